/*
 * L2 base: object index, accounting, done queues, delete and eviction.
 * Engines (fs.c, mock.c, ...) call the helpers here; controllers call the
 * contract functions. See l2.h for the rules.
 */
#include "l2/engine.h"
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

#define NOHANDLE UINT32_MAX
#define ST_MASK KVT_OBJ_STATE_MASK
#define ST_TRACKED 0x80 /* the policy knows this handle */
#define ST_DOOMED 0x40  /* failed verification: no new pins, removed at the last unpin */

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

/* ------------------------------------------------------------- index */

static uint32_t idx_find(const struct kvt_l2_index *x, const kvt_key *k)
{
    return kvt_kindex_find(&x->map, k);
}

/* Insert a new entry (key must be absent); returns its handle. */
static uint32_t idx_insert(kvt_l2 *l2, const kvt_key *k)
{
    struct kvt_l2_index *x = &l2->idx;
    uint32_t h;
    if (x->free_head != NOHANDLE) {
        h = x->free_head;
        x->free_head = x->objs[h].aux;
    } else {
        if (x->hwm == x->cap_objs) {
            uint32_t ncap = x->cap_objs ? x->cap_objs * 2 : 1024;
            x->objs = kvt_xrealloc(x->objs, (size_t)ncap * sizeof(*x->objs));
            x->map.base = (const char *)x->objs;
            x->cap_objs = ncap;
            kvt_policy_reserve(l2->policy, ncap);
        }
        h = x->hwm++;
    }
    memset(&x->objs[h], 0, sizeof(x->objs[h]));
    x->objs[h].key = *k;
    x->nobjs++;
    kvt_kindex_put(&x->map, h);
    return h;
}

static void idx_remove(struct kvt_l2_index *x, uint32_t h)
{
    /* only a live, unpinned entry leaves the index (kvt_kindex_del checks
     * that the key maps to it) */
    KVT_ASSERT(h < x->hwm && x->nobjs > 0);
    KVT_ASSERT((x->objs[h].state & ST_MASK) != KVT_OBJ_FREE && x->objs[h].pins == 0);
    kvt_kindex_del(&x->map, h);
    x->objs[h].state = KVT_OBJ_FREE;
    x->objs[h].aux = x->free_head;
    x->free_head = h;
    x->nobjs--;
}

struct kvt_l2_obj *kvt_l2_find_locked(kvt_l2 *l2, const kvt_key *ck)
{
    uint32_t h = idx_find(&l2->idx, ck);
    return h == NOHANDLE ? NULL : &l2->idx.objs[h];
}

uint32_t kvt_l2_handle_locked(kvt_l2 *l2, const struct kvt_l2_obj *o)
{
    return (uint32_t)(o - l2->idx.objs);
}

static uint8_t st(const struct kvt_l2_obj *o)
{
    return o->state & ST_MASK;
}

/* May a lookup pin this entry? */
static bool pinnable(const struct kvt_l2_obj *o)
{
    return st(o) == KVT_OBJ_READY && !(o->state & ST_DOOMED) && o->pins < UINT16_MAX;
}

/* -------------------------------------------------- accounting (locked) */

static void ns_add_locked(kvt_l2 *l2, uint32_t ns, int64_t delta, int objs)
{
    if (ns >= l2->ns_bytes_cap) {
        uint32_t ncap = l2->ns_bytes_cap ? l2->ns_bytes_cap : 64;
        while (ncap <= ns)
            ncap *= 2;
        l2->ns_bytes = kvt_xrealloc(l2->ns_bytes, ncap * sizeof(uint64_t));
        memset(l2->ns_bytes + l2->ns_bytes_cap, 0, (ncap - l2->ns_bytes_cap) * sizeof(uint64_t));
        l2->ns_objs = kvt_xrealloc(l2->ns_objs, ncap * sizeof(uint32_t));
        memset(l2->ns_objs + l2->ns_bytes_cap, 0, (ncap - l2->ns_bytes_cap) * sizeof(uint32_t));
        l2->ns_bytes_cap = ncap;
    }
    KVT_ASSERT(delta >= 0 || l2->ns_bytes[ns] >= (uint64_t)-delta); /* no underflow */
    KVT_ASSERT(objs >= 0 || l2->ns_objs[ns] > 0);
    l2->ns_bytes[ns] = (uint64_t)((int64_t)l2->ns_bytes[ns] + delta);
    l2->ns_objs[ns] = (uint32_t)((int32_t)l2->ns_objs[ns] + objs);
}

/* The quota of a namespace id, resolved by name once per id: its index,
 * or -1 when the namespace has none. */
static int quota_of_locked(kvt_l2 *l2, uint32_t ns)
{
    if (!l2->nquotas)
        return -1;
    if (ns >= l2->ns_quota_cap) {
        uint32_t ncap = l2->ns_quota_cap ? l2->ns_quota_cap : 64;
        while (ncap <= ns)
            ncap *= 2;
        l2->ns_quota = kvt_xrealloc(l2->ns_quota, ncap * sizeof(uint32_t));
        memset(l2->ns_quota + l2->ns_quota_cap, 0, (ncap - l2->ns_quota_cap) * sizeof(uint32_t));
        l2->ns_quota_cap = ncap;
    }
    if (l2->ns_quota[ns] == 0) {
        const char *name = kvt_ns_name(ns);
        l2->ns_quota[ns] = 1;
        for (uint32_t i = 0; name && i < l2->nquotas; i++)
            if (strcmp(l2->quotas[i].name, name) == 0)
                l2->ns_quota[ns] = 2 + i;
    }
    return (int)l2->ns_quota[ns] - 2;
}

/* An entry enters (sign +1: reserved, adopted) or leaves (-1) the counted
 * set: every running total follows, so that stats never walk the index.
 * Removing more than was added is a bookkeeping bug: assert. call with
 * l2->lock held */
static void account_locked(kvt_l2 *l2, const struct kvt_l2_obj *o, int sign)
{
    int64_t d = sign * (int64_t)o->stored;
    KVT_ASSERT(d >= 0 || l2->used_bytes >= (uint64_t)-d);
    l2->used_bytes = (uint64_t)((int64_t)l2->used_bytes + d);
    if (o->len) {
        KVT_ASSERT(sign > 0 || (l2->logical_bytes >= o->len && l2->stored_known >= o->stored));
        l2->logical_bytes = (uint64_t)((int64_t)l2->logical_bytes + sign * (int64_t)o->len);
        l2->stored_known = (uint64_t)((int64_t)l2->stored_known + d);
    } else if (o->stored) {
        KVT_ASSERT(sign > 0 || l2->logical_unknown > 0);
        l2->logical_unknown = (uint64_t)((int64_t)l2->logical_unknown + sign);
    }
    ns_add_locked(l2, o->key.ns, d, sign);
    int q = quota_of_locked(l2, o->key.ns);
    if (q >= 0) {
        KVT_ASSERT(d >= 0 || l2->quotas[q].used >= (uint64_t)-d);
        l2->quotas[q].used = (uint64_t)((int64_t)l2->quotas[q].used + d);
    }
}

static void pin_locked_obj(kvt_l2 *l2, struct kvt_l2_obj *o)
{
    if (o->pins++ == 0)
        l2->pinned_objs++;
}

static void unpin_locked_obj(kvt_l2 *l2, struct kvt_l2_obj *o)
{
    if (--o->pins == 0)
        l2->pinned_objs--;
}

void kvt_l2_obj_pin_locked(kvt_l2 *l2, struct kvt_l2_obj *o)
{
    pin_locked_obj(l2, o);
}

