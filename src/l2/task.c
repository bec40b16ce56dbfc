/* L2 base: tasks, submit and finish, the done queues, latency, filters. */
#include "l2/base_int.h"
#include "l2/evict.h"
#include "l2/adapters.h"
#include "common/log.h"
#include "common/util.h"
#include "policy/policy.h"
#include "io/tpool.h"
#include "kvtier/error.h"
#include "l2/stage.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <unistd.h>

/* ------------------------------------------------------------- tasks */

/* A task kind the base knows (it indexes efd[], done queues, lat[]). */
static bool kind_ok(enum kvt_l2_kind kind)
{
    return (unsigned)kind <= KVT_L2_LOAD;
}

kvt_l2_task *kvt_l2_task_new(enum kvt_l2_kind kind, uint32_t n)
{
    KVT_ASSERT(kind_ok(kind));
    kvt_l2_task *t = kvt_xcalloc(1, sizeof(*t));
    t->kind = kind;
    t->n = n;
    t->keys = kvt_xcalloc(n, sizeof(kvt_key));
    t->meta = kvt_xcalloc(n, sizeof(kvt_objmeta));
    t->ok = kvt_xcalloc(kvt_bm_words(n), sizeof(uint64_t));
    if (kind != KVT_L2_LOOKUP)
        t->bufs = kvt_xcalloc(n, sizeof(kvt_buf));
    return t;
}

void kvt_l2_task_free(kvt_l2_task *t)
{
    if (!t)
        return;
    free(t->keys);
    free(t->meta);
    free(t->ok);
    free(t->bufs);
    free(t->codes);
    free(t);
}

void kvt_l2_task_ok(kvt_l2_task *t, uint32_t i, uint64_t bytes)
{
    kvt_bm_set_atomic(t->ok, i);
    if (bytes)
        atomic_fetch_add_explicit(&t->bytes, bytes, memory_order_relaxed);
}

/*
 * Keep err for key i and, if it is the first, for the task. The per-key
 * array is made at the first failure, so a task that succeeds allocates
 * nothing more; engine threads failing keys of one task at once race only
 * on installing it (one CAS wins, the others free theirs).
 */
void kvt_l2_task_fail(kvt_l2_task *t, uint32_t i, int err)
{
    /* acquire: pairs with the winner's release below, so its zeroed array
     * is seen complete */
    int32_t *c = atomic_load_explicit(&t->codes, memory_order_acquire);
    if (!c && i < t->n) {
        int32_t *fresh = kvt_xcalloc(t->n, sizeof(int32_t));
        if (atomic_compare_exchange_strong_explicit(&t->codes, &c, fresh, memory_order_acq_rel,
                                                    memory_order_acquire))
            c = fresh;
        else
            free(fresh);
    }
    if (c && i < t->n)
        c[i] = err; /* one engine thread per key: no race on the slot */
    int zero = 0;
    atomic_compare_exchange_strong(&t->err, &zero, err);
}

int kvt_l2_task_code(const kvt_l2_task *t, uint32_t i)
{
    if (i < t->n && kvt_bm_test(t->ok, i))
        return 0;
    /* the task is done: its completion (l2->lock) ordered every write */
    const int32_t *c = atomic_load_explicit(&t->codes, memory_order_relaxed);
    int code = c && i < t->n ? c[i] : 0;
    if (!code)
        code = atomic_load_explicit(&t->err, memory_order_relaxed);
    return code ? code : -EIO;
}

/* ------------------------------------------------------------ contract */

/* L2 batches run from tens of microseconds (a lookup in the index) to
 * seconds (a large load from S3) */
const double kvt_l2_lat_bounds[KVT_L2_LAT_BUCKETS] = {
    50e-6, 100e-6, 250e-6, 500e-6, 1e-3,   2.5e-3, 5e-3, 10e-3,
    25e-3, 50e-3,  100e-3, 250e-3, 500e-3, 1.0,    5.0,  1e300,
};

static void record_latency(kvt_l2 *l2, const kvt_l2_task *t)
{
    struct kvt_l2_lat_hist *h = &l2->lat[t->kind];
    uint64_t dt = kvt_now_ns() - t->submit_ns;
    double sec = (double)dt / 1e9;
    int b = 0;
    while (b < KVT_L2_LAT_BUCKETS - 1 && sec > kvt_l2_lat_bounds[b])
        b++;
    /* relaxed: statistics, read without ordering against anything else */
    atomic_fetch_add_explicit(&h->count, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum_ns, dt, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->bucket[b], 1, memory_order_relaxed);
}

