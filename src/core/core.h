/*
 * The core: the one road into the tiers. It owns L1, the L2 set, the store
 * and prefetch controllers, the eviction controllers and the worker pool,
 * and offers the calls every front end needs (fetch a prefix, copy a store
 * in, reserve and commit a write, touch, leases, delete, purge). A front
 * end (src/front/<protocol>/) calls only these: it never includes l1/,
 * ctrl/ or evict/ headers and never calls their functions
 * (scripts/check-layers.py checks both). The server sets the core up, tears
 * it down and reads its parts for status and metrics.
 *
 * Opaque types: struct kvt_core.
 * Non-opaque types, from l1/l1.h and ctrl/store_ctrl.h, which this header
 * includes for them: struct kvt_l1_ref (a referenced object: handle, pool
 * offset, pointer, meta), struct kvt_l1_owner (whose a lease is), struct
 * kvt_l1_shm, enum kvt_lease_kind, struct kvt_store_failure.
 *
 * Threads: every call may be made from any thread unless it says
 * otherwise; L1 and the controllers take their own locks. Set-up and
 * tear-down calls are the server's main thread's.
 */
#ifndef KVT_CORE_H
#define KVT_CORE_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>

#include <jansson.h>

#include "core/events.h"
#include "ctrl/prefetch_ctrl.h"
#include "ctrl/store_ctrl.h"
#include "io/tpool.h"
#include "l1/l1.h"
#include "l2/adapters.h"
#include "l2/l2.h"
#include "ops/purge.h"

struct kvt_core;

#define KVT_MAX_ADAPTERS 16 /* L2 adapters of one server */

struct kvt_core_opts {
    const struct kvt_l2_spec *adapters; /* opened in order: adapter i is index i */
    int nadapters;
    struct kvt_l1_opts l1;
    enum kvt_store_policy store_policy;
    enum kvt_prefetch_policy prefetch_policy;
    int prefetch_max_in_flight;
    int eviction_interval_ms;
    int max_workers; /* the worker pool ("rpc-worker") */
    /* called on the store-ctrl thread when store batches finish (flushes
     * may be answerable): it must only wake someone */
    void (*on_store_progress)(void *arg);
    void *progress_arg;
    /* tier events (core/events.h): L1 and every adapter announce into it
     * from open on; NULL: no events */
    struct kvt_events *events;
};

/* ---- set-up and tear-down (the server, main thread) ---- */

/* Create the core and open its L2 adapters (each locks its directory or
 * device; recovery scans start in the background). o must outlive the
 * core. On failure err says why; the core is still returned in *out for
 * kvt_core_close. 0 or the adapter's error. */
int kvt_core_open(const struct kvt_core_opts *o, struct kvt_core **out, char *err, size_t cap);
/* Then L1, the controllers, the eviction threads and the worker pool.
 * 0, or the error with err filled ("L1: ..." or the threads'). */
int kvt_core_start(struct kvt_core *c, char *err, size_t cap);
/* Shutdown, in this order (the server interleaves its own steps):
 * stop_fetching: the worker pool finishes its queued jobs, the prefetch
 * controller stops (no prefetch callback runs after it);
 * drain_stores: every store batch submitted finishes on every adapter;
 * stop: the store controller and the eviction threads end;
 * close: adapters close, L1 goes, c is freed. Each is safe on a core
 * that started only in part. */
void kvt_core_stop_fetching(struct kvt_core *c);
void kvt_core_drain_stores(struct kvt_core *c);
void kvt_core_stop(struct kvt_core *c);
void kvt_core_close(struct kvt_core *c);

/* ---- the parts, for the server's status and metrics ---- */

struct kvt_l1 *kvt_core_l1(struct kvt_core *c);
int kvt_core_nl2(const struct kvt_core *c);
kvt_l2 *kvt_core_l2(struct kvt_core *c, int i);
struct kvt_store_ctrl *kvt_core_store_ctrl(struct kvt_core *c);
struct kvt_prefetch_ctrl *kvt_core_prefetch_ctrl(struct kvt_core *c);
uint64_t kvt_core_workers_queued(struct kvt_core *c);

/* ---- what the front ends call ---- */

/* The L1 pool as clients map it (fd, size, ids) and its id. */
void kvt_core_shm(struct kvt_core *c, struct kvt_l1_shm *shm);
uint64_t kvt_core_pool_id(const struct kvt_core *c);
/* adapter i's name ("?" when there is none) */
const char *kvt_core_l2_name(struct kvt_core *c, int i);

/* Run job on the worker pool (bulk copies, deletes, purges: work that may
 * block the caller's loop). */
void kvt_core_defer(struct kvt_core *c, struct kvt_job *job);

/*
 * Fetch the longest available prefix of keys[0..n): first from L1, then,
 * when L1 holds only refs[0..*m) and there are L2 adapters, the rest
 * through the prefetch controller (L2 -> L1). note: the request is a
 * lookup (the eviction policy learns from it). Returns true when *m
 * references in refs are the answer; false when keys[*m..n) went to the
 * prefetch controller: done(arg, k, krefs) then runs once, on the prefetch
 * thread, with the k references that followed (krefs malloc'd, the
 * callee's); *m is set before the prefetch is submitted, and keys are
 * copied. Every reference is the caller's (kvt_core_put, or moved into a
 * lease).
 */
bool kvt_core_fetch(struct kvt_core *c, const kvt_key *keys, uint32_t n, bool note,
                    struct kvt_l1_ref *refs, uint32_t *m, kvt_prefetch_cb done, void *arg);

