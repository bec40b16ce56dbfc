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
 * The base (this file, l2.c) owns what every adapter shares: the object index
 * (key -> sizes, pins, state), byte accounting with a hard cap, per-namespace
 * usage, counters, the eviction-policy hooks, recovery bookkeeping and the
 * done queues. An engine implements struct kvt_l2_ops.
 *
 * Engine convention for lengths (a serde stage may sit in front of the
 * engine, so stored bytes and logical bytes differ; see serde/serde.h:
 * kvt_l2_submit hands STORE and LOAD of an adapter with a "serde" chain to
 * the stage, which submits inner tasks with encoded bytes to the engine):
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

enum kvt_l2_kind { KVT_L2_STORE = 0, KVT_L2_LOOKUP = 1, KVT_L2_LOAD = 2 };


typedef struct kvt_buf {
    void *ptr;
    uint64_t len;
} kvt_buf;

typedef struct kvt_l2_task {
    struct kvt_l2_task *next; /* done-queue link, guarded by l2->lock */
    enum kvt_l2_kind kind;
    uint32_t n;
    kvt_key *keys;       /* n keys (owned by the task) */
    kvt_buf *bufs;       /* STORE: sources; LOAD: destinations (arrays owned) */
    kvt_objmeta *meta;   /* n entries; STORE: in; LOOKUP/LOAD: out */
    uint64_t *ok;        /* result bitmap, n bits */
    int32_t *_Atomic codes; /* n per-key errors from kvt_l2_task_fail (0: none recorded:
                             * use err); made at the first failure, NULL until then */
    _Atomic uint64_t bytes;
    _Atomic uint32_t pending; /* engine's outstanding jobs */
    _Atomic int err;          /* first error seen, 0 if none */
    void *udata;              /* the submitter's cookie */
    uint64_t submit_ns;
    /* serde stage (l2/stage.c): staged is set on a task that went
     * through the adapter's serde chain; stage_op on the inner task that
     * the stage handed to the engine (its completion goes back to the
     * stage instead of the done queue). Both are unset otherwise. */
    bool staged;
    void *stage_op;
} kvt_l2_task;

/* Allocate a task for n keys with zeroed arrays (bufs only for STORE/LOAD). */
kvt_l2_task *kvt_l2_task_new(enum kvt_l2_kind kind, uint32_t n);
void kvt_l2_task_free(kvt_l2_task *t);

/* ---- the object index ---------------------------------------------- */

enum kvt_l2_state { KVT_OBJ_FREE = 0, KVT_OBJ_WRITING, KVT_OBJ_READY, KVT_OBJ_DELETING };
/* struct kvt_l2_obj.state holds the kvt_l2_state in its low bits and two
 * base-owned flags above them (the policy tracks it; it is doomed). */
#define KVT_OBJ_STATE_MASK 0x3f

/* One indexed object: 64 bytes. */
struct kvt_l2_obj {
    kvt_key key;
    uint32_t stored; /* bytes occupied on the backend (header + payload, or slot) */
    uint32_t len;    /* logical payload bytes */
    uint32_t aux;    /* engine-owned (slot number, header size, ...) */
    uint16_t pins;   /* lookup pins */
    uint8_t state;   /* enum kvt_l2_state */
    uint8_t flags;   /* engine-owned */
};
_Static_assert(sizeof(struct kvt_l2_obj) == 64, "index entry size");

static inline enum kvt_l2_state kvt_l2_obj_state(const struct kvt_l2_obj *o)
{
    return (enum kvt_l2_state)(o->state & KVT_OBJ_STATE_MASK);
}

struct kvt_l2_index {
    struct kvt_l2_obj *objs; /* slab; handle = position */
    uint32_t cap_objs;
    uint32_t nobjs;     /* live entries */
    uint32_t free_head; /* free list threaded through objs[].aux, UINT32_MAX = empty */
    uint32_t hwm;       /* entries ever used (handles below this were allocated) */
    struct kvt_kindex map; /* key -> handle */
};

/* ---- eviction-policy hooks (implemented in policy/) ----------------- */

struct kvt_policy;

/* ---- adapters -------------------------------------------------------- */

typedef struct kvt_l2 kvt_l2;

