/*
 * kvtier server: component setup, the rpc loop, replies, shutdown.
 *
 * Start-up order: the listeners first (the ROUTER socket binds, the HTTP
 * daemon answers 503 "starting" until the end of start-up), so that a
 * mistaken second start that fails on its port has touched no storage;
 * then the L2 adapters (each locks its directory or device; their recovery
 * scans start in the background), L1, controllers, eviction threads,
 * handler pool, the same-host socket. Requests queue in the bound socket
 * until the rpc loop runs. Shutdown (SIGTERM/SIGINT) reverses it: stop
 * receiving, finish handler jobs, stop prefetching, drain every pending L2
 * write, close adapters, exit 0.
 */
#include "server/server.h"
#include "common/log.h"
#include "common/util.h"
#include "kvtier/error.h"
#include "ops/cli.h"
#include "server/internal.h"
#include "server/notify.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <unistd.h>

const char *const kvt_op_names[OP_COUNT] = {
    "hello",           "ping",       "store",         "flush",        "lookup",
    "retrieve",        "free_locks", "prepare_store", "commit_store", "prepare_retrieve",
    "commit_retrieve", "status",     "delete",        "purge",        "unknown",
};

const double kvt_lat_bounds[KVT_LAT_BUCKETS] = {
    50e-6, 100e-6, 250e-6, 500e-6, 1e-3,   2.5e-3, 5e-3, 10e-3,
    25e-3, 50e-3,  100e-3, 250e-3, 500e-3, 1.0,    5.0,  1e300,
};

static struct kvt_l1 *g_l1; /* for ZeroMQ free callbacks of zero-copy frames */

/* ------------------------------------------------------------ replies */

struct reply *kvt_reply_new(const zmq_msg_t *ident, const void *rid, size_t rid_len, enum kvt_op op,
                            uint64_t t0)
{
    struct reply *r = kvt_xcalloc(1, sizeof(*r));
    zmq_msg_init(&r->ident);
    if (ident)
        zmq_msg_copy(&r->ident, (zmq_msg_t *)ident);
    /* echoed as it came, also when it is too long (the client matches its
     * error reply by it) */
    r->rid = rid_len > sizeof(r->rid_buf) ? kvt_xmalloc(rid_len) : r->rid_buf;
    r->rid_len = rid_len;
    if (rid_len)
        memcpy(r->rid, rid, rid_len);
    msgpack_sbuffer_init(&r->body);
    msgpack_packer_init(&r->pk, &r->body, msgpack_sbuffer_write);
    r->op = op;
    r->t0 = t0;
    return r;
}

void kvt_reply_free(struct reply *r)
{
    if (!r)
        return;
    zmq_msg_close(&r->ident);
    if (r->rid != r->rid_buf)
        free(r->rid);
    msgpack_sbuffer_destroy(&r->body);
    for (uint32_t i = 0; i < r->nframes; i++)
        kvt_l1_put(g_l1, r->frames[i].h);
    free(r->frames);
    free(r);
}

/* Copy in to out as valid UTF-8: every byte that does not start a
 * well-formed sequence (RFC 3629: no overlong forms, no surrogates, at most
 * U+10FFFF) becomes the four characters \xNN. out holds 4 * strlen(in) + 1. */
static void utf8_escape(const char *in, char *out)
{
    const uint8_t *p = (const uint8_t *)in;
    char *o = out;
    while (*p) {
        uint8_t b = *p;
        int len = b < 0x80                 ? 1
                  : b >= 0xc2 && b <= 0xdf ? 2
                  : b >= 0xe0 && b <= 0xef ? 3
                  : b >= 0xf0 && b <= 0xf4 ? 4
                                           : 0;
        bool ok = len > 0;
        for (int i = 1; ok && i < len; i++)
            ok = (p[i] & 0xc0) == 0x80; /* also stops at the terminating NUL */
        if (ok && len == 3)
            ok = !(b == 0xe0 && p[1] < 0xa0) && !(b == 0xed && p[1] >= 0xa0);
        if (ok && len == 4)
            ok = !(b == 0xf0 && p[1] < 0x90) && !(b == 0xf4 && p[1] >= 0x90);
        if (!ok) {
            o += sprintf(o, "\\x%02x", b);
            p++;
            continue;
        }
        memcpy(o, p, (size_t)len);
        o += len;
        p += len;
    }
    *o = 0;
}

