/*
 * L2 base: a byte budget shared by several servers (budget.h has the
 * rules). The base charges, refunds, settles and subtracts through the
 * record backend an engine attached; l2.c (reserve, publish, unreserve)
 * and remove.c (removals, eviction to make room) call the helpers below
 * (base_int.h).
 *
 * Credit: a store charges the record for its bytes plus a chunk (cap/64,
 * at most 4 MiB, when the object is smaller) and keeps the rest as local
 * credit, which the next stores use without a step; a write that
 * certainly failed gives its bytes back to the credit. To the record,
 * credit is charged bytes whose write has not landed: pending, counted in
 * the total, so the cap and the recount hold as without it. Credit is
 * given back (refunded) when a periodic step finds none of it used since
 * the last one, when a store is refused (the others may need it), and at
 * close.
 *
 * Locks: b->lock is a leaf guarding the cached view, the recount snapshot
 * and the counters; it is never held across a record step. Record steps
 * run without l2->lock (they may block on the record's I/O: a file lock, a
 * Redis round trip); their backend serializes them itself.
 */
#include "l2/base_int.h"
#include "l2/budget.h"
#include "l2/evict.h"
#include "common/log.h"
#include "common/util.h"
#include "kvtier/error.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct kvt_l2_budget {
    const struct kvt_budget_rec_ops *ops;
    void *rec;
    uint64_t cap;
    /* charged bytes of writes in flight (reserved, not yet published or
     * dropped): the record's pending for this server when it rejoins */
    _Atomic uint64_t inflight;
    /* charged bytes whose writes are over, to report with the next step
     * (the record's pending only ever over-states) */
    _Atomic uint64_t settled;
    uint64_t chunk;       /* credit taken with a store (0: none) */
    pthread_mutex_t lock; /* a leaf: guards the fields below */
    uint64_t credit;      /* charged, not yet given to a write */
    /* writes whose fate is unknown, still in flight (they may land):
     * unsure_new since unsure_ns, unsure_old the period before; each
     * periodic step at least KVT_BUDGET_UNSURE_HOLD_S after unsure_ns
     * settles unsure_old and ages unsure_new */
    uint64_t unsure_new, unsure_old, unsure_ns;
    bool credit_used;            /* since the last periodic step */
    struct kvt_budget_view view; /* the last step's answer */
    bool have_view;
    uint64_t view_ns;
    bool last_ok;                /* the last record step answered */
    bool skip_warned;            /* watermark eviction is skipped (logged once) */
    uint64_t refresh_ns;         /* the last periodic step (an eviction cycle) */
    uint64_t refresh_gap;        /* ns between the last two: the eviction interval */
    struct kvt_budget_snap snap; /* the recount in progress */
    bool snap_valid;
    uint64_t snap_ns;
    uint64_t steps, step_errors, refused, refunded_bytes, removed_bytes, removed_dropped;
    uint64_t rejoins, recounts, recounts_skipped;
    uint64_t last_walked;
    int64_t last_before, last_after;
    double last_seconds;
    char last_error[256];
    char where[300];
};

bool kvt_l2_budget_on(const kvt_l2 *l2)
{
    return l2->budget != NULL;
}

/* One record step with this server's figures; the view is cached for
 * status, the eviction trigger and the removal epoch. */
static int step(kvt_l2 *l2, struct kvt_budget_req *rq, struct kvt_budget_view *v)
{
    struct kvt_l2_budget *b = l2->budget;
    char err[256] = "";
    rq->cap = b->cap;
    /* inflight first: a write settling in between is then in both (an
     * over-count on a rejoin), never in neither */
    rq->inflight = atomic_load(&b->inflight);
    uint64_t settled = atomic_exchange(&b->settled, 0);
    rq->settled += settled;
    memset(v, 0, sizeof(*v));
    int rc = b->ops->apply(b->rec, rq, v, err, sizeof(err));
    bool first_err = false, rejoined = false;
    pthread_mutex_lock(&b->lock);
    b->steps++;
    b->last_ok = rc == 0;
    if (rc) {
        b->step_errors++;
        first_err = strcmp(b->last_error, err) != 0;
        snprintf(b->last_error, sizeof(b->last_error), "%s", err[0] ? err : kvt_strerror(rc));
    } else {
        rejoined = v->rejoined && b->have_view;
        if (rejoined)
            b->rejoins++;
        b->view = *v;
        b->have_view = true;
        b->view_ns = kvt_now_ns();
        b->last_error[0] = 0;
        if (rq->refund)
            b->refunded_bytes += rq->refund;
        if (rq->removed && v->removed_ok)
            b->removed_bytes += rq->removed;
        else if (rq->removed)
            b->removed_dropped += rq->removed;
    }
    pthread_mutex_unlock(&b->lock);
    if (rc) {
        atomic_fetch_add(&b->settled, settled); /* report them next time */
        if (first_err)
            kvt_warn("%s: shared budget record %s: %s (stores are refused until it answers)",
                     l2->name, b->where, err[0] ? err : kvt_strerror(rc));
    }
    if (rejoined)
        kvt_warn("%s: shared budget record %s had no entry for this server (presumed dead, or "
                 "the record was rebuilt): joined again",
                 l2->name, b->where);
    return rc;
}

