#include "ctrl/prefetch_ctrl.h"
#include "common/log.h"
#include "common/util.h"
#include "kvtier/error.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

/*
 * A requested key's state (struct req.st), changed only by key_set:
 *   MISS -> PRESENT (in L1: referenced) -> MISS (the plan was trimmed
 *     before it, its reference dropped)
 *   MISS -> LOADING (room reserved in L1) -> LOADED or FAILED (the load)
 *   LOADED -> MISS (a client's store won its key: the prefix ends before it)
 */
enum { K_MISS = 0, K_PRESENT, K_LOADING, K_LOADED, K_FAILED };
#define KB(s) (1u << (s))

struct req {
    struct req *next;
    kvt_key *keys;
    uint32_t n;
    kvt_prefetch_cb cb;
    void *arg;
    int pending;           /* tasks outstanding */
    kvt_l2_task **lookups; /* per adapter, kept until the plan is made */
    int8_t *src;           /* chosen adapter per key, -1 none */
    uint8_t *st;           /* K_* per key */
    struct kvt_l1_ref *refs;
    uint32_t plan;
};

/* A load task's view: which request keys its entries are. */
struct load_map {
    struct req *r;
    uint32_t *idx;
};

struct kvt_prefetch_ctrl {
    struct kvt_l1 *l1;
    kvt_l2 **l2s;
    int nl2;
    enum kvt_prefetch_policy policy;
    int max_in_flight;

    pthread_mutex_t lock; /* guards the incoming queue and stopping */
    struct req *in_head, *in_tail;
    bool stopping;
    int qfd, epfd;
    pthread_t thr;

    /* thread-owned */
    struct req *wait_head, *wait_tail; /* FIFO beyond max_in_flight */
    int active;

    _Atomic uint64_t requests, keys_asked, keys_loaded, keys_present, load_failures, queued_max;
    _Atomic int active_pub, waiting_pub;
};

/* Key i of r leaves one of the states in from (KB bits) for to. */
static void key_set(struct req *r, uint32_t i, unsigned from, uint8_t to)
{
    KVT_ASSERT(i < r->n && (from & KB(r->st[i])));
    r->st[i] = to;
}

static void req_free(struct req *r)
{
    free(r->keys);
    free(r->lookups);
    free(r->src);
    free(r->st);
    free(r->refs);
    free(r);
}

static void start_req(struct kvt_prefetch_ctrl *pc, struct req *r);

static void finish_req(struct kvt_prefetch_ctrl *pc, struct req *r)
{
    KVT_ASSERT(r->pending == 0 && r->plan <= r->n); /* every task came back */
    /* the prefix: present or loaded keys from the start */
    uint32_t count = 0;
    while (count < r->plan && (r->st[count] == K_PRESENT || r->st[count] == K_LOADED))
        count++;
    uint32_t *commit = kvt_xmalloc((r->n ? r->n : 1) * sizeof(uint32_t));
    uint32_t nc = 0;
    for (uint32_t i = 0; i < count; i++)
        if (r->st[i] == K_LOADED)
            commit[nc++] = r->refs[i].h;
    kvt_l1_commit(pc->l1, commit, nc, pc->policy == KVT_PREFETCH_RETAIN ? 0 : KVT_L1_TEMP);
    atomic_fetch_add(&pc->keys_loaded, nc);
    /* a load a client's store of the same key beat to its publish: the
     * lookup's lease takes the client's object (it needs a READY one) */
    for (uint32_t i = 0; i < count; i++) {
        if (r->st[i] != K_LOADED || kvt_l1_winner(pc->l1, &r->refs[i]))
            continue;
        for (uint32_t j = i; j < count; j++) { /* gone since: the prefix ends here */
            kvt_l1_put(pc->l1, r->refs[j].h);
            key_set(r, j, KB(K_PRESENT) | KB(K_LOADED), K_MISS); /* nothing more to do below */
        }
        count = i;
        break;
    }
    /* beyond the prefix: keep valid loads only under retain */
    for (uint32_t i = count; i < r->plan; i++) {
        if (r->st[i] == K_LOADED && pc->policy == KVT_PREFETCH_RETAIN) {
            kvt_l1_commit(pc->l1, &r->refs[i].h, 1, 0);
        } else if (r->st[i] == K_LOADED || r->st[i] == K_FAILED) {
            kvt_l1_abort(pc->l1, r->refs[i].h);
        }
        if (r->st[i] != K_MISS)
            kvt_l1_put(pc->l1, r->refs[i].h);
    }
    free(commit);
    kvt_debug("Prefetch request completed: %u of %u keys from L2 (%u loaded)", count, r->n, nc);
    struct kvt_l1_ref *refs = r->refs;
    r->refs = NULL;
    r->cb(r->arg, count, refs);
    req_free(r);
    pc->active--;
    if (pc->wait_head) {
        struct req *nx = pc->wait_head;
        pc->wait_head = nx->next;
        if (!pc->wait_head)
            pc->wait_tail = NULL;
        atomic_fetch_sub(&pc->waiting_pub, 1);
        start_req(pc, nx);
    }
    atomic_store(&pc->active_pub, pc->active);
}

