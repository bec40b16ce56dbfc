/* The LMCache front end's operations: one handler per request (docs/lmcache-protocol.md). */
#include "common/log.h"
#include "common/util.h"
#include "key/blake3.h"
#include "kvtier/error.h"
#include "proto/lmc_wire.h"
#include "front/lmcache/lmc_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

static const char *const REFUSE_LMC_DRIVEN =
    "kvtier serves LMCache's engine-driven transfer mode only: lmcache_driven (the server "
    "copying through CUDA IPC handles) is not available. Start vLLM or SGLang with "
    "LMCACHE_MP_TRANSFER_MODE=engine_driven (SGLang: or extra_config: "
    "{lmcache.mp.mp_transfer_mode: engine_driven} in its --lmcache-config-file)";

/* ------------------------------------------------------------ handlers */

static void h_register(struct lmc_rq *q)
{
    struct kvt_lmc *m = q->m;
    struct lmc_register r;
    char why[256];
    if (lmc_register_decode(lmc_arg(q, 0), &r, why, sizeof(why))) {
        lmc_reply_err(q, "bad RegisterEngineDrivenContextPayload: %s", why);
        return;
    }
    const char *mwhy;
    if (kvt_validate_model(r.model, r.model_len, &mwhy)) {
        lmc_reply_err(q, "model_name: %s", mwhy);
        return;
    }
    uint32_t slots = r.num_physical_slots ? r.num_physical_slots : (uint32_t)m->env->chunk_size;
    uint64_t bytes = (uint64_t)lmc_dtype_size(r.dtype) * r.num_layers * slots * r.hidden_dim *
                     (r.use_mla ? 1 : 2);
    if (bytes == 0 || bytes > m->env->max_object_bytes || bytes > UINT32_MAX) {
        lmc_reply_err(q,
                      "one chunk would be %llu bytes; this server accepts objects of at most "
                      "%llu bytes (--max-object-mb)",
                      (unsigned long long)bytes, (unsigned long long)m->env->max_object_bytes);
        return;
    }
    struct lmc_ctx *c = lmc_ctx_find(m, r.instance_id);
    if (!c) {
        c = kvt_xcalloc(1, sizeof(*c));
        c->instance_id = r.instance_id;
        c->next = m->ctxs;
        m->ctxs = c;
        atomic_fetch_add(&m->contexts, 1);
    }
    c->world_size = r.world_size;
    snprintf(c->dtype, sizeof(c->dtype), "%s", r.dtype);
    memset(&c->meta, 0, sizeof(c->meta));
    c->meta.len = (uint32_t)bytes;
    int kd = kvt_dtype_parse(strcmp(r.dtype, "float8_e4m3fn") == 0 ? "float8_e4m3" : r.dtype);
    c->meta.dtype = (uint16_t)(kd > 0 ? kd : 0);
    uint32_t shape[4] = {2, r.num_layers, slots, r.hidden_dim};
    int nd = r.use_mla ? 3 : 4;
    c->meta.ndim = (uint8_t)nd;
    memcpy(c->meta.shape, r.use_mla ? shape + 1 : shape, (size_t)nd * sizeof(uint32_t));
    c->last_seen_ns = kvt_now_ns();
    kvt_info("lmcache: worker %lld registered (model %.*s, world size %u, %s chunk of %llu bytes)",
             (long long)r.instance_id, (int)r.model_len, r.model, r.world_size, r.dtype,
             (unsigned long long)bytes);
    struct kvt_l1_shm shm;
    kvt_core_shm(m->env->core, &shm);
    struct body b;
    lmc_body_init(&b);
    msgpack_pack_map(&b.pk, 2);
    kvt_mp_str0(&b.pk, "shm_name");
    kvt_mp_str0(&b.pk, m->cfg->shm_name);
    kvt_mp_str0(&b.pk, "pool_size");
    msgpack_pack_uint64(&b.pk, shm.map_size);
    lmc_reply_body(q, &b);
}

static void drop_instance_xfers(struct kvt_lmc *m, int64_t inst)
{
    struct lmc_xfer **pp = &m->xfers;
    while (*pp) {
        if ((*pp)->instance_id == inst)
            lmc_xfer_drop(m, pp);
        else
            pp = &(*pp)->next;
    }
}

static void h_unregister(struct lmc_rq *q)
{
    struct kvt_lmc *m = q->m;
    int64_t inst;
    if (lmc_decode_i64(q, 0, "instance_id", &inst))
        return;
    for (struct lmc_ctx **pp = &m->ctxs; *pp; pp = &(*pp)->next)
        if ((*pp)->instance_id == inst) {
            struct lmc_ctx *c = *pp;
            *pp = c->next;
            free(c);
            atomic_fetch_sub(&m->contexts, 1);
            break;
        }
    drop_instance_xfers(m, inst);
    lmc_events_drop_instance(m, inst);
    lmc_reply(q, NULL);
}

