/*
 * The operator's calls on a running core (docs/operations.md, "The admin
 * API"): list objects, delete by keys or by name prefix, clear a tier,
 * quotas at run time, pin and unpin, and the background jobs warm (L2 ->
 * L1) and verify (re-read L2 objects, remove the corrupt ones). The
 * server's HTTP admin endpoints (src/server/admin_http.c) translate
 * requests into these calls; nothing here knows HTTP.
 *
 * Tiers are numbered as the calls take them: KVT_ADMIN_L1 for the memory
 * tier, 0..nl2-1 for the L2 adapters, KVT_ADMIN_ALL for every tier.
 *
 * Removals go through the tiers' own removal paths (kvt_core_delete,
 * kvt_l2_delete, kvt_core_clear_l1), so whatever those paths report
 * (counters, events) reports them too.
 *
 * Errors: 0, or -EINVAL (bad input, *err says what), -ENOENT (unknown keys,
 * namespace, quota, job; *err names it), -EOVERFLOW (a quota below the use,
 * pins over their bound), -EBUSY (a job of that kind runs), -ENOSPC,
 * -EIO (a quotas file could not be written: nothing changed). Every call
 * that changes data is logged and counted (struct kvt_admin_stats).
 *
 * Opaque types: struct kvt_admin. Non-opaque: the option, filter and
 * stats structs below.
 *
 * Threads: every call may come from any thread (the HTTP server's); they
 * block on the tiers (a worker's kind of work). One thread of its own,
 * "admin", runs the jobs, one at a time, in the order they were asked.
 */
#ifndef KVT_CORE_ADMIN_H
#define KVT_CORE_ADMIN_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "core/core.h"

#define KVT_ADMIN_L1 (-1)
#define KVT_ADMIN_ALL (-2)
#define KVT_ADMIN_MAX_KEYS 65536 /* keys in one request */
#define KVT_ADMIN_MAX_LIST 10000 /* objects in one page of a listing */

struct kvt_admin;

struct kvt_admin_opts {
    uint64_t max_pinned_bytes; /* the most pinned bytes (L1 payload) at once */
    /* adapter i's quotas file (absolute), where quotas set at run time are
     * written; NULL: the adapter has none, and its quotas cannot change */
    const char *quotas_files[KVT_MAX_ADAPTERS];
};

/* Counters (since start) and totals (now), rendered by status and
 * metrics. */
struct kvt_admin_stats {
    uint64_t deletes, deleted_objects; /* delete requests; objects they removed (every tier) */
    uint64_t clears, cleared_objects, cleared_bytes;
    uint64_t quota_sets, quota_deletes;
    uint64_t pins, unpins; /* keys pinned, unpinned */
    uint64_t warm_jobs, warmed_objects;
    uint64_t verify_jobs, verified_objects, corrupt_found, corrupt_removed;
    uint64_t pinned_objects, pinned_bytes, max_pinned_bytes; /* now */
};

/* Start the admin calls and their job thread on a running core. o is
 * copied. 0 or -errno. */
int kvt_admin_open(struct kvt_core *c, const struct kvt_admin_opts *o, struct kvt_admin **out);
/* Stop: the running job ends at its next batch, queued ones are dropped,
 * the thread is joined and every pin released. Before the core stops. */
void kvt_admin_close(struct kvt_admin *a);

/* "l1" or an adapter's name ("fs[0]") -> a tier; -ENOENT. */
int kvt_admin_tier(struct kvt_admin *a, const char *name);
/* Has this server ever seen the namespace name (a key of it stored,
 * looked up, or found by a start-up scan)? */
bool kvt_admin_ns_known(const char *ns);

/* ---- listing ---- */

struct kvt_admin_filter {
    const char *model, *salt, *ns, *prefix; /* NULL: any; salt "": no salt */
    int tier;                               /* KVT_ADMIN_ALL, KVT_ADMIN_L1 or an adapter */
};
/* One page of at most limit objects matching f from cursor on (NULL or
 * "": the start): *out = {objects: [...], next_cursor: "..." or null}.
 * -EINVAL for a cursor this server never gave. */