struct kvt_l2_ops {
    /* Start a task. Must not block on I/O. Must end with kvt_l2_task_finish. */
    void (*submit)(kvt_l2 *l2, kvt_l2_task *t);
    /* Remove the object's bytes from the backend; called without l2->lock
     * for an entry the base has marked DELETING. Return 0 or -errno. */
    int (*remove)(kvt_l2 *l2, const struct kvt_l2_obj *o);
    /* Optional, for engines whose remove is a network round trip: remove n
     * objects at once (concurrently), rcs[i] as remove would return it.
     * Used instead of remove whenever the base removes a batch. */
    void (*remove_batch)(kvt_l2 *l2, const struct kvt_l2_obj *objs, uint32_t n, int *rcs);
    /* Add engine-specific fields to the status object (may take l2->lock). */
    void (*status)(kvt_l2 *l2, json_t *out);
    /* Health: fill msg (<= 200 bytes) and return false when unhealthy. */
    bool (*healthy)(kvt_l2 *l2, char *msg, size_t cap);
    /* Stop engine threads after in-flight work completed; free the engine. */
    void (*close)(kvt_l2 *l2);
};

struct kvt_l2_counters {
    _Atomic uint64_t store_ok, store_failed, store_skipped, rejected_writes;
    _Atomic uint64_t lookups, lookup_hits, lookup_misses, secondary_hits;
    _Atomic uint64_t load_ok, load_failed, corrupt;
    _Atomic uint64_t bytes_written, bytes_read;
    _Atomic uint64_t deleted, evictions, reclaimed_bytes;
    _Atomic uint64_t sync_evictions; /* stores that evicted to fit under the cap */
    _Atomic uint64_t too_big;        /* stores refused: larger than a slot/object can hold */
    _Atomic uint64_t odirect_fallbacks;
    _Atomic uint64_t serde_mismatches; /* a serde-encoded object read without its chain */
    _Atomic uint64_t quota_rejections, quota_evictions; /* namespace quotas */
};

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
struct kvt_l2_lat_hist {
    _Atomic uint64_t count, sum_ns;
    _Atomic uint64_t bucket[KVT_L2_LAT_BUCKETS];
};

/* A per-namespace quota (namespace = kvt_ns_name, the sanitized model).
 * The list is built by kvt_l2_base_init from the spec and never changes. */
struct kvt_l2_quota {
    char *name;
    uint64_t limit;    /* bytes */
    uint64_t used;     /* guarded by l2->lock: bytes of its namespaces' entries */
    uint64_t rejected; /* guarded by l2->lock: writes refused by this quota */
};

struct kvt_l2 {
    const struct kvt_l2_ops *ops;
    char type[32];
    char name[48]; /* "fs[0]" */
    int index;
    int efd[3]; /* eventfds, one per enum kvt_l2_kind */
    enum kvt_codec codec;

    pthread_mutex_t lock; /* guards everything below up to 'counters' */
    struct kvt_l2_index idx;
    uint64_t cap_bytes;      /* hard cap; 0 = unlimited */
    uint64_t used_bytes;     /* READY + WRITING + DELETING entries */
    uint64_t *ns_bytes;      /* per namespace id */
    uint32_t ns_bytes_cap;
    struct kvt_l2_quota *quotas; /* nquotas entries (the list is immutable) */
    uint32_t nquotas;
    uint32_t *ns_quota;          /* ns id -> 0 unresolved, 1 no quota, 2 + quota index */
    uint32_t ns_quota_cap;
    kvt_l2_task *done_head[3], *done_tail[3];
    struct kvt_policy *policy; /* may be NULL: no eviction */
    bool recovering;           /* start-up scan still running */
    uint64_t recovered_objs, recovered_bytes;
    double recovery_seconds;
    bool closing;
    /* doomed entries whose last pin went (DELETING, not yet removed from the
     * backend): kvt_l2_reap removes them off the caller's thread */
    uint32_t *reap_h;
    struct kvt_l2_obj *reap_copy;
    uint32_t nreap, reap_cap;
    /* bytes of entries an eviction walk marked DELETING and whose removal
     * has not settled yet: concurrent evictions (store threads making room,
     * the eviction thread) count them as already gone instead of marking
     * more victims, and a store that finds nothing left to mark waits for
     * them on evict_cv (broadcast whenever a removal settles) */
    uint64_t evicting_bytes;
    pthread_cond_t evict_cv;