static void finish_lookup(struct kvt_lmc *m, struct lmc_sess *x, struct kvt_l1_ref *refs,
                          uint32_t total, uint32_t nr, uint32_t readers)
{
    uint32_t hits = total / nr, keep = hits * nr;
    for (uint32_t i = keep; i < total; i++)
        kvt_core_put(m->env->core, refs[i].h);
    lmc_sess_release(m, x);
    x->hits = hits;
    x->nr = nr;
    x->nh = keep;
    x->hs = kvt_xmalloc((keep ? keep : 1) * sizeof(uint32_t));
    x->readers = kvt_xmalloc((keep ? keep : 1) * sizeof(uint16_t));
    for (uint32_t i = 0; i < keep; i++) {
        x->hs[i] = refs[i].h;
        x->readers[i] = (uint16_t)readers;
    }
    if (keep)
        kvt_core_touch(m->env->core, x->hs, keep);
    x->state = LS_DONE;
    atomic_fetch_add_explicit(&m->lookup_hits, hits, memory_order_relaxed);
    lmc_answer_waiters(m, x);
}

static void on_prefetched(void *arg, uint32_t k, struct kvt_l1_ref *refs)
{
    struct lmc_fetch *f = arg;
    memcpy(f->refs + f->m0, refs, k * sizeof(*refs));
    free(refs);
    f->got = k;
    struct kvt_lmc *m = f->m;
    pthread_mutex_lock(&m->done_lock);
    f->next = m->done;
    m->done = f;
    pthread_mutex_unlock(&m->done_lock);
    uint64_t one = 1;
    ssize_t w = write(m->efd, &one, sizeof(one));
    (void)w;
}

void lmc_drain_fetches(struct kvt_lmc *m, bool discard)
{
    pthread_mutex_lock(&m->done_lock);
    struct lmc_fetch *f = m->done;
    m->done = NULL;
    pthread_mutex_unlock(&m->done_lock);
    while (f) {
        struct lmc_fetch *nx = f->next;
        uint32_t total = f->m0 + f->got;
        struct lmc_sess *x = discard ? NULL : lmc_sess_find(m, f->rid, f->rid_len);
        if (x && x->gen == f->gen && x->state == LS_PENDING) {
            finish_lookup(m, x, f->refs, total, f->nr, f->readers);
        } else { /* the session ended or looked up again meanwhile */
            for (uint32_t i = 0; i < total; i++)
                kvt_core_put(m->env->core, f->refs[i].h);
        }
        free(f->refs);
        free(f);
        f = nx;
    }
}

static void h_lookup(struct lmc_rq *q)
{
    struct kvt_lmc *m = q->m;
    struct lmc_key k;
    if (lmc_decode_key(q, 0, &k))
        return;
    struct lmc_sess *x = lmc_sess_get(m, k.rid, k.rid_len);
    lmc_sess_release(m, x); /* a new lookup replaces the previous one's locks */
    x->gen = ++m->gen;
    x->state = LS_NONE;
    lmc_answer_waiters(m, x); /* waiters of the previous lookup: 0 */
    x->state = LS_DONE;       /* 0 hits unless the lookup gets further */
    uint32_t ns, c0, c1;
    uint8_t *hashes = NULL;
    if (k.num_kv_readers < 1) {
        lmc_reply_err(q, "num_kv_readers=0: this server needs clients that send "
                         "IPCCacheServerKey.num_kv_readers (lmcache >= 0.5.6)");
        goto out;
    }
    if (lmc_key_ns(q, &k, &ns) || lmc_key_chunks(q, &k, true, &c0, &c1, &hashes))
        goto out;
    if (lmc_denied(q, ns, false)) {
        lmc_reply(q, NULL); /* 0 hits: the session is done with none */
        goto out;
    }
    uint32_t nr = k.has_worker ? 1 : k.world_size;
    uint64_t n64 = (uint64_t)c1 * nr;
    if (n64 > KVT_MAX_BATCH * 16ull) {
        lmc_reply_err(q, "%llu chunk objects in one lookup: too many", (unsigned long long)n64);
        goto out;
    }
    uint32_t n = (uint32_t)n64;
    atomic_fetch_add_explicit(&m->lookup_chunks, c1, memory_order_relaxed);
    if (n == 0) {
        lmc_reply(q, NULL);
        goto out;
    }
    kvt_key *keys = kvt_xmalloc(n * sizeof(kvt_key));
    for (uint32_t c = 0; c < c1; c++)
        for (uint32_t r = 0; r < nr; r++) {
            uint32_t w = k.has_worker ? k.worker_id : r;
            kvt_key_make(&keys[c * nr + r], ns, hashes + 32 * c, 32, lmc_kv_rank(k.world_size, w),
                         0);
        }
    struct kvt_l1_ref *refs = kvt_xcalloc(n, sizeof(*refs));
    struct lmc_fetch *f = kvt_xcalloc(1, sizeof(*f));
    f->m = m;
    memcpy(f->rid, k.rid, k.rid_len);
    f->rid_len = k.rid_len;
    f->gen = x->gen;
    f->n = n;
    f->nr = nr;
    f->readers = k.num_kv_readers;
    f->refs = refs;
    /* f->m0 is set before the prefetch is submitted; its result is taken
     * on this thread (lmc_drain_fetches), after the state below */
    if (kvt_core_fetch(m->env->core, keys, n, true, refs, &f->m0, on_prefetched, f)) {
        finish_lookup(m, x, refs, f->m0, nr, k.num_kv_readers);
        free(refs);
        free(f);
    } else {
        x->state = LS_PENDING;
    }
    free(keys);
    lmc_reply(q, NULL); /* LMCache answers a lookup once its prefetch is submitted */
out:
    free(hashes);
    lmc_key_free(&k);
}

