/*
 * LMCache multi-process protocol front end (lmcache 0.5.6), enabled with
 * --lmcache-port: a drop-in for `lmcache server` in engine-driven mode.
 * docs/lmcache-protocol.md describes every operation.
 *
 * One thread ("lmcache") owns its own ZeroMQ ROUTER socket and all of this
 * file's state: registered worker contexts, sessions (a lookup's result and
 * the L1 references it holds for the retrieve), pending transfers (an L1
 * write or read lease per prepare_*). It calls the same store as the native
 * handlers: L1 (reserve, leases, get), the prefetch controller (L2 -> L1),
 * the store controller (L1 -> L2). The only other thread that touches it is
 * the prefetch thread: its callback queues the result under done_lock and
 * wakes this thread through an eventfd.
 *
 * The worker copies KV between its paged cache and the L1 pool itself: the
 * pool is a POSIX shared-memory object named --lmcache-shm-name (L1 creates
 * it when kvt_l1_opts.shm_name is set), which LMCache's worker opens by that
 * name, exactly as it opens `lmcache server`'s pool. kvtier never needs CUDA.
 *
 * Every request gets exactly one reply. LMCache's protocol has no error
 * frame; an error is sent as a reply whose operation frame is the msgpack
 * string "kvtier error: <op>: <message>". LMCache's client compares the
 * operation of every reply with its request and fails the request's future
 * with ValueError("Response operation '<that string>' does not match ..."),
 * so the message reaches the caller at once instead of after mq_timeout.
 */
#include "common/log.h"
#include "common/util.h"
#include "key/blake3.h"
#include "kvtier/error.h"
#include "proto/lmc_wire.h"
#include "server/internal.h"

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

#define MAX_ARGS 8
#define NBUCKETS 1024
#define MAX_FRAME_ECHO 64

/* a reply owed to a peer after this request's handler returned */
struct lmc_rep {
    struct lmc_rep *next;
    zmq_msg_t ident;
    uint8_t uid[MAX_FRAME_ECHO], op[MAX_FRAME_ECHO];
    size_t uid_len, op_len;
    uint64_t deadline_ns;
};

struct lmc_ctx { /* one registered engine-driven worker */
    struct lmc_ctx *next;
    int64_t instance_id;
    uint32_t world_size;
    char dtype[32];
    kvt_objmeta meta; /* len, dtype, shape of one chunk object */
    uint64_t last_seen_ns;
};

enum { LS_NONE, LS_PENDING, LS_DONE, LS_CONSUMED };

struct lmc_sess {
    struct lmc_sess *next;
    char rid[LMC_MAX_RID + 1];
    size_t rid_len;
    uint64_t gen; /* lookup generation (a prefetch result of an older one is dropped) */
    int state;
    uint32_t hits; /* chunks */
    uint32_t nr;   /* ranks per chunk in hs (world size, or 1 for a worker's lookup) */
    uint32_t nh;
    uint32_t *hs;       /* chunk-major: hs[c * nr + r] */
    uint16_t *readers;  /* reads still expected per handle; 0 = reference dropped */
    struct lmc_rep *waiters;
    uint64_t last_ns;
};

struct lmc_fetch { /* a lookup waiting for the prefetch controller */
    struct lmc_fetch *next;
    struct kvt_lmc *m;
    char rid[LMC_MAX_RID + 1];
    size_t rid_len;
    uint64_t gen;
    uint32_t n, m0, got, nr, readers;
    struct kvt_l1_ref *refs;
};

struct lmc_xfer { /* a prepare_* waiting for its commit_* */
    struct lmc_xfer *next;
    int64_t instance_id;
    uint8_t id[32];
    bool write;
    uint64_t lease;
    uint32_t n;
    uint64_t t_ns;
};

struct kvt_lmc {
    struct kvt_server *s;
    void *zctx, *sock;
    pthread_t th;
    bool started;
    int efd;
    _Atomic int stop; /* set by kvt_lmc_stop (main thread), read by the loop */
    pthread_mutex_t done_lock;
    struct lmc_fetch *done; /* prefetch results, newest first */
    struct lmc_ctx *ctxs;
    struct lmc_sess *sess[NBUCKETS];
    struct lmc_xfer *xfers;
    uint64_t gen;
    char endpoint[200];
    int64_t nudged[64]; /* unknown workers told "unhealthy" once by ping (a ring) */
    uint32_t nnudged, nudge_pos;
    _Atomic uint64_t unknown_instance;
    _Atomic uint64_t count[LMC_OP_COUNT], errors[LMC_OP_COUNT];
    _Atomic uint64_t bad_frames, sessions, contexts, pending_xfers;
    _Atomic uint64_t chunks_stored, chunks_retrieved, lookup_chunks, lookup_hits;
};

/* ------------------------------------------------------------ requests */

struct lmc_rq {
    struct kvt_lmc *m;
    zmq_msg_t *parts;
    uint32_t n;
    enum lmc_op op;
    msgpack_unpacked args[MAX_ARGS];
    uint32_t nargs;
    bool done;
};

static void send_frames(struct kvt_lmc *m, zmq_msg_t *ident, const void *uid, size_t ul,
                        const void *op, size_t ol, const void *body, size_t bl, bool has_body)
{
    zmq_msg_t id;
    zmq_msg_init(&id);
    zmq_msg_copy(&id, ident);
    zmq_msg_send(&id, m->sock, ZMQ_SNDMORE);
    zmq_msg_close(&id);
    zmq_send(m->sock, uid, ul, ZMQ_SNDMORE);
    zmq_send(m->sock, op, ol, has_body ? ZMQ_SNDMORE : 0);
    if (has_body)
        zmq_send(m->sock, body, bl, 0);
}

static const void *frame(struct lmc_rq *q, uint32_t i, size_t *len)
{
    if (i >= q->n) {
        *len = 0;
        return "";
    }
    *len = zmq_msg_size(&q->parts[i]);
    return zmq_msg_data(&q->parts[i]);
}

/* success: echo uid and op; body NULL = the result None (no frame) */
static void reply(struct lmc_rq *q, const msgpack_sbuffer *body)
{
    size_t ul, ol;
    const void *uid = frame(q, 1, &ul), *op = frame(q, 2, &ol);
    send_frames(q->m, &q->parts[0], uid, ul, op, ol, body ? body->data : NULL,
                body ? body->size : 0, body != NULL);
    q->done = true;
}

static void pack_err_op(msgpack_sbuffer *sb, const char *opname, const char *msg)
{
    msgpack_packer pk;
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    char text[700];
    snprintf(text, sizeof(text), "kvtier error: %s: %s", opname, msg);
    kvt_mp_str0(&pk, text);
}

