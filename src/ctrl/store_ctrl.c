#include "ctrl/store_ctrl.h"
#include "common/log.h"
#include "common/util.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#define FAIL_LIST_MAX 1024    /* keys listed per client between two flushes */
#define FAIL_CLIENTS_MAX 1024 /* clients with failures not yet taken */
#define CLIENT_BUCKETS 1024   /* hash buckets of the per-client in-flight counts */

/* A client with batches in flight or a flush parked: exists only then. */
struct client_rec {
    struct client_rec *hnext; /* hash chain */
    uint64_t client;
    uint32_t inflight; /* its batches submitted and not finished on every adapter */
    void *waiter;      /* its parked flush, or NULL */
};

/* A flush whose client's batches all finished, not yet taken. */
struct ready_flush {
    struct ready_flush *next;
    void *cookie;
};

struct batch {
    struct batch *next; /* queue link (lock), then in-order list (thread) */
    uint64_t seq;
    uint64_t client; /* tag of the submitting client, 0 = none */
    uint64_t t0_ns;
    uint32_t n;
    struct kvt_l1_ref *refs;
    kvt_key *keys;
    /* queued (pending 0, not done) -> started (pending: the adapters still
     * working; thread-owned) -> done (pending 0: every adapter finished,
     * references dropped) -> freed once every older batch is done too */
    int pending;
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

    /* in-flight batches per client and parked flushes */
    pthread_mutex_t clock; /* a leaf: guards clients[], ready_head/tail */
    struct client_rec *clients[CLIENT_BUCKETS];
    struct ready_flush *ready_head, *ready_tail;

    /* failures per client, not yet taken by its flush */
    pthread_mutex_t flock; /* a leaf: guards fails, nfails, fail_cap */
    struct fail_client *fails;
    uint32_t nfails, fail_cap;

    _Atomic uint64_t last_seq, done_seq;
    _Atomic uint64_t batches, keys_in, l2_ok, l2_failed, in_flight;
};

struct fail_client {
    uint64_t client;
    uint64_t total;  /* failures since the last take (listed or not) */
    uint32_t n, cap; /* listed, allocated */
    struct kvt_store_failure *v;
};

/* Record the keys of t (a finished task of adapter a for batch b) that
 * were not stored, for b's client. */
static void record_failures(struct kvt_store_ctrl *sc, struct batch *b, int a, kvt_l2_task *t,
                            size_t ok)
{
    if (!b->client || ok == t->n)
        return;
    pthread_mutex_lock(&sc->flock);
    struct fail_client *fc = NULL;
    for (uint32_t k = 0; k < sc->nfails; k++)
        if (sc->fails[k].client == b->client) {
            fc = &sc->fails[k];
            break;
        }
    if (!fc) {
        if (sc->nfails == FAIL_CLIENTS_MAX) { /* forget the oldest client's record */
            free(sc->fails[0].v);
            memmove(sc->fails, sc->fails + 1, (sc->nfails - 1) * sizeof(*sc->fails));
            sc->nfails--;
        }
        if (sc->nfails == sc->fail_cap) {
            sc->fail_cap = sc->fail_cap ? 2 * sc->fail_cap : 8;
            sc->fails = kvt_xrealloc(sc->fails, sc->fail_cap * sizeof(*sc->fails));
        }
        fc = &sc->fails[sc->nfails++];
        memset(fc, 0, sizeof(*fc));
        fc->client = b->client;
    }
    for (uint32_t i = 0; i < t->n; i++) {
        if (kvt_bm_test(t->ok, i))
            continue;
        fc->total++;
        if (fc->n == FAIL_LIST_MAX)
            continue;
        if (fc->n == fc->cap) {
            fc->cap = fc->cap ? KVT_MIN(2 * fc->cap, FAIL_LIST_MAX) : 16;
            fc->v = kvt_xrealloc(fc->v, fc->cap * sizeof(*fc->v));
        }
        fc->v[fc->n++] = (struct kvt_store_failure){
            .key = t->keys[i], .adapter = a, .code = kvt_l2_task_code(t, i)};
    }
    pthread_mutex_unlock(&sc->flock);
}

