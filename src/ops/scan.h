/*
 * Walking a cache root offline: the nixl_store_dynamic layout (flat *.bin
 * files, or hex[0:2]/hex[2:4]/ shard directories), the fs adapter's flat
 * *.data files, tmp files, registry markers, legacy kvp-* directories. Used by `kvtier status
 * --root` and by `kvtier purge` when no server serves the root.
 *
 * Namespaces are the file-name prefix of an object name
 *   {namespace}_{kv_rank:08x}_{group:x}_{chunk hex}[@salt].bin
 * i.e. the escaped model (kvt_ns_name, key.h) exactly as on disk; for an fs
 * name the same kvt_ns_name of its decoded model, as the server reports it.
 *
 * Nothing here follows a symbolic link: entries are lstat'ed, directories
 * opened with O_NOFOLLOW, and only regular files are reported as objects or
 * tmp files. Glue (CLI side); not used by the server's hot paths.
 */
#ifndef KVT_OPS_SCAN_H
#define KVT_OPS_SCAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <jansson.h>

#include "key/key.h"
#include "l2/kit/tmpguard.h"

enum kvt_entry_kind { KVT_ENT_OBJECT, KVT_ENT_TMP, KVT_ENT_OTHER };

struct kvt_entry {
    enum kvt_entry_kind kind;
    int dfd;          /* directory holding it (the root or a shard directory) */
    const char *name; /* entry name in dfd */
    const struct stat *st;
    /* KVT_ENT_OBJECT: the decoded key (nixl_store_dynamic's codec; its
     * namespace interned) and its namespace name (kvt_ns_name: the file-name
     * prefix) */
    kvt_key key;
    const char *ns;
};

/* Called for every regular file; return false to stop the walk. */
typedef bool (*kvt_walk_fn)(const struct kvt_entry *e, void *arg);

/* Walk the root open at rootfd. Returns 0 or -errno. */
int kvt_walk_root(int rootfd, kvt_walk_fn fn, void *arg);

/* Decode an object file name into *k and its namespace name (*ns, from
 * kvt_ns_name: valid for the process); false when the name is not a cache
 * object name (nixl_store_dynamic's codec, ".bin", or fs's, ".data"). */
bool kvt_object_key(const char *name, kvt_key *k, const char **ns);

/* A namespace name an operator may pass to purge: not empty, no '/', no
 * NUL, not "." or "..", no '@' (a namespace never has one). */
bool kvt_ns_name_ok(const char *name);

struct kvt_scan {
    uint64_t used_bytes; /* object files (+ legacy kvp-* directories) */
    uint64_t objects;
    json_t *per_ns_bytes; /* namespace -> bytes (owned) */
    json_t *per_ns_objects;
    uint64_t tmp_files, tmp_bytes;
    uint64_t tmp_n[KVT_TMP_NVERDICTS], tmp_b[KVT_TMP_NVERDICTS];
    uint64_t legacy_bytes;             /* kvp-* directories (the seed counts them as used) */
    uint64_t other_files, other_bytes; /* files that are none of the above */
    uint64_t markers;                  /* registry markers in .tmp_guard/ */
    uint64_t fs_total_bytes, fs_free_bytes;
};

/* Scan a root. Returns 0, or -errno (e.g. -ENOENT: no such directory).
 * tmp_only: count tmp files only (other names are not even lstat'ed). */
int kvt_scan_root(const char *root, struct kvt_scan *s, bool tmp_only);
void kvt_scan_free(struct kvt_scan *s);

/* Processes other than this one that hold the root directory open (a
 * running server's adapter keeps a descriptor on it). Returns how many
 * were found (at most max stored). Only processes we may inspect count. */
int kvt_root_users(const char *root, pid_t *pids, int max);

#endif