void kvt_reply_error(struct reply *r, int code, const char *fmt, ...)
{
    char raw[512], msg[4 * sizeof(raw)];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(raw, sizeof(raw), fmt, ap);
    va_end(ap);
    /* messages quote what the client sent (an op name, a namespace): msgpack
     * str must be UTF-8, and a cut at 511 bytes may split a character */
    utf8_escape(raw, msg);
    msgpack_sbuffer_clear(&r->body);
    for (uint32_t i = 0; i < r->nframes; i++)
        kvt_l1_put(g_l1, r->frames[i].h);
    r->nframes = 0;
    r->status = code ? code : KVT_E_BADREQ;
    msgpack_pack_map(&r->pk, 3);
    kvt_mp_str0(&r->pk, "code");
    msgpack_pack_int32(&r->pk, r->status);
    kvt_mp_str0(&r->pk, "error");
    kvt_mp_str0(&r->pk, kvt_errname(r->status));
    kvt_mp_str0(&r->pk, "message");
    kvt_mp_str0(&r->pk, msg);
}

static void free_body(void *data, void *hint)
{
    (void)hint;
    free(data);
}

static void free_l1_frame(void *data, void *hint)
{
    (void)data;
    kvt_l1_put(g_l1, (uint32_t)(uintptr_t)hint);
}

static void record(struct kvt_server *s, struct reply *r)
{
    struct op_stats *st = &s->ops[r->op];
    uint64_t dt = kvt_now_ns() - r->t0;
    atomic_fetch_add_explicit(&st->count, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&st->sum_ns, dt, memory_order_relaxed);
    if (r->status)
        atomic_fetch_add_explicit(&st->errors, 1, memory_order_relaxed);
    double sec = (double)dt / 1e9;
    int b = 0;
    while (b < KVT_LAT_BUCKETS - 1 && sec > kvt_lat_bounds[b])
        b++;
    atomic_fetch_add_explicit(&st->bucket[b], 1, memory_order_relaxed);
}

static void order_done(struct kvt_server *s, const zmq_msg_t *ident);

void kvt_reply_send(struct kvt_server *s, struct reply *r)
{
    record(s, r);
    order_done(s, &r->ident); /* the connection's next request may run */
    if (kvt_local_is_ident(&r->ident)) {
        size_t blen = r->body.size;
        char *body = msgpack_sbuffer_release(&r->body);
        if (!body) {
            body = kvt_xmalloc(1);
            body[0] = (char)0x80; /* empty map */
            blen = 1;
        }
        kvt_local_send(s, r, body, blen); /* takes the body and frame references */
        kvt_reply_free(r);
        return;
    }
    void *sock = s->sock;
    zmq_msg_send(&r->ident, sock, ZMQ_SNDMORE);
    zmq_send(sock, r->rid, r->rid_len, ZMQ_SNDMORE);
    uint8_t st[4];
    kvt_wire_put_status(st, r->status);
    zmq_send(sock, st, 4, ZMQ_SNDMORE);
    size_t blen = r->body.size;
    char *body = msgpack_sbuffer_release(&r->body);
    zmq_msg_t m;
    if (!body) {
        body = kvt_xmalloc(1);
        body[0] = (char)0x80; /* empty map */
        blen = 1;
    }
    zmq_msg_init_data(&m, body, blen, free_body, NULL);
    zmq_msg_send(&m, sock, r->nframes ? ZMQ_SNDMORE : 0);
    for (uint32_t i = 0; i < r->nframes; i++) {
        struct kvt_l1_ref *f = &r->frames[i];
        /* zero copy: ZeroMQ sends from the pool; the reference keeps the
         * object in place until its I/O thread calls free_l1_frame */
        zmq_msg_init_data(&m, f->ptr, f->meta.len, free_l1_frame, (void *)(uintptr_t)f->h);
        atomic_fetch_add_explicit(&s->bytes_out, f->meta.len, memory_order_relaxed);
        zmq_msg_send(&m, sock, i + 1 < r->nframes ? ZMQ_SNDMORE : 0);
    }
    r->nframes = 0; /* references now belong to the sent frames */
    kvt_reply_free(r);
}

void kvt_reply_post(struct kvt_server *s, struct reply *r)
{
    r->next = NULL;
    pthread_mutex_lock(&s->reply_lock);
    if (s->rq_tail)
        s->rq_tail->next = r;
    else
        s->rq_head = r;
    s->rq_tail = r;
    pthread_mutex_unlock(&s->reply_lock);
    uint64_t one = 1;
    ssize_t w = write(s->reply_efd, &one, sizeof(one));
    (void)w;
}

static void drain_replies(struct kvt_server *s)
{
    uint64_t v;
    ssize_t n = read(s->reply_efd, &v, sizeof(v));
    (void)n;
    pthread_mutex_lock(&s->reply_lock);
    struct reply *r = s->rq_head;
    s->rq_head = s->rq_tail = NULL;
    pthread_mutex_unlock(&s->reply_lock);
    while (r) {
        struct reply *nx = r->next;
        kvt_reply_send(s, r);
        r = nx;
    }
}

static void kick_l1(void *ev)
{
    kvt_evictor_kick(ev);
}

static void on_store_progress(void *arg)
{
    struct kvt_server *s = arg;
    uint64_t one = 1;
    ssize_t w = write(s->progress_efd, &one, sizeof(one));
    (void)w;
}