/* Give credit back to the record (all of it, or what is above keep). */
static void credit_return(kvt_l2 *l2, uint64_t keep)
{
    struct kvt_l2_budget *b = l2->budget;
    pthread_mutex_lock(&b->lock);
    uint64_t give = b->credit > keep ? b->credit - keep : 0;
    b->credit -= give;
    pthread_mutex_unlock(&b->lock);
    if (!give)
        return;
    atomic_fetch_sub(&b->inflight, give);
    struct kvt_budget_req rq = {.refund = give};
    struct kvt_budget_view v;
    step(l2, &rq, &v); /* unanswered: an over-count, until a recount */
}

int kvt_l2b_budget_take(kvt_l2 *l2, uint32_t stored)
{
    struct kvt_l2_budget *b = l2->budget;
    pthread_mutex_lock(&b->lock);
    uint64_t use = KVT_MIN(b->credit, (uint64_t)stored);
    b->credit -= use;
    b->credit_used = true;
    pthread_mutex_unlock(&b->lock);
    uint64_t need = stored - use;
    if (!need)
        return 0; /* the credit's bytes were charged (and counted in flight) */
    /* with a chunk of credit when it fits under the cap, else just the need */
    uint64_t extra = b->chunk > need ? b->chunk : 0;
    for (int pass = 0; pass < 2; pass++) {
        uint64_t want = need + (pass == 0 ? extra : 0);
        if (pass == 1 && !extra)
            break;
        /* counted in flight before the step: a rejoin's pending includes it */
        atomic_fetch_add(&b->inflight, want);
        struct kvt_budget_req rq = {.take = want};
        struct kvt_budget_view v;
        int rc = step(l2, &rq, &v);
        if (rc == 0 && v.granted) {
            pthread_mutex_lock(&b->lock);
            b->credit += want - need;
            pthread_mutex_unlock(&b->lock);
            return 0;
        }
        atomic_fetch_sub(&b->inflight, want);
        if (rc) {
            pthread_mutex_lock(&b->lock);
            b->credit += use; /* not spent */
            pthread_mutex_unlock(&b->lock);
            return rc;
        }
    }
    pthread_mutex_lock(&b->lock);
    b->refused++;
    b->credit += use;
    pthread_mutex_unlock(&b->lock);
    /* refused: whatever credit is left may be what the others need */
    credit_return(l2, 0);
    return KVT_E_FULL;
}

void kvt_l2b_budget_settle(kvt_l2 *l2, uint32_t stored)
{
    struct kvt_l2_budget *b = l2->budget;
    atomic_fetch_sub(&b->inflight, stored);
    atomic_fetch_add(&b->settled, stored);
}

void kvt_l2b_budget_unsure(kvt_l2 *l2, uint32_t stored)
{
    struct kvt_l2_budget *b = l2->budget;
    pthread_mutex_lock(&b->lock);
    b->unsure_new += stored;
    pthread_mutex_unlock(&b->lock);
}

/* The periodic step's share of the hold: what has been unsure for a whole
 * period is settled now (it can no longer land, we assume). */
