/*
 * Private to kvtier's protocol front end: what its files share. ops.c has
 * the operation table and dispatch, request.c the framing of requests and
 * replies, store.c and fetch.c the data paths, admin.c delete and purge.
 */
#ifndef KVT_FRONT_NATIVE_INT_H
#define KVT_FRONT_NATIVE_INT_H

#include "front/native/native.h"

/* Reply from the thread that holds r: sent on the rpc thread, posted to it
 * from any other. */
void kvt_native_reply(struct kvt_native *n, struct reply *r, bool on_rpc);
/* Leases belong to the connection that took them: its routing id. */
struct kvt_l1_owner kvt_native_owner(struct reply *r);
/* The error reply for a lease that cannot be used as named (nothing of it
 * changed): another connection's, or a retrieve of other keys. */
void kvt_native_lease_refused(struct reply *r, int rc, uint64_t lease);
/* The request's keys, decoded and checked against its key's tenants (and
 * rights, for an operation flagged KVT_OPF_WRITE). 0, or the error code
 * with q->r already made the error reply. */
int kvt_native_keys(struct kvt_native *n, struct request *q, kvt_key **keys, uint32_t *cnt);

/* the handlers: one per row of the table (ops.c) */
void kvt_op_hello(struct kvt_native *n, struct request *q);
void kvt_op_ping(struct kvt_native *n, struct request *q);
void kvt_op_store(struct kvt_native *n, struct request *q);
void kvt_op_flush(struct kvt_native *n, struct request *q);
void kvt_op_lookup(struct kvt_native *n, struct request *q);
void kvt_op_retrieve(struct kvt_native *n, struct request *q);
void kvt_op_free_locks(struct kvt_native *n, struct request *q);
void kvt_op_prepare_store(struct kvt_native *n, struct request *q);
void kvt_op_commit_store(struct kvt_native *n, struct request *q);
void kvt_op_prepare_retrieve(struct kvt_native *n, struct request *q);
void kvt_op_commit_retrieve(struct kvt_native *n, struct request *q);
void kvt_op_status(struct kvt_native *n, struct request *q);
void kvt_op_delete(struct kvt_native *n, struct request *q);
void kvt_op_purge(struct kvt_native *n, struct request *q);

/* Dispatch a decoded request to its row's handler (ops.c). */
void kvt_native_dispatch(struct kvt_native *n, uint32_t op, struct request *q);

#endif