    struct kvt_l2_counters counters;
    struct kvt_l2_lat_hist lat[3]; /* per enum kvt_l2_kind */
    bool persist_enabled;
    /* set by engines that reserve on a thread where a remove must not be
     * waited for (s3: the submitting thread): a store over the cap is
     * refused at once and the eviction controller makes room on its next
     * wake */
    bool no_sync_evict;
    _Atomic bool warned_too_big;
    void *engine; /* engine state */
    /* serde stage, or NULL: set by kvt_serde_stage_attach before the first
     * submit, cleared in kvt_l2_close after the engine closed */
    struct kvt_serde_stage *serde;
    /* Test/diagnostic hook (fault_inject): may clear result bits of a task
     * just before it is published. Set once before the first submit. */
    void (*finish_hook)(kvt_l2 *l2, kvt_l2_task *t);
    void (*hook_status)(kvt_l2 *l2, json_t *out);
    void *hook_ctx; /* freed by kvt_l2_close */
};

struct kvt_l2_spec;

/* Base setup for an engine's constructor: name, eventfds, lock, index, and
 * the spec's common keys (persist_enabled, eviction policy). Call it before
 * starting any engine thread. */
int kvt_l2_base_init(kvt_l2 *l2, const struct kvt_l2_ops *ops, const struct kvt_l2_spec *spec,
                     enum kvt_codec codec, uint64_t cap_bytes);
void kvt_l2_base_destroy(kvt_l2 *l2);

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
    uint64_t used_bytes;
    uint64_t cap_bytes;
    double fraction; /* used / cap, or -1 when cap is 0 */
    uint64_t objects;
};
void kvt_l2_usage(kvt_l2 *l2, struct kvt_l2_usage *u);
/* Full status object (jansson, caller decrefs). */
json_t *kvt_l2_status(kvt_l2 *l2);
/* A snapshot of one kind's batch latencies (see struct kvt_l2_latency). */
void kvt_l2_latency(kvt_l2 *l2, enum kvt_l2_kind kind, struct kvt_l2_latency *out);
bool kvt_l2_healthy(kvt_l2 *l2, char *msg, size_t cap);
void kvt_l2_close(kvt_l2 *l2);

/* ---- helpers for engines --------------------------------------------- */

/* Canonical form of a key for this adapter's names. */
static inline void kvt_l2_canon(const kvt_l2 *l2, const kvt_key *in, kvt_key *out)
{
    kvt_key_canon(l2->codec, in, out);
}

/* A store of len bytes that this adapter can never hold (max bytes per
 * object or slot): count it (too_big, store_failed), warn once naming the
 * limit and the config key (what), and fail key i of t with KVT_E_TOOBIG. */
void kvt_l2_too_big(kvt_l2 *l2, kvt_l2_task *t, uint32_t i, uint64_t len, uint64_t max,
                    const char *what);
/* Mark the task finished (release) and queue it for the controller. */
void kvt_l2_task_finish(kvt_l2 *l2, kvt_l2_task *t);
/* Record one key's result; called from any engine thread. */
void kvt_l2_task_ok(kvt_l2_task *t, uint32_t i, uint64_t bytes);
void kvt_l2_task_fail(kvt_l2_task *t, uint32_t i, int err);
/* Key i's error once the task is done: its own code, else the task's first
 * error, else -EIO (for a key not marked ok); 0 for a key marked ok. */
int kvt_l2_task_code(const kvt_l2_task *t, uint32_t i);
/* Decrement t->pending; finish the task when it reaches zero. */
void kvt_l2_task_job_done(kvt_l2 *l2, kvt_l2_task *t);

/* Reserve room for a new object before writing it. Returns 0 (entry is now
 * WRITING and counted), -EEXIST (already indexed or being written: skip),
 * KVT_E_FULL (over the cap: refused and counted), KVT_E_LIMIT (over its
 * namespace quota: refused and counted), or -ESHUTDOWN. Over the cap on an
 * adapter with an eviction policy, it first evicts (policy order, never
 * pinned or in-flight objects) on the caller's thread: call it from an
 * engine thread that may block on ops->remove, holding no engine lock that
 * remove takes (or set l2->no_sync_evict). */
int kvt_l2_reserve(kvt_l2 *l2, const kvt_key *ck, uint32_t stored, uint32_t len, uint32_t aux,
                   uint8_t flags);