void kvt_l2_latency(kvt_l2 *l2, enum kvt_l2_kind kind, struct kvt_l2_latency *out)
{
    const struct kvt_l2_lat_hist *h = &l2->lat[kind];
    for (int b = 0; b < KVT_L2_LAT_BUCKETS; b++)
        out->bucket[b] = atomic_load_explicit(&h->bucket[b], memory_order_relaxed);
    out->sum_ns = atomic_load_explicit(&h->sum_ns, memory_order_relaxed);
    out->count = atomic_load_explicit(&h->count, memory_order_relaxed);
}

void kvt_l2_submit(kvt_l2 *l2, kvt_l2_task *t)
{
    KVT_ASSERT(kind_ok(t->kind));
    t->submit_ns = kvt_now_ns();
    memset(t->ok, 0, kvt_bm_words(t->n) * sizeof(uint64_t));
    int32_t *codes = atomic_load_explicit(&t->codes, memory_order_relaxed);
    if (codes) /* a resubmitted task: no engine holds it yet */
        memset(codes, 0, t->n * sizeof(int32_t));
    atomic_store(&t->bytes, 0);
    atomic_store(&t->err, 0);
    t->on_done = NULL;
    if (t->n == 0) {
        kvt_l2_task_finish(l2, t);
        return;
    }
    if (l2->taker >= 0 && t->kind != KVT_L2_LOOKUP) {
        const struct kvt_l2_filter *f = &l2->filters[l2->taker];
        f->ops->submit(l2, f->ctx, t); /* e.g. serde: encodes/decodes around the engine */
        return;
    }
    l2->ops->submit(l2, t);
}

/* Post-completion bookkeeping, under the lock: the policy learns stored keys
 * and accessed keys in reverse request order, so that the head of a prefix is
 * the most recent and its tail is evicted first. */
static void finish_policy_locked(kvt_l2 *l2, kvt_l2_task *t)
{
    if (!l2->policy || t->kind == KVT_L2_LOOKUP)
        return;
    for (uint32_t i = t->n; i-- > 0;) {
        if (!kvt_bm_test(t->ok, i))
            continue;
        kvt_key ck;
        kvt_l2_canon(l2, &t->keys[i], &ck);
        uint32_t h = idx_find(&l2->idx, &ck);
        if (h == NOHANDLE)
            continue;
        struct kvt_l2_obj *o = &l2->idx.objs[h];
        if (st(o) != KVT_OBJ_READY)
            continue;
        if (o->state & ST_TRACKED) {
            kvt_policy_access(l2->policy, h);
        } else {
            struct kvt_policy_hint hint = {
                .prefix_pos = i, .prefix_len = t->n, .bytes = o->stored, .fp = kvt_key_hash(&ck)};
            kvt_policy_insert(l2->policy, h, false, &hint);
            o->state |= ST_TRACKED;
        }
    }
}

int kvt_l2_filter_attach(kvt_l2 *l2, const struct kvt_l2_filter_ops *ops, void *ctx)
{
    if (ops->submit && l2->taker >= 0)
        return -EEXIST;
    if (l2->nfilters == KVT_L2_MAX_FILTERS)
        return -ENOSPC;
    if (ops->submit)
        l2->taker = l2->nfilters;
    l2->filters[l2->nfilters++] = (struct kvt_l2_filter){ops, ctx};
    return 0;
}

/*
 * Counters, policy and the done queue for a finished task. With a filter
 * that takes tasks (the serde stage) there are two tasks per STORE/LOAD:
 * the inner one (on_done set) is what the engine ran: it counts the backend
 * bytes and feeds the policy, then goes back to the filter instead of the
 * done queue; the outer one counts load results and is queued for the
 * controller.
 */
