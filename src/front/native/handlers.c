/*
 * Operation handlers. Each handler ends with exactly one reply: sent on the
 * rpc thread, or posted from a worker / controller thread. Request schemas
 * are in docs/protocol.md.
 */
#include "common/log.h"
#include "common/secret.h"
#include "common/util.h"
#include "kvtier/error.h"
#include "ops/cli.h"
#include "ops/purge.h"
#include "ops/scan.h"
#include "server/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <string.h>
#include <unistd.h>

#define INLINE_STORE_BYTES (64u << 10) /* smaller stores are copied on the rpc thread */

/* --------------------------------------------------------------- helpers */

static void reply_now(struct kvt_server *s, struct reply *r, bool on_rpc)
{
    if (on_rpc)
        kvt_reply_send(s, r);
    else
        kvt_reply_post(s, r);
}

static void pack_meta(msgpack_packer *pk, const kvt_objmeta *m)
{
    msgpack_pack_array(pk, 3);
    msgpack_pack_uint32(pk, m->len);
    kvt_mp_str0(pk, kvt_dtype_name(m->dtype));
    msgpack_pack_array(pk, m->ndim);
    for (int d = 0; d < m->ndim; d++)
        msgpack_pack_uint32(pk, m->shape[d]);
}

/* Leases belong to the connection that took them: its routing id. */
static struct kvt_l1_owner owner_of(struct reply *r)
{
    return (struct kvt_l1_owner){zmq_msg_data(&r->ident), (uint32_t)zmq_msg_size(&r->ident)};
}

/* The error reply for a lease that cannot be used as named (nothing of it
 * changed): another connection's, or a retrieve of other keys. */
static void lease_refused(struct reply *r, int rc, uint64_t lease)
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

