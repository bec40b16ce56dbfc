/*
 * Eviction controllers: one thread per tier (L1, and each L2 adapter with an
 * "eviction" block), woken by a timer (interval_ms) or at once by
 * kvt_evictor_kick(). Each wake evicts until usage is back under the target
 * (used x (1 - eviction_ratio)) when it was at or over trigger_watermark,
 * not one batch per wake. Pinned and referenced objects are skipped and
 * retried on the next wake. The L1 thread also expires leases.
 */
#ifndef KVT_EVICT_CONTROLLER_H
#define KVT_EVICT_CONTROLLER_H

#include <stdint.h>

#include "l1/l1.h"
#include "l2/evict.h"

struct kvt_evictor;

int kvt_evictor_start_l1(struct kvt_evictor **out, struct kvt_l1 *l1, int interval_ms);
/* NULL in *out (and 0) when the adapter has no eviction policy. */
int kvt_evictor_start_l2(struct kvt_evictor **out, kvt_l2 *l2, int interval_ms);
void kvt_evictor_kick(struct kvt_evictor *ev);
void kvt_evictor_stop(struct kvt_evictor *ev);

#endif