static void h_query(struct lmc_rq *q, bool wait)
{
    struct kvt_lmc *m = q->m;
    const char *rid;
    size_t rl;
    if (lmc_decode_str(q, 0, "request_id", &rid, &rl))
        return;
    double timeout = 0;
    if (wait && lmc_get_float(lmc_arg(q, 1), &timeout)) {
        lmc_reply_err(q, "argument timeout must be a number of seconds");
        return;
    }
    struct lmc_sess *x = lmc_sess_find(m, rid, rl);
    if (!x || x->state == LS_NONE || x->state == LS_CONSUMED) {
        lmc_reply_int(q, 0); /* unknown, or already handed over */
        return;
    }
    x->last_ns = kvt_now_ns();
    if (x->state == LS_DONE) {
        x->state = LS_CONSUMED;
        lmc_reply_int(q, x->hits);
        return;
    }
    if (!wait || !(timeout > 0)) {
        lmc_reply(q, NULL); /* still prefetching */
        return;
    }
    if (timeout > 3600)
        timeout = 3600;
    struct lmc_rep *r = lmc_rep_save(q, kvt_now_ns() + (uint64_t)(timeout * 1e9));
    r->next = x->waiters;
    x->waiters = r;
}

static void h_free_locks(struct lmc_rq *q)
{
    struct kvt_lmc *m = q->m;
    struct lmc_key k;
    if (lmc_decode_key(q, 0, &k))
        return;
    struct lmc_sess *x = lmc_sess_find(m, k.rid, k.rid_len);
    uint32_t C = (uint32_t)m->env->chunk_size;
    if (x && k.start < k.end && (x->state == LS_DONE || x->state == LS_CONSUMED)) {
        uint64_t c0 = k.start / C, c1 = KVT_MIN(k.end, (uint64_t)k.ntokens) / C;
        if (c1 > x->hits)
            c1 = x->hits;
        for (uint64_t c = c0; c < c1; c++)
            for (uint32_t r = 0; r < x->nr; r++) {
                if (k.has_worker && x->nr > 1 && r != k.worker_id)
                    continue;
                uint32_t i = (uint32_t)c * x->nr + r;
                if (x->readers[i]) {
                    x->readers[i] = 0;
                    kvt_core_put(m->env->core, x->hs[i]);
                }
            }
    }
    lmc_key_free(&k);
    lmc_reply(q, NULL);
}

static void h_end_session(struct lmc_rq *q)
{
    const char *rid;
    size_t rl;
    if (lmc_decode_str(q, 0, "request_id", &rid, &rl))
        return;
    struct lmc_sess *x = lmc_sess_find(q->m, rid, rl);
    if (x)
        lmc_sess_remove(q->m, x);
    lmc_reply(q, NULL);
}

struct xfer_args {
    struct lmc_key k;
    struct lmc_ctx *c;
    int64_t inst;
    uint32_t ns, c0, c1;
    uint8_t *hashes;
    uint8_t id[32];
};

static void serve_as_nothing(struct lmc_rq *q);

