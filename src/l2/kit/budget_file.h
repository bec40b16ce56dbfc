/*
 * The shared budget record of servers sharing one directory (fs,
 * nixl_store_dynamic with "shared": true and "shared_budget": true): the
 * file "<dir>/.kvtier-budget" (l2/kit/brec.h's 4096-byte record).
 *
 * One step = open file description lock (F_OFD_SETLKW) on byte 0, pread,
 * apply, pwrite (fdatasync with durable), unlock. A server holds a second
 * OFD lock, on byte 2^20 + its entry, for as long as it runs: the kernel
 * drops it when the process dies (SIGKILL included), so another server that
 * finds that byte unlocked (F_OFD_GETLK) knows the entry's owner is gone and
 * may fold it. OFD locks work across hosts where the file system forwards
 * POSIX locks (NFS, CephFS, 3FS's FUSE with lock support); a file system
 * without them is refused at open: the record cannot be kept consistent
 * there.
 *
 * A record created (an empty file: the first server, or one re-creating a
 * removed record) or found torn or of another format starts with total =
 * cap (as if the tier were full: nothing over the cap while the truth is
 * unknown) until a recount (the opener's start-up scan) sets the real
 * figure.
 */
#ifndef KVT_L2_KIT_BUDGET_FILE_H
#define KVT_L2_KIT_BUDGET_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "l2/budget.h"

extern const struct kvt_budget_rec_ops kvt_budget_file_ops;

/* Open (creating it if needed) the record in the directory open at dirfd
 * (dir: its path, for messages). cap: this server's cap, recorded by the
 * server that creates the record. 0 with *rec set, or -errno with err. */
int kvt_budget_file_open(int dirfd, const char *dir, bool durable, uint64_t cap, void **rec,
                         char *err, size_t errcap);
/* For an engine's open, before its start-up scan: open the record, attach
 * it to l2 (its cap) and take the recount's snapshot, which the scan's
 * kvt_l2_finish_recovery completes. 0, or -errno with err. */
int kvt_budget_file_attach(kvt_l2 *l2, int dirfd, const char *dir, bool durable, char *err,
                           size_t errcap);
/* A server sharing the directory without "shared_budget": warn when the
 * others keep a record there (its stores would not count in their budget). */
void kvt_budget_file_warn_outside(kvt_l2 *l2, int dirfd, const char *dir);

#endif