int kvt_admin_list(struct kvt_admin *a, const struct kvt_admin_filter *f, const char *cursor,
                   uint32_t limit, json_t **out, char *err, size_t cap);

/* ---- removals ---- */

/* Delete keys from every tier (pins on them released first). Every key
 * must be held by some tier: otherwise -ENOENT, nothing deleted, and *out
 * = {unknown: [names]}. Keys read-locked by a client's lookup are left and
 * listed. */
int kvt_admin_delete(struct kvt_admin *a, kvt_key *keys, uint32_t n, json_t **out, char *err,
                     size_t cap);
/* Delete every object whose name (kvt_admin_list's "name") starts with
 * prefix, from every tier. -ENOENT when none does. */
int kvt_admin_delete_prefix(struct kvt_admin *a, const char *prefix, json_t **out, char *err,
                            size_t cap);
/* Empty one tier (pinned objects and objects in use stay, counted). */
int kvt_admin_clear(struct kvt_admin *a, int tier, json_t **out, char *err, size_t cap);

/* ---- quotas (name: a namespace name, or "@" + a cache salt) ---- */

/* adapter: an L2 index, or KVT_ADMIN_ALL (every adapter). */
int kvt_admin_quota_get(struct kvt_admin *a, const char *name, int adapter, json_t **out, char *err,
                        size_t cap);
int kvt_admin_quota_set(struct kvt_admin *a, const char *name, uint64_t bytes, int adapter,
                        json_t **out, char *err, size_t cap);
int kvt_admin_quota_del(struct kvt_admin *a, const char *name, int adapter, json_t **out, char *err,
                        size_t cap);

/* ---- pins ---- */

/* Pin keys: each is brought into L1 (from L2 when only there) and held
 * there and in every L2 adapter that has it, so that no eviction takes
 * it, until unpinned. All or none: an unknown key (-ENOENT), pinned bytes
 * over the bound (-EOVERFLOW) or a key that cannot be brought into L1
 * (-ENOSPC) pins nothing. */
int kvt_admin_pin(struct kvt_admin *a, const kvt_key *keys, uint32_t n, json_t **out, char *err,
                  size_t cap);
/* Unpin keys; -ENOENT (nothing changed) when one is not pinned. */
int kvt_admin_unpin(struct kvt_admin *a, const kvt_key *keys, uint32_t n, json_t **out, char *err,
                    size_t cap);
/* The pinned keys: {objects: [...], pinned_bytes, max_pinned_bytes}. */
json_t *kvt_admin_pins(struct kvt_admin *a);

/* ---- jobs ---- */

/* Warm keys (n > 0) or a namespace's objects (ns) from L2 into L1, in the
 * background. *out = the job's object ({id, kind, state, ...}). */
int kvt_admin_warm(struct kvt_admin *a, const kvt_key *keys, uint32_t n, const char *ns,
                   json_t **out, char *err, size_t cap);
/* Verify the objects of one L2 adapter (tier) or of all (KVT_ADMIN_ALL),
 * all of them or one namespace's (ns), in the background: each is read
 * and checked as a load checks it; a corrupt one is removed (the engine
 * does it, as on any load) and counted. */
int kvt_admin_verify(struct kvt_admin *a, int tier, const char *ns, json_t **out, char *err,
                     size_t cap);
/* A job's object, or NULL for an id never given (or long forgotten). */
json_t *kvt_admin_job(struct kvt_admin *a, uint64_t id);

/* ---- status ---- */

void kvt_admin_stats(struct kvt_admin *a, struct kvt_admin_stats *out);
/* {pinned_objects, pinned_bytes, max_pinned_bytes, counters, jobs: [...]} */
json_t *kvt_admin_status(struct kvt_admin *a);

#endif
