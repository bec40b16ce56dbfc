/*
 * Purge: delete a namespace, everything, or crash residue (tmp files).
 *
 * Two ways, one set of rules:
 *   - through a running server (kvt_purge_l2, the "purge" operation): the
 *     adapter's index is the list, kvt_l2_delete removes each object, so the
 *     server's accounting (used_bytes, per-namespace bytes, quotas) stays
 *     exact. Pinned objects (being read) and objects being written are left
 *     and reported. Files of the namespace the server does not index (put
 *     there by another process) are removed afterwards, tmp files by the tmp
 *     guard's rules.
 *   - offline (kvt_purge_root), when no server serves the root: a walk of
 *     the root that unlinks cache object files of the namespace (or all) and
 *     removable tmp files.
 * Only regular files whose names are cache object names (or tmp names) are
 * ever removed, never through a symbolic link, never outside the root.
 * Namespace matching is exact (no substrings, no patterns).
 */
#ifndef KVT_OPS_PURGE_H
#define KVT_OPS_PURGE_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "l2/l2.h"

enum kvt_purge_what { KVT_PURGE_NAMESPACE, KVT_PURGE_ALL, KVT_PURGE_TMP };

struct kvt_purge_req {
    enum kvt_purge_what what;
    char ns[256]; /* KVT_PURGE_NAMESPACE */
    uint32_t max; /* objects per call through a server (0 = no limit) */
    /* through a server: called with each batch of keys taken from the
     * adapter's index, before they are deleted there (the server drops its
     * L1 copies with it); may be NULL */
    void (*on_keys)(const kvt_key *keys, uint32_t n, void *arg);
    void *on_keys_arg;
};

struct kvt_purge_res {
    uint64_t matched; /* objects of the selection found (before removal) */
    uint64_t removed, removed_bytes;
    uint64_t l1_removed;                 /* copies dropped from the server's memory tier */
    uint64_t pinned, in_flight;          /* left in place: being read / being written */
    uint64_t files_removed, files_bytes; /* unindexed object files (server), or all (offline) */
    uint64_t tmp_removed, tmp_bytes, tmp_kept;
    uint64_t markers_swept;
    bool more; /* the per-call limit was reached: call again */
};

/* Purge through one adapter of a running server (blocking; a worker thread
 * calls it). root: the adapter's directory as kvt_l2_root gives it
 * (the caller asks once per request; "" or NULL: no files to walk).
 * Returns 0, -EBUSY at once while the adapter's start-up scan runs (the
 * client retries), or -errno. */
int kvt_purge_l2(kvt_l2 *l2, const char *root, const struct kvt_purge_req *q,
                 struct kvt_purge_res *r);

/* Progress of an offline purge: done of total files. */
typedef void (*kvt_purge_progress)(uint64_t done, uint64_t total, uint64_t bytes, void *arg);

/* Offline purge of a root. count_only: only fill matched (and tmp counts).
 * Returns 0 or -errno. */
int kvt_purge_root(const char *root, const struct kvt_purge_req *q, bool count_only,
                   kvt_purge_progress progress, void *arg, struct kvt_purge_res *r);

json_t *kvt_purge_res_json(const struct kvt_purge_res *r);

#endif
