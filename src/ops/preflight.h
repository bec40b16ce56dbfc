/*
 * Start-up pre-flight of a cache root: which file system it lives on, how
 * big it is, whether it can ever hold the budget, and whether the root is on
 * the device the operator named (KVP_CACHE_DEVICE). Warnings only: the cache
 * is never wiped or refused at start. The adapter repeats the free-space
 * check once its start-up scan knows the cache's own bytes, and status
 * reports it live ("filesystem").
 */
#ifndef KVT_OPS_PREFLIGHT_H
#define KVT_OPS_PREFLIGHT_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

struct kvt_preflight {
    char checked[PATH_MAX]; /* the path statvfs'ed (the root or its nearest existing parent) */
    char device[PATH_MAX];  /* KVP_CACHE_DEVICE as given ("" = none) */
    char mount[PATH_MAX];   /* the device's mount point, if it is a mounted block device */
    uint64_t budget_bytes;
    uint64_t fs_total_bytes, fs_free_bytes;
    bool fs_can_hold_budget; /* total size >= budget */
    bool root_on_device;     /* true when no device was named */
    char warning[1024];      /* "" when all is well */
};

/* Never fails: problems become warnings. */
void kvt_preflight_run(const char *root, const char *device, uint64_t budget_bytes,
                       struct kvt_preflight *pf);
json_t *kvt_preflight_json(const struct kvt_preflight *pf);

#endif
