/*
 * What the operator commands (status, purge) share: which cache root and
 * which server they talk about, from --config / --root / --url, and small
 * formatting helpers.
 */
#ifndef KVT_OPS_CLI_H
#define KVT_OPS_CLI_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "ops/envcfg.h"

#define KVT_DEFAULT_URL "tcp://127.0.0.1:5555"

struct kvt_cli_target {
    char root[PATH_MAX]; /* the cache root (real path), "" when none was given */
    char url[300];       /* the server: --url, else KVP_SERVER_URL, else the default */
    bool url_given;      /* --url, or KVP_SERVER_URL in the config */
    bool have_cfg;
    struct kvt_envcfg cfg;
};

/* Resolve the target. need_root: a root is required. A --root that is not
 * the config's KVP_CACHE_ROOT, "/" or a missing directory is refused.
 * Returns 0, or 2 (the exit status) after printing why, prefixed by cmd. */
int kvt_cli_target(const char *cmd, const char *config, const char *root, const char *url,
                   bool need_root, struct kvt_cli_target *t);
void kvt_cli_target_free(struct kvt_cli_target *t);

/* Same directory (device and inode). */
bool kvt_same_dir(const char *a, const char *b);

/* The directory an adapter of a server status keeps its files in: its
 * "file_path" (nixl_store_dynamic, nixl_store) or "base_path" (fs,
 * fs_native); NULL when it has none. */
const char *kvt_cli_adapter_root(const json_t *ad);

/* The adapter of a server status that keeps its files in root; without a
 * root the first one with a directory, else the first. NULL: none. */
json_t *kvt_cli_pick_adapter(const json_t *status, const char *root);

/* "1.23 GiB" */
void kvt_human(char *out, size_t cap, double bytes);

#endif
