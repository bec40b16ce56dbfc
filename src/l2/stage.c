/*
 * The serde stage: puts a chain in front of any L2 engine that follows the
 * engine convention for lengths (l2.h), without the engine knowing.
 *
 * STORE (outer task t from a controller):
 *   submit -> one pool job per key encodes bufs[i] into a new buffer (a key
 *   already indexed is skipped, as engines skip it; a failed encode fails
 *   that key only) -> the last job builds an inner STORE task of the
 *   encoded keys (bufs = encoded bytes, meta.len = logical length,
 *   meta.serde = chain id) and submits it to the engine -> the engine's
 *   completion (kvt_l2_task_finish -> engine_done) maps the results back,
 *   frees the encoded buffers and finishes t.
 * LOAD:
 *   submit -> a read buffer per key sized by the chain's bound for the
 *   key's logical length (t->bufs[i].len) -> inner LOAD to the engine ->
 *   engine_done pushes one pool job per key: the object must carry this
 *   chain's id (else chain_mismatches: written raw, by another chain or
 *   under another master key), its logical length must equal the
 *   destination's, and it must decode to exactly that many bytes; then t's
 *   meta is the stored meta with serde 0 (the buffer holds logical bytes).
 *   The last job frees the read buffers and finishes t.
 * LOOKUP passes straight to the engine (lengths are logical there).
 *
 * Threads: max_workers pool threads ("serde-<i>") per adapter run every
 * encode and decode; the submitting thread only allocates and queues.
 * Locks: st->lock guards st->encoding only; it is never held across serde
 * work or engine calls. l2->lock is taken briefly for the skip check.
 */
#include "l2/stage.h"
#include "common/log.h"
#include "common/util.h"
#include "io/tpool.h"
#include "kvtier/error.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct kvt_serde_stage {
    struct kvt_serde *chain;
    struct kvt_tpool *pool;
    pthread_mutex_t lock;
    pthread_cond_t idle;
    uint32_t encoding; /* STORE ops not yet handed to the engine; guarded by lock */
    _Atomic uint64_t mismatch_logged;
};

struct stage_op;

struct stage_job {
    struct kvt_job job;
    struct stage_op *op;
    uint32_t i; /* STORE: outer index; LOAD: inner index */
};

/*
 * One outer task's state. Two references once an inner task exists: the
 * thread that submits it to the engine (an engine may still read the task
 * in its submit function after the completion ran on another thread) and
 * the completion path; the last one frees the op and the inner task.
 */
struct stage_op {
    kvt_l2 *l2;
    struct kvt_serde_stage *st;
    kvt_l2_task *outer, *inner;
    uint32_t n; /* outer keys (the outer task may be gone before the op) */
    _Atomic int refs;
    void **tmp;     /* per outer key: encoded bytes (STORE) or read buffer (LOAD) */
    size_t *tmplen; /* STORE: encoded length; LOAD: capacity */
    uint32_t *map;  /* inner index -> outer index */
    _Atomic uint32_t left;
    struct stage_job jobs[];
};

static void *wctx_new(int i, void *arg)
{
    (void)i;
    (void)arg;
    return kvt_serde_wctx_new();
}

static void wctx_free(void *ctx)
{
    kvt_serde_wctx_free(ctx);
}

static const struct kvt_l2_filter_ops stage_filter;
static void stage_detach(kvt_l2 *l2, void *ctx);

int kvt_serde_stage_attach(kvt_l2 *l2, struct kvt_serde *s, char *err, size_t errcap)
{
    struct kvt_serde_stage *st = kvt_xcalloc(1, sizeof(*st));
    pthread_mutex_init(&st->lock, NULL);
    pthread_cond_init(&st->idle, NULL);
    st->chain = kvt_serde_ref(s);
    int rc =
        kvt_tpool_create(&st->pool, "serde", kvt_serde_max_workers(s), wctx_new, wctx_free, NULL);
    if (rc) {
        snprintf(err, errcap, "cannot start serde workers: %s", kvt_strerror(rc));
        kvt_serde_unref(st->chain);
        pthread_mutex_destroy(&st->lock);
        pthread_cond_destroy(&st->idle);
        free(st);
        return rc;
    }
    rc = kvt_l2_filter_attach(l2, &stage_filter, st);
    if (rc) {
        snprintf(err, errcap, "\"serde\" is given twice (here and in \"inner\")");
        stage_detach(l2, st);
        return KVT_E_CONFIG;
    }
    return 0;
}