static void reply_err(struct lmc_rq *q, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void reply_err(struct lmc_rq *q, const char *fmt, ...)
{
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    pack_err_op(&sb, lmc_ops[q->op].name, msg);
    size_t ul;
    const void *uid = frame(q, 1, &ul);
    send_frames(q->m, &q->parts[0], uid, ul, sb.data, sb.size, NULL, 0, false);
    msgpack_sbuffer_destroy(&sb);
    atomic_fetch_add_explicit(&q->m->errors[q->op], 1, memory_order_relaxed);
    kvt_debug("lmcache: %s refused: %s", lmc_ops[q->op].name, msg);
    q->done = true;
}

static struct lmc_rep *rep_save(struct lmc_rq *q, uint64_t deadline)
{
    struct lmc_rep *r = kvt_xcalloc(1, sizeof(*r));
    zmq_msg_init(&r->ident);
    zmq_msg_copy(&r->ident, &q->parts[0]);
    size_t ul, ol;
    const void *uid = frame(q, 1, &ul), *op = frame(q, 2, &ol);
    r->uid_len = KVT_MIN(ul, sizeof(r->uid));
    r->op_len = KVT_MIN(ol, sizeof(r->op));
    memcpy(r->uid, uid, r->uid_len);
    memcpy(r->op, op, r->op_len);
    r->deadline_ns = deadline;
    q->done = true;
    return r;
}

/* answer a saved request with an int, or None when value < 0 */
static void rep_int(struct kvt_lmc *m, struct lmc_rep *r, int64_t value)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    if (value >= 0)
        msgpack_pack_int64(&pk, value);
    send_frames(m, &r->ident, r->uid, r->uid_len, r->op, r->op_len, sb.data, sb.size,
                value >= 0);
    msgpack_sbuffer_destroy(&sb);
    zmq_msg_close(&r->ident);
    free(r);
}

/* helpers for a reply body */
struct body {
    msgpack_sbuffer sb;
    msgpack_packer pk;
};
static void body_init(struct body *b)
{
    msgpack_sbuffer_init(&b->sb);
    msgpack_packer_init(&b->pk, &b->sb, msgpack_sbuffer_write);
}
static void reply_body(struct lmc_rq *q, struct body *b)
{
    reply(q, &b->sb);
    msgpack_sbuffer_destroy(&b->sb);
}
static void reply_int(struct lmc_rq *q, int64_t v)
{
    struct body b;
    body_init(&b);
    msgpack_pack_int64(&b.pk, v);
    reply_body(q, &b);
}
static void reply_bool(struct lmc_rq *q, bool v)
{
    struct body b;
    body_init(&b);
    if (v)
        msgpack_pack_true(&b.pk);
    else
        msgpack_pack_false(&b.pk);
    reply_body(q, &b);
}

static const msgpack_object *arg(struct lmc_rq *q, uint32_t i)
{
    return &q->args[i].data;
}

/* --------------------------------------------------------------- state */

static struct lmc_ctx *ctx_find(struct kvt_lmc *m, int64_t id)
{
    for (struct lmc_ctx *c = m->ctxs; c; c = c->next)
        if (c->instance_id == id)
            return c;
    return NULL;
}

static uint32_t bucket(const char *rid, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)rid[i]) * 1099511628211ull;
    return (uint32_t)(h % NBUCKETS);
}

static struct lmc_sess *sess_find(struct kvt_lmc *m, const char *rid, size_t n)
{
    for (struct lmc_sess *x = m->sess[bucket(rid, n)]; x; x = x->next)
        if (x->rid_len == n && memcmp(x->rid, rid, n) == 0)
            return x;
    return NULL;
}

static struct lmc_sess *sess_get(struct kvt_lmc *m, const char *rid, size_t n)
{
    struct lmc_sess *x = sess_find(m, rid, n);
    if (!x) {
        x = kvt_xcalloc(1, sizeof(*x));
        memcpy(x->rid, rid, n);
        x->rid_len = n;
        uint32_t b = bucket(rid, n);
        x->next = m->sess[b];
        m->sess[b] = x;
        atomic_fetch_add(&m->sessions, 1);
    }
    x->last_ns = kvt_now_ns();
    return x;
}

/* drop the references a session holds (a lookup's locks) */
static void sess_release(struct kvt_lmc *m, struct lmc_sess *x)
{
    for (uint32_t i = 0; i < x->nh; i++)
        if (x->readers[i])
            kvt_l1_put(m->s->l1, x->hs[i]);
    free(x->hs);
    free(x->readers);
    x->hs = NULL;
    x->readers = NULL;
    x->nh = 0;
    x->hits = 0;
}

static void answer_waiters(struct kvt_lmc *m, struct lmc_sess *x)
{
    struct lmc_rep *r = x->waiters;
    x->waiters = NULL;
    /* the result is handed over once (as LMCache's job table); later ones see 0 */
    while (r) {
        struct lmc_rep *nx = r->next;
        if (x->state == LS_DONE) {
            rep_int(m, r, x->hits);
            x->state = LS_CONSUMED;
        } else {
            rep_int(m, r, 0);
        }
        r = nx;
    }
}

static void sess_remove(struct kvt_lmc *m, struct lmc_sess *x)
{
    struct lmc_sess **pp = &m->sess[bucket(x->rid, x->rid_len)];
    while (*pp && *pp != x)
        pp = &(*pp)->next;
    if (*pp)
        *pp = x->next;
    if (x->nh)
        kvt_l1_touch(m->s->l1, x->hs, x->nh);
    sess_release(m, x);
    x->state = LS_NONE;
    answer_waiters(m, x);
    free(x);
    atomic_fetch_sub(&m->sessions, 1);
}

static struct lmc_xfer *xfer_find(struct kvt_lmc *m, const uint8_t id[32], bool write,
                                  struct lmc_xfer ***pprev)
{
    for (struct lmc_xfer **pp = &m->xfers; *pp; pp = &(*pp)->next)
        if ((*pp)->write == write && memcmp((*pp)->id, id, 32) == 0) {
            if (pprev)
                *pprev = pp;
            return *pp;
        }
    return NULL;
}

/* A transfer's lease belongs to the worker instance that prepared it. */
static struct kvt_l1_owner inst_owner(const int64_t *inst)
{
    struct kvt_l1_owner o = {.id = inst, .len = sizeof(*inst)};
    return o;
}

/* end a transfer's lease: a write that is not committed is aborted */
static void xfer_drop(struct kvt_lmc *m, struct lmc_xfer **pp)
{
    struct lmc_xfer *x = *pp;
    *pp = x->next;
    if (x->write) {
        uint64_t *none = kvt_xcalloc(kvt_bm_words(x->n ? x->n : 1), sizeof(uint64_t));
        struct kvt_l1_owner ow = inst_owner(&x->instance_id);
        kvt_l1_lease_end(m->s->l1, x->lease, KVT_LEASE_WRITE, &ow, none, NULL, 0);
        free(none);
    } else {
        struct kvt_l1_owner ow = inst_owner(&x->instance_id);
        kvt_l1_lease_end(m->s->l1, x->lease, KVT_LEASE_READ, &ow, NULL, NULL, 0);
    }
    free(x);
    atomic_fetch_sub(&m->pending_xfers, 1);
}

/* --------------------------------------------------------------- keys */

