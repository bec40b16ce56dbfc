/* raw_block configuration: the seed's keys and defaults, LMCache's
 * validation messages, kvtier's extra checks. */
#include "common/util.h"
#include "io/engine.h"
#include "kvtier/error.h"
#include "l2/adapters.h"
#include "l2/raw_block/raw_block.h"

#include <stdio.h>
#include <string.h>

int kvt_raw_block_parse(struct kvt_cfg *c, void *opts)
{
    struct kvt_raw_block_opts *o = opts;
    memset(o, 0, sizeof(*o));
    bool pe = true;
    kvt_cfg_bool(c, "persist_enabled", true, &pe);
    if (!c->rc && !pe)
        return kvt_cfg_fail(c, "persist_enabled",
                            "must stay true: raw_block always persists (its slots and index "
                            "live on the device)");
    if (!c->rc && kvt_cfg_has(c, "per_tp_device_paths"))
        return kvt_cfg_fail(c, "per_tp_device_paths",
                            "is not supported: raw_block is one server-owned device (use one "
                            "device_path)");
    kvt_cfg_str(c, "device_path", true, NULL, &o->device_path);
    if (!c->rc && !o->device_path[0])
        return kvt_cfg_fail(c, "device_path", "must not be empty");
    int64_t v = 0;
    kvt_cfg_int(c, "slot_bytes", true, 0, 1, UINT32_MAX, &v); /* usage counts it in 32 bits */
    o->slot_bytes = (uint64_t)v;
    kvt_cfg_int(c, "capacity_bytes", false, 0, 0, INT64_MAX, &v);
    o->capacity_bytes = (uint64_t)v;
    kvt_cfg_bool(c, "use_odirect", true, &o->use_odirect);
    kvt_cfg_int(c, "block_align", false, 4096, 1, 1 << 20, &v);
    o->block_align = (uint32_t)v;
    kvt_cfg_int(c, "header_bytes", false, 4096, 1, 1 << 20, &v);
    o->header_bytes = (uint32_t)v;
    kvt_cfg_int(c, "meta_total_bytes", false, 256ll << 20, 1, INT64_MAX, &v);
    o->meta_total_bytes = (uint64_t)v;
    kvt_cfg_str(c, "meta_magic", false, "LMCIDX01", &o->meta_magic);
    if (!c->rc && strlen(o->meta_magic) != 8)
        return kvt_cfg_fail(c, "meta_magic", "must be exactly 8 ASCII characters (got \"%s\")",
                            o->meta_magic);
    for (const char *p = o->meta_magic; !c->rc && *p; p++)
        if (*p < 0x20 || *p > 0x7e)
            return kvt_cfg_fail(c, "meta_magic", "must be printable ASCII");
    kvt_cfg_int(c, "meta_version", false, 1, 0, UINT32_MAX, &v);
    o->meta_version = (uint32_t)v;
    kvt_cfg_int(c, "meta_checkpoint_interval_sec", false, 60, 1, 86400 * 365, &v);
    o->ckpt_interval_s = (uint32_t)v;
    kvt_cfg_int(c, "meta_idle_quiet_ms", false, 100, 0, 86400000, &v);
    o->idle_quiet_ms = (uint32_t)v;
    kvt_cfg_bool(c, "meta_enable_periodic", true, &o->periodic);
    kvt_cfg_bool(c, "load_checkpoint_on_init", true, &o->load_checkpoint);
    kvt_cfg_bool(c, "meta_verify_on_load", true, &o->verify_on_load);
    kvt_cfg_bool(c, "enable_zero_copy", true, &o->zero_copy);
    static const char *const engines[] = {"posix", "io_uring", NULL};
    const char *eng = "posix";
    bool use_iouring = false, use_uring = false;
    kvt_cfg_enum(c, "io_engine", false, "posix", engines, true, &eng);
    kvt_cfg_bool(c, "use_iouring", false, &use_iouring);
    kvt_cfg_bool(c, "use_uring", false, &use_uring);
    o->io_engine = (use_iouring || use_uring) ? KVT_IOENG_URING : kvt_ioeng_kind_parse(eng);
    kvt_cfg_int(c, "iouring_queue_depth", false, 256, 1, 4096, &v);
    o->queue_depth = (int)v;
    bool uring_cmd = false;
    kvt_cfg_bool(c, "use_uring_cmd", false, &uring_cmd);
    kvt_cfg_int(c, "max_data_transfer_size", false, 0, INT64_MIN, INT64_MAX, &v);
    o->max_xfer = v > 0 ? (uint64_t)v : 0;
    int64_t ns = 2, nl = 1, nd = 4;
    kvt_cfg_int(c, "num_store_workers", false, 2, 1, 1024, &ns);
    kvt_cfg_int(c, "num_lookup_workers", false, 1, 1, 1024, &nl);
    kvt_cfg_int(c, "num_load_workers", false, 4, 1, 1024, &nd);
    o->num_store_workers = (int)ns;
    o->num_lookup_workers = (int)nl;
    o->num_load_workers = (int)nd;
    kvt_cfg_bool(c, "durable", false, &o->durable);
    /* kvtier: what may be formatted (raw_block_probe.c) */
    static const char *const formats[] = {"if_empty", "force", NULL};
    const char *fmt = "if_empty";
    kvt_cfg_enum(c, "format", false, "if_empty", formats, false, &fmt);
    o->format_force = strcmp(fmt, "force") == 0;
    if (c->rc)
        return c->rc;
    uint32_t ba = o->block_align;
    if (ba & (ba - 1))
        return kvt_cfg_fail(c, "block_align", "must be a power of two (got %u)", ba);
    if (o->slot_bytes % ba)
        return kvt_cfg_fail(c, "slot_bytes", "must be a multiple of block_align %u (got %llu)", ba,
                            (unsigned long long)o->slot_bytes);
    if (o->header_bytes % ba)
        return kvt_cfg_fail(c, "header_bytes", "must be a multiple of block_align %u (got %u)", ba,
                            o->header_bytes);
    if (o->header_bytes < RB_MIN_HEADER)
        return kvt_cfg_fail(c, "header_bytes",
                            "must be at least %u: the slot header holds the object header "
                            "(512 bytes) and a slot trailer (got %u)",
                            RB_MIN_HEADER, o->header_bytes);
    if (o->meta_total_bytes % ba)
        return kvt_cfg_fail(c, "meta_total_bytes",
                            "must be a multiple of block_align %u (got %llu)", ba,
                            (unsigned long long)o->meta_total_bytes);
    /* a slot is header_bytes of header followed by slot_bytes of payload,
     * counted in 32 bits by the usage */
    if (o->slot_bytes + o->header_bytes > UINT32_MAX)
        return kvt_cfg_fail(c, "slot_bytes",
                            "must be at most %llu: a slot of slot_bytes plus header_bytes %u is "
                            "counted in 32 bits (got %llu)",
                            (unsigned long long)(UINT32_MAX - o->header_bytes) / ba * ba,
                            o->header_bytes, (unsigned long long)o->slot_bytes);
    if (o->capacity_bytes &&
        o->capacity_bytes < o->meta_total_bytes + o->slot_bytes + o->header_bytes)
        return kvt_cfg_fail(
            c, "capacity_bytes",
            "must hold meta_total_bytes %llu plus one slot of %llu "
            "(slot_bytes %llu + header_bytes %u): at least %llu (got %llu)",
            (unsigned long long)o->meta_total_bytes,
            (unsigned long long)(o->slot_bytes + o->header_bytes),
            (unsigned long long)o->slot_bytes, o->header_bytes,
            (unsigned long long)(o->meta_total_bytes + o->slot_bytes + o->header_bytes),
            (unsigned long long)o->capacity_bytes);
    if (o->meta_total_bytes / ba < 16)
        return kvt_cfg_fail(c, "meta_total_bytes",
                            "must hold at least 16 blocks of block_align (two checkpoint copies "
                            "and a journal): at least %u (got %llu)",
                            16 * ba, (unsigned long long)o->meta_total_bytes);
    if (uring_cmd && o->io_engine != KVT_IOENG_URING)
        return kvt_cfg_fail(c, "use_uring_cmd", "requires \"io_engine\": \"io_uring\"");
    if (uring_cmd) {
        snprintf(c->err, c->errcap,
                 "--l2-adapter #%d (%s): \"use_uring_cmd\" (NVMe passthrough) is not in this "
                 "build; remove it: \"io_engine\": \"io_uring\" alone drives the same device",
                 c->index, c->type);
        c->rc = KVT_E_UNSUPPORTED;
        return c->rc;
    }
    if (o->max_xfer && o->max_xfer % ba)
        o->max_xfer = KVT_MAX(o->max_xfer / ba * ba, ba);
    return 0;
}