/* ------------------------------------------------------------ receive */

static enum kvt_op op_of(const zmq_msg_t *m)
{
    size_t n = zmq_msg_size((zmq_msg_t *)m);
    const char *p = zmq_msg_data((zmq_msg_t *)m);
    for (int i = 0; i < OP_UNKNOWN; i++)
        if (strlen(kvt_op_names[i]) == n && memcmp(kvt_op_names[i], p, n) == 0)
            return (enum kvt_op)i;
    return OP_UNKNOWN;
}

#define MAX_PARTS (KVT_MAX_BATCH + 8 + 1) /* 65,544 frames as sent, plus the routing id */

/* Receive one whole multipart message (ZeroMQ delivers all parts or none). */
static int recv_message(void *sock, zmq_msg_t **parts_out, uint32_t *n_out, bool *truncated)
{
    uint32_t cap = 8, n = 0;
    zmq_msg_t *parts = kvt_xmalloc(cap * sizeof(zmq_msg_t));
    *truncated = false;
    for (;;) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, sock, n == 0 ? ZMQ_DONTWAIT : 0) < 0) {
            int e = errno;
            zmq_msg_close(&m);
            if (n == 0) {
                free(parts);
                return -e;
            }
            break;
        }
        bool more = zmq_msg_more(&m);
        if (n < MAX_PARTS) {
            if (n == cap) {
                cap *= 2;
                parts = kvt_xrealloc(parts, cap * sizeof(zmq_msg_t));
            }
            memcpy(&parts[n++], &m, sizeof(m)); /* moves ownership */
        } else {
            *truncated = true;
            zmq_msg_close(&m);
        }
        if (!more)
            break;
    }
    *parts_out = parts;
    *n_out = n;
    return 0;
}

static void close_parts(zmq_msg_t *parts, uint32_t from, uint32_t n)
{
    for (uint32_t i = from; i < n; i++)
        zmq_msg_close(&parts[i]);
}

/* ------------------------------------------------ per-connection order */

/*
 * Requests of one connection take effect in the order sent and are answered
 * in that order: a connection's next request is dispatched only once the
 * reply to its previous one was sent (kvt_reply_send), whether that request
 * was answered inline, on a worker, by the prefetch thread or by a flush.
 * Other connections are not held up. A connection has an entry here only
 * while it has a request in flight or queued.
 */

static uint32_t order_hash(const void *id, size_t len)
{
    const uint8_t *p = id;
    uint32_t h = 2166136261u; /* FNV-1a */
    for (size_t i = 0; i < len; i++)
        h = (h ^ p[i]) * 16777619u;
    return h % KVT_ORDER_BUCKETS;
}

static struct conn_order **order_slot(struct kvt_server *s, const void *id, size_t len)
{
    struct conn_order **pp = &s->order[order_hash(id, len)];
    while (*pp && !((*pp)->idlen == len && memcmp((*pp)->id, id, len) == 0))
        pp = &(*pp)->hnext;
    return pp;
}

static void order_ready(struct kvt_server *s, struct conn_order *c)
{
    if (c->on_ready)
        return;
    c->on_ready = true;
    c->rnext = NULL;
    if (s->ready_tail)
        s->ready_tail->rnext = c;
    else
        s->ready_head = c;
    s->ready_tail = c;
}

/* Drop an entry with nothing in flight, queued or on the ready list. */
static void order_release(struct kvt_server *s, struct conn_order *c)
{
    if (c->busy || c->qh || c->on_ready || c == s->dispatching)
        return;
    struct conn_order **pp = order_slot(s, c->id, c->idlen);
    *pp = c->hnext;
    free(c);
}

static void order_done(struct kvt_server *s, const zmq_msg_t *ident)
{
    size_t len = zmq_msg_size((zmq_msg_t *)ident);
    struct conn_order *c = *order_slot(s, zmq_msg_data((zmq_msg_t *)ident), len);
    if (!c)
        return; /* not a dispatched request's reply (shutdown) */
    c->busy = false;
    if (c->qh)
        order_ready(s, c);
    else
        order_release(s, c);
}

void kvt_dispatch_message(struct kvt_server *s, zmq_msg_t *parts, uint32_t n, bool truncated)
{
    size_t len = zmq_msg_size(&parts[0]);
    const void *id = zmq_msg_data(&parts[0]);
    struct conn_order **pp = order_slot(s, id, len);
    struct conn_order *c = *pp;
    if (!c) {
        c = kvt_xcalloc(1, sizeof(*c) + len);
        c->idlen = (uint32_t)len;
        memcpy(c->id, id, len);
        *pp = c;
    }
    struct pending_msg *m = kvt_xmalloc(sizeof(*m));
    *m = (struct pending_msg){.parts = parts, .n = n, .truncated = truncated};
    if (c->qt)
        c->qt->next = m;
    else
        c->qh = m;
    c->qt = m;
    if (!c->busy)
        order_ready(s, c);
}

