/*
 * Private to the resp adapter: resp.c (batches and jobs, submit, removal,
 * status, open and close), resp_pass.c (workers, pipelined passes on a
 * server or across cluster nodes), resp_store.c (SET passes), resp_load.c
 * (lookup and GET passes), resp_wire.c (connections and the RESP wire),
 * resp_mon.c (health, reconnects and scans), resp_cfg.c (configuration),
 * resp_cluster.c (Redis Cluster slots and redirects), resp_budget.c (the
 * shared budget record).
 */
#ifndef KVT_RESP_INT_H
#define KVT_RESP_INT_H

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/time.h>
#include <sys/uio.h>

#include <hiredis/hiredis.h>

#include "l2/engine.h"
#include "l2/kit/objfmt.h"

#define HDR KVT_OBJHDR_MIN           /* header bytes in front of every value */
#define RESP_SPLIT_BYTES (4u << 20)  /* spread batches above this over connections */
#define RBUF_CAP (1u << 20)          /* raw reply reader buffer */
#define OBUF_CAP (1u << 20)          /* command output buffer */
#define BACKOFF_MIN_NS 100000000ull  /* 0.1 s */
#define BACKOFF_MAX_NS 2000000000ull /* 2 s: a node back is found within this (plus a probe) */
#define PROBE_MAX_NS 500000000ull    /* a probe waits at most this (and request_timeout) */
#define CHECK_EVERY_NS 5000000000ull /* the monitor asks every node that is up this often */
#define F_LEN_KNOWN 0x80             /* index flags: logical length known */
#define F_GEN 0x7f                   /* index flags: scan generation */
#define KEY_MAX (KVT_NAME_MAX + 160)
#define CL_SLOTS 16384     /* Redis Cluster hash slots */
#define CL_MAX_NODES 64    /* cluster nodes ever seen (seeds + masters), append-only */
#define CL_NO_NODE 0xffff  /* slot owner not known */
#define CL_MAX_REDIRECTS 5 /* MOVED/ASK hops per key and batch */
#define CL_MAX_SEEDS 16
#define CL_REFRESH_GAP_NS 200000000ull /* at most 5 slot-map refreshes a second */
/* "read_from_replicas" while a master has no replica in the map (a new
 * cluster whose replicas the asked node has not heard of yet, a replica
 * lost): read the map again this often */
#define CL_REPLICA_POLL_NS 2000000000ull

/* One connection with its raw reply reader. Owned by one thread. */
struct conn {
    redisContext *c;
    unsigned epoch;       /* e->epoch when connected; older means stale */
    uint64_t deadline_ns; /* the request's deadline (monotonic): opening, writes and reads
                           * past it fail with -ETIMEDOUT; 0: the socket timeouts only */
    char *rbuf;           /* RBUF_CAP: replies are read through it */
    char *obuf;           /* OBUF_CAP: data commands are written through it */
    size_t rpos, rlen;
    bool used; /* has completed a command since it was opened */
    int node;  /* cluster mode: index in e->nodes to connect to (0: the first seed) */
};

/* A cluster node's address. Written once before nnodes counts it, never
 * changed after: readers copy it under maplock. */
struct cl_node {
    char host[256];
    int port;
};

enum { ROLE_NONE = 0, ROLE_MASTER, ROLE_REPLICA }; /* a node's part in the current slot map */

/* A cluster node's health (maplock). A node is marked down when a request
 * or a probe to it fails (refused, reset, or no answer before the deadline:
 * a stalled node); its keys then fail at once, without I/O, until a probe
 * of the monitor thread gets an answer. */
struct cl_health {
    uint64_t down_ns;    /* when it was marked down; 0: up */
    uint64_t downs;      /* times it was marked down */
    uint64_t backoff_ns; /* down: the wait before the next probe */
    uint64_t next_probe_ns;
    bool probing;    /* a probe is in flight */
    uint8_t role;    /* ROLE_*: in the current map */
    char err[200];   /* its last error; "" when none or since it answered again */
    double err_unix; /* wall-clock time of err */
    char run_id[48]; /* INFO server's run_id as last seen; "" unknown */
};

struct resp_engine {
    /* configuration (immutable after open) */
    char host[256];
    int port;
    bool unix_sock;
    char endpoint[300]; /* "unix:PATH" or "HOST:PORT", for logs and status */
    char user[128], pass[256];
    char prefix[129];
    size_t prefix_len;
    int db;
    int nworkers;
    struct timeval conn_tv, req_tv;
    uint64_t conn_ns, req_ns; /* connection_timeout, request_timeout */
    uint64_t probe_ns;        /* a probe's deadline: min(request_timeout, PROBE_MAX_NS) */