/* Chunk hashes of a key's token range [start, end), hashed from token 0.
 * LMCache asserts chunk alignment and end <= len(tokens); here that is an
 * error reply. Returns 0 with *c0, *c1 (chunk indices) and *hashes (32 bytes
 * per chunk for chunks 0..c1-1), or -1 after replying. */
static int key_chunks(struct lmc_rq *q, const struct lmc_key *k, bool whole, uint32_t *c0,
                      uint32_t *c1, uint8_t **hashes)
{
    uint32_t C = (uint32_t)q->m->s->cfg->chunk_size;
    uint64_t end = k->end;
    if (whole) { /* lookup: every full chunk up to end */
        if (end > k->ntokens)
            end = k->ntokens;
        end -= end % C;
    } else {
        if (k->start % C || k->end % C) {
            reply_err(q, "start (%llu) and end (%llu) must be multiples of the chunk size %u",
                      (unsigned long long)k->start, (unsigned long long)k->end, C);
            return -1;
        }
        if (k->end > k->ntokens) {
            reply_err(q, "end (%llu) exceeds the key's %zu token(s)", (unsigned long long)k->end,
                      k->ntokens);
            return -1;
        }
        if (k->start > k->end) {
            reply_err(q, "start (%llu) is after end (%llu)", (unsigned long long)k->start,
                      (unsigned long long)k->end);
            return -1;
        }
    }
    *c0 = whole ? 0 : (uint32_t)(k->start / C);
    *c1 = (uint32_t)(end / C);
    *hashes = kvt_xmalloc(32 * (size_t)(*c1 ? *c1 : 1));
    kvt_lmc_chunk_hashes(k->tokens, end, C, *hashes, *c1);
    return 0;
}

static int key_ns(struct lmc_rq *q, const struct lmc_key *k, uint32_t *ns)
{
    const char *why = "invalid key";
    if (kvt_ns_intern(k->model, k->model_len, k->salt, k->salt_len, ns, &why)) {
        reply_err(q, "%s", why);
        return -1;
    }
    return 0;
}

static int decode_key(struct lmc_rq *q, uint32_t i, struct lmc_key *k)
{
    char why[256];
    if (lmc_key_decode(arg(q, i), k, why, sizeof(why))) {
        reply_err(q, "bad IPCCacheServerKey: %s", why);
        return -1;
    }
    return 0;
}

static int decode_i64(struct lmc_rq *q, uint32_t i, const char *name, int64_t *v)
{
    if (lmc_get_int(arg(q, i), v)) {
        reply_err(q, "argument %s must be an integer", name);
        return -1;
    }
    return 0;
}

static int decode_str(struct lmc_rq *q, uint32_t i, const char *name, const char **s, size_t *n)
{
    if (lmc_get_str(arg(q, i), s, n)) {
        reply_err(q, "argument %s must be a string", name);
        return -1;
    }
    if (*n > LMC_MAX_RID) {
        reply_err(q, "argument %s is longer than %u bytes", name, LMC_MAX_RID);
        return -1;
    }
    return 0;
}

/* identity of a prepare/commit pair: LMCache's (instance_id, key) where the
 * key compares model, world size, worker, tokens, range and salt */
static void xfer_id(int64_t inst, const struct lmc_key *k, uint32_t ns, const uint8_t *last_hash,
                    uint8_t out[32])
{
    /* LMCache leaves request_id out of the key's equality; kvtier keeps it in,
     * so two requests with the same tokens never commit each other's slots */
    uint8_t b[8 + 4 + 4 + 8 + 8 + 4 + 32 + 2 + LMC_MAX_RID];
    size_t o = 0;
    memcpy(b + o, &inst, 8), o += 8;
    memcpy(b + o, &k->world_size, 4), o += 4;
    memcpy(b + o, &k->worker_id, 4), o += 4;
    memcpy(b + o, &k->start, 8), o += 8;
    memcpy(b + o, &k->end, 8), o += 8;
    memcpy(b + o, &ns, 4), o += 4;
    if (last_hash)
        memcpy(b + o, last_hash, 32);
    else
        memset(b + o, 0, 32);
    o += 32;
    uint16_t rl = (uint16_t)k->rid_len;
    memcpy(b + o, &rl, 2), o += 2;
    memcpy(b + o, k->rid, k->rid_len), o += k->rid_len;
    kvt_blake3(b, o, out);
}

static void pack_slot(msgpack_packer *pk, const struct lmc_ctx *c, uint64_t off)
{
    msgpack_pack_map(pk, 4);
    kvt_mp_str0(pk, "offset");
    msgpack_pack_uint64(pk, off);
    kvt_mp_str0(pk, "length");
    msgpack_pack_uint32(pk, c->meta.len);
    kvt_mp_str0(pk, "shape");
    msgpack_pack_array(pk, c->meta.ndim);
    for (int d = 0; d < c->meta.ndim; d++)
        msgpack_pack_uint32(pk, c->meta.shape[d]);
    kvt_mp_str0(pk, "dtype");
    kvt_mp_str0(pk, c->dtype);
}

static const char *const REFUSE_LMC_DRIVEN =
    "kvtier serves LMCache's engine-driven transfer mode only: lmcache_driven (the server "
    "copying through CUDA IPC handles) is not available. Start vLLM with "
    "LMCACHE_MP_TRANSFER_MODE=engine_driven";

/* ------------------------------------------------------------ handlers */

static void h_register(struct lmc_rq *q)
{
    struct kvt_lmc *m = q->m;
    struct lmc_register r;
    char why[256];
    if (lmc_register_decode(arg(q, 0), &r, why, sizeof(why))) {
        reply_err(q, "bad RegisterEngineDrivenContextPayload: %s", why);
        return;
    }
    const char *mwhy;
    if (kvt_validate_model(r.model, r.model_len, &mwhy)) {
        reply_err(q, "model_name: %s", mwhy);
        return;
    }
    uint32_t slots = r.num_physical_slots ? r.num_physical_slots : (uint32_t)m->s->cfg->chunk_size;
    uint64_t bytes = (uint64_t)lmc_dtype_size(r.dtype) * r.num_layers * slots * r.hidden_dim *
                     (r.use_mla ? 1 : 2);
    if (bytes == 0 || bytes > m->s->cfg->max_object_bytes || bytes > UINT32_MAX) {
        reply_err(q, "one chunk would be %llu bytes; this server accepts objects of at most "
                     "%llu bytes (--max-object-mb)",
                  (unsigned long long)bytes, (unsigned long long)m->s->cfg->max_object_bytes);
        return;
    }
    struct lmc_ctx *c = ctx_find(m, r.instance_id);
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
    kvt_l1_shm(m->s->l1, &shm);
    struct body b;
    body_init(&b);
    msgpack_pack_map(&b.pk, 2);
    kvt_mp_str0(&b.pk, "shm_name");
    kvt_mp_str0(&b.pk, m->s->cfg->lmc_shm_name);
    kvt_mp_str0(&b.pk, "pool_size");
    msgpack_pack_uint64(&b.pk, shm.map_size);
    reply_body(q, &b);
}

