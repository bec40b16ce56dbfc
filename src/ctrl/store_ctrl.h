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
 * shutdown waits for it to reach the last one.
 *
 * Flush: a client's flush waits only for that client's batches
 * (kvt_store_ctrl_submit_for's tag) that are in flight when it arrives,
 * never for another client's: a count of in-flight batches per client, in
 * a hash table; the flush of a client with batches in flight is parked on
 * its entry and handed back (kvt_store_ctrl_take_flushed) when the count
 * reaches zero. O(1) per batch and per flush, no walk. Batches without a
 * tag (the LMCache front end's, which has no flush) are counted by nobody.
 *
 * Failures: a key that an adapter did not store is recorded for the client
 * whose request submitted it (kvt_store_ctrl_submit_for); its flush takes
 * them (kvt_store_ctrl_take_failures). Bounded: at most FAIL_LIST_MAX keys
 * listed per client and FAIL_CLIENTS_MAX clients with untaken failures
 * (the oldest record goes first); counts are never lost for a kept client.
 *
 * Thread: one "store-ctrl" thread; epoll on its queue eventfd and on every
 * adapter's store eventfd. No polling, no walk of in-flight batches per wake.
 * Without adapters a batch is finished by the submitting thread (its
 * references dropped at once) and never reaches the controller thread.
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
/* The same for a client (a nonzero tag naming the connection): the keys
 * of the batch that do not reach an adapter are kept for that client's
 * next kvt_store_ctrl_take_failures (its flush). */
uint64_t kvt_store_ctrl_submit_for(struct kvt_store_ctrl *sc, const struct kvt_l1_ref *refs,
                                   const kvt_key *keys, uint32_t n, uint64_t client);

/* One (key, adapter) pair that did not reach L2. */
struct kvt_store_failure {
    kvt_key key;
    int adapter; /* index of the adapter */
    int code;    /* why (KVT_E_FULL, KVT_E_TOOBIG, -errno, ...) */
};
/* Take what is recorded for client: the failures of its batches that
 * finished since its previous take, each reported once. Up to max of them
 * are copied to out (a malloc'd array, caller frees; NULL when none);
 * *listed says how many, the return value how many failures there were in
 * all (more than *listed when the per-client list overflowed). Any thread. */
uint64_t kvt_store_ctrl_take_failures(struct kvt_store_ctrl *sc, uint64_t client, uint32_t max,
                                      struct kvt_store_failure **out, uint32_t *listed);
/* A flush of client (nonzero): true when none of its batches is in flight
 * (answer it now). Otherwise cookie is kept and false returned; once the
 * client's last batch in flight finished, cookie is handed back by
 * kvt_store_ctrl_take_flushed and on_progress is called. One flush per
 * client at a time (a connection's requests run one at a time). Any
 * thread. */
bool kvt_store_ctrl_flush_wait(struct kvt_store_ctrl *sc, uint64_t client, void *cookie);
/* Move up to max cookies of flushes that may now be answered to out, in
 * the order they became ready; returns how many. Any thread. */
size_t kvt_store_ctrl_take_flushed(struct kvt_store_ctrl *sc, void **out, size_t max);
/* Sequence number of the latest submitted batch. */
uint64_t kvt_store_ctrl_last_seq(struct kvt_store_ctrl *sc);
/* Every batch <= this has finished on every adapter. */
uint64_t kvt_store_ctrl_done_seq(struct kvt_store_ctrl *sc);
json_t *kvt_store_ctrl_status(struct kvt_store_ctrl *sc);
/* Wait until every batch submitted so far finished (done_seq ==
 * last_seq): every parked flush is then ready; the caller submits
 * nothing meanwhile. */
void kvt_store_ctrl_quiesce(struct kvt_store_ctrl *sc);
/* Wait for every submitted batch, then stop the thread. */
void kvt_store_ctrl_stop(struct kvt_store_ctrl *sc);

#endif
