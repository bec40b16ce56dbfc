/*
 * L2 adapter interface.
 *
 * An L2 adapter is an engine that keeps objects in one persistent or remote
 * tier. It knows nothing of L1, the server or other adapters. The contract
 * (LMCache's L2AdapterInterface, in C):
 *
 *   kvt_l2_submit(l2, task)   start a STORE, LOOKUP (lookup-and-lock) or LOAD
 *                             task; never blocks on I/O. The task comes back
 *                             exactly once from kvt_l2_pop_done() after the
 *                             adapter signalled the kind's eventfd.
 *   kvt_l2_unlock(l2, keys)   drop pins taken by a lookup; unknown keys and
 *                             underflow are no-ops; always succeeds.
 *   kvt_l2_delete(l2, keys)   synchronous; skips pinned keys; reports only
 *                             the keys it removed.
 *   kvt_l2_usage / kvt_l2_status / kvt_l2_close.
 *
 * Three eventfds per adapter (store, lookup, load), distinct across adapters.
 * A completed task is put on the kind's done queue under l2->lock, then the
 * eventfd is written; one wake may cover several completions.
 *
 * The base (the .c files of src/l2: base_int.h lists them) owns what every
 * adapter shares: the object index (key -> sizes, pins, state), byte
 * accounting with a hard cap, per-namespace usage, counters, the
 * eviction-policy hooks, recovery bookkeeping and the done queues. An engine
 * implements struct kvt_l2_ops (l2/engine.h). Outside src/l2, kvt_l2 is an
 * opaque handle: this header (the contract, accessors, stats) and
 * l2/evict.h are all code above L2 sees.
 *
 * Engine convention for lengths (a serde stage may sit in front of the
 * engine, so stored bytes and logical bytes differ; see serde/serde.h:
 * kvt_l2_submit hands STORE and LOAD of an adapter with a "serde" chain to
 * the stage (a filter, below), which submits inner tasks with encoded
 * bytes to the engine):
 *   STORE  store bufs[i].len bytes from bufs[i].ptr; meta[i] describes the
 *          object: meta[i].len is the LOGICAL length (index `len`, header
 *          logical_len), meta[i].serde goes into the header flags.
 *   LOOKUP report meta[i].len = the logical length.
 *   LOAD   bufs[i].len is the CAPACITY of bufs[i].ptr. Read the stored payload
 *          only if it fits (never an overrun), verify it, then set
 *          bufs[i].len to the payload bytes read and meta[i] from the header
 *          (len, dtype, shape, serde). The base and the controllers check the
 *          lengths against what they expect: a mismatch is a miss.
 *
 * Task results (written by the adapter, read by the controller after pop):
 *   ok       bitmap: STORE key stored (or already present), LOOKUP key found
 *            and pinned, LOAD key's bytes are in bufs[i] and verified.
 *   meta[i]  LOOKUP: the object's logical length (meta[i].len) for hits;
 *            LOAD: the object's metadata as stored.
 *   bytes    bytes moved to/from the backend.
 *
 * Thread rules: submit/unlock/delete/usage/status may be called from any
 * thread. close must be called once, after the last submit, from one thread.
 */
#ifndef KVT_L2_H
#define KVT_L2_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "key/key.h"
#include "key/kindex.h"
#include "key/objmeta.h"
#include "key/tierev.h"

enum kvt_l2_kind { KVT_L2_STORE = 0, KVT_L2_LOOKUP = 1, KVT_L2_LOAD = 2 };

typedef struct kvt_buf {
    void *ptr;
    uint64_t len;
} kvt_buf;

struct kvt_l2;

