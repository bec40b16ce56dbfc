/*
 * kvtier's own protocol (docs/protocol.md): requests
 * [request id][op name][msgpack body][data frames...] decoded into calls of
 * the core, replies [request id][status][msgpack body][data frames...].
 *
 * The server's loop owns the sockets (the ROUTER socket, the same-host
 * socket), the per-connection order and the sending of replies; it hands
 * each whole message to kvt_native_handle and sends what the handlers
 * reply. The operations are one table (ops.c): a row names the operation,
 * its handler and its flags, and dispatch, the permission checks and the
 * per-operation counters all read it.
 *
 * Threads: the rpc thread runs kvt_native_handle and every handler; a
 * handler that blocks moves its work to the core's worker pool
 * (kvt_core_defer) and posts the reply from there. Each request ends with
 * exactly one reply.
 */
#ifndef KVT_FRONT_NATIVE_H
#define KVT_FRONT_NATIVE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>
#include <msgpack.h>
#include <zmq.h>

#include "core/core.h"
#include "front/front.h"
#include "proto/wire.h"
#include "server/auth.h"

struct kvt_native;
struct request;

/* ---- the operation table (ops.c) ---- */

enum {
    KVT_OPF_ADMIN = 1 << 0, /* with authentication on: admin keys only */
    KVT_OPF_WRITE = 1 << 1, /* stores or deletes: rw keys only (checked with its keys) */
    KVT_OPF_HELLO = 1 << 2, /* may come on a same-host connection before it has a key */
};

struct kvt_op {
    const char *name; /* the op frame, exactly */
    void (*proc)(struct kvt_native *n, struct request *q);
    unsigned flags; /* KVT_OPF_* */
};
/* Every operation, then one last row, "unknown" (proc NULL), under which
 * requests with an unknown or missing op are counted. */
extern const struct kvt_op kvt_ops[];
extern const uint32_t kvt_nops; /* rows, the "unknown" one included */

#define KVT_LAT_BUCKETS 16
extern const double kvt_lat_bounds[KVT_LAT_BUCKETS]; /* seconds; last = +Inf */

struct op_stats {
    _Atomic uint64_t count, errors, sum_ns;
    _Atomic uint64_t bucket[KVT_LAT_BUCKETS];
};

/* ---- replies and requests ---- */

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
    struct kvt_core *core;     /* whose references frames are */
    uint32_t op;               /* row of kvt_ops */
    uint64_t t0;
    struct kvt_auth_client *who; /* the request's key (authentication on), else NULL */
};

/* a decoded request */
struct request {
    struct reply *r; /* pre-built reply carrying ident and rid */
    msgpack_object body;
    zmq_msg_t *frames; /* data frames */
    uint32_t nframes;
};

struct reply *kvt_reply_new(struct kvt_native *n, const zmq_msg_t *ident, const void *rid,
                            size_t rid_len, uint32_t op, uint64_t t0);
/* Turn r into an error reply (status + {code, error, message}). */
void kvt_reply_error(struct reply *r, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void kvt_reply_free(struct reply *r);
/* A nonzero tag naming the connection a request came from (its routing id). */
uint64_t kvt_client_tag(const struct reply *r);

/* ---- the front end's state ---- */

struct kvt_native {
    const struct kvt_front_env *env;
    struct kvt_server *host; /* handed back in the host calls below */
    const char *boot_id;     /* this boot's id (hello) */
    struct op_stats *ops;    /* kvt_nops of them */
    _Atomic uint64_t bytes_in, bad_requests;
    _Atomic uint64_t local_bound;  /* auth on: same-host connections bound to a key by a ticket */
    _Atomic uint64_t local_denied; /* auth on: same-host hellos without a valid ticket */
};

/* Frames of one message at most, as sent (a full batch's data frames and
 * the rest), plus the routing id: beyond, the request is refused whole. */
#define KVT_NATIVE_MAX_PARTS (KVT_MAX_BATCH + 8 + 1)

struct kvt_native *kvt_native_new(const struct kvt_front_env *env, struct kvt_server *host,
                                  const char *boot_id);
void kvt_native_free(struct kvt_native *n);

/* One whole message (parts[0] = routing id) from the loop, on the rpc
 * thread: decode, dispatch, reply (now or later). truncated: more frames
 * came than a request may have. Frames are closed; parts stays the
 * caller's. */
void kvt_native_handle(struct kvt_native *n, zmq_msg_t *parts, uint32_t np, bool truncated);
/* Store batches finished (the loop's progress eventfd): answer the flushes
 * that were waiting for them. rpc thread. */
void kvt_flush_progress(struct kvt_native *n);

/* ---- host calls: defined by the server (src/server/) ---- */

/* Send now (rpc thread only) or queue for the rpc thread (any thread). */
void kvt_reply_send(struct kvt_server *s, struct reply *r);
void kvt_reply_post(struct kvt_server *s, struct reply *r);
/* The status document (the "status" operation, GET /status). */
json_t *kvt_server_status(struct kvt_server *s);
/* The same-host socket (local.c): whether a routing id is one of its
 * connections; its name (NULL: not offered). With authentication on, all
 * on the rpc thread: a single-use ticket for who, handed out in a hello
 * over CURVE; the key a same-host connection's ticket bound (NULL: none
 * yet); redeem binds the connection to the ticket's key (NULL: unknown,
 * used or expired). */
#define KVT_LOCAL_TICKET_BYTES 32
bool kvt_local_is_ident(const zmq_msg_t *ident);
const char *kvt_local_name(struct kvt_server *s);
int kvt_local_ticket(struct kvt_server *s, struct kvt_auth_client *who,
                     uint8_t out[KVT_LOCAL_TICKET_BYTES]);
struct kvt_auth_client *kvt_local_who(struct kvt_server *s, const zmq_msg_t *ident);
struct kvt_auth_client *kvt_local_redeem(struct kvt_server *s, const zmq_msg_t *ident,
                                         const void *ticket, size_t len);

#endif
