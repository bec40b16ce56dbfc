/*
 * LMCache multi-process protocol front end (lmcache 0.5.6), enabled with
 * --lmcache-port: a drop-in for `lmcache server` in engine-driven mode.
 * docs/lmcache-protocol.md describes every operation.
 *
 * One thread ("lmcache") owns its own ZeroMQ ROUTER socket and all of this
 * file's state: registered worker contexts, sessions (a lookup's result and
 * the L1 references it holds for the retrieve), pending transfers (an L1
 * write or read lease per prepare_*). It reaches the tiers through the
 * core (core/core.h), as kvtier's own protocol does: reserve, leases, get,
 * fetch (L1, then a prefetch from L2), commit (publish and submit to L2).
 * The only other thread that touches it is the prefetch thread: its
 * callback queues the result under done_lock and wakes this thread through
 * an eventfd. The server drives it through its descriptor
 * (kvt_front_lmcache, at the end of this file).
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
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

/* ------------------------------------------------------------ requests */

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

const void *lmc_frame(struct lmc_rq *q, uint32_t i, size_t *len)
{
    if (i >= q->n) {
        *len = 0;
        return "";
    }
    *len = zmq_msg_size(&q->parts[i]);
    return zmq_msg_data(&q->parts[i]);
}

/* success: echo uid and op; body NULL = the result None (no frame) */
void lmc_reply(struct lmc_rq *q, const msgpack_sbuffer *body)
{
    size_t ul, ol;
    const void *uid = lmc_frame(q, 1, &ul), *op = lmc_frame(q, 2, &ol);
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

void lmc_reply_err(struct lmc_rq *q, const char *fmt, ...)
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
    const void *uid = lmc_frame(q, 1, &ul);
    send_frames(q->m, &q->parts[0], uid, ul, sb.data, sb.size, NULL, 0, false);
    msgpack_sbuffer_destroy(&sb);
    atomic_fetch_add_explicit(&q->m->errors[q->op], 1, memory_order_relaxed);
    kvt_debug("lmcache: %s refused: %s", lmc_ops[q->op].name, msg);
    q->done = true;
}

struct lmc_rep *lmc_rep_save(struct lmc_rq *q, uint64_t deadline)
{
    struct lmc_rep *r = kvt_xcalloc(1, sizeof(*r));
    zmq_msg_init(&r->ident);
    zmq_msg_copy(&r->ident, &q->parts[0]);
    size_t ul, ol;
    const void *uid = lmc_frame(q, 1, &ul), *op = lmc_frame(q, 2, &ol);
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
    send_frames(m, &r->ident, r->uid, r->uid_len, r->op, r->op_len, sb.data, sb.size, value >= 0);
    msgpack_sbuffer_destroy(&sb);
    zmq_msg_close(&r->ident);
    free(r);
}

void lmc_body_init(struct body *b)
{
    msgpack_sbuffer_init(&b->sb);
    msgpack_packer_init(&b->pk, &b->sb, msgpack_sbuffer_write);
}
void lmc_reply_body(struct lmc_rq *q, struct body *b)
{
    lmc_reply(q, &b->sb);
    msgpack_sbuffer_destroy(&b->sb);
}
void lmc_reply_int(struct lmc_rq *q, int64_t v)
{
    struct body b;
    lmc_body_init(&b);
    msgpack_pack_int64(&b.pk, v);
    lmc_reply_body(q, &b);
}
void lmc_reply_bool(struct lmc_rq *q, bool v)
{
    struct body b;
    lmc_body_init(&b);
    if (v)
        msgpack_pack_true(&b.pk);
    else
        msgpack_pack_false(&b.pk);
    lmc_reply_body(q, &b);
}

const msgpack_object *lmc_arg(struct lmc_rq *q, uint32_t i)
{
    return &q->args[i].data;
}

/* --------------------------------------------------------------- state */

struct lmc_ctx *lmc_ctx_find(struct kvt_lmc *m, int64_t id)
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

struct lmc_sess *lmc_sess_find(struct kvt_lmc *m, const char *rid, size_t n)
{
    for (struct lmc_sess *x = m->sess[bucket(rid, n)]; x; x = x->next)
        if (x->rid_len == n && memcmp(x->rid, rid, n) == 0)
            return x;
    return NULL;
}