void kvt_l2_obj_set_len_locked(kvt_l2 *l2, struct kvt_l2_obj *o, uint32_t len)
{
    account_locked(l2, o, -1);
    o->len = len;
    account_locked(l2, o, +1);
}

void kvt_l2_obj_set_stored_locked(kvt_l2 *l2, struct kvt_l2_obj *o, uint32_t stored)
{
    account_locked(l2, o, -1);
    o->stored = stored;
    account_locked(l2, o, +1);
}

/* Drop an entry: policy, accounting, index. */
static void drop_locked(kvt_l2 *l2, uint32_t h)
{
    struct kvt_l2_obj *o = &l2->idx.objs[h];
    if (o->state & ST_TRACKED)
        kvt_policy_remove(l2->policy, h);
    account_locked(l2, o, -1);
    idx_remove(&l2->idx, h);
}

/* ------------------------------------------------------------ base */

int kvt_l2_base_init(kvt_l2 *l2, const struct kvt_l2_ops *ops, const struct kvt_l2_spec *spec,
                     enum kvt_codec codec, uint64_t cap_bytes)
{
    memset(l2, 0, sizeof(*l2));
    l2->taker = -1; /* no filter yet */
    for (int i = 0; i < 3; i++)
        l2->efd[i] = -1; /* before any failure: the caller's cleanup closes them */
    l2->ops = ops;
    snprintf(l2->type, sizeof(l2->type), "%s", spec->type);
    snprintf(l2->name, sizeof(l2->name), "%s[%d]",
             spec->name_prefix[0] ? spec->name_prefix : spec->type, spec->index);
    l2->index = spec->index;
    l2->codec = codec;
    l2->cap_bytes = cap_bytes;
    l2->persist_enabled = spec->persist_enabled;
    if (spec->has_eviction) {
        /* the object kvt_l2_spec_parse validated (it carries the value
         * policy's parameters too): parsed once more here, never replaced by
         * defaults */
        const json_t *ev = spec->json ? json_object_get(spec->json, "eviction") : NULL;
        char e[256] = "no eviction object";
        if (!ev || kvt_policy_from_json(ev, &l2->policy, e, sizeof(e))) {
            kvt_error("%s: eviction: %s", l2->name, e);
            return KVT_E_CONFIG;
        }
    }
    if (spec->quotas && json_object_size(spec->quotas)) {
        l2->nquotas = (uint32_t)json_object_size(spec->quotas);
        l2->quotas = kvt_xcalloc(l2->nquotas, sizeof(*l2->quotas));
        const char *qn;
        json_t *qv;
        uint32_t i = 0;
        json_object_foreach(spec->quotas, qn, qv)
        {
            l2->quotas[i].name = kvt_xstrdup(qn);
            l2->quotas[i++].limit = (uint64_t)json_integer_value(qv);
        }
    }
    l2->idx.free_head = NOHANDLE;
    pthread_cond_init(&l2->evict_cv, NULL);
    kvt_kindex_init(&l2->idx.map, sizeof(struct kvt_l2_obj), offsetof(struct kvt_l2_obj, key));
    for (int i = 0; i < 3; i++) {
        l2->efd[i] = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (l2->efd[i] < 0) {
            int e = -errno;
            kvt_l2_base_destroy(l2);
            return e;
        }
    }
    pthread_mutex_init(&l2->lock, NULL);
    return 0;
}

void kvt_l2_base_destroy(kvt_l2 *l2)
{
    for (int i = 0; i < 3; i++)
        if (l2->efd[i] >= 0)
            close(l2->efd[i]);
    for (int k = 0; k < 3; k++) {
        kvt_l2_task *t = l2->done_head[k];
        while (t) {
            kvt_l2_task *n = t->next;
            kvt_l2_task_free(t);
            t = n;
        }
    }
    free(l2->idx.objs);
    kvt_kindex_free(&l2->idx.map);
    free(l2->reap_h);
    free(l2->reap_copy);
    free(l2->ns_bytes);
    free(l2->ns_objs);
    for (uint32_t i = 0; i < l2->nquotas; i++)
        free(l2->quotas[i].name);
    free(l2->quotas);
    free(l2->ns_quota);
    l2->quotas = NULL;
    l2->nquotas = 0;
    kvt_policy_destroy(l2->policy);
    l2->policy = NULL;
    pthread_cond_destroy(&l2->evict_cv);
}

/* ------------------------------------------------------------ contract */

/* L2 batches run from tens of microseconds (a lookup in the index) to
 * seconds (a large load from S3) */