static void unsure_age(struct kvt_l2_budget *b, uint64_t now)
{
    uint64_t due = 0;
    pthread_mutex_lock(&b->lock);
    if (!b->unsure_ns) {
        b->unsure_ns = now;
    } else if (now - b->unsure_ns >= (uint64_t)KVT_BUDGET_UNSURE_HOLD_S * 1000000000ull) {
        due = b->unsure_old;
        b->unsure_old = b->unsure_new;
        b->unsure_new = 0;
        b->unsure_ns = now;
    }
    pthread_mutex_unlock(&b->lock);
    if (due) {
        atomic_fetch_sub(&b->inflight, due);
        atomic_fetch_add(&b->settled, due);
    }
}

void kvt_l2b_budget_refund(kvt_l2 *l2, uint32_t stored)
{
    struct kvt_l2_budget *b = l2->budget;
    /* still charged and in flight, now unused: credit for the next store */
    pthread_mutex_lock(&b->lock);
    b->credit += stored;
    uint64_t credit = b->credit;
    pthread_mutex_unlock(&b->lock);
    if (credit > 2 * b->chunk)
        credit_return(l2, b->chunk);
}

uint64_t kvt_l2b_budget_epoch(kvt_l2 *l2)
{
    struct kvt_l2_budget *b = l2->budget;
    pthread_mutex_lock(&b->lock);
    uint64_t e = b->have_view ? b->view.epoch : 0; /* 0: no removal is subtracted */
    pthread_mutex_unlock(&b->lock);
    return e;
}

void kvt_l2b_budget_removed(kvt_l2 *l2, uint64_t bytes, uint64_t epoch)
{
    if (!bytes)
        return;
    struct kvt_budget_req rq = {.removed = bytes, .removed_epoch = epoch};
    struct kvt_budget_view v;
    step(l2, &rq, &v);
}

/* How old a view may be to drive watermark eviction: three eviction
 * intervals (as the periodic steps measure them), at least 1 s. */
static uint64_t fresh_limit_ns(const struct kvt_l2_budget *b)
{
    uint64_t gap = b->refresh_gap ? b->refresh_gap : 1000000000ull;
    return KVT_MAX(3 * gap, 1000000000ull);
}

/* "ok", "none" (no answer yet), "unavailable" (the last step failed),
 * "stale" (older than fresh_limit_ns). call with b->lock held */
static const char *state_locked(const struct kvt_l2_budget *b, uint64_t now)
{
    if (!b->have_view)
        return "none";
    if (!b->last_ok)
        return "unavailable";
    if (now - b->view_ns > fresh_limit_ns(b))
        return "stale";
    return "ok";
}

bool kvt_l2b_budget_fresh_total(kvt_l2 *l2, int64_t *total)
{
    struct kvt_l2_budget *b = l2->budget;
    pthread_mutex_lock(&b->lock);
    const char *state = state_locked(b, kvt_now_ns());
    bool fresh = strcmp(state, "ok") == 0;
    *total = b->have_view ? b->view.total : (int64_t)b->cap;
    bool changed = fresh == b->skip_warned;
    b->skip_warned = !fresh;
    pthread_mutex_unlock(&b->lock);
    if (changed && !fresh)
        kvt_warn("%s: shared budget record %s is %s: watermark eviction is skipped until it "
                 "answers (its last total would drive every cycle while removals cannot be "
                 "subtracted)",
                 l2->name, b->where, state);
    else if (changed)
        kvt_info("%s: shared budget record %s answers again: watermark eviction resumes", l2->name,
                 b->where);
    return fresh;
}

int64_t kvt_l2b_budget_total(kvt_l2 *l2)
{
    struct kvt_l2_budget *b = l2->budget;
    pthread_mutex_lock(&b->lock);
    int64_t t = b->have_view ? b->view.total : (int64_t)b->cap;
    pthread_mutex_unlock(&b->lock);
    return t;
}

void kvt_l2_budget_shrunk(kvt_l2 *l2, uint32_t bytes)
{
    if (l2->budget && bytes)
        kvt_l2b_budget_refund(l2, bytes);
}

void kvt_l2_budget_refresh(kvt_l2 *l2)
{
    struct kvt_l2_budget *b = l2->budget;
    if (!b)
        return;
    /* credit untouched since the last cycle goes back to the others */
    pthread_mutex_lock(&b->lock);
    uint64_t now = kvt_now_ns();
    if (b->refresh_ns)
        b->refresh_gap = now - b->refresh_ns;
    b->refresh_ns = now;
    bool idle = !b->credit_used;
    b->credit_used = false;
    pthread_mutex_unlock(&b->lock);
    if (idle)
        credit_return(l2, 0);
    unsure_age(b, now);
    struct kvt_budget_req rq = {0};
    struct kvt_budget_view v;
    step(l2, &rq, &v);
}