struct lmc_sess *lmc_sess_get(struct kvt_lmc *m, const char *rid, size_t n)
{
    struct lmc_sess *x = lmc_sess_find(m, rid, n);
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
void lmc_sess_release(struct kvt_lmc *m, struct lmc_sess *x)
{
    for (uint32_t i = 0; i < x->nh; i++)
        if (x->readers[i])
            kvt_core_put(m->env->core, x->hs[i]);
    free(x->hs);
    free(x->readers);
    x->hs = NULL;
    x->readers = NULL;
    x->nh = 0;
    x->hits = 0;
}

void lmc_answer_waiters(struct kvt_lmc *m, struct lmc_sess *x)
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

void lmc_sess_remove(struct kvt_lmc *m, struct lmc_sess *x)
{
    struct lmc_sess **pp = &m->sess[bucket(x->rid, x->rid_len)];
    while (*pp && *pp != x)
        pp = &(*pp)->next;
    if (*pp)
        *pp = x->next;
    if (x->nh)
        kvt_core_touch(m->env->core, x->hs, x->nh);
    lmc_sess_release(m, x);
    x->state = LS_NONE;
    lmc_answer_waiters(m, x);
    free(x);
    atomic_fetch_sub(&m->sessions, 1);
}

struct lmc_xfer *lmc_xfer_find(struct kvt_lmc *m, const uint8_t id[32], bool write,
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
struct kvt_l1_owner lmc_inst_owner(const int64_t *inst)
{
    struct kvt_l1_owner o = {.id = inst, .len = sizeof(*inst)};
    return o;
}

/* end a transfer's lease: a write that is not committed is aborted */
void lmc_xfer_drop(struct kvt_lmc *m, struct lmc_xfer **pp)
{
    struct lmc_xfer *x = *pp;
    *pp = x->next;
    struct kvt_l1_owner ow = lmc_inst_owner(&x->instance_id);
    kvt_core_lease_drop(m->env->core, x->lease, &ow);
    free(x);
    atomic_fetch_sub(&m->pending_xfers, 1);
}

/* --------------------------------------------------------------- keys */

/* Chunk hashes of a key's token range [start, end), hashed from token 0.
 * LMCache asserts chunk alignment and end <= len(tokens); here that is an
 * error reply. Returns 0 with *c0, *c1 (chunk indices) and *hashes (32 bytes
 * per chunk for chunks 0..c1-1), or KVT_E_BADREQ after replying. */
int lmc_key_chunks(struct lmc_rq *q, const struct lmc_key *k, bool whole, uint32_t *c0,
                   uint32_t *c1, uint8_t **hashes)
{
    uint32_t C = (uint32_t)q->m->env->chunk_size;
    uint64_t end = k->end;
    if (whole) { /* lookup: every full chunk up to end */
        if (end > k->ntokens)
            end = k->ntokens;
        end -= end % C;
    } else {
        if (k->start % C || k->end % C) {
            lmc_reply_err(q, "start (%llu) and end (%llu) must be multiples of the chunk size %u",
                          (unsigned long long)k->start, (unsigned long long)k->end, C);
            return KVT_E_BADREQ;
        }
        if (k->end > k->ntokens) {
            lmc_reply_err(q, "end (%llu) exceeds the key's %zu token(s)",
                          (unsigned long long)k->end, k->ntokens);
            return KVT_E_BADREQ;
        }
        if (k->start > k->end) {
            lmc_reply_err(q, "start (%llu) is after end (%llu)", (unsigned long long)k->start,
                          (unsigned long long)k->end);
            return KVT_E_BADREQ;
        }
    }
    *c0 = whole ? 0 : (uint32_t)(k->start / C);
    *c1 = (uint32_t)(end / C);
    *hashes = kvt_xmalloc(32 * (size_t)(*c1 ? *c1 : 1));
    kvt_lmc_chunk_hashes(k->tokens, end, C, *hashes, *c1);
    return 0;
}

int lmc_key_ns(struct lmc_rq *q, const struct lmc_key *k, uint32_t *ns)
{
    const char *why = "invalid key";
    if (kvt_ns_intern(k->model, k->model_len, k->salt, k->salt_len, ns, &why)) {
        lmc_reply_err(q, "%s", why);
        return KVT_E_BADREQ;
    }
    return 0;
}

int lmc_decode_key(struct lmc_rq *q, uint32_t i, struct lmc_key *k)
{
    char why[256];
    if (lmc_key_decode(lmc_arg(q, i), k, why, sizeof(why))) {
        lmc_reply_err(q, "bad IPCCacheServerKey: %s", why);
        return KVT_E_BADREQ;
    }
    return 0;
}

int lmc_decode_i64(struct lmc_rq *q, uint32_t i, const char *name, int64_t *v)
{
    if (lmc_get_int(lmc_arg(q, i), v)) {
        lmc_reply_err(q, "argument %s must be an integer", name);
        return KVT_E_BADREQ;
    }
    return 0;
}

int lmc_decode_str(struct lmc_rq *q, uint32_t i, const char *name, const char **s, size_t *n)
{
    if (lmc_get_str(lmc_arg(q, i), s, n)) {
        lmc_reply_err(q, "argument %s must be a string", name);
        return KVT_E_BADREQ;
    }
    if (*n > LMC_MAX_RID) {
        lmc_reply_err(q, "argument %s is longer than %u bytes", name, LMC_MAX_RID);
        return KVT_E_BADREQ;
    }
    return 0;
}

/* identity of a prepare/commit pair: LMCache's (instance_id, key) where the
 * key compares model, world size, worker, tokens, range and salt */
void lmc_xfer_id(int64_t inst, const struct lmc_key *k, uint32_t ns, const uint8_t *last_hash,
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

void lmc_pack_slot(msgpack_packer *pk, const struct lmc_ctx *c, uint64_t off)
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

/* ---------------------------------------------------------------- auth */

struct kvt_auth_client *lmc_who(struct kvt_lmc *m)
{
    /* a published table never changes but for atomic counters, and stays
     * until exit: this thread may read it (auth.h) */
    struct kvt_auth *a = kvt_front_auth(m->env);
    if (a != m->who_tab) {
        m->who_tab = a;
        m->who = kvt_auth_named(a, m->cfg->client, NULL);
        if (!m->who)
            kvt_error("lmcache: --lmcache-client %s is no longer one client of %s: every "
                      "request on the LMCache port is denied (served as a miss)",
                      m->cfg->client, m->env->auth_clients_file);
    }
    return m->who;
}

uint64_t lmc_count_denied(struct kvt_lmc *m, struct kvt_auth_client *c)
{
    if (c)
        atomic_fetch_add_explicit(&c->denied, 1, memory_order_relaxed);
    return atomic_fetch_add_explicit(&m->denied, 1, memory_order_relaxed) + 1;
}

bool lmc_denied(struct lmc_rq *q, uint32_t ns, bool write)
{
    struct kvt_lmc *m = q->m;
    if (!m->env->auth)
        return false;
    struct kvt_auth_client *c = lmc_who(m);
    const char *salt = kvt_ns_salt(ns);
    const char *why = !c                ? "its client is gone from the authorized-clients file"
                      : write && !c->rw ? "its client is read-only"
                      : !kvt_auth_salt_ok(c, salt)
                          ? "the cache salt is not one of its client's tenants"
                          : NULL;
    if (!why)
        return false;
    uint64_t nth = lmc_count_denied(m, c);
    uint64_t now = kvt_now_ns();
    if (now - m->denied_log_ns >= 1000000000ull) { /* one line a second at most */
        kvt_warn("lmcache: %s denied (served as a miss / nothing stored): %s (salt '%s', "
                 "client %s; %llu denied so far)",
                 lmc_ops[q->op].name, why, salt, m->cfg->client, (unsigned long long)nth);
        m->denied_log_ns = now;
    }
    return true;
}

/* ---------------------------------------------------------------- loop */

static void sweep(struct kvt_lmc *m, uint64_t now, uint64_t *next_deadline)
{
    uint64_t rttl = (uint64_t)(m->env->read_ttl_s * 1e9);
    uint64_t wttl = (uint64_t)(m->env->write_ttl_s * 1e9);
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
                lmc_sess_remove(m, x);
            x = nx;
        }
    }
    struct lmc_xfer **pp = &m->xfers;
    uint64_t limit = KVT_MAX(rttl, wttl) + 60ull * 1000000000ull;
    while (*pp) {
        if (now - (*pp)->t_ns > limit)
            lmc_xfer_drop(m, pp); /* its lease has expired in L1 already */
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
            lmc_drain_fetches(m, false);
            lmc_events_service(m); /* L1 logged events (the log writes efd too) */
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
                const void *op = lmc_frame(&q, 2, &ol);
                if (lmc_decode_op(op, ol, &q.op, name, sizeof(name)))
                    q.op = LMC_OP_UNKNOWN;
                atomic_fetch_add(&m->bad_frames, 1);
                lmc_reply_err(&q, "too many payload frames");
            } else {
                lmc_handle(m, parts, n);
            }
            for (uint32_t i = 0; i < n; i++)
                zmq_msg_close(&parts[i]);
        }
    }
    return NULL;
}

