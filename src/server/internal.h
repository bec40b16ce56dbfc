/*
 * Server internals shared by server.c (setup, rpc loop), handlers.c (ops),
 * status.c (status/metrics) and http.c. Not a public header.
 *
 * Threads (see docs/threads.md):
 *   rpc (main)   owns the ROUTER socket, decodes requests, runs fast
 *                handlers inline, sends every reply.
 *   rpc-worker   --max-workers threads: bulk copies of inline stores.
 *   store-ctrl, prefetch, evict-*, adapter I/O threads, http (libmicrohttpd).
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

#include "ctrl/prefetch_ctrl.h"
#include "ctrl/store_ctrl.h"
#include "evict/controller.h"
#include "io/tpool.h"
#include "l1/l1.h"
#include "l2/l2.h"
#include "proto/wire.h"
#include "server/config.h"

enum kvt_op {
    OP_HELLO,
    OP_PING,
    OP_STORE,
    OP_FLUSH,
    OP_LOOKUP,
    OP_RETRIEVE,
    OP_FREE_LOCKS,
    OP_PREPARE_STORE,
    OP_COMMIT_STORE,
    OP_PREPARE_RETRIEVE,
    OP_COMMIT_RETRIEVE,
    OP_STATUS,
    OP_DELETE,
    OP_PURGE,
    OP_UNKNOWN,
    OP_COUNT
};
extern const char *const kvt_op_names[OP_COUNT];

#define KVT_LAT_BUCKETS 16
extern const double kvt_lat_bounds[KVT_LAT_BUCKETS]; /* seconds; last = +Inf */

struct op_stats {
    _Atomic uint64_t count, errors, sum_ns;
    _Atomic uint64_t bucket[KVT_LAT_BUCKETS];
};

struct reply {
    struct reply *next;
    zmq_msg_t ident;
    uint8_t *rid; /* the request id as it came: rid_buf, or malloc'd when longer */
    uint8_t rid_buf[KVT_MAX_RID];
    size_t rid_len;
    int32_t status;
    msgpack_sbuffer body;
    msgpack_packer pk;
    uint32_t nframes;
    struct kvt_l1_ref *frames; /* data frames sent zero-copy from L1, one ref each */
    enum kvt_op op;
    uint64_t t0;
    struct kvt_auth_client *who; /* the request's key (authentication on), else NULL */
};

/* A flush parked in the store controller until its client's stores
 * finished (kvt_store_ctrl_flush_wait's cookie). */
struct flush_wait {
    uint64_t client; /* kvt_client_tag of the requester */
    struct reply *r;
};

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

struct kvt_server {
    struct kvt_server_cfg *cfg;
    void *zctx, *sock;
    struct kvt_l1 *l1;
    kvt_l2 *l2s[KVT_MAX_ADAPTERS];
    int nl2;
    struct kvt_store_ctrl *sc;
    struct kvt_prefetch_ctrl *pc;
    struct kvt_evictor *ev_l1, *ev_l2[KVT_MAX_ADAPTERS];
    struct kvt_tpool *workers;

    pthread_mutex_t reply_lock; /* guards rq_head/rq_tail */
    struct reply *rq_head, *rq_tail;
    int reply_efd, progress_efd, sig_fd;

    /* per-connection request order (server.c), rpc thread only */
    struct conn_order *order[KVT_ORDER_BUCKETS];
    struct conn_order *ready_head, *ready_tail, *dispatching;

    struct op_stats ops[OP_COUNT];
    _Atomic uint64_t bytes_in, bytes_out, bad_requests;
    _Atomic uint64_t local_bound;  /* auth on: same-host connections bound to a key by a ticket */
    _Atomic uint64_t local_denied; /* auth on: same-host hellos without a valid ticket */
    uint64_t start_ns;
    char boot_id[64];
    void *http;              /* struct MHD_Daemon */
    _Atomic bool ready;      /* start-up done: HTTP may read the components */
    struct kvt_local *local; /* same-host socket (local.c), rpc thread only */
    struct kvt_lmc *lmc;     /* LMCache protocol front end (lmc.c), or NULL */
    struct kvt_zap *zap;     /* ZAP handler thread (auth.c) with --auth-key, or NULL */
    /* the authorized-clients table in use (cfg->auth at start, a newer one
     * after each SIGHUP reload; older ones stay until exit): written by the
     * rpc thread, read by the ZAP and status threads */
    struct kvt_auth *_Atomic auth_cur;
    void *mon; /* PAIR socket: the ROUTER's handshake failures (rpc thread) */
    volatile int stop;
};

