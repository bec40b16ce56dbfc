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
#include "policy/policy.h"

struct kvt_policy;
struct kvt_serde;
struct kvt_l2_spec;

/*
 * One adapter type, as its folder defines it (nginx's module descriptor):
 * registry.c lists the descriptors and nothing else, so a new adapter is a
 * folder and one table line. The option struct is the adapter's own: the
 * registry only sizes it.
 *
 * parse: reads the adapter's keys from c into opts (opts_size bytes,
 *   zeroed); strings may point into the spec's JSON. Returns c->rc.
 *   Called once, by kvt_l2_spec_parse; the spec keeps the result.
 * open: starts the adapter into l2 from the options parse filled in;
 *   0, or an error with a message in err (without the adapter's name).
 * opts_free: releases what parse allocated in opts (NULL: nothing).
 * check: what open would find on the host, checked without changing
 *   anything (sizes, free space, device state and content), so that
 *   --dry-run refuses what the start would; kvt_l2_spec_check calls it
 *   after its own checks. 0, or an error with *field (the key it concerns,
 *   NULL for none) and a message naming the path. NULL: nothing to add.
 */
struct kvt_l2_adapter_desc {
    const char *name; /* the "type" */
    size_t opts_size;
    int (*parse)(struct kvt_cfg *c, void *opts);
    int (*open)(kvt_l2 *l2, const struct kvt_l2_spec *spec, const void *opts, char *err,
                size_t errcap);
    void (*opts_free)(void *opts);
    int (*check)(const struct kvt_l2_spec *spec, const void *opts, const char **field, char *msg,
                 size_t cap);
};

/* A parsed adapter spec: type, resolved config, eviction policy, serde. */
struct kvt_l2_spec {
    int index;
    char type[32];
    json_t *json;     /* the user's object (owned) */
    json_t *resolved; /* every field with its default (owned) */
    bool persist_enabled;
    bool has_eviction; /* json has a valid "eviction" object, parsed into eviction */
    struct kvt_policy_cfg eviction;
    struct kvt_serde *serde; /* "serde" chain (owned reference) or NULL */
    char name_prefix[40];    /* adapter name before "[index]"; "" = the type */
    json_t *quotas;          /* "namespace_quotas" resolved {name: bytes} (owned) or NULL */
    /* "shared_budget": the cap is one budget of every server sharing the
     * tier, kept in a shared record (l2/budget.h) */
    bool shared_budget;
    /* what the user typed, for messages ("--data-dir", "--config FILE");
     * "" = "--l2-adapter #<index> (<type>)". Set by the caller after parse. */
    char origin[320];
    const struct kvt_l2_adapter_desc *desc; /* the type's descriptor */
    void *opts; /* desc->opts_size bytes as desc->parse filled them (owned) */
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
/* What can be checked without changing anything (--dry-run runs it, and so
 * does every start before it opens an adapter): the directory is one (or
 * can be created: its parent exists, is writable and is on a file system
 * that holds files, not /proc or /sys) and is writable; the device exists
 * (raw_block without capacity_bytes) and is of the right kind and
 * read-write; s3 finds credentials; then the type's own check (sizes, free
 * space, device state and content: kvt_l2_adapter_desc.check). 0, or an
 * error (KVT_E_CONFIG, or the type's) with *field (NULL when the message
 * is about no one key) and a message naming the path. */
int kvt_l2_spec_check(const struct kvt_l2_spec *s, const char **field, char *msg, size_t cap);
/* Do two paths name the same directory or file (same device and inode, or
 * the same real path for one that does not exist yet)? shown: the real
 * path, for messages (may be NULL). */
bool kvt_l2_same_storage(const char *a, const char *b, char *shown, size_t cap);

/* ---- "shared_budget" on Redis (l2/resp/resp_budget.c) ---- */
/* A server's entry in a Redis record is a lease on the Redis server's
 * clock, renewed by the step each L2 eviction cycle makes: an entry older
 * than this is a dead server's and is folded. */
#define KVT_RESP_BUDGET_LEASE_MS 30000
/* The same lease in a bucket's record (l2/s3/s3_budget.c), on the S3
 * server's clock (its answers' Date header). */
#define KVT_S3_BUDGET_LEASE_MS KVT_RESP_BUDGET_LEASE_MS
/* The longest --eviction-interval-ms an adapter allows (0: any): a third of
 * the lease for "shared_budget" on Redis (resp, valkey) and S3 (s3, nixl_store
 * OBJ), so that a cycle
 * delayed by its own evictions or a slow step does not let the lease end
 * and the server's entry fold while it runs (its stores in flight would
 * then be counted twice, its later removals dropped). */
int kvt_l2_spec_max_interval_ms(const struct kvt_l2_spec *s);

/* ---- s3 (l2/s3): what spec_check asks of it ---- */
/* Can a server started now sign requests? explicit_keys: the config has
 * them; else the environment or the credentials file must (as at open).
 * 0, or KVT_E_CONFIG with the message open would give. */
int kvt_s3_creds_check(bool explicit_keys, char *err, size_t errcap);

/* ---- nixl_store's "OBJ" backend (NIXL's S3 plugin), served by the s3
 * engine: nixl_store hands the whole config over ---- */
/* Parse {"backend": "OBJ", "backend_params": {NIXL's keys}, "pool_size"}
 * into s3 options; *opts is allocated here (free with kvt_s3_nixl_obj_free).
 * Returns c->rc. */
int kvt_s3_parse_nixl_obj(struct kvt_cfg *c, void **opts);
/* Open the s3 engine from what kvt_s3_parse_nixl_obj parsed. */
int kvt_s3_open_nixl_obj(kvt_l2 *l2, const struct kvt_l2_spec *spec, const void *opts, char *err,
                         size_t errcap);
void kvt_s3_nixl_obj_free(void *opts);
/* {"backend": "AZURE_BLOB", "backend_params": {account_url, container_name,
 * ...}}: the s3 engine in Azure Blob's dialect; opened and freed as OBJ. */
int kvt_s3_parse_nixl_azure(struct kvt_cfg *c, void **opts);
/* Can a server started now authenticate to Azure (an account key or SAS in
 * the config or the environment)? 0, or KVT_E_CONFIG with the message. */
int kvt_s3_azure_creds_check(bool explicit_creds, char *err, size_t errcap);

#endif