bool kvt_auth_allows(struct kvt_server *s, struct reply *r, const kvt_key *keys, uint32_t n,
                     bool write)
{
    if (!s->cfg->auth)
        return true;
    if (!r->who) {
        deny(r, "key %s: this connection has no authenticated key%s", "");
        return false;
    }
    if (write && !r->who->rw) {
        deny(r, "key %s is read-only: it may not %s", kvt_op_names[r->op]);
        return false;
    }
    uint32_t ns = 0; /* a batch has one salt: check each distinct one once */
    for (uint32_t i = 0; i < n; i++) {
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

/* status and purge: operators only, with authentication on */
static bool admin_only(struct kvt_server *s, struct reply *r)
{
    if (!s->cfg->auth || (r->who && r->who->admin))
        return true;
    deny(r, "key %s is not an admin key: %s is for operators", kvt_op_names[r->op]);
    return false;
}

/* The request's keys, decoded and checked against its key's tenants. */
static int get_keys(struct kvt_server *s, struct request *q, kvt_key **keys, uint32_t *n,
                    bool write)
{
    const char *why = "invalid keys";
    int rc = kvt_wire_keys_decode(&q->body, keys, n, &why);
    if (rc) {
        kvt_reply_error(q->r, rc, "%s", why);
        return rc;
    }
    if (!kvt_auth_allows(s, q->r, *keys, *n, write)) {
        free(*keys);
        *keys = NULL;
        return KVT_E_DENIED;
    }
    return 0;
}

/* ---------------------------------------------------------------- hello */

/* a same-host connection with authentication on, before its ticket */
#define LOCAL_UNBOUND_MSG                                                                          \
    "this same-host connection has no key: its first request must be a hello with the ticket "     \
    "(bin, single use, 30 s) from a hello over CURVE (docs/protocol.md)"

static void h_hello(struct kvt_server *s, struct request *q)
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
    if (s->cfg->auth && same_host && !r->who) {
        /* authentication on: this same-host connection is nobody's until it
         * presents a ticket that a hello over CURVE handed to a key */
        const msgpack_object *t = kvt_mp_get(&q->body, "ticket");
        if (!t || t->type != MSGPACK_OBJECT_BIN ||
            !(r->who = kvt_local_redeem(s, &r->ident, t->via.bin.ptr, t->via.bin.size))) {
            atomic_fetch_add(&s->local_denied, 1);
            kvt_reply_error(r, KVT_E_DENIED, LOCAL_UNBOUND_MSG);
            return;
        }
        atomic_fetch_add(&s->local_bound, 1);
    }
    msgpack_packer *pk = &r->pk;
    const char *local = kvt_local_name(s);
    uint8_t ticket[KVT_LOCAL_TICKET_BYTES];
    bool give = local && s->cfg->auth && !same_host && kvt_local_ticket(s, r->who, ticket) == 0;
    msgpack_pack_map(pk, (local ? 12 : 10) + (give ? 1 : 0));
    if (local) {
        kvt_mp_str0(pk, "local");
        kvt_mp_str0(pk, local);
        kvt_mp_str0(pk, "boot_id");
        kvt_mp_str0(pk, s->boot_id);
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
    msgpack_pack_int(pk, s->cfg->chunk_size);
    kvt_mp_str0(pk, "max_object_bytes");
    msgpack_pack_uint64(pk, s->cfg->max_object_bytes);
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
    msgpack_pack_int(pk, s->nl2);
    kvt_mp_str0(pk, "shm");
    if (!s->cfg->shm) {
        msgpack_pack_nil(pk);
        return;
    }
    struct kvt_l1_shm shm;
    kvt_l1_shm(s->l1, &shm);
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
    kvt_mp_str0(pk, s->boot_id);
}

/* ---------------------------------------------------------------- store */

struct store_job {
    struct kvt_job job;
    struct kvt_server *s;
    struct reply *r;
    kvt_key *keys;
    uint32_t n;
    zmq_msg_t *frames;
    kvt_objmeta meta;
};

static void do_store(struct store_job *j)
{
    struct kvt_server *s = j->s;
    struct kvt_l1_ref *refs = kvt_xmalloc((j->n ? j->n : 1) * sizeof(*refs));
    kvt_key *keys = kvt_xmalloc((j->n ? j->n : 1) * sizeof(kvt_key));
    uint32_t *hs = kvt_xmalloc((j->n ? j->n : 1) * sizeof(uint32_t));
    int32_t *codes = kvt_xcalloc(j->n ? j->n : 1, sizeof(int32_t));
    uint32_t k = 0, accepted = 0, nfail = 0;
    for (uint32_t i = 0; i < j->n; i++) {
        kvt_objmeta m = j->meta;
        m.len = (uint32_t)zmq_msg_size(&j->frames[i]);
        int rc = kvt_l1_reserve(s->l1, &j->keys[i], &m, &refs[k]);
        if (rc == -EEXIST) {
            accepted++; /* already stored (content-addressed): nothing to do */
            continue;
        }
        if (rc) {
            codes[i] = rc;
            nfail++;
            continue;
        }
        memcpy(refs[k].ptr, zmq_msg_data(&j->frames[i]), m.len);
        keys[k] = j->keys[i];
        hs[k] = refs[k].h;
        k++;
        accepted++;
    }
    kvt_l1_commit(s->l1, hs, k, 0);
    if (k) /* references move to the controller */
        kvt_store_ctrl_submit_for(s->sc, refs, keys, k, kvt_client_tag(j->r));
    msgpack_packer *pk = &j->r->pk;
    msgpack_pack_map(pk, 2);
    kvt_mp_str0(pk, "accepted");
    msgpack_pack_uint32(pk, accepted);
    kvt_mp_str0(pk, "failed");
    msgpack_pack_array(pk, nfail);
    for (uint32_t i = 0; i < j->n; i++)
        if (codes[i]) {
            msgpack_pack_array(pk, 2);
            msgpack_pack_uint32(pk, i);
            msgpack_pack_int32(pk, codes[i]);
        }
    free(refs);
    free(keys);
    free(hs);
    free(codes);
    for (uint32_t i = 0; i < j->n; i++)
        zmq_msg_close(&j->frames[i]);
}

static void store_job_fn(struct kvt_job *job, void *ctx)
{
    (void)ctx;
    struct store_job *j = (struct store_job *)job;
    do_store(j);
    kvt_reply_post(j->s, j->r);
    free(j->frames);
    free(j->keys);
    free(j);
}

static void h_store(struct kvt_server *s, struct request *q)
{
    kvt_key *keys;
    uint32_t n;
    if (get_keys(s, q, &keys, &n, true))
        return;
    const char *why;
    kvt_objmeta meta;
    int rc = kvt_wire_meta_decode(&q->body, &meta, &why);
    if (rc) {
        kvt_reply_error(q->r, rc, "%s", why);
        free(keys);
        return;
    }
    if (q->nframes != n) {
        kvt_reply_error(q->r, KVT_E_BADREQ, "store has %u keys but %u data frames", n, q->nframes);
        free(keys);
        return;
    }
    uint64_t total = 0;
    for (uint32_t i = 0; i < n; i++) {
        size_t len = zmq_msg_size(&q->frames[i]);
        if (len > s->cfg->max_object_bytes) {
            kvt_reply_error(q->r, KVT_E_TOOBIG,
                            "object %u is %zu bytes; the server accepts at most %llu", i, len,
                            (unsigned long long)s->cfg->max_object_bytes);
            free(keys);
            return;
        }
        total += len;
    }
    struct store_job *j = kvt_xcalloc(1, sizeof(*j));
    j->s = s;
    j->r = q->r;
    j->keys = keys;
    j->n = n;
    j->meta = meta;
    j->frames = kvt_xmalloc((n ? n : 1) * sizeof(zmq_msg_t));
    memcpy(j->frames, q->frames, n * sizeof(zmq_msg_t)); /* move ownership */
    q->nframes = 0;
    q->r = NULL;
    if (total <= INLINE_STORE_BYTES) {
        do_store(j);
        kvt_reply_send(s, j->r);
        free(j->frames);
        free(j->keys);
        free(j);
        return;
    }
    j->job.fn = store_job_fn;
    kvt_tpool_push(s->workers, &j->job);
}

/* ---------------------------------------------------------------- flush */

uint64_t kvt_client_tag(const struct reply *r)
{
    /* FNV-1a of the routing id (ZeroMQ's, or the same-host socket's
     * connection id): the same connection always gets the same tag */
    const uint8_t *p = zmq_msg_data((zmq_msg_t *)&r->ident);
    size_t n = zmq_msg_size((zmq_msg_t *)&r->ident);
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h | 1;
}

#define FLUSH_LIST_MAX 1024 /* failed keys listed in one flush reply */

/*
 * The flush reply: {l2_failed, failed: [...], failed_truncated}. Built when
 * it is sent (every store acknowledged before the flush has then finished
 * on every adapter), from what the store controller recorded for this
 * client: each (key, adapter) that did not reach L2 since the client's
 * previous flush reply, reported once.
 */
static void pack_flush_reply(struct kvt_server *s, struct reply *r, uint64_t client)
{
    struct kvt_store_failure *fv = NULL;
    uint32_t listed = 0;
    uint64_t total = kvt_store_ctrl_take_failures(s->sc, client, FLUSH_LIST_MAX, &fv, &listed);
    msgpack_packer *pk = &r->pk;
    msgpack_pack_map(pk, 3);
    kvt_mp_str0(pk, "l2_failed");
    msgpack_pack_uint64(pk, total);
    kvt_mp_str0(pk, "failed");
    msgpack_pack_array(pk, listed);
    for (uint32_t i = 0; i < listed; i++) {
        const struct kvt_store_failure *f = &fv[i];
        msgpack_pack_map(pk, 9);
        kvt_mp_str0(pk, "adapter");
        msgpack_pack_int(pk, f->adapter);
        kvt_mp_str0(pk, "name");
        kvt_mp_str0(pk, f->adapter < s->nl2 ? kvt_l2_name(s->l2s[f->adapter]) : "?");
        kvt_mp_str0(pk, "code");
        msgpack_pack_int32(pk, f->code);
        kvt_mp_str0(pk, "error");
        kvt_mp_str0(pk, kvt_errname(f->code));
        kvt_mp_str0(pk, "model");
        kvt_mp_str0(pk, kvt_ns_model(f->key.ns));
        kvt_mp_str0(pk, "kv_rank");
        msgpack_pack_uint32(pk, f->key.kv_rank);
        kvt_mp_str0(pk, "group");
        msgpack_pack_uint32(pk, f->key.group);
        kvt_mp_str0(pk, "salt");
        kvt_mp_str0(pk, kvt_ns_salt(f->key.ns));
        kvt_mp_str0(pk, "hash");
        msgpack_pack_bin(pk, f->key.hash_len);
        msgpack_pack_bin_body(pk, f->key.hash, f->key.hash_len);
    }
    kvt_mp_str0(pk, "failed_truncated");
    if (total > listed)
        msgpack_pack_true(pk);
    else
        msgpack_pack_false(pk);
    free(fv);
}

/* A flush is answered once every store this connection sent before it
 * finished on every adapter (the store controller counts each client's
 * batches in flight): other clients' stores, stuck or not, never hold it. */
static void h_flush(struct kvt_server *s, struct request *q)
{
    struct flush_wait *f = kvt_xcalloc(1, sizeof(*f));
    f->client = kvt_client_tag(q->r);
    f->r = q->r;
    if (kvt_store_ctrl_flush_wait(s->sc, f->client, f)) {
        pack_flush_reply(s, q->r, f->client);
        free(f);
        return;
    }
    q->r = NULL; /* answered by kvt_flush_progress */
}

void kvt_flush_progress(struct kvt_server *s)
{
    void *ready[64];
    size_t n;
    while ((n = kvt_store_ctrl_take_flushed(s->sc, ready, KVT_ARRAY_LEN(ready))) > 0) {
        for (size_t i = 0; i < n; i++) {
            struct flush_wait *f = ready[i];
            pack_flush_reply(s, f->r, f->client);
            kvt_reply_send(s, f->r);
            free(f);
        }
    }
}

/* ------------------------------------------------- lookup and retrieve */

struct fetch {
    struct kvt_server *s;
    struct reply *r;
    enum kvt_op op;
    kvt_key *keys;
    uint32_t n, m; /* m: served from L1 before prefetching */
    struct kvt_l1_ref *refs;
    bool leased; /* served from a lookup's lease: that lookup was the use */
};

static void finish_fetch(struct fetch *f, uint32_t total, bool on_rpc)
{
    struct kvt_server *s = f->s;
    struct reply *r = f->r;
    uint32_t *hs = kvt_xmalloc((total ? total : 1) * sizeof(uint32_t));
    for (uint32_t i = 0; i < total; i++)
        hs[i] = f->refs[i].h;
    /* one use per request: a frequency policy (LFU, ARC) must not count the
     * lookup and the retrieve that follows it as two */
    if (!f->leased)
        kvt_l1_touch(s->l1, hs, total);
    msgpack_packer *pk = &r->pk;
    if (f->op == OP_RETRIEVE) {
        msgpack_pack_map(pk, 2);
        kvt_mp_str0(pk, "n");
        msgpack_pack_uint32(pk, total);
        kvt_mp_str0(pk, "metas");
        msgpack_pack_array(pk, total);
        for (uint32_t i = 0; i < total; i++)
            pack_meta(pk, &f->refs[i].meta);
        r->frames = f->refs; /* references travel with the frames */
        r->nframes = total;
        f->refs = NULL;
    } else {
        struct kvt_l1_owner ow = owner_of(r);
        uint64_t lease = total ? kvt_l1_lease_new(s->l1, KVT_LEASE_READ, hs, total, &ow) : 0;
        if (f->op == OP_LOOKUP) {
            msgpack_pack_map(pk, 2);
            kvt_mp_str0(pk, "hits");
            msgpack_pack_uint32(pk, total);
            kvt_mp_str0(pk, "lease");
            msgpack_pack_uint64(pk, lease);
        } else { /* prepare_retrieve: offsets are only meaningful in this pool */
            msgpack_pack_map(pk, 4);
            kvt_mp_str0(pk, "pool");
            msgpack_pack_uint64(pk, kvt_l1_pool_id(s->l1));
            kvt_mp_str0(pk, "lease");
            msgpack_pack_uint64(pk, lease);
            kvt_mp_str0(pk, "n");
            msgpack_pack_uint32(pk, total);
            kvt_mp_str0(pk, "entries");
            msgpack_pack_array(pk, total);
            for (uint32_t i = 0; i < total; i++) {
                msgpack_pack_array(pk, 2);
                msgpack_pack_uint64(pk, f->refs[i].off);
                pack_meta(pk, &f->refs[i].meta);
            }
        }
    }
    free(hs);
    free(f->refs);
    free(f->keys);
    reply_now(s, r, on_rpc);
    free(f);
}

static void on_prefetched(void *arg, uint32_t k, struct kvt_l1_ref *refs)
{
    struct fetch *f = arg;
    memcpy(f->refs + f->m, refs, k * sizeof(*refs));
    free(refs);
    finish_fetch(f, f->m + k, false);
}

/* Serve the request's keys from a lease taken by an earlier lookup of this
 * connection: the first keys must be the lease's. Returns how many were
 * referenced, KVT_E_EXPIRED when the lease is gone (then the caller looks up
 * again), or the refusal (another connection's lease, other keys: the lease
 * is left as it was). */
static int from_lease(struct kvt_server *s, uint64_t lease, struct fetch *f)
{
    struct kvt_l1_owner ow = owner_of(f->r);
    return kvt_l1_lease_take(s->l1, lease, &ow, f->keys, f->n, f->refs);
}

static void h_fetch(struct kvt_server *s, struct request *q, enum kvt_op op)
{
    struct fetch *f = kvt_xcalloc(1, sizeof(*f));
    f->s = s;
    f->op = op;
    if (get_keys(s, q, &f->keys, &f->n, false)) {
        free(f);
        return;
    }
    f->refs = kvt_xcalloc(f->n ? f->n : 1, sizeof(*f->refs));
    uint64_t lease = 0, release = 0;
    const char *why;
    int rc = 0;
    if (op == OP_LOOKUP)
        rc = kvt_mp_u64(&q->body, "release", false, &release, &why);
    else
        rc = kvt_mp_u64(&q->body, "lease", false, &lease, &why);
    if (rc) {
        kvt_reply_error(q->r, KVT_E_BADREQ, "%s", why);
        free(f->keys);
        free(f->refs);
        free(f);
        return;
    }
    /* a lookup may release the client's previous, unused read lease (one
     * that expired meanwhile is no error; another connection's is) */
    if (release) {
        struct kvt_l1_owner ow = owner_of(q->r);
        rc = kvt_l1_lease_end(s->l1, release, KVT_LEASE_READ, &ow, NULL, NULL, 0);
        if (rc == KVT_E_LEASE_OWNER) {
            lease_refused(q->r, rc, release);
            free(f->keys);
            free(f->refs);
            free(f);
            return;
        }
    }
    f->r = q->r;
    q->r = NULL;
    if (lease) {
        int k = from_lease(s, lease, f);
        if (k >= 0) {
            f->leased = true;
            finish_fetch(f, (uint32_t)k, true);
            return;
        }
        if (k != KVT_E_EXPIRED) {
            q->r = f->r; /* answered by kvt_handle */
            lease_refused(q->r, k, lease);
            free(f->keys);
            free(f->refs);
            free(f);
            return;
        }
    }
    if (op == OP_LOOKUP)
        kvt_l1_note_request(s->l1, f->keys, f->n);
    f->m = kvt_l1_get_prefix(s->l1, f->keys, f->n, f->refs);
    if (f->m == f->n || s->nl2 == 0) {
        finish_fetch(f, f->m, true);
        return;
    }
    kvt_debug("Prefetch request submitted: %u total keys, %u L1 prefix hits, %u remaining for L2",
              f->n, f->m, f->n - f->m);
    kvt_prefetch_submit(s->pc, f->keys + f->m, f->n - f->m, on_prefetched, f);
}

static void h_free_locks(struct kvt_server *s, struct request *q)
{
    uint64_t lease = 0;
    const char *why;
    if (kvt_mp_u64(&q->body, "lease", true, &lease, &why)) {
        kvt_reply_error(q->r, KVT_E_BADREQ, "%s", why);
        return;
    }
    struct kvt_l1_owner ow = owner_of(q->r);
    /* either kind: a write lease (prepare_store) is given back with nothing
     * published, as commit_store with no bit set would */
    int rc = kvt_l1_lease_drop(s->l1, lease, &ow);
    if (rc == KVT_E_LEASE_OWNER) {
        lease_refused(q->r, rc, lease);
        return;
    }
    msgpack_pack_map(&q->r->pk, 1);
    kvt_mp_str0(&q->r->pk, "released");
    if (rc < 0)
        msgpack_pack_false(&q->r->pk);
    else
        msgpack_pack_true(&q->r->pk);
}

static void h_commit_retrieve(struct kvt_server *s, struct request *q)
{
    uint64_t lease = 0;
    const char *why;
    if (kvt_mp_u64(&q->body, "lease", true, &lease, &why)) {
        kvt_reply_error(q->r, KVT_E_BADREQ, "%s", why);
        return;
    }
    struct kvt_l1_owner ow = owner_of(q->r);
    int rc = kvt_l1_lease_end(s->l1, lease, KVT_LEASE_READ, &ow, NULL, NULL, 0);
    if (rc == KVT_E_LEASE_OWNER) {
        lease_refused(q->r, rc, lease);
        return;
    }
    if (rc < 0) {
        kvt_reply_error(q->r, KVT_E_EXPIRED,
                        "read lease %llu expired or unknown: discard what was read",
                        (unsigned long long)lease);
        return;
    }
    msgpack_pack_map(&q->r->pk, 1);
    kvt_mp_str0(&q->r->pk, "valid");
    msgpack_pack_true(&q->r->pk);
}

/* ------------------------------------------------ zero-copy store path */

static void h_prepare_store(struct kvt_server *s, struct request *q)
{
    kvt_key *keys;
    uint32_t n;
    if (get_keys(s, q, &keys, &n, true))
        return;
    const char *why;
    kvt_objmeta meta;
    int rc = kvt_wire_meta_decode(&q->body, &meta, &why);
    const msgpack_object *sizes = kvt_mp_get(&q->body, "sizes");
    if (!rc && (!sizes || sizes->type != MSGPACK_OBJECT_ARRAY || sizes->via.array.size != n)) {
        why = "\"sizes\" must be an array with one size per key";
        rc = KVT_E_BADREQ;
    }
    for (uint32_t i = 0; !rc && i < n; i++) {
        const msgpack_object *v = &sizes->via.array.ptr[i];
        if (v->type != MSGPACK_OBJECT_POSITIVE_INTEGER) {
            why = "each size must be a non-negative integer";
            rc = KVT_E_BADREQ;
        } else if (v->via.u64 > s->cfg->max_object_bytes) {
            why = "an object is larger than the server accepts";
            rc = KVT_E_TOOBIG;
        }
    }
    if (rc) {
        kvt_reply_error(q->r, rc, "%s", why);
        free(keys);
        return;
    }
    uint32_t *hs = kvt_xmalloc((n ? n : 1) * sizeof(uint32_t));
    int64_t *offs = kvt_xmalloc((n ? n : 1) * sizeof(int64_t));
    int32_t *codes = kvt_xcalloc(n ? n : 1, sizeof(int32_t));
    uint32_t k = 0;
    for (uint32_t i = 0; i < n; i++) {
        kvt_objmeta m = meta;
        m.len = (uint32_t)sizes->via.array.ptr[i].via.u64;
        struct kvt_l1_ref ref;
        rc = kvt_l1_reserve(s->l1, &keys[i], &m, &ref);
        if (rc == 0) {
            hs[k++] = ref.h;
            offs[i] = (int64_t)ref.off;
        } else {
            offs[i] = -1;
            codes[i] = rc == -EEXIST ? 0 : rc; /* present: nothing to write */
        }
    }
    struct kvt_l1_owner ow = owner_of(q->r);
    uint64_t lease = k ? kvt_l1_lease_new(s->l1, KVT_LEASE_WRITE, hs, k, &ow) : 0;
    msgpack_packer *pk = &q->r->pk;
    msgpack_pack_map(pk, 4);
    kvt_mp_str0(pk, "pool"); /* offsets are only meaningful in this pool */
    msgpack_pack_uint64(pk, kvt_l1_pool_id(s->l1));
    kvt_mp_str0(pk, "lease");
    msgpack_pack_uint64(pk, lease);
    kvt_mp_str0(pk, "offsets");
    msgpack_pack_array(pk, n);
    for (uint32_t i = 0; i < n; i++)
        msgpack_pack_int64(pk, offs[i]);
    kvt_mp_str0(pk, "codes");
    msgpack_pack_array(pk, n);
    for (uint32_t i = 0; i < n; i++)
        msgpack_pack_int32(pk, codes[i]);
    free(hs);
    free(offs);
    free(codes);
    free(keys);
}

static void h_commit_store(struct kvt_server *s, struct request *q)
{
    uint64_t lease = 0;
    const char *why;
    if (kvt_mp_u64(&q->body, "lease", true, &lease, &why)) {
        kvt_reply_error(q->r, KVT_E_BADREQ, "%s", why);
        return;
    }
    const msgpack_object *w = kvt_mp_get(&q->body, "written");
    struct kvt_l1_owner ow = owner_of(q->r);
    int nl = kvt_l1_lease_handles(s->l1, lease, KVT_LEASE_WRITE, &ow, NULL, 0);
    if (nl == KVT_E_LEASE_OWNER) {
        lease_refused(q->r, nl, lease);
        return;
    }
    if (nl < 0) {
        kvt_reply_error(q->r, KVT_E_EXPIRED,
                        "write lease %llu expired or unknown: nothing was stored",
                        (unsigned long long)lease);
        return;
    }
    uint32_t total = (uint32_t)nl;
    uint64_t *bits = NULL;
    if (w && w->type != MSGPACK_OBJECT_NIL) {
        if (w->type != MSGPACK_OBJECT_BIN || w->via.bin.size * 8 < total) {
            kvt_reply_error(q->r, KVT_E_BADREQ,
                            "\"written\" must be a bitmap (bin) with one bit per reserved slot");
            return;
        }
        bits = kvt_xcalloc(kvt_bm_words(total ? total : 1), sizeof(uint64_t));
        memcpy(bits, w->via.bin.ptr, KVT_MIN(w->via.bin.size, kvt_bm_words(total) * 8));
    }
    uint32_t *keep = kvt_xmalloc((total ? total : 1) * sizeof(uint32_t));
    int committed = kvt_l1_lease_end(s->l1, lease, KVT_LEASE_WRITE, &ow, bits, keep, total);
    free(bits);
    if (committed < 0) {
        free(keep);
        kvt_reply_error(q->r, KVT_E_EXPIRED, "write lease %llu expired: nothing was stored",
                        (unsigned long long)lease);
        return;
    }
    struct kvt_l1_ref *refs =
        kvt_xmalloc(((uint32_t)committed ? (uint32_t)committed : 1) * sizeof(*refs));
    kvt_key *keys = kvt_xmalloc(((uint32_t)committed ? (uint32_t)committed : 1) * sizeof(kvt_key));
    for (int i = 0; i < committed; i++)
        kvt_l1_describe(s->l1, keep[i], &refs[i], &keys[i]);
    if (committed)
        kvt_store_ctrl_submit_for(s->sc, refs, keys, (uint32_t)committed, kvt_client_tag(q->r));
    free(refs);
    free(keys);
    free(keep);
    msgpack_pack_map(&q->r->pk, 1);
    kvt_mp_str0(&q->r->pk, "accepted");
    msgpack_pack_int(&q->r->pk, committed);
}

/* ------------------------------------------------------- status, delete */

static void h_status(struct kvt_server *s, struct request *q)
{
    if (!admin_only(s, q->r))
        return;
    json_t *st = kvt_server_status(s);
    kvt_mp_pack_json(&q->r->pk, st);
    json_decref(st);
}

struct delete_job {
    struct kvt_job job;
    struct kvt_server *s;
    struct reply *r;
    kvt_key *keys;
    uint32_t n;
};

static void delete_job_fn(struct kvt_job *job, void *ctx)
{
    (void)ctx;
    struct delete_job *j = (struct delete_job *)job;
    struct kvt_server *s = j->s;
    uint32_t l1n = 0, nskip = 0, k = 0;
    uint32_t *skipped = kvt_xmalloc((j->n ? j->n : 1) * sizeof(uint32_t));
    /* a key read-locked by a lease (lookup -> retrieve) is skipped in every
     * tier: it stays whole and the reply names it */
    for (uint32_t i = 0; i < j->n; i++) {
        int rc = kvt_l1_delete_unleased(s->l1, &j->keys[i]);
        if (rc < 0) {
            skipped[nskip++] = i;
            continue;
        }
        l1n += (uint32_t)rc;
        j->keys[k++] = j->keys[i];
    }
    msgpack_packer *pk = &j->r->pk;
    msgpack_pack_map(pk, 3);
    kvt_mp_str0(pk, "removed_l1");
    msgpack_pack_uint32(pk, l1n);
    kvt_mp_str0(pk, "removed_l2");
    msgpack_pack_array(pk, s->nl2);
    for (int a = 0; a < s->nl2; a++)
        msgpack_pack_uint32(pk, kvt_l2_delete(s->l2s[a], j->keys, k, NULL));
    kvt_mp_str0(pk, "skipped");
    msgpack_pack_array(pk, nskip);
    for (uint32_t i = 0; i < nskip; i++)
        msgpack_pack_uint32(pk, skipped[i]);
    free(skipped);
    kvt_reply_post(s, j->r);
    free(j->keys);
    free(j);
}

static void h_delete(struct kvt_server *s, struct request *q)
{
    struct delete_job *j = kvt_xcalloc(1, sizeof(*j));
    if (get_keys(s, q, &j->keys, &j->n, true)) {
        free(j);
        return;
    }
    j->s = s;
    j->r = q->r;
    q->r = NULL;
    j->job.fn = delete_job_fn;
    kvt_tpool_push(s->workers, &j->job);
}

/* ---------------------------------------------------------------- purge */

struct purge_job {
    struct kvt_job job;
    struct kvt_server *s;
    struct reply *r;
    struct kvt_purge_req q;
    char root[4096]; /* "" = every adapter */
};

struct l1_drop {
    struct kvt_l1 *l1;
    uint64_t n;
};

/* Purged keys leave the memory tier too, so a lookup cannot hit them there. */
static void drop_from_l1(const kvt_key *keys, uint32_t n, void *arg)
{
    struct l1_drop *d = arg;
    for (uint32_t i = 0; i < n; i++)
        d->n += kvt_l1_delete(d->l1, &keys[i]);
}

/* On a worker: purge through every selected adapter (see ops/purge.h). */
static void purge_job_fn(struct kvt_job *job, void *ctx)
{
    (void)ctx;
    struct purge_job *j = (struct purge_job *)job;
    struct kvt_server *s = j->s;
    bool sel[KVT_MAX_ADAPTERS] = {0};
    char dirs[KVT_MAX_ADAPTERS][4096]; /* asked once per request */
    int nsel = 0;
    for (int a = 0; a < s->nl2; a++) {
        char *dir = dirs[a];
        kvt_l2_root(s->l2s[a], dir, sizeof(dirs[a]));
        sel[a] = !j->root[0] || (dir[0] && kvt_same_dir(dir, j->root));
        nsel += sel[a];
    }
    if (!nsel) {
        kvt_reply_error(j->r, KVT_E_NOTFOUND, "no L2 adapter of this server keeps its files in %s",
                        j->root);
        kvt_reply_post(s, j->r);
        free(j);
        return;
    }
    json_t *out = json_object(), *arr = json_array();
    bool more = false;
    int err = 0;
    /* all or none: an adapter still scanning would refuse after others
     * were purged, and that work would go unreported */
    for (int a = 0; a < s->nl2; a++) {
        if (!sel[a])
            continue;
        if (kvt_l2_recovering(s->l2s[a]))
            err = -EBUSY;
    }
    for (int a = 0; a < s->nl2 && !err; a++) {
        if (!sel[a])
            continue;
        struct kvt_purge_res res;
        struct l1_drop d = {.l1 = s->l1};
        j->q.on_keys = drop_from_l1;
        j->q.on_keys_arg = &d;
        err = kvt_purge_l2(s->l2s[a], dirs[a], &j->q, &res);
        res.l1_removed = d.n;
        json_t *o = kvt_purge_res_json(&res);
        json_object_set_new(o, "adapter", json_string(kvt_l2_name(s->l2s[a])));
        json_array_append_new(arr, o);
        more |= res.more;
    }
    if (err) {
        kvt_reply_error(j->r, err, "purge failed: %s%s", kvt_strerror(err),
                        err == -EBUSY ? " (the start-up scan is still running; retry)" : "");
    } else {
        json_object_set_new(out, "adapters", arr);
        arr = NULL;
        json_object_set_new(out, "more", json_boolean(more));
        kvt_mp_pack_json(&j->r->pk, out);
    }
    json_decref(arr);
    json_decref(out);
    kvt_reply_post(s, j->r);
    free(j);
}

/* purge {namespace: str | all: true | tmp: true, root?: str, max?: uint} */
static void h_purge(struct kvt_server *s, struct request *q)
{
    const char *why = NULL, *ns = NULL, *root = NULL;
    size_t nsl = 0, rl = 0;
    bool all = false, tmp = false;
    uint64_t max = 0;
    int rc;
    /* a namespace is a model: it spans every tenant's salt */
    if (!admin_only(s, q->r))
        return;
    if ((rc = kvt_mp_str(&q->body, "namespace", false, &ns, &nsl, &why)) ||
        (rc = kvt_mp_str(&q->body, "root", false, &root, &rl, &why)) ||
        (rc = kvt_mp_bool(&q->body, "all", &all, &why)) ||
        (rc = kvt_mp_bool(&q->body, "tmp", &tmp, &why)) ||
        (rc = kvt_mp_u64(&q->body, "max", false, &max, &why))) {
        kvt_reply_error(q->r, rc, "%s", why);
        return;
    }
    struct purge_job *j = kvt_xcalloc(1, sizeof(*j));
    if ((ns != NULL) + all + tmp != 1) {
        kvt_reply_error(q->r, KVT_E_BADREQ, "purge needs exactly one of namespace, all, tmp");
        free(j);
        return;
    }
    if (ns && nsl < sizeof(j->q.ns)) {
        memcpy(j->q.ns, ns, nsl);
        j->q.ns[nsl] = 0;
    }
    if (ns && (nsl >= sizeof(j->q.ns) || strlen(j->q.ns) != nsl || !kvt_ns_name_ok(j->q.ns))) {
        kvt_reply_error(q->r, KVT_E_BADREQ, "\"%.*s\" is not a namespace name",
                        (int)KVT_MIN(nsl, 300), ns);
        free(j);
        return;
    }
    if (root && (rl == 0 || rl >= sizeof(j->root) || memchr(root, 0, rl))) {
        kvt_reply_error(q->r, KVT_E_BADREQ, "\"root\" must be a directory path");
        free(j);
        return;
    }
    if (root)
        memcpy(j->root, root, rl);
    j->q.what = ns ? KVT_PURGE_NAMESPACE : all ? KVT_PURGE_ALL : KVT_PURGE_TMP;
    j->q.max = (uint32_t)KVT_MIN(max, KVT_MAX_BATCH);
    j->s = s;
    j->r = q->r;
    q->r = NULL;
    j->job.fn = purge_job_fn;
    kvt_tpool_push(s->workers, &j->job);
}

/* ------------------------------------------------------------- dispatch */

void kvt_handle(struct kvt_server *s, enum kvt_op op, struct request *q)
{
    /* over CURVE: the key went in a reload (ZAP named every peer it
     * admitted); a same-host connection gets its key from the ticket in
     * its first hello */
    if (s->cfg->auth && !q->r->who && !(op == OP_HELLO && kvt_local_is_ident(&q->r->ident))) {
        if (kvt_local_is_ident(&q->r->ident)) {
            /* counted with the hellos that had no valid ticket */
            atomic_fetch_add(&s->local_denied, 1);
            kvt_reply_error(q->r, KVT_E_DENIED,
                            "%s; or its key was removed from the authorized-clients file by "
                            "a reload",
                            LOCAL_UNBOUND_MSG);
        } else {
            kvt_reply_error(q->r, KVT_E_DENIED,
                            "this connection's key is not (or no longer, after "
                            "a reload) in the authorized-clients file");
        }
        op = OP_COUNT;
    }
    switch (op) {
    case OP_HELLO:
        h_hello(s, q);
        break;
    case OP_PING:
        msgpack_pack_map(&q->r->pk, 0);
        break;
    case OP_STORE:
        h_store(s, q);
        break;
    case OP_FLUSH:
        h_flush(s, q);
        break;
    case OP_LOOKUP:
    case OP_RETRIEVE:
    case OP_PREPARE_RETRIEVE:
        h_fetch(s, q, op);
        break;
    case OP_FREE_LOCKS:
        h_free_locks(s, q);
        break;
    case OP_PREPARE_STORE:
        h_prepare_store(s, q);
        break;
    case OP_COMMIT_STORE:
        h_commit_store(s, q);
        break;
    case OP_COMMIT_RETRIEVE:
        h_commit_retrieve(s, q);
        break;
    case OP_STATUS:
        h_status(s, q);
        break;
    case OP_DELETE:
        h_delete(s, q);
        break;
    case OP_PURGE:
        h_purge(s, q);
        break;
    case OP_COUNT:
        break; /* refused above */
    default:
        kvt_reply_error(q->r, KVT_E_BADOP, "unknown operation");
    }
    if (q->r) { /* handled synchronously: reply now */
        if (q->r->status)
            atomic_fetch_add(&s->bad_requests, 1);
        kvt_reply_send(s, q->r);
        q->r = NULL;
    }
}