static void handle_message(struct kvt_server *s, zmq_msg_t *parts, uint32_t n, bool truncated);

void kvt_run_ready(struct kvt_server *s)
{
    while (s->ready_head) {
        struct conn_order *c = s->ready_head;
        s->ready_head = c->rnext;
        if (!s->ready_head)
            s->ready_tail = NULL;
        c->on_ready = false;
        if (c->busy || !c->qh) {
            order_release(s, c);
            continue;
        }
        struct pending_msg *m = c->qh;
        c->qh = m->next;
        if (!c->qh)
            c->qt = NULL;
        c->busy = true;
        s->dispatching = c; /* an inline reply must not free c under us */
        handle_message(s, m->parts, m->n, m->truncated);
        s->dispatching = NULL;
        free(m->parts);
        free(m);
        if (!c->busy && c->qh)
            order_ready(s, c);
        else
            order_release(s, c);
    }
}

/* Shutdown: requests never dispatched get no reply (their clients' sockets
 * close with the server). */
static void order_drop_all(struct kvt_server *s)
{
    for (int b = 0; b < KVT_ORDER_BUCKETS; b++)
        while (s->order[b]) {
            struct conn_order *c = s->order[b];
            s->order[b] = c->hnext;
            while (c->qh) {
                struct pending_msg *m = c->qh;
                c->qh = m->next;
                close_parts(m->parts, 0, m->n);
                free(m->parts);
                free(m);
            }
            free(c);
        }
    s->ready_head = s->ready_tail = NULL;
}

static void handle_message(struct kvt_server *s, zmq_msg_t *parts, uint32_t n, bool truncated)
{
    uint64_t t0 = kvt_now_ns();
    /* parts[0] = routing id (ROUTER), [1] = request id, [2] = op, [3] = body */
    const void *rid = n > 1 ? zmq_msg_data(&parts[1]) : NULL;
    size_t rid_len = n > 1 ? zmq_msg_size(&parts[1]) : 0;
    enum kvt_op op = n > 2 ? op_of(&parts[2]) : OP_UNKNOWN;
    struct reply *r = kvt_reply_new(&parts[0], rid, rid_len, op, t0);
    if (s->cfg->auth && n > 1) {
        /* the ZAP handler's user id: the table's generation and the key's
         * index; after a reload, the key's entry now (NULL: removed) */
        const char *uid = zmq_msg_gets(&parts[1], "User-Id");
        if (uid)
            r->who = kvt_auth_by_uid(kvt_server_auth(s), uid);
        else if (kvt_local_is_ident(&parts[0]))
            r->who = kvt_local_who(s, &parts[0]); /* bound by its ticket, or NULL */
    }
    /* n counts the routing id: a request is at least [id][op][body] */
    if (n < 4 || rid_len == 0 || rid_len > KVT_MAX_RID) {
        atomic_fetch_add(&s->bad_requests, 1);
        kvt_reply_error(r, KVT_E_BADREQ, "%s",
                        n < 4 ? "a request needs frames [request id][op][body]"
                              : "the request id must be 1..32 bytes");
        kvt_reply_send(s, r);
        close_parts(parts, 0, n);
        return;
    }
    if (truncated) {
        atomic_fetch_add(&s->bad_requests, 1);
        kvt_reply_error(r, KVT_E_BADREQ, "too many frames (max %u)", MAX_PARTS - 1);
        kvt_reply_send(s, r);
        close_parts(parts, 0, n);
        return;
    }
    if (op == OP_UNKNOWN) {
        atomic_fetch_add(&s->bad_requests, 1);
        size_t l = zmq_msg_size(&parts[2]);
        char name[65]; /* printed up to its first NUL; kvt_reply_error escapes non-UTF-8 */
        memcpy(name, zmq_msg_data(&parts[2]), KVT_MIN(l, 64));
        name[KVT_MIN(l, 64)] = 0;
        kvt_reply_error(r, KVT_E_BADOP, "unknown operation '%s'%s", name, l > 64 ? "..." : "");
        kvt_reply_send(s, r);
        close_parts(parts, 0, n);
        return;
    }
    struct request q = {.r = r};
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    const char *why = NULL;
    if (kvt_wire_body_decode(n > 3 ? zmq_msg_data(&parts[3]) : NULL,
                             n > 3 ? zmq_msg_size(&parts[3]) : 0, &up, &why)) {
        atomic_fetch_add(&s->bad_requests, 1);
        kvt_reply_error(r, KVT_E_BADREQ, "%s", why);
        kvt_reply_send(s, r);
        msgpack_unpacked_destroy(&up);
        close_parts(parts, 0, n);
        return;
    }
    q.body = up.data;
    q.frames = n > 4 ? &parts[4] : NULL;
    q.nframes = n > 4 ? n - 4 : 0;
    for (uint32_t i = 0; i < q.nframes; i++)
        atomic_fetch_add_explicit(&s->bytes_in, zmq_msg_size(&q.frames[i]), memory_order_relaxed);
    kvt_handle(s, op, &q);
    /* handlers that keep data frames move them out and zero q.nframes */
    msgpack_unpacked_destroy(&up);
    close_parts(parts, 0, KVT_MIN(n, 4));
    if (q.frames)
        close_parts(q.frames, 0, q.nframes);
}