static void drop_instance_xfers(struct kvt_lmc *m, int64_t inst)
{
    struct lmc_xfer **pp = &m->xfers;
    while (*pp) {
        if ((*pp)->instance_id == inst)
            xfer_drop(m, pp);
        else
            pp = &(*pp)->next;
    }
}

static void h_unregister(struct lmc_rq *q)
{
    struct kvt_lmc *m = q->m;
    int64_t inst;
    if (decode_i64(q, 0, "instance_id", &inst))
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
    reply(q, NULL);
}

static void finish_lookup(struct kvt_lmc *m, struct lmc_sess *x, struct kvt_l1_ref *refs,
                          uint32_t total, uint32_t nr, uint32_t readers)
{
    uint32_t hits = total / nr, keep = hits * nr;
    for (uint32_t i = keep; i < total; i++)
        kvt_l1_put(m->s->l1, refs[i].h);
    sess_release(m, x);
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
        kvt_l1_touch(m->s->l1, x->hs, keep);
    x->state = LS_DONE;
    atomic_fetch_add_explicit(&m->lookup_hits, hits, memory_order_relaxed);
    answer_waiters(m, x);
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

static void drain_fetches(struct kvt_lmc *m, bool discard)
{
    pthread_mutex_lock(&m->done_lock);
    struct lmc_fetch *f = m->done;
    m->done = NULL;
    pthread_mutex_unlock(&m->done_lock);
    while (f) {
        struct lmc_fetch *nx = f->next;
        uint32_t total = f->m0 + f->got;
        struct lmc_sess *x = discard ? NULL : sess_find(m, f->rid, f->rid_len);
        if (x && x->gen == f->gen && x->state == LS_PENDING) {
            finish_lookup(m, x, f->refs, total, f->nr, f->readers);
        } else { /* the session ended or looked up again meanwhile */
            for (uint32_t i = 0; i < total; i++)
                kvt_l1_put(m->s->l1, f->refs[i].h);
        }
        free(f->refs);
        free(f);
        f = nx;
    }
}

static void h_lookup(struct lmc_rq *q)
{
    struct kvt_lmc *m = q->m;
    struct kvt_server *s = m->s;
    struct lmc_key k;
    if (decode_key(q, 0, &k))
        return;
    struct lmc_sess *x = sess_get(m, k.rid, k.rid_len);
    sess_release(m, x); /* a new lookup replaces the previous one's locks */
    x->gen = ++m->gen;
    x->state = LS_NONE;
    answer_waiters(m, x); /* waiters of the previous lookup: 0 */
    x->state = LS_DONE;   /* 0 hits unless the lookup gets further */
    uint32_t ns, c0, c1;
    uint8_t *hashes = NULL;
    if (k.num_kv_readers < 1) {
        reply_err(q, "num_kv_readers=0: this server needs clients that send "
                     "IPCCacheServerKey.num_kv_readers (lmcache >= 0.5.6)");
        goto out;
    }
    if (key_ns(q, &k, &ns) || key_chunks(q, &k, true, &c0, &c1, &hashes))
        goto out;
    uint32_t nr = k.has_worker ? 1 : k.world_size;
    uint64_t n64 = (uint64_t)c1 * nr;
    if (n64 > KVT_MAX_BATCH * 16ull) {
        reply_err(q, "%llu chunk objects in one lookup: too many", (unsigned long long)n64);
        goto out;
    }
    uint32_t n = (uint32_t)n64;
    atomic_fetch_add_explicit(&m->lookup_chunks, c1, memory_order_relaxed);
    if (n == 0) {
        reply(q, NULL);
        goto out;
    }
    kvt_key *keys = kvt_xmalloc(n * sizeof(kvt_key));
    for (uint32_t c = 0; c < c1; c++)
        for (uint32_t r = 0; r < nr; r++) {
            uint32_t w = k.has_worker ? k.worker_id : r;
            kvt_key_make(&keys[c * nr + r], ns, hashes + 32 * c, 32,
                         lmc_kv_rank(k.world_size, w), 0);
        }
    struct kvt_l1_ref *refs = kvt_xcalloc(n, sizeof(*refs));
    uint32_t m0 = kvt_l1_get_prefix(s->l1, keys, n, refs);
    if (m0 == n || s->nl2 == 0) {
        finish_lookup(m, x, refs, m0, nr, k.num_kv_readers);
        free(refs);
    } else {
        x->state = LS_PENDING;
        struct lmc_fetch *f = kvt_xcalloc(1, sizeof(*f));
        f->m = m;
        memcpy(f->rid, k.rid, k.rid_len);
        f->rid_len = k.rid_len;
        f->gen = x->gen;
        f->n = n;
        f->m0 = m0;
        f->nr = nr;
        f->readers = k.num_kv_readers;
        f->refs = refs;
        kvt_prefetch_submit(s->pc, keys + m0, n - m0, on_prefetched, f);
    }
    free(keys);
    reply(q, NULL); /* LMCache answers a lookup once its prefetch is submitted */
out:
    free(hashes);
    lmc_key_free(&k);
}

static void h_query(struct lmc_rq *q, bool wait)
{
    struct kvt_lmc *m = q->m;
    const char *rid;
    size_t rl;
    if (decode_str(q, 0, "request_id", &rid, &rl))
        return;
    double timeout = 0;
    if (wait && lmc_get_float(arg(q, 1), &timeout)) {
        reply_err(q, "argument timeout must be a number of seconds");
        return;
    }
    struct lmc_sess *x = sess_find(m, rid, rl);
    if (!x || x->state == LS_NONE || x->state == LS_CONSUMED) {
        reply_int(q, 0); /* unknown, or already handed over */
        return;
    }
    x->last_ns = kvt_now_ns();
    if (x->state == LS_DONE) {
        x->state = LS_CONSUMED;
        reply_int(q, x->hits);
        return;
    }
    if (!wait || !(timeout > 0)) {
        reply(q, NULL); /* still prefetching */
        return;
    }
    if (timeout > 3600)
        timeout = 3600;
    struct lmc_rep *r = rep_save(q, kvt_now_ns() + (uint64_t)(timeout * 1e9));
    r->next = x->waiters;
    x->waiters = r;
}

static void h_free_locks(struct lmc_rq *q)
{
    struct kvt_lmc *m = q->m;
    struct lmc_key k;
    if (decode_key(q, 0, &k))
        return;
    struct lmc_sess *x = sess_find(m, k.rid, k.rid_len);
    uint32_t C = (uint32_t)m->s->cfg->chunk_size;
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
                    kvt_l1_put(m->s->l1, x->hs[i]);
                }
            }
    }
    lmc_key_free(&k);
    reply(q, NULL);
}

static void h_end_session(struct lmc_rq *q)
{
    const char *rid;
    size_t rl;
    if (decode_str(q, 0, "request_id", &rid, &rl))
        return;
    struct lmc_sess *x = sess_find(q->m, rid, rl);
    if (x)
        sess_remove(q->m, x);
    reply(q, NULL);
}

