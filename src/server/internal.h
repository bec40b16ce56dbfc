/*
 * Server internals shared by server.c (set-up, the rpc loop, replies),
 * fronts.c (the front-end table), local.c (the same-host socket),
 * status.c (status, health, metrics), http.c and admin_http.c. Not a
 * public header.
 *
 * Threads (see docs/threads.md):
 *   rpc (main)   owns the ROUTER socket and the same-host socket, hands
 *                each request to kvtier's protocol front end
 *                (front/native), sends every reply.
 *   the core's threads (rpc-worker, store-ctrl, prefetch, evict-*), the
 *   adapters' I/O threads, each front end's own (lmcache), http
 *   (libmicrohttpd).
 * Replies produced off the rpc thread go through srv->reply queue
 * (reply_lock) and reply_efd; the rpc thread sends them.
 */
#ifndef KVT_SERVER_INTERNAL_H
#define KVT_SERVER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include <msgpack.h>
#include <zmq.h>

#include "core/admin.h"
#include "core/core.h"
#include "front/front.h"
#include "front/native/native.h"
#include "proto/wire.h"
#include "server/config.h"

/* One connection (ZeroMQ routing id or same-host socket) with a request in
 * flight or queued: its requests run one at a time, in arrival order. */
struct pending_msg {
    struct pending_msg *next;
    zmq_msg_t *parts; /* parts[0] = routing id */
    uint32_t n;
    bool truncated;
};
struct conn_order {
    struct conn_order *hnext, *rnext; /* ident hash chain; ready list */
    struct pending_msg *qh, *qt;
    bool busy;     /* a request was dispatched and its reply is not sent yet */
    bool on_ready; /* on the ready list */
    uint32_t idlen;
    uint8_t id[];
};
#define KVT_ORDER_BUCKETS 1024

#define KVT_MAX_FRONTS 8

struct kvt_server {
    struct kvt_server_cfg *cfg;
    void *zctx, *sock;
    struct kvt_core_opts core_opts; /* what the core was set up with (it keeps a pointer) */
    struct kvt_core *core;          /* the tiers and their threads */
    struct kvt_front_env env;       /* what the front ends read */
    struct kvt_native *native;      /* kvtier's protocol (front/native) */
    void *fronts[KVT_MAX_FRONTS];   /* each front end's state, in kvt_fronts order (NULL: off) */
    struct kvt_evpub *evpub;        /* the KV-events publisher (events.h), NULL: off */

    pthread_mutex_t reply_lock; /* guards rq_head/rq_tail */
    struct reply *rq_head, *rq_tail;
    int reply_efd, progress_efd, sig_fd;

    /* per-connection request order (server.c), rpc thread only */
    struct conn_order *order[KVT_ORDER_BUCKETS];
    struct conn_order *ready_head, *ready_tail, *dispatching;

    _Atomic uint64_t bytes_out;
    uint64_t start_ns;
    char boot_id[64];
    void *http;              /* struct MHD_Daemon */
    _Atomic bool ready;      /* start-up done: HTTP may read the components */
    struct kvt_local *local; /* same-host socket (local.c), rpc thread only */
    struct kvt_zap *zap;     /* ZAP handler thread (auth.c) with --auth-key, or NULL */
    /* the authorized-clients table in use (cfg->auth at start, a newer one
     * after each SIGHUP reload; older ones stay until exit): written by the
     * rpc thread, read by the ZAP and status threads and the front ends */
    struct kvt_auth *_Atomic auth_cur;
    void *mon;               /* PAIR socket: the ROUTER's handshake failures (rpc thread) */
    struct kvt_admin *admin; /* the admin calls (core/admin.h), once the core runs */
    _Atomic uint64_t admin_denied, admin_bad; /* admin requests refused: credential, input */
    volatile int stop;
};

/* The front ends with listeners of their own (fronts.c): one row each, its
 * descriptor and where its flags are in struct kvt_server_cfg. */
struct kvt_front {
    const struct kvt_front_desc *desc;
    size_t cfg_off;
};
extern const struct kvt_front kvt_fronts[];
extern const int kvt_nfronts;
/* Each step over every front end that is on, in table order (stop and
 * free: those that exist). listen and start: 0, or the first error with
 * err. status: each one's object under its name in o. */
int kvt_fronts_listen(struct kvt_server *s, char *err, size_t cap);
int kvt_fronts_start(struct kvt_server *s, char *err, size_t cap);
void kvt_fronts_stop(struct kvt_server *s);
void kvt_fronts_free(struct kvt_server *s);
void kvt_fronts_status(struct kvt_server *s, json_t *o);
void kvt_fronts_banner(struct kvt_server *s);

/* server.c: one whole message (parts[0] = routing id), from ZeroMQ or local.
 * Queued behind the connection's earlier requests; takes the parts and the
 * parts array (malloc'd). Dispatched by kvt_run_ready (rpc loop). */
void kvt_dispatch_message(struct kvt_server *s, zmq_msg_t *parts, uint32_t n, bool truncated);
void kvt_run_ready(struct kvt_server *s);

/* local.c: the same-host transport (the calls kvtier's protocol front end
 * makes are declared in front/native/native.h) */
struct kvt_local;
int kvt_local_start(struct kvt_server *s, char *err, size_t cap);
void kvt_local_stop(struct kvt_server *s);
int kvt_local_fd(struct kvt_server *s);
void kvt_local_poll(struct kvt_server *s);
void kvt_local_send(struct kvt_server *s, struct reply *r, char *body, size_t blen);
uint32_t kvt_local_conns(struct kvt_server *s);

/* server.c: the authorized-clients table in use (NULL without auth) */
struct kvt_auth *kvt_server_auth(struct kvt_server *s);

/* status.c (kvt_server_status is declared in front/native/native.h) */
/* true if healthy; otherwise fills why with the failing parts */
bool kvt_server_health(struct kvt_server *s, char *why, size_t cap);
char *kvt_server_metrics(struct kvt_server *s, size_t *len);

/* http.c */
int kvt_http_start(struct kvt_server *s, char *err, size_t cap);
void kvt_http_stop(struct kvt_server *s);

/* admin_http.c: a request under /admin (libmicrohttpd's access handler
 * arguments); kvt_admin_http_done frees what it kept in *con_cls. */
struct MHD_Connection;
int kvt_admin_http(struct kvt_server *s, struct MHD_Connection *c, const char *url,
                   const char *method, const char *upload, size_t *upload_size, void **con_cls);
void kvt_admin_http_done(void *con_cls);

#endif
