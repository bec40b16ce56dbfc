/*
 * The serde stage: the L2 base's hooks that run an adapter's serde chain
 * (src/serde) on a worker pool between the controllers and the engine.
 */
#ifndef KVT_L2_STAGE_H
#define KVT_L2_STAGE_H

#include "l2/engine.h"
#include "serde/serde.h"

/* ---- the stage: L2 base hooks (l2/stage.c) --------------------------------- */

/* Attach chain s to an opened adapter before its first submit, as the
 * adapter's filter that takes its STORE/LOAD tasks (l2.h): start the worker
 * pool. Takes a reference on s. Returns 0, -errno, or KVT_E_CONFIG when
 * another chain is attached already (err filled). kvt_l2_close detaches
 * it. */
int kvt_serde_stage_attach(kvt_l2 *l2, struct kvt_serde *s, char *err, size_t errcap);

#endif