static struct stage_op *op_new(kvt_l2 *l2, struct kvt_serde_stage *st, kvt_l2_task *t)
{
    struct stage_op *op = kvt_xcalloc(1, sizeof(*op) + t->n * sizeof(struct stage_job));
    op->l2 = l2;
    op->st = st;
    op->outer = t;
    op->n = t->n;
    atomic_init(&op->refs, 1);
    op->tmp = kvt_xcalloc(t->n, sizeof(void *));
    op->tmplen = kvt_xcalloc(t->n, sizeof(size_t));
    op->map = kvt_xcalloc(t->n, sizeof(uint32_t));
    return op;
}

static void op_put(struct stage_op *op)
{
    /* acq_rel: the last owner sees the other's writes before freeing */
    if (atomic_fetch_sub_explicit(&op->refs, 1, memory_order_acq_rel) != 1)
        return;
    for (uint32_t i = 0; i < op->n; i++)
        free(op->tmp[i]);
    free(op->tmp);
    free(op->tmplen);
    free(op->map);
    kvt_l2_task_free(op->inner);
    free(op);
}

/* Finish the outer task; the op must not touch it afterwards (the
 * controller may free it as soon as it is queued). */
static void op_finish(struct stage_op *op)
{
    kvt_l2 *l2 = op->l2;
    kvt_l2_task *t = op->outer;
    op->outer = NULL;
    op_put(op);
    kvt_l2_task_finish(l2, t);
}

/* Hand the inner task to the engine; keeps a reference across the call. */
static void engine_submit(kvt_l2 *l2, struct stage_op *op)
{
    atomic_fetch_add_explicit(&op->refs, 1, memory_order_relaxed);
    l2->ops->submit(l2, op->inner);
    op_put(op);
}

static void stage_engine_done(kvt_l2 *l2, kvt_l2_task *inner);

/* An inner task over the outer keys that have tmp buffers. */
static kvt_l2_task *inner_new(struct stage_op *op, enum kvt_l2_kind kind, uint32_t serde_id)
{
    kvt_l2_task *t = op->outer;
    uint32_t m = 0;
    for (uint32_t i = 0; i < t->n; i++)
        if (op->tmp[i])
            m++;
    if (m == 0)
        return NULL;
    kvt_l2_task *in = kvt_l2_task_new(kind, m);
    uint32_t j = 0;
    for (uint32_t i = 0; i < t->n; i++) {
        if (!op->tmp[i])
            continue;
        in->keys[j] = t->keys[i];
        in->bufs[j].ptr = op->tmp[i];
        in->bufs[j].len = op->tmplen[i];
        if (kind == KVT_L2_STORE) {
            in->meta[j] = t->meta[i];
            in->meta[j].len = (uint32_t)t->bufs[i].len; /* logical */
            in->meta[j].serde = serde_id;
        }
        op->map[j++] = i;
    }
    in->udata = op; /* the stage is this task's submitter */
    in->on_done = stage_engine_done;
    in->submit_ns = kvt_now_ns();
    return in;
}

/* ------------------------------------------------------------- store */

static void encoding_done(struct kvt_serde_stage *st)
{
    pthread_mutex_lock(&st->lock);
    if (--st->encoding == 0)
        pthread_cond_broadcast(&st->idle);
    pthread_mutex_unlock(&st->lock);
}

/* The last encode job of an op: hand the encoded keys to the engine. */
static void store_dispatch(struct stage_op *op)
{
    kvt_l2 *l2 = op->l2;
    struct kvt_serde_stage *st = op->st;
    op->inner = inner_new(op, KVT_L2_STORE, kvt_serde_id(st->chain));
    if (!op->inner)
        op_finish(op);
    else
        engine_submit(l2, op); /* op may be gone when this returns */
    /* after the engine has the task, so that close's quiesce + engine drain
     * covers it */
    encoding_done(st);
}

