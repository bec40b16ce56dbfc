#include "ctrl/store_ctrl.h"
#include "common/log.h"
#include "common/util.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

struct batch {
    struct batch *next; /* queue link (lock), then in-order list (thread) */
    uint64_t seq;
    uint32_t n;
    struct kvt_l1_ref *refs;
    kvt_key *keys;
    int pending; /* adapters still working (thread-owned) */
    bool done;
};

struct kvt_store_ctrl {
    struct kvt_l1 *l1;
    kvt_l2 **l2s;
    int nl2;
    enum kvt_store_policy policy;
    void (*on_progress)(void *);
    void *arg;

    pthread_mutex_t lock; /* guards the incoming queue and next_seq */
    struct batch *in_head, *in_tail;
    uint64_t next_seq;
    bool stopping;
    int qfd; /* eventfd: incoming batches or stop */
    int epfd;
    pthread_t thr;

    /* thread-owned: batches in seq order, oldest first */
    struct batch *order_head, *order_tail;

    _Atomic uint64_t last_seq, done_seq;
    _Atomic uint64_t batches, keys_in, l2_ok, l2_failed, in_flight;
};

static void batch_finish(struct kvt_store_ctrl *sc, struct batch *b)
{
    for (uint32_t i = 0; i < b->n; i++) {
        if (sc->policy == KVT_STORE_SKIP_L1)
            kvt_l1_drop(sc->l1, b->refs[i].h);
        kvt_l1_put(sc->l1, b->refs[i].h);
    }
    b->done = true;
    atomic_fetch_sub(&sc->in_flight, 1);
    /* advance done_seq over the finished prefix of the order list */
    bool advanced = false;
    while (sc->order_head && sc->order_head->done) {
        struct batch *h = sc->order_head;
        sc->order_head = h->next;
        if (!sc->order_head)
            sc->order_tail = NULL;
        /* release: flush waiters read done_seq then reply */
        atomic_store_explicit(&sc->done_seq, h->seq, memory_order_release);
        free(h->refs);
        free(h->keys);
        free(h);
        advanced = true;
    }
    if (advanced && sc->on_progress)
        sc->on_progress(sc->arg);
}

static void start_batch(struct kvt_store_ctrl *sc, struct batch *b)
{
    b->next = NULL;
    if (sc->order_tail)
        sc->order_tail->next = b;
    else
        sc->order_head = b;
    sc->order_tail = b;
    b->pending = sc->nl2;
    if (sc->nl2 == 0) {
        batch_finish(sc, b);
        return;
    }
    /* the batch's references keep these pointers valid until batch_finish */
    kvt_buf *bufs = kvt_xcalloc(b->n, sizeof(kvt_buf));
    kvt_objmeta *metas = kvt_xcalloc(b->n, sizeof(kvt_objmeta));
    for (uint32_t i = 0; i < b->n; i++) {
        bufs[i].ptr = b->refs[i].ptr;
        bufs[i].len = b->refs[i].meta.len;
        metas[i] = b->refs[i].meta;
    }
    for (int a = 0; a < sc->nl2; a++) {
        kvt_l2_task *t = kvt_l2_task_new(KVT_L2_STORE, b->n);
        memcpy(t->keys, b->keys, b->n * sizeof(kvt_key));
        memcpy(t->bufs, bufs, b->n * sizeof(kvt_buf));
        memcpy(t->meta, metas, b->n * sizeof(kvt_objmeta));
        t->udata = b;
        kvt_l2_submit(sc->l2s[a], t);
    }
    free(bufs);
    free(metas);
}

static void *ctrl_main(void *arg)
{
    struct kvt_store_ctrl *sc = arg;
    pthread_setname_np(pthread_self(), "store-ctrl");
    struct epoll_event evs[16];
    kvt_l2_task *done[64];
    for (;;) {
        int n = epoll_wait(sc->epfd, evs, 16, -1);
        if (n < 0 && errno == EINTR)
            continue;
        for (int e = 0; e < n; e++) {
            int who = (int)evs[e].data.u32;
            if (who < 0 || who >= sc->nl2) { /* the queue */
                uint64_t v;
                ssize_t r = read(sc->qfd, &v, sizeof(v));
                (void)r;
                pthread_mutex_lock(&sc->lock);
                struct batch *b = sc->in_head;
                sc->in_head = sc->in_tail = NULL;
                pthread_mutex_unlock(&sc->lock);
                while (b) {
                    struct batch *nx = b->next;
                    start_batch(sc, b);
                    b = nx;
                }
                continue;
            }
            kvt_l2 *l2 = sc->l2s[who];
            size_t m;
            while ((m = kvt_l2_pop_done(l2, KVT_L2_STORE, done, KVT_ARRAY_LEN(done))) > 0) {
                for (size_t i = 0; i < m; i++) {
                    kvt_l2_task *t = done[i];
                    struct batch *b = t->udata;
                    size_t ok = kvt_bm_count(t->ok, t->n);
                    atomic_fetch_add(&sc->l2_ok, ok);
                    atomic_fetch_add(&sc->l2_failed, t->n - ok);
                    kvt_l2_task_free(t);
                    if (--b->pending == 0)
                        batch_finish(sc, b);
                }
                if (m < KVT_ARRAY_LEN(done))
                    break;
            }
        }
        pthread_mutex_lock(&sc->lock);
        bool stop = sc->stopping && !sc->in_head && !sc->order_head;
        pthread_mutex_unlock(&sc->lock);
        if (stop)
            break;
    }
    return NULL;
}