/* prepare_store's answer: {context: {slots: [k slots of c at offs],
 * chunk_indices: idx[0..k)}}; k 0: nothing to store. */
static void reply_store_slots(struct lmc_rq *q, const struct lmc_ctx *c, const uint64_t *offs,
                              const uint32_t *idx, uint32_t k)
{
    struct body b;
    lmc_body_init(&b);
    msgpack_pack_map(&b.pk, 1);
    kvt_mp_str0(&b.pk, "context");
    msgpack_pack_map(&b.pk, 2);
    kvt_mp_str0(&b.pk, "slots");
    msgpack_pack_array(&b.pk, k);
    for (uint32_t i = 0; i < k; i++)
        lmc_pack_slot(&b.pk, c, offs[i]);
    kvt_mp_str0(&b.pk, "chunk_indices");
    msgpack_pack_array(&b.pk, k);
    for (uint32_t i = 0; i < k; i++)
        msgpack_pack_uint32(&b.pk, idx[i]);
    lmc_reply_body(q, &b);
}

/* prepare_retrieve's answer up to its context map of nctx entries:
 * {success, data: b"", context: {...}} */
static void pack_retrieve_head(msgpack_packer *pk, bool success, uint32_t nctx)
{
    msgpack_pack_map(pk, 3);
    kvt_mp_str0(pk, "success");
    if (success)
        msgpack_pack_true(pk);
    else
        msgpack_pack_false(pk);
    kvt_mp_str0(pk, "data");
    msgpack_pack_bin(pk, 0);
    kvt_mp_str0(pk, "context");
    msgpack_pack_map(pk, nctx);
}

/* prepare_retrieve's miss: {success: false, data: b"", context: {}} */
static void reply_retrieve_miss(struct lmc_rq *q)
{
    struct body b;
    lmc_body_init(&b);
    pack_retrieve_head(&b.pk, false, 0);
    lmc_reply_body(q, &b);
}

static int xfer_begin(struct lmc_rq *q, struct xfer_args *a, bool write)
{
    memset(a, 0, sizeof(*a));
    int rc = lmc_decode_key(q, 0, &a->k);
    if (rc)
        return rc;
    if ((rc = lmc_decode_i64(q, 1, "instance_id", &a->inst)))
        goto fail;
    if (!a->k.has_worker) {
        lmc_reply_err(q, "a %s key needs worker_id", write ? "store" : "retrieve");
        rc = KVT_E_BADREQ;
        goto fail;
    }
    if ((rc = lmc_key_ns(q, &a->k, &a->ns)) ||
        (rc = lmc_key_chunks(q, &a->k, false, &a->c0, &a->c1, &a->hashes)))
        goto fail;
    if (lmc_denied(q, a->ns, write)) {
        serve_as_nothing(q);
        rc = KVT_E_DENIED;
        goto fail;
    }
    a->c = lmc_ctx_find(q->m, a->inst);
    if (!a->c) {
        /* a worker this server does not know: kvtier restarted under a running
         * vLLM. An error would raise in the worker and fail its step, so the
         * transfer degrades (nothing stored, a miss) while ping makes the
         * worker register again (h_ping). */
        uint64_t nth = atomic_fetch_add(&q->m->unknown_instance, 1) + 1;
        if ((nth & (nth - 1)) == 0) /* 1st, 2nd, 4th, ...: no flood */
            kvt_warn("lmcache: %s from instance %lld, which has not registered with this server: "
                     "served as a miss until it registers again",
                     lmc_ops[q->op].name, (long long)a->inst);
        serve_as_nothing(q);
        rc = KVT_E_NOTFOUND;
        goto fail;
    }
    a->c->last_seen_ns = kvt_now_ns();
    lmc_xfer_id(a->inst, &a->k, a->ns, a->c1 ? a->hashes + 32 * (a->c1 - 1) : NULL, a->id);
    return 0;
fail:
    lmc_key_free(&a->k);
    free(a->hashes);
    return rc;
}

/* A transfer that cannot be served answers what the worker takes without an
 * error: nothing to store, a miss, or nothing committed. */
static void serve_as_nothing(struct lmc_rq *q)
{
    switch (q->op) {
    case LMC_PREPARE_STORE:
        reply_store_slots(q, NULL, NULL, NULL, 0);
        break;
    case LMC_PREPARE_RETRIEVE:
        reply_retrieve_miss(q);
        break;
    default:
        lmc_reply_bool(q, q->op == LMC_COMMIT_RETRIEVE);
    }
}

static void xfer_end(struct xfer_args *a)
{
    lmc_key_free(&a->k);
    free(a->hashes);
}

