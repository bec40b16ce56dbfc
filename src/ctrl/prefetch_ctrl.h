/*
 * Prefetch controller: pulls L2 hits into L1 for a lookup or retrieve.
 *
 * For a request (keys that missed L1, in prefix order):
 *   1. lookup-and-lock on every adapter;
 *   2. plan: each key from the lowest-index adapter that has it, trimmed to
 *      the contiguous prefix; pins on keys outside the plan are released;
 *   3. reserve L1 space (keys already in L1 are referenced instead of
 *      loaded) and load, grouped by adapter, straight into the pool;
 *   4. commit what loaded, in order, up to the first failure; objects are
 *      temporary (freed after the reader) under the default policy, kept
 *      under retain; unlock every adapter pin; call back with the prefix.
 * At most max_in_flight requests run at once; the rest wait in FIFO order.
 *
 * Thread: one "prefetch" thread; epoll on its queue eventfd and on every
 * adapter's lookup and load eventfds. The callback runs on that thread.
 */
#ifndef KVT_PREFETCH_CTRL_H
#define KVT_PREFETCH_CTRL_H

#include <stdint.h>

#include <jansson.h>

#include "l1/l1.h"
#include "l2/l2.h"

enum kvt_prefetch_policy { KVT_PREFETCH_DEFAULT = 0, KVT_PREFETCH_RETAIN = 1 };

/* n: keys now available from L1 in order (a prefix of the request); refs:
 * one reference each, owned by the callee. */
typedef void (*kvt_prefetch_cb)(void *arg, uint32_t n, struct kvt_l1_ref *refs);

struct kvt_prefetch_ctrl;

int kvt_prefetch_ctrl_start(struct kvt_prefetch_ctrl **out, struct kvt_l1 *l1, kvt_l2 **l2s,
                            int nl2, enum kvt_prefetch_policy policy, int max_in_flight);
/* Copies keys. cb is always called exactly once. */
void kvt_prefetch_submit(struct kvt_prefetch_ctrl *pc, const kvt_key *keys, uint32_t n,
                         kvt_prefetch_cb cb, void *arg);
json_t *kvt_prefetch_ctrl_status(struct kvt_prefetch_ctrl *pc);
void kvt_prefetch_ctrl_stop(struct kvt_prefetch_ctrl *pc);

#endif
