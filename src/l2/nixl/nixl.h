/*
 * nixl_store_dynamic and nixl_store: their options (private to this folder).
 * One parser for both (nixl_dynamic.c); each file opens its own type.
 */
#ifndef KVT_L2_NIXL_H
#define KVT_L2_NIXL_H

#include <stdbool.h>
#include <stdint.h>

#include "common/cfg.h"

struct kvt_nixl_opts {
    const char *backend; /* POSIX, HF3FS, or OBJ for nixl_store (others are refused at parse) */
    const char *file_path;
    bool use_direct_io;
    uint64_t max_capacity_bytes; /* dynamic */
    bool shard_dirs;             /* dynamic */
    uint32_t pool_size;          /* static pool */
    uint64_t file_size;          /* static pool */
    uint32_t page_size;          /* static pool */
    int io_engine;               /* enum kvt_ioeng_kind */
    int queue_depth;             /* io_uring */
    int num_workers;
    bool durable;
    bool shared; /* dynamic: "shared", other servers use file_path too (l2/kit/dirlock.h) */
    void *
        obj; /* static pool, backend OBJ or AZURE_BLOB: the s3 engine's options (l2/s3/s3_nixl.h) */
};

/* dynamic: nixl_store_dynamic's keys, else nixl_store's. Returns c->rc. */
int kvt_nixl_parse(struct kvt_cfg *c, struct kvt_nixl_opts *o, bool dynamic);
/* Both types' kvt_l2_adapter_desc.storage: the directory file_path. */
const char *kvt_nixl_storage(const void *opts, const char **field, bool *is_dir);

#endif
