/*
 * The operator's config file: configs/cache.env in the seed's style, with
 * local overrides in <file>.local, turned into one nixl_store_dynamic
 * adapter (hard cap = budget) plus what the CLI needs (root, server URL).
 *
 * Syntax (a subset of POSIX shell assignments, so `source cache.env` in a
 * script means the same):
 *   # comment
 *   KVP_CACHE_ROOT=/data/kvcache
 *   export KVP_CACHE_BUDGET_GB=1500
 *   KVP_CACHE_DEVICE="${NVME_MOUNT:-/data}"     # $NAME, ${NAME}, ${NAME:-default}
 *   KVP_QUOTAS_FILE='quotas.json'               # single quotes: literal
 * Expansions see variables set earlier in the files, then the environment;
 * an unset variable without a default is an error. Later assignments win
 * (so <file>.local overrides <file>). Relative paths are relative to the
 * directory of the file that set them. Unknown KVP_* names are errors (a
 * typo must not silently fall back to a default); other names may be set
 * for expansions and are otherwise ignored.
 *
 * Variables and defaults: see kvt_envcfg_vars() and docs/operations.md.
 */
#ifndef KVT_OPS_ENVCFG_H
#define KVT_OPS_ENVCFG_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

struct kvt_envcfg {
    char file[PATH_MAX];   /* the config file as given */
    char root[PATH_MAX];   /* KVP_CACHE_ROOT (absolute) */
    double budget_gb;      /* KVP_CACHE_BUDGET_GB: 1500 */
    char device[PATH_MAX]; /* KVP_CACHE_DEVICE: "" = the file system of the root */
    double watermark;      /* KVP_TRIGGER_WATERMARK: 0.9 */
    double ratio;          /* KVP_EVICTION_RATIO: 0.1 */
    char policy[16];       /* KVP_EVICTION_POLICY: LRU, a policy of the table, or none */
    double half_life_h;    /* KVP_VALUE_HALF_LIFE_HOURS: 0 = aging (value policy) */
    char quotas[PATH_MAX]; /* KVP_QUOTAS_FILE: "" = no quotas */
    char url[300];         /* KVP_SERVER_URL: tcp://127.0.0.1:5555 */
    bool url_set;          /* KVP_SERVER_URL was given */
    bool direct_io;        /* KVP_USE_DIRECT_IO: false */
    char io_engine[16];    /* KVP_IO_ENGINE: posix */
    int num_workers;       /* KVP_NUM_WORKERS: 4 */
    bool durable;          /* KVP_DURABLE: false */
    bool shard_dirs;       /* KVP_SHARD_DIRS: false */
    json_t *sources;       /* KVP name -> "file:line" or "default" (owned) */
    json_t *quotas_bytes;  /* KVP_QUOTAS_FILE parsed: namespace -> bytes (owned), or NULL */
};

/* Read path and path.local (if present). 0, or KVT_E_CONFIG (a file that
 * cannot be read included) with a message naming the file, line and
 * variable in err. */
int kvt_envcfg_load(const char *path, struct kvt_envcfg *c, char *err, size_t errcap);
void kvt_envcfg_free(struct kvt_envcfg *c);

/* The --l2-adapter JSON this config stands for (malloc'd string). */
char *kvt_envcfg_adapter_json(const struct kvt_envcfg *c);
/* Every value with its source, for --dry-run and status. Caller decrefs. */
json_t *kvt_envcfg_json(const struct kvt_envcfg *c);

#endif
