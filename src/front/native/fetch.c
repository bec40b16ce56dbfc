/*
 * The data paths out: lookup (a read lease on the prefix found), retrieve
 * (bytes inline, zero-copy from the pool), prepare_retrieve (offsets in
 * the pool) with commit_retrieve, and free_locks. Each fetches the prefix
 * through the core: L1 first, then a prefetch from L2.
 */
#include "common/log.h"
#include "common/util.h"
#include "front/native/native_int.h"
#include "kvtier/error.h"

#include <stdlib.h>
#include <string.h>

enum fetch_kind { FETCH_LOOKUP, FETCH_RETRIEVE, FETCH_PREPARE_RETRIEVE };

static void pack_meta(msgpack_packer *pk, const kvt_objmeta *m)
{
    msgpack_pack_array(pk, 3);
    msgpack_pack_uint32(pk, m->len);
    kvt_mp_str0(pk, kvt_dtype_name(m->dtype));
    msgpack_pack_array(pk, m->ndim);
    for (int d = 0; d < m->ndim; d++)
        msgpack_pack_uint32(pk, m->shape[d]);
}

struct fetch {
    struct kvt_native *n;
    struct reply *r;
    enum fetch_kind kind;
    kvt_key *keys;
    uint32_t nk, m; /* m: served from L1 before prefetching */
    struct kvt_l1_ref *refs;
    bool leased; /* served from a lookup's lease: that lookup was the use */
};

static void finish_fetch(struct fetch *f, uint32_t total, bool on_rpc)
{
    struct kvt_native *n = f->n;
    struct reply *r = f->r;
    uint32_t *hs = kvt_xmalloc((total ? total : 1) * sizeof(uint32_t));
    for (uint32_t i = 0; i < total; i++)
        hs[i] = f->refs[i].h;
    /* one use per request: a frequency policy (LFU, ARC) must not count the
     * lookup and the retrieve that follows it as two */
    if (!f->leased)
        kvt_core_touch(n->env->core, hs, total);
    msgpack_packer *pk = &r->pk;
    if (f->kind == FETCH_RETRIEVE) {
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
        struct kvt_l1_owner ow = kvt_native_owner(r);
        uint64_t lease =
            total ? kvt_core_lease_new(n->env->core, KVT_LEASE_READ, hs, total, &ow) : 0;
        if (f->kind == FETCH_LOOKUP) {
            msgpack_pack_map(pk, 2);
            kvt_mp_str0(pk, "hits");
            msgpack_pack_uint32(pk, total);
            kvt_mp_str0(pk, "lease");
            msgpack_pack_uint64(pk, lease);
        } else { /* prepare_retrieve: offsets are only meaningful in this pool */
            msgpack_pack_map(pk, 4);
            kvt_mp_str0(pk, "pool");
            msgpack_pack_uint64(pk, kvt_core_pool_id(n->env->core));
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
    kvt_native_reply(n, r, on_rpc);
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
static int from_lease(struct kvt_native *n, uint64_t lease, struct fetch *f)
{
    struct kvt_l1_owner ow = kvt_native_owner(f->r);
    return kvt_core_lease_take(n->env->core, lease, &ow, f->keys, f->nk, f->refs);
}

static void fetch(struct kvt_native *n, struct request *q, enum fetch_kind kind)
{
    struct fetch *f = kvt_xcalloc(1, sizeof(*f));
    f->n = n;
    f->kind = kind;
    if (kvt_native_keys(n, q, &f->keys, &f->nk)) {
        free(f);
        return;
    }
    f->refs = kvt_xcalloc(f->nk ? f->nk : 1, sizeof(*f->refs));
    uint64_t lease = 0, release = 0;
    const char *why;
    int rc = 0;
    if (kind == FETCH_LOOKUP)
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
        struct kvt_l1_owner ow = kvt_native_owner(q->r);
        rc = kvt_core_lease_end_read(n->env->core, release, &ow);
        if (rc == KVT_E_LEASE_OWNER) {
            kvt_native_lease_refused(q->r, rc, release);
            free(f->keys);
            free(f->refs);
            free(f);
            return;
        }
    }
    f->r = q->r;
    q->r = NULL;
    if (lease) {
        int k = from_lease(n, lease, f);
        if (k >= 0) {
            f->leased = true;
            finish_fetch(f, (uint32_t)k, true);
            return;
        }
        if (k != KVT_E_EXPIRED) {
            q->r = f->r; /* answered by kvt_native_dispatch */
            kvt_native_lease_refused(q->r, k, lease);
            free(f->keys);
            free(f->refs);
            free(f);
            return;
        }
    }
    /* f->m is set before a prefetch is submitted: on_prefetched reads it */
    if (kvt_core_fetch(n->env->core, f->keys, f->nk, kind == FETCH_LOOKUP, f->refs, &f->m,
                       on_prefetched, f))
        finish_fetch(f, f->m, true);
}

void kvt_op_lookup(struct kvt_native *n, struct request *q)
{
    fetch(n, q, FETCH_LOOKUP);
}

void kvt_op_retrieve(struct kvt_native *n, struct request *q)
{
    fetch(n, q, FETCH_RETRIEVE);
}

void kvt_op_prepare_retrieve(struct kvt_native *n, struct request *q)
{
    fetch(n, q, FETCH_PREPARE_RETRIEVE);
}

void kvt_op_free_locks(struct kvt_native *n, struct request *q)
{
    uint64_t lease = 0;
    const char *why;
    if (kvt_mp_u64(&q->body, "lease", true, &lease, &why)) {
        kvt_reply_error(q->r, KVT_E_BADREQ, "%s", why);
        return;
    }
    struct kvt_l1_owner ow = kvt_native_owner(q->r);
    /* either kind: a write lease (prepare_store) is given back with nothing
     * published, as commit_store with no bit set would */
    int rc = kvt_core_lease_drop(n->env->core, lease, &ow);
    if (rc == KVT_E_LEASE_OWNER) {
        kvt_native_lease_refused(q->r, rc, lease);
        return;
    }
    msgpack_pack_map(&q->r->pk, 1);
    kvt_mp_str0(&q->r->pk, "released");
    if (rc < 0)
        msgpack_pack_false(&q->r->pk);
    else
        msgpack_pack_true(&q->r->pk);
}

void kvt_op_commit_retrieve(struct kvt_native *n, struct request *q)
{
    uint64_t lease = 0;
    const char *why;
    if (kvt_mp_u64(&q->body, "lease", true, &lease, &why)) {
        kvt_reply_error(q->r, KVT_E_BADREQ, "%s", why);
        return;
    }
    struct kvt_l1_owner ow = kvt_native_owner(q->r);
    int rc = kvt_core_lease_end_read(n->env->core, lease, &ow);
    if (rc == KVT_E_LEASE_OWNER) {
        kvt_native_lease_refused(q->r, rc, lease);
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