/* replies (server.c) */
struct reply *kvt_reply_new(const zmq_msg_t *ident, const void *rid, size_t rid_len, enum kvt_op op,
                            uint64_t t0);
/* Turn r into an error reply (status + {code, error, message}). */
void kvt_reply_error(struct reply *r, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Send now (rpc thread only) or queue for the rpc thread (any thread). */
void kvt_reply_send(struct kvt_server *s, struct reply *r);
void kvt_reply_post(struct kvt_server *s, struct reply *r);
void kvt_reply_free(struct reply *r);

/* server.c: one whole message (parts[0] = routing id), from ZeroMQ or local.
 * Queued behind the connection's earlier requests; takes the parts and the
 * parts array (malloc'd). Dispatched by kvt_run_ready (rpc loop). */
void kvt_dispatch_message(struct kvt_server *s, zmq_msg_t *parts, uint32_t n, bool truncated);
void kvt_run_ready(struct kvt_server *s);

/* local.c: the same-host transport */
struct kvt_local;
int kvt_local_start(struct kvt_server *s, char *err, size_t cap);
void kvt_local_stop(struct kvt_server *s);
int kvt_local_fd(struct kvt_server *s);
const char *kvt_local_name(struct kvt_server *s);
void kvt_local_poll(struct kvt_server *s);
bool kvt_local_is_ident(const zmq_msg_t *ident);
void kvt_local_send(struct kvt_server *s, struct reply *r, char *body, size_t blen);
uint32_t kvt_local_conns(struct kvt_server *s);
/* Authentication on (local.c): a single-use ticket for who, handed out in
 * a hello over CURVE; the key a same-host connection's ticket bound (NULL:
 * none yet); redeem binds the connection to the ticket's key (NULL:
 * unknown, used or expired). All on the rpc thread. */
#define KVT_LOCAL_TICKET_BYTES 32
struct kvt_auth_client;
int kvt_local_ticket(struct kvt_server *s, struct kvt_auth_client *who,
                     uint8_t out[KVT_LOCAL_TICKET_BYTES]);
struct kvt_auth_client *kvt_local_who(struct kvt_server *s, const zmq_msg_t *ident);
struct kvt_auth_client *kvt_local_redeem(struct kvt_server *s, const zmq_msg_t *ident,
                                         const void *ticket, size_t len);

/* server.c: the authorized-clients table in use (NULL without auth) */
struct kvt_auth *kvt_server_auth(struct kvt_server *s);

/* handlers.c: with authentication on, may r's key use these keys' salts
 * (write: store or delete)? Otherwise r becomes an E_DENIED reply, counted
 * for the key. Always true without authentication. */
bool kvt_auth_allows(struct kvt_server *s, struct reply *r, const kvt_key *keys, uint32_t n,
                     bool write);

/* lmc.c: LMCache's multi-process protocol on --lmcache-port, own thread.
 * listen: with the other listeners, before storage opens; start: when
 * everything it uses exists. stop: before the worker pool, controllers and
 * L1 go (joins the thread);
 * free: after the prefetch controller stopped, before L1 is destroyed. */
struct kvt_lmc;
int kvt_lmc_listen(struct kvt_server *s, char *err, size_t cap); /* bind, early */
int kvt_lmc_start(struct kvt_server *s, char *err, size_t cap);  /* its thread, last */
void kvt_lmc_stop(struct kvt_server *s);
void kvt_lmc_free(struct kvt_server *s);
const char *kvt_lmc_endpoint(struct kvt_server *s);
json_t *kvt_lmc_status(struct kvt_server *s);

/* a decoded request (handlers.c) */
struct request {
    struct reply *r; /* pre-built reply carrying ident and rid */
    msgpack_object body;
    zmq_msg_t *frames; /* data frames */
    uint32_t nframes;
};
void kvt_handle(struct kvt_server *s, enum kvt_op op, struct request *q);
void kvt_flush_progress(struct kvt_server *s);
/* A nonzero tag naming the connection a request came from (its routing id). */
uint64_t kvt_client_tag(const struct reply *r);

/* status.c */
json_t *kvt_server_status(struct kvt_server *s);
/* true if healthy; otherwise fills why with the failing parts */
bool kvt_server_health(struct kvt_server *s, char *why, size_t cap);
char *kvt_server_metrics(struct kvt_server *s, size_t *len);

/* http.c */
int kvt_http_start(struct kvt_server *s, char *err, size_t cap);
void kvt_http_stop(struct kvt_server *s);

#endif
