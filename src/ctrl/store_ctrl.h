/*
 * Store controller: pushes every object committed to L1 to every L2 adapter.
 *
 * A batch (the objects of one store request, in request order) arrives with
 * one L1 reference per object; those references keep the bytes in place
 * (and unevictable) while adapters read them. When every adapter finished
 * the batch, the references are dropped; with the skip_l1 policy the objects
 * also leave L1 (buffer-only mode).
 *
 * Batches get increasing sequence numbers. done_seq is the largest s such
 * that every batch <= s finished on every adapter (succeeded or failed);
 * a flush waits until done_seq reaches the sequence number that was current
 * when the flush arrived.
 *
 * Thread: one "store-ctrl" thread; epoll on its queue eventfd and on every
 * adapter's store eventfd. No polling, no walk of in-flight batches per wake.
 */
#ifndef KVT_STORE_CTRL_H
#define KVT_STORE_CTRL_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "l1/l1.h"
#include "l2/l2.h"

enum kvt_store_policy { KVT_STORE_DEFAULT = 0, KVT_STORE_SKIP_L1 = 1 };

struct kvt_store_ctrl;

int kvt_store_ctrl_start(struct kvt_store_ctrl **out, struct kvt_l1 *l1, kvt_l2 **l2s, int nl2,
                         enum kvt_store_policy policy, void (*on_progress)(void *), void *arg);
/* Hand over n committed objects (one reference each, keys in request
 * order). Takes ownership of the references. Returns the batch's seq. */
uint64_t kvt_store_ctrl_submit(struct kvt_store_ctrl *sc, const struct kvt_l1_ref *refs,
                               const kvt_key *keys, uint32_t n);
/* Sequence number of the latest submitted batch. */
uint64_t kvt_store_ctrl_last_seq(struct kvt_store_ctrl *sc);
/* Every batch <= this has finished on every adapter. */
uint64_t kvt_store_ctrl_done_seq(struct kvt_store_ctrl *sc);
json_t *kvt_store_ctrl_status(struct kvt_store_ctrl *sc);
/* Wait for every submitted batch, then stop the thread. */
void kvt_store_ctrl_stop(struct kvt_store_ctrl *sc);

#endif