const double kvt_l2_lat_bounds[KVT_L2_LAT_BUCKETS] = {
    50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3,
    25e-3, 50e-3,  100e-3, 250e-3, 500e-3, 1.0,  5.0,  1e300,
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
            struct kvt_policy_hint hint = {.prefix_pos = i, .prefix_len = t->n,
                                           .bytes = o->stored, .fp = kvt_key_hash(&ck)};
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

bool kvt_l2_filtered(const kvt_l2 *l2)
{
    return l2->taker >= 0;
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

/* Queue a doomed, unpinned READY entry for kvt_l2_reap. call with lock held */
static void reap_queue_locked(kvt_l2 *l2, uint32_t h)
{
    struct kvt_l2_obj *o = &l2->idx.objs[h];
    o->state = (uint8_t)((o->state & (ST_TRACKED | ST_DOOMED)) | KVT_OBJ_DELETING);
    if (l2->nreap == l2->reap_cap) {
        l2->reap_cap = l2->reap_cap ? 2 * l2->reap_cap : 16;
        l2->reap_h = kvt_xrealloc(l2->reap_h, l2->reap_cap * sizeof(*l2->reap_h));
        l2->reap_copy = kvt_xrealloc(l2->reap_copy, l2->reap_cap * sizeof(*l2->reap_copy));
    }
    l2->reap_h[l2->nreap] = h;
    l2->reap_copy[l2->nreap++] = *o;
}

void kvt_l2_unlock(kvt_l2 *l2, const kvt_key *keys, uint32_t n)
{
    pthread_mutex_lock(&l2->lock);
    for (uint32_t i = 0; i < n; i++) {
        kvt_key ck;
        kvt_l2_canon(l2, &keys[i], &ck);
        uint32_t h = idx_find(&l2->idx, &ck);
        if (h == NOHANDLE || l2->idx.objs[h].pins == 0)
            continue;
        struct kvt_l2_obj *o = &l2->idx.objs[h];
        unpin_locked_obj(l2, o);
        if (o->pins == 0 && (o->state & ST_DOOMED) && st(o) == KVT_OBJ_READY)
            reap_queue_locked(l2, h);
    }
    pthread_mutex_unlock(&l2->lock);
}

void kvt_l2_doom(kvt_l2 *l2, const kvt_key *ck)
{
    pthread_mutex_lock(&l2->lock);
    uint32_t h = idx_find(&l2->idx, ck);
    if (h != NOHANDLE && st(&l2->idx.objs[h]) == KVT_OBJ_READY) {
        l2->idx.objs[h].state |= ST_DOOMED;
        if (l2->idx.objs[h].pins == 0)
            reap_queue_locked(l2, h);
    }
    pthread_mutex_unlock(&l2->lock);
}

/*
 * Remove entries already marked DELETING: the engine removes the bytes
 * without the lock (an unlink must not stall lookups), then the entry goes.
 * If the engine fails to remove, the entry is forgotten anyway only when the
 * object is gone (ENOENT); otherwise it returns to READY.
 */
static uint64_t remove_marked(kvt_l2 *l2, uint32_t *hs, struct kvt_l2_obj *copies, uint32_t n,
                              uint64_t *removed_bits, const uint32_t *bit_of, bool eviction,
                              uint32_t *nremoved)
{
    uint32_t cnt = 0;
    int *rcs = kvt_xcalloc(n ? n : 1, sizeof(int));
    if (l2->ops->remove_batch && n)
        l2->ops->remove_batch(l2, copies, n, rcs);
    else
        for (uint32_t i = 0; i < n; i++)
            rcs[i] = l2->ops->remove ? l2->ops->remove(l2, &copies[i]) : 0;
    uint64_t freed = 0;
    pthread_mutex_lock(&l2->lock);
    for (uint32_t i = 0; i < n; i++) {
        struct kvt_l2_obj *o = &l2->idx.objs[hs[i]];
        if (eviction) /* marked by victim_visit: settled now, either way */
            l2->evicting_bytes -= KVT_MIN(l2->evicting_bytes, (uint64_t)copies[i].stored);
        if (rcs[i] == 0 || rcs[i] == -ENOENT) {
            freed += o->stored;
            cnt++;
            drop_locked(l2, hs[i]);
            atomic_fetch_add(&l2->counters.deleted, 1);
            if (eviction) {
                atomic_fetch_add(&l2->counters.evictions, 1);
                atomic_fetch_add(&l2->counters.reclaimed_bytes, copies[i].stored);
            }
            if (removed_bits && bit_of)
                kvt_bm_set(removed_bits, bit_of[i]);
        } else {
            /* back to READY; a doomed one stays doomed (never pinned again)
             * and is queued for the next reap */
            o->state = (uint8_t)((o->state & (ST_TRACKED | ST_DOOMED)) | KVT_OBJ_READY);
            if ((o->state & ST_DOOMED) && o->pins == 0)
                reap_queue_locked(l2, hs[i]);
            char ks[400];
            kvt_warn("%s: could not remove %s: %s", l2->name,
                     kvt_key_str(&copies[i].key, ks, sizeof(ks)), kvt_strerror(rcs[i]));
        }
    }
    if (eviction)
        pthread_cond_broadcast(&l2->evict_cv);
    pthread_mutex_unlock(&l2->lock);
    free(rcs);
    if (nremoved)
        *nremoved = cnt;
    return freed;
}

/* The handle of key's ready, unpinned entry (what a delete may take), or
 * NOHANDLE. call with l2->lock held */
static uint32_t deletable_locked(kvt_l2 *l2, const kvt_key *key)
{
    kvt_key ck;
    kvt_l2_canon(l2, key, &ck);
    uint32_t h = idx_find(&l2->idx, &ck);
    if (h == NOHANDLE)
        return NOHANDLE;
    const struct kvt_l2_obj *o = &l2->idx.objs[h];
    return st(o) == KVT_OBJ_READY && !o->pins ? h : NOHANDLE;
}

uint32_t kvt_l2_delete(kvt_l2 *l2, const kvt_key *keys, uint32_t n, uint64_t *removed)
{
    uint32_t *hs = kvt_xcalloc(n ? n : 1, sizeof(uint32_t));
    uint32_t *bit = kvt_xcalloc(n ? n : 1, sizeof(uint32_t));
    struct kvt_l2_obj *copies = kvt_xcalloc(n ? n : 1, sizeof(*copies));
    uint32_t m = 0;
    pthread_mutex_lock(&l2->lock);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t h = deletable_locked(l2, &keys[i]);
        if (h == NOHANDLE)
            continue;
        struct kvt_l2_obj *o = &l2->idx.objs[h];
        o->state = (uint8_t)((o->state & ST_TRACKED) | KVT_OBJ_DELETING);
        hs[m] = h;
        bit[m] = i;
        copies[m++] = *o;
    }
    pthread_mutex_unlock(&l2->lock);
    uint32_t count = 0;
    remove_marked(l2, hs, copies, m, removed, bit, false, &count);
    free(hs);
    free(bit);
    free(copies);
    return count;
}

uint32_t kvt_l2_drop_gone(kvt_l2 *l2, const kvt_key *ck, uint32_t n)
{
    uint32_t count = 0;
    pthread_mutex_lock(&l2->lock);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t h = deletable_locked(l2, &ck[i]);
        if (h == NOHANDLE)
            continue;
        drop_locked(l2, h);
        atomic_fetch_add(&l2->counters.deleted, 1);
        count++;
    }
    pthread_mutex_unlock(&l2->lock);
    return count;
}

void kvt_l2_slot_corrupt(kvt_l2 *l2, const kvt_key *key, uint32_t slot, const char *why)
{
    kvt_key ck;
    kvt_l2_canon(l2, key, &ck);
    atomic_fetch_add(&l2->counters.corrupt, 1);
    kvt_l2_doom(l2, &ck);
    char ks[400], where[32] = "";
    if (slot != UINT32_MAX)
        snprintf(where, sizeof(where), " in slot %u", slot);
    kvt_warn("%s: %s%s failed verification (%s): a miss, removed once its readers are done",
             l2->name, kvt_key_str(key, ks, sizeof(ks)), where, why);
}

uint32_t kvt_l2_reap(kvt_l2 *l2)
{
    pthread_mutex_lock(&l2->lock);
    uint32_t n = l2->nreap, count = 0;
    uint32_t *hs = l2->reap_h;
    struct kvt_l2_obj *copies = l2->reap_copy;
    l2->reap_h = NULL;
    l2->reap_copy = NULL;
    l2->nreap = l2->reap_cap = 0;
    pthread_mutex_unlock(&l2->lock);
    if (n) {
        remove_marked(l2, hs, copies, n, NULL, NULL, false, &count);
        char ks[400];
        kvt_info("%s: removed %u of %u objects that failed verification (first: %s)", l2->name,
                 count, n, kvt_key_str(&copies[0].key, ks, sizeof(ks)));
    }
    free(hs);
    free(copies);
    return count;
}

struct victim_ctx {
    kvt_l2 *l2;
    uint32_t *hs;
    struct kvt_l2_obj *copies;
    uint32_t n, max;
    uint64_t need; /* bytes still to free */
};

static bool victim_visit(uint32_t h, void *arg)
{
    struct victim_ctx *v = arg;
    struct kvt_l2_obj *o = &v->l2->idx.objs[h];
    if (st(o) == KVT_OBJ_READY && o->pins == 0) {
        o->state = (uint8_t)((o->state & ST_TRACKED) | KVT_OBJ_DELETING);
        v->hs[v->n] = h;
        v->copies[v->n++] = *o;
        v->l2->evicting_bytes += o->stored;
        v->need = v->need > o->stored ? v->need - o->stored : 0;
    }
    return v->n < v->max && v->need > 0;
}

/* kvt_l2_evict_to; *stuck: it stopped above the target because nothing
 * left could be marked (pinned, in flight, or marked by another eviction). */
