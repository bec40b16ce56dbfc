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

static struct kvt_l1 *g_l1; /* for ZeroMQ free callbacks of zero-copy frames */

/* ------------------------------------------------------------ replies */

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
    struct op_stats *st = &s->native->ops[r->op];
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

static void on_store_progress(void *arg)
{
    struct kvt_server *s = arg;
    uint64_t one = 1;
    ssize_t w = write(s->progress_efd, &one, sizeof(one));
    (void)w;
}

/* ------------------------------------------------------------ receive */

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
        if (n < KVT_NATIVE_MAX_PARTS) {
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
        kvt_native_handle(s->native, m->parts, m->n, m->truncated);
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
            kvt_flush_progress(s->native);
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
    kvt_fronts_stop(s); /* their threads use the core */
    if (s->http)
        kvt_http_stop(s);
    kvt_admin_close(s->admin); /* its job ends; its pins go before the tiers stop */
    s->admin = NULL;
    if (s->core)
        kvt_core_stop_fetching(s->core); /* handler jobs finish; no prefetch callback after */
    kvt_fronts_free(s);                  /* after the prefetch callbacks, before L1 goes */
    drain_replies(s);
    order_drop_all(s);
    if (s->core && s->native) {
        kvt_core_drain_stores(s->core);
        kvt_flush_progress(s->native); /* every parked flush, with its client's L2 failures */
    }
    if (s->core)
        kvt_core_stop(s->core);
    kvt_evpub_stop(s->evpub); /* after the last eviction: then AllBlocksCleared */
    kvt_local_stop(s);        /* before L1 goes: queued replies hold references */
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
    kvt_core_close(s->core);
    s->core = NULL;
    kvt_evpub_free(s->evpub);
    s->evpub = NULL;
    g_l1 = NULL;
    kvt_native_free(s->native);
    s->native = NULL;
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
    /* what every front end may read (the core comes once it runs) */
    s->env = (struct kvt_front_env){
        .chunk_size = c->chunk_size,
        .max_object_bytes = c->max_object_bytes,
        .shm = c->shm,
        .read_ttl_s = c->l1_read_ttl_s,
        .write_ttl_s = c->l1_write_ttl_s,
        .auth = c->auth,
        .auth_cur = &s->auth_cur,
        .auth_clients_file = c->auth_clients_file,
    };
    s->native = kvt_native_new(&s->env, s, s->boot_id);
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
    /* the other front ends' ports too: bound now, their threads start last */
    rc = kvt_fronts_listen(s, err, sizeof(err));
    if (rc) {
        kvt_error("%s", err);
        return rc;
    }
    /* the events queue exists before the adapters open: their start-up
     * scans announce what they find into it */
    rc = kvt_evpub_listen(&c->events, &s->evpub, err, sizeof(err));
    if (rc) {
        kvt_error("%s", err);
        return rc;
    }
    s->env.events = kvt_evpub_queue(s->evpub); /* the LMCache front end's event stream */
    if (c->http_port) {                        /* answers 503 "starting" until s->ready */
        rc = kvt_http_start(s, err, sizeof(err));
        if (rc) {
            kvt_error("http: %s", err);
            return rc;
        }
    }
    /* with events on, the adapters' scans read the engine block hashes
     * their objects were written with (docs/events.md) */
    for (int i = 0; i < c->nadapters; i++)
        c->adapters[i].keep_tags = s->evpub != NULL;
    s->core_opts = (struct kvt_core_opts){
        .adapters = c->adapters,
        .nadapters = c->nadapters,
        .l1 =
            {
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
                .shm_name = c->lmc.port ? c->lmc.shm_name : NULL,
            },
        .store_policy = c->store_policy,
        .prefetch_policy = c->prefetch_policy,
        .prefetch_max_in_flight = c->prefetch_max_in_flight,
        .eviction_interval_ms = c->eviction_interval_ms,
        .max_workers = c->max_workers,
        .on_store_progress = on_store_progress,
        .progress_arg = s,
        .events = kvt_evpub_queue(s->evpub),
    };
    rc = kvt_core_open(&s->core_opts, &s->core, err, sizeof(err));
    s->env.core = s->core; /* also after a failed start: shutdown goes through it */
    if (!rc)
        rc = kvt_core_start(s->core, err, sizeof(err));
    if (rc) {
        kvt_error("%s", err);
        return rc;
    }
    g_l1 = kvt_core_l1(s->core);
    if (s->evpub && (rc = kvt_evpub_start(s->evpub, s->core, c->chunk_size, err, sizeof(err)))) {
        kvt_error("%s", err);
        return rc;
    }
    if (c->local && c->shm) {
        rc = kvt_local_start(s, err, sizeof(err));
        if (rc) /* not fatal: clients use ZeroMQ */
            kvt_warn("%s: same-host clients will use %s", err, c->bind);
        rc = 0;
    }
    struct kvt_admin_opts ao = {.max_pinned_bytes = (uint64_t)c->max_pinned_mb << 20};
    for (int i = 0; i < c->nadapters; i++)
        ao.quotas_files[i] = c->adapters[i].quotas_file;
    rc = kvt_admin_open(s->core, &ao, &s->admin);
    if (rc) {
        kvt_error("cannot start the admin thread: %s", kvt_strerror(rc));
        return rc;
    }
    rc = kvt_fronts_start(s, err, sizeof(err)); /* requests are served from now on */
    if (rc) {
        kvt_error("%s", err);
        return rc;
    }
    /* release: the HTTP thread reads the components set up above */
    atomic_store_explicit(&s->ready, true, memory_order_release);
    return 0;
}

static void banner(struct kvt_server *s)
{
    struct kvt_server_cfg *c = s->cfg;
    struct kvt_l1_shm shm;
    kvt_core_shm(s->core, &shm);
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
    kvt_fronts_banner(s);
    if (s->evpub) {
        char media[600] = "";
        for (int t = 0; t <= kvt_core_nl2(s->core); t++) {
            size_t l = strlen(media);
            snprintf(media + l, sizeof(media) - l, "%s", t ? ", " : "");
            l = strlen(media);
            kvt_evpub_medium(s->core, t, media + l, sizeof(media) - l);
        }
        kvt_info("kv events: PUB %s%s%s, topic '%s', media %s", c->events.endpoint,
                 c->events.replay[0] ? ", replay " : "", c->events.replay, c->events.topic, media);
    }
    /* where each adapter keeps its objects, under the name its status uses */
    static const char *const where_keys[] = {"base_path", "file_path", "device_path", "endpoint",
                                             "endpoint_url"};
    for (int i = 0; i < kvt_core_nl2(s->core); i++) {
        kvt_l2 *l2 = kvt_core_l2(s->core, i);
        json_t *st = kvt_l2_status(l2);
        const char *where = NULL;
        for (size_t k = 0; !where && k < sizeof(where_keys) / sizeof(where_keys[0]); k++)
            where = json_string_value(json_object_get(st, where_keys[k]));
        kvt_info("L2 #%d: %s%s%s%s", i, kvt_l2_type(l2), where ? " at " : "", where ? where : "",
                 c->default_adapter ? " (embedded default)" : "");
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