struct xfer_args {
    struct lmc_key k;
    struct lmc_ctx *c;
    int64_t inst;
    uint32_t ns, c0, c1;
    uint8_t *hashes;
    uint8_t id[32];
};

static int xfer_begin(struct lmc_rq *q, struct xfer_args *a, bool write)
{
    memset(a, 0, sizeof(*a));
    if (decode_key(q, 0, &a->k))
        return -1;
    if (decode_i64(q, 1, "instance_id", &a->inst))
        goto fail;
    if (!a->k.has_worker) {
        reply_err(q, "a %s key needs worker_id", write ? "store" : "retrieve");
        goto fail;
    }
    if (key_ns(q, &a->k, &a->ns) || key_chunks(q, &a->k, false, &a->c0, &a->c1, &a->hashes))
        goto fail;
    a->c = ctx_find(q->m, a->inst);
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
        switch (q->op) {
        case LMC_PREPARE_STORE: {
            struct body b;
            body_init(&b);
            msgpack_pack_map(&b.pk, 1);
            kvt_mp_str0(&b.pk, "context");
            msgpack_pack_map(&b.pk, 2);
            kvt_mp_str0(&b.pk, "slots");
            msgpack_pack_array(&b.pk, 0);
            kvt_mp_str0(&b.pk, "chunk_indices");
            msgpack_pack_array(&b.pk, 0);
            reply_body(q, &b);
            break;
        }
        case LMC_PREPARE_RETRIEVE: {
            struct body b;
            body_init(&b);
            msgpack_pack_map(&b.pk, 3);
            kvt_mp_str0(&b.pk, "success");
            msgpack_pack_false(&b.pk);
            kvt_mp_str0(&b.pk, "data");
            msgpack_pack_bin(&b.pk, 0);
            kvt_mp_str0(&b.pk, "context");
            msgpack_pack_map(&b.pk, 0);
            reply_body(q, &b);
            break;
        }
        default:
            reply_bool(q, q->op == LMC_COMMIT_RETRIEVE);
        }
        goto fail;
    }
    a->c->last_seen_ns = kvt_now_ns();
    xfer_id(a->inst, &a->k, a->ns, a->c1 ? a->hashes + 32 * (a->c1 - 1) : NULL, a->id);
    return 0;
fail:
    lmc_key_free(&a->k);
    free(a->hashes);
    return -1;
}

static void xfer_end(struct xfer_args *a)
{
    lmc_key_free(&a->k);
    free(a->hashes);
}

