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
 *   anything (the device's kind, sizes, free space, device state and
 *   content, credentials), so that --dry-run refuses what the start would;
 *   kvt_l2_spec_check calls it after its own checks of the directory that
 *   storage names. 0, or an error with *field (the key it concerns, NULL
 *   for none) and a message naming the path. NULL: nothing to add.
 * storage: the local path the type stores into with these options: a
 *   directory (*is_dir true; kvt_l2_spec_check checks it) or a device or
 *   file (the type's check checks it, kvt_l2_check_device has the common
 *   part), with *field its key; NULL for a remote tier. NULL hook: the
 *   type never stores on this host.
 * shared_budget: "shared_budget": true on this type with these options
 *   (l2/budget.h): 0 when the type keeps a shared record (the registry then
 *   requires a cap and persist_enabled), KVT_L2_NO_BUDGET when it keeps none
 *   with these options, or c->rc after failing c with a reason of its own.
 *   NULL hook: never (the registry refuses the key, naming the types that
 *   have one and their shared_budget_needs).
 * shared_budget_needs: what the type needs beside the key, for that
 *   message ("with \"shared\": true"); NULL: nothing.
 * budget_max_interval_ms: with "shared_budget", the longest
 *   --eviction-interval-ms the type allows (0: any): a third of the lease
 *   of a record on a remote tier (KVT_L2_BUDGET_LEASE_MS), so that a cycle
 *   delayed by its own evictions or a slow step does not let the lease end
 *   and the server's entry fold while it runs (its stores in flight would
 *   then be counted twice, its later removals dropped).
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
    const char *(*storage)(const void *opts, const char **field, bool *is_dir);
    int (*shared_budget)(struct kvt_cfg *c, const void *opts);
    const char *shared_budget_needs;
    int budget_max_interval_ms;
};

/* kvt_l2_adapter_desc.shared_budget: no shared record with these options */
#define KVT_L2_NO_BUDGET 1

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
    char *quotas_file;       /* the file they came from (absolute, owned), or NULL */
    /* "shared_budget": the cap is one budget of every server sharing the
     * tier, kept in a shared record (l2/budget.h) */
    bool shared_budget;
    /* what the user typed, for messages ("--data-dir", "--config FILE");
     * "" = "--l2-adapter #<index> (<type>)". Set by the caller after parse. */
    char origin[320];
    const struct kvt_l2_adapter_desc *desc; /* the type's descriptor */
    void *opts; /* desc->opts_size bytes as desc->parse filled them (owned) */
    /* the server publishes KV events: the start-up scan reads the engine
     * block hashes objects were written with (kvt_l2.keep_tags). Set by
     * the caller after parse. */
    bool keep_tags;
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
/* The i-th descriptor of the table (registry.c), NULL past the end. */
const struct kvt_l2_adapter_desc *kvt_l2_adapter_at(size_t i);

/* ---- storage of a parsed spec (spec_check.c) ---- */
/* The local path a spec stores into (its type's storage hook; a wrapper
 * such as fault_inject answers for its inner adapter): a directory (*is_dir
 * true) or a device or file, *field its key ("base_path", "device_path",
 * ...); NULL for remote tiers. */
const char *kvt_l2_spec_storage(const struct kvt_l2_spec *s, const char **field, bool *is_dir);
/* What can be checked without changing anything (--dry-run runs it, and so
 * does every start before it opens an adapter): a directory the type
 * stores into is one (or can be created: kvt_l2_check_new) and is
 * writable, on a file system that holds files (not /proc or /sys); then
 * the type's own check (kvt_l2_adapter_desc.check: a device's kind,
 * sizes, free space, device state and content, credentials). 0, or an
 * error (KVT_E_CONFIG, or the type's) with *field (NULL when the message
 * is about no one key) and a message naming the path. */
int kvt_l2_spec_check(const struct kvt_l2_spec *s, const char **field, char *msg, size_t cap);
/* A path that does not exist yet and that open will create: its parent
 * exists, is a writable directory and is on a file system that holds
 * files (the adapters create one level only: a missing mount point is
 * never papered over by a new tree on the root file system). 0, or
 * KVT_E_CONFIG with a message naming both. */
int kvt_l2_check_new(const char *path, char *msg, size_t cap);
/* The common part of a device type's check: path is a regular file or a
 * device of file type dev_type (S_IFBLK, S_IFCHR; dev_what names it: "block
 * device"), readable and writable; or it does not exist and
 * kvt_l2_check_new allows it. 0, or KVT_E_CONFIG with a message. */
int kvt_l2_check_device(const char *path, unsigned dev_type, const char *dev_what, char *msg,
                        size_t cap);
/* Do two paths name the same directory or file (same device and inode, or
 * the same real path for one that does not exist yet)? shown: the real
 * path, for messages (may be NULL). */
bool kvt_l2_same_storage(const char *a, const char *b, char *shown, size_t cap);

/* ---- "shared_budget" (l2/budget.h) ---- */
/* A server's entry in a record kept on a remote tier (a hash on Redis, an
 * object in a bucket) is a lease on that server's clock, renewed by the
 * step each L2 eviction cycle makes: an entry older than this is a dead
 * server's and is folded. */
#define KVT_L2_BUDGET_LEASE_MS 30000
/* With "shared_budget": the type's budget_max_interval_ms (0: any). */
int kvt_l2_spec_max_interval_ms(const struct kvt_l2_spec *s);
/* For a shared_budget hook of a type whose record lives in a directory
 * several servers share: the key needs "shared": true. Returns c->rc. */
int kvt_l2_budget_needs_shared(struct kvt_cfg *c, bool shared);

#endif