static void drain_monitor(struct kvt_server *s);

struct kvt_auth *kvt_server_auth(struct kvt_server *s)
{
    return atomic_load_explicit(&s->auth_cur, memory_order_acquire);
}

/* SIGHUP (rpc thread): read the authorized-clients file again. A file that
 * does not load keeps the table in use (logged, counted); otherwise the new
 * one admits from the next handshake on, and requests of connections
 * admitted before get their key's new line, or E_DENIED if it went. */
static void reload_auth(struct kvt_server *s)
{
    struct kvt_server_cfg *c = s->cfg;
    if (!c->auth) {
        kvt_info("received SIGHUP: nothing to reload (no --auth-clients)");
        return;
    }
    struct kvt_auth *cur = kvt_server_auth(s), *fresh = NULL;
    char err[600];
    if (kvt_auth_load(c->auth_clients_file, &fresh, err, sizeof(err))) {
        atomic_fetch_add(&c->auth->reload_failures, 1);
        kvt_error("auth: SIGHUP: %s; the %u key(s) in use stay", err, cur->n);
        return;
    }
    uint32_t added, removed;
    kvt_auth_supersede(cur, fresh, &added, &removed);
    atomic_store_explicit(&s->auth_cur, fresh, memory_order_release); /* ZAP reads it too */
    atomic_fetch_add(&c->auth->reloads, 1);
    kvt_info("auth: SIGHUP: reloaded %s: %u key(s), %u added, %u removed (their connections "
             "get E_DENIED from now on)",
             c->auth_clients_file, fresh->n, added, removed);
}

static void rpc_loop(struct kvt_server *s)
{
    zmq_pollitem_t items[6] = {
        {.socket = s->sock, .events = ZMQ_POLLIN},     {.fd = s->reply_efd, .events = ZMQ_POLLIN},
        {.fd = s->progress_efd, .events = ZMQ_POLLIN}, {.fd = s->sig_fd, .events = ZMQ_POLLIN},
        {.fd = kvt_local_fd(s), .events = ZMQ_POLLIN}, {.socket = s->mon, .events = ZMQ_POLLIN},
    };
    int nitems = s->local ? 5 : 4;
    int mon_at = -1;
    if (s->mon) { /* authentication on: the monitor of CURVE handshakes */
        mon_at = nitems;
        items[mon_at] = items[5];
        nitems++;
    }
    /* the service manager's watchdog: WATCHDOG=1 from this loop at half the
     * period it asked for, so a wedged rpc thread gets the service restarted */
    uint64_t wd_ns = kvt_notify_watchdog_usec() * 1000 / 2;
    uint64_t wd_last = kvt_now_ns();
    long timeout_ms = wd_ns ? (long)(wd_ns / 1000000) + 1 : -1;
    while (!s->stop) {
        int n = zmq_poll(items, nitems, timeout_ms);
        if (wd_ns && kvt_now_ns() - wd_last >= wd_ns) {
            kvt_notify("WATCHDOG=1");
            wd_last = kvt_now_ns();
        }
        if (n < 0) {
            if (errno == EINTR)
                continue;
            kvt_error("rpc: zmq_poll: %s", kvt_strerror(-errno));
            break;
        }
        if (items[3].revents & ZMQ_POLLIN) {
            struct signalfd_siginfo si;
            bool got = read(s->sig_fd, &si, sizeof(si)) == sizeof(si);
            if (got && si.ssi_signo == SIGHUP) {
                reload_auth(s);
                continue;
            }
            if (got)
                kvt_info("received %s: stopping", strsignal((int)si.ssi_signo));
            s->stop = 1;
            break;
        }
        if (items[1].revents & ZMQ_POLLIN)
            drain_replies(s);
        if (items[2].revents & ZMQ_POLLIN) {
            uint64_t v;
            ssize_t rr = read(s->progress_efd, &v, sizeof(v));
            (void)rr;
            kvt_flush_progress(s);
        }
        if (s->local && (items[4].revents & ZMQ_POLLIN))
            kvt_local_poll(s);
        if (mon_at >= 0 && (items[mon_at].revents & ZMQ_POLLIN))
            drain_monitor(s);
        if (items[0].revents & ZMQ_POLLIN) {
            /* bounded batch per wake so replies from workers are not starved */
            for (int i = 0; i < 64; i++) {
                zmq_msg_t *parts = NULL;
                uint32_t np = 0;
                bool trunc = false;
                if (recv_message(s->sock, &parts, &np, &trunc))
                    break;
                kvt_dispatch_message(s, parts, np, trunc); /* takes parts */
            }
        }
        kvt_run_ready(s);
    }
}