static void xfer_add(struct kvt_lmc *m, struct xfer_args *a, bool write, uint64_t lease, uint32_t n)
{
    struct lmc_xfer **pp;
    if (lmc_xfer_find(m, a->id, write, &pp)) /* a retried prepare replaces the first */
        lmc_xfer_drop(m, pp);
    struct lmc_xfer *x = kvt_xcalloc(1, sizeof(*x));
    x->instance_id = a->inst;
    memcpy(x->id, a->id, 32);
    x->write = write;
    x->lease = lease;
    x->n = n;
    x->t_ns = kvt_now_ns();
    x->next = m->xfers;
    m->xfers = x;
    atomic_fetch_add(&m->pending_xfers, 1);
}

/* Chunk c of a store as one "block" (docs/events.md): its LMCache chunk
 * hash, the previous chunk's as parent, its tokens; LMCache's client keeps
 * a host-tier store only with its tokens. */
static struct kvt_blocktag *chunk_tag(struct kvt_lmc *m, const struct xfer_args *a, uint32_t c)
{
    uint32_t C = (uint32_t)m->env->chunk_size;
    struct kvt_blocktag *t = kvt_blocktag_new(C, 1, 32, C);
    memcpy(t->hashes, a->hashes + 32 * c, 32);
    if (c > 0) {
        t->has_parent = 1;
        memcpy(t->parent, a->hashes + 32 * (c - 1), 32);
    }
    memcpy(t->tokens, a->k.tokens + (size_t)c * C, (size_t)C * sizeof(uint32_t));
    return t;
}

static void h_prepare_store(struct lmc_rq *q)
{
    struct kvt_lmc *m = q->m;
    struct xfer_args a;
    if (xfer_begin(q, &a, true))
        return;
    struct lmc_xfer **pp;
    if (lmc_xfer_find(m, a.id, true, &pp)) /* a retried prepare: its first reservation goes */
        lmc_xfer_drop(m, pp);
    uint32_t nc = a.c1 - a.c0, k = 0, rank = lmc_kv_rank(a.k.world_size, a.k.worker_id);
    uint32_t *hs = kvt_xmalloc((nc ? nc : 1) * sizeof(uint32_t));
    uint32_t *idx = kvt_xmalloc((nc ? nc : 1) * sizeof(uint32_t));
    uint64_t *offs = kvt_xmalloc((nc ? nc : 1) * sizeof(uint64_t));
    for (uint32_t c = a.c0; c < a.c1; c++) {
        kvt_key key;
        kvt_key_make(&key, a.ns, a.hashes + 32 * c, 32, rank, 0);
        struct kvt_l1_ref ref;
        int rc = kvt_core_reserve(m->env->core, &key, &a.c->meta, &ref);
        if (rc == 0) {
            if (m->env->events) /* its events carry the chunk's tokens and parent */
                kvt_core_tag(m->env->core, &key, chunk_tag(m, &a, c));
            hs[k] = ref.h;
            offs[k] = ref.off;
            idx[k++] = c - a.c0;
        } else if (rc != -EEXIST) {
            kvt_debug("lmcache: prepare_store: chunk %u not stored: %s", c, kvt_strerror(rc));
        }
    }
    if (k) {
        struct kvt_l1_owner ow = lmc_inst_owner(&a.inst);
        xfer_add(m, &a, true, kvt_core_lease_new(m->env->core, KVT_LEASE_WRITE, hs, k, &ow), k);
    }
    reply_store_slots(q, a.c, offs, idx, k);
    free(hs);
    free(idx);
    free(offs);
    xfer_end(&a);
}

static void h_commit_store(struct lmc_rq *q)
{
    struct kvt_lmc *m = q->m;
    const msgpack_object *d = lmc_arg(q, 2);
    if (d->type != MSGPACK_OBJECT_BIN && d->type != MSGPACK_OBJECT_STR) {
        lmc_reply_err(q, "argument data must be bytes");
        return;
    }
    struct xfer_args a;
    if (xfer_begin(q, &a, true))
        return;
    struct lmc_xfer **pp;
    struct lmc_xfer *x = lmc_xfer_find(m, a.id, true, &pp);
    if (d->via.bin.size) { /* the pickle transport */
        if (x)
            lmc_xfer_drop(m, pp);
        lmc_reply_err(
            q,
            "the worker sent its KV inline (LMCache's pickle transport), which kvtier "
            "does not take: the worker could not map the shared-memory pool "
            "/dev/shm/%s (it must run on this host, in the same IPC namespace, as "
            "the same user). Run vLLM or SGLang with LMCACHE_MP_TRANSFER_MODE=engine_driven on "
            "the server's host",
            m->cfg->shm_name);
        xfer_end(&a);
        return;
    }
    if (!x) {
        lmc_reply_bool(q, false);
        xfer_end(&a);
        return;
    }
    uint64_t lease = x->lease;
    uint32_t n = x->n;
    *pp = x->next;
    free(x);
    atomic_fetch_sub(&m->pending_xfers, 1);
    struct kvt_l1_owner ow = lmc_inst_owner(&a.inst);
    /* every slot written; no client tag: LMCache has no flush */
    int committed = kvt_core_commit(m->env->core, lease, &ow, NULL, n, 0);
    if (committed > 0)
        atomic_fetch_add_explicit(&m->chunks_stored, (uint64_t)committed, memory_order_relaxed);
    lmc_reply_bool(q, committed == (int)n);
    xfer_end(&a);
}

