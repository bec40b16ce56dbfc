/*
 * Private to the L2 base (the .c files of src/l2 itself): the index state
 * bits and the helpers its files share. Engines use l2/engine.h instead.
 *   l2.c      the index and its accounting, base init/destroy, accessors,
 *             the engine helpers (reserve, publish, pin, adopt), close
 *   task.c    tasks, submit, finish, the done queues, latency, filters
 *   remove.c  unlock, doom and reap, delete, eviction (sync and passes)
 *   status.c  stats, usage, health, the status object, the index scan
 *   recover.c what a start-up scan found, adopted in one go
 *   park.c    parked stores and draining
 *   budget.c  a byte budget shared with other servers (l2/budget.h)
 *   admin.c   the operator's calls: run a task and wait, hold, quotas at
 *             run time
 */
#ifndef KVT_L2_BASE_INT_H
#define KVT_L2_BASE_INT_H

#include "common/log.h"
#include "l2/engine.h"

#define NOHANDLE UINT32_MAX
#define ST_MASK KVT_OBJ_STATE_MASK
#define ST_TRACKED 0x80 /* the policy knows this handle */
#define ST_DOOMED 0x40  /* failed verification: no new pins, removed at the last unpin */

static inline uint32_t idx_find(const struct kvt_l2_index *x, const kvt_key *k)
{
    return kvt_kindex_find(&x->map, k);
}

static inline uint8_t st(const struct kvt_l2_obj *o)
{
    return o->state & ST_MASK;
}

/* The states an entry may leave, for obj_set_state: one bit per state. */
#define FROM(s) (1u << (s))
#define FROM_LIVE (FROM(KVT_OBJ_WRITING) | FROM(KVT_OBJ_READY) | FROM(KVT_OBJ_DELETING))

/*
 * The one place an entry's state changes. The life of an entry:
 *   FREE -> WRITING (a reservation) -> READY (published)
 *   FREE -> READY (adopted: a scan or a secondary lookup found it)
 *   READY -> DELETING (marked by a delete, an eviction or a reap) -> READY
 *     (its removal failed) or FREE (removed)
 *   WRITING, READY -> FREE (unreserved, forgotten)
 * Asserts that the entry is in one of the states of from (FROM bits);
 * keeps the base's flags (ST_TRACKED, ST_DOOMED), except that a FREE entry
 * has none. call with l2->lock held
 */
static inline void obj_set_state(struct kvt_l2_obj *o, unsigned from, enum kvt_l2_state to)
{
    KVT_ASSERT(from & FROM(st(o)));
    o->state = to == KVT_OBJ_FREE ? (uint8_t)KVT_OBJ_FREE : (uint8_t)((o->state & ~ST_MASK) | to);
}

/* Tell the tier-event hook (if any) about entry o. call with l2->lock held */
static inline void obj_announce_locked(kvt_l2 *l2, const struct kvt_l2_obj *o, enum kvt_tier_ev ev)
{
    if (l2->ev.fn)
        l2->ev.fn(l2->ev.arg, l2->ev.tier, ev, &o->key);
}

/* recover.c: the tags a scan gave before the event hook was set
 * (kvt_l2_give_tag): given to the hook (call with l2->lock held, the hook
 * set), or dropped */
void kvt_l2b_early_tags_flush_locked(kvt_l2 *l2);
/* kvt_l2_give_tag with l2->lock held */
void kvt_l2b_give_tag_locked(kvt_l2 *l2, const kvt_key *ck, struct kvt_blocktag *tag);
void kvt_l2b_early_tags_free(kvt_l2 *l2);

/* call with l2->lock held */
uint32_t kvt_l2b_idx_insert(kvt_l2 *l2, const kvt_key *k);
/* the namespace quota and the tenant quota of a namespace id: an index
 * into l2->quotas, or -1 */
int kvt_l2b_quota_of_locked(kvt_l2 *l2, uint32_t ns);
int kvt_l2b_tquota_of_locked(kvt_l2 *l2, uint32_t ns);
void kvt_l2b_account_locked(kvt_l2 *l2, const struct kvt_l2_obj *o, int sign);
void kvt_l2b_unpin_locked_obj(kvt_l2 *l2, struct kvt_l2_obj *o);
void kvt_l2b_drop_locked(kvt_l2 *l2, uint32_t h);
bool kvt_l2b_make_room(kvt_l2 *l2, uint32_t stored);

/* admin.c: a task of kvt_l2_run finished: wake its caller */
void kvt_l2b_wake(kvt_l2_task *t);

/* the shared budget (budget.c); only with l2->budget set, never with
 * l2->lock held (a step may block on the record's I/O) */
/* Charge stored bytes: 0, KVT_E_FULL (refused: over the cap), or the
 * record's error. */
int kvt_l2b_budget_take(kvt_l2 *l2, uint32_t stored);
/* A charged write landed: pending drops with the next step, the total
 * keeps the bytes. No I/O. */
void kvt_l2b_budget_settle(kvt_l2 *l2, uint32_t stored);
/* A charged write's fate is unknown (no answer): it may still land later
 * (a server that got the whole request runs it after the client gave up),
 * so its bytes stay in flight and pending for KVT_BUDGET_UNSURE_HOLD_S to
 * 2x that (a recount meanwhile counts them), then settle. No I/O. */
void kvt_l2b_budget_unsure(kvt_l2 *l2, uint32_t stored);
/* A charged write certainly never landed: give the bytes back. */
void kvt_l2b_budget_refund(kvt_l2 *l2, uint32_t stored);
/* The record's epoch as last seen: read it before a removal starts. */
uint64_t kvt_l2b_budget_epoch(kvt_l2 *l2);
/* This server removed bytes of objects (the backend said it removed them),
 * the removal having started at epoch. */
void kvt_l2b_budget_removed(kvt_l2 *l2, uint64_t bytes, uint64_t epoch);
/* The record's total as last seen (the cap before any answer); true when
 * it may drive watermark eviction: the last step answered and the view is
 * younger than three eviction intervals. Logs when that changes. */
bool kvt_l2b_budget_fresh_total(kvt_l2 *l2, int64_t *total);
/* The record's total as last seen (the cap before any answer). */
int64_t kvt_l2b_budget_total(kvt_l2 *l2);
/* Store over the shared cap: evict from this server's index to fit. */
bool kvt_l2b_make_room_shared(kvt_l2 *l2, uint32_t stored);
void kvt_l2b_budget_free(kvt_l2 *l2);
void kvt_l2b_budget_stats(kvt_l2 *l2, struct kvt_l2_stats *out);
void kvt_l2b_budget_status(kvt_l2 *l2, json_t *o);

#endif