/* ------------------------------------------------------------ setup */

static void read_boot_id(char *out, size_t cap)
{
    out[0] = 0;
    int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    ssize_t n = read(fd, out, cap - 1);
    close(fd);
    if (n > 0) {
        out[n] = 0;
        char *nl = strchr(out, '\n');
        if (nl)
            *nl = 0;
    }
}

static void shutdown_all(struct kvt_server *s)
{
    kvt_lmc_stop(s); /* its thread uses L1 and the controllers */
    if (s->http)
        kvt_http_stop(s);
    if (s->workers) {
        kvt_tpool_destroy(s->workers); /* finishes queued handler jobs */
        s->workers = NULL;
    }
    if (s->pc) {
        kvt_prefetch_ctrl_stop(s->pc);
        s->pc = NULL;
    }
    kvt_lmc_free(s); /* after the prefetch callbacks, before L1 goes */
    drain_replies(s);
    order_drop_all(s);
    if (s->sc) {
        uint64_t pend = kvt_store_ctrl_last_seq(s->sc) - kvt_store_ctrl_done_seq(s->sc);
        if (pend)
            kvt_info("draining %llu pending L2 store batch(es)", (unsigned long long)pend);
        kvt_store_ctrl_quiesce(s->sc);
        kvt_flush_progress(s); /* every parked flush, with its client's L2 failures */
        kvt_store_ctrl_stop(s->sc);
        s->sc = NULL;
    }
    if (s->l1)
        kvt_l1_set_pressure_hook(s->l1, NULL, NULL);
    if (s->ev_l1)
        kvt_evictor_stop(s->ev_l1);
    for (int i = 0; i < s->nl2; i++)
        if (s->ev_l2[i])
            kvt_evictor_stop(s->ev_l2[i]);
    kvt_local_stop(s); /* before L1 goes: queued replies hold references */
    if (s->sock) {
        int linger = 2000;
        zmq_setsockopt(s->sock, ZMQ_LINGER, &linger, sizeof(linger));
        zmq_close(s->sock);
    }
    if (s->mon) {
        zmq_close(s->mon);
    }
    if (s->zctx && s->zap) {
        zmq_ctx_shutdown(s->zctx); /* the ZAP thread's recv returns ETERM */
        kvt_zap_join(s->zap);
        s->zap = NULL;
    }
    /* after reloads the configuration must free the newest table: it links
     * the older ones, back to the first (the HTTP thread is gone by now) */
    if (s->cfg->auth && kvt_server_auth(s))
        s->cfg->auth = kvt_server_auth(s);
    if (s->zctx)
        zmq_ctx_term(s->zctx); /* waits for zero-copy frames to be released */
    for (int i = 0; i < s->nl2; i++)
        kvt_l2_close(s->l2s[i]), free(s->l2s[i]);
    kvt_l1_destroy(s->l1);
    g_l1 = NULL;
    close(s->reply_efd);
    close(s->progress_efd);
    if (s->sig_fd >= 0)
        close(s->sig_fd);
    pthread_mutex_destroy(&s->reply_lock);
}

/*
 * CURVE on the ROUTER socket (docs/security.md): the ZAP handler first
 * (without one libzmq would admit every key), then the server's key pair,
 * then a monitor that counts the handshakes that fail before ZAP is asked
 * (no key, a wrong server key).
 */
static int setup_curve(struct kvt_server *s)
{
    struct kvt_server_cfg *c = s->cfg;
    int one = 1;
    atomic_store_explicit(&s->auth_cur, c->auth, memory_order_release);
    int rc = kvt_zap_start(s->zctx, c->auth, &s->auth_cur, &s->zap);
    if (rc) {
        kvt_error("auth: cannot start the ZAP handler: %s", kvt_strerror(rc));
        return rc;
    }
    if (zmq_setsockopt(s->sock, ZMQ_CURVE_SERVER, &one, sizeof(one)) ||
        zmq_setsockopt(s->sock, ZMQ_CURVE_SECRETKEY, c->auth_secret, 40) ||
        zmq_setsockopt(s->sock, ZMQ_ZAP_DOMAIN, "kvtier", 6)) {
        rc = -errno;
        kvt_error("auth: cannot set up CURVE: %s", kvt_strerror(-errno));
        return rc;
    }
    if (zmq_socket_monitor(s->sock, "inproc://kvtier-monitor",
                           ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                               ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) == 0) {
        s->mon = zmq_socket(s->zctx, ZMQ_PAIR);
        if (s->mon && zmq_connect(s->mon, "inproc://kvtier-monitor") < 0) {
            zmq_close(s->mon);
            s->mon = NULL;
        }
    }
    return 0;
}

