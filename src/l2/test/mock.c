/*
 * mock adapter: objects in process memory, with a bandwidth limit, for
 * testing the L2 pipeline without storage hardware (LMCache's "mock").
 *
 * max_size_gb    capacity; when a store does not fit, the oldest unpinned
 *                objects are evicted first (FIFO), as LMCache's mock does.
 * mock_bandwidth_gb  GB/s for all transfers together: one token bucket
 *                shared by every task (a transfer of B bytes occupies the
 *                "link" for B / bandwidth seconds, in arrival order).
 *
 * Not persistent: contents vanish with the process.
 * Threads: two workers (tpool "mock"); data slots guarded by m->lock.
 */
#include "common/log.h"
#include "common/util.h"
#include "io/tpool.h"
#include "kvtier/error.h"
#include "l2/adapters.h"
#include "l2/engine.h"
#include "l2/life.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct mock_obj {
    void *data;
    uint32_t stored_len;
    kvt_objmeta meta;
    kvt_key key;
    uint64_t seq; /* insertion order, for FIFO */
    bool used;
};

struct fifo_ent {
    uint32_t slot;
    uint64_t seq;
};

struct mock_engine {
    pthread_mutex_t lock; /* guards slots, nslots, free list, fifo, next_free_ns */
    struct fifo_ent *fifo;
    size_t fifo_head, fifo_tail, fifo_cap; /* positions grow; index modulo cap */
    struct mock_obj *slots;
    uint32_t nslots, cap_slots;
    uint32_t *free_ids;
    uint32_t nfree;
    uint64_t seq;
    double bw; /* bytes per second */
    uint64_t next_free_ns;
    struct kvt_tpool *pool;
};

struct mock_job {
    struct kvt_job job;
    kvt_l2 *l2;
    kvt_l2_task *t;
};

/* Occupy the shared link for len bytes: sleep until our turn ends. */
static void throttle(struct mock_engine *m, uint64_t len)
{
    if (m->bw <= 0 || len == 0)
        return;
    uint64_t dur = (uint64_t)((double)len / m->bw * 1e9);
    pthread_mutex_lock(&m->lock);
    uint64_t now = kvt_now_ns();
    uint64_t start = m->next_free_ns > now ? m->next_free_ns : now;
    m->next_free_ns = start + dur;
    uint64_t until = m->next_free_ns;
    pthread_mutex_unlock(&m->lock);
    while ((now = kvt_now_ns()) < until) {
        uint64_t d = until - now;
        struct timespec ts = {(time_t)(d / 1000000000ull), (long)(d % 1000000000ull)};
        nanosleep(&ts, NULL);
    }
}

static uint32_t slot_alloc(struct mock_engine *m)
{
    if (m->nfree)
        return m->free_ids[--m->nfree];
    if (m->nslots == m->cap_slots) {
        m->cap_slots = m->cap_slots ? m->cap_slots * 2 : 256;
        m->slots = kvt_xrealloc(m->slots, m->cap_slots * sizeof(*m->slots));
        m->free_ids = kvt_xrealloc(m->free_ids, m->cap_slots * sizeof(uint32_t));
    }
    memset(&m->slots[m->nslots], 0, sizeof(m->slots[0]));
    return m->nslots++;
}

/* Evict the oldest objects until `need` more bytes fit under the cap.
 * m->fifo holds (slot, seq) in insertion order; entries whose slot was
 * freed or reused since are stale and skipped. */
static void fifo_make_room(kvt_l2 *l2, struct mock_engine *m, uint64_t need)
{
    for (int round = 0; round < 1024; round++) {
        struct kvt_l2_usage u;
        kvt_l2_usage(l2, &u);
        if (!u.cap_bytes || u.used_bytes + need <= u.cap_bytes || u.objects == 0)
            return;
        kvt_key keys[32];
        uint32_t n = 0;
        pthread_mutex_lock(&m->lock);
        size_t scan = m->fifo_head;
        while (n < 32 && scan != m->fifo_tail) {
            struct fifo_ent *f = &m->fifo[scan % m->fifo_cap];
            struct mock_obj *o = &m->slots[f->slot];
            if (o->used && o->seq == f->seq)
                keys[n++] = o->key;
            else if (scan == m->fifo_head)
                m->fifo_head++; /* drop stale entries at the front */
            scan++;
        }
        pthread_mutex_unlock(&m->lock);
        if (n == 0 || kvt_l2_delete(l2, keys, n, NULL) == 0)
            return; /* everything old is pinned */
    }
}