/* Unlock, on adapter a, request keys [from, to) that a pinned but will not
 * serve (not chosen, or outside the plan). */
static void unlock_unused(struct kvt_prefetch_ctrl *pc, struct req *r)
{
    kvt_key *ks = kvt_xmalloc((r->n ? r->n : 1) * sizeof(kvt_key));
    for (int a = 0; a < pc->nl2; a++) {
        kvt_l2_task *t = r->lookups[a];
        uint32_t k = 0;
        for (uint32_t i = 0; i < r->n; i++)
            if (kvt_bm_test(t->ok, i) && (i >= r->plan || r->src[i] != a || r->st[i] == K_PRESENT))
                ks[k++] = r->keys[i];
        if (k)
            kvt_l2_unlock(pc->l2s[a], ks, k);
    }
    free(ks);
}

static void plan_and_load(struct kvt_prefetch_ctrl *pc, struct req *r)
{
    /* 1. each key from the lowest-index adapter that has it, or from L1 when
     * it is there (stored since the lookup started, or stored to L1 while
     * its L2 copy is still being written); stop at a hole */
    uint32_t plan = 0;
    for (; plan < r->n; plan++) {
        int a;
        for (a = 0; a < pc->nl2; a++)
            if (kvt_bm_test(r->lookups[a]->ok, plan))
                break;
        r->src[plan] = (int8_t)(a < pc->nl2 ? a : -1);
        if (a == pc->nl2) {
            if (kvt_l1_get(pc->l1, &r->keys[plan], &r->refs[plan]) != 0)
                break;
            key_set(r, plan, KB(K_MISS), K_PRESENT);
            atomic_fetch_add(&pc->keys_present, 1);
        }
    }
    /* 2. L1 space for each planned key, in order; trim at the first failure */
    for (uint32_t i = 0; i < plan; i++) {
        if (r->st[i] == K_PRESENT)
            continue;
        kvt_objmeta m = {0};
        m.len = r->lookups[r->src[i]]->meta[i].len;
        int rc = kvt_l1_reserve_free(pc->l1, &r->keys[i], &m, &r->refs[i]);
        if (rc == 0) {
            key_set(r, i, KB(K_MISS), K_LOADING);
        } else if (rc == -EEXIST && kvt_l1_get(pc->l1, &r->keys[i], &r->refs[i]) == 0) {
            key_set(r, i, KB(K_MISS), K_PRESENT);
            atomic_fetch_add(&pc->keys_present, 1);
        } else {
            /* full, too big, or being written by someone else: trim here,
             * dropping the L1 references taken above for later keys */
            for (uint32_t j = i + 1; j < plan; j++)
                if (r->st[j] == K_PRESENT) {
                    kvt_l1_put(pc->l1, r->refs[j].h);
                    key_set(r, j, KB(K_PRESENT), K_MISS);
                }
            plan = i;
            break;
        }
    }
    r->plan = plan;
    unlock_unused(pc, r);
    /* 3. one load task per adapter with its keys */
    uint32_t *idx = kvt_xmalloc((r->n ? r->n : 1) * sizeof(uint32_t));
    r->pending = 0;
    for (int a = 0; a < pc->nl2; a++) {
        uint32_t k = 0;
        for (uint32_t i = 0; i < plan; i++)
            if (r->src[i] == a && r->st[i] == K_LOADING)
                idx[k++] = i;
        if (!k)
            continue;
        kvt_l2_task *t = kvt_l2_task_new(KVT_L2_LOAD, k);
        struct load_map *lm = kvt_xmalloc(sizeof(*lm));
        lm->r = r;
        lm->idx = kvt_xmalloc(k * sizeof(uint32_t));
        memcpy(lm->idx, idx, k * sizeof(uint32_t));
        for (uint32_t j = 0; j < k; j++) {
            uint32_t i = idx[j];
            t->keys[j] = r->keys[i];
            t->bufs[j].ptr = r->refs[i].ptr;
            t->bufs[j].len = r->refs[i].meta.len;
        }
        t->udata = lm;
        r->pending++;
        kvt_l2_submit(pc->l2s[a], t);
    }
    free(idx);
    for (int a = 0; a < pc->nl2; a++) {
        kvt_l2_task_free(r->lookups[a]);
        r->lookups[a] = NULL;
    }
    if (r->pending == 0)
        finish_req(pc, r);
}

