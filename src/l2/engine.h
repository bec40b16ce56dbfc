/*
 * The L2 engine header: what an adapter's engine (a folder under src/l2)
 * and the base (the files of src/l2 itself) share. Nothing outside src/l2
 * includes it (white-box tests and benchmarks aside): controllers,
 * operations and the server see kvt_l2 as an opaque handle through l2.h
 * (the contract, accessors, stats) and l2/evict.h (the eviction passes).
 *
 * An engine fills a struct kvt_l2_ops, calls kvt_l2_base_init first in its
 * open function, keeps its own state in l2->engine, and uses the helpers
 * below (reserve/publish, pin, adopt, park, drain) instead of touching the
 * index; its status hook may read the struct under l2->lock.
 */
#ifndef KVT_L2_ENGINE_H
#define KVT_L2_ENGINE_H

#include "l2/l2.h"

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
    uint32_t nobjs;        /* live entries */
    uint32_t free_head;    /* free list threaded through objs[].aux, UINT32_MAX = empty */
    uint32_t hwm;          /* entries ever used (handles below this were allocated) */
    struct kvt_kindex map; /* key -> handle */
};

/* ---- eviction-policy hooks (implemented in policy/) ----------------- */

struct kvt_policy;
struct kvt_blocktag;
struct kvt_l2_early_tag; /* recover.c */

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
    /* Optional, for engines that talk to servers: fill up to max nodes and
     * return how many there are (struct kvt_l2_node). Must not block on
     * the network. */
    int (*nodes)(kvt_l2 *l2, struct kvt_l2_node *out, int max);
    /* Optional: the directory of cache object files this engine keeps
     * (kvt_l2_root). */
    void (*root)(kvt_l2 *l2, char *out, size_t cap);
    /* Stop engine threads after in-flight work completed; free the engine. */
    void (*close)(kvt_l2 *l2);
};

struct kvt_l2_lat_hist {
    _Atomic uint64_t count, sum_ns;
    _Atomic uint64_t bucket[KVT_L2_LAT_BUCKETS];
};

struct kvt_l2_counters {
    _Atomic uint64_t store_ok, store_failed, store_skipped, rejected_writes;
    _Atomic uint64_t lookups, lookup_hits, lookup_misses, secondary_hits;
    _Atomic uint64_t load_ok, load_failed, corrupt;
    _Atomic uint64_t bytes_written, bytes_read;
    _Atomic uint64_t deleted, evictions, reclaimed_bytes;
    _Atomic uint64_t sync_evictions; /* stores that evicted to fit under the cap */
    _Atomic uint64_t too_big;        /* stores refused: larger than a slot/object can hold */
    _Atomic uint64_t failovers;      /* remote tiers: another node took over a failed one's data */
    _Atomic uint64_t odirect_fallbacks;
    _Atomic uint64_t serde_mismatches; /* a serde-encoded object read without its chain */
    _Atomic uint64_t quota_rejections, quota_evictions; /* namespace quotas */
};

/* A quota: per namespace (name = kvt_ns_name, the sanitized model) or per
 * tenant (name = "@" + the cache salt). The list is built by
 * kvt_l2_base_init from the spec and grows at run time (kvt_l2_quota_set);
 * an entry is never removed, only turned off, so that the namespace ids
 * resolved to its index stay valid. Every field is guarded by l2->lock. */
struct kvt_l2_quota {
    char *name;
    uint64_t limit;    /* bytes */
    uint64_t used;     /* bytes of its namespaces' (its tenant's) entries */
    uint64_t rejected; /* writes refused by this quota */
    bool tenant;       /* name is "@salt" */
    bool off;          /* deleted at run time: counts, refuses nothing, not shown */
};

/* ---- filters: the base's one extension mechanism on the task path -----
 *
 * A filter sits between kvt_l2_submit and the engine of one adapter: the
 * serde stage (l2/stage.c: encode/decode around the engine) and fault
 * injection (l2/test/fault_inject.c: results dropped before publication)
 * are filters. Every hook is optional; ctx is the filter's own state.
 */
struct kvt_l2_filter_ops {
    const char *name;
    /* Take a STORE or LOAD task with n > 0 instead of the engine (at most
     * one filter of an adapter has this hook). The filter hands its own
     * tasks to the engine (ops->submit) with on_done set, and finishes t
     * with kvt_l2_task_finish; the base then treats t's backend bytes and
     * policy updates as done by those inner tasks. */
    void (*submit)(kvt_l2 *l2, void *ctx, kvt_l2_task *t);
    /* A controller's task about to be published: may clear result bits. */
    void (*finish)(kvt_l2 *l2, void *ctx, kvt_l2_task *t);
    /* Close, before the engine closes: no new task reaches it afterwards. */
    void (*quiesce)(kvt_l2 *l2, void *ctx);
    /* Close, after the engine closed and drained: release ctx. */
    void (*detach)(kvt_l2 *l2, void *ctx);
    /* Add the filter's object to the adapter's status. */
    void (*status)(kvt_l2 *l2, void *ctx, json_t *out);
};

