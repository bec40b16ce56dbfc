/*
 * nixl_store_dynamic and nixl_store: one parser for both types' keys
 * (LMCache's NIXL backends and backend_params); nixl_store's object
 * backends (OBJ, AZURE_BLOB) are handed to the s3 engine (l2/s3/s3_nixl.h),
 * the GPU ones refused with what to use instead.
 */
#include "common/cfg.h"
#include "common/util.h"
#include "io/engine.h"
#include "kvtier/error.h"
#include "l2/nixl/nixl.h"
#include "l2/s3/s3_nixl.h"

#include <stdio.h>
#include <string.h>

static const char *const backends[] = {"POSIX", "GDS",        "GDS_MT", "HF3FS",
                                       "OBJ",   "AZURE_BLOB", NULL};

/* Refuse what this build cannot serve, with what to use instead. */
static int refuse_backend(struct kvt_cfg *c, const char *b)
{
    char msg[512];
    if (strcmp(b, "GDS") == 0 || strcmp(b, "GDS_MT") == 0)
        snprintf(msg, sizeof(msg),
                 "\"backend\" %s needs NVIDIA GPUDirect Storage (cuFile) and a GPU, which this "
                 "build does not have; use \"backend\": \"POSIX\" with the same backend_params "
                 "(\"use_direct_io\": \"true\" gives direct I/O to the same NVMe)",
                 b);
    else /* OBJ or AZURE_BLOB in nixl_store_dynamic (nixl_store serves them) */
        snprintf(msg, sizeof(msg),
                 "\"backend\" %s is an object store: nixl_store_dynamic serves file backends "
                 "only (POSIX, HF3FS); for object storage use nixl_store with this backend, or "
                 "the s3 adapter ({\"type\": \"s3\", \"s3_endpoint\": ..., \"s3_region\": ...})",
                 b);
    snprintf(c->err, c->errcap, "--l2-adapter #%d (%s): %s", c->index, c->type, msg);
    c->rc = KVT_E_UNSUPPORTED;
    return c->rc;
}

int kvt_nixl_parse(struct kvt_cfg *c, struct kvt_nixl_opts *o, bool dynamic)
{
    memset(o, 0, sizeof(*o));
    if (kvt_cfg_enum(c, "backend", true, NULL, backends, false, &o->backend))
        return c->rc;
    if (!dynamic && strcmp(o->backend, "OBJ") == 0)
        return kvt_s3_parse_nixl_obj(c, &o->obj); /* NIXL's OBJ plugin is S3 */
    if (!dynamic && strcmp(o->backend, "AZURE_BLOB") == 0)
        return kvt_s3_parse_nixl_azure(c, &o->obj); /* the s3 engine, Azure's dialect */
    if (strcmp(o->backend, "POSIX") != 0 && strcmp(o->backend, "HF3FS") != 0)
        return refuse_backend(c, o->backend);
    struct kvt_cfg bp;
    if (kvt_cfg_sub(c, "backend_params", true, &bp)) {
        kvt_cfg_free(&bp);
        return c->rc;
    }
    kvt_cfg_str(&bp, "file_path", true, NULL, &o->file_path);
    kvt_cfg_bool(&bp, "use_direct_io", false, &o->use_direct_io);
    if (dynamic) {
        double cap = 0;
        kvt_cfg_num(&bp, "max_capacity_gb", true, 0, 0, 1e9, &cap);
        if (!bp.rc && cap <= 0)
            kvt_cfg_fail(&bp, "max_capacity_gb",
                         "must be > 0: nixl_store_dynamic refuses stores beyond it (got %g)", cap);
        o->max_capacity_bytes = (uint64_t)(cap * KVT_GIB);
        kvt_cfg_bool(&bp, "shard_dirs", false, &o->shard_dirs);
    } else {
        int64_t page = 4096, fsz = 0;
        kvt_cfg_int(&bp, "page_size", false, 4096, 512, 32768, &page);
        if (!bp.rc && (page & (page - 1)))
            kvt_cfg_fail(&bp, "page_size", "must be a power of two (got %lld)", (long long)page);
        o->page_size = (uint32_t)page;
        /* 16 MiB: the seed's pool_size 64 is 1 GiB (docs/persistent-adapters.md) */
        kvt_cfg_int(&bp, "file_size", false, 16ll << 20, 1, 1ll << 40, &fsz);
        if (!bp.rc && fsz % page)
            kvt_cfg_fail(&bp, "file_size", "must be a multiple of page_size %lld (got %lld)",
                         (long long)page, (long long)fsz);
        o->file_size = (uint64_t)fsz;
    }
    if (!bp.rc && o->file_path && !o->file_path[0])
        kvt_cfg_fail(&bp, "file_path", "must not be empty");
    if (!bp.rc)
        kvt_cfg_finish(&bp);
    kvt_cfg_sub_done(c, "backend_params", &bp);
    if (c->rc)
        return c->rc;
    if (!dynamic) {
        int64_t ps = 0;
        kvt_cfg_int(c, "pool_size", true, 0, 1, 1 << 24, &ps);
        o->pool_size = (uint32_t)ps;
        uint64_t ppf = o->file_size / o->page_size;
        if (!c->rc && (ppf < 2 || ppf * o->pool_size > UINT32_MAX - 1))
            return kvt_cfg_fail(c, ppf < 2 ? "backend_params.file_size" : "pool_size",
                                "gives a pool of %u files x %llu pages of %u bytes: each file "
                                "needs at least 2 pages, the pool at most 2^32 pages",
                                o->pool_size, (unsigned long long)ppf, o->page_size);
        /* the pool's index is volatile whatever persist_enabled says, and
         * its files are preallocated in full: --dry-run shows both */
        json_object_set_new(c->resolved, "persist_enabled", json_false());
        json_object_set_new(c->resolved, "preallocated_bytes",
                            json_integer((json_int_t)(o->pool_size * o->file_size)));
    }
    static const char *const engines[] = {"posix", "io_uring", NULL};
    const char *eng = "posix";
    kvt_cfg_enum(c, "io_engine", false, "posix", engines, false, &eng);
    o->io_engine = kvt_ioeng_kind_parse(eng);
    int64_t qd = 64, nw = 4;
    kvt_cfg_int(c, "iouring_queue_depth", false, 64, 1, 4096, &qd);
    kvt_cfg_int(c, "num_workers", false, 4, 1, 1024, &nw);
    o->queue_depth = (int)qd;
    o->num_workers = (int)nw;
    kvt_cfg_bool(c, "durable", false, &o->durable);
    if (dynamic)
        kvt_cfg_bool(c, "shared", false, &o->shared);
    return c->rc;
}

const char *kvt_nixl_storage(const void *opts, const char **field, bool *is_dir)
{
    const struct kvt_nixl_opts *o = opts;
    *field = "backend_params.file_path";
    *is_dir = true;
    return o->file_path; /* NULL for the object backends */
}