static void start_req(struct kvt_prefetch_ctrl *pc, struct req *r)
{
    if (pc->active >= pc->max_in_flight) {
        r->next = NULL;
        if (pc->wait_tail)
            pc->wait_tail->next = r;
        else
            pc->wait_head = r;
        pc->wait_tail = r;
        int w = atomic_fetch_add(&pc->waiting_pub, 1) + 1;
        if ((uint64_t)w > atomic_load(&pc->queued_max))
            atomic_store(&pc->queued_max, (uint64_t)w);
        return;
    }
    pc->active++;
    atomic_store(&pc->active_pub, pc->active);
    if (pc->nl2 == 0 || r->n == 0) {
        r->plan = 0;
        finish_req(pc, r);
        return;
    }
    r->pending = pc->nl2;
    for (int a = 0; a < pc->nl2; a++) {
        kvt_l2_task *t = kvt_l2_task_new(KVT_L2_LOOKUP, r->n);
        memcpy(t->keys, r->keys, r->n * sizeof(kvt_key));
        t->udata = r;
        kvt_l2_submit(pc->l2s[a], t);
    }
}

static void on_lookup(struct kvt_prefetch_ctrl *pc, int a, kvt_l2_task *t)
{
    struct req *r = t->udata;
    KVT_ASSERT(r->pending > 0 && r->lookups[a] == NULL); /* one lookup per adapter */
    r->lookups[a] = t;
    if (--r->pending == 0)
        plan_and_load(pc, r);
}

static void on_load(struct kvt_prefetch_ctrl *pc, int a, kvt_l2_task *t)
{
    struct load_map *lm = t->udata;
    struct req *r = lm->r;
    kvt_l2_unlock(pc->l2s[a], t->keys, t->n);
    for (uint32_t j = 0; j < t->n; j++) {
        uint32_t i = lm->idx[j];
        if (kvt_bm_test(t->ok, j) && t->bufs[j].len == r->refs[i].meta.len &&
            t->meta[j].len == r->refs[i].meta.len) {
            kvt_objmeta m = t->meta[j];
            m.len = r->refs[i].meta.len;
            kvt_l1_set_meta(pc->l1, r->refs[i].h, &m);
            r->refs[i].meta = m;
            key_set(r, i, KB(K_LOADING), K_LOADED);
        } else {
            key_set(r, i, KB(K_LOADING), K_FAILED);
            atomic_fetch_add(&pc->load_failures, 1);
        }
    }
    free(lm->idx);
    free(lm);
    kvt_l2_task_free(t);
    KVT_ASSERT(r->pending > 0);
    if (--r->pending == 0)
        finish_req(pc, r);
}