static void h_prepare_retrieve(struct lmc_rq *q)
{
    struct kvt_lmc *m = q->m;
    struct kvt_core *core = m->env->core;
    struct xfer_args a;
    if (xfer_begin(q, &a, false))
        return;
    uint32_t nc = a.c1 - a.c0, k = 0, rank = lmc_kv_rank(a.k.world_size, a.k.worker_id);
    struct kvt_l1_ref *refs = kvt_xmalloc((nc ? nc : 1) * sizeof(*refs));
    for (uint32_t c = a.c0; c < a.c1; c++) {
        kvt_key key;
        kvt_key_make(&key, a.ns, a.hashes + 32 * c, 32, rank, 0);
        if (kvt_core_get(core, &key, &refs[k]))
            break;
        k++;
        if (refs[k - 1].meta.len != a.c->meta.len) { /* another layout under this name */
            kvt_warn("lmcache: chunk %u of model %.*s is %u bytes, the worker's layout %u: "
                     "not served",
                     c, (int)a.k.model_len, a.k.model, refs[k - 1].meta.len, a.c->meta.len);
            break;
        }
    }
    if (nc == 0 || k != nc || refs[k - 1].meta.len != a.c->meta.len) {
        for (uint32_t i = 0; i < k; i++)
            kvt_core_put(core, refs[i].h);
        reply_retrieve_miss(q);
        free(refs);
        xfer_end(&a);
        return;
    }
    struct body b;
    lmc_body_init(&b);
    uint32_t *hs = kvt_xmalloc(nc * sizeof(uint32_t));
    for (uint32_t i = 0; i < nc; i++)
        hs[i] = refs[i].h;
    /* the read now holds its own references: the lookup's locks on these
     * chunks are used up for this worker */
    struct lmc_sess *x = lmc_sess_find(m, a.k.rid, a.k.rid_len);
    if (x && x->nh) {
        for (uint32_t c = a.c0; c < a.c1 && c < x->hits; c++) {
            uint32_t r = x->nr > 1 ? a.k.worker_id : 0;
            uint32_t i = c * x->nr + r;
            if (x->readers[i] && --x->readers[i] == 0)
                kvt_core_put(core, x->hs[i]);
        }
    }
    pack_retrieve_head(&b.pk, true, 1);
    kvt_mp_str0(&b.pk, "slots");
    msgpack_pack_array(&b.pk, nc);
    for (uint32_t i = 0; i < nc; i++)
        lmc_pack_slot(&b.pk, a.c, refs[i].off);
    struct kvt_l1_owner ow = lmc_inst_owner(&a.inst);
    xfer_add(m, &a, false, kvt_core_lease_new(core, KVT_LEASE_READ, hs, nc, &ow), nc);
    atomic_fetch_add_explicit(&m->chunks_retrieved, nc, memory_order_relaxed);
    lmc_reply_body(q, &b);
    free(hs);
    free(refs);
    xfer_end(&a);
}

static void h_commit_retrieve(struct lmc_rq *q)
{
    struct kvt_lmc *m = q->m;
    struct xfer_args a;
    if (xfer_begin(q, &a, false))
        return;
    struct lmc_xfer **pp;
    struct lmc_xfer *x = lmc_xfer_find(m, a.id, false, &pp);
    bool ok = true;
    if (x) {
        uint32_t *hs = kvt_xmalloc((x->n ? x->n : 1) * sizeof(uint32_t));
        struct kvt_l1_owner ow = lmc_inst_owner(&x->instance_id);
        int n = kvt_core_lease_handles(m->env->core, x->lease, KVT_LEASE_READ, &ow, hs, x->n);
        if (n > 0)
            kvt_core_touch(m->env->core, hs, (uint32_t)n);
        free(hs);
        /* an expired lease: the slots may have been reused while the worker read */
        ok = kvt_core_lease_end_read(m->env->core, x->lease, &ow) >= 0;
        *pp = x->next;
        free(x);
        atomic_fetch_sub(&m->pending_xfers, 1);
    }
    lmc_reply_bool(q, ok);
    xfer_end(&a);
}

