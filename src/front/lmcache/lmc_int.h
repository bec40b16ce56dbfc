/*
 * Private to the LMCache front end: its state (lmc.c: the loop, requests
 * and replies, sessions, contexts, transfers, keys) and what its handlers
 * (lmc_handlers.c: one function per operation) share with it.
 */
#ifndef KVT_FRONT_LMC_INT_H
#define KVT_FRONT_LMC_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#include <msgpack.h>
#include <zmq.h>

#include "core/core.h"
#include "front/lmcache/lmc.h"
#include "key/key.h"
#include "proto/lmc_wire.h"
#include "proto/wire.h"
#include "server/auth.h"

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
    uint32_t *hs;      /* chunk-major: hs[c * nr + r] */
    uint16_t *readers; /* reads still expected per handle; 0 = reference dropped */
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

/* A subscribe_kv_events stream (lmc_events.c): one per worker instance;
 * a batch is sent when it has credit (the first at once, then one per
 * "ack" from the client). */
struct lmc_sub {
    struct lmc_sub *next;
    int64_t instance_id;
    zmq_msg_t ident;
    uint8_t uid[MAX_FRAME_ECHO], op[MAX_FRAME_ECHO];
    size_t uid_len, op_len;
    char model[KVT_MODEL_MAX + 1];
    uint64_t cursor;
    uint32_t max_events;
    bool credit, first;
};

struct kvt_lmc {
    const struct kvt_front_env *env; /* the server's facts and the core */
    const struct kvt_lmc_cfg *cfg;   /* its flags */
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
    /* with --auth-key (docs/security.md): the ZAP handler of zctx, and the
     * client (--lmcache-client) of the table in use, looked up again when
     * the table changes (this thread only) */
    struct kvt_zap *zap;
    struct kvt_auth *who_tab;
    struct kvt_auth_client *who;
    _Atomic uint64_t denied;
    uint64_t denied_log_ns;
    struct lmc_sub *subs; /* event streams (this thread) */
    uint32_t nsubs;
    uint64_t incarnation; /* this server's start (ns since the epoch): a stream's restart */
    _Atomic uint64_t event_batches, nsubs_seen; /* batches sent; streams open (for status) */
    bool ipc_file; /* the endpoint is a socket file (created 0600, removed at stop) */
    dev_t ipc_dev; /* that file, as bound: only it is removed */
    ino_t ipc_ino;
};

struct lmc_rq {
    struct kvt_lmc *m;
    zmq_msg_t *parts;
    uint32_t n;
    enum lmc_op op;
    msgpack_unpacked args[MAX_ARGS];
    uint32_t nargs;
    bool done;
};

/* helpers for a reply body */
struct body {
    msgpack_sbuffer sb;
    msgpack_packer pk;
};

const void *lmc_frame(struct lmc_rq *q, uint32_t i, size_t *len);
void lmc_reply(struct lmc_rq *q, const msgpack_sbuffer *body);
void lmc_reply_err(struct lmc_rq *q, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
struct lmc_rep *lmc_rep_save(struct lmc_rq *q, uint64_t deadline);
void lmc_body_init(struct body *b);
void lmc_reply_body(struct lmc_rq *q, struct body *b);
void lmc_reply_int(struct lmc_rq *q, int64_t v);
void lmc_reply_bool(struct lmc_rq *q, bool v);
const msgpack_object *lmc_arg(struct lmc_rq *q, uint32_t i);
struct lmc_ctx *lmc_ctx_find(struct kvt_lmc *m, int64_t id);
struct lmc_sess *lmc_sess_find(struct kvt_lmc *m, const char *rid, size_t n);
struct lmc_sess *lmc_sess_get(struct kvt_lmc *m, const char *rid, size_t n);
void lmc_sess_release(struct kvt_lmc *m, struct lmc_sess *x);
void lmc_answer_waiters(struct kvt_lmc *m, struct lmc_sess *x);
void lmc_sess_remove(struct kvt_lmc *m, struct lmc_sess *x);
struct lmc_xfer *lmc_xfer_find(struct kvt_lmc *m, const uint8_t id[32], bool write,
                               struct lmc_xfer ***pprev);
struct kvt_l1_owner lmc_inst_owner(const int64_t *inst);

/* lmc_events.c: subscribe_kv_events (docs/lmcache-protocol.md) */
#define LMC_KV_EVENT_LOG 65536 /* L1 events kept for streams (LMCache's kv_event_log_size) */
void lmc_events_start(struct kvt_lmc *m);
bool lmc_events_on(const struct kvt_lmc *m);
void lmc_h_subscribe(struct lmc_rq *q);
/* [ident][uid][""][ack | cancel]: a stream's flow control */
void lmc_stream_control(struct kvt_lmc *m, zmq_msg_t *parts, uint32_t n);
/* Send what each stream with credit has to send (the loop, every wake). */
void lmc_events_service(struct kvt_lmc *m);
void lmc_events_drop_instance(struct kvt_lmc *m, int64_t inst);
void lmc_events_free(struct kvt_lmc *m);
void lmc_xfer_drop(struct kvt_lmc *m, struct lmc_xfer **pp);
int lmc_key_chunks(struct lmc_rq *q, const struct lmc_key *k, bool whole, uint32_t *c0,
                   uint32_t *c1, uint8_t **hashes);
int lmc_key_ns(struct lmc_rq *q, const struct lmc_key *k, uint32_t *ns);
int lmc_decode_key(struct lmc_rq *q, uint32_t i, struct lmc_key *k);
int lmc_decode_i64(struct lmc_rq *q, uint32_t i, const char *name, int64_t *v);
int lmc_decode_str(struct lmc_rq *q, uint32_t i, const char *name, const char **s, size_t *n);
void lmc_xfer_id(int64_t inst, const struct lmc_key *k, uint32_t ns, const uint8_t *last_hash,
                 uint8_t out[32]);
void lmc_pack_slot(msgpack_packer *pk, const struct lmc_ctx *c, uint64_t off);
void lmc_drain_fetches(struct kvt_lmc *m, bool discard);
void lmc_handle(struct kvt_lmc *m, zmq_msg_t *parts, uint32_t n);
/* With --auth-key: whether the request may use ns's salt (and store, if
 * write). Not: counted (per client too), logged, true, and the caller
 * serves it as a miss or as nothing to store (an error would fail vLLM's
 * step: a cache_salt is any API user's choice). Without auth: false. */
bool lmc_denied(struct lmc_rq *q, uint32_t ns, bool write);
/* Count a denial, for client c (if any) and for the port; the port's total. */
uint64_t lmc_count_denied(struct kvt_lmc *m, struct kvt_auth_client *c);
/* --lmcache-client's entry in the table in use, or NULL (removed). */
struct kvt_auth_client *lmc_who(struct kvt_lmc *m);

#endif
