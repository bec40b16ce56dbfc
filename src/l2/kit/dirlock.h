/*
 * Directory ownership: one cache directory, one owner.
 *
 * A server's fs / nixl_store_dynamic adapter holds an flock on
 * "<root>/.kvtier.lock" for as long as it runs (the kernel drops it when the
 * process dies, SIGKILL included):
 *   - exclusive (the default): a second server on the same directory is
 *     refused at start with the directory and the holder's pid (from
 *     /proc/locks; the lock file stays empty);
 *   - shared ("shared": true in the adapter's config): servers that all say
 *     so may use one directory together (HF3FS, NFS); an exclusive server is
 *     refused where shared ones run, and the other way round.
 * The offline `kvtier purge` takes the exclusive lock (where a server left
 * its lock file) for the time it deletes, so no server can start under it
 * and it never deletes under a running one. flock conflicts between two descriptors of one process
 * too: two adapters of one server on the same directory collide as well.
 *
 * A file system without flock support (ENOLCK, EOPNOTSUPP) cannot enforce
 * this: the lock is then reported as unsupported and the caller warns.
 *
 * Leaf module: libc only (engines and the CLI share it). The file is never
 * removed: unlinking a lock file races with a process that opened it.
 */
#ifndef KVT_OPS_DIRLOCK_H
#define KVT_OPS_DIRLOCK_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#define KVT_DIRLOCK_NAME ".kvtier.lock"
/* The shared budget record of servers sharing the directory with
 * "shared_budget" (l2/kit/budget_file.h): no cache file either. */
#define KVT_BUDGET_FILE_NAME ".kvtier-budget"

/* Take the lock of the directory open at dirfd (path and what, e.g.
 * "base_path", for messages). Returns the lock's fd (>= 0; close it to
 * release), or:
 *   -EBUSY       another process holds it: err names the directory and,
 *                when known, the pid and how it holds it; *holder (may be
 *                NULL) is that pid, 0 when unknown, -1 for shared holders;
 *   -ENOLCK      the file system does not support locks: err says so;
 *   other -errno the lock file cannot be created (err says why). */
int kvt_dirlock_take(int dirfd, const char *path, const char *what, bool shared, pid_t *holder,
                     char *err, size_t errcap);
/* The same for a directory that may never have had an owner: no lock file
 * is created; -ENOENT when there is none. */
int kvt_dirlock_take_existing(int dirfd, const char *path, const char *what, pid_t *holder,
                              char *err, size_t errcap);

#endif