#define KVT_L2_MAX_FILTERS 4

struct kvt_l2_filter {
    const struct kvt_l2_filter_ops *ops;
    void *ctx;
};

/* Attach a filter before the first submit. Returns 0, -EEXIST when ops
 * has a submit hook and another filter already has one, -ENOSPC when
 * KVT_L2_MAX_FILTERS are attached. */
int kvt_l2_filter_attach(kvt_l2 *l2, const struct kvt_l2_filter_ops *ops, void *ctx);

struct kvt_l2 {
    const struct kvt_l2_ops *ops;
    char type[32];
    char name[48]; /* "fs[0]" */
    int index;
    int efd[3]; /* eventfds, one per enum kvt_l2_kind */
    enum kvt_codec codec;

    pthread_mutex_t lock; /* guards everything below up to 'counters' */
    struct kvt_l2_index idx;
    uint64_t cap_bytes;    /* hard cap; 0 = unlimited */
    uint64_t used_bytes;   /* READY + WRITING + DELETING entries */
    uint64_t *ns_bytes;    /* per namespace id */
    uint32_t *ns_objs;     /* per namespace id: entries counted in used_bytes */
    uint32_t ns_bytes_cap; /* of both */
    /* running totals over the same entries (kept by the accounting, so
     * that stats never walk the index): logical bytes and backend bytes of
     * those whose logical length is known, entries whose length is not
     * (restored by a scan, header unread), entries with a pin */
    uint64_t logical_bytes, stored_known, logical_unknown, pinned_objs;
    struct kvt_l2_quota *quotas; /* nquotas entries (grows; never shrinks) */
    uint32_t nquotas;
    /* ns id -> 0 unresolved, 1 no quota, 2 + quota index: the namespace
     * quota (ns_quota) and the tenant quota (ns_tquota) of each id */
    uint32_t *ns_quota, *ns_tquota;
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
    _Atomic uint64_t too_big_limit; /* the most an object may have, once one was refused */
    void *engine;                   /* engine state */
    /* filters on the task path (kvt_l2_filter_attach), attached before the
     * first submit and detached by kvt_l2_close after the engine closed;
     * taker: the one filter with a submit hook, or -1 */
    struct kvt_l2_filter filters[KVT_L2_MAX_FILTERS];
    int nfilters, taker;
    /* a byte budget shared with other servers (l2/budget.h), attached by
     * the engine at open; NULL: the cap counts this server's index only */
    struct kvt_l2_budget *budget;
    /* tier events (kvt_l2_set_event_hook), guarded by lock: called under it
     * when an entry becomes READY and when a READY or DELETING entry leaves
     * the index; fn NULL: none */
    struct kvt_tier_hook ev;
    /* engine block hashes (key/blocktag.h): keep_tags (the spec's, fixed
     * at init): the server publishes KV events, so a scan reads the tags
     * its objects were written with (kvt_l2_give_tag); those given before
     * the hook was set wait in early (guarded by lock) until it is */
    bool keep_tags;
    struct kvt_l2_early_tag *early;
    uint32_t nearly, early_cap;
};

struct kvt_l2_spec;

/* Base setup for an engine's constructor: name, eventfds, lock, index, and
 * the spec's common keys (persist_enabled, eviction policy). Call it before
 * starting any engine thread. */
int kvt_l2_base_init(kvt_l2 *l2, const struct kvt_l2_ops *ops, const struct kvt_l2_spec *spec,
                     enum kvt_codec codec, uint64_t cap_bytes);
void kvt_l2_base_destroy(kvt_l2 *l2);

/* ---- helpers for engines --------------------------------------------- */

/* Canonical form of a key for this adapter's names. */
static inline void kvt_l2_canon(const kvt_l2 *l2, const kvt_key *in, kvt_key *out)
{
    kvt_key_canon(l2->codec, in, out);
}

/* A store of len bytes that this adapter can never hold (max bytes per
 * object or slot): count it (too_big, store_failed), warn once naming the
 * limit and the config key (what), and fail key i of t with KVT_E_TOOBIG.
 * The status' health line says it from then on. */
void kvt_l2_too_big(kvt_l2 *l2, kvt_l2_task *t, uint32_t i, uint64_t len, uint64_t max,
                    const char *what);
/* Mark the task finished (release) and queue it for the controller. */
void kvt_l2_task_finish(kvt_l2 *l2, kvt_l2_task *t);
/* Record one key's result; called from any engine thread. */
void kvt_l2_task_ok(kvt_l2_task *t, uint32_t i, uint64_t bytes);
void kvt_l2_task_fail(kvt_l2_task *t, uint32_t i, int err);
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
/* The write failed: drop the reservation. With a shared budget its bytes
 * are given back: call it only when the write certainly did not land (a
 * tmp file removed before its rename, a refusal from the server). */