static void xfer_add(struct kvt_lmc *m, struct xfer_args *a, bool write, uint64_t lease,
                     uint32_t n)
{
    struct lmc_xfer **pp;
    if (xfer_find(m, a->id, write, &pp)) /* a retried prepare replaces the first */
        xfer_drop(m, pp);
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

static void h_prepare_store(struct lmc_rq *q)
{
    struct kvt_lmc *m = q->m;
    struct xfer_args a;
    if (xfer_begin(q, &a, true))
        return;
    struct lmc_xfer **pp;
    if (xfer_find(m, a.id, true, &pp)) /* a retried prepare: its first reservation goes */
        xfer_drop(m, pp);
    uint32_t nc = a.c1 - a.c0, k = 0, rank = lmc_kv_rank(a.k.world_size, a.k.worker_id);
    uint32_t *hs = kvt_xmalloc((nc ? nc : 1) * sizeof(uint32_t));
    uint32_t *idx = kvt_xmalloc((nc ? nc : 1) * sizeof(uint32_t));
    uint64_t *offs = kvt_xmalloc((nc ? nc : 1) * sizeof(uint64_t));
    for (uint32_t c = a.c0; c < a.c1; c++) {
        kvt_key key;
        kvt_key_make(&key, a.ns, a.hashes + 32 * c, 32, rank, 0);
        struct kvt_l1_ref ref;
        int rc = kvt_l1_reserve(m->s->l1, &key, &a.c->meta, &ref);
        if (rc == 0) {
            hs[k] = ref.h;
            offs[k] = ref.off;
            idx[k++] = c - a.c0;
        } else if (rc != -EEXIST) {
            kvt_debug("lmcache: prepare_store: chunk %u not stored: %s", c, kvt_strerror(rc));
        }
    }
    if (k) {
        struct kvt_l1_owner ow = inst_owner(&a.inst);
        xfer_add(m, &a, true, kvt_l1_lease_new(m->s->l1, KVT_LEASE_WRITE, hs, k, &ow), k);
    }
    struct body b;
    body_init(&b);
    msgpack_pack_map(&b.pk, 1);
    kvt_mp_str0(&b.pk, "context");
    msgpack_pack_map(&b.pk, 2);
    kvt_mp_str0(&b.pk, "slots");
    msgpack_pack_array(&b.pk, k);
    for (uint32_t i = 0; i < k; i++)
        pack_slot(&b.pk, a.c, offs[i]);
    kvt_mp_str0(&b.pk, "chunk_indices");
    msgpack_pack_array(&b.pk, k);
    for (uint32_t i = 0; i < k; i++)
        msgpack_pack_uint32(&b.pk, idx[i]);
    reply_body(q, &b);
    free(hs);
    free(idx);
    free(offs);
    xfer_end(&a);
}

static void h_commit_store(struct lmc_rq *q)
{
    struct kvt_lmc *m = q->m;
    struct kvt_server *s = m->s;
    const msgpack_object *d = arg(q, 2);
    if (d->type != MSGPACK_OBJECT_BIN && d->type != MSGPACK_OBJECT_STR) {
        reply_err(q, "argument data must be bytes");
        return;
    }
    struct xfer_args a;
    if (xfer_begin(q, &a, true))
        return;
    struct lmc_xfer **pp;
    struct lmc_xfer *x = xfer_find(m, a.id, true, &pp);
    if (d->via.bin.size) { /* the pickle transport */
        if (x)
            xfer_drop(m, pp);
        reply_err(q, "the worker sent its KV inline (LMCache's pickle transport), which kvtier "
                     "does not take: the worker could not map the shared-memory pool "
                     "/dev/shm/%s (it must run on this host, in the same IPC namespace, as "
                     "the same user). Run vLLM with LMCACHE_MP_TRANSFER_MODE=engine_driven on "
                     "the server's host",
                  s->cfg->lmc_shm_name);
        xfer_end(&a);
        return;
    }
    if (!x) {
        reply_bool(q, false);
        xfer_end(&a);
        return;
    }
    uint64_t lease = x->lease;
    uint32_t n = x->n;
    *pp = x->next;
    free(x);
    atomic_fetch_sub(&m->pending_xfers, 1);
    uint32_t *keep = kvt_xmalloc((n ? n : 1) * sizeof(uint32_t));
    struct kvt_l1_owner ow = inst_owner(&a.inst);
    int committed = kvt_l1_lease_end(s->l1, lease, KVT_LEASE_WRITE, &ow, NULL, keep, n);
    if (committed > 0) {
        struct kvt_l1_ref *refs = kvt_xmalloc((size_t)committed * sizeof(*refs));
        kvt_key *keys = kvt_xmalloc((size_t)committed * sizeof(kvt_key));
        for (int i = 0; i < committed; i++)
            kvt_l1_describe(s->l1, keep[i], &refs[i], &keys[i]);
        kvt_store_ctrl_submit(s->sc, refs, keys, (uint32_t)committed); /* refs move */
        free(refs);
        free(keys);
        atomic_fetch_add_explicit(&m->chunks_stored, (uint64_t)committed, memory_order_relaxed);
    }
    free(keep);
    reply_bool(q, committed == (int)n);
    xfer_end(&a);
}

static void h_prepare_retrieve(struct lmc_rq *q)
{
    struct kvt_lmc *m = q->m;
    struct kvt_l1 *l1 = m->s->l1;
    struct xfer_args a;
    if (xfer_begin(q, &a, false))
        return;
    uint32_t nc = a.c1 - a.c0, k = 0, rank = lmc_kv_rank(a.k.world_size, a.k.worker_id);
    struct kvt_l1_ref *refs = kvt_xmalloc((nc ? nc : 1) * sizeof(*refs));
    for (uint32_t c = a.c0; c < a.c1; c++) {
        kvt_key key;
        kvt_key_make(&key, a.ns, a.hashes + 32 * c, 32, rank, 0);
        if (kvt_l1_get(l1, &key, &refs[k]))
            break;
        k++;
        if (refs[k - 1].meta.len != a.c->meta.len) { /* another layout under this name */
            kvt_warn("lmcache: chunk %u of model %.*s is %u bytes, the worker's layout %u: "
                     "not served",
                     c, (int)a.k.model_len, a.k.model, refs[k - 1].meta.len, a.c->meta.len);
            break;
        }
    }
    struct body b;
    body_init(&b);
    if (nc == 0 || k != nc || refs[k - 1].meta.len != a.c->meta.len) {
        for (uint32_t i = 0; i < k; i++)
            kvt_l1_put(l1, refs[i].h);
        msgpack_pack_map(&b.pk, 3);
        kvt_mp_str0(&b.pk, "success");
        msgpack_pack_false(&b.pk);
        kvt_mp_str0(&b.pk, "data");
        msgpack_pack_bin(&b.pk, 0);
        kvt_mp_str0(&b.pk, "context");
        msgpack_pack_map(&b.pk, 0);
        reply_body(q, &b);
        free(refs);
        xfer_end(&a);
        return;
    }
    uint32_t *hs = kvt_xmalloc(nc * sizeof(uint32_t));
    for (uint32_t i = 0; i < nc; i++)
        hs[i] = refs[i].h;
    /* the read now holds its own references: the lookup's locks on these
     * chunks are used up for this worker */
    struct lmc_sess *x = sess_find(m, a.k.rid, a.k.rid_len);
    if (x && x->nh) {
        for (uint32_t c = a.c0; c < a.c1 && c < x->hits; c++) {
            uint32_t r = x->nr > 1 ? a.k.worker_id : 0;
            uint32_t i = c * x->nr + r;
            if (x->readers[i] && --x->readers[i] == 0)
                kvt_l1_put(l1, x->hs[i]);
        }
    }
    msgpack_pack_map(&b.pk, 3);
    kvt_mp_str0(&b.pk, "success");
    msgpack_pack_true(&b.pk);
    kvt_mp_str0(&b.pk, "data");
    msgpack_pack_bin(&b.pk, 0);
    kvt_mp_str0(&b.pk, "context");
    msgpack_pack_map(&b.pk, 1);
    kvt_mp_str0(&b.pk, "slots");
    msgpack_pack_array(&b.pk, nc);
    for (uint32_t i = 0; i < nc; i++)
        pack_slot(&b.pk, a.c, refs[i].off);
    struct kvt_l1_owner ow = inst_owner(&a.inst);
    xfer_add(m, &a, false, kvt_l1_lease_new(l1, KVT_LEASE_READ, hs, nc, &ow), nc);
    atomic_fetch_add_explicit(&m->chunks_retrieved, nc, memory_order_relaxed);
    reply_body(q, &b);
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
    struct lmc_xfer *x = xfer_find(m, a.id, false, &pp);
    bool ok = true;
    if (x) {
        uint32_t *hs = kvt_xmalloc((x->n ? x->n : 1) * sizeof(uint32_t));
        struct kvt_l1_owner ow = inst_owner(&x->instance_id);
        int n = kvt_l1_lease_handles(m->s->l1, x->lease, KVT_LEASE_READ, &ow, hs, x->n);
        if (n > 0)
            kvt_l1_touch(m->s->l1, hs, (uint32_t)n);
        free(hs);
        /* an expired lease: the slots may have been reused while the worker read */
        ok = kvt_l1_lease_end(m->s->l1, x->lease, KVT_LEASE_READ, &ow, NULL, NULL, 0) >= 0;
        *pp = x->next;
        free(x);
        atomic_fetch_sub(&m->pending_xfers, 1);
    }
    reply_bool(q, ok);
    xfer_end(&a);
}

static void h_ping(struct lmc_rq *q)
{
    int64_t inst;
    if (!lmc_is_nil(arg(q, 0))) {
        if (decode_i64(q, 0, "instance_id", &inst))
            return;
        struct lmc_ctx *c = ctx_find(q->m, inst);
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
                         "register again", (long long)inst);
                reply_bool(q, false);
                return;
            }
        }
    }
    reply_bool(q, true);
}

static void h_clear(struct lmc_rq *q)
{
    /* LMCache's clear empties L1 of what nobody holds; kvtier's L2 is not
     * touched (use kvtier purge for that) */
    uint64_t freed = kvt_l1_evict_to(q->m->s->l1, 0);
    kvt_info("lmcache: clear: %llu bytes of L1 freed", (unsigned long long)freed);
    reply(q, NULL);
}

