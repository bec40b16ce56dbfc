/*
 * The data paths in: store (bytes inline, copied into L1), flush, and the
 * zero-copy path (prepare_store: slots in the pool; commit_store: publish
 * what the client wrote). docs/protocol.md has the schemas.
 */
#include "common/util.h"
#include "front/native/native_int.h"
#include "kvtier/error.h"
#include "proto/blocks.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define INLINE_STORE_BYTES (64u << 10) /* smaller stores are copied on the rpc thread */

struct store_job {
    struct kvt_job job;
    struct kvt_native *n;
    struct reply *r;
    kvt_key *keys;
    uint32_t n_keys;
    zmq_msg_t *frames;
    kvt_objmeta meta;
    struct kvt_blocktag **tags; /* n_keys, or NULL: the request had no "blocks" */
};

static void do_store(struct store_job *j)
{
    uint32_t cnt = j->n_keys;
    struct iovec *data = kvt_xmalloc((cnt ? cnt : 1) * sizeof(*data));
    int32_t *codes = kvt_xcalloc(cnt ? cnt : 1, sizeof(int32_t));
    for (uint32_t i = 0; i < cnt; i++)
        data[i] = (struct iovec){zmq_msg_data(&j->frames[i]), zmq_msg_size(&j->frames[i])};
    uint32_t accepted = kvt_core_store(j->n->env->core, j->keys, cnt, data, &j->meta,
                                       kvt_client_tag(j->r), j->tags, codes);
    uint32_t nfail = 0;
    for (uint32_t i = 0; i < cnt; i++)
        nfail += codes[i] != 0;
    msgpack_packer *pk = &j->r->pk;
    msgpack_pack_map(pk, 2);
    kvt_mp_str0(pk, "accepted");
    msgpack_pack_uint32(pk, accepted);
    kvt_mp_str0(pk, "failed");
    msgpack_pack_array(pk, nfail);
    for (uint32_t i = 0; i < cnt; i++)
        if (codes[i]) {
            msgpack_pack_array(pk, 2);
            msgpack_pack_uint32(pk, i);
            msgpack_pack_int32(pk, codes[i]);
        }
    free(data);
    free(codes);
    for (uint32_t i = 0; i < cnt; i++)
        zmq_msg_close(&j->frames[i]);
    kvt_wire_blocks_free(j->tags, cnt);
    j->tags = NULL;
}

static void store_job_fn(struct kvt_job *job, void *ctx)
{
    (void)ctx;
    struct store_job *j = (struct store_job *)job;
    do_store(j);
    kvt_reply_post(j->n->host, j->r);
    free(j->frames);
    free(j->keys);
    free(j);
}

void kvt_op_store(struct kvt_native *n, struct request *q)
{
    kvt_key *keys;
    uint32_t cnt;
    if (kvt_native_keys(n, q, &keys, &cnt))
        return;
    const char *why;
    kvt_objmeta meta;
    struct kvt_blocktag **tags = NULL;
    int rc = kvt_wire_meta_decode(&q->body, &meta, &why);
    if (!rc)
        rc = kvt_wire_blocks_decode(&q->body, cnt, &tags, &why);
    if (rc) {
        kvt_reply_error(q->r, rc, "%s", why);
        free(keys);
        return;
    }
    if (q->nframes != cnt) {
        kvt_wire_blocks_free(tags, cnt);
        kvt_reply_error(q->r, KVT_E_BADREQ, "store has %u keys but %u data frames", cnt,
                        q->nframes);
        free(keys);
        return;
    }
    uint64_t total = 0;
    for (uint32_t i = 0; i < cnt; i++) {
        size_t len = zmq_msg_size(&q->frames[i]);
        if (len > n->env->max_object_bytes) {
            kvt_reply_error(q->r, KVT_E_TOOBIG,
                            "object %u is %zu bytes; the server accepts at most %llu", i, len,
                            (unsigned long long)n->env->max_object_bytes);
            kvt_wire_blocks_free(tags, cnt);
            free(keys);
            return;
        }
        total += len;
    }
    struct store_job *j = kvt_xcalloc(1, sizeof(*j));
    j->n = n;
    j->r = q->r;
    j->keys = keys;
    j->n_keys = cnt;
    j->meta = meta;
    j->tags = tags;
    j->frames = kvt_xmalloc((cnt ? cnt : 1) * sizeof(zmq_msg_t));
    memcpy(j->frames, q->frames, cnt * sizeof(zmq_msg_t)); /* move ownership */
    q->nframes = 0;
    q->r = NULL;
    if (total <= INLINE_STORE_BYTES) {
        do_store(j);
        kvt_reply_send(n->host, j->r);
        free(j->frames);
        free(j->keys);
        free(j);
        return;
    }
    j->job.fn = store_job_fn;
    kvt_core_defer(n->env->core, &j->job);
}