void kvt_l2_unreserve(kvt_l2 *l2, const kvt_key *ck);
/* The write failed in a way that may still have landed it, or may land it
 * later (a connection lost mid-request): drop the reservation like
 * kvt_l2_unreserve, but with a shared budget keep its bytes charged and
 * pending for KVT_BUDGET_UNSURE_HOLD_S (an over-count, never an
 * under-count: a recount meanwhile counts them, in case they land after
 * its walk). Without a shared budget: kvt_l2_unreserve. */
void kvt_l2_unreserve_unsure(kvt_l2 *l2, const kvt_key *ck);
/* A reserved object turned out bytes smaller than reserved (the engine
 * corrected its entry with kvt_l2_obj_set_stored_locked): with a shared
 * budget, give them back. No-op otherwise. */
void kvt_l2_budget_shrunk(kvt_l2 *l2, uint32_t bytes);

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
/* The same for an object whose header holds engine block hashes (tag,
 * kvt_objhdr_tag; NULL: none): given to the tier events before the object
 * is announced (kvt_l2_give_tag), dropped when the key is indexed already.
 * Takes the caller's reference. */
bool kvt_l2_adopt_tag(kvt_l2 *l2, const kvt_key *ck, struct kvt_blocktag *tag, uint32_t stored,
                      uint32_t len, uint32_t aux, uint8_t flags, bool pin, bool at_cold_end);
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
/* Tell the policy these keys were read. */
void kvt_l2_touch(kvt_l2 *l2, const kvt_key *ck, uint32_t n);
void kvt_l2_set_recovering(kvt_l2 *l2, bool on);

/* What a start-up scan found, collected before adopting it in one go. */
struct kvt_l2_found {
    kvt_key key; /* canonical */
    int64_t mtime_ns;
    uint32_t stored, len, aux;
    uint8_t flags;
    struct kvt_blocktag *tag; /* the tag its header holds (a reference), or NULL */
};
struct kvt_l2_found_vec {
    struct kvt_l2_found *v;
    size_t n, cap;
    uint64_t corrupt; /* object names found holding no valid object (removed) */
};
void kvt_l2_found_push(struct kvt_l2_found_vec *fv, const kvt_key *ck, uint32_t stored,
                       uint32_t len, uint32_t aux, uint8_t flags, int64_t mtime_ns);
/* The engine block hashes an object's header holds (kvt_objhdr_tag), read
 * by a scan before it adopts the object: they name it in the tier events
 * (given to the hook's tag before the object is announced). Takes the
 * caller's reference (tag may be NULL: nothing). Without keep_tags the tag
 * is dropped. */
void kvt_l2_give_tag(kvt_l2 *l2, const kvt_key *ck, struct kvt_blocktag *tag);
/* The tag kept for ck (a new reference) for a write's header, or NULL (no
 * events, or no tag). */
struct kvt_blocktag *kvt_l2_tag_of(kvt_l2 *l2, const kvt_key *ck);

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
    pthread_mutex_t lock;            /* a leaf: guards the fields below */
    struct kvt_job *head;            /* parked jobs, newest first */
    kvt_l2_task *tasks, *tasks_tail; /* parked tasks, oldest first */
    uint64_t n;                      /* how many jobs and tasks are parked */
    bool parking;                    /* set by the engine before its scan starts */
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

/* ---- walks over the index (cursor scans, as Valkey's hashtableScan) -- */

/* Visit the live entries (not FREE) from handle *cursor on, under
 * l2->lock, until visit returns false or the index ends; *cursor is where
 * the next call goes on (start at 0). visit runs with the lock held: it
 * must not call back into the base, and o is valid only during the call.
 * Returns true when the walk reached the end. An engine never walks
 * l2->idx itself. */
bool kvt_l2_index_scan(kvt_l2 *l2, uint32_t *cursor,
                       bool (*visit)(const struct kvt_l2_obj *o, void *arg), void *arg);
/* The keys of every live entry, copied in one lock hold (for work on the
 * backend done without the lock): an array of *n keys to free(). */
kvt_key *kvt_l2_index_keys(kvt_l2 *l2, uint32_t *n);

/* Index primitives: call with l2->lock held. */
/* An engine that learns an indexed entry's logical length or its exact
 * backend size late (a header read after a scan) records it here, so that
 * every total (used, per namespace, quotas, logical) stays exact. */
void kvt_l2_obj_set_len_locked(kvt_l2 *l2, struct kvt_l2_obj *o, uint32_t len);
void kvt_l2_obj_set_stored_locked(kvt_l2 *l2, struct kvt_l2_obj *o, uint32_t stored);
/* Pin a READY entry the engine found (it checked pins < UINT16_MAX). */
void kvt_l2_obj_pin_locked(kvt_l2 *l2, struct kvt_l2_obj *o);
struct kvt_l2_obj *kvt_l2_find_locked(kvt_l2 *l2, const kvt_key *ck);
uint32_t kvt_l2_handle_locked(kvt_l2 *l2, const struct kvt_l2_obj *o);

#endif