static bool already_indexed(kvt_l2 *l2, const kvt_key *ck)
{
    pthread_mutex_lock(&l2->lock);
    bool found = kvt_l2_find_locked(l2, ck) != NULL;
    pthread_mutex_unlock(&l2->lock);
    return found;
}

static void encode_job(struct kvt_job *job, void *ctx)
{
    struct stage_job *j = (struct stage_job *)job;
    struct stage_op *op = j->op;
    kvt_l2 *l2 = op->l2;
    struct kvt_serde_stage *st = op->st;
    kvt_l2_task *t = op->outer;
    uint32_t i = j->i;
    kvt_key ck;
    kvt_l2_canon(l2, &t->keys[i], &ck);
    if (already_indexed(l2, &ck)) { /* stored or being stored: skip, as engines do */
        atomic_fetch_add(&l2->counters.store_skipped, 1);
        kvt_l2_task_ok(t, i, 0);
    } else if (!ctx) {
        kvt_l2_task_fail(t, i, -ENOMEM);
        atomic_fetch_add(&l2->counters.store_failed, 1);
    } else {
        kvt_objmeta m = t->meta[i];
        m.len = (uint32_t)t->bufs[i].len;
        void *out = NULL;
        size_t outlen = 0;
        int rc = t->bufs[i].len > KVT_MAX_OBJECT
                     ? KVT_E_TOOBIG
                     : kvt_serde_encode(st->chain, ctx, &ck, &m, t->bufs[i].ptr,
                                        (size_t)t->bufs[i].len, &out, &outlen);
        if (rc) {
            char ks[400];
            kvt_warn("%s: serde encode of %s failed: %s", l2->name,
                     kvt_key_str(&t->keys[i], ks, sizeof(ks)), kvt_strerror(rc));
            kvt_l2_task_fail(t, i, rc);
            atomic_fetch_add(&l2->counters.store_failed, 1);
        } else {
            op->tmp[i] = out;
            op->tmplen[i] = outlen;
        }
    }
    /* acq_rel: the last job sees every other job's tmp[] before dispatching */
    if (atomic_fetch_sub_explicit(&op->left, 1, memory_order_acq_rel) == 1)
        store_dispatch(op);
}

/* The inner task's errors onto the outer task: each failed key's own code
 * onto its outer key (op->map), then the first error for the task (a
 * no-op when the outer task has one already). */
static void map_errors(struct stage_op *op)
{
    kvt_l2_task *in = op->inner, *t = op->outer;
    int e = atomic_load(&in->err);
    if (!e)
        return;
    const int32_t *c = atomic_load_explicit(&in->codes, memory_order_acquire);
    for (uint32_t j = 0; c && j < in->n; j++)
        if (c[j])
            kvt_l2_task_fail(t, op->map[j], c[j]);
    kvt_l2_task_fail(t, UINT32_MAX, e);
}

static void store_engine_done(struct stage_op *op)
{
    kvt_l2_task *in = op->inner, *t = op->outer;
    for (uint32_t j = 0; j < in->n; j++)
        if (kvt_bm_test(in->ok, j))
            kvt_l2_task_ok(t, op->map[j], 0);
    atomic_fetch_add(&t->bytes, atomic_load(&in->bytes));
    map_errors(op);
    op_finish(op);
}

/* -------------------------------------------------------------- load */

static void load_submit(kvt_l2 *l2, struct stage_op *op)
{
    struct kvt_serde_stage *st = op->st;
    kvt_l2_task *t = op->outer;
    for (uint32_t i = 0; i < t->n; i++) {
        uint64_t cap = kvt_serde_bound(st->chain, t->bufs[i].len);
        if (t->bufs[i].len > KVT_MAX_OBJECT || cap > 2ull * KVT_MAX_OBJECT) {
            kvt_l2_task_fail(t, i, KVT_E_TOOBIG);
            continue;
        }
        op->tmp[i] = malloc(cap ? cap : 1);
        op->tmplen[i] = cap;
        if (!op->tmp[i])
            kvt_l2_task_fail(t, i, -ENOMEM);
    }
    op->inner = inner_new(op, KVT_L2_LOAD, 0);
    if (!op->inner) {
        op_finish(op);
        return;
    }
    engine_submit(l2, op);
}