/* --------------------------------------------------------------- setup */

/* --lmcache-host ipc://PATH: PATH must be free, or a socket nobody listens
 * on (a SIGKILLed server's, removed here); libzmq would replace anything
 * there, another server's socket or a file. 0, or -errno with err. */
static int ipc_path_free(const char *path, char *err, size_t cap)
{
    struct stat st;
    if (lstat(path, &st) < 0) {
        int e = errno;
        if (e == ENOENT)
            return 0;
        snprintf(err, cap, "--lmcache-host: %s: %s", path, kvt_strerror(-e));
        return -e;
    }
    if (!S_ISSOCK(st.st_mode)) {
        snprintf(err, cap, "--lmcache-host: %s exists and is not a socket: not replaced", path);
        return -EEXIST;
    }
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof(a.sun_path)) {
        snprintf(err, cap, "--lmcache-host: %s: a Unix socket path holds at most %zu bytes", path,
                 sizeof(a.sun_path) - 1);
        return -ENAMETOOLONG;
    }
    memcpy(a.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    int rc = connect(fd, (struct sockaddr *)&a, sizeof(a));
    int e = errno;
    close(fd);
    if (rc == 0) {
        snprintf(err, cap, "--lmcache-host: %s: another process listens there (another server?)",
                 path);
        return -EADDRINUSE;
    }
    if (e == ECONNREFUSED && unlink(path) == 0) {
        kvt_info("lmcache: removed the stale socket %s (nobody listened on it)", path);
        return 0;
    }
    snprintf(err, cap, "--lmcache-host: %s: %s", path, kvt_strerror(-e));
    return -e;
}