static void fifo_push_locked(struct mock_engine *m, uint32_t slot, uint64_t seq)
{
    if (m->fifo_tail - m->fifo_head == m->fifo_cap) {
        size_t ncap = m->fifo_cap ? m->fifo_cap * 2 : 256;
        struct fifo_ent *nf = kvt_xmalloc(ncap * sizeof(*nf));
        for (size_t i = m->fifo_head; i < m->fifo_tail; i++)
            nf[i - m->fifo_head] = m->fifo[i % m->fifo_cap];
        free(m->fifo);
        m->fifo = nf;
        m->fifo_tail -= m->fifo_head;
        m->fifo_head = 0;
        m->fifo_cap = ncap;
    }
    m->fifo[m->fifo_tail++ % m->fifo_cap] = (struct fifo_ent){slot, seq};
}

static void do_store(kvt_l2 *l2, struct mock_engine *m, kvt_l2_task *t, uint32_t i)
{
    kvt_key ck;
    kvt_l2_canon(l2, &t->keys[i], &ck);
    uint64_t len = t->bufs[i].len;
    if (len > KVT_MAX_OBJECT) {
        kvt_l2_task_fail(t, i, KVT_E_TOOBIG);
        return;
    }
    fifo_make_room(l2, m, len);
    void *copy = malloc(len ? len : 1);
    if (!copy) {
        kvt_l2_task_fail(t, i, -ENOMEM);
        atomic_fetch_add(&l2->counters.store_failed, 1);
        return;
    }
    pthread_mutex_lock(&m->lock);
    uint32_t id = slot_alloc(m);
    pthread_mutex_unlock(&m->lock);
    uint32_t logical = t->meta[i].len ? t->meta[i].len : (uint32_t)len;
    int rc = kvt_l2_reserve(l2, &ck, (uint32_t)len, logical, id, 0);
    if (rc) {
        pthread_mutex_lock(&m->lock);
        m->free_ids[m->nfree++] = id;
        pthread_mutex_unlock(&m->lock);
        free(copy);
        if (rc == -EEXIST) {
            atomic_fetch_add(&l2->counters.store_skipped, 1);
            kvt_l2_task_ok(t, i, 0);
        } else {
            atomic_fetch_add(&l2->counters.store_failed, 1);
            kvt_l2_task_fail(t, i, rc);
        }
        return;
    }
    throttle(m, len);
    memcpy(copy, t->bufs[i].ptr, len);
    pthread_mutex_lock(&m->lock);
    struct mock_obj *o = &m->slots[id];
    o->data = copy;
    o->meta = t->meta[i];
    o->meta.len = logical;
    o->stored_len = (uint32_t)len;
    o->key = ck;
    o->seq = m->seq++;
    o->used = true;
    fifo_push_locked(m, id, o->seq);
    pthread_mutex_unlock(&m->lock);
    kvt_l2_publish(l2, &ck);
    atomic_fetch_add(&l2->counters.store_ok, 1);
    kvt_l2_task_ok(t, i, len);
}

static void do_lookup(kvt_l2 *l2, kvt_l2_task *t, uint32_t i)
{
    kvt_key ck;
    kvt_l2_canon(l2, &t->keys[i], &ck);
    struct kvt_l2_obj o;
    if (kvt_l2_pin(l2, &ck, &o)) {
        t->meta[i].len = o.len;
        kvt_l2_task_ok(t, i, 0);
    }
}

static void do_load(kvt_l2 *l2, struct mock_engine *m, kvt_l2_task *t, uint32_t i)
{
    kvt_key ck;
    kvt_l2_canon(l2, &t->keys[i], &ck);
    uint32_t id = UINT32_MAX;
    pthread_mutex_lock(&l2->lock);
    struct kvt_l2_obj *o = kvt_l2_find_locked(l2, &ck);
    if (o && kvt_l2_obj_state(o) == KVT_OBJ_READY)
        id = o->aux;
    pthread_mutex_unlock(&l2->lock);
    if (id == UINT32_MAX) {
        kvt_l2_task_fail(t, i, KVT_E_NOTFOUND);
        return;
    }
    throttle(m, t->bufs[i].len);
    pthread_mutex_lock(&m->lock);
    struct mock_obj *mo = &m->slots[id];
    int rc = 0;
    if (!mo->used || !kvt_key_eq(&mo->key, &ck))
        rc = KVT_E_NOTFOUND;
    else if (mo->stored_len > t->bufs[i].len)
        rc = KVT_E_CORRUPT; /* never an overrun */
    else {
        memcpy(t->bufs[i].ptr, mo->data, mo->stored_len);
        t->bufs[i].len = mo->stored_len;
        t->meta[i] = mo->meta;
    }
    pthread_mutex_unlock(&m->lock);
    if (rc)
        kvt_l2_task_fail(t, i, rc);
    else
        kvt_l2_task_ok(t, i, t->bufs[i].len);
}

