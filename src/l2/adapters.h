/*
 * Adapter registry: turns one --l2-adapter JSON into a running adapter.
 *
 * Parsing and opening are separate so that --dry-run validates every field
 * (and prints the resolved config) without touching storage.
 */
#ifndef KVT_ADAPTERS_H
#define KVT_ADAPTERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "common/cfg.h"
#include "l2/l2.h"

struct kvt_policy;
struct kvt_serde;

/* A parsed adapter spec: type, resolved config, eviction policy, serde. */
struct kvt_l2_spec {
    int index;
    char type[32];
    json_t *json;          /* the user's object (owned) */
    json_t *resolved;      /* every field with its default (owned) */
    bool persist_enabled;
    bool has_eviction;     /* json has a valid "eviction" object (checked at parse) */
    struct kvt_serde *serde; /* "serde" chain (owned reference) or NULL */
    char name_prefix[40];    /* adapter name before "[index]"; "" = the type */
    json_t *quotas;          /* "namespace_quotas" resolved {name: bytes} (owned) or NULL */
    /* what the user typed, for messages ("--data-dir", "--config FILE");
     * "" = "--l2-adapter #<index> (<type>)". Set by the caller after parse. */
    char origin[320];
};

/* Parse one --l2-adapter argument. On error returns KVT_E_CONFIG (or
 * KVT_E_UNSUPPORTED for what this build cannot serve) with a message that
 * names the adapter index, type and field. */
int kvt_l2_spec_parse(const char *text, int index, struct kvt_l2_spec *spec, char *err,
                      size_t errcap);
void kvt_l2_spec_free(struct kvt_l2_spec *spec);
/* Create and start the adapter described by a parsed spec. */
int kvt_l2_open(const struct kvt_l2_spec *spec, kvt_l2 **out, char *err, size_t errcap);
/* The same into caller-provided storage (wrappers open their inner adapter). */
int kvt_l2_open_into(const struct kvt_l2_spec *spec, kvt_l2 *l2, char *err, size_t errcap);
/* Known adapter types, for messages. */
const char *kvt_l2_types(void);

/* ---- storage of a parsed spec (spec_check.c) ---- */
/* The local path a spec stores into: a directory (fs, fs_native,
 * nixl_store(_dynamic); *is_dir true) or a device or file (raw_block, dax);
 * NULL for remote tiers. *field is its key ("base_path",
 * "backend_params.file_path", "device_path"); fault_inject answers for its
 * inner adapter. */
const char *kvt_l2_spec_storage(const struct kvt_l2_spec *s, const char **field, bool *is_dir);
/* What can be checked without opening anything (--dry-run runs it): the
 * directory is one (or can be created: its parent exists and is writable)
 * and is writable; the device exists (raw_block without capacity_bytes) and
 * is of the right kind and read-write; s3 finds credentials. 0, or
 * KVT_E_CONFIG with *field (NULL when the message is about no one key) and
 * a message naming the path. */
int kvt_l2_spec_check(const struct kvt_l2_spec *s, const char **field, char *msg, size_t cap);
/* Do two paths name the same directory or file (same device and inode, or
 * the same real path for one that does not exist yet)? shown: the real
 * path, for messages (may be NULL). */
bool kvt_l2_same_storage(const char *a, const char *b, char *shown, size_t cap);

/* ---- fs / fs_native ---- */
struct kvt_fs_opts {
    const char *base_path;
    const char *relative_tmp_dir;
    uint64_t read_ahead_size;
    bool use_odirect;
    int num_workers;
    uint64_t max_capacity_bytes;
    bool durable;
    bool native; /* fs_native: O_DIRECT on a misaligned buffer is an error */
    bool shared; /* "shared": other servers use base_path too (l2/kit/dirlock.h) */
};
int kvt_fs_parse(struct kvt_cfg *c, struct kvt_fs_opts *o, bool native);
int kvt_fs_open(kvt_l2 *l2, const struct kvt_l2_spec *spec, const struct kvt_fs_opts *o,
                char *err, size_t errcap);

/* ---- mock ---- */
struct kvt_mock_opts {
    uint64_t max_size_bytes;
    double bandwidth_bytes_per_s;
};
int kvt_mock_parse(struct kvt_cfg *c, struct kvt_mock_opts *o);
int kvt_mock_open(kvt_l2 *l2, const struct kvt_l2_spec *spec, const struct kvt_mock_opts *o,
                  char *err, size_t errcap);