bool kvt_lmc_host_is_ipc(const char *host)
{
    return !strncmp(host, "ipc://", 6);
}

/* Bind LMCache's port (with the other listeners, before storage opens). */
static int lmc_listen(const struct kvt_front_env *env, const void *cfg, void **out, char *err,
                      size_t cap)
{
    const struct kvt_lmc_cfg *c = cfg;
    *out = NULL;
    if (!c->port)
        return 0; /* off */
    struct kvt_lmc *m = kvt_xcalloc(1, sizeof(*m));
    m->env = env;
    m->cfg = c;
    *out = m;
    pthread_mutex_init(&m->done_lock, NULL);
    m->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (m->efd < 0) {
        int e = errno;
        snprintf(err, cap, "--lmcache-port: eventfd: %s", kvt_strerror(-e));
        return -e;
    }
    /* what LMCache's connector connects to: f"{lmcache.mp.host}:{lmcache.mp.port}" */
    bool ipc = kvt_lmc_host_is_ipc(c->host);
    snprintf(m->endpoint, sizeof(m->endpoint), "%s%s:%d", ipc ? "" : "tcp://", c->host, c->port);
    const char *path = m->endpoint + 6;
    m->ipc_file = ipc && path[0] != '@'; /* '@': Linux's abstract namespace, no file */
    if (m->ipc_file) {
        int rc = ipc_path_free(path, err, cap);
        if (rc)
            return rc;
    }
    m->zctx = zmq_ctx_new();
    m->sock = zmq_socket(m->zctx, ZMQ_ROUTER);
    int zero = 0, linger = 0;
    int64_t maxmsg = 64ll << 20; /* token ids of the longest prompt, with room */
    zmq_setsockopt(m->sock, ZMQ_SNDHWM, &zero, sizeof(zero));
    zmq_setsockopt(m->sock, ZMQ_LINGER, &linger, sizeof(linger));
    zmq_setsockopt(m->sock, ZMQ_MAXMSGSIZE, &maxmsg, sizeof(maxmsg));
    if (env->auth) {
        /* the handler before the domain and the bind: without one libzmq
         * admits every peer (the server's config allows only ipc:// here) */
        int rc = kvt_zap_start_same_uid(m->zctx, env->auth, env->auth_cur, c->client, &m->zap);
        if (!rc && zmq_setsockopt(m->sock, ZMQ_ZAP_DOMAIN, "kvtier-lmcache", 14))
            rc = -errno;
        if (rc) {
            snprintf(err, cap, "--lmcache-port: cannot start its ZAP handler: %s",
                     kvt_strerror(rc));
            return rc;
        }
    }
    /* the socket file is made 0600 as it is created: only the server's uid
     * (and root) may connect, with or without authentication. Nothing else
     * creates files now (start-up, before the adapters open). */
    mode_t um = m->ipc_file ? umask(0177) : 0;
    int brc = zmq_bind(m->sock, m->endpoint);
    int be = errno;
    if (m->ipc_file)
        umask(um);
    if (brc < 0 && !ipc && be == ENODEV) {
        /* libzmq binds to addresses or interface names, not host names (pyzmq's
         * bundled libzmq takes "localhost", LMCache's default): resolve it */
        struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai = NULL;
        if (getaddrinfo(c->host, NULL, &hints, &ai) == 0 && ai) {
            char ip[INET_ADDRSTRLEN];
            inet_ntop(AF_INET, &((struct sockaddr_in *)ai->ai_addr)->sin_addr, ip, sizeof(ip));
            snprintf(m->endpoint, sizeof(m->endpoint), "tcp://%s:%d", ip, c->port);
            brc = zmq_bind(m->sock, m->endpoint);
            be = errno;
            freeaddrinfo(ai);
        }
    }
    if (brc < 0) {
        snprintf(err, cap, "--lmcache-port: cannot listen on %s: %s%s", m->endpoint,
                 kvt_strerror(-be), ipc && be == ENOENT ? " (its directory must exist)" : "");
        return -be;
    }
    struct stat st;
    if (m->ipc_file && lstat(path, &st) == 0) {
        m->ipc_dev = st.st_dev;
        m->ipc_ino = st.st_ino;
    } else {
        m->ipc_file = false; /* not ours to remove at stop */
    }
    return 0;
}

