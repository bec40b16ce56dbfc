/*
 * The engine life cycle every L2 adapter shares, written once: setup on top
 * of the base (kvt_l2_life_init), the start of the start-up scan
 * (kvt_l2_life_start_scan) and the close sequence (kvt_l2_life_stop).
 *
 * An engine fills in the parts it has; the skeleton runs them in one fixed
 * order, the order the crash and sanitizer tests rely on:
 *
 *   1. stop       tell the engine's own threads to finish: stop_fn, or
 *                 *stop_flag set (NULL both: nothing to tell)
 *   2. join       the scan (recovery, monitor) thread, when *thread_started
 *   3. release    parked stores run (kvt_l2_park_release into park_pool), or
 *                 release_fn where the engine parks another way
 *   4. drain      wait until no batch is live (kvt_l2_drain_wait)
 *   5. pools      destroyed in array order (each runs what is queued)
 *
 * What an engine does after that (its device, files, final checkpoint) stays
 * in its close function, after the call.
 */
#ifndef KVT_L2_LIFE_H
#define KVT_L2_LIFE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "l2/engine.h"

struct kvt_tpool;

struct kvt_l2_life {
    _Atomic bool *stop_flag;     /* 1: set true (seq_cst), or */
    void (*stop_fn)(kvt_l2 *l2); /* 1: the engine's own stop */
    pthread_t *thread;           /* 2: joined when *thread_started */
    const bool *thread_started;
    struct kvt_l2_park *park; /* 3: released into park_pool, or */
    struct kvt_tpool *park_pool;
    void (*release_fn)(kvt_l2 *l2); /* 3: the engine's own release */
    struct kvt_l2_drain *drain;     /* 4 */
    struct kvt_tpool *pools[2];     /* 5: NULL entries are skipped */
};

/* kvt_l2_base_init, with its failure put in err the one way every engine
 * words it ("adapter setup failed: ..."). 0 or the base's error. */
int kvt_l2_life_init(kvt_l2 *l2, const struct kvt_l2_ops *ops, const struct kvt_l2_spec *spec,
                     enum kvt_codec codec, uint64_t cap_bytes, char *err, size_t errcap);

/* Start the engine's start-up scan thread fn(l2): stores park from now on
 * (park->parking) and the adapter reports that it is recovering until the
 * scan ends; *started is set once the thread runs. what names the thread
 * in the error ("the scan thread"). 0, or -errno with err "cannot start
 * <what>: ...". */
int kvt_l2_life_start_scan(kvt_l2 *l2, struct kvt_l2_park *park, pthread_t *thread, bool *started,
                           void *(*fn)(void *), const char *what, char *err, size_t errcap);

/* Steps 1-5 above, for an engine's close function. */
void kvt_l2_life_stop(kvt_l2 *l2, const struct kvt_l2_life *lf);

#endif