static void h_ping(struct lmc_rq *q)
{
    int64_t inst;
    if (!lmc_is_nil(lmc_arg(q, 0))) {
        if (lmc_decode_i64(q, 0, "instance_id", &inst))
            return;
        struct lmc_ctx *c = lmc_ctx_find(q->m, inst);
        if (c) {
            c->last_seen_ns = kvt_now_ns();
        } else {
            /* LMCache's worker re-registers (and re-maps the pool) on the
             * unhealthy -> healthy edge of its heartbeat: answer false once to
             * a worker this server does not know (kvtier restarted), true
             * after, so that edge happens */
            struct kvt_lmc *m = q->m;
            bool seen = false;
            for (uint32_t i = 0; i < m->nnudged; i++)
                seen |= m->nudged[i] == inst;
            if (!seen) {
                m->nudged[m->nudge_pos++ % 64] = inst;
                if (m->nnudged < 64)
                    m->nnudged++;
                kvt_info("lmcache: ping from unregistered instance %lld: asking it to "
                         "register again",
                         (long long)inst);
                lmc_reply_bool(q, false);
                return;
            }
        }
    }
    lmc_reply_bool(q, true);
}

/* LMCache's clear empties L1 of what nobody holds; kvtier's L2 is not
 * touched (use kvtier purge for that). An admin operation. */
static void h_clear(struct lmc_rq *q)
{
    uint64_t freed = kvt_core_clear_l1(q->m->env->core);
    kvt_info("lmcache: clear: %llu bytes of L1 freed", (unsigned long long)freed);
    lmc_reply(q, NULL);
}

static void h_chunk_size(struct lmc_rq *q)
{
    lmc_reply_int(q, q->m->env->chunk_size);
}

static void h_noop(struct lmc_rq *q)
{
    struct body b;
    lmc_body_init(&b);
    kvt_mp_str0(&b.pk, "OK");
    lmc_reply_body(q, &b);
}

/* The capabilities LMCache's client asks for: the event stream when the
 * server keeps KV events (its worker then takes the host tier's stores and
 * evictions from subscribe_kv_events instead of reporting its own stores). */
static void h_experimental(struct lmc_rq *q)
{
    struct body b;
    lmc_body_init(&b);
    bool ev = lmc_events_on(q->m);
    msgpack_pack_array(&b.pk, ev ? 1 : 0);
    if (ev)
        kvt_mp_str0(&b.pk, "kv_event_stream");
    lmc_reply_body(q, &b);
}

/* accepted, nothing to do: kvtier keeps no block-level events, and
 * nothing is ever registered the ways these undo */
static void h_none(struct lmc_rq *q)
{
    lmc_reply(q, NULL);
}

/* the operator sees why an engine's cache construction failed */
static void h_lmc_driven(struct lmc_rq *q)
{
    kvt_warn("lmcache: %s refused: %s", lmc_ops[q->op].name, REFUSE_LMC_DRIVEN);
    lmc_reply_err(q, "%s", REFUSE_LMC_DRIVEN);
}

static void h_query_status(struct lmc_rq *q)
{
    h_query(q, false);
}

static void h_wait_status(struct lmc_rq *q)
{
    h_query(q, true);
}

enum {
    LMC_ADMIN = 1 << 0, /* with --auth-key: --lmcache-client must be an admin key */
};

/* The operations kvtier serves, one row each (indexed by the wire table's
 * enum, proto/lmc_wire.h); an operation without a row is an LMCache-only
 * feature and refused. */
