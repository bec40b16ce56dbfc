/*
 * The L2 eviction passes, for the eviction controller (evict/controller.c):
 * each adapter's policy decides the order, the base removes.
 */
#ifndef KVT_L2_EVICT_H
#define KVT_L2_EVICT_H

#include "l2/l2.h"

/* The adapter's eviction parameters: false when it has no policy (never
 * evicts); otherwise usage at or over *watermark triggers a pass that frees
 * *ratio of the used bytes. */
bool kvt_l2_evict_params(kvt_l2 *l2, double *watermark, double *ratio);
/* Does the adapter enforce namespace quotas? */
bool kvt_l2_has_quotas(kvt_l2 *l2);
/* Remove the queued doomed objects (ops->remove may block: the L2 eviction
 * thread calls this, and kvt_l2_close). Returns how many were removed. */
uint32_t kvt_l2_reap(kvt_l2 *l2);

/* With a shared budget ("shared_budget", l2/budget.h): one step on the
 * shared record that renews this server's entry, reports its settled
 * writes and reads the tier's total, which kvt_l2_usage's fraction then
 * shows. May block on the record's I/O: the eviction thread calls it at
 * the start of every cycle. No-op otherwise. */
void kvt_l2_budget_refresh(kvt_l2 *l2);

/* Evict until used_bytes <= target, policy order, skipping pinned keys.
 * Returns bytes reclaimed. Used by the eviction controller. */
uint64_t kvt_l2_evict_to(kvt_l2 *l2, uint64_t target, uint32_t batch);
/* Quota pass of the eviction controller: every namespace at or over
 * trigger_watermark of its quota loses eviction_ratio of its bytes, in
 * policy order, its own objects only. Returns bytes reclaimed. */
uint64_t kvt_l2_evict_quotas(kvt_l2 *l2, uint32_t batch);

#endif