typedef struct kvt_l2_task {
    struct kvt_l2_task *next; /* done-queue link, guarded by l2->lock */
    enum kvt_l2_kind kind;
    uint32_t n;
    kvt_key *keys;          /* n keys (owned by the task) */
    kvt_buf *bufs;          /* STORE: sources; LOAD: destinations (arrays owned) */
    kvt_objmeta *meta;      /* n entries; STORE: in; LOOKUP/LOAD: out */
    uint64_t *ok;           /* result bitmap, n bits */
    int32_t *_Atomic codes; /* n per-key errors from kvt_l2_task_fail (0: none recorded:
                             * use err); made at the first failure, NULL until then */
    _Atomic uint64_t bytes;
    _Atomic uint32_t pending; /* engine's outstanding jobs */
    _Atomic int err;          /* first error seen, 0 if none */
    void *udata;              /* the submitter's cookie */
    uint64_t submit_ns;
    /* Set by a filter (kvt_l2_filter_ops.submit) on a task it hands to the
     * engine: the engine's completion (kvt_l2_task_finish) counts the
     * backend bytes, feeds the policy and calls on_done instead of queueing
     * the task for a controller. NULL on every controller's task. */
    void (*on_done)(struct kvt_l2 *l2, struct kvt_l2_task *t);
    /* Set by kvt_l2_run: the finished task goes back to its waiting
     * caller instead of a controller's done queue. NULL otherwise. */
    struct kvt_l2_waiter *waiter;
} kvt_l2_task;

/* Allocate a task for n keys with zeroed arrays (bufs only for STORE/LOAD). */
kvt_l2_task *kvt_l2_task_new(enum kvt_l2_kind kind, uint32_t n);
void kvt_l2_task_free(kvt_l2_task *t);
/* Key i's error once the task is done: its own code, else the task's first
 * error, else -EIO (for a key not marked ok); 0 for a key marked ok. */
int kvt_l2_task_code(const kvt_l2_task *t, uint32_t i);

typedef struct kvt_l2 kvt_l2; /* opaque outside src/l2 (l2/engine.h) */

/* Latency of the batches submitted to the adapter, per kind (store, lookup,
 * load): from kvt_l2_submit to the task's finish, serde stage included.
 * Bucket k counts batches of at most kvt_l2_lat_bounds[k] seconds (the last
 * bound is +Inf), not cumulative. Relaxed atomics: these are statistics. */
#define KVT_L2_LAT_BUCKETS 16
extern const double kvt_l2_lat_bounds[KVT_L2_LAT_BUCKETS];
struct kvt_l2_latency {
    uint64_t count, sum_ns;
    uint64_t bucket[KVT_L2_LAT_BUCKETS];
};

/* ---- the contract, used by controllers ------------------------------ */

void kvt_l2_submit(kvt_l2 *l2, kvt_l2_task *t);
/* Pop up to max finished tasks of a kind; returns how many. Call after the
 * kind's eventfd became readable (it is drained here). */
size_t kvt_l2_pop_done(kvt_l2 *l2, enum kvt_l2_kind kind, kvt_l2_task **out, size_t max);
void kvt_l2_unlock(kvt_l2 *l2, const kvt_key *keys, uint32_t n);
/* Delete unpinned keys; sets bit i in removed (may be NULL) for each removed
 * key and returns how many were removed. */
uint32_t kvt_l2_delete(kvt_l2 *l2, const kvt_key *keys, uint32_t n, uint64_t *removed);
/* The objects of these keys are already gone from the backend: drop their
 * unpinned READY entries like kvt_l2_delete, without ops->remove. Returns
 * how many were dropped. */
uint32_t kvt_l2_drop_gone(kvt_l2 *l2, const kvt_key *ck, uint32_t n);

struct kvt_l2_usage {
    uint64_t used_bytes; /* this server's index */
    uint64_t cap_bytes;
    /* used / cap, or -1 when cap is 0; with a shared budget the tier's
     * total (as last read from the shared record) / cap: what the
     * eviction trigger compares with its watermark; -1 (no watermark
     * eviction) while the record does not answer or its view is older
     * than three eviction intervals */
    double fraction;
    uint64_t objects;
};
void kvt_l2_usage(kvt_l2 *l2, struct kvt_l2_usage *u);
/* Full status object (jansson, caller decrefs). */
json_t *kvt_l2_status(kvt_l2 *l2);
/* A snapshot of one kind's batch latencies (see struct kvt_l2_latency). */
void kvt_l2_latency(kvt_l2 *l2, enum kvt_l2_kind kind, struct kvt_l2_latency *out);
bool kvt_l2_healthy(kvt_l2 *l2, char *msg, size_t cap);
void kvt_l2_close(kvt_l2 *l2);

