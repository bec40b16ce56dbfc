/*
 * Per-namespace quotas: the "namespace_quotas" adapter key and quotas.json.
 *
 * A namespace is the model as the nixl codec writes it in file names
 * (kvt_ns_name: every '/' as "--", '%' as "%25", a '-' before '-' or '/' as
 * "%2D"; key.h). A quota caps the
 * bytes one namespace may hold in one adapter; the base refuses a write that
 * would exceed it (KVT_E_LIMIT, counted) and, with an "eviction" block, the
 * eviction controller keeps each namespace under its quota (l2.h).
 *
 * Accepted forms, in the adapter JSON or in a file named by a string:
 *   "namespace_quotas": {"--models--A--v1": 200, "/models/B/v2": {"max_gb": 50},
 *                        "C": {"max_bytes": 1000000}, "D": "12.5"}
 *   "namespace_quotas": "/etc/kvtier/quotas.json"   (the same object in a file)
 * Numbers are GiB (JSON numbers or numeric strings); names may be given as
 * the model ("/models/B/v2") or as the namespace name ("--models--B--v2").
 * A name without '/' that is a namespace name is taken as one ("a--b" is the
 * namespace of "a/b"); a model without '/' whose namespace name differs
 * ("a--b", "50%") is named by its namespace name ("a%2D-b", "50%25").
 *
 * A name "@SALT" is a tenant's quota: it caps the bytes of every namespace
 * stored under the cache salt SALT (non-empty, the key rules for salts),
 * alone or beside a namespace's own quota (a write must fit both).
 *
 * Leaf module (jansson + libc): the adapter registry uses it at parse time.
 */
#ifndef KVT_OPS_QUOTA_H
#define KVT_OPS_QUOTA_H

#include <stddef.h>

#include <jansson.h>

/* Validate and resolve a "namespace_quotas" value. On success *out is a new
 * object {sanitized name: bytes (integer)} and 0 is returned; otherwise a
 * message (without the adapter prefix) goes to err and KVT_E_CONFIG is
 * returned (an unreadable quotas file included). */
int kvt_quota_parse(const json_t *v, json_t **out, char *err, size_t errcap);

/* The namespace name of a quota's name (a model or a namespace name, rules
 * above; a tenant's "@SALT" as it is) into out; returns its length, or -1
 * if it does not fit. */
int kvt_quota_ns_name(const char *in, char *out, size_t cap);

#endif