/* A monitor event: [u16 event, u32 value][endpoint]. */
static void drain_monitor(struct kvt_server *s)
{
    for (;;) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, s->mon, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            return;
        }
        bool more = zmq_msg_more(&m), event = zmq_msg_size(&m) >= 6;
        zmq_msg_close(&m);
        while (more) { /* the endpoint */
            zmq_msg_init(&m);
            if (zmq_msg_recv(&m, s->mon, 0) < 0)
                more = false;
            else
                more = zmq_msg_more(&m);
            zmq_msg_close(&m);
        }
        if (event)
            atomic_fetch_add(&s->cfg->auth->handshakes_failed, 1);
    }
}

static int start(struct kvt_server *s)
{
    struct kvt_server_cfg *c = s->cfg;
    char err[1024];
    int rc;
    s->start_ns = kvt_now_ns();
    read_boot_id(s->boot_id, sizeof(s->boot_id));
    pthread_mutex_init(&s->reply_lock, NULL);
    s->reply_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    s->progress_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);

    /* signals: blocked in every thread, read by the rpc loop */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP); /* reload the authorized-clients file */
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    s->sig_fd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
    signal(SIGPIPE, SIG_IGN);

    /* listeners before storage: a port in use fails here, before any
     * adapter has locked, scanned or changed its directory */
    s->zctx = zmq_ctx_new();
    /* before the first socket: ZeroMQ starts its I/O threads with it */
    zmq_ctx_set(s->zctx, ZMQ_IO_THREADS, kvt_server_io_threads(c));
    s->sock = zmq_socket(s->zctx, ZMQ_ROUTER);
    /* a frame is a data frame (<= max_object_bytes) or a body (<= 16 MiB,
     * enough for a full batch of 65,536 keys): a smaller --max-object-mb
     * must not make ZeroMQ drop a valid batch without a reply */
    int64_t maxmsg = (int64_t)KVT_MAX(c->max_object_bytes, KVT_MAX_BODY) + (1 << 20);
    int zero = 0;
    zmq_setsockopt(s->sock, ZMQ_MAXMSGSIZE, &maxmsg, sizeof(maxmsg));
    zmq_setsockopt(s->sock, ZMQ_SNDHWM, &zero, sizeof(zero));
    if (c->auth) {
        rc = setup_curve(s);
        if (rc)
            return rc;
    }
    if (zmq_bind(s->sock, c->bind) < 0) {
        int e = errno;
        kvt_error("cannot listen on %s: %s%s", c->bind, kvt_strerror(-e),
                  e == EADDRINUSE ? " (another server there? nothing was opened or changed)" : "");
        return -e;
    }
    if (c->lmc_port) { /* LMCache's port too: bound now, its thread starts last */
        rc = kvt_lmc_listen(s, err, sizeof(err));
        if (rc) {
            kvt_error("%s", err);
            return rc;
        }
    }
    if (c->http_port) { /* answers 503 "starting" until s->ready */
        rc = kvt_http_start(s, err, sizeof(err));
        if (rc) {
            kvt_error("http: %s", err);
            return rc;
        }
    }
    for (int i = 0; i < c->nadapters; i++) {
        rc = kvt_l2_open(&c->adapters[i], &s->l2s[i], err, sizeof(err));
        if (rc) {
            kvt_error("%s", err);
            return rc;
        }
        s->nl2 = i + 1;
    }
    struct kvt_l1_opts lo = {
        .size_bytes = (uint64_t)(c->l1_size_gb * KVT_GIB),
        .init_bytes = (uint64_t)(c->l1_init_size_gb * KVT_GIB),
        .lazy = c->l1_lazy,
        .hugepages = c->l1_hugepages,
        .align = c->l1_align,
        .write_ttl_ns = (uint64_t)(c->l1_write_ttl_s * 1e9),
        .read_ttl_ns = (uint64_t)(c->l1_read_ttl_s * 1e9),
        .policy = c->eviction_policy,
        .watermark = c->eviction_watermark,
        .ratio = c->eviction_ratio,
        /* LMCache workers open the pool by name (docs/lmcache-protocol.md) */
        .shm_name = c->lmc_port ? c->lmc_shm_name : NULL,
    };
    rc = kvt_l1_create(&lo, &s->l1, err, sizeof(err));
    if (rc) {
        kvt_error("L1: %s", err);
        return rc;
    }
    g_l1 = s->l1;
    rc = kvt_store_ctrl_start(&s->sc, s->l1, s->l2s, s->nl2, c->store_policy, on_store_progress, s);
    if (!rc)
        rc = kvt_prefetch_ctrl_start(&s->pc, s->l1, s->l2s, s->nl2, c->prefetch_policy,
                                     c->prefetch_max_in_flight);
    if (!rc)
        rc = kvt_evictor_start_l1(&s->ev_l1, s->l1, c->eviction_interval_ms);
    if (!rc)
        kvt_l1_set_pressure_hook(s->l1, kick_l1, s->ev_l1);
    for (int i = 0; !rc && i < s->nl2; i++)
        rc = kvt_evictor_start_l2(&s->ev_l2[i], s->l2s[i], c->eviction_interval_ms);
    if (!rc)
        rc = kvt_tpool_create(&s->workers, "rpc-worker", c->max_workers, NULL, NULL, NULL);
    if (rc) {
        kvt_error("cannot start server threads: %s", kvt_strerror(rc));
        return rc;
    }
    if (c->local && c->shm) {
        rc = kvt_local_start(s, err, sizeof(err));
        if (rc) /* not fatal: clients use ZeroMQ */
            kvt_warn("%s: same-host clients will use %s", err, c->bind);
        rc = 0;
    }
    if (c->lmc_port) { /* bound above; requests are served from now on */
        rc = kvt_lmc_start(s, err, sizeof(err));
        if (rc) {
            kvt_error("%s", err);
            return rc;
        }
    }
    /* release: the HTTP thread reads the components set up above */
    atomic_store_explicit(&s->ready, true, memory_order_release);
    return 0;
}

