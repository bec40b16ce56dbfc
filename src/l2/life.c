/* The engine life cycle every L2 adapter shares (life.h). */
#include "l2/life.h"
#include "io/tpool.h"
#include "kvtier/error.h"

#include <stdio.h>

int kvt_l2_life_init(kvt_l2 *l2, const struct kvt_l2_ops *ops, const struct kvt_l2_spec *spec,
                     enum kvt_codec codec, uint64_t cap_bytes, char *err, size_t errcap)
{
    int rc = kvt_l2_base_init(l2, ops, spec, codec, cap_bytes);
    if (rc)
        snprintf(err, errcap, "adapter setup failed: %s", kvt_strerror(rc));
    return rc;
}

int kvt_l2_life_start_scan(kvt_l2 *l2, struct kvt_l2_park *park, pthread_t *thread, bool *started,
                           void *(*fn)(void *), const char *what, char *err, size_t errcap)
{
    park->parking = true;
    l2->recovering = true;
    int rc = pthread_create(thread, NULL, fn, l2);
    if (rc) {
        snprintf(err, errcap, "cannot start %s: %s", what, kvt_strerror(-rc));
        return -rc;
    }
    *started = true;
    return 0;
}

/*
 * The close skeleton. Each step only starts once the one before it is over:
 * the scan thread may still park or push work until it is joined, parked
 * stores become batches that the drain then waits for, and a pool is
 * destroyed only when nothing can push to it any more.
 */
void kvt_l2_life_stop(kvt_l2 *l2, const struct kvt_l2_life *lf)
{
    if (lf->stop_fn)
        lf->stop_fn(l2);
    else if (lf->stop_flag)
        atomic_store(lf->stop_flag, true);
    if (lf->thread && *lf->thread_started)
        pthread_join(*lf->thread, NULL);
    if (lf->release_fn)
        lf->release_fn(l2);
    else if (lf->park)
        kvt_l2_park_release(lf->park, lf->park_pool);
    if (lf->drain)
        kvt_l2_drain_wait(lf->drain);
    for (size_t i = 0; i < sizeof(lf->pools) / sizeof(lf->pools[0]); i++)
        if (lf->pools[i])
            kvt_tpool_destroy(lf->pools[i]);
}