static void decode_job(struct kvt_job *job, void *ctx)
{
    struct stage_job *j = (struct stage_job *)job;
    struct stage_op *op = j->op;
    kvt_l2 *l2 = op->l2;
    struct kvt_serde_stage *st = op->st;
    kvt_l2_task *in = op->inner, *t = op->outer;
    uint32_t i = op->map[j->i], k = j->i;
    if (kvt_bm_test(in->ok, k)) {
        const kvt_objmeta *m = &in->meta[k];
        kvt_key ck;
        kvt_l2_canon(l2, &t->keys[i], &ck);
        enum kvt_serde_fail why = KVT_SERDE_OK;
        int rc = 0;
        if (m->serde != kvt_serde_id(st->chain)) {
            atomic_fetch_add(&kvt_serde_stats(st->chain)->chain_mismatches, 1);
            rc = KVT_E_CORRUPT;
            if (atomic_fetch_add(&st->mismatch_logged, 1) < 5) {
                char ks[400];
                kvt_warn("%s: %s was stored %s (serde id %#x, this adapter's chain is %#x): "
                         "treated as a miss",
                         l2->name, kvt_key_str(&t->keys[i], ks, sizeof(ks)),
                         m->serde ? "by another serde chain or master key" : "without serde",
                         m->serde, kvt_serde_id(st->chain));
            }
        } else if (!ctx) {
            rc = -ENOMEM;
        } else {
            rc = kvt_serde_decode(st->chain, ctx, &ck, m, in->bufs[k].ptr, (size_t)in->bufs[k].len,
                                  t->bufs[i].ptr, (size_t)t->bufs[i].len, &why);
            if (rc) {
                char ks[400];
                kvt_warn("%s: %s: %s: treated as a miss", l2->name,
                         kvt_key_str(&t->keys[i], ks, sizeof(ks)), kvt_serde_fail_str(why));
            }
        }
        if (rc) {
            kvt_l2_task_fail(t, i, rc);
        } else {
            t->meta[i] = *m;
            t->meta[i].serde = 0; /* the destination holds logical bytes */
            kvt_l2_task_ok(t, i, 0);
        }
    }
    if (atomic_fetch_sub_explicit(&op->left, 1, memory_order_acq_rel) == 1)
        op_finish(op);
}

static void load_engine_done(struct stage_op *op)
{
    struct kvt_serde_stage *st = op->st;
    kvt_l2_task *in = op->inner, *t = op->outer;
    atomic_fetch_add(&t->bytes, atomic_load(&in->bytes));
    map_errors(op);
    atomic_store(&op->left, in->n);
    for (uint32_t k = 0; k < in->n; k++) {
        op->jobs[k].op = op;
        op->jobs[k].i = k;
        op->jobs[k].job.fn = decode_job;
    }
    /* the last push may run and free op before the loop reads it again */
    uint32_t n = in->n;
    struct stage_job *jobs = op->jobs;
    for (uint32_t k = 0; k < n; k++)
        kvt_tpool_push(st->pool, &jobs[k].job);
}

/* ------------------------------------------------------------ hooks */

static void stage_submit(kvt_l2 *l2, void *ctx, kvt_l2_task *t)
{
    struct kvt_serde_stage *st = ctx;
    struct stage_op *op = op_new(l2, st, t);
    if (t->kind == KVT_L2_LOAD) {
        load_submit(l2, op);
        return;
    }
    pthread_mutex_lock(&st->lock);
    st->encoding++;
    pthread_mutex_unlock(&st->lock);
    uint32_t n = t->n;
    atomic_store(&op->left, n);
    for (uint32_t i = 0; i < n; i++) {
        op->jobs[i].op = op;
        op->jobs[i].i = i;
        op->jobs[i].job.fn = encode_job;
    }
    struct stage_job *jobs = op->jobs;
    for (uint32_t i = 0; i < n; i++)
        kvt_tpool_push(st->pool, &jobs[i].job);
}

