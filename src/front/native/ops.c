/*
 * The operation table: one row per operation (name, handler, flags), read
 * by dispatch, the permission checks and the per-operation counters; and
 * the operations that need nothing else: hello and ping. Adding an
 * operation adds a handler and a row (docs/extending.md).
 */
#include "common/secret.h"
#include "common/util.h"
#include "front/native/native_int.h"
#include "kvtier/error.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* In this order in /status and /metrics. */
const struct kvt_op kvt_ops[] = {
    {"hello", kvt_op_hello, KVT_OPF_HELLO},
    {"ping", kvt_op_ping, 0},
    {"store", kvt_op_store, KVT_OPF_WRITE},
    {"flush", kvt_op_flush, 0},
    {"lookup", kvt_op_lookup, 0},
    {"retrieve", kvt_op_retrieve, 0},
    {"free_locks", kvt_op_free_locks, 0},
    {"prepare_store", kvt_op_prepare_store, KVT_OPF_WRITE},
    {"commit_store", kvt_op_commit_store, 0},
    {"prepare_retrieve", kvt_op_prepare_retrieve, 0},
    {"commit_retrieve", kvt_op_commit_retrieve, 0},
    {"status", kvt_op_status, KVT_OPF_ADMIN},
    {"delete", kvt_op_delete, KVT_OPF_WRITE},
    {"purge", kvt_op_purge, KVT_OPF_ADMIN},
    {"unknown", NULL, 0}, /* last: requests with no known operation */
};
const uint32_t kvt_nops = sizeof(kvt_ops) / sizeof(kvt_ops[0]);

struct kvt_native *kvt_native_new(const struct kvt_front_env *env, struct kvt_server *host,
                                  const char *boot_id)
{
    struct kvt_native *n = kvt_xcalloc(1, sizeof(*n));
    n->env = env;
    n->host = host;
    n->boot_id = boot_id;
    n->ops = kvt_xcalloc(kvt_nops, sizeof(*n->ops));
    return n;
}

void kvt_native_free(struct kvt_native *n)
{
    if (!n)
        return;
    free(n->ops);
    free(n);
}

/* --------------------------------------------------------------- helpers */

void kvt_native_reply(struct kvt_native *n, struct reply *r, bool on_rpc)
{
    if (on_rpc)
        kvt_reply_send(n->host, r);
    else
        kvt_reply_post(n->host, r);
}

struct kvt_l1_owner kvt_native_owner(struct reply *r)
{
    return (struct kvt_l1_owner){zmq_msg_data(&r->ident), (uint32_t)zmq_msg_size(&r->ident)};
}

void kvt_native_lease_refused(struct reply *r, int rc, uint64_t lease)
{
    if (rc == KVT_E_LEASE_OWNER)
        kvt_reply_error(r, rc, "lease %llu belongs to another connection",
                        (unsigned long long)lease);
    else
        kvt_reply_error(r, rc, "lease %llu covers other keys than this request's",
                        (unsigned long long)lease);
}

static void deny(struct reply *r, const char *fmt, const char *arg)
{
    if (r->who)
        atomic_fetch_add(&r->who->denied, 1);
    kvt_reply_error(r, KVT_E_DENIED, fmt, r->who ? r->who->name : "(none)", arg);
}

/* With authentication on, may r's key use these keys' salts (and, for an
 * operation flagged KVT_OPF_WRITE, store or delete)? Otherwise r becomes an
 * E_DENIED reply, counted for the key. Always true without
 * authentication. */
static bool auth_allows(struct kvt_native *n, struct reply *r, const kvt_key *keys, uint32_t cnt)
{
    if (!n->env->auth)
        return true;
    if (!r->who) {
        deny(r, "key %s: this connection has no authenticated key%s", "");
        return false;
    }
    if ((kvt_ops[r->op].flags & KVT_OPF_WRITE) && !r->who->rw) {
        deny(r, "key %s is read-only: it may not %s", kvt_ops[r->op].name);
        return false;
    }
    uint32_t ns = 0; /* a batch has one salt: check each distinct one once */
    for (uint32_t i = 0; i < cnt; i++) {
        if (keys[i].ns == ns)
            continue;
        ns = keys[i].ns;
        if (!kvt_auth_salt_ok(r->who, kvt_ns_salt(ns))) {
            const char *salt = kvt_ns_salt(ns);
            deny(r, "key %s may not use the cache salt \"%s\" (not one of its tenants)",
                 salt[0] ? salt : "(none)");
            return false;
        }
    }
    return true;
}