static void *pc_main(void *arg)
{
    struct kvt_prefetch_ctrl *pc = arg;
    pthread_setname_np(pthread_self(), "prefetch");
    struct epoll_event evs[16];
    kvt_l2_task *done[64];
    for (;;) {
        int n = epoll_wait(pc->epfd, evs, 16, -1);
        if (n < 0 && errno == EINTR)
            continue;
        for (int e = 0; e < n; e++) {
            uint32_t tag = evs[e].data.u32;
            if (tag == UINT32_MAX) {
                uint64_t v;
                ssize_t rr = read(pc->qfd, &v, sizeof(v));
                (void)rr;
                pthread_mutex_lock(&pc->lock);
                struct req *r = pc->in_head;
                pc->in_head = pc->in_tail = NULL;
                pthread_mutex_unlock(&pc->lock);
                while (r) {
                    struct req *nx = r->next;
                    start_req(pc, r);
                    r = nx;
                }
                continue;
            }
            int a = (int)(tag >> 1);
            enum kvt_l2_kind kind = (tag & 1) ? KVT_L2_LOAD : KVT_L2_LOOKUP;
            size_t m;
            while ((m = kvt_l2_pop_done(pc->l2s[a], kind, done, KVT_ARRAY_LEN(done))) > 0) {
                for (size_t i = 0; i < m; i++) {
                    if (kind == KVT_L2_LOOKUP)
                        on_lookup(pc, a, done[i]);
                    else
                        on_load(pc, a, done[i]);
                }
                if (m < KVT_ARRAY_LEN(done))
                    break;
            }
        }
        pthread_mutex_lock(&pc->lock);
        bool stop = pc->stopping && !pc->in_head && pc->active == 0;
        pthread_mutex_unlock(&pc->lock);
        if (stop)
            break;
    }
    return NULL;
}

/*
 * Start the prefetch controller. Each step that fails leaves its error in e
 * (-errno from the fd calls, the return of pthread_create: it does not set
 * errno), and everything made so far is undone before returning it.
 */
int kvt_prefetch_ctrl_start(struct kvt_prefetch_ctrl **out, struct kvt_l1 *l1, kvt_l2 **l2s,
                            int nl2, enum kvt_prefetch_policy policy, int max_in_flight)
{
    struct kvt_prefetch_ctrl *pc = kvt_xcalloc(1, sizeof(*pc));
    int e = 0;
    pc->l1 = l1;
    pc->l2s = l2s;
    pc->nl2 = nl2;
    pc->policy = policy;
    pc->max_in_flight = max_in_flight > 0 ? max_in_flight : 1;
    pthread_mutex_init(&pc->lock, NULL);
    pc->epfd = -1;
    pc->qfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (pc->qfd < 0) {
        e = -errno;
        goto fail;
    }
    pc->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (pc->epfd < 0) {
        e = -errno;
        goto fail;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.u32 = UINT32_MAX};
    if (epoll_ctl(pc->epfd, EPOLL_CTL_ADD, pc->qfd, &ev) < 0) {
        e = -errno;
        goto fail;
    }
    for (int a = 0; a < nl2; a++) {
        ev.data.u32 = (uint32_t)a << 1;
        if (epoll_ctl(pc->epfd, EPOLL_CTL_ADD, kvt_l2_efd(l2s[a], KVT_L2_LOOKUP), &ev) < 0) {
            e = -errno;
            goto fail;
        }
        ev.data.u32 = (uint32_t)a << 1 | 1;
        if (epoll_ctl(pc->epfd, EPOLL_CTL_ADD, kvt_l2_efd(l2s[a], KVT_L2_LOAD), &ev) < 0) {
            e = -errno;
            goto fail;
        }
    }
    e = -pthread_create(&pc->thr, NULL, pc_main, pc);
    if (e)
        goto fail;
    *out = pc;
    return 0;
fail:
    if (pc->qfd >= 0)
        close(pc->qfd);
    if (pc->epfd >= 0)
        close(pc->epfd);
    pthread_mutex_destroy(&pc->lock);
    free(pc);
    return e ? e : -EIO;
}