static uint64_t evict_to(kvt_l2 *l2, uint64_t target, uint32_t batch, bool *stuck)
{
    *stuck = false;
    if (!l2->policy || batch == 0)
        return 0;
    uint64_t total = 0;
    uint32_t *hs = kvt_xcalloc(batch, sizeof(uint32_t));
    struct kvt_l2_obj *copies = kvt_xcalloc(batch, sizeof(*copies));
    for (;;) {
        struct victim_ctx v = {.l2 = l2, .hs = hs, .copies = copies, .max = batch};
        pthread_mutex_lock(&l2->lock);
        uint64_t live = l2->used_bytes - KVT_MIN(l2->used_bytes, l2->evicting_bytes);
        if (live <= target || l2->closing) {
            pthread_mutex_unlock(&l2->lock);
            break; /* there, or other evictions in flight will get it there */
        }
        v.need = live - target;
        l2->policy->ops->walk(l2->policy, victim_visit, &v);
        pthread_mutex_unlock(&l2->lock);
        if (v.n == 0) {
            *stuck = true; /* everything left is pinned or in flight: retry next wake */
            break;
        }
        uint64_t freed = remove_marked(l2, hs, copies, v.n, NULL, NULL, true, NULL);
        total += freed;
        if (freed == 0) {
            *stuck = true;
            break;
        }
    }
    free(hs);
    free(copies);
    return total;
}

uint64_t kvt_l2_evict_to(kvt_l2 *l2, uint64_t target, uint32_t batch)
{
    bool stuck;
    return evict_to(l2, target, batch, &stuck);
}

struct qvictim_ctx {
    struct victim_ctx v;
    int quota;
};

static bool qvictim_visit(uint32_t h, void *arg)
{
    struct qvictim_ctx *q = arg;
    kvt_l2 *l2 = q->v.l2;
    if (quota_of_locked(l2, l2->idx.objs[h].key.ns) != q->quota)
        return true; /* another namespace: keep walking */
    return victim_visit(h, &q->v);
}

/*
 * Per-namespace eviction. The policy walk is shared by all namespaces, so
 * this visits other namespaces' entries on its way (O(objects) in the worst
 * case, under l2->lock like kvt_l2_evict_to's walk); it runs on the eviction
 * thread only for namespaces at their quota watermark.
 */
uint64_t kvt_l2_evict_quotas(kvt_l2 *l2, uint32_t batch)
{
    if (!l2->policy || !l2->nquotas || batch == 0)
        return 0;
    uint64_t total = 0;
    uint32_t *hs = kvt_xcalloc(batch, sizeof(uint32_t));
    struct kvt_l2_obj *copies = kvt_xcalloc(batch, sizeof(*copies));
    double wm = l2->policy->trigger_watermark, ratio = l2->policy->eviction_ratio;
    for (uint32_t qi = 0; qi < l2->nquotas; qi++) {
        struct kvt_l2_quota *qt = &l2->quotas[qi];
        pthread_mutex_lock(&l2->lock);
        bool over = qt->used && (double)qt->used >= wm * (double)qt->limit;
        uint64_t target = (uint64_t)((double)qt->used * (1.0 - ratio));
        if (qt->used > qt->limit && target > qt->limit)
            target = qt->limit;
        pthread_mutex_unlock(&l2->lock);
        while (over) {
            struct qvictim_ctx q = {
                .v = {.l2 = l2, .hs = hs, .copies = copies, .max = batch}, .quota = (int)qi};
            pthread_mutex_lock(&l2->lock);
            if (qt->used <= target || l2->closing) {
                pthread_mutex_unlock(&l2->lock);
                break;
            }
            q.v.need = qt->used - target;
            l2->policy->ops->walk(l2->policy, qvictim_visit, &q);
            pthread_mutex_unlock(&l2->lock);
            if (q.v.n == 0)
                break; /* pinned or in flight: next wake */
            uint32_t nrem = 0;
            uint64_t freed = remove_marked(l2, hs, copies, q.v.n, NULL, NULL, true, &nrem);
            atomic_fetch_add(&l2->counters.quota_evictions, nrem);
            total += freed;
            if (freed == 0)
                break;
        }
    }
    free(hs);
    free(copies);
    return total;
}

const char *kvt_l2_name(const kvt_l2 *l2)
{
    return l2->name;
}

const char *kvt_l2_type(const kvt_l2 *l2)
{
    return l2->type;
}

int kvt_l2_efd(const kvt_l2 *l2, enum kvt_l2_kind kind)
{
    return l2->efd[kind];
}

bool kvt_l2_recovering(kvt_l2 *l2)
{
    pthread_mutex_lock(&l2->lock);
    bool rec = l2->recovering;
    pthread_mutex_unlock(&l2->lock);
    return rec;
}

bool kvt_l2_indexed(kvt_l2 *l2, const kvt_key *key)
{
    kvt_key ck;
    kvt_l2_canon(l2, key, &ck);
    pthread_mutex_lock(&l2->lock);
    bool in = idx_find(&l2->idx, &ck) != NOHANDLE;
    pthread_mutex_unlock(&l2->lock);
    return in;
}

void kvt_l2_root(kvt_l2 *l2, char *out, size_t cap)
{
    out[0] = 0;
    if (l2->ops->root)
        l2->ops->root(l2, out, cap);
}

bool kvt_l2_evict_params(kvt_l2 *l2, double *watermark, double *ratio)
{
    if (!l2->policy)
        return false;
    *watermark = l2->policy->trigger_watermark;
    *ratio = l2->policy->eviction_ratio;
    return true;
}

bool kvt_l2_has_quotas(kvt_l2 *l2)
{
    return l2->nquotas != 0; /* the list is immutable */
}

#define LOAD(f) out->f = atomic_load_explicit(&c->f, memory_order_relaxed)

void kvt_l2_stats(kvt_l2 *l2, struct kvt_l2_stats *out)
{
    memset(out, 0, sizeof(*out));
    const struct kvt_l2_counters *c = &l2->counters;
    LOAD(store_ok);
    LOAD(store_failed);
    LOAD(store_skipped);
    LOAD(rejected_writes);
    LOAD(lookups);
    LOAD(lookup_hits);
    LOAD(lookup_misses);
    LOAD(secondary_hits);
    LOAD(load_ok);
    LOAD(load_failed);
    LOAD(corrupt);
    LOAD(bytes_written);
    LOAD(bytes_read);
    LOAD(deleted);
    LOAD(evictions);
    LOAD(reclaimed_bytes);
    LOAD(sync_evictions);
    LOAD(too_big);
    LOAD(odirect_fallbacks);
    LOAD(serde_mismatches);
    LOAD(quota_rejections);
    LOAD(quota_evictions);
    pthread_mutex_lock(&l2->lock);
    out->used_bytes = l2->used_bytes;
    out->cap_bytes = l2->cap_bytes;
    out->objects = l2->idx.nobjs;
    out->logical_bytes = l2->logical_bytes;
    out->stored_known_bytes = l2->stored_known;
    out->logical_unknown = l2->logical_unknown;
    out->pinned_objects = l2->pinned_objs;
    out->recovering = l2->recovering;
    out->recovered_objs = l2->recovered_objs;
    out->recovered_bytes = l2->recovered_bytes;
    out->recovery_seconds = l2->recovery_seconds;
    pthread_mutex_unlock(&l2->lock);
}

#undef LOAD

bool kvt_l2_scan(kvt_l2 *l2, uint32_t *cursor, bool (*visit)(const struct kvt_l2_entry *e, void *arg),
                 void *arg)
{
    pthread_mutex_lock(&l2->lock);
    uint32_t h = *cursor;
    bool more = true;
    for (; h < l2->idx.hwm && more; h++) {
        const struct kvt_l2_obj *o = &l2->idx.objs[h];
        if (st(o) == KVT_OBJ_FREE)
            continue;
        struct kvt_l2_entry e = {.key = o->key, .stored = o->stored, .len = o->len,
                                 .pins = o->pins, .ready = st(o) == KVT_OBJ_READY};
        more = visit(&e, arg);
    }
    bool end = h >= l2->idx.hwm;
    pthread_mutex_unlock(&l2->lock);
    *cursor = h;
    return end;
}