int kvt_l2_budget_attach(kvt_l2 *l2, const struct kvt_budget_rec_ops *ops, void *rec, char *err,
                         size_t errcap)
{
    (void)err;
    (void)errcap;
    struct kvt_l2_budget *b = kvt_xcalloc(1, sizeof(*b));
    b->ops = ops;
    b->rec = rec;
    b->cap = l2->cap_bytes;
    /* one step per chunk of stores: a sixty-fourth of the cap, at most
     * 4 MiB (a cap of 600 GB: 4 MiB; a test's 1 MiB: 16 KiB) */
    b->chunk = KVT_MIN(b->cap / 64, (uint64_t)4 << 20);
    pthread_mutex_init(&b->lock, NULL);
    ops->where(rec, b->where, sizeof(b->where));
    l2->budget = b;
    kvt_info("%s: shared budget of %llu bytes in %s", l2->name, (unsigned long long)b->cap,
             b->where);
    return 0;
}

int kvt_l2_budget_recount_begin(kvt_l2 *l2, char *errout, size_t errcap)
{
    struct kvt_l2_budget *b = l2->budget;
    if (!b)
        return 0;
    struct kvt_budget_snap s;
    memset(&s, 0, sizeof(s));
    char err[256] = "";
    int rc = b->ops->begin(b->rec, atomic_load(&b->inflight), &s, err, sizeof(err));
    pthread_mutex_lock(&b->lock);
    b->snap_valid = rc == 0;
    b->snap = s;
    b->snap_ns = kvt_now_ns();
    if (rc) {
        b->last_ok = false;
        snprintf(b->last_error, sizeof(b->last_error), "%s", err);
    }
    pthread_mutex_unlock(&b->lock);
    if (rc && errout)
        snprintf(errout, errcap, "shared budget record: %s", err);
    return rc;
}

void kvt_l2_budget_recount_end(kvt_l2 *l2, uint64_t walked, bool complete)
{
    struct kvt_l2_budget *b = l2->budget;
    if (!b)
        return;
    pthread_mutex_lock(&b->lock);
    bool have = b->snap_valid;
    struct kvt_budget_snap s = b->snap;
    uint64_t t0 = b->snap_ns;
    b->snap_valid = false;
    if (have && !complete)
        b->recounts_skipped++;
    pthread_mutex_unlock(&b->lock);
    if (!have)
        return;
    if (!complete) {
        kvt_info("%s: shared budget: the walk may have missed objects: the record's total is "
                 "left as it was",
                 l2->name);
        return;
    }
    struct kvt_budget_view v;
    memset(&v, 0, sizeof(v));
    char err[256] = "";
    int rc = b->ops->end(b->rec, atomic_load(&b->inflight), &s, walked, &v, err, sizeof(err));
    double secs = (double)(kvt_now_ns() - t0) / 1e9;
    pthread_mutex_lock(&b->lock);
    b->last_ok = rc == 0;
    if (rc) {
        snprintf(b->last_error, sizeof(b->last_error), "%s", err);
    } else {
        b->recounts++;
        b->last_walked = walked;
        b->last_before = b->have_view ? b->view.total : 0;
        b->last_after = v.total;
        b->last_seconds = secs;
        b->view = v;
        b->have_view = true;
        b->view_ns = kvt_now_ns();
    }
    pthread_mutex_unlock(&b->lock);
    if (rc)
        kvt_warn("%s: shared budget record %s: the recount was not recorded: %s", l2->name,
                 b->where, err);
    else
        kvt_info("%s: shared budget recounted: the tier holds %llu bytes of objects, the "
                 "record's total is now %lld bytes (%llu pending, %llu charged during the "
                 "%.3f s walk) of %llu",
                 l2->name, (unsigned long long)walked, (long long)v.total,
                 (unsigned long long)s.pending, (unsigned long long)(v.adds - s.adds), secs,
                 (unsigned long long)b->cap);
}

void kvt_l2_budget_detach(kvt_l2 *l2)
{
    kvt_l2b_budget_free(l2);
}

