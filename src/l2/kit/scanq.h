/*
 * A start-up scan's stat queue: the names a scan found are stat'ed in
 * batches of 256 through one io_uring (IORING_OP_STATX), so a directory of a
 * million objects costs a few thousand system calls instead of a million
 * (and the kernel runs the lookups on its workers). Falls back to fstatat
 * when io_uring is not available. Regular files of at least an object
 * header's size are added to the scan's findings.
 *
 * One queue per scan thread; not thread-safe. A batch refers to its
 * directory fd: flush before closing it.
 */
#ifndef KVT_L2_SCANQ_H
#define KVT_L2_SCANQ_H

#include "l2/engine.h"

struct kvt_l2_scanq;

struct kvt_l2_scanq *kvt_l2_scanq_new(struct kvt_l2_found_vec *fv);
/* Queue dirfd/name (ck: the object's canonical key). */
void kvt_l2_scanq_add(struct kvt_l2_scanq *q, int dirfd, const char *name, const kvt_key *ck);
void kvt_l2_scanq_flush(struct kvt_l2_scanq *q);
/* Flush and free. */
void kvt_l2_scanq_free(struct kvt_l2_scanq *q);

#endif