void kvt_l2_usage(kvt_l2 *l2, struct kvt_l2_usage *u)
{
    pthread_mutex_lock(&l2->lock);
    u->used_bytes = l2->used_bytes;
    u->cap_bytes = l2->cap_bytes;
    u->objects = l2->idx.nobjs;
    pthread_mutex_unlock(&l2->lock);
    u->fraction = u->cap_bytes ? (double)u->used_bytes / (double)u->cap_bytes : -1.0;
}

bool kvt_l2_healthy(kvt_l2 *l2, char *msg, size_t cap)
{
    if (l2->ops->healthy)
        return l2->ops->healthy(l2, msg, cap);
    snprintf(msg, cap, "ok");
    return true;
}

#define C(name) json_integer((json_int_t)x.name)

json_t *kvt_l2_status(kvt_l2 *l2)
{
    struct kvt_l2_stats x;
    kvt_l2_stats(l2, &x);
    double fraction = x.cap_bytes ? (double)x.used_bytes / (double)x.cap_bytes : -1.0;
    char msg[256];
    bool ok = kvt_l2_healthy(l2, msg, sizeof(msg));
    json_t *o = json_object();
    json_object_set_new(o, "name", json_string(l2->name));
    json_object_set_new(o, "type", json_string(l2->type));
    json_object_set_new(o, "index", json_integer(l2->index));
    json_object_set_new(o, "is_healthy", json_boolean(ok));
    json_object_set_new(o, "health", json_string(msg));
    json_object_set_new(o, "used_bytes", json_integer((json_int_t)x.used_bytes));
    json_object_set_new(o, "capacity_bytes", json_integer((json_int_t)x.cap_bytes));
    json_object_set_new(o, "free_bytes",
                        x.cap_bytes ? json_integer((json_int_t)(x.cap_bytes > x.used_bytes
                                                                    ? x.cap_bytes - x.used_bytes
                                                                    : 0))
                                    : json_null());
    json_object_set_new(o, "usage_fraction", json_real(fraction));
    json_object_set_new(o, "objects", json_integer((json_int_t)x.objects));
    json_object_set_new(o, "persist_enabled", json_boolean(l2->persist_enabled));

    json_t *per_ns = json_object(), *per_salt = json_object();
    pthread_mutex_lock(&l2->lock);
    for (uint32_t ns = 1; ns < l2->ns_bytes_cap; ns++) {
        if (!l2->ns_bytes[ns])
            continue;
        const char *name = kvt_ns_name(ns), *salt = kvt_ns_salt(ns);
        json_t *cur = json_object_get(per_ns, name);
        json_int_t v = (json_int_t)l2->ns_bytes[ns];
        json_object_set_new(per_ns, name, json_integer(v + (cur ? json_integer_value(cur) : 0)));
        cur = json_object_get(per_salt, salt);
        json_object_set_new(per_salt, salt, json_integer(v + (cur ? json_integer_value(cur) : 0)));
    }
    json_t *quotas = NULL;
    if (l2->nquotas) {
        quotas = json_object();
        for (uint32_t i = 0; i < l2->nquotas; i++) {
            const struct kvt_l2_quota *qt = &l2->quotas[i];
            json_t *e = json_object();
            json_object_set_new(e, "quota_bytes", json_integer((json_int_t)qt->limit));
            json_object_set_new(e, "used_bytes", json_integer((json_int_t)qt->used));
            json_object_set_new(e, "usage_fraction",
                                qt->limit ? json_real((double)qt->used / (double)qt->limit)
                                          : json_null());
            json_object_set_new(e, "rejected_writes", json_integer((json_int_t)qt->rejected));
            json_object_set_new(quotas, qt->name, e);
        }
    }
    json_t *per_ns_objs = json_object();
    for (uint32_t ns = 1; ns < l2->ns_bytes_cap; ns++) {
        if (!l2->ns_objs[ns])
            continue;
        const char *name = kvt_ns_name(ns);
        json_t *cur = json_object_get(per_ns_objs, name);
        json_object_set_new(per_ns_objs, name,
                            json_integer(l2->ns_objs[ns] + (cur ? json_integer_value(cur) : 0)));
    }
    const char *pname = l2->policy ? l2->policy->ops->name : NULL;
    double wm = l2->policy ? l2->policy->trigger_watermark : 0,
           ratio = l2->policy ? l2->policy->eviction_ratio : 0;
    pthread_mutex_unlock(&l2->lock);
    json_object_set_new(o, "per_namespace_bytes", per_ns);
    json_object_set_new(o, "per_namespace_objects", per_ns_objs);
    json_object_set_new(o, "namespace_quotas", quotas ? quotas : json_null());
    json_object_set_new(o, "bytes_by_cache_salt", per_salt);
    json_object_set_new(o, "pinned_objects", json_integer((json_int_t)x.pinned_objects));
    /* stored bytes are what the backend holds (after serde and headers);
     * the ratio covers the objects whose logical length is known */
    json_object_set_new(o, "stored_bytes", json_integer((json_int_t)x.used_bytes));
    json_object_set_new(o, "logical_bytes", json_integer((json_int_t)x.logical_bytes));
    json_object_set_new(o, "logical_unknown_objects", json_integer((json_int_t)x.logical_unknown));
    json_object_set_new(o, "stored_to_logical_ratio",
                        x.logical_bytes ? json_real((double)x.stored_known_bytes /
                                                    (double)x.logical_bytes)
                                : json_null());

    json_t *rec = json_object();
    json_object_set_new(rec, "state", json_string(x.recovering ? "running" : "done"));
    json_object_set_new(rec, "objects", json_integer((json_int_t)x.recovered_objs));
    json_object_set_new(rec, "bytes", json_integer((json_int_t)x.recovered_bytes));
    json_object_set_new(rec, "seconds", json_real(x.recovery_seconds));
    json_object_set_new(o, "recovery", rec);

    json_t *ev = json_object();
    json_object_set_new(ev, "policy", pname ? json_string(pname) : json_null());
    if (pname) {
        json_object_set_new(ev, "trigger_watermark", json_real(wm));
        json_object_set_new(ev, "eviction_ratio", json_real(ratio));
    }
    json_object_set_new(o, "eviction", ev);

    json_t *c = json_object();
    json_object_set_new(c, "store_ok", C(store_ok));
    json_object_set_new(c, "store_failed", C(store_failed));
    json_object_set_new(c, "store_skipped", C(store_skipped));
    json_object_set_new(c, "rejected_writes", C(rejected_writes));
    json_object_set_new(c, "lookups", C(lookups));
    json_object_set_new(c, "lookup_hits", C(lookup_hits));
    json_object_set_new(c, "lookup_misses", C(lookup_misses));
    json_object_set_new(c, "secondary_hits", C(secondary_hits));
    json_object_set_new(c, "load_ok", C(load_ok));
    json_object_set_new(c, "load_failed", C(load_failed));
    json_object_set_new(c, "corrupt", C(corrupt));
    json_object_set_new(c, "bytes_written", C(bytes_written));
    json_object_set_new(c, "bytes_read", C(bytes_read));
    json_object_set_new(c, "deleted", C(deleted));
    json_object_set_new(c, "evictions", C(evictions));
    json_object_set_new(c, "sync_evictions", C(sync_evictions));
    json_object_set_new(c, "too_big", C(too_big));
    json_object_set_new(c, "reclaimed_bytes", C(reclaimed_bytes));
    json_object_set_new(c, "odirect_fallbacks", C(odirect_fallbacks));
    json_object_set_new(c, "serde_mismatches", C(serde_mismatches));
    json_object_set_new(c, "quota_rejections", C(quota_rejections));
    json_object_set_new(c, "quota_evictions", C(quota_evictions));
    json_object_set_new(o, "counters", c);
    json_object_set_new(o, "serde", json_null()); /* the serde filter fills it in */
    if (l2->ops->status)
        l2->ops->status(l2, o);
    for (int f = 0; f < l2->nfilters; f++)
        if (l2->filters[f].ops->status)
            l2->filters[f].ops->status(l2, l2->filters[f].ctx, o);
    return o;
}

