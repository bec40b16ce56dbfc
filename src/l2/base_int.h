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
 */
#ifndef KVT_L2_BASE_INT_H
#define KVT_L2_BASE_INT_H

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

/* call with l2->lock held */
uint32_t kvt_l2b_idx_insert(kvt_l2 *l2, const kvt_key *k);
int kvt_l2b_quota_of_locked(kvt_l2 *l2, uint32_t ns);
void kvt_l2b_account_locked(kvt_l2 *l2, const struct kvt_l2_obj *o, int sign);
void kvt_l2b_unpin_locked_obj(kvt_l2 *l2, struct kvt_l2_obj *o);
void kvt_l2b_drop_locked(kvt_l2 *l2, uint32_t h);
bool kvt_l2b_make_room(kvt_l2 *l2, uint32_t stored);

#endif