static void dispatch(struct lmc_rq *q)
{
    struct body b;
    switch (q->op) {
    case LMC_GET_CHUNK_SIZE:
        reply_int(q, q->m->s->cfg->chunk_size);
        break;
    case LMC_NOOP:
        body_init(&b);
        kvt_mp_str0(&b.pk, "OK");
        reply_body(q, &b);
        break;
    case LMC_GET_EXPERIMENTAL:
        body_init(&b);
        msgpack_pack_array(&b.pk, 0);
        reply_body(q, &b);
        break;
    case LMC_PING:
        h_ping(q);
        break;
    case LMC_CLEAR:
        h_clear(q);
        break;
    case LMC_REPORT_BLOCK_ALLOCATION: /* accepted: kvtier keeps no block-level events */
    case LMC_UNREGISTER_KV_CACHE:     /* nothing is ever registered that way */
    case LMC_UNREGISTER_Q_CACHE:
    case LMC_CB_UNREGISTER_ROPE:
        reply(q, NULL);
        break;
    case LMC_REGISTER_ED_CONTEXT:
        h_register(q);
        break;
    case LMC_UNREGISTER_ED_CONTEXT:
        h_unregister(q);
        break;
    case LMC_LOOKUP:
        h_lookup(q);
        break;
    case LMC_QUERY_PREFETCH_STATUS:
        h_query(q, false);
        break;
    case LMC_WAIT_PREFETCH_STATUS:
        h_query(q, true);
        break;
    case LMC_FREE_LOOKUP_LOCKS:
        h_free_locks(q);
        break;
    case LMC_END_SESSION:
        h_end_session(q);
        break;
    case LMC_PREPARE_STORE:
        h_prepare_store(q);
        break;
    case LMC_COMMIT_STORE:
        h_commit_store(q);
        break;
    case LMC_PREPARE_RETRIEVE:
        h_prepare_retrieve(q);
        break;
    case LMC_COMMIT_RETRIEVE:
        h_commit_retrieve(q);
        break;
    case LMC_REGISTER_KV_CACHE:
    case LMC_STORE:
    case LMC_RETRIEVE:
    case LMC_REGISTER_Q_CACHE:
    case LMC_STORE_Q:
        reply_err(q, "%s", REFUSE_LMC_DRIVEN);
        break;
    default:
        reply_err(q, "not supported by kvtier (CacheBlend, P2P, KV event streams and server "
                     "modules are LMCache-only features)");
    }
}

/* one whole message: [ident][uid][op][args...] */
static void handle(struct kvt_lmc *m, zmq_msg_t *parts, uint32_t n)
{
    struct lmc_rq q = {.m = m, .parts = parts, .n = n};
    char name[80];
    size_t ol;
    const void *op = frame(&q, 2, &ol);
    if (n < 3 || lmc_decode_op(op, ol, &q.op, name, sizeof(name))) {
        atomic_fetch_add(&m->bad_frames, 1);
        q.op = LMC_OP_UNKNOWN;
        if (n >= 2) /* the client can still match the uid */
            reply_err(&q, "a request is [uid][operation][payload...]; the operation must be a "
                          "msgpack integer id or string");
        return;
    }
    atomic_fetch_add_explicit(&m->count[q.op], 1, memory_order_relaxed);
    if (q.op == LMC_OP_UNKNOWN) {
        reply_err(&q, "unknown operation %s (kvtier speaks lmcache 0.5.6's protocol)", name);
        return;
    }
    q.nargs = n - 3;
    int want = lmc_ops[q.op].nargs;
    if ((int)q.nargs != want) {
        reply_err(&q, "expects %d payload frame(s), got %u (kvtier speaks lmcache 0.5.6's "
                      "protocol; is the client another version?)",
                  want, q.nargs);
        return;
    }
    uint32_t i = 0;
    for (; i < q.nargs; i++) {
        msgpack_unpacked_init(&q.args[i]);
        size_t l;
        const void *p = frame(&q, 3 + i, &l);
        if (lmc_unpack(p, l, &q.args[i])) {
            reply_err(&q, "payload %u is not one msgpack document", i);
            i++;
            break;
        }
    }
    if (!q.done)
        dispatch(&q);
    for (uint32_t j = 0; j < i; j++)
        msgpack_unpacked_destroy(&q.args[j]);
    if (!q.done) /* never silent */
        reply_err(&q, "internal error: no reply was produced");
}

/* ---------------------------------------------------------------- loop */

static void sweep(struct kvt_lmc *m, uint64_t now, uint64_t *next_deadline)
{
    struct kvt_server_cfg *c = m->s->cfg;
    uint64_t rttl = (uint64_t)(c->l1_read_ttl_s * 1e9), wttl = (uint64_t)(c->l1_write_ttl_s * 1e9);
    for (int b = 0; b < NBUCKETS; b++) {
        struct lmc_sess *x = m->sess[b];
        while (x) {
            struct lmc_sess *nx = x->next;
            /* wait_prefetch_status deadlines */
            struct lmc_rep **pp = &x->waiters;
            while (*pp) {
                struct lmc_rep *r = *pp;
                if (r->deadline_ns <= now) {
                    *pp = r->next;
                    rep_int(m, r, -1); /* None: the wait timed out */
                } else {
                    if (r->deadline_ns < *next_deadline)
                        *next_deadline = r->deadline_ns;
                    pp = &r->next;
                }
            }
            /* a session nobody ended: its locks go with the read TTL */
            if (x->state != LS_PENDING && !x->waiters && now - x->last_ns > rttl)
                sess_remove(m, x);
            x = nx;
        }
    }
    struct lmc_xfer **pp = &m->xfers;
    uint64_t limit = KVT_MAX(rttl, wttl) + 60ull * 1000000000ull;
    while (*pp) {
        if (now - (*pp)->t_ns > limit)
            xfer_drop(m, pp); /* its lease has expired in L1 already */
        else
            pp = &(*pp)->next;
    }
}

static void *lmc_main(void *arg)
{
    struct kvt_lmc *m = arg;
    pthread_setname_np(pthread_self(), "lmcache");
    zmq_pollitem_t items[2] = {
        {.socket = m->sock, .events = ZMQ_POLLIN},
        {.fd = m->efd, .events = ZMQ_POLLIN},
    };
    uint64_t next_sweep = 0, next_deadline = UINT64_MAX;
    while (!atomic_load_explicit(&m->stop, memory_order_relaxed)) {
        uint64_t now = kvt_now_ns();
        if (now >= next_sweep || now >= next_deadline) {
            next_deadline = UINT64_MAX;
            sweep(m, now, &next_deadline);
            next_sweep = now + 1000000000ull;
        }
        uint64_t wake = KVT_MIN(next_sweep, next_deadline);
        long tmo = wake > now ? (long)((wake - now) / 1000000 + 1) : 0;
        int rc = zmq_poll(items, 2, tmo);
        if (rc < 0) {
            if (errno == EINTR)
                continue;
            kvt_error("lmcache: zmq_poll: %s", kvt_strerror(-errno));
            break;
        }
        if (items[1].revents & ZMQ_POLLIN) {
            uint64_t v;
            ssize_t r = read(m->efd, &v, sizeof(v));
            (void)r;
            drain_fetches(m, false);
        }
        if (!(items[0].revents & ZMQ_POLLIN))
            continue;
        for (int b = 0; b < 64 && !atomic_load_explicit(&m->stop, memory_order_relaxed); b++) {
            zmq_msg_t parts[3 + MAX_ARGS + 1];
            uint32_t n = 0;
            bool over = false;
            for (;;) {
                zmq_msg_t f;
                zmq_msg_init(&f);
                if (zmq_msg_recv(&f, m->sock, n == 0 ? ZMQ_DONTWAIT : 0) < 0) {
                    zmq_msg_close(&f);
                    break;
                }
                bool more = zmq_msg_more(&f);
                if (n < sizeof(parts) / sizeof(parts[0]))
                    memcpy(&parts[n++], &f, sizeof(f));
                else {
                    over = true;
                    zmq_msg_close(&f);
                }
                if (!more)
                    break;
            }
            if (n == 0)
                break;
            if (over) { /* more arguments than any operation takes */
                struct lmc_rq q = {.m = m, .parts = parts, .n = n};
                char name[80];
                size_t ol;
                const void *op = frame(&q, 2, &ol);
                if (lmc_decode_op(op, ol, &q.op, name, sizeof(name)))
                    q.op = LMC_OP_UNKNOWN;
                atomic_fetch_add(&m->bad_frames, 1);
                reply_err(&q, "too many payload frames");
            } else {
                handle(m, parts, n);
            }
            for (uint32_t i = 0; i < n; i++)
                zmq_msg_close(&parts[i]);
        }
    }
    return NULL;
}