void kvt_l2_close(kvt_l2 *l2)
{
    pthread_mutex_lock(&l2->lock);
    l2->closing = true;
    pthread_mutex_unlock(&l2->lock);
    /* serde: stores still being encoded reach the engine first, the engine
     * drains (its completions queue decodes on the serde pool), then the
     * pool runs what is left */
    for (int f = 0; f < l2->nfilters; f++)
        if (l2->filters[f].ops->quiesce)
            l2->filters[f].ops->quiesce(l2, l2->filters[f].ctx);
    kvt_l2_reap(l2); /* the engine still runs: doomed objects go now */
    if (l2->ops->close)
        l2->ops->close(l2);
    /* last attached first: a detach may still finish tasks (serde's last
     * decodes), which the filters attached before it see */
    for (int f = l2->nfilters; f-- > 0;)
        if (l2->filters[f].ops->detach)
            l2->filters[f].ops->detach(l2, l2->filters[f].ctx);
    l2->nfilters = 0;
    l2->taker = -1;
    kvt_l2_base_destroy(l2);
}

/* ------------------------------------------------------ engine helpers */

/* Wait (l2->lock held) until an eviction in flight settles, at most 2 s.
 * Returns whether there was one to wait for. */
static bool wait_evictions_locked(kvt_l2 *l2)
{
    if (!l2->evicting_bytes || l2->closing)
        return false;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 2;
    uint64_t before = l2->evicting_bytes;
    while (!l2->closing && l2->evicting_bytes == before)
        if (pthread_cond_timedwait(&l2->evict_cv, &l2->lock, &until) == ETIMEDOUT)
            break;
    return true;
}

/*
 * A store that does not fit under the cap, on an adapter with an eviction
 * policy: make room now, as the eviction controller would on its next
 * wake (down to used x (1 - eviction_ratio)), but at least room for this
 * object; the policy chooses, pinned and in-flight objects are never taken
 * (kvt_l2_evict_to). Runs on the engine's store thread, without l2->lock.
 * Returns whether the store may try again: this thread freed something, or
 * there is room now (evictions in flight elsewhere made it).
 */
static bool make_room(kvt_l2 *l2, uint32_t stored)
{
    pthread_mutex_lock(&l2->lock);
    uint64_t used = l2->used_bytes, cap = l2->cap_bytes;
    uint64_t live = used - KVT_MIN(used, l2->evicting_bytes);
    double ratio = l2->policy ? l2->policy->eviction_ratio : 0;
    if (!cap || stored > cap) {
        pthread_mutex_unlock(&l2->lock);
        return false; /* never fits */
    }
    if (live + stored <= cap) { /* room now, or once the evictions in flight settle */
        if (used + stored > cap)
            wait_evictions_locked(l2);
        pthread_mutex_unlock(&l2->lock);
        return true; /* look again */
    }
    pthread_mutex_unlock(&l2->lock);
    uint64_t target = KVT_MIN(cap - stored, (uint64_t)((double)live * (1.0 - ratio)));
    bool stuck;
    uint64_t freed = evict_to(l2, target, 256, &stuck);
    if (freed) {
        atomic_fetch_add(&l2->counters.sync_evictions, 1);
        kvt_debug("%s: a store of %u bytes did not fit under the cap: evicted %llu bytes now",
                  l2->name, stored, (unsigned long long)freed);
        return true;
    }
    /* Nothing freed by this thread: other threads got there first (their
     * evictions settled down to the target, or are in flight with what this
     * one would have marked), or everything left is pinned or in flight.
     * Only the last is a refusal. */
    if (!stuck)
        return true; /* the target was reached by others: look again */
    pthread_mutex_lock(&l2->lock);
    bool again = wait_evictions_locked(l2) || l2->used_bytes + stored <= l2->cap_bytes;
    pthread_mutex_unlock(&l2->lock);
    return again;
}

int kvt_l2_reserve(kvt_l2 *l2, const kvt_key *ck, uint32_t stored, uint32_t len, uint32_t aux,
                   uint8_t flags)
{
    int rc = 0, q;
    for (int attempt = 0;; attempt++) {
        pthread_mutex_lock(&l2->lock);
        bool over = !l2->closing && l2->cap_bytes && l2->used_bytes + stored > l2->cap_bytes &&
                    idx_find(&l2->idx, ck) == NOHANDLE;
        bool evict = over && l2->policy && !l2->no_sync_evict && attempt < 16;
        if (!evict)
            break; /* with the lock held */
        pthread_mutex_unlock(&l2->lock);
        if (!make_room(l2, stored)) {
            pthread_mutex_lock(&l2->lock);
            break; /* everything left is pinned or in flight: refused below */
        }
    }
    if (l2->closing) {
        rc = -ESHUTDOWN;
    } else if (idx_find(&l2->idx, ck) != NOHANDLE) {
        rc = -EEXIST;
    } else if (l2->cap_bytes && l2->used_bytes + stored > l2->cap_bytes) {
        rc = KVT_E_FULL;
        atomic_fetch_add(&l2->counters.rejected_writes, 1);
    } else if ((q = quota_of_locked(l2, ck->ns)) >= 0 &&
               l2->quotas[q].used + stored > l2->quotas[q].limit) {
        rc = KVT_E_LIMIT;
        l2->quotas[q].rejected++;
        atomic_fetch_add(&l2->counters.rejected_writes, 1);
        atomic_fetch_add(&l2->counters.quota_rejections, 1);
    } else {
        uint32_t h = idx_insert(l2, ck);
        struct kvt_l2_obj *o = &l2->idx.objs[h];
        o->stored = stored;
        o->len = len;
        o->aux = aux;
        o->flags = flags;
        o->state = KVT_OBJ_WRITING;
        account_locked(l2, o, +1);
    }
    pthread_mutex_unlock(&l2->lock);
    return rc;
}

static void publish(kvt_l2 *l2, const kvt_key *ck, bool set_aux, uint32_t aux)
{
    pthread_mutex_lock(&l2->lock);
    uint32_t h = idx_find(&l2->idx, ck);
    if (h != NOHANDLE && st(&l2->idx.objs[h]) == KVT_OBJ_WRITING) {
        if (set_aux)
            l2->idx.objs[h].aux = aux;
        l2->idx.objs[h].state = KVT_OBJ_READY;
    }
    pthread_mutex_unlock(&l2->lock);
}

void kvt_l2_publish(kvt_l2 *l2, const kvt_key *ck)
{
    publish(l2, ck, false, 0);
}

void kvt_l2_publish_aux(kvt_l2 *l2, const kvt_key *ck, uint32_t aux)
{
    publish(l2, ck, true, aux);
}

void kvt_l2_unreserve(kvt_l2 *l2, const kvt_key *ck)
{
    pthread_mutex_lock(&l2->lock);
    uint32_t h = idx_find(&l2->idx, ck);
    if (h != NOHANDLE && st(&l2->idx.objs[h]) == KVT_OBJ_WRITING)
        drop_locked(l2, h);
    pthread_mutex_unlock(&l2->lock);
}