uint64_t kvt_store_ctrl_take_failures(struct kvt_store_ctrl *sc, uint64_t client, uint32_t max,
                                      struct kvt_store_failure **out, uint32_t *listed)
{
    *out = NULL;
    *listed = 0;
    uint64_t total = 0;
    pthread_mutex_lock(&sc->flock);
    for (uint32_t k = 0; k < sc->nfails; k++) {
        struct fail_client *fc = &sc->fails[k];
        if (fc->client != client)
            continue;
        total = fc->total;
        uint32_t m = KVT_MIN(fc->n, max);
        if (m) {
            *out = kvt_xmalloc(m * sizeof(**out));
            memcpy(*out, fc->v, m * sizeof(**out));
        }
        *listed = m;
        free(fc->v);
        memmove(fc, fc + 1, (sc->nfails - k - 1) * sizeof(*fc));
        sc->nfails--;
        break;
    }
    pthread_mutex_unlock(&sc->flock);
    return total;
}

/* call with sc->clock held: the entry of client, created when create */
static struct client_rec *client_find_locked(struct kvt_store_ctrl *sc, uint64_t client,
                                             bool create)
{
    struct client_rec **pp = &sc->clients[(client ^ (client >> 29)) % CLIENT_BUCKETS];
    for (struct client_rec *c = *pp; c; c = c->hnext)
        if (c->client == client)
            return c;
    if (!create)
        return NULL;
    struct client_rec *c = kvt_xcalloc(1, sizeof(*c));
    c->client = client;
    c->hnext = *pp;
    *pp = c;
    return c;
}

/* call with sc->clock held: unlink and free c (no batch in flight, no
 * flush parked) */
static void client_drop_locked(struct kvt_store_ctrl *sc, struct client_rec *c)
{
    KVT_ASSERT(c->inflight == 0 && c->waiter == NULL);
    struct client_rec **pp = &sc->clients[(c->client ^ (c->client >> 29)) % CLIENT_BUCKETS];
    while (*pp != c)
        pp = &(*pp)->hnext;
    *pp = c->hnext;
    free(c);
}

/* One more batch of client in flight. */
static void client_submitted(struct kvt_store_ctrl *sc, uint64_t client)
{
    pthread_mutex_lock(&sc->clock);
    client_find_locked(sc, client, true)->inflight++;
    pthread_mutex_unlock(&sc->clock);
}

/* A batch of client finished on every adapter; true when that released a
 * parked flush (now on the ready list). */
static bool client_finished(struct kvt_store_ctrl *sc, uint64_t client)
{
    bool ready = false;
    pthread_mutex_lock(&sc->clock);
    struct client_rec *c = client_find_locked(sc, client, false);
    KVT_ASSERT(c && c->inflight > 0);
    if (--c->inflight == 0) {
        if (c->waiter) {
            struct ready_flush *rf = kvt_xmalloc(sizeof(*rf));
            rf->next = NULL;
            rf->cookie = c->waiter;
            c->waiter = NULL;
            if (sc->ready_tail)
                sc->ready_tail->next = rf;
            else
                sc->ready_head = rf;
            sc->ready_tail = rf;
            ready = true;
        }
        client_drop_locked(sc, c);
    }
    pthread_mutex_unlock(&sc->clock);
    return ready;
}

bool kvt_store_ctrl_flush_wait(struct kvt_store_ctrl *sc, uint64_t client, void *cookie)
{
    KVT_ASSERT(client != 0 && cookie != NULL);
    pthread_mutex_lock(&sc->clock);
    struct client_rec *c = client_find_locked(sc, client, false);
    bool now = c == NULL; /* an entry exists only while batches are in flight */
    if (!now) {
        KVT_ASSERT(c->inflight > 0 && c->waiter == NULL);
        c->waiter = cookie;
    }
    pthread_mutex_unlock(&sc->clock);
    return now;
}

