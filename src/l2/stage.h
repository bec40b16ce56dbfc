/*
 * The serde stage: the L2 base's hooks that run an adapter's serde chain
 * (src/serde) on a worker pool between the controllers and the engine.
 */
#ifndef KVT_L2_STAGE_H
#define KVT_L2_STAGE_H

#include "l2/l2.h"
#include "serde/serde.h"

/* ---- the stage: L2 base hooks (l2/stage.c) --------------------------------- */

/* Attach chain s to an opened adapter before its first submit: start the
 * worker pool. Takes a reference on s. Returns 0 or -errno (err filled). */
int kvt_serde_stage_attach(kvt_l2 *l2, struct kvt_serde *s, char *err, size_t errcap);
/* STORE/LOAD of an adapter with a chain (called by kvt_l2_submit). */
void kvt_serde_stage_submit(kvt_l2 *l2, kvt_l2_task *t);
/* The engine finished an inner task of the stage (called by
 * kvt_l2_task_finish, without l2->lock). */
void kvt_serde_stage_engine_done(kvt_l2 *l2, kvt_l2_task *inner);
/* Close, part 1 (before the engine closes): wait until every STORE still
 * being encoded has been handed to the engine. */
void kvt_serde_stage_quiesce(kvt_l2 *l2);
/* Close, part 2 (after the engine closed and drained): run what is left on
 * the pool, stop it, drop the chain. */
void kvt_serde_stage_detach(kvt_l2 *l2);
/* Add the "serde" object to an adapter's status. */
void kvt_serde_stage_status(kvt_l2 *l2, json_t *out);

#endif