/* ---------------------------------------------------------------- flush */

#define FLUSH_LIST_MAX 1024 /* failed keys listed in one flush reply */

/* A flush parked in the core until its client's stores finished
 * (kvt_core_flush_wait's cookie). */
struct flush_wait {
    uint64_t client; /* kvt_client_tag of the requester */
    struct reply *r;
};

/*
 * The flush reply: {l2_failed, failed: [...], failed_truncated}. Built when
 * it is sent (every store acknowledged before the flush has then finished
 * on every adapter), from what the store controller recorded for this
 * client: each (key, adapter) that did not reach L2 since the client's
 * previous flush reply, reported once.
 */
static void pack_flush_reply(struct kvt_native *n, struct reply *r, uint64_t client)
{
    struct kvt_store_failure *fv = NULL;
    uint32_t listed = 0;
    uint64_t total = kvt_core_take_failures(n->env->core, client, FLUSH_LIST_MAX, &fv, &listed);
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
        kvt_mp_str0(pk, kvt_core_l2_name(n->env->core, f->adapter));
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
void kvt_op_flush(struct kvt_native *n, struct request *q)
{
    struct flush_wait *f = kvt_xcalloc(1, sizeof(*f));
    f->client = kvt_client_tag(q->r);
    f->r = q->r;
    if (kvt_core_flush_wait(n->env->core, f->client, f)) {
        pack_flush_reply(n, q->r, f->client);
        free(f);
        return;
    }
    q->r = NULL; /* answered by kvt_flush_progress */
}

void kvt_flush_progress(struct kvt_native *n)
{
    void *ready[64];
    size_t cnt;
    while ((cnt = kvt_core_take_flushed(n->env->core, ready, KVT_ARRAY_LEN(ready))) > 0) {
        for (size_t i = 0; i < cnt; i++) {
            struct flush_wait *f = ready[i];
            pack_flush_reply(n, f->r, f->client);
            kvt_reply_send(n->host, f->r);
            free(f);
        }
    }
}

/* ------------------------------------------------ zero-copy store path */

void kvt_op_prepare_store(struct kvt_native *n, struct request *q)
{
    kvt_key *keys;
    uint32_t cnt;
    if (kvt_native_keys(n, q, &keys, &cnt))
        return;
    const char *why;
    kvt_objmeta meta;
    int rc = kvt_wire_meta_decode(&q->body, &meta, &why);
    const msgpack_object *sizes = kvt_mp_get(&q->body, "sizes");
    if (!rc && (!sizes || sizes->type != MSGPACK_OBJECT_ARRAY || sizes->via.array.size != cnt)) {
        why = "\"sizes\" must be an array with one size per key";
        rc = KVT_E_BADREQ;
    }
    for (uint32_t i = 0; !rc && i < cnt; i++) {
        const msgpack_object *v = &sizes->via.array.ptr[i];
        if (v->type != MSGPACK_OBJECT_POSITIVE_INTEGER) {
            why = "each size must be a non-negative integer";
            rc = KVT_E_BADREQ;
        } else if (v->via.u64 > n->env->max_object_bytes) {
            why = "an object is larger than the server accepts";
            rc = KVT_E_TOOBIG;
        }
    }
    struct kvt_blocktag **tags = NULL;
    if (!rc)
        rc = kvt_wire_blocks_decode(&q->body, cnt, &tags, &why);
    if (rc) {
        kvt_reply_error(q->r, rc, "%s", why);
        free(keys);
        return;
    }
    uint32_t *hs = kvt_xmalloc((cnt ? cnt : 1) * sizeof(uint32_t));
    int64_t *offs = kvt_xmalloc((cnt ? cnt : 1) * sizeof(int64_t));
    int32_t *codes = kvt_xcalloc(cnt ? cnt : 1, sizeof(int32_t));
    uint32_t k = 0;
    for (uint32_t i = 0; i < cnt; i++) {
        kvt_objmeta m = meta;
        m.len = (uint32_t)sizes->via.array.ptr[i].via.u64;
        struct kvt_l1_ref ref;
        rc = kvt_core_reserve(n->env->core, &keys[i], &m, &ref);
        if (rc == 0) {
            hs[k++] = ref.h;
            offs[i] = (int64_t)ref.off;
            if (tags) { /* published at commit_store: announced with these */
                kvt_core_tag(n->env->core, &keys[i], tags[i]);
                tags[i] = NULL;
            }
        } else {
            offs[i] = -1;
            codes[i] = rc == -EEXIST ? 0 : rc; /* present: nothing to write */
        }
    }
    struct kvt_l1_owner ow = kvt_native_owner(q->r);
    uint64_t lease = k ? kvt_core_lease_new(n->env->core, KVT_LEASE_WRITE, hs, k, &ow) : 0;
    msgpack_packer *pk = &q->r->pk;
    msgpack_pack_map(pk, 4);
    kvt_mp_str0(pk, "pool"); /* offsets are only meaningful in this pool */
    msgpack_pack_uint64(pk, kvt_core_pool_id(n->env->core));
    kvt_mp_str0(pk, "lease");
    msgpack_pack_uint64(pk, lease);
    kvt_mp_str0(pk, "offsets");
    msgpack_pack_array(pk, cnt);
    for (uint32_t i = 0; i < cnt; i++)
        msgpack_pack_int64(pk, offs[i]);
    kvt_mp_str0(pk, "codes");
    msgpack_pack_array(pk, cnt);
    for (uint32_t i = 0; i < cnt; i++)
        msgpack_pack_int32(pk, codes[i]);
    free(hs);
    free(offs);
    free(codes);
    free(keys);
    kvt_wire_blocks_free(tags, cnt);
}

void kvt_op_commit_store(struct kvt_native *n, struct request *q)
{
    uint64_t lease = 0;
    const char *why;
    if (kvt_mp_u64(&q->body, "lease", true, &lease, &why)) {
        kvt_reply_error(q->r, KVT_E_BADREQ, "%s", why);
        return;
    }
    const msgpack_object *w = kvt_mp_get(&q->body, "written");
    struct kvt_l1_owner ow = kvt_native_owner(q->r);
    int nl = kvt_core_lease_handles(n->env->core, lease, KVT_LEASE_WRITE, &ow, NULL, 0);
    if (nl == KVT_E_LEASE_OWNER) {
        kvt_native_lease_refused(q->r, nl, lease);
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
    int committed = kvt_core_commit(n->env->core, lease, &ow, bits, total, kvt_client_tag(q->r));
    free(bits);
    if (committed < 0) {
        kvt_reply_error(q->r, KVT_E_EXPIRED, "write lease %llu expired: nothing was stored",
                        (unsigned long long)lease);
        return;
    }
    msgpack_pack_map(&q->r->pk, 1);
    kvt_mp_str0(&q->r->pk, "accepted");
    msgpack_pack_int(&q->r->pk, committed);
}