size_t kvt_store_ctrl_take_flushed(struct kvt_store_ctrl *sc, void **out, size_t max)
{
    size_t n = 0;
    pthread_mutex_lock(&sc->clock);
    while (n < max && sc->ready_head) {
        struct ready_flush *rf = sc->ready_head;
        sc->ready_head = rf->next;
        if (!sc->ready_head)
            sc->ready_tail = NULL;
        out[n++] = rf->cookie;
        free(rf);
    }
    pthread_mutex_unlock(&sc->clock);
    return n;
}

/* The batch's objects are no longer needed here: drop their references
 * (with skip_l1 they leave L1 too). */
static void release_refs(struct kvt_store_ctrl *sc, const struct kvt_l1_ref *refs, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        if (sc->policy == KVT_STORE_SKIP_L1)
            kvt_l1_drop(sc->l1, refs[i].h);
        kvt_l1_put(sc->l1, refs[i].h);
    }
}

static void batch_finish(struct kvt_store_ctrl *sc, struct batch *b)
{
    KVT_ASSERT(b->pending == 0 && !b->done);
    release_refs(sc, b->refs, b->n);
    b->done = true;
    atomic_fetch_sub(&sc->in_flight, 1);
    /* the client's flush waits for its own batches only: it may be ready
     * while older batches of others are still in flight */
    bool ready = b->client && client_finished(sc, b->client);
    /* advance done_seq over the finished prefix of the order list */
    while (sc->order_head && sc->order_head->done) {
        struct batch *h = sc->order_head;
        sc->order_head = h->next;
        if (!sc->order_head)
            sc->order_tail = NULL;
        /* release: shutdown's quiesce reads done_seq, then the results */
        atomic_store_explicit(&sc->done_seq, h->seq, memory_order_release);
        free(h->refs);
        free(h->keys);
        free(h);
    }
    if (ready && sc->on_progress)
        sc->on_progress(sc->arg);
}

