/*
 * A start-up scan's stat queue: the names a scan found are stat'ed in
 * batches of 256. On a network or FUSE file system (NFS, CIFS, Lustre,
 * GPFS, CephFS, anything not on the local list in scanq.c) a batch goes
 * through one io_uring (IORING_OP_STATX): the kernel's workers run the
 * lookups concurrently, so round trips overlap. On a local file system
 * (ext4, XFS, btrfs, tmpfs, ...) each name is statx'ed in turn: statx has
 * no non-blocking path in io_uring, every request is handed to a worker
 * thread, and on a warm dentry cache those hand-offs cost more than the
 * lookups (1M objects on ext4, 2 cores: 4.9 s through io_uring, 3.3 s in
 * turn; cold, the same 1.06-1.07 s per 100k either way;
 * docs/performance.md, Restart accounting). Falls back to statx in turn
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
