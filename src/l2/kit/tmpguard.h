/*
 * tmp guard: which "*.tmp.*" files under a cache root may be removed.
 *
 * A writer publishes an object as "<final>.tmp.<id>" + rename. After a crash
 * (SIGKILL, OOM, power loss) the tmp file stays behind: crash residue that
 * is never served but takes disk space. A tmp file of a writer that is still
 * running must never be removed, however long the write takes.
 *
 * The seed's rules, and how they are kept here (docs/operations.md):
 *   - each write registers a marker before its tmp file appears and clears
 *     it after the rename. kvtier's marker is the tmp file's NAME:
 *     "<final>.tmp.<pid hex>-<start hex>-<seq hex>" (start = the writer's
 *     process start time in clock ticks, /proc/<pid>/stat field 22). It is
 *     created atomically with the file (O_EXCL) and cleared atomically by the
 *     rename: no window where a tmp file exists without its marker, and no
 *     extra I/O per write. The writer also holds an OFD write lock on the tmp
 *     file while it writes (kvt_tmpguard_hold), which any process on the same
 *     kernel sees, whatever its pid namespace (containers sharing a disk).
 *   - writers of other tools may register in a registry directory
 *     "<root>/.tmp_guard/": one file per write named like the tmp file
 *     (without its directory), content "pid=<dec> start=<dec>".
 *   - a marker is live while its writer lives, checked by (pid, start time),
 *     so a reused pid cannot fool it: a live writer's tmp file is kept
 *     however old it is.
 *   - registry markers of dead writers are swept after an hour (by the
 *     marker's mtime); their tmp files are removable at once.
 *   - a tmp file without any marker (LMCache's "<final>.tmp.<uuid>") is
 *     skipped for 15 minutes after its last modification, then removable.
 *   - when liveness cannot be decided (no /proc, a pid hidden by hidepid, an
 *     unreadable marker), the file is kept.
 *
 * Leaf module: libc only, so engines (nixl_store_dynamic) and the CLI share
 * it. Thread rules: a struct kvt_tmpguard is used by one thread at a time;
 * the free functions are thread-safe.
 */
#ifndef KVT_OPS_TMPGUARD_H
#define KVT_OPS_TMPGUARD_H

#include "common/util.h"

#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>

#define KVT_TMPGUARD_DIR ".tmp_guard"
#define KVT_TMPGUARD_UNMARKED_GRACE_S (15 * 60)
#define KVT_TMPGUARD_MARKER_TTL_S (60 * 60)

enum kvt_tmp_verdict {
    KVT_TMP_OURS = 0,    /* marked by the calling process: only the owner decides */
    KVT_TMP_LIVE,        /* its writer runs (or holds the lock): keep, however old */
    KVT_TMP_UNDECIDABLE, /* liveness cannot be decided: keep */
    KVT_TMP_RECENT,      /* no marker, modified less than 15 minutes ago: keep */
    KVT_TMP_DEAD,        /* marked, and its writer is gone: remove */
    KVT_TMP_STALE,       /* no marker, older than 15 minutes: remove */
    KVT_TMP_NVERDICTS
};

static inline bool kvt_tmp_removable(enum kvt_tmp_verdict v)
{
    return v == KVT_TMP_DEAD || v == KVT_TMP_STALE;
}
const char *kvt_tmp_verdict_name(enum kvt_tmp_verdict v);

struct kvt_tmpguard {
    pid_t self_pid;
    uint64_t self_start;
    bool proc_ok; /* /proc is mounted and readable */
    int regfd;    /* the registry directory, or -1 when there is none */
    time_t now;   /* reference time for the age rules (set by init; tests may move it) */
};

/* Set up a guard for the cache root open at rootfd (the registry directory
 * is opened if it exists; it is never created here). Returns 0 or -errno. */
int kvt_tmpguard_init(struct kvt_tmpguard *g, int rootfd);
void kvt_tmpguard_fini(struct kvt_tmpguard *g);

/* Whether a directory entry name is a tmp file ("...tmp.<something>"). */
bool kvt_tmpguard_is_tmp(const char *name);

/* Decide about the tmp file `name` in directory dfd (the root or a shard
 * directory below it); st is its lstat (callers have it from the scan).
 * *why (may be NULL) gets a static explanation for reports. */
enum kvt_tmp_verdict kvt_tmpguard_classify(struct kvt_tmpguard *g, int dfd, const char *name,
                                           const struct stat *st, const char **why);

/* What a sweep did with one tmp file (kvt_tmpguard_sweep). */
enum kvt_tmp_sweep {
    KVT_SWEEP_NONE = 0, /* not a regular file, ours while running, or the unlink failed */
    KVT_SWEEP_REMOVED,  /* removed */
    KVT_SWEEP_KEPT,     /* another writer's, kept by the rules */
};
/* A sweep's step for the tmp file `name` in dfd (the adapters' start-up
 * scans and close): removed when the rules allow it (a dead writer's, one
 * without a marker after 15 minutes, never a live or undecidable one's),
 * our own only when closing (nothing is in flight then). *size (may be
 * NULL) gets a kept file's size. */
enum kvt_tmp_sweep kvt_tmpguard_sweep(struct kvt_tmpguard *g, int dfd, const char *name,
                                      bool closing, uint64_t *size);

/* Remove registry markers of writers that are gone and whose marker is
 * older than an hour. Counts go to *swept and *kept (either may be NULL).
 * Returns 0 or -errno (no registry: 0). */
int kvt_tmpguard_sweep_markers(struct kvt_tmpguard *g, uint64_t *swept, uint64_t *kept);

/* ---- the writer's side ---- */

/* Build the tmp name "<final>.tmp.<pid hex>-<start hex>-<seq hex>".
 * Returns its length, or -ENAMETOOLONG when it does not fit cap. */
int kvt_tmpguard_name(char *out, size_t cap, const char *final, pid_t pid, uint64_t start,
                      uint64_t seq);
/* Parse the writer identity of a kvtier tmp name; false when the name has
 * another format (LMCache's uuid, ...). */
bool kvt_tmpguard_parse(const char *name, pid_t *pid, uint64_t *start);
/* Take an OFD write lock on the writer's open tmp file; released by close.
 * Returns 0 or -errno (file systems without locks: the name still marks). */
int kvt_tmpguard_hold(int fd);

/* ---- process liveness ---- */

/* 1: pid runs and started at `start` (clock ticks since boot); 0: it is gone
 * (no such process, a zombie, or another process under a reused pid);
 * -1: undecidable (no /proc, pid hidden). */
int kvt_proc_alive(pid_t pid, uint64_t start);
/* kvt_proc_stat (state and start time from /proc/<pid>/stat) is in
 * common/util.h. */

#endif