static void banner(struct kvt_server *s)
{
    struct kvt_server_cfg *c = s->cfg;
    struct kvt_l1_shm shm;
    kvt_l1_shm(s->l1, &shm);
    kvt_info("kvtier %s listening on %s (pid %d)", KVT_VERSION, c->bind, (int)getpid());
    if (c->auth)
        kvt_info("auth: CURVE on %s, %u authorized client key(s) from %s; server public key %s; "
                 "same-host socket %s",
                 c->bind, c->auth->n, c->auth_clients_file, c->auth_public,
                 s->local ? "on, each connection bound to a key by a ticket from a hello "
                            "over CURVE"
                          : "off");
    if (c->insecure_no_auth)
        kvt_warn("--insecure-no-auth: %s%s%s",
                 c->auth ? ""
                         : "any process that reaches "
                           "the RPC port can read, overwrite and delete every tenant's cache",
                 c->auth ? "" : "; ",
                 c->http_token[0] ? ""
                                  : "/status and /metrics are open to anyone who reaches them");
    if (c->http_port)
        kvt_info("http: http://%s:%d/healthz /status /metrics", c->http_host, c->http_port);
    char l1size[32];
    kvt_human(l1size, sizeof(l1size), (double)shm.map_size);
    kvt_info("L1: %s shared memory (%s, align %u, policy %s)%s", l1size,
             c->l1_lazy ? "lazy" : "preallocated", c->l1_align, c->eviction_policy,
             c->shm ? "; zero-copy path offered to local clients" : "");
    if (c->l1_fit_checked && c->l1_fit.verdict == KVT_L1_FIT_WARN)
        kvt_warn("L1: %s", c->l1_fit.msg);
    if (s->local)
        kvt_info("same-host clients: unix socket %s", kvt_local_name(s));
    if (s->lmc)
        kvt_info("LMCache protocol (lmcache 0.5.6, engine_driven) on %s; L1 pool /dev/shm/%s",
                 kvt_lmc_endpoint(s), c->lmc_shm_name);
    /* where each adapter keeps its objects, under the name its status uses */
    static const char *const where_keys[] = {"base_path", "file_path", "device_path", "endpoint",
                                             "endpoint_url"};
    for (int i = 0; i < s->nl2; i++) {
        json_t *st = kvt_l2_status(s->l2s[i]);
        const char *where = NULL;
        for (size_t k = 0; !where && k < sizeof(where_keys) / sizeof(where_keys[0]); k++)
            where = json_string_value(json_object_get(st, where_keys[k]));
        kvt_info("L2 #%d: %s%s%s%s", i, kvt_l2_type(s->l2s[i]), where ? " at " : "",
                 where ? where : "", c->default_adapter ? " (embedded default)" : "");
        json_decref(st);
    }
}

int kvt_server_run(struct kvt_server_cfg *cfg)
{
    kvt_log_set_level(cfg->log_level);
    kvt_log_set_format(cfg->log_format);
    struct kvt_server *s = kvt_xcalloc(1, sizeof(*s));
    s->cfg = cfg;
    s->sig_fd = -1;
    int rc = start(s);
    if (rc == 0) {
        banner(s);
        /* listeners bound, adapters open with their recovery scans started:
         * the service manager may start what depends on the cache */
        char msg[400];
        snprintf(msg, sizeof(msg), "READY=1\nSTATUS=listening on %s\nMAINPID=%d", cfg->bind,
                 (int)getpid());
        int nrc = kvt_notify(msg);
        if (nrc)
            kvt_warn("NOTIFY_SOCKET: %s", kvt_strerror(nrc));
        rpc_loop(s);
        kvt_notify("STOPPING=1");
    }
    shutdown_all(s);
    free(s);
    if (rc == 0)
        kvt_info("stopped");
    return rc == 0 ? 0 : 1;
}