void kvt_prefetch_submit(struct kvt_prefetch_ctrl *pc, const kvt_key *keys, uint32_t n,
                         kvt_prefetch_cb cb, void *arg)
{
    struct req *r = kvt_xcalloc(1, sizeof(*r));
    uint32_t cap = n ? n : 1;
    r->keys = kvt_xmalloc(cap * sizeof(kvt_key));
    memcpy(r->keys, keys, n * sizeof(kvt_key));
    r->n = n;
    r->cb = cb;
    r->arg = arg;
    r->lookups = kvt_xcalloc((size_t)(pc->nl2 ? pc->nl2 : 1), sizeof(kvt_l2_task *));
    r->src = kvt_xmalloc(cap);
    memset(r->src, -1, cap);
    r->st = kvt_xcalloc(cap, 1);
    r->refs = kvt_xcalloc(cap, sizeof(struct kvt_l1_ref));
    atomic_fetch_add(&pc->requests, 1);
    atomic_fetch_add(&pc->keys_asked, n);
    pthread_mutex_lock(&pc->lock);
    if (pc->in_tail)
        pc->in_tail->next = r;
    else
        pc->in_head = r;
    pc->in_tail = r;
    pthread_mutex_unlock(&pc->lock);
    uint64_t one = 1;
    ssize_t w = write(pc->qfd, &one, sizeof(one));
    (void)w;
}

json_t *kvt_prefetch_ctrl_status(struct kvt_prefetch_ctrl *pc)
{
    json_t *o = json_object();
    json_object_set_new(o, "policy",
                        json_string(pc->policy == KVT_PREFETCH_RETAIN ? "retain" : "default"));
    json_object_set_new(o, "max_in_flight", json_integer(pc->max_in_flight));
    json_object_set_new(o, "in_flight", json_integer(atomic_load(&pc->active_pub)));
    json_object_set_new(o, "waiting", json_integer(atomic_load(&pc->waiting_pub)));
    json_object_set_new(o, "waiting_max", json_integer((json_int_t)atomic_load(&pc->queued_max)));
    json_object_set_new(o, "requests", json_integer((json_int_t)atomic_load(&pc->requests)));
    json_object_set_new(o, "keys_asked", json_integer((json_int_t)atomic_load(&pc->keys_asked)));
    json_object_set_new(o, "keys_loaded", json_integer((json_int_t)atomic_load(&pc->keys_loaded)));
    json_object_set_new(o, "keys_already_in_l1",
                        json_integer((json_int_t)atomic_load(&pc->keys_present)));
    json_object_set_new(o, "load_failures",
                        json_integer((json_int_t)atomic_load(&pc->load_failures)));
    return o;
}

void kvt_prefetch_ctrl_stop(struct kvt_prefetch_ctrl *pc)
{
    if (!pc)
        return;
    pthread_mutex_lock(&pc->lock);
    pc->stopping = true;
    pthread_mutex_unlock(&pc->lock);
    uint64_t one = 1;
    ssize_t w = write(pc->qfd, &one, sizeof(one));
    (void)w;
    pthread_join(pc->thr, NULL);
    close(pc->qfd);
    close(pc->epfd);
    pthread_mutex_destroy(&pc->lock);
    free(pc);
}