/* Its thread: requests are served from now on. */
static int lmc_start(void *fe, char *err, size_t cap)
{
    struct kvt_lmc *m = fe;
    lmc_events_start(m);
    int rc = pthread_create(&m->th, NULL, lmc_main, m); /* returns the error, errno untouched */
    if (rc) {
        snprintf(err, cap, "--lmcache-port: cannot start its thread");
        return -rc;
    }
    m->started = true;
    return 0;
}

/* Before the worker pool, the controllers and L1 go: joins the thread,
 * closes the socket. */
static void lmc_stop(void *fe)
{
    struct kvt_lmc *m = fe;
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
    /* libzmq 4.3 leaves an ipc:// socket file behind: remove it, if it is
     * still the one this server bound (not a newer server's) */
    struct stat st;
    const char *path = m->endpoint + 6;
    if (m->ipc_file && lstat(path, &st) == 0 && st.st_dev == m->ipc_dev && st.st_ino == m->ipc_ino)
        unlink(path);
    m->ipc_file = false;
    if (m->zctx && m->zap) {
        zmq_ctx_shutdown(m->zctx); /* the ZAP thread's recv returns ETERM */
        kvt_zap_join(m->zap);
        m->zap = NULL;
    }
    if (m->zctx)
        zmq_ctx_term(m->zctx);
    m->zctx = NULL;
}

/* After the prefetch controller stopped, before L1 is destroyed: drops
 * every L1 reference it holds. */
static void lmc_free(void *fe)
{
    struct kvt_lmc *m = fe;
    lmc_drain_fetches(m, true); /* the prefetch controller has stopped: no more arrive */
    lmc_events_free(m);
    while (m->xfers)
        lmc_xfer_drop(m, &m->xfers);
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
            lmc_sess_release(m, x);
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
}

static void lmc_banner(void *fe)
{
    struct kvt_lmc *m = fe;
    kvt_info("LMCache protocol (lmcache 0.5.6, engine_driven) on %s; L1 pool /dev/shm/%s",
             m->endpoint, m->cfg->shm_name);
}

static json_t *lmc_status(void *fe)
{
    struct kvt_lmc *m = fe;
    json_t *o = json_object();
    json_object_set_new(o, "endpoint", json_string(m->endpoint));
    json_object_set_new(o, "protocol", json_string("lmcache 0.5.6 multi-process (engine_driven)"));
    json_object_set_new(o, "shm_name", json_string(m->cfg->shm_name));
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
    json_object_set_new(o, "kv_event_streams", N(nsubs_seen));
    json_object_set_new(o, "kv_event_batches", N(event_batches));
    if (m->env->auth) { /* status runs on the rpc thread: the name, not m->who */
        json_t *au = json_object();
        json_object_set_new(au, "client", json_string(m->cfg->client));
        json_object_set_new(au, "denied_requests", N(denied));
        json_object_set_new(au, "connections_refused",
                            json_integer((json_int_t)atomic_load(&m->env->auth->lmc_refused)));
        json_object_set_new(o, "auth", au);
    } else {
        json_object_set_new(o, "auth", json_null());
    }
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

const struct kvt_front_desc kvt_front_lmcache = {
    .name = "lmcache",
    .listen = lmc_listen,
    .start = lmc_start,
    .stop = lmc_stop,
    .free = lmc_free,
    .status = lmc_status,
    .banner = lmc_banner,
};