static void start_batch(struct kvt_store_ctrl *sc, struct batch *b)
{
    KVT_ASSERT(b->pending == 0 && !b->done); /* queued: started once */
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
    kvt_debug("Submitted store task %llu: %u keys to %d L2 adapter%s", (unsigned long long)b->seq,
              b->n, sc->nl2, sc->nl2 == 1 ? "" : "s");
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
                    record_failures(sc, b, who, t, ok);
                    kvt_debug("L2 store task %llu completed on %s: %zu of %u keys stored "
                              "in %.3f ms",
                              (unsigned long long)b->seq, kvt_l2_name(l2), ok, t->n,
                              (double)(kvt_now_ns() - b->t0_ns) / 1e6);
                    kvt_l2_task_free(t);
                    KVT_ASSERT(b->pending > 0); /* one task per adapter */
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

/*
 * Start the store controller. Each step that fails leaves its error in e
 * (-errno from the fd calls, the return of pthread_create: it does not set
 * errno), and everything made so far is undone before returning it.
 */
int kvt_store_ctrl_start(struct kvt_store_ctrl **out, struct kvt_l1 *l1, kvt_l2 **l2s, int nl2,
                         enum kvt_store_policy policy, void (*on_progress)(void *), void *arg)
{
    struct kvt_store_ctrl *sc = kvt_xcalloc(1, sizeof(*sc));
    int e = 0;
    sc->l1 = l1;
    sc->l2s = l2s;
    sc->nl2 = nl2;
    sc->policy = policy;
    sc->on_progress = on_progress;
    sc->arg = arg;
    pthread_mutex_init(&sc->lock, NULL);
    pthread_mutex_init(&sc->flock, NULL);
    pthread_mutex_init(&sc->clock, NULL);
    sc->epfd = -1;
    sc->qfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (sc->qfd < 0) {
        e = -errno;
        goto fail;
    }
    sc->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (sc->epfd < 0) {
        e = -errno;
        goto fail;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.u32 = UINT32_MAX};
    if (epoll_ctl(sc->epfd, EPOLL_CTL_ADD, sc->qfd, &ev) < 0) {
        e = -errno;
        goto fail;
    }
    for (int a = 0; a < nl2; a++) {
        ev.data.u32 = (uint32_t)a;
        if (epoll_ctl(sc->epfd, EPOLL_CTL_ADD, kvt_l2_efd(l2s[a], KVT_L2_STORE), &ev) < 0) {
            e = -errno;
            goto fail;
        }
    }
    e = -pthread_create(&sc->thr, NULL, ctrl_main, sc);
    if (e)
        goto fail;
    *out = sc;
    return 0;
fail:
    if (sc->qfd >= 0)
        close(sc->qfd);
    if (sc->epfd >= 0)
        close(sc->epfd);
    pthread_mutex_destroy(&sc->clock);
    pthread_mutex_destroy(&sc->flock);
    pthread_mutex_destroy(&sc->lock);
    free(sc);
    return e ? e : -EIO;
}

uint64_t kvt_store_ctrl_submit(struct kvt_store_ctrl *sc, const struct kvt_l1_ref *refs,
                               const kvt_key *keys, uint32_t n)
{
    return kvt_store_ctrl_submit_for(sc, refs, keys, n, 0);
}

uint64_t kvt_store_ctrl_submit_for(struct kvt_store_ctrl *sc, const struct kvt_l1_ref *refs,
                                   const kvt_key *keys, uint32_t n, uint64_t client)
{
    if (sc->nl2 == 0) {
        /* No adapter to copy to: drop the references here, so the objects
         * are evictable as soon as their store is answered (held until the
         * controller thread woke, they were not: under load the next store
         * found its victims pinned, evicted others or failed E_FULL, and
         * the live L1 hit up to 2 points below the same policy offline).
         * No batch ever reaches the thread, so done_seq stays in order. */
        release_refs(sc, refs, n);
        atomic_fetch_add(&sc->batches, 1);
        atomic_fetch_add(&sc->keys_in, n);
        pthread_mutex_lock(&sc->lock);
        uint64_t seq = ++sc->next_seq;
        atomic_store(&sc->last_seq, seq);
        atomic_store_explicit(&sc->done_seq, seq, memory_order_release);
        pthread_mutex_unlock(&sc->lock);
        if (sc->on_progress)
            sc->on_progress(sc->arg);
        return seq;
    }
    struct batch *b = kvt_xcalloc(1, sizeof(*b));
    b->n = n;
    b->client = client;
    b->t0_ns = kvt_now_ns();
    b->refs = kvt_xmalloc((n ? n : 1) * sizeof(*refs));
    b->keys = kvt_xmalloc((n ? n : 1) * sizeof(kvt_key));
    memcpy(b->refs, refs, n * sizeof(*refs));
    memcpy(b->keys, keys, n * sizeof(kvt_key));
    atomic_fetch_add(&sc->batches, 1);
    atomic_fetch_add(&sc->keys_in, n);
    atomic_fetch_add(&sc->in_flight, 1);
    if (client) /* before the thread can finish it */
        client_submitted(sc, client);
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
    json_object_set_new(o, "l2_keys_failed", json_integer((json_int_t)atomic_load(&sc->l2_failed)));
    json_object_set_new(o, "last_seq", json_integer((json_int_t)atomic_load(&sc->last_seq)));
    json_object_set_new(o, "done_seq", json_integer((json_int_t)atomic_load(&sc->done_seq)));
    return o;
}

void kvt_store_ctrl_quiesce(struct kvt_store_ctrl *sc)
{
    while (kvt_store_ctrl_done_seq(sc) < kvt_store_ctrl_last_seq(sc)) {
        struct timespec ts = {0, 1000000}; /* shutdown only: 1 ms polls are fine */
        nanosleep(&ts, NULL);
    }
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
    for (uint32_t k = 0; k < sc->nfails; k++)
        free(sc->fails[k].v);
    free(sc->fails);
    pthread_mutex_destroy(&sc->flock);
    /* every batch finished: no client entry is left; flushes not taken
     * are the caller's (their cookies) */
    for (int i = 0; i < CLIENT_BUCKETS; i++)
        KVT_ASSERT(sc->clients[i] == NULL);
    for (struct ready_flush *rf = sc->ready_head, *nx; rf; rf = nx) {
        nx = rf->next;
        free(rf);
    }
    pthread_mutex_destroy(&sc->clock);
    free(sc);
}