/* ---- nixl_store_dynamic / nixl_store (nixl_dynamic.c, nixl_store.c) ---- */
struct kvt_nixl_opts {
    const char *backend; /* POSIX or HF3FS (others are refused at parse) */
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
};
int kvt_nixl_parse(struct kvt_cfg *c, struct kvt_nixl_opts *o, bool dynamic);
int kvt_nixl_dynamic_open(kvt_l2 *l2, const struct kvt_l2_spec *spec,
                          const struct kvt_nixl_opts *o, char *err, size_t errcap);
int kvt_nixl_store_open(kvt_l2 *l2, const struct kvt_l2_spec *spec, const struct kvt_nixl_opts *o,
                        char *err, size_t errcap);

/* ---- raw_block (raw_block.c) ---- */
struct kvt_raw_block_opts {
    const char *device_path;
    uint64_t slot_bytes, capacity_bytes, meta_total_bytes, max_xfer;
    uint32_t block_align, header_bytes, meta_version;
    const char *meta_magic;
    uint32_t ckpt_interval_s, idle_quiet_ms;
    bool use_odirect, periodic, load_checkpoint, verify_on_load, zero_copy, durable;
    int io_engine, queue_depth;
    int num_store_workers, num_lookup_workers, num_load_workers;
};
int kvt_raw_block_parse(struct kvt_cfg *c, struct kvt_raw_block_opts *o);
int kvt_raw_block_open(kvt_l2 *l2, const struct kvt_l2_spec *spec,
                       const struct kvt_raw_block_opts *o, char *err, size_t errcap);

/* ---- dax (dax.c) ---- */
struct kvt_dax_opts {
    const char *device_path;
    uint64_t size_bytes, slot_bytes;
    int num_store_workers, num_lookup_workers, num_load_workers;
    bool durable;
};
int kvt_dax_parse(struct kvt_cfg *c, struct kvt_dax_opts *o);
int kvt_dax_open(kvt_l2 *l2, const struct kvt_l2_spec *spec, const struct kvt_dax_opts *o,
                 char *err, size_t errcap);

/* ---- resp / valkey (resp.c) ---- */
struct kvt_resp_opts {
    const char *host; /* points into the JSON, or at node_host */
    int port;
    char node_host[256]; /* first startup_nodes entry */
    int nnodes;
    const char *username, *password, *key_prefix;
    int num_workers;
    double connection_timeout, request_timeout; /* seconds */
    int database_id;
    uint64_t max_capacity_bytes;
};
int kvt_resp_parse(struct kvt_cfg *c, struct kvt_resp_opts *o, bool valkey);
int kvt_resp_open(kvt_l2 *l2, const struct kvt_l2_spec *spec, const struct kvt_resp_opts *o,
                  char *err, size_t errcap);

/* ---- s3 (s3.c, s3_http.c) ---- */
struct kvt_s3_opts {
    const char *endpoint, *region, *bucket_opt, *addressing, *key_prefix;
    const char *key_id, *secret, *token; /* NULL: environment or credentials file */
    int num_io_threads;                  /* concurrent transfers */
    bool prefer_http2, disable_tls;
    double connection_timeout, request_timeout; /* seconds */
    int breaker_threshold;
    uint64_t max_capacity_bytes;
    /* resolved from the above */
    char scheme[8], host[400], bucket[128];
    bool path_style;
};
int kvt_s3_parse(struct kvt_cfg *c, struct kvt_s3_opts *o);
/* Can a server started now sign requests? explicit_keys: the config has
 * them; else the environment or the credentials file must (as at open).
 * 0, or KVT_E_CONFIG with the message open would give. */
int kvt_s3_creds_check(bool explicit_keys, char *err, size_t errcap);
int kvt_s3_open(kvt_l2 *l2, const struct kvt_l2_spec *spec, const struct kvt_s3_opts *o,
                char *err, size_t errcap);

/* ---- mooncake_store (mooncake.c): parsed, then refused in this build ---- */
struct kvt_mooncake_opts {
    int num_workers;
    int per_op_workers[4]; /* lookup, retrieve, store, delete; 0 = shared pool */
};
int kvt_mooncake_parse(struct kvt_cfg *c, struct kvt_mooncake_opts *o);
int kvt_mooncake_open(kvt_l2 *l2, const struct kvt_l2_spec *spec,
                      const struct kvt_mooncake_opts *o, char *err, size_t errcap);

/* ---- fault_inject (test/diagnostic wrapper) ---- */
struct kvt_fault_opts {
    const json_t *inner; /* points into the spec's JSON */
    double rate;
    uint64_t seed;
    uint32_t gaps[64];
    int ngaps;
    double ratios[64];
    int nratios;
};
int kvt_fault_parse(struct kvt_cfg *c, struct kvt_fault_opts *o);
int kvt_fault_open(kvt_l2 *l2, const struct kvt_l2_spec *spec, const struct kvt_fault_opts *o,
                   char *err, size_t errcap);

#endif