/*
 * Copy a store in: object i (data[i], meta with its len) into L1 under
 * keys[i], published, and submitted to L2 for client (a nonzero tag names
 * the connection whose flush waits for it; 0: none). codes[i] (zeroed by
 * the caller) gets the refusal of an object that was not taken
 * (KVT_E_FULL, KVT_E_TOOBIG, ...). tags (NULL: none): object i's engine
 * block hashes, given to the tier events (kvt_core_tag) when the object is
 * stored now; the references stay the caller's. Returns how many were
 * accepted: stored now, or already there (content-addressed).
 */
uint32_t kvt_core_store(struct kvt_core *c, const kvt_key *keys, uint32_t n,
                        const struct iovec *data, const kvt_objmeta *meta, uint64_t client,
                        struct kvt_blocktag *const *tags, int32_t *codes);
/* The engine's block hashes of key (key/blocktag.h), for the tier events
 * (core/events.h: kvt_events_tag): give them before the key is published
 * (after kvt_core_reserve, before kvt_core_commit). Takes the caller's
 * reference; without events the tag is dropped. */
void kvt_core_tag(struct kvt_core *c, const kvt_key *key, struct kvt_blocktag *tag);

/* Reserve an L1 slot for key (meta->len bytes) for a client to write into
 * (a write lease holds it): 0 and *ref, -EEXIST when the key is present,
 * or the refusal (KVT_E_TOOBIG, KVT_E_FULL). */
int kvt_core_reserve(struct kvt_core *c, const kvt_key *key, const kvt_objmeta *meta,
                     struct kvt_l1_ref *ref);
/*
 * Commit a write: end the write lease, publishing the slots whose bit is
 * set in written (one bit per slot in lease order; NULL: all) and dropping
 * the rest, then submit what was published to L2 for client (as
 * kvt_core_store). nslots: the lease's size. Returns how many were
 * published, KVT_E_EXPIRED or KVT_E_LEASE_OWNER (nothing done).
 */
int kvt_core_commit(struct kvt_core *c, uint64_t lease, const struct kvt_l1_owner *owner,
                    const uint64_t *written, uint32_t nslots, uint64_t client);

/* An object present in L1 now, with a reference (0), else -ENOENT. */
int kvt_core_get(struct kvt_core *c, const kvt_key *key, struct kvt_l1_ref *ref);
/* Drop one reference. */
void kvt_core_put(struct kvt_core *c, uint32_t h);
/* One use of each object (the eviction policy's order). */
void kvt_core_touch(struct kvt_core *c, const uint32_t *hs, uint32_t n);

/* Leases (l1/l1.h has the full contract of each): new moves n references
 * into a lease of owner; handles copies a live lease's handles; end_read
 * ends a read lease; drop ends either kind with nothing published; take
 * serves a retrieve of keys from a lookup's read lease. */
uint64_t kvt_core_lease_new(struct kvt_core *c, enum kvt_lease_kind kind, const uint32_t *hs,
                            uint32_t n, const struct kvt_l1_owner *owner);
int kvt_core_lease_handles(struct kvt_core *c, uint64_t id, enum kvt_lease_kind kind,
                           const struct kvt_l1_owner *owner, uint32_t *hs, uint32_t cap);
int kvt_core_lease_end_read(struct kvt_core *c, uint64_t id, const struct kvt_l1_owner *owner);
int kvt_core_lease_drop(struct kvt_core *c, uint64_t id, const struct kvt_l1_owner *owner);
int kvt_core_lease_take(struct kvt_core *c, uint64_t id, const struct kvt_l1_owner *owner,
                        const kvt_key *keys, uint32_t n, struct kvt_l1_ref *refs);

/*
 * Delete keys[0..n) from every tier (blocking: a worker calls it). A key
 * read-locked by a lease (lookup -> retrieve) is skipped in every tier: it
 * stays whole, and its index goes to skipped[(*nskip)++]. keys is
 * compacted in place to the keys deleted. removed_l2[a]: objects removed
 * from adapter a (kvt_core_nl2 entries). Returns the objects removed from
 * L1.
 */
uint32_t kvt_core_delete(struct kvt_core *c, kvt_key *keys, uint32_t n, uint32_t *removed_l2,
                         uint32_t *skipped, uint32_t *nskip);

/*
 * Purge through the adapters that keep their files in root (NULL or "":
 * every adapter), blocking (a worker calls it); purged keys leave L1 too.
 * All or none: while a selected adapter's start-up scan runs, nothing is
 * purged. On success *out = {adapters: [{adapter, ...counts}], more}.
 * Returns 0, KVT_E_NOTFOUND (no adapter keeps its files in root), -EBUSY
 * (a scan is running), or the first adapter's error (-errno).
 */
int kvt_core_purge(struct kvt_core *c, const char *root, struct kvt_purge_req *q, json_t **out);

/* Empty L1 of every object nobody holds. Returns the bytes freed. */
uint64_t kvt_core_clear_l1(struct kvt_core *c);

/* Flushes (the store controller's per-client accounting, ctrl/store_ctrl.h):
 * park a flush of client's until its stores finished (false) or answer it
 * now (true); take the flushes whose stores finished; take the client's
 * store failures. */
bool kvt_core_flush_wait(struct kvt_core *c, uint64_t client, void *cookie);
size_t kvt_core_take_flushed(struct kvt_core *c, void **out, size_t max);
uint64_t kvt_core_take_failures(struct kvt_core *c, uint64_t client, uint32_t max,
                                struct kvt_store_failure **out, uint32_t *listed);

#endif