int kvt_native_keys(struct kvt_native *n, struct request *q, kvt_key **keys, uint32_t *cnt)
{
    const char *why = "invalid keys";
    int rc = kvt_wire_keys_decode(&q->body, keys, cnt, &why);
    if (rc) {
        kvt_reply_error(q->r, rc, "%s", why);
        return rc;
    }
    if (!auth_allows(n, q->r, *keys, *cnt)) {
        free(*keys);
        *keys = NULL;
        return KVT_E_DENIED;
    }
    return 0;
}

/* a same-host connection with authentication on, before its ticket */
#define LOCAL_UNBOUND_MSG                                                                          \
    "this same-host connection has no key: its first request must be a hello with the ticket "     \
    "(bin, single use, 30 s) from a hello over CURVE (docs/protocol.md)"

void kvt_op_hello(struct kvt_native *n, struct request *q)
{
    struct reply *r = q->r;
    /* version is required; any integer other than ours (negative too) is a
     * version mismatch, anything else a malformed hello */
    const msgpack_object *ver = kvt_mp_get(&q->body, "version");
    if (!ver || (ver->type != MSGPACK_OBJECT_POSITIVE_INTEGER &&
                 ver->type != MSGPACK_OBJECT_NEGATIVE_INTEGER)) {
        kvt_reply_error(r, KVT_E_BADREQ, "hello needs {version: %d} (an integer)",
                        KVT_PROTO_VERSION);
        return;
    }
    if (ver->type == MSGPACK_OBJECT_NEGATIVE_INTEGER || ver->via.u64 != KVT_PROTO_VERSION) {
        if (ver->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
            kvt_reply_error(r, KVT_E_PROTO, "client speaks protocol %lld, server speaks %d",
                            (long long)ver->via.i64, KVT_PROTO_VERSION);
        else
            kvt_reply_error(r, KVT_E_PROTO, "client speaks protocol %llu, server speaks %d",
                            (unsigned long long)ver->via.u64, KVT_PROTO_VERSION);
        return;
    }
    bool same_host = kvt_local_is_ident(&r->ident);
    if (n->env->auth && same_host && !r->who) {
        /* authentication on: this same-host connection is nobody's until it
         * presents a ticket that a hello over CURVE handed to a key */
        const msgpack_object *t = kvt_mp_get(&q->body, "ticket");
        if (!t || t->type != MSGPACK_OBJECT_BIN ||
            !(r->who = kvt_local_redeem(n->host, &r->ident, t->via.bin.ptr, t->via.bin.size))) {
            atomic_fetch_add(&n->local_denied, 1);
            kvt_reply_error(r, KVT_E_DENIED, LOCAL_UNBOUND_MSG);
            return;
        }
        atomic_fetch_add(&n->local_bound, 1);
    }
    msgpack_packer *pk = &r->pk;
    const char *local = kvt_local_name(n->host);
    uint8_t ticket[KVT_LOCAL_TICKET_BYTES];
    bool give =
        local && n->env->auth && !same_host && kvt_local_ticket(n->host, r->who, ticket) == 0;
    msgpack_pack_map(pk, (local ? 12 : 10) + (give ? 1 : 0));
    if (local) {
        kvt_mp_str0(pk, "local");
        kvt_mp_str0(pk, local);
        kvt_mp_str0(pk, "boot_id");
        kvt_mp_str0(pk, n->boot_id);
    }
    if (give) {
        kvt_mp_str0(pk, "ticket");
        msgpack_pack_bin(pk, sizeof(ticket));
        msgpack_pack_bin_body(pk, ticket, sizeof(ticket));
        kvt_secret_wipe(ticket, sizeof(ticket));
    }
    kvt_mp_str0(pk, "version");
    msgpack_pack_int(pk, KVT_PROTO_VERSION);
    kvt_mp_str0(pk, "server");
    kvt_mp_str0(pk, "kvtier " KVT_VERSION);
    kvt_mp_str0(pk, "chunk_size");
    msgpack_pack_int(pk, n->env->chunk_size);
    kvt_mp_str0(pk, "max_object_bytes");
    msgpack_pack_uint64(pk, n->env->max_object_bytes);
    kvt_mp_str0(pk, "max_batch");
    msgpack_pack_uint32(pk, KVT_MAX_BATCH);
    /* key limits in bytes (docs/protocol.md "Keys"; key.h) */
    kvt_mp_str0(pk, "max_model_bytes");
    msgpack_pack_uint32(pk, KVT_MODEL_MAX);
    kvt_mp_str0(pk, "max_salt_bytes");
    msgpack_pack_uint32(pk, KVT_SALT_MAX);
    kvt_mp_str0(pk, "max_name_bytes");
    msgpack_pack_uint32(pk, KVT_NAME_MAX);
    kvt_mp_str0(pk, "l2_adapters");
    msgpack_pack_int(pk, kvt_core_nl2(n->env->core));
    kvt_mp_str0(pk, "shm");
    if (!n->env->shm) {
        msgpack_pack_nil(pk);
        return;
    }
    struct kvt_l1_shm shm;
    kvt_core_shm(n->env->core, &shm);
    msgpack_pack_map(pk, 8);
    kvt_mp_str0(pk, "pool");
    msgpack_pack_uint64(pk, shm.pool_id);
    kvt_mp_str0(pk, "pid");
    msgpack_pack_int(pk, (int)getpid());
    kvt_mp_str0(pk, "fd");
    msgpack_pack_int(pk, shm.fd);
    kvt_mp_str0(pk, "size");
    msgpack_pack_uint64(pk, shm.map_size);
    kvt_mp_str0(pk, "align");
    msgpack_pack_uint32(pk, shm.align);
    kvt_mp_str0(pk, "dev");
    msgpack_pack_uint64(pk, shm.dev);
    kvt_mp_str0(pk, "ino");
    msgpack_pack_uint64(pk, shm.ino);
    kvt_mp_str0(pk, "boot_id");
    kvt_mp_str0(pk, n->boot_id);
}

void kvt_op_ping(struct kvt_native *n, struct request *q)
{
    (void)n;
    msgpack_pack_map(&q->r->pk, 0);
}

/* ------------------------------------------------------------- dispatch */

/* May this request run? With authentication on: over CURVE, its key went
 * in a reload (ZAP named every peer it admitted); a same-host connection
 * gets its key from the ticket in its first hello; an admin operation needs
 * an admin key. Otherwise r becomes the E_DENIED reply. */
static bool admitted(struct kvt_native *n, const struct kvt_op *op, struct reply *r)
{
    if (!n->env->auth)
        return true;
    bool same_host = kvt_local_is_ident(&r->ident);
    if (!r->who && !((op->flags & KVT_OPF_HELLO) && same_host)) {
        if (same_host) {
            /* counted with the hellos that had no valid ticket */
            atomic_fetch_add(&n->local_denied, 1);
            kvt_reply_error(r, KVT_E_DENIED,
                            "%s; or its key was removed from the authorized-clients file by "
                            "a reload",
                            LOCAL_UNBOUND_MSG);
        } else {
            kvt_reply_error(r, KVT_E_DENIED,
                            "this connection's key is not (or no longer, after "
                            "a reload) in the authorized-clients file");
        }
        return false;
    }
    if ((op->flags & KVT_OPF_ADMIN) && !(r->who && r->who->admin)) {
        /* status and purge: operators only */
        deny(r, "key %s is not an admin key: %s is for operators", op->name);
        return false;
    }
    return true;
}

void kvt_native_dispatch(struct kvt_native *n, uint32_t op, struct request *q)
{
    const struct kvt_op *row = &kvt_ops[op];
    if (!row->proc)
        kvt_reply_error(q->r, KVT_E_BADOP, "unknown operation");
    else if (admitted(n, row, q->r))
        row->proc(n, q);
    if (q->r) { /* handled synchronously: reply now */
        if (q->r->status)
            atomic_fetch_add(&n->bad_requests, 1);
        kvt_reply_send(n->host, q->r);
        q->r = NULL;
    }
}