static void stage_engine_done(kvt_l2 *l2, kvt_l2_task *inner)
{
    (void)l2;
    struct stage_op *op = inner->udata;
    if (inner->kind == KVT_L2_STORE)
        store_engine_done(op);
    else
        load_engine_done(op);
}

static void stage_quiesce(kvt_l2 *l2, void *ctx)
{
    (void)l2;
    struct kvt_serde_stage *st = ctx;
    pthread_mutex_lock(&st->lock);
    while (st->encoding)
        pthread_cond_wait(&st->idle, &st->lock);
    pthread_mutex_unlock(&st->lock);
}

static void stage_detach(kvt_l2 *l2, void *ctx)
{
    (void)l2;
    struct kvt_serde_stage *st = ctx;
    kvt_tpool_destroy(st->pool); /* runs the decode jobs still queued */
    kvt_serde_unref(st->chain);
    pthread_mutex_destroy(&st->lock);
    pthread_cond_destroy(&st->idle);
    free(st);
}

#define S(name) json_integer((json_int_t)atomic_load(&x->name))

static void stage_status(kvt_l2 *l2, void *ctx, json_t *out)
{
    (void)l2;
    struct kvt_serde_stage *st = ctx;
    struct kvt_serde *s = st->chain;
    struct kvt_serde_stats *x = kvt_serde_stats(s);
    json_t *o = json_object();
    json_t *types = json_array();
    for (int i = 0; i < kvt_serde_count(s); i++)
        json_array_append_new(types, json_string(kvt_serde_type(s, i)));
    char id[16];
    snprintf(id, sizeof(id), "%#010x", kvt_serde_id(s));
    json_object_set_new(o, "chain", types);
    json_object_set_new(o, "chain_id", json_string(id));
    json_object_set_new(o, "max_workers", json_integer(kvt_serde_max_workers(s)));
    json_object_set_new(o, "queued_jobs", json_integer((json_int_t)kvt_tpool_queued(st->pool)));
    json_object_set_new(o, "encoded", S(encoded));
    json_object_set_new(o, "encode_failed", S(encode_failed));
    json_object_set_new(o, "decoded", S(decoded));
    json_object_set_new(o, "decode_failed", S(decode_failed));
    json_object_set_new(
        o, "serde_failures",
        json_integer((json_int_t)(atomic_load(&x->encode_failed) + atomic_load(&x->decode_failed) +
                                  atomic_load(&x->chain_mismatches))));
    json_object_set_new(o, "checksum_mismatches", S(checksum_mismatches));
    json_object_set_new(o, "decrypt_failures", S(decrypt_failures));
    json_object_set_new(o, "chain_mismatches", S(chain_mismatches));
    json_object_set_new(o, "format_errors", S(format_errors));
    json_object_set_new(o, "length_mismatches", S(length_mismatches));
    json_object_set_new(o, "fp8_passthrough", S(fp8_passthrough));
    uint64_t lin = atomic_load(&x->logical_in), sout = atomic_load(&x->stored_out);
    json_object_set_new(o, "encoded_logical_bytes", json_integer((json_int_t)lin));
    json_object_set_new(o, "encoded_stored_bytes", json_integer((json_int_t)sout));
    json_object_set_new(o, "encode_seconds", json_real((double)atomic_load(&x->encode_ns) / 1e9));
    json_object_set_new(o, "decode_seconds", json_real((double)atomic_load(&x->decode_ns) / 1e9));
    json_object_set_new(out, "serde", o);
}

static const struct kvt_l2_filter_ops stage_filter = {
    .name = "serde",
    .submit = stage_submit,
    .quiesce = stage_quiesce,
    .detach = stage_detach,
    .status = stage_status,
};