/* Pin a ready entry; NULL when there is none (or it cannot take another
 * pin). call with l2->lock held */
static struct kvt_l2_obj *pin_locked(kvt_l2 *l2, const kvt_key *ck)
{
    uint32_t h = idx_find(&l2->idx, ck);
    if (h == NOHANDLE)
        return NULL;
    struct kvt_l2_obj *o = &l2->idx.objs[h];
    if (!pinnable(o))
        return NULL;
    pin_locked_obj(l2, o);
    return o;
}

bool kvt_l2_pin(kvt_l2 *l2, const kvt_key *ck, struct kvt_l2_obj *out)
{
    pthread_mutex_lock(&l2->lock);
    struct kvt_l2_obj *o = pin_locked(l2, ck);
    if (o && out)
        *out = *o;
    pthread_mutex_unlock(&l2->lock);
    return o != NULL;
}

void kvt_l2_lookup_index(kvt_l2 *l2, kvt_l2_task *t)
{
    pthread_mutex_lock(&l2->lock); /* once for the batch, not once per key */
    for (uint32_t i = 0; i < t->n; i++) {
        kvt_key ck;
        kvt_l2_canon(l2, &t->keys[i], &ck);
        struct kvt_l2_obj *o = pin_locked(l2, &ck);
        if (o) {
            t->meta[i].len = o->len;
            kvt_bm_set(t->ok, i);
        }
    }
    pthread_mutex_unlock(&l2->lock);
    kvt_l2_task_finish(l2, t);
}

/* All or nothing under one lock hold: a partial hit would need the slow
 * path for the rest anyway, and pins taken here must not be taken twice. */
bool kvt_l2_lookup_known(kvt_l2 *l2, kvt_l2_task *t)
{
    uint32_t hits = 0;
    kvt_key ck;
    pthread_mutex_lock(&l2->lock);
    for (uint32_t i = 0; i < t->n; i++) {
        kvt_l2_canon(l2, &t->keys[i], &ck);
        uint32_t h = idx_find(&l2->idx, &ck);
        const struct kvt_l2_obj *o = h == NOHANDLE ? NULL : &l2->idx.objs[h];
        if (!(o && pinnable(o) && o->aux))
            break;
        hits++;
    }
    if (hits == t->n) {
        for (uint32_t i = 0; i < t->n; i++) {
            kvt_l2_canon(l2, &t->keys[i], &ck);
            struct kvt_l2_obj *o = &l2->idx.objs[idx_find(&l2->idx, &ck)];
            pin_locked_obj(l2, o);
            t->meta[i].len = o->len;
            kvt_bm_set(t->ok, i);
        }
    }
    pthread_mutex_unlock(&l2->lock);
    if (hits != t->n)
        return false;
    kvt_l2_task_finish(l2, t);
    return true;
}

bool kvt_l2_adopt(kvt_l2 *l2, const kvt_key *ck, uint32_t stored, uint32_t len, uint32_t aux,
                  uint8_t flags, bool pin, bool at_cold_end)
{
    bool inserted = false;
    pthread_mutex_lock(&l2->lock);
    uint32_t h = idx_find(&l2->idx, ck);
    if (h == NOHANDLE) {
        h = idx_insert(l2, ck);
        struct kvt_l2_obj *o = &l2->idx.objs[h];
        o->stored = stored;
        o->len = len;
        o->aux = aux;
        o->flags = flags;
        o->state = KVT_OBJ_READY;
        account_locked(l2, o, +1);
        if (l2->policy) {
            struct kvt_policy_hint hint = {.prefix_pos = 0, .bytes = stored,
                                           .fp = kvt_key_hash(ck)};
            kvt_policy_insert(l2->policy, h, at_cold_end, &hint);
            o->state |= ST_TRACKED;
        }
        inserted = true;
    }
    struct kvt_l2_obj *o = &l2->idx.objs[h];
    if (pin && pinnable(o))
        pin_locked_obj(l2, o);
    pthread_mutex_unlock(&l2->lock);
    return inserted;
}

void kvt_l2_forget(kvt_l2 *l2, const kvt_key *ck)
{
    pthread_mutex_lock(&l2->lock);
    uint32_t h = idx_find(&l2->idx, ck);
    if (h != NOHANDLE) {
        struct kvt_l2_obj *o = &l2->idx.objs[h];
        if (st(o) == KVT_OBJ_READY) {
            if (o->pins)
                unpin_locked_obj(l2, o); /* the caller's own pin */
            if (o->pins == 0)
                drop_locked(l2, h);
        }
    }
    pthread_mutex_unlock(&l2->lock);
}

void kvt_l2_touch(kvt_l2 *l2, const kvt_key *ck, uint32_t n)
{
    if (!l2->policy)
        return;
    pthread_mutex_lock(&l2->lock);
    for (uint32_t i = n; i-- > 0;) {
        uint32_t h = idx_find(&l2->idx, &ck[i]);
        if (h != NOHANDLE && (l2->idx.objs[h].state & ST_TRACKED))
            kvt_policy_access(l2->policy, h);
    }
    pthread_mutex_unlock(&l2->lock);
}

void kvt_l2_found_push(struct kvt_l2_found_vec *fv, const kvt_key *ck, uint32_t stored,
                       uint32_t len, uint32_t aux, uint8_t flags, int64_t mtime_ns)
{
    if (fv->n == fv->cap) {
        fv->cap = fv->cap ? fv->cap * 2 : 4096;
        fv->v = kvt_xrealloc(fv->v, fv->cap * sizeof(*fv->v));
    }
    fv->v[fv->n++] = (struct kvt_l2_found){.key = *ck, .mtime_ns = mtime_ns, .stored = stored,
                                           .len = len, .aux = aux, .flags = flags};
}

struct mt_idx {
    int64_t mtime_ns;
    size_t i;
};

static int by_mtime_desc(const void *a, const void *b)
{
    const struct mt_idx *x = a, *y = b;
    return (x->mtime_ns < y->mtime_ns) - (x->mtime_ns > y->mtime_ns);
}

/* call with l2->lock held: room for `extra` more entries without regrowing */
static void index_reserve_locked(kvt_l2 *l2, size_t extra)
{
    struct kvt_l2_index *x = &l2->idx;
    uint64_t want = (uint64_t)x->nobjs + extra;
    if (want >= UINT32_MAX / 2)
        return;
    if (want > x->cap_objs) {
        uint32_t ncap = x->cap_objs ? x->cap_objs : 1024;
        while (ncap < want)
            ncap *= 2;
        x->objs = kvt_xrealloc(x->objs, (size_t)ncap * sizeof(*x->objs));
        x->map.base = (const char *)x->objs;
        x->cap_objs = ncap;
        kvt_policy_reserve(l2->policy, ncap);
    }
    kvt_kindex_reserve(&x->map, (uint32_t)want);
}

