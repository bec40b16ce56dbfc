/*
 * A byte budget shared by several kvtier servers on one L2 ("shared_budget":
 * true, docs/remote-tiers.md "Two kvtier servers sharing one L2"): the cap
 * is checked against one record of the whole tier's bytes instead of this
 * server's index. The base keeps the rules (what to charge, refund and
 * subtract, and when); a record backend keeps the numbers where every
 * server sees them: a locked file in a shared directory (l2/kit/budget_file.h)
 * or a hash on a Redis server (l2/resp/resp_budget.c).
 *
 * The record holds total (bytes of the tier, an upper bound), adds (every
 * byte ever charged: it only grows), epoch (bumped by each recount) and one
 * entry per server: part (its net bytes: charged - refunded - removed) and
 * pending (bytes it charged whose write may still land: an upper bound).
 *
 *   take     charge bytes before a write, all or nothing:
 *            refused when total + take > cap
 *   refund   a charged write certainly never landed: total and pending drop
 *   removed  this server removed an object (unlink / UNLINK said it removed
 *            something): total drops, unless a recount ended since the
 *            server last read the epoch (removed_epoch): the recount
 *            already counted the tier without it, and subtracting again
 *            would under-count
 *   settled  charged writes that are over (landed; or unanswered, once
 *            KVT_BUDGET_UNSURE_HOLD_S passed: until then they may still
 *            land): pending drops; reported lazily with the next operation
 *   recount  begin: snapshot adds and the live servers' pending; walk the
 *            tier (the engine's scan) to `walked` bytes; end: total =
 *            walked + (adds since the snapshot) + the snapshot's pending,
 *            epoch + 1, dead servers' entries folded away. Never below the
 *            tier's bytes: an object present for the whole walk is in
 *            walked, one written during it was charged before (pending) or
 *            during it (adds).
 *
 * Every change that can make total lower than the tier's real bytes is
 * excluded by construction: a crash leaves an over-count (a charged write
 * that never landed, a removal not yet subtracted), which the next recount
 * (a server's start-up scan) corrects.
 */
#ifndef KVT_L2_BUDGET_H
#define KVT_L2_BUDGET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "l2/l2.h"

/* How long a write whose fate is unknown (no answer from the backend) is
 * still counted as one that may land: its bytes are settled after this
 * many to twice as many seconds (budget.c, kvt_l2b_budget_unsure). */
#define KVT_BUDGET_UNSURE_HOLD_S 60

/* One operation on the record (every field may be 0). */
struct kvt_budget_req {
    uint64_t take;          /* charge, all or nothing */
    uint64_t refund;        /* charged bytes that never landed */
    uint64_t removed;       /* bytes this server removed from the tier */
    uint64_t removed_epoch; /* the record's epoch when that removal began */
    uint64_t settled;       /* charged bytes whose writes are over */
    uint64_t inflight;      /* an upper bound of this server's charged writes still
                             * in flight (credit too), take included, read
                             * before settled: with refund and settled what the
                             * record gets back when it has no entry for it
                             * (folded as dead while it lived, a rebuilt record) */
    uint64_t cap;           /* this server's cap (bytes) */
};

/* What the record said after an operation. */
struct kvt_budget_view {
    int64_t total;    /* the tier's bytes (upper bound) */
    int64_t part;     /* this server's net part */
    uint64_t pending; /* this server's pending bytes */
    uint64_t adds, epoch, recounts;
    uint64_t cap;    /* the cap the record was created with */
    uint32_t nodes;  /* live servers with an entry, this one included */
    uint32_t folded; /* dead servers' entries folded by this operation */
    bool granted;    /* take was charged */
    bool removed_ok; /* removed was subtracted (false: a recount came first) */
    bool rejoined;   /* this server had no entry (first use or presumed dead) */
};

/* A recount's starting point. */
struct kvt_budget_snap {
    uint64_t adds;    /* adds at the snapshot */
    uint64_t pending; /* sum of the live servers' pending */
    uint64_t epoch;
    uint64_t created; /* the record's created_ms: another at the end is a rebuilt record */
};

/* A record backend. Each function is one atomic step on the shared record
 * (a file lock held across read-modify-write, a Lua script): 0 or -errno /
 * a kvtier error, with a message for status in err where it has one. They
 * may block on I/O; the base never calls them with l2->lock held. */
struct kvt_budget_rec_ops {
    const char *kind; /* "file", "redis" */
    int (*apply)(void *rec, const struct kvt_budget_req *rq, struct kvt_budget_view *out, char *err,
                 size_t errcap);
    /* begin and end: inflight is the server's charged bytes in flight
     * (credit included), what it holds if the step rejoins it */
    int (*begin)(void *rec, uint64_t inflight, struct kvt_budget_snap *snap, char *err,
                 size_t errcap);
    int (*end)(void *rec, uint64_t inflight, const struct kvt_budget_snap *snap, uint64_t walked,
               struct kvt_budget_view *out, char *err, size_t errcap);
    /* Where the record lives ("file:/mnt/kv/.kvtier-budget"), for status. */
    void (*where)(void *rec, char *out, size_t cap);
    /* Close: drop this server's entry (its part folds into the total), free rec. */
    void (*leave)(void *rec);
};

/* Attach a record to an adapter opened with a cap and "shared_budget": the
 * base then charges every reservation against it, and leaves the record
 * (ops->leave) when l2 is destroyed. Call from the engine's open before any
 * store can run; no I/O. Before its start-up scan walks the tier the engine
 * calls kvt_l2_budget_recount_begin; kvt_l2_finish_recovery (or the engine,
 * kvt_l2_budget_recount_end) completes the recount with what it found. */
int kvt_l2_budget_attach(kvt_l2 *l2, const struct kvt_budget_rec_ops *ops, void *rec, char *err,
                         size_t errcap);
/* Leave the record now (an engine whose record uses its connections
 * calls it in its close, after its last store and removal, before it frees
 * them); otherwise destroying l2 leaves it. No-op without one. */
void kvt_l2_budget_detach(kvt_l2 *l2);
/* Is a shared budget attached? */
bool kvt_l2_budget_on(const kvt_l2 *l2);
/* A walk of the whole tier starts now: the recount's snapshot (a new one
 * replaces an older). 0, or the record's error (then no recount follows:
 * the walk's end leaves the total alone), with err (may be NULL). */
int kvt_l2_budget_recount_begin(kvt_l2 *l2, char *err, size_t errcap);
/* The walk since the last snapshot found `walked` bytes of objects: set the
 * record's total from it. complete false: the walk may have missed objects
 * (a topology change, an aborted scan): the snapshot is dropped, the total
 * left as it was. No-op without a snapshot. */
void kvt_l2_budget_recount_end(kvt_l2 *l2, uint64_t walked, bool complete);

#endif