void kvt_l2b_budget_free(kvt_l2 *l2)
{
    struct kvt_l2_budget *b = l2->budget;
    if (!b)
        return;
    /* the credit goes back (leaving keeps the total, pending and all) */
    credit_return(l2, 0);
    l2->budget = NULL;
    b->ops->leave(b->rec);
    pthread_mutex_destroy(&b->lock);
    free(b);
}

void kvt_l2b_budget_stats(kvt_l2 *l2, struct kvt_l2_stats *out)
{
    struct kvt_l2_budget *b = l2->budget;
    if (!b)
        return;
    pthread_mutex_lock(&b->lock);
    out->shared_budget = true;
    out->shared_total = b->have_view ? b->view.total : 0;
    out->shared_part = b->have_view ? b->view.part : 0;
    out->shared_nodes = b->have_view ? b->view.nodes : 0;
    pthread_mutex_unlock(&b->lock);
}

#define I(v) json_integer((json_int_t)(v))

void kvt_l2b_budget_status(kvt_l2 *l2, json_t *o)
{
    struct kvt_l2_budget *b = l2->budget;
    if (!b)
        return;
    json_t *j = json_object();
    pthread_mutex_lock(&b->lock);
    const struct kvt_budget_view *v = &b->view;
    json_object_set_new(j, "record", json_string(b->where));
    /* whether the total below drives watermark eviction ("ok") */
    json_object_set_new(j, "record_state", json_string(state_locked(b, kvt_now_ns())));
    json_object_set_new(j, "capacity_bytes", I(b->cap));
    json_object_set_new(j, "record_capacity_bytes", b->have_view ? I(v->cap) : json_null());
    json_object_set_new(j, "total_bytes", b->have_view ? I(v->total) : json_null());
    json_object_set_new(j, "usage_fraction",
                        b->have_view && b->cap ? json_real((double)v->total / (double)b->cap)
                                               : json_null());
    json_object_set_new(j, "node_bytes", b->have_view ? I(v->part) : json_null());
    json_object_set_new(j, "node_pending_bytes", b->have_view ? I(v->pending) : json_null());
    json_object_set_new(j, "inflight_bytes", I(atomic_load(&b->inflight)));
    json_object_set_new(j, "credit_bytes", I(b->credit));
    json_object_set_new(j, "unsure_bytes", I(b->unsure_new + b->unsure_old));
    json_object_set_new(j, "credit_chunk_bytes", I(b->chunk));
    json_object_set_new(j, "nodes", b->have_view ? I(v->nodes) : json_null());
    json_object_set_new(j, "epoch", b->have_view ? I(v->epoch) : json_null());
    json_object_set_new(j, "charged_total_bytes", b->have_view ? I(v->adds) : json_null());
    json_object_set_new(j, "record_recounts", b->have_view ? I(v->recounts) : json_null());
    json_object_set_new(j, "age_seconds",
                        b->have_view ? json_real((double)(kvt_now_ns() - b->view_ns) / 1e9)
                                     : json_null());
    json_object_set_new(j, "steps", I(b->steps));
    json_object_set_new(j, "step_errors", I(b->step_errors));
    json_object_set_new(j, "refused", I(b->refused));
    json_object_set_new(j, "refunded_bytes", I(b->refunded_bytes));
    json_object_set_new(j, "removed_bytes", I(b->removed_bytes));
    json_object_set_new(j, "removed_dropped_bytes", I(b->removed_dropped));
    json_object_set_new(j, "rejoins", I(b->rejoins));
    json_t *rc = json_object();
    json_object_set_new(rc, "state", json_string(b->snap_valid ? "running" : "idle"));
    json_object_set_new(rc, "count", I(b->recounts));
    json_object_set_new(rc, "skipped", I(b->recounts_skipped));
    json_object_set_new(rc, "walked_bytes", I(b->last_walked));
    json_object_set_new(rc, "total_before", I(b->last_before));
    json_object_set_new(rc, "total_after", I(b->last_after));
    json_object_set_new(rc, "seconds", json_real(b->last_seconds));
    json_object_set_new(j, "recount", rc);
    json_object_set_new(j, "last_error",
                        b->last_error[0] ? json_string(b->last_error) : json_null());
    pthread_mutex_unlock(&b->lock);
    json_object_set_new(o, "shared_budget", j);
}