static void job_fn(struct kvt_job *job, void *ctx)
{
    (void)ctx;
    struct mock_job *j = (struct mock_job *)job;
    kvt_l2 *l2 = j->l2;
    struct mock_engine *m = l2->engine;
    kvt_l2_task *t = j->t;
    for (uint32_t i = 0; i < t->n; i++) {
        if (t->kind == KVT_L2_STORE)
            do_store(l2, m, t, i);
        else if (t->kind == KVT_L2_LOOKUP)
            do_lookup(l2, t, i);
        else
            do_load(l2, m, t, i);
    }
    free(j);
    kvt_l2_task_finish(l2, t);
}

static void mock_submit(kvt_l2 *l2, kvt_l2_task *t)
{
    struct mock_engine *m = l2->engine;
    struct mock_job *j = kvt_xcalloc(1, sizeof(*j));
    j->job.fn = job_fn;
    j->l2 = l2;
    j->t = t;
    kvt_tpool_push(m->pool, &j->job);
}

static int mock_remove(kvt_l2 *l2, const struct kvt_l2_obj *o)
{
    struct mock_engine *m = l2->engine;
    pthread_mutex_lock(&m->lock);
    struct mock_obj *mo = o->aux < m->nslots ? &m->slots[o->aux] : NULL;
    if (mo && mo->used) {
        free(mo->data);
        mo->data = NULL;
        mo->used = false;
        m->free_ids[m->nfree++] = o->aux;
    }
    pthread_mutex_unlock(&m->lock);
    return 0;
}

static void mock_status(kvt_l2 *l2, json_t *out)
{
    struct mock_engine *m = l2->engine;
    json_object_set_new(out, "mock_bandwidth_gb", json_real(m->bw / KVT_GIB));
}

static void mock_close(kvt_l2 *l2)
{
    struct mock_engine *m = l2->engine;
    kvt_l2_life_stop(l2, &(struct kvt_l2_life){.pools = {m->pool}});
    for (uint32_t i = 0; i < m->nslots; i++)
        free(m->slots[i].data);
    free(m->slots);
    free(m->free_ids);
    free(m->fifo);
    pthread_mutex_destroy(&m->lock);
    free(m);
    l2->engine = NULL;
}

static const struct kvt_l2_ops mock_ops = {
    .submit = mock_submit,
    .remove = mock_remove,
    .status = mock_status,
    .close = mock_close,
};

struct kvt_mock_opts {
    uint64_t max_size_bytes;
    double bandwidth_bytes_per_s;
};

static int mock_parse(struct kvt_cfg *c, void *opts)
{
    struct kvt_mock_opts *o = opts;
    double size = 0, bw = 0;
    kvt_cfg_num(c, "max_size_gb", true, 0, 0, 1e9, &size);
    kvt_cfg_num(c, "mock_bandwidth_gb", true, 0, 0, 1e9, &bw);
    if (c->rc)
        return c->rc;
    if (size <= 0)
        return kvt_cfg_fail(c, "max_size_gb", "must be > 0");
    if (bw <= 0)
        return kvt_cfg_fail(c, "mock_bandwidth_gb", "must be > 0");
    o->max_size_bytes = (uint64_t)(size * KVT_GIB);
    o->bandwidth_bytes_per_s = bw * KVT_GIB;
    return 0;
}

static int mock_open(kvt_l2 *l2, const struct kvt_l2_spec *spec, const void *opts, char *err,
                     size_t errcap)
{
    const struct kvt_mock_opts *o = opts;
    int rc = kvt_l2_life_init(l2, &mock_ops, spec, KVT_CODEC_OBJ, o->max_size_bytes, err, errcap);
    if (rc)
        return rc;
    struct mock_engine *m = kvt_xcalloc(1, sizeof(*m));
    pthread_mutex_init(&m->lock, NULL);
    m->bw = o->bandwidth_bytes_per_s;
    l2->engine = m;
    l2->persist_enabled = false;
    rc = kvt_tpool_create(&m->pool, "mock", 2, NULL, NULL, NULL);
    if (rc) {
        snprintf(err, errcap, "cannot start threads: %s", kvt_strerror(rc));
        free(m);
        kvt_l2_base_destroy(l2);
        return rc;
    }
    return 0;
}

const struct kvt_l2_adapter_desc kvt_l2_mock_desc = {
    .name = "mock",
    .opts_size = sizeof(struct kvt_mock_opts),
    .parse = mock_parse,
    .open = mock_open,
};