/* --------------------------------------------------------------- setup */

int kvt_lmc_listen(struct kvt_server *s, char *err, size_t cap)
{
    struct kvt_server_cfg *c = s->cfg;
    struct kvt_lmc *m = kvt_xcalloc(1, sizeof(*m));
    m->s = s;
    s->lmc = m;
    pthread_mutex_init(&m->done_lock, NULL);
    m->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    snprintf(m->endpoint, sizeof(m->endpoint), "tcp://%s:%d", c->lmc_host, c->lmc_port);
    m->zctx = zmq_ctx_new();
    m->sock = zmq_socket(m->zctx, ZMQ_ROUTER);
    int zero = 0, linger = 0;
    int64_t maxmsg = 64ll << 20; /* token ids of the longest prompt, with room */
    zmq_setsockopt(m->sock, ZMQ_SNDHWM, &zero, sizeof(zero));
    zmq_setsockopt(m->sock, ZMQ_LINGER, &linger, sizeof(linger));
    zmq_setsockopt(m->sock, ZMQ_MAXMSGSIZE, &maxmsg, sizeof(maxmsg));
    int brc = m->efd < 0 ? -1 : zmq_bind(m->sock, m->endpoint);
    if (brc < 0 && m->efd >= 0 && errno == ENODEV) {
        /* libzmq binds to addresses or interface names, not host names (pyzmq's
         * bundled libzmq takes "localhost", LMCache's default): resolve it */
        struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai = NULL;
        if (getaddrinfo(c->lmc_host, NULL, &hints, &ai) == 0 && ai) {
            char ip[INET_ADDRSTRLEN];
            inet_ntop(AF_INET, &((struct sockaddr_in *)ai->ai_addr)->sin_addr, ip, sizeof(ip));
            snprintf(m->endpoint, sizeof(m->endpoint), "tcp://%s:%d", ip, c->lmc_port);
            brc = zmq_bind(m->sock, m->endpoint);
            freeaddrinfo(ai);
        } else {
            errno = ENODEV;
        }
    }
    if (brc < 0) {
        snprintf(err, cap, "--lmcache-port: cannot listen on %s: %s", m->endpoint,
                 m->efd < 0 ? kvt_strerror(-errno) : kvt_strerror(-errno));
        return -EADDRINUSE;
    }
    return 0;
}

int kvt_lmc_start(struct kvt_server *s, char *err, size_t cap)
{
    struct kvt_lmc *m = s->lmc;
    int rc = pthread_create(&m->th, NULL, lmc_main, m); /* returns the error, errno untouched */
    if (rc) {
        snprintf(err, cap, "--lmcache-port: cannot start its thread");
        return -rc;
    }
    m->started = true;
    return 0;
}

void kvt_lmc_stop(struct kvt_server *s)
{
    struct kvt_lmc *m = s->lmc;
    if (!m)
        return;
    atomic_store_explicit(&m->stop, 1, memory_order_relaxed); /* the eventfd write wakes it */
    if (m->started) {
        uint64_t one = 1;
        ssize_t w = write(m->efd, &one, sizeof(one));
        (void)w;
        pthread_join(m->th, NULL);
        m->started = false;
    }
    if (m->sock)
        zmq_close(m->sock);
    m->sock = NULL;
    if (m->zctx)
        zmq_ctx_term(m->zctx);
    m->zctx = NULL;
}

void kvt_lmc_free(struct kvt_server *s)
{
    struct kvt_lmc *m = s->lmc;
    if (!m)
        return;
    drain_fetches(m, true); /* the prefetch controller has stopped: no more arrive */
    while (m->xfers)
        xfer_drop(m, &m->xfers);
    for (int b = 0; b < NBUCKETS; b++)
        while (m->sess[b]) {
            struct lmc_sess *x = m->sess[b];
            struct lmc_rep *r = x->waiters;
            while (r) { /* the socket is gone: nobody to answer */
                struct lmc_rep *nx = r->next;
                zmq_msg_close(&r->ident);
                free(r);
                r = nx;
            }
            x->waiters = NULL;
            m->sess[b] = x->next;
            sess_release(m, x);
            free(x);
        }
    while (m->ctxs) {
        struct lmc_ctx *c = m->ctxs;
        m->ctxs = c->next;
        free(c);
    }
    if (m->efd >= 0)
        close(m->efd);
    pthread_mutex_destroy(&m->done_lock);
    free(m);
    s->lmc = NULL;
}

const char *kvt_lmc_endpoint(struct kvt_server *s)
{
    return s->lmc ? s->lmc->endpoint : NULL;
}

json_t *kvt_lmc_status(struct kvt_server *s)
{
    struct kvt_lmc *m = s->lmc;
    if (!m)
        return json_null();
    json_t *o = json_object();
    json_object_set_new(o, "endpoint", json_string(m->endpoint));
    json_object_set_new(o, "protocol", json_string("lmcache 0.5.6 multi-process (engine_driven)"));
    json_object_set_new(o, "shm_name", json_string(s->cfg->lmc_shm_name));
#define N(f) json_integer((json_int_t)atomic_load_explicit(&m->f, memory_order_relaxed))
    json_object_set_new(o, "contexts", N(contexts));
    json_object_set_new(o, "sessions", N(sessions));
    json_object_set_new(o, "pending_transfers", N(pending_xfers));
    json_object_set_new(o, "bad_frames", N(bad_frames));
    json_object_set_new(o, "unknown_instance_requests", N(unknown_instance));
    json_object_set_new(o, "lookup_chunks", N(lookup_chunks));
    json_object_set_new(o, "lookup_hit_chunks", N(lookup_hits));
    json_object_set_new(o, "chunks_stored", N(chunks_stored));
    json_object_set_new(o, "chunks_retrieved", N(chunks_retrieved));
    json_t *ops = json_object();
    for (int i = 0; i < LMC_OP_COUNT; i++) {
        uint64_t n = atomic_load_explicit(&m->count[i], memory_order_relaxed);
        uint64_t e = atomic_load_explicit(&m->errors[i], memory_order_relaxed);
        if (!n && !e)
            continue;
        json_t *x = json_object();
        json_object_set_new(x, "count", json_integer((json_int_t)n));
        json_object_set_new(x, "errors", json_integer((json_int_t)e));
        json_object_set_new(ops, lmc_ops[i].name, x);
    }
#undef N
    json_object_set_new(o, "ops", ops);
    return o;
}