void kvt_l2_finish_recovery(kvt_l2 *l2, struct kvt_l2_found_vec *fv, uint64_t t0_ns,
                            const char *where)
{
    /* sort 16-byte (mtime, position) pairs, not the entries themselves */
    struct mt_idx *order = kvt_xmalloc((fv->n ? fv->n : 1) * sizeof(*order));
    for (size_t i = 0; i < fv->n; i++)
        order[i] = (struct mt_idx){fv->v[i].mtime_ns, i};
    qsort(order, fv->n, sizeof(*order), by_mtime_desc);
    uint64_t objs = 0, bytes = 0;
    pthread_mutex_lock(&l2->lock);
    index_reserve_locked(l2, fv->n);
    pthread_mutex_unlock(&l2->lock);
    /* in chunks, so lookups and stores are not held up behind one long lock */
    for (size_t base = 0; base < fv->n; base += 4096) {
        size_t end = KVT_MIN(fv->n, base + 4096);
        pthread_mutex_lock(&l2->lock);
        for (size_t k = base; k < end; k++) {
            const struct kvt_l2_found *f = &fv->v[order[k].i];
            if (idx_find(&l2->idx, &f->key) != NOHANDLE)
                continue; /* found by a lookup meanwhile */
            uint32_t h = idx_insert(l2, &f->key);
            struct kvt_l2_obj *o = &l2->idx.objs[h];
            o->stored = f->stored;
            o->len = f->len;
            o->aux = f->aux;
            o->flags = f->flags;
            o->state = KVT_OBJ_READY;
            account_locked(l2, o, +1);
            if (l2->policy) {
                struct kvt_policy_hint hint = {.prefix_pos = 0, .bytes = f->stored,
                                               .fp = kvt_key_hash(&f->key)};
                kvt_policy_insert(l2->policy, h, true, &hint);
                o->state |= ST_TRACKED;
            }
            objs++;
            bytes += f->stored;
        }
        pthread_mutex_unlock(&l2->lock);
    }
    free(order);
    free(fv->v);
    fv->v = NULL;
    fv->n = fv->cap = 0;
    if (fv->corrupt) {
        atomic_fetch_add(&l2->counters.corrupt, fv->corrupt);
        kvt_warn("%s: %llu object files under %s were shorter than an object header (emptied "
                 "or torn): counted as corrupt and removed",
                 l2->name, (unsigned long long)fv->corrupt, where);
    }
    double secs = kvt_l2_recovery_done(l2, objs, bytes, t0_ns);
    kvt_info("%s: recovered %llu objects, %llu bytes from %s in %.3f s", l2->name,
             (unsigned long long)objs, (unsigned long long)bytes, where, secs);
}

double kvt_l2_recovery_done(kvt_l2 *l2, uint64_t objs, uint64_t bytes, uint64_t t0_ns)
{
    double secs = (double)(kvt_now_ns() - t0_ns) / 1e9;
    pthread_mutex_lock(&l2->lock);
    l2->recovered_objs = objs;
    l2->recovered_bytes = bytes;
    l2->recovery_seconds = secs;
    l2->recovering = false;
    pthread_mutex_unlock(&l2->lock);
    return secs;
}

void kvt_l2_set_recovering(kvt_l2 *l2, bool on)
{
    pthread_mutex_lock(&l2->lock);
    l2->recovering = on;
    pthread_mutex_unlock(&l2->lock);
}

/* ------------------------------------------------- parking and draining */

void kvt_l2_park_init(struct kvt_l2_park *p)
{
    memset(p, 0, sizeof(*p));
    pthread_mutex_init(&p->lock, NULL);
}

void kvt_l2_park_destroy(struct kvt_l2_park *p)
{
    pthread_mutex_destroy(&p->lock);
}

bool kvt_l2_park(struct kvt_l2_park *p, struct kvt_job *job)
{
    pthread_mutex_lock(&p->lock);
    bool parked = p->parking;
    if (parked) {
        job->next = p->head;
        p->head = job;
        p->n++;
    }
    pthread_mutex_unlock(&p->lock);
    return parked;
}

void kvt_l2_park_release(struct kvt_l2_park *p, struct kvt_tpool *pool)
{
    pthread_mutex_lock(&p->lock);
    p->parking = false;
    struct kvt_job *j = p->head;
    p->head = NULL;
    for (struct kvt_job *q = j; q; q = q->next)
        p->n--;
    pthread_mutex_unlock(&p->lock);
    struct kvt_job *rev = NULL; /* parked LIFO: reverse to keep submission order */
    while (j) {
        struct kvt_job *nx = j->next;
        j->next = rev;
        rev = j;
        j = nx;
    }
    while (rev) {
        struct kvt_job *nx = rev->next; /* the push reuses next */
        kvt_tpool_push(pool, rev);
        rev = nx;
    }
}

bool kvt_l2_park_task(struct kvt_l2_park *p, kvt_l2_task *t)
{
    pthread_mutex_lock(&p->lock);
    bool parked = p->parking;
    if (parked) {
        t->next = NULL;
        if (p->tasks_tail)
            p->tasks_tail->next = t;
        else
            p->tasks = t;
        p->tasks_tail = t;
        p->n++;
    }
    pthread_mutex_unlock(&p->lock);
    return parked;
}

kvt_l2_task *kvt_l2_park_take(struct kvt_l2_park *p, bool stop_parking)
{
    pthread_mutex_lock(&p->lock);
    if (stop_parking)
        p->parking = false;
    kvt_l2_task *t = p->tasks;
    p->tasks = p->tasks_tail = NULL;
    for (kvt_l2_task *q = t; q; q = q->next)
        p->n--;
    pthread_mutex_unlock(&p->lock);
    return t;
}

uint64_t kvt_l2_parked(struct kvt_l2_park *p)
{
    pthread_mutex_lock(&p->lock);
    uint64_t n = p->n;
    pthread_mutex_unlock(&p->lock);
    return n;
}

void kvt_l2_drain_init(struct kvt_l2_drain *d)
{
    memset(d, 0, sizeof(*d));
    pthread_mutex_init(&d->lock, NULL);
    pthread_cond_init(&d->cond, NULL);
}

void kvt_l2_drain_destroy(struct kvt_l2_drain *d)
{
    pthread_mutex_destroy(&d->lock);
    pthread_cond_destroy(&d->cond);
}

void kvt_l2_drain_enter(struct kvt_l2_drain *d)
{
    pthread_mutex_lock(&d->lock);
    d->live++;
    pthread_mutex_unlock(&d->lock);
}

void kvt_l2_drain_leave(struct kvt_l2_drain *d)
{
    pthread_mutex_lock(&d->lock);
    if (--d->live == 0)
        pthread_cond_broadcast(&d->cond);
    pthread_mutex_unlock(&d->lock);
}

void kvt_l2_drain_wait(struct kvt_l2_drain *d)
{
    pthread_mutex_lock(&d->lock);
    while (d->live)
        pthread_cond_wait(&d->cond, &d->lock);
    pthread_mutex_unlock(&d->lock);
}

bool kvt_l2_pin_found(kvt_l2 *l2, const kvt_key *ck, uint32_t stored, uint32_t logical,
                      uint32_t aux, uint8_t flag)
{
    pthread_mutex_lock(&l2->lock);
    struct kvt_l2_obj *o = kvt_l2_find_locked(l2, ck);
    bool hit = false, known = o != NULL;
    if (o && pinnable(o)) {
        pin_locked_obj(l2, o);
        if (o->len != logical)
            kvt_l2_obj_set_len_locked(l2, o, logical);
        o->flags |= flag;
        hit = true;
    }
    pthread_mutex_unlock(&l2->lock);
    if (known)
        return hit;
    /* adopt unpinned, then pin: adopt cannot say whether it pinned an entry
     * that someone else inserted meanwhile */
    if (kvt_l2_adopt(l2, ck, stored, logical, aux, flag, false, false))
        atomic_fetch_add(&l2->counters.secondary_hits, 1);
    return kvt_l2_pin(l2, ck, NULL);
}
