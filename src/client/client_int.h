/*
 * Private to src/client: the client handle and the transport the
 * operations (client_ops.c) run on (client.c: sockets, the same-host
 * socket, hello, open/close).
 */
#ifndef KVT_CLIENT_INT_H
#define KVT_CLIENT_INT_H

#include "kvtier/client.h"
#include "common/secret.h"

#include <msgpack.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <zmq.h>

/* Shared by the client's own files only: not exported by libkvtier_client. */
#define KVT_C_INTERNAL __attribute__((visibility("hidden")))

/* kvt_store through the pool sends a larger store as parts of about this
 * many bytes (client_ops.c: their L2 writes overlap the next part's copy). */
#define KVT_STORE_PART_BYTES (32u << 20)

struct kvt_client {
    void *ctx, *sock;
    char url[512];
    int timeout_ms;
    int connect_timeout_ms;      /* the hello of kvt_client_open */
    bool opening;                /* in kvt_client_open: probe for a listener */
    struct kvt_curve_keys curve; /* CURVE when curve.on (docs/security.md); never shown */
    void *mon; /* with CURVE: PAIR of sock's monitor, tells a refused key from silence */
    uint64_t next_rid;
    char err[512];
    int chunk_size;
    uint64_t max_object;
    /* shared memory */
    char *shm;
    uint64_t shm_size;
    uint64_t pool_id; /* the mapped pool's identity (hello "shm.pool") */
    bool want_shm, want_local;
    /* the same-host socket (hello "local"); -1 when not used */
    int lfd;
    uint8_t *lbuf;
    size_t lpos, llen;
    /* the lease of the last lookup and the keys it covers */
    uint64_t lease;
    size_t lease_n, lease_hash_len;
    uint8_t *lease_hashes;
    char *lease_model, *lease_salt;
    uint32_t lease_rank, lease_group;
    /* zero-copy sends in flight (freed by ZeroMQ's I/O thread) */
    pthread_mutex_t zc_lock;
    pthread_cond_t zc_cond;
    int zc_pending;
};

/* A decoded reply. */
struct rep {
    int32_t status;
    zmq_msg_t body; /* the decoded objects point into it */
    msgpack_unpacked up;
    zmq_msg_t *frames;
    uint32_t nframes;
};

KVT_C_INTERNAL void kvt_c_rep_free(struct rep *r);
/* An empty reply, ready to receive into (kvt_c_rep_free undoes it). */
KVT_C_INTERNAL void kvt_c_rep_init(struct rep *r);
/* Record the handle's last error (kvt_client_last_error); returns rc. */
KVT_C_INTERNAL int kvt_c_seterr(kvt_client *c, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* One request and its reply (ZeroMQ or the same-host socket). */
KVT_C_INTERNAL int kvt_c_call(kvt_client *c, const char *op, const msgpack_sbuffer *body,
                              const void *const *bufs, const size_t *lens, size_t nbufs,
                              struct rep *out);
/* A request without a reply. */
KVT_C_INTERNAL void kvt_c_cast(kvt_client *c, const char *op, const msgpack_sbuffer *body);
/* Drop the lease of the last lookup (its keys are no longer covered). */
KVT_C_INTERNAL void kvt_c_lease_forget(kvt_client *c);
/* The server's pool changed (a restart): map the new one. */
KVT_C_INTERNAL int kvt_c_shm_reattach(kvt_client *c);

#endif