/* The write succeeded: WRITING -> READY, the policy learns the key. */
void kvt_l2_publish(kvt_l2 *l2, const kvt_key *ck);
/* The same, recording the engine's aux (e.g. the slot) in the same lock
 * hold: nothing reads aux before the entry is READY. */
void kvt_l2_publish_aux(kvt_l2 *l2, const kvt_key *ck, uint32_t aux);
/* The write failed: drop the reservation. */
void kvt_l2_unreserve(kvt_l2 *l2, const kvt_key *ck);

/* Lookup-and-pin a canonical key; copies the entry to *out when found. */
bool kvt_l2_pin(kvt_l2 *l2, const kvt_key *ck, struct kvt_l2_obj *out);
/* LOOKUP answered from the index alone (engines whose index is complete:
 * no I/O): pin each key found READY, report its logical length, finish t. */
void kvt_l2_lookup_index(kvt_l2 *l2, kvt_l2_task *t);
/* LOOKUP fast path of engines whose index may lack a key's header: when
 * every key is READY with a nonzero aux (its header is known) and can be
 * pinned, pin them all, report their lengths, finish t and return true
 * (no thread hop). Otherwise change nothing and return false. */
bool kvt_l2_lookup_known(kvt_l2 *l2, kvt_l2_task *t);
/* Insert an object found on the backend (recovery scan or secondary lookup).
 * pin: also pin it. at_cold_end: the policy sees it as least recently used
 * (recovery inserts newest first, so the oldest ends up coldest).
 * Returns true if inserted (false: already indexed). */
bool kvt_l2_adopt(kvt_l2 *l2, const kvt_key *ck, uint32_t stored, uint32_t len, uint32_t aux,
                  uint8_t flags, bool pin, bool at_cold_end);
/* A hit found on a remote backend (stored bytes, logical length): pin the
 * ready indexed entry, recording its logical length and the engine's flag;
 * or, when not indexed, adopt it (header aux, counted as a secondary hit)
 * and pin it. Returns true when the key is pinned (a hit). */
bool kvt_l2_pin_found(kvt_l2 *l2, const kvt_key *ck, uint32_t stored, uint32_t logical,
                      uint32_t aux, uint8_t flag);
/* An indexed object turned out missing or corrupt on the backend: forget it
 * (if unpinned by others) so the bytes are no longer counted. */
void kvt_l2_forget(kvt_l2 *l2, const kvt_key *ck);
/* A pinned object failed verification on the backend (slot engines, whose
 * bytes cannot simply be unlinked under a reader): it takes no new pins from
 * now on, and when its last pin goes (kvt_l2_unlock) it is queued for
 * kvt_l2_reap, which removes it through ops->remove like a delete. */
void kvt_l2_doom(kvt_l2 *l2, const kvt_key *ck);
/* A slot engine's load found the object behind pinned key (as the client
 * named it) corrupt: count it, log it (slot, or UINT32_MAX for none) and
 * doom its entry. The caller then fails the key with KVT_E_CORRUPT. */
void kvt_l2_slot_corrupt(kvt_l2 *l2, const kvt_key *key, uint32_t slot, const char *why);
/* Remove the queued doomed objects (ops->remove may block: the L2 eviction
 * thread calls this, and kvt_l2_close). Returns how many were removed. */
uint32_t kvt_l2_reap(kvt_l2 *l2);
/* Tell the policy these keys were read. */
void kvt_l2_touch(kvt_l2 *l2, const kvt_key *ck, uint32_t n);
void kvt_l2_set_recovering(kvt_l2 *l2, bool on);

/* What a start-up scan found, collected before adopting it in one go. */
struct kvt_l2_found {
    kvt_key key; /* canonical */
    int64_t mtime_ns;
    uint32_t stored, len, aux;
    uint8_t flags;
};
struct kvt_l2_found_vec {
    struct kvt_l2_found *v;
    size_t n, cap;
    uint64_t corrupt; /* object names found holding no valid object (removed) */
};
void kvt_l2_found_push(struct kvt_l2_found_vec *fv, const kvt_key *ck, uint32_t stored,
                       uint32_t len, uint32_t aux, uint8_t flags, int64_t mtime_ns);
/* End a start-up scan: adopt everything found, newest first at the policy's
 * cold end (so the oldest is evicted first), with the index sized once;
 * then record the recovery figures (time since t0_ns), clear `recovering`
 * and log where from. Frees fv's array. */