int kvt_store_ctrl_start(struct kvt_store_ctrl **out, struct kvt_l1 *l1, kvt_l2 **l2s, int nl2,
                         enum kvt_store_policy policy, void (*on_progress)(void *), void *arg)
{
    struct kvt_store_ctrl *sc = kvt_xcalloc(1, sizeof(*sc));
    sc->l1 = l1;
    sc->l2s = l2s;
    sc->nl2 = nl2;
    sc->policy = policy;
    sc->on_progress = on_progress;
    sc->arg = arg;
    pthread_mutex_init(&sc->lock, NULL);
    sc->qfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    sc->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (sc->qfd < 0 || sc->epfd < 0)
        goto fail;
    struct epoll_event ev = {.events = EPOLLIN, .data.u32 = UINT32_MAX};
    if (epoll_ctl(sc->epfd, EPOLL_CTL_ADD, sc->qfd, &ev) < 0)
        goto fail;
    for (int a = 0; a < nl2; a++) {
        ev.data.u32 = (uint32_t)a;
        if (epoll_ctl(sc->epfd, EPOLL_CTL_ADD, l2s[a]->efd[KVT_L2_STORE], &ev) < 0)
            goto fail;
    }
    if (pthread_create(&sc->thr, NULL, ctrl_main, sc))
        goto fail;
    *out = sc;
    return 0;
fail:;
    int e = errno ? -errno : -EIO;
    if (sc->qfd >= 0)
        close(sc->qfd);
    if (sc->epfd >= 0)
        close(sc->epfd);
    free(sc);
    return e;
}

uint64_t kvt_store_ctrl_submit(struct kvt_store_ctrl *sc, const struct kvt_l1_ref *refs,
                               const kvt_key *keys, uint32_t n)
{
    struct batch *b = kvt_xcalloc(1, sizeof(*b));
    b->n = n;
    b->refs = kvt_xmalloc((n ? n : 1) * sizeof(*refs));
    b->keys = kvt_xmalloc((n ? n : 1) * sizeof(kvt_key));
    memcpy(b->refs, refs, n * sizeof(*refs));
    memcpy(b->keys, keys, n * sizeof(kvt_key));
    atomic_fetch_add(&sc->batches, 1);
    atomic_fetch_add(&sc->keys_in, n);
    atomic_fetch_add(&sc->in_flight, 1);
    pthread_mutex_lock(&sc->lock);
    uint64_t seq = b->seq = ++sc->next_seq; /* under the queue lock: queue order = seq order */
    atomic_store(&sc->last_seq, seq);
    if (sc->in_tail)
        sc->in_tail->next = b;
    else
        sc->in_head = b;
    sc->in_tail = b;
    pthread_mutex_unlock(&sc->lock);
    uint64_t one = 1;
    ssize_t w = write(sc->qfd, &one, sizeof(one));
    (void)w;
    return seq; /* b belongs to the controller thread now */
}

uint64_t kvt_store_ctrl_last_seq(struct kvt_store_ctrl *sc)
{
    return atomic_load(&sc->last_seq);
}

uint64_t kvt_store_ctrl_done_seq(struct kvt_store_ctrl *sc)
{
    return atomic_load_explicit(&sc->done_seq, memory_order_acquire);
}

json_t *kvt_store_ctrl_status(struct kvt_store_ctrl *sc)
{
    json_t *o = json_object();
    json_object_set_new(o, "policy",
                        json_string(sc->policy == KVT_STORE_SKIP_L1 ? "skip_l1" : "default"));
    json_object_set_new(o, "batches", json_integer((json_int_t)atomic_load(&sc->batches)));
    json_object_set_new(o, "keys", json_integer((json_int_t)atomic_load(&sc->keys_in)));
    json_object_set_new(o, "in_flight_batches",
                        json_integer((json_int_t)atomic_load(&sc->in_flight)));
    json_object_set_new(o, "l2_keys_ok", json_integer((json_int_t)atomic_load(&sc->l2_ok)));
    json_object_set_new(o, "l2_keys_failed",
                        json_integer((json_int_t)atomic_load(&sc->l2_failed)));
    json_object_set_new(o, "last_seq", json_integer((json_int_t)atomic_load(&sc->last_seq)));
    json_object_set_new(o, "done_seq", json_integer((json_int_t)atomic_load(&sc->done_seq)));
    return o;
}

void kvt_store_ctrl_stop(struct kvt_store_ctrl *sc)
{
    if (!sc)
        return;
    pthread_mutex_lock(&sc->lock);
    sc->stopping = true;
    pthread_mutex_unlock(&sc->lock);
    uint64_t one = 1;
    ssize_t w = write(sc->qfd, &one, sizeof(one));
    (void)w;
    pthread_join(sc->thr, NULL);
    close(sc->qfd);
    close(sc->epfd);
    pthread_mutex_destroy(&sc->lock);
    free(sc);
}