struct lmc_proc {
    void (*fn)(struct lmc_rq *q);
    unsigned flags;
    const char *why; /* LMC_ADMIN: what the operation does, for the refusal */
};
static const struct lmc_proc procs[LMC_OP_COUNT] = {
    [LMC_GET_CHUNK_SIZE] = {.fn = h_chunk_size},
    [LMC_NOOP] = {.fn = h_noop},
    [LMC_GET_EXPERIMENTAL] = {.fn = h_experimental},
    [LMC_PING] = {.fn = h_ping},
    [LMC_CLEAR] = {.fn = h_clear, .flags = LMC_ADMIN, .why = "clear empties every tenant's L1"},
    [LMC_REPORT_BLOCK_ALLOCATION] = {.fn = h_none},
    [LMC_UNREGISTER_KV_CACHE] = {.fn = h_none},
    [LMC_UNREGISTER_Q_CACHE] = {.fn = h_none},
    [LMC_CB_UNREGISTER_ROPE] = {.fn = h_none},
    [LMC_REGISTER_ED_CONTEXT] = {.fn = h_register},
    [LMC_UNREGISTER_ED_CONTEXT] = {.fn = h_unregister},
    [LMC_LOOKUP] = {.fn = h_lookup},
    [LMC_QUERY_PREFETCH_STATUS] = {.fn = h_query_status},
    [LMC_WAIT_PREFETCH_STATUS] = {.fn = h_wait_status},
    [LMC_FREE_LOOKUP_LOCKS] = {.fn = h_free_locks},
    [LMC_END_SESSION] = {.fn = h_end_session},
    [LMC_PREPARE_STORE] = {.fn = h_prepare_store},
    [LMC_COMMIT_STORE] = {.fn = h_commit_store},
    [LMC_PREPARE_RETRIEVE] = {.fn = h_prepare_retrieve},
    [LMC_COMMIT_RETRIEVE] = {.fn = h_commit_retrieve},
    [LMC_REGISTER_KV_CACHE] = {.fn = h_lmc_driven},
    [LMC_STORE] = {.fn = h_lmc_driven},
    [LMC_RETRIEVE] = {.fn = h_lmc_driven},
    [LMC_REGISTER_Q_CACHE] = {.fn = h_lmc_driven},
    [LMC_STORE_Q] = {.fn = h_lmc_driven},
    [LMC_SUBSCRIBE_KV_EVENTS] = {.fn = lmc_h_subscribe},
};

static void dispatch(struct lmc_rq *q)
{
    const struct lmc_proc *p = &procs[q->op];
    if (!p->fn) {
        lmc_reply_err(q, "not supported by kvtier (CacheBlend, P2P, KV event streams and server "
                         "modules are LMCache-only features)");
        return;
    }
    if ((p->flags & LMC_ADMIN) && q->m->env->auth) { /* an operator's call */
        struct kvt_auth_client *c = lmc_who(q->m);
        if (!c || !c->admin) {
            lmc_count_denied(q->m, c);
            lmc_reply_err(q, "E_DENIED: %s: --lmcache-client %s is not an admin key", p->why,
                          q->m->cfg->client);
            return;
        }
    }
    p->fn(q);
}

/* one whole message: [ident][uid][op][args...] */
void lmc_handle(struct kvt_lmc *m, zmq_msg_t *parts, uint32_t n)
{
    struct lmc_rq q = {.m = m, .parts = parts, .n = n};
    char name[80];
    size_t ol;
    const void *op = lmc_frame(&q, 2, &ol);
    if (n >= 3 && ol == 0) { /* [uid][""][ack | cancel]: an event stream's control */
        lmc_stream_control(m, parts, n);
        return;
    }
    if (n < 3 || lmc_decode_op(op, ol, &q.op, name, sizeof(name))) {
        atomic_fetch_add(&m->bad_frames, 1);
        q.op = LMC_OP_UNKNOWN;
        if (n >= 2) /* the client can still match the uid */
            lmc_reply_err(&q, "a request is [uid][operation][payload...]; the operation must be a "
                              "msgpack integer id or string");
        return;
    }
    atomic_fetch_add_explicit(&m->count[q.op], 1, memory_order_relaxed);
    if (q.op == LMC_OP_UNKNOWN) {
        lmc_reply_err(&q, "unknown operation %s (kvtier speaks lmcache 0.5.6's protocol)", name);
        return;
    }
    q.nargs = n - 3;
    int want = lmc_ops[q.op].nargs;
    if ((int)q.nargs != want) {
        lmc_reply_err(&q,
                      "expects %d payload lmc_frame(s), got %u (kvtier speaks lmcache 0.5.6's "
                      "protocol; is the client another version?)",
                      want, q.nargs);
        return;
    }
    uint32_t i = 0;
    for (; i < q.nargs; i++) {
        msgpack_unpacked_init(&q.args[i]);
        size_t l;
        const void *p = lmc_frame(&q, 3 + i, &l);
        if (lmc_unpack(p, l, &q.args[i])) {
            lmc_reply_err(&q, "payload %u is not one msgpack document", i);
            i++;
            break;
        }
    }
    if (!q.done)
        dispatch(&q);
    for (uint32_t j = 0; j < i; j++)
        msgpack_unpacked_destroy(&q.args[j]);
    if (!q.done) /* never silent */
        lmc_reply_err(&q, "internal error: no reply was produced");
}