    struct kvt_tpool *pool;
    pthread_t mon;
    bool mon_started;

    pthread_mutex_t hlock; /* guards the fields down to 'scan_running' */
    pthread_cond_t hcond;
    bool stop;
    uint64_t backoff_ns, next_probe_ns, down_since_ns;
    uint64_t next_check_ns; /* the monitor's next round over the nodes that are up */
    char last_err[256];
    double last_err_unix; /* wall-clock time of last_err */
    int last_err_node;    /* cluster: the node last_err is about, -1: the adapter's own */
    bool probing;         /* standalone: a probe is in flight */
    char run_id[48], version[32];
    bool scan_needed, sweep_after_scan, scan_running;
    bool recovered; /* the start-up scan is done */
    /* cluster mode: the masters whose restart the next scan reconciles
     * (their keys only); all false: the scan covers every master */
    bool recon[CL_MAX_NODES];

    _Atomic bool up;
    _Atomic unsigned epoch; /* bumped on every disconnect: workers reopen */
    _Atomic unsigned gen;   /* scan generation, 1..127 */

    struct kvt_l2_park park; /* stores waiting for the start-up scan */

    pthread_mutex_t ctl_lock; /* guards ctl */
    struct conn ctl;

    _Atomic uint64_t round_trips, reconnects, disconnects, foreign, swept, cmd_errors;

    /* Redis Cluster (resp_cluster.c); cluster false: none of this is used */
    bool cluster;
    pthread_mutex_t maplock;            /* guards nodes, nnodes, slots, nmasters (a leaf lock) */
    struct cl_node nodes[CL_MAX_NODES]; /* [0..nseeds) the configured seeds */
    int nnodes, nseeds;
    uint16_t slots[CL_SLOTS]; /* slot -> index in nodes, CL_NO_NODE: unknown */
    int nmasters;
    struct cl_health nh[CL_MAX_NODES];   /* maplock */
    bool refresh_needed;                 /* hlock: the monitor re-reads CLUSTER SLOTS */
    uint64_t next_refresh_ns;            /* hlock */
    struct conn ctl_nodes[CL_MAX_NODES]; /* ctl_lock: remove's connections per node */
    _Atomic uint64_t refreshes, moved, asked, cl_errors;
    /* the start-up scan waits for a master that is down: stores fail at once
     * instead of waiting parked for it */
    _Atomic bool scan_blocked;
    /* "read_from_replicas": loads go to a replica of the slot's master
     * (connections opened READONLY); a miss or a failure there is asked of
     * the master again. replica_of: a master's replica to read from,
     * master_of: a replica's master (CL_NO_NODE: none). maplock */
    bool read_replicas;
    bool replica_poll; /* hlock: a master has no replica in the map: poll it */
    uint16_t replica_of[CL_MAX_NODES];
    uint16_t master_of[CL_MAX_NODES];
    _Atomic uint64_t replica_loads, replica_fallbacks;

    /* "shared_budget" (resp_budget.c): stores are SET ... NX, so a key
     * another server stored is neither overwritten nor charged twice */
    bool nx;
};

/* Growable command buffer for small commands. */
struct wbuf {
    char *p;
    size_t len, cap;
};

enum { R_STATUS, R_ERROR, R_INT, R_BULK, R_NIL }; /* reply kinds of kvt_resp_rd_reply */

/* Parsed adapter options (resp_cfg.c fills them, resp.c opens with them). */
struct kvt_resp_opts {
    const char *host; /* points into the JSON, or at node_host */
    int port;
    char node_host[256]; /* first startup_nodes entry */
    int nnodes;
    const char *username, *password, *key_prefix;
    int num_workers;
    double connection_timeout, request_timeout; /* seconds */
    int database_id;
    uint64_t max_capacity_bytes;
    bool cluster;
    bool read_replicas; /* "read_from_replicas" (cluster mode) */
    int nseeds;         /* cluster mode: host/port or startup_nodes, then "nodes" */
    char seed_host[CL_MAX_SEEDS][256];
    int seed_port[CL_MAX_SEEDS];
};

struct kvt_cfg;
/* resp_cfg.c: the adapter descriptors' parse functions */
int kvt_resp_parse_resp(struct kvt_cfg *c, void *o);
int kvt_resp_parse_valkey(struct kvt_cfg *c, void *o);

/* resp.c */
int kvt_resp_wire_key(const struct resp_engine *e, const kvt_key *k, char *out);
int kvt_resp_check_header(const uint8_t *buf, uint32_t got, uint64_t vlen, const kvt_key *want,
                          struct kvt_objhdr *h, const char **why);