void kvt_l2_finish_recovery(kvt_l2 *l2, struct kvt_l2_found_vec *fv, uint64_t t0_ns,
                            const char *where);
/* End a start-up scan that adopted on its own: record what was recovered
 * (objs, bytes, time since t0_ns) and clear `recovering`. Returns the
 * seconds, for the engine's log line. */
double kvt_l2_recovery_done(kvt_l2 *l2, uint64_t objs, uint64_t bytes, uint64_t t0_ns);

/* ---- parked stores and draining, for engines with worker pools ------ */

struct kvt_job;
struct kvt_tpool;

/* Stores that wait for the start-up scan, so that the cap counts what the
 * backend already holds (lookups and loads are served meanwhile). Parked
 * jobs are chained through kvt_job.next: they are on no pool's queue.
 * Engines without a worker pool (resp, s3) park whole tasks instead,
 * chained through kvt_l2_task.next (they are on no done queue). */
struct kvt_l2_park {
    pthread_mutex_t lock; /* a leaf: guards the fields below */
    struct kvt_job *head; /* parked jobs, newest first */
    kvt_l2_task *tasks, *tasks_tail; /* parked tasks, oldest first */
    uint64_t n;           /* how many jobs and tasks are parked */
    bool parking;         /* set by the engine before its scan starts */
};
void kvt_l2_park_init(struct kvt_l2_park *p);
void kvt_l2_park_destroy(struct kvt_l2_park *p);
/* From a worker about to run a store job: park it while the scan runs and
 * return true (it runs later, from kvt_l2_park_release); false: run it. */
bool kvt_l2_park(struct kvt_l2_park *p, struct kvt_job *job);
/* The scan is done, or the adapter closes: stop parking and push what was
 * parked to pool, in submission order. */
void kvt_l2_park_release(struct kvt_l2_park *p, struct kvt_tpool *pool);
/* From the submit path of a store task: park it while the scan runs and
 * return true (the caller gets it back from kvt_l2_park_take); false: run
 * it. */
bool kvt_l2_park_task(struct kvt_l2_park *p, kvt_l2_task *t);
/* Take every parked task, oldest first, chained through next (NULL-ended),
 * for the caller to resubmit or fail; stop_parking: the scan is done or the
 * adapter closes. */
kvt_l2_task *kvt_l2_park_take(struct kvt_l2_park *p, bool stop_parking);
/* How many stores are parked now (status). */
uint64_t kvt_l2_parked(struct kvt_l2_park *p);

/* Batches in flight, so that close can wait until the last one finished
 * before it stops the pools their completions push to. */
struct kvt_l2_drain {
    pthread_mutex_t lock; /* a leaf: guards live */
    pthread_cond_t cond;  /* signalled when live reaches 0 */
    uint64_t live;
};
void kvt_l2_drain_init(struct kvt_l2_drain *d);
void kvt_l2_drain_destroy(struct kvt_l2_drain *d);
void kvt_l2_drain_enter(struct kvt_l2_drain *d); /* a batch starts */
void kvt_l2_drain_leave(struct kvt_l2_drain *d); /* a batch finished */
void kvt_l2_drain_wait(struct kvt_l2_drain *d);  /* until none is live */

/* Evict until used_bytes <= target, policy order, skipping pinned keys.
 * Returns bytes reclaimed. Used by the eviction controller. */
uint64_t kvt_l2_evict_to(kvt_l2 *l2, uint64_t target, uint32_t batch);
/* Quota pass of the eviction controller: every namespace at or over
 * trigger_watermark of its quota loses eviction_ratio of its bytes, in
 * policy order, its own objects only. Returns bytes reclaimed. */
uint64_t kvt_l2_evict_quotas(kvt_l2 *l2, uint32_t batch);

/* Index primitives: call with l2->lock held. */
struct kvt_l2_obj *kvt_l2_find_locked(kvt_l2 *l2, const kvt_key *ck);
uint32_t kvt_l2_handle_locked(kvt_l2 *l2, const struct kvt_l2_obj *o);
/* Change an indexed entry's stored bytes, keeping the adapter's, the
 * namespace's and the quota's counts in step. */
void kvt_l2_set_stored_locked(kvt_l2 *l2, struct kvt_l2_obj *o, uint32_t stored);

#endif