void kvt_l2_task_finish(kvt_l2 *l2, kvt_l2_task *t)
{
    KVT_ASSERT(kind_ok(t->kind));
    struct kvt_l2_counters *c = &l2->counters;
    if (t->on_done) {
        atomic_fetch_add(t->kind == KVT_L2_STORE ? &c->bytes_written : &c->bytes_read,
                         atomic_load(&t->bytes));
        pthread_mutex_lock(&l2->lock);
        finish_policy_locked(l2, t);
        pthread_mutex_unlock(&l2->lock);
        t->on_done(l2, t);
        return;
    }
    /* filters see what the controller will see: outer tasks only */
    for (int f = 0; f < l2->nfilters; f++)
        if (l2->filters[f].ops->finish)
            l2->filters[f].ops->finish(l2, l2->filters[f].ctx, t);
    /* inner tasks already counted the backend bytes and fed the policy */
    bool staged = t->kind != KVT_L2_LOOKUP && l2->taker >= 0;
    if (t->n)
        record_latency(l2, t);
    uint32_t hits = (uint32_t)kvt_bm_count(t->ok, t->n);
    switch (t->kind) {
    case KVT_L2_STORE:
        if (!staged)
            atomic_fetch_add(&c->bytes_written, atomic_load(&t->bytes));
        break;
    case KVT_L2_LOOKUP:
        atomic_fetch_add(&c->lookups, t->n);
        atomic_fetch_add(&c->lookup_hits, hits);
        atomic_fetch_add(&c->lookup_misses, t->n - hits);
        break;
    case KVT_L2_LOAD:
        /* a raw object's bytes must be exactly its logical length, and an
         * adapter without serde cannot serve an encoded object (written by
         * an adapter with a chain on the same storage) */
        for (uint32_t i = 0; i < t->n; i++) {
            if (!kvt_bm_test(t->ok, i))
                continue;
            bool foreign = t->meta[i].serde != 0;
            if (foreign || t->bufs[i].len != t->meta[i].len) {
                t->ok[i / 64] &= ~(1ull << (i % 64));
                atomic_fetch_add(foreign ? &c->serde_mismatches : &c->corrupt, 1);
                hits--;
            }
        }
        atomic_fetch_add(&c->load_ok, hits);
        atomic_fetch_add(&c->load_failed, t->n - hits);
        if (!staged)
            atomic_fetch_add(&c->bytes_read, atomic_load(&t->bytes));
        break;
    }
    pthread_mutex_lock(&l2->lock);
    if (!staged)
        finish_policy_locked(l2, t);
    if (t->waiter) { /* kvt_l2_run's: back to its caller */
        pthread_mutex_unlock(&l2->lock);
        kvt_l2b_wake(t);
        return;
    }
    t->next = NULL;
    int k = t->kind;
    if (l2->done_tail[k])
        l2->done_tail[k]->next = t;
    else
        l2->done_head[k] = t;
    l2->done_tail[k] = t;
    pthread_mutex_unlock(&l2->lock);
    /* the mutex is the release that publishes the task's results; the
     * controller takes the same mutex in pop_done */
    uint64_t one = 1;
    ssize_t w = write(l2->efd[k], &one, sizeof(one));
    (void)w; /* EAGAIN only if the counter is saturated: already readable */
}

void kvt_l2_too_big(kvt_l2 *l2, kvt_l2_task *t, uint32_t i, uint64_t len, uint64_t max,
                    const char *what)
{
    atomic_store(&l2->too_big_limit, max);
    atomic_fetch_add(&l2->counters.too_big, 1);
    atomic_fetch_add(&l2->counters.store_failed, 1);
    kvt_l2_task_fail(t, i, KVT_E_TOOBIG);
    char ks[400];
    kvt_warn_once(&l2->warned_too_big,
                  "%s: refused a store of %llu bytes (%s): this adapter holds at most %llu "
                  "bytes per object (%s); such stores are counted in too_big and reported by "
                  "flush (logged once)",
                  l2->name, (unsigned long long)len, kvt_key_str(&t->keys[i], ks, sizeof(ks)),
                  (unsigned long long)max, what);
}

void kvt_l2_task_job_done(kvt_l2 *l2, kvt_l2_task *t)
{
    /* acq_rel: the last job sees every other job's writes before finishing */
    if (atomic_fetch_sub_explicit(&t->pending, 1, memory_order_acq_rel) == 1)
        kvt_l2_task_finish(l2, t);
}

size_t kvt_l2_pop_done(kvt_l2 *l2, enum kvt_l2_kind kind, kvt_l2_task **out, size_t max)
{
    KVT_ASSERT(kind_ok(kind));
    uint64_t v;
    ssize_t r = read(l2->efd[kind], &v, sizeof(v));
    (void)r;
    size_t n = 0;
    pthread_mutex_lock(&l2->lock);
    while (n < max && l2->done_head[kind]) {
        kvt_l2_task *t = l2->done_head[kind];
        KVT_ASSERT(t->kind == kind); /* each queue holds its own kind only */
        l2->done_head[kind] = t->next;
        if (!t->next)
            l2->done_tail[kind] = NULL;
        t->next = NULL;
        out[n++] = t;
    }
    bool more = l2->done_head[kind] != NULL;
    pthread_mutex_unlock(&l2->lock);
    if (more) { /* keep the fd readable for what we left behind */
        uint64_t one = 1;
        ssize_t w = write(l2->efd[kind], &one, sizeof(one));
        (void)w;
    }
    return n;
}