/* Fail the parked stores (the server is down, or close: stop_parking). */
void kvt_resp_fail_parked(kvt_l2 *l2, struct resp_engine *e, bool stop_parking);
void kvt_resp_submit(kvt_l2 *l2, kvt_l2_task *t);

/* Run one command about key on its control connection (standalone: e->ctl,
 * reopened once; cluster: the key's node, following redirects), taking
 * e->ctl_lock. NULL: no reply (the error is in last_error). */
redisReply *kvt_resp_ctl_key(kvt_l2 *l2, struct resp_engine *e, const char *key, size_t kl,
                             int argc, const char **argv, const size_t *lens);

/* resp_budget.c: the shared budget's record, a hash on the server */
int kvt_resp_budget_attach(kvt_l2 *l2, struct resp_engine *e, char *err, size_t errcap);

/* resp_wire.c: connections (each owned by one thread) and the raw protocol */
void kvt_resp_conn_close(struct conn *cn);
int kvt_resp_conn_open(struct resp_engine *e, struct conn *cn, char *msg, size_t cap);
/* Set the socket timeouts of cn for one hiredis command to what is left of
 * cn->deadline_ns (at most request_timeout); -ETIMEDOUT: nothing is left. */
int kvt_resp_conn_arm(struct resp_engine *e, struct conn *cn);
bool kvt_resp_past_deadline(const struct conn *cn);
int kvt_resp_conn_ensure(struct resp_engine *e, struct conn *cn, char *msg, size_t cap);
int kvt_resp_wr_all(struct conn *cn, struct iovec *iov, int cnt);
void kvt_resp_wb_put(struct wbuf *b, const void *s, size_t n);
void kvt_resp_wb_fmt(struct wbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void kvt_resp_wb_arg(struct wbuf *b, const char *s, size_t n);
int kvt_resp_rd_reply(struct conn *cn, int *type, long long *num, char *err, size_t errcap);
int kvt_resp_rd_bytes(struct conn *cn, void *dst, size_t n);
int kvt_resp_rd_crlf(struct conn *cn);
bool kvt_resp_is_transport(int rc);

/* resp_cluster.c: slot map, redirects, per-node control commands */
unsigned kvt_resp_cl_slot(const char *key, size_t len);
int kvt_resp_cl_node_add(struct resp_engine *e, const char *host, int port);
/* The node that owns key's slot (-1: the map does not know); read, with
 * "read_from_replicas": its replica instead, unless that is marked down. */
int kvt_resp_cl_node_of(struct resp_engine *e, const char *key, size_t len, bool read);
/* node's master when node is a replica, else -1. */
int kvt_resp_cl_master_of(struct resp_engine *e, int node);
void kvt_resp_cl_addr(struct resp_engine *e, int node, char *host, size_t cap, int *port);
int kvt_resp_cl_masters(struct resp_engine *e, int *out, int max);
void kvt_resp_cl_want_refresh(struct resp_engine *e);
/* Node health (struct cl_health): a request or probe to node failed. */
void kvt_resp_cl_mark_down(kvt_l2 *l2, struct resp_engine *e, int node, const char *why);
bool kvt_resp_cl_is_down(struct resp_engine *e, int node);
const char *kvt_resp_role_name(int role);
double kvt_resp_wall_now(void);
/* How many slot owners are marked down (slots nobody can serve yet). */
int kvt_resp_cl_down_owners(struct resp_engine *e);
/* An error reply on a data command: 1 MOVED/ASK (*node, *ask set), 2 a
 * transient cluster error (CLUSTERDOWN, TRYAGAIN, ...), 0 anything else. */
int kvt_resp_cl_error(struct resp_engine *e, const char *err, int *node, bool *ask);
int kvt_resp_cl_refresh(kvt_l2 *l2, struct resp_engine *e, struct conn *mon, char *msg, size_t cap);
/* One command about key on its node's control connection, following
 * redirects, within request_timeout; call with e->ctl_lock held. NULL: no
 * reply (the node is down, or does not answer in time: then marked down). */
redisReply *kvt_resp_cl_command(kvt_l2 *l2, struct resp_engine *e, const char *key, size_t kl,
                                int argc, const char **argv, const size_t *lens);
void kvt_resp_cl_close(struct resp_engine *e);

/* resp_mon.c: health and the monitor thread */
void kvt_resp_set_err(struct resp_engine *e, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void kvt_resp_mark_down(kvt_l2 *l2, struct resp_engine *e, const char *why);
int kvt_resp_probe(kvt_l2 *l2, struct resp_engine *e, struct conn *mon);
void *kvt_resp_monitor_main(void *arg);
/* The nodes hook (struct kvt_l2_node): standalone the server, cluster mode
 * every master and replica of the map. */
int kvt_resp_nodes(kvt_l2 *l2, struct kvt_l2_node *out, int max);

/* ---- the data path: resp.c (batches, jobs), resp_pass.c (workers and
 * the pass runners), resp_store.c, resp_load.c (lookups and loads) ---- */

/* A worker thread's state (kvt_tpool ctx): its connections and buffers. */
struct worker {
    uint64_t deadline; /* the current job's: request_timeout after it started */
    struct conn cn;    /* standalone: the one connection */
    struct conn *cur;  /* the connection a pass runs on (&cn, or one of ncn) */
    struct wbuf wb;
    uint8_t *hdrs; /* HDR bytes per key of the current job */
    size_t hdrs_cap;
    /* cluster mode: one connection per node index, opened when first used */
    struct conn ncn[CL_MAX_NODES];
    bool asking;   /* the pass sends ASKING before each command */
    uint16_t *tgt; /* per key of the job: node for the next pass */
    uint8_t *askf; /* per key: the next pass is an ASK redirect */
};

/* Per-key outcome of one pipelined pass. K_REDIR: MOVED/ASK (cluster: sent
 * again to w->tgt[j]); K_DOWN: the key's node failed (cluster: the key
 * fails, the others go on); K_NOTSEL: not part of this pass; K_EXISTS: a
 * SET ... NX found the key there (shared budget: another server stored it). */
enum {
    K_PENDING = 0,
    K_OK,
    K_SKIP,
    K_FAIL,
    K_MISS,
    K_CORRUPT,
    K_REDIR,
    K_DOWN,
    K_NOTSEL,
    K_EXISTS
};

/* The pass runners: one attempt, plus one retry on a fresh connection when
 * the connection was an old one that broke (a server restart breaks idle
 * connections without anyone noticing until they are used), both within
 * the job's deadline; no answer in time is not asked again. */
typedef int (*pass_fn)(kvt_l2 *l2, struct resp_engine *e, struct worker *w, kvt_l2_task *t,
                       const uint32_t *idx, uint32_t n, uint8_t *st, void *ctx, char *msg,
                       size_t cap);
void *kvt_resp_worker_new(int i, void *arg);
void kvt_resp_worker_free(void *p);
/* HDR bytes per key of the current job (n keys), reused across jobs. */
uint8_t *kvt_resp_worker_hdrs(struct worker *w, uint32_t n);
/* Run fn for keys idx[0..n) of t: standalone on the worker's connection;
 * in cluster mode on node first, then wherever redirects send keys. */
int kvt_resp_run_pass(kvt_l2 *l2, struct resp_engine *e, struct worker *w, pass_fn fn,
                      kvt_l2_task *t, const uint32_t *idx, uint32_t n, uint8_t *st, void *ctx,
                      int node);
/* Cluster mode: the state for an error reply to key j's command: K_REDIR
 * (w->tgt/askf say where next), K_DOWN (a transient cluster error), or 0
 * (not a cluster error: the caller's usual handling). */
int kvt_resp_cl_err_state(struct resp_engine *e, struct worker *w, uint32_t j, const char *err);
/* ASKING in front of a command when the pass follows an ASK redirect; and
 * reading (dropping) its +OK. */
void kvt_resp_put_asking(struct worker *w);
int kvt_resp_skip_asking(struct worker *w);
/* A corrupt or foreign value for k: counted and logged (the caller removes it). */
void kvt_resp_report_corrupt(kvt_l2 *l2, const kvt_key *k, const char *why);
/* UNLINK keys[which[0..n)] (a cleanup after corrupt values; errors are
 * ignored): on the worker's connection, or in cluster mode one by one on
 * their nodes' control connections. */
void kvt_resp_unlink_keys(struct resp_engine *e, struct worker *w, const kvt_key *keys,
                          const uint32_t *which, uint32_t n);
void kvt_resp_cl_unlink_keys(kvt_l2 *l2, struct resp_engine *e, const kvt_key *keys,
                             const uint32_t *which, uint32_t n);
/* One job's share of a task, on a worker: STORE (resp_store.c), LOOKUP
 * (known: the stored sizes the index knows, 0 unknown) and LOAD
 * (resp_load.c). */
void kvt_resp_do_store(kvt_l2 *l2, struct resp_engine *e, struct worker *w, kvt_l2_task *t,
                       const uint32_t *idx, uint32_t n, int node);
void kvt_resp_do_lookup(kvt_l2 *l2, struct resp_engine *e, struct worker *w, kvt_l2_task *t,
                        const uint32_t *idx, const uint32_t *known, uint32_t n, int node);
void kvt_resp_do_load(kvt_l2 *l2, struct resp_engine *e, struct worker *w, kvt_l2_task *t,
                      const uint32_t *idx, uint32_t n, int node);

#endif