/* ---- accessors: what controllers, operations and the server may read -- */

const char *kvt_l2_name(const kvt_l2 *l2); /* "fs[0]" */
const char *kvt_l2_type(const kvt_l2 *l2); /* "fs" */
/* The eventfd a controller polls for finished tasks of this kind. */
int kvt_l2_efd(const kvt_l2 *l2, enum kvt_l2_kind kind);
/* Is the start-up scan still running? */
bool kvt_l2_recovering(kvt_l2 *l2);
/* Is this (client-named) key in the index, in any state? */
bool kvt_l2_indexed(kvt_l2 *l2, const kvt_key *key);
/* The directory of cache object files behind this adapter (fs, fs_native,
 * nixl_store_dynamic: what purge and the offline scan walk), or "" when the
 * engine keeps no such directory. */
void kvt_l2_root(kvt_l2 *l2, char *out, size_t cap);

/* Tier events (key/tierev.h): from now on the hook hears of every entry
 * that becomes available (a store published, an object adopted by the
 * start-up scan or a lookup) as KVT_TIER_STORED, and of every one of
 * those that leaves the index (delete, eviction, quota, purge, a removal
 * after a failed verification, a drop of objects gone from the backend)
 * as KVT_TIER_REMOVED; a write that fails is never announced. The entries
 * indexed when it is set are announced at once (the start-up scan may
 * have adopted some). The hook runs with l2->lock held. Set it once. */
void kvt_l2_set_event_hook(kvt_l2 *l2, const struct kvt_tier_hook *hook);

/* ---- stats: numbers kept as numbers ---------------------------------- */

/* A snapshot of an adapter's counters and totals, taken in one short lock
 * hold with no walk of the index: /status and /metrics render from it. */
struct kvt_l2_stats {
    /* counters (since start) */
    uint64_t store_ok, store_failed, store_skipped, rejected_writes;
    uint64_t lookups, lookup_hits, lookup_misses, secondary_hits;
    uint64_t load_ok, load_failed, corrupt;
    uint64_t bytes_written, bytes_read;
    uint64_t deleted, evictions, reclaimed_bytes, sync_evictions, too_big, failovers;
    uint64_t odirect_fallbacks, serde_mismatches, quota_rejections, quota_evictions;
    /* totals (now) */
    uint64_t used_bytes, cap_bytes, objects;
    uint64_t logical_bytes;      /* of the entries whose logical length is known */
    uint64_t stored_known_bytes; /* backend bytes of those entries */
    uint64_t logical_unknown;    /* entries restored by a scan whose header is unread */
    uint64_t pinned_objects;
    /* the start-up scan */
    bool recovering;
    uint64_t recovered_objs, recovered_bytes;
    double recovery_seconds;
    /* a budget shared with other servers (l2/budget.h), as last read */
    bool shared_budget;
    int64_t shared_total; /* the tier's bytes in the shared record */
    int64_t shared_part;  /* this server's net part of them */
    uint32_t shared_nodes;
};
void kvt_l2_stats(kvt_l2 *l2, struct kvt_l2_stats *out);

/* ---- remote endpoints: what status and metrics show per node ---------
 *
 * An adapter that talks to servers over the network (the nodes of a Redis
 * Cluster, a Redis server, an S3 endpoint) reports each of them: whether it
 * answers, its circuit breaker where it has one, how often it went down and
 * its last error, which is cleared when the node answers again. Rendered as
 * the adapter's "nodes" array in /status and as kvtier_l2_node_* metrics.
 */
#define KVT_L2_NODES_MAX 256 /* most nodes status and metrics show per adapter */

enum kvt_l2_node_state {
    KVT_NODE_UP = 0,  /* answers */
    KVT_NODE_DOWN,    /* failed (refused, reset, hung): its requests fail at once */
    KVT_NODE_PROBING, /* down, a probe is in flight */
};
enum kvt_l2_breaker_state { KVT_BRK_NONE = 0, KVT_BRK_CLOSED, KVT_BRK_OPEN, KVT_BRK_HALF_OPEN };

struct kvt_l2_node {
    char name[320]; /* "10.0.0.5:7000", "http://127.0.0.1:9000/bucket" */
    char role[16];  /* "master", "replica", "server", "endpoint" */
    enum kvt_l2_node_state state;
    enum kvt_l2_breaker_state breaker; /* KVT_BRK_NONE: the node has none */
    uint64_t downs;                    /* times it was marked down since start */
    double down_seconds;               /* how long it has been down; 0 when up */
    char last_error[200];              /* "" when none, or since it answered again */
    double last_error_unix;            /* wall-clock time of last_error; 0 when none */
};
const char *kvt_l2_node_state_name(enum kvt_l2_node_state s); /* "up", "down", "probing" */
const char *kvt_l2_breaker_name(enum kvt_l2_breaker_state b); /* NULL for NONE, "closed", ... */
/* Fill up to max nodes of the adapter; returns how many it has (more than
 * max when out was too short), 0 when it reports none. Any thread. */
int kvt_l2_nodes(kvt_l2 *l2, struct kvt_l2_node *out, int max);

/* ---- operator calls (the admin API: src/core/admin.c) ----------------- */

/* Run a LOOKUP or LOAD task and wait until it finished: the same path as
 * kvt_l2_submit (filters, counters, latency), but the task comes back to
 * the caller, never to a controller's done queue, so a controller never
 * sees it. A LOOKUP pins its hits as any lookup does (kvt_l2_unlock).
 * Blocks: never call it from an adapter's or a controller's thread. */
void kvt_l2_run(kvt_l2 *l2, kvt_l2_task *t);
/* Pin the READY entries of keys as a lookup does (eviction and delete
 * skip them) until kvt_l2_unlock; sets bit i of held (n bits, zeroed by
 * the caller) for each key pinned and returns how many. */
uint32_t kvt_l2_hold(kvt_l2 *l2, const kvt_key *keys, uint32_t n, uint64_t *held);

/* Quotas at run time. name: a namespace name (kvt_ns_name) or "@" + a
 * cache salt (a tenant: every namespace stored under that salt). */
struct kvt_l2_quota_info {
    uint64_t limit, used, rejected;
};
/* 0 and *out, or -ENOENT (no quota of that name). */
int kvt_l2_quota_get(kvt_l2 *l2, const char *name, struct kvt_l2_quota_info *out);
/* Set (or add) a quota. Refused with -EOVERFLOW (nothing changes) when the
 * name's bytes in this adapter, *used, are above limit; -ENOSPC when
 * KVT_L2_MAX_QUOTAS names were given. 0 otherwise; *used is filled. */
#define KVT_L2_MAX_QUOTAS 4096
int kvt_l2_quota_set(kvt_l2 *l2, const char *name, uint64_t limit, uint64_t *used);
/* Remove a quota: 0, or -ENOENT. */
int kvt_l2_quota_del(kvt_l2 *l2, const char *name);
/* Every quota in force: {name: {quota_bytes, used_bytes, rejected_writes}}. */
json_t *kvt_l2_quotas(kvt_l2 *l2);

/* ---- index scan: for purge -------------------------------------------- */

/* A live index entry as a scan shows it. */
struct kvt_l2_entry {
    kvt_key key; /* canonical */
    uint32_t stored, len;
    uint16_t pins;
    bool ready; /* false: being written or deleted */
};
/* Visit live entries from *cursor on (0: the start), under the adapter's
 * lock: visit must be short and must not call into the adapter. It returns
 * false to stop; *cursor then points at the entry after the last visited,
 * for the next call. Returns true when the end of the index was reached. */
bool kvt_l2_scan(kvt_l2 *l2, uint32_t *cursor,
                 bool (*visit)(const struct kvt_l2_entry *e, void *arg), void *arg);

#endif
