/* kvtier C client: the operations (store, lookup, retrieve, admin) over
 * the transport of client.c. */
#include "client/client_int.h"
#include "kvtier/error.h"
#include "common/util.h"
#include "common/le.h"
#include "key/key.h"
#include "proto/wire.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

/* ------------------------------------------------------------ helpers */

static void body_init(msgpack_sbuffer *sb, msgpack_packer *pk, size_t nfields)
{
    msgpack_sbuffer_init(sb);
    msgpack_packer_init(pk, sb, msgpack_sbuffer_write);
    msgpack_pack_map(pk, nfields);
}

static void pack_keys(msgpack_packer *pk, const kvt_keys *k)
{
    kvt_mp_str0(pk, "keys");
    kvt_wire_keys_encode(pk, k->model ? k->model : "", k->kv_rank, k->group, k->salt, k->hashes,
                         k->hash_len, (uint32_t)k->n);
}

static size_t meta_fields(const kvt_meta *m)
{
    return m ? (m->dtype ? 1 : 0) + (m->ndim ? 1 : 0) : 0;
}

static void pack_meta(msgpack_packer *pk, const kvt_meta *m)
{
    if (!m)
        return;
    if (m->dtype) {
        kvt_mp_str0(pk, "dtype");
        kvt_mp_str0(pk, m->dtype);
    }
    if (m->ndim) {
        kvt_mp_str0(pk, "shape");
        msgpack_pack_array(pk, m->ndim);
        for (int i = 0; i < m->ndim && i < 6; i++)
            msgpack_pack_uint32(pk, m->shape[i]);
    }
}

/* "blocks" (docs/protocol.md): n keys' engine block hashes. */
static void pack_blocks(msgpack_packer *pk, const kvt_blocks *b, size_t n)
{
    if (!b)
        return;
    size_t nh = n * b->per_key, nt = n * b->tokens_per_key;
    kvt_mp_str0(pk, "blocks");
    msgpack_pack_map(pk, 2 + (b->has_parent ? 1 : 0) + (nt ? 1 : 0));
    kvt_mp_str0(pk, "size");
    msgpack_pack_uint32(pk, b->block_size);
    kvt_mp_str0(pk, "hashes");
    msgpack_pack_array(pk, nh);
    for (size_t i = 0; i < nh; i++) {
        if (b->hash_len) {
            msgpack_pack_bin(pk, b->hash_len);
            msgpack_pack_bin_body(pk, b->hashes + i * b->hash_len, b->hash_len);
        } else {
            msgpack_pack_uint64(pk, b->ints[i]);
        }
    }
    if (b->has_parent) {
        kvt_mp_str0(pk, "parent");
        if (b->hash_len) {
            msgpack_pack_bin(pk, b->hash_len);
            msgpack_pack_bin_body(pk, b->parent, b->hash_len);
        } else {
            msgpack_pack_uint64(pk, b->parent_int);
        }
    }
    if (nt) {
        kvt_mp_str0(pk, "tokens");
        msgpack_pack_array(pk, nt);
        for (size_t i = 0; i < nt; i++)
            msgpack_pack_uint32(pk, b->tokens[i]);
    }
}

static int check_blocks(kvt_client *c, const kvt_blocks *b)
{
    if (b && (b->per_key < 1 || b->per_key > 64 || b->hash_len > 32 || !b->block_size ||
              (b->hash_len ? !b->hashes || (b->has_parent && !b->parent) : !b->ints) ||
              (b->tokens_per_key && !b->tokens)))
        return kvt_c_seterr(c, KVT_E_BADREQ,
                            "blocks: 1..64 hashes per key of 1..32 bytes (or integers), a "
                            "block size, and the arrays they name");
    return 0;
}

static int check_keys(kvt_client *c, const kvt_keys *k)
{
    if (!k || !k->model || (k->n && !k->hashes) || (k->n && (k->hash_len < 1 || k->hash_len > 32)))
        return kvt_c_seterr(c, KVT_E_BADKEY, "keys need a model and hashes of 1..32 bytes");
    if (k->n > KVT_MAX_BATCH)
        return kvt_c_seterr(c, KVT_E_BADREQ, "at most %u keys per request", KVT_MAX_BATCH);
    return 0;
}

/* Decode [len, dtype, [shape]] into a blob's metadata. */
static void decode_meta(const msgpack_object *m, kvt_blob *b)
{
    b->dtype[0] = 0;
    b->ndim = 0;
    if (!m || m->type != MSGPACK_OBJECT_ARRAY || m->via.array.size < 3)
        return;
    const msgpack_object *dt = &m->via.array.ptr[1], *sh = &m->via.array.ptr[2];
    if (dt->type == MSGPACK_OBJECT_STR)
        snprintf(b->dtype, sizeof(b->dtype), "%.*s", (int)dt->via.str.size, dt->via.str.ptr);
    if (sh->type == MSGPACK_OBJECT_ARRAY)
        for (uint32_t i = 0; i < sh->via.array.size && i < 6; i++) {
            b->shape[i] = (uint32_t)sh->via.array.ptr[i].via.u64;
            b->ndim = (uint8_t)(i + 1);
        }
}

static uint64_t meta_len(const msgpack_object *m)
{
    if (!m || m->type != MSGPACK_OBJECT_ARRAY || m->via.array.size < 1 ||
        m->via.array.ptr[0].type != MSGPACK_OBJECT_POSITIVE_INTEGER)
        return UINT64_MAX;
    return m->via.array.ptr[0].via.u64;
}

/* -------------------------------------------------------------- store */

static int store_inline(kvt_client *c, const kvt_keys *keys, const void *const *bufs,
                        const size_t *lens, const kvt_meta *meta, const kvt_blocks *blocks,
                        size_t *accepted)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    body_init(&sb, &pk, 1 + meta_fields(meta) + (blocks ? 1 : 0));
    pack_keys(&pk, keys);
    pack_meta(&pk, meta);
    pack_blocks(&pk, blocks, keys->n);
    struct rep r;
    int rc = kvt_c_call(c, "store", &sb, bufs, lens, keys->n, &r);
    msgpack_sbuffer_destroy(&sb);
    if (rc)
        return rc;
    uint64_t acc = 0;
    kvt_mp_u64(&r.up.data, "accepted", false, &acc, NULL);
    kvt_c_rep_free(&r);
    if (accepted)
        *accepted = acc;
    return 0;
}

int kvt_store(kvt_client *c, const kvt_keys *keys, const void *const *bufs, const size_t *lens,
              const kvt_meta *meta, size_t *accepted)
{
    return kvt_store_ex(c, keys, bufs, lens, meta, NULL, accepted);
}

/* The block hashes of keys [first, ...) of a store: its keys' hashes and
 * tokens, and as parent the last block of the key before (or the store's
 * parent for the first key). NULL without blocks. */
static const kvt_blocks *part_blocks(const kvt_blocks *b, size_t first, kvt_blocks *out)
{
    if (!b || !first)
        return b;
    *out = *b;
    size_t h = first * b->per_key;
    if (b->hash_len) {
        out->hashes = b->hashes + h * b->hash_len;
        out->parent = b->hashes + (h - 1) * b->hash_len;
    } else {
        out->ints = b->ints + h;
        out->parent_int = b->ints[h - 1];
    }
    out->has_parent = true;
    if (b->tokens_per_key)
        out->tokens = b->tokens + first * b->tokens_per_key;
    return out;
}

/* Keys [first, first + n) of keys. */
static kvt_keys part_keys(const kvt_keys *keys, size_t first, size_t n)
{
    kvt_keys k = *keys;
    k.hashes += first * keys->hash_len;
    k.n = n;
    return k;
}

/* Keys [first, first + n) of a store through the pool: reserve, copy in,
 * commit. */
static int store_part(kvt_client *c, const kvt_keys *keys, const void *const *bufs,
                      const size_t *lens, const kvt_meta *meta, const kvt_blocks *blocks,
                      size_t first, size_t n, size_t *accepted)
{
    kvt_keys k = part_keys(keys, first, n);
    kvt_blocks pb;
    kvt_wview *v;
    int rc = kvt_store_begin_ex(c, &k, lens + first, meta, part_blocks(blocks, first, &pb), &v);
    if (rc)
        return rc;
    for (size_t i = 0; i < v->n; i++)
        if (v->ptrs[i])
            memcpy(v->ptrs[i], bufs[first + i], lens[first + i]);
    return kvt_store_commit(c, v, NULL, accepted);
}

int kvt_store_ex(kvt_client *c, const kvt_keys *keys, const void *const *bufs, const size_t *lens,
                 const kvt_meta *meta, const kvt_blocks *blocks, size_t *accepted)
{
    int rc = check_keys(c, keys);
    if (!rc)
        rc = check_blocks(c, blocks);
    if (rc)
        return rc;
    if (!c->shm)
        return store_inline(c, keys, bufs, lens, meta, blocks, accepted);
    /* A large store goes as parts of about KVT_STORE_PART_BYTES, each its
     * own request: the server hands a part to the L2 adapters at its
     * commit, so their writes run while the next part is copied into the
     * pool, instead of after the whole store (docs/performance.md, store +
     * flush). */
    size_t done = 0, acc_all = 0;
    while (done < keys->n) {
        size_t n = 0, bytes = 0;
        while (done + n < keys->n && (n == 0 || bytes + lens[done + n] <= KVT_STORE_PART_BYTES))
            bytes += lens[done + n++];
        size_t acc = 0;
        rc = store_part(c, keys, bufs, lens, meta, blocks, done, n, &acc);
        if (rc == KVT_E_UNSUPPORTED && !c->shm) { /* the restarted server is not local */
            kvt_keys rest = part_keys(keys, done, keys->n - done);
            kvt_blocks rb;
            rc = store_inline(c, &rest, bufs + done, lens + done, meta,
                              part_blocks(blocks, done, &rb), &acc);
            n = rest.n;
        }
        if (rc)
            break;
        acc_all += acc;
        done += n;
    }
    *accepted = acc_all;
    return rc;
}

/* Give back a write lease's reservations without publishing anything. */
static void cast_abort_store(kvt_client *c, uint64_t lease)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    body_init(&sb, &pk, 2);
    kvt_mp_str0(&pk, "lease");
    msgpack_pack_uint64(&pk, lease);
    kvt_mp_str0(&pk, "written");
    static const uint8_t none[KVT_MAX_BATCH / 8];
    msgpack_pack_bin(&pk, sizeof(none));
    msgpack_pack_bin_body(&pk, none, sizeof(none));
    kvt_c_cast(c, "commit_store", &sb);
    msgpack_sbuffer_destroy(&sb);
}

static int store_begin_once(kvt_client *c, const kvt_keys *keys, const size_t *sizes,
                            const kvt_meta *meta, const kvt_blocks *blocks, kvt_wview **out,
                            bool *stale)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    body_init(&sb, &pk, 2 + meta_fields(meta) + (blocks ? 1 : 0));
    pack_keys(&pk, keys);
    kvt_mp_str0(&pk, "sizes");
    msgpack_pack_array(&pk, keys->n);
    for (size_t i = 0; i < keys->n; i++)
        msgpack_pack_uint64(&pk, sizes[i]);
    pack_meta(&pk, meta);
    pack_blocks(&pk, blocks, keys->n);
    struct rep r;
    int rc = kvt_c_call(c, "prepare_store", &sb, NULL, NULL, 0, &r);
    msgpack_sbuffer_destroy(&sb);
    if (rc)
        return rc;
    const msgpack_object *offs = kvt_mp_get(&r.up.data, "offsets");
    uint64_t lease = 0, pool = 0;
    kvt_mp_u64(&r.up.data, "lease", false, &lease, NULL);
    kvt_mp_u64(&r.up.data, "pool", false, &pool, NULL);
    if (pool != c->pool_id) {
        if (lease)
            cast_abort_store(c, lease);
        kvt_c_rep_free(&r);
        *stale = true;
        return kvt_c_seterr(c, KVT_E_EXPIRED, "the server's pool changed (restart)");
    }
    if (!offs || offs->type != MSGPACK_OBJECT_ARRAY || offs->via.array.size != keys->n) {
        kvt_c_rep_free(&r);
        return kvt_c_seterr(c, KVT_E_PROTO, "prepare_store: bad reply");
    }
    kvt_wview *v = kvt_xcalloc(1, sizeof(*v));
    v->n = keys->n;
    v->ptrs = kvt_xcalloc(v->n ? v->n : 1, sizeof(void *));
    v->sizes = kvt_xcalloc(v->n ? v->n : 1, sizeof(size_t));
    v->lease_ = lease;
    for (size_t i = 0; i < v->n; i++) {
        const msgpack_object *o = &offs->via.array.ptr[i];
        v->sizes[i] = sizes[i];
        if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER && o->via.u64 <= c->shm_size &&
            sizes[i] <= c->shm_size - o->via.u64)
            v->ptrs[i] = c->shm + o->via.u64;
    }
    kvt_c_rep_free(&r);
    *out = v;
    return 0;
}

int kvt_store_begin(kvt_client *c, const kvt_keys *keys, const size_t *sizes, const kvt_meta *meta,
                    kvt_wview **out)
{
    return kvt_store_begin_ex(c, keys, sizes, meta, NULL, out);
}

int kvt_store_begin_ex(kvt_client *c, const kvt_keys *keys, const size_t *sizes,
                       const kvt_meta *meta, const kvt_blocks *blocks, kvt_wview **out)
{
    int rc = check_keys(c, keys);
    if (!rc)
        rc = check_blocks(c, blocks);
    if (rc)
        return rc;
    for (int attempt = 0; attempt < 2; attempt++) {
        if (!c->shm)
            return kvt_c_seterr(c, KVT_E_UNSUPPORTED, "the shared-memory path is not available");
        bool stale = false;
        rc = store_begin_once(c, keys, sizes, meta, blocks, out, &stale);
        if (!stale)
            return rc;
        int hr = kvt_c_shm_reattach(c); /* the server restarted: map its new pool */
        if (hr)
            return hr;
    }
    return rc;
}

static void wview_free(kvt_wview *v)
{
    free(v->ptrs);
    free(v->sizes);
    free(v);
}

int kvt_store_commit(kvt_client *c, kvt_wview *v, const bool *written, size_t *accepted)
{
    size_t present = 0, slots = 0;
    for (size_t i = 0; i < v->n; i++) {
        if (v->ptrs[i])
            slots++;
        else
            present++;
    }
    if (!v->lease_) {
        if (accepted)
            *accepted = present;
        wview_free(v);
        return 0;
    }
    msgpack_sbuffer sb;
    msgpack_packer pk;
    body_init(&sb, &pk, written ? 2 : 1);
    kvt_mp_str0(&pk, "lease");
    msgpack_pack_uint64(&pk, v->lease_);
    if (written) {
        /* bit j = j-th reserved slot */
        size_t nb = (slots + 7) / 8;
        uint8_t *bits = kvt_xcalloc(nb ? nb : 1, 1);
        size_t j = 0;
        for (size_t i = 0; i < v->n; i++)
            if (v->ptrs[i]) {
                if (written[i])
                    bits[j / 8] |= (uint8_t)(1u << (j % 8));
                j++;
            }
        kvt_mp_str0(&pk, "written");
        msgpack_pack_bin(&pk, nb);
        msgpack_pack_bin_body(&pk, bits, nb);
        free(bits);
    }
    struct rep r;
    int rc = kvt_c_call(c, "commit_store", &sb, NULL, NULL, 0, &r);
    msgpack_sbuffer_destroy(&sb);
    wview_free(v);
    if (rc)
        return rc;
    uint64_t acc = 0;
    kvt_mp_u64(&r.up.data, "accepted", false, &acc, NULL);
    kvt_c_rep_free(&r);
    if (accepted)
        *accepted = acc + present;
    return 0;
}

void kvt_store_abort(kvt_client *c, kvt_wview *v)
{
    bool *none = kvt_xcalloc(v->n ? v->n : 1, sizeof(bool));
    kvt_store_commit(c, v, none, NULL);
    free(none);
}

int kvt_flush(kvt_client *c)
{
    return kvt_flush_ex(c, NULL);
}

/* A msgpack string or bin into a NUL-terminated buffer (cut to fit). */
static void mp_copy_str(const msgpack_object *o, char *dst, size_t cap)
{
    dst[0] = 0;
    if (!o || (o->type != MSGPACK_OBJECT_STR && o->type != MSGPACK_OBJECT_BIN))
        return;
    size_t n = KVT_MIN((size_t)o->via.str.size, cap - 1);
    memcpy(dst, o->via.str.ptr, n);
    dst[n] = 0;
}

int kvt_flush_ex(kvt_client *c, kvt_flush_report *out)
{
    if (out)
        memset(out, 0, sizeof(*out));
    struct rep r;
    int rc = kvt_c_call(c, "flush", NULL, NULL, NULL, 0, &r);
    if (rc)
        return rc;
    if (out) {
        const msgpack_object *b = &r.up.data;
        uint64_t total = 0;
        kvt_mp_u64(b, "l2_failed", false, &total, NULL);
        out->l2_failed = total;
        const msgpack_object *fa = kvt_mp_get(b, "failed");
        if (fa && fa->type == MSGPACK_OBJECT_ARRAY && fa->via.array.size) {
            out->failed = kvt_xcalloc(fa->via.array.size, sizeof(*out->failed));
            for (uint32_t i = 0; i < fa->via.array.size; i++) {
                const msgpack_object *e = &fa->via.array.ptr[i];
                kvt_flush_failure *f = &out->failed[out->n++];
                uint64_t v = 0;
                kvt_mp_u64(e, "adapter", false, &v, NULL);
                f->adapter = (int)v;
                const msgpack_object *code = kvt_mp_get(e, "code");
                if (code && (code->type == MSGPACK_OBJECT_NEGATIVE_INTEGER ||
                             code->type == MSGPACK_OBJECT_POSITIVE_INTEGER))
                    f->code = (int)code->via.i64;
                v = 0;
                kvt_mp_u64(e, "kv_rank", false, &v, NULL);
                f->kv_rank = (uint32_t)v;
                v = 0;
                kvt_mp_u64(e, "group", false, &v, NULL);
                f->group = (uint32_t)v;
                mp_copy_str(kvt_mp_get(e, "model"), f->model, sizeof(f->model));
                mp_copy_str(kvt_mp_get(e, "salt"), f->salt, sizeof(f->salt));
                const msgpack_object *h = kvt_mp_get(e, "hash");
                if (h && h->type == MSGPACK_OBJECT_BIN) {
                    f->hash_len = KVT_MIN((size_t)h->via.bin.size, sizeof(f->hash));
                    memcpy(f->hash, h->via.bin.ptr, f->hash_len);
                }
            }
        }
        out->truncated = out->l2_failed > out->n;
    }
    kvt_c_rep_free(&r);
    return 0;
}

void kvt_flush_report_free(kvt_flush_report *r)
{
    if (!r)
        return;
    free(r->failed);
    r->failed = NULL;
    r->n = 0;
}

int kvt_ping(kvt_client *c)
{
    struct rep r;
    int rc = kvt_c_call(c, "ping", NULL, NULL, NULL, 0, &r);
    if (!rc)
        kvt_c_rep_free(&r);
    return rc;
}

/* ------------------------------------------------------------- lookup */

static void cast_free_lease(kvt_client *c, uint64_t lease)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    body_init(&sb, &pk, 1);
    kvt_mp_str0(&pk, "lease");
    msgpack_pack_uint64(&pk, lease);
    kvt_c_cast(c, "free_locks", &sb);
    msgpack_sbuffer_destroy(&sb);
}

int kvt_free_locks(kvt_client *c)
{
    if (!c->lease)
        return 0;
    cast_free_lease(c, c->lease);
    kvt_c_lease_forget(c);
    return 0;
}

static bool same_batch_prefix(const kvt_client *c, const kvt_keys *k)
{
    return c->lease && k->n <= c->lease_n && k->hash_len == c->lease_hash_len &&
           k->kv_rank == c->lease_rank && k->group == c->lease_group &&
           strcmp(k->model, c->lease_model) == 0 &&
           strcmp(k->salt ? k->salt : "", c->lease_salt) == 0 &&
           memcmp(k->hashes, c->lease_hashes, k->n * k->hash_len) == 0;
}

int kvt_lookup(kvt_client *c, const kvt_keys *keys, size_t *hits)
{
    int rc = check_keys(c, keys);
    if (rc)
        return rc;
    /* an earlier lookup's locks that no retrieve used are released by this
     * request itself ("release"), not by a separate message */
    uint64_t release = c->lease;
    kvt_c_lease_forget(c);
    msgpack_sbuffer sb;
    msgpack_packer pk;
    body_init(&sb, &pk, release ? 2 : 1);
    pack_keys(&pk, keys);
    if (release) {
        kvt_mp_str0(&pk, "release");
        msgpack_pack_uint64(&pk, release);
    }
    struct rep r;
    rc = kvt_c_call(c, "lookup", &sb, NULL, NULL, 0, &r);
    msgpack_sbuffer_destroy(&sb);
    if (rc)
        return rc;
    uint64_t h = 0, lease = 0;
    kvt_mp_u64(&r.up.data, "hits", false, &h, NULL);
    kvt_mp_u64(&r.up.data, "lease", false, &lease, NULL);
    kvt_c_rep_free(&r);
    if (lease && h) {
        c->lease = lease;
        c->lease_n = h;
        c->lease_hash_len = keys->hash_len;
        c->lease_hashes = kvt_xmalloc(h * keys->hash_len);
        memcpy(c->lease_hashes, keys->hashes, h * keys->hash_len);
        c->lease_model = kvt_xstrdup(keys->model);
        c->lease_salt = kvt_xstrdup(keys->salt ? keys->salt : "");
        c->lease_rank = keys->kv_rank;
        c->lease_group = keys->group;
    }
    *hits = h;
    return 0;
}

/* ----------------------------------------------------------- retrieve */

static size_t fetch_body(kvt_client *c, const kvt_keys *keys, msgpack_sbuffer *sb)
{
    msgpack_packer pk;
    uint64_t lease = same_batch_prefix(c, keys) ? c->lease : 0;
    body_init(sb, &pk, lease ? 2 : 1);
    pack_keys(&pk, keys);
    if (lease) {
        kvt_mp_str0(&pk, "lease");
        msgpack_pack_uint64(&pk, lease);
        kvt_c_lease_forget(c); /* the server ends it with this request */
    }
    return 0;
}

void kvt_blobs_free(kvt_blob *b, size_t n)
{
    if (!b)
        return;
    for (size_t i = 0; i < n; i++) {
        if (b[i].priv_) {
            zmq_msg_close(b[i].priv_);
            free(b[i].priv_);
        } else {
            free(b[i].data);
        }
    }
    free(b);
}

int kvt_retrieve(kvt_client *c, const kvt_keys *keys, kvt_blob **out, size_t *n)
{
    int rc = check_keys(c, keys);
    if (rc)
        return rc;
    *out = NULL;
    *n = 0;
    if (c->shm) {
        kvt_rview *v;
        rc = kvt_retrieve_begin(c, keys, &v);
        if (rc == KVT_E_UNSUPPORTED && !c->shm) /* the restarted server is not local */
            return kvt_retrieve(c, keys, out, n);
        if (rc)
            return rc;
        kvt_blob *b = kvt_xcalloc(v->n ? v->n : 1, sizeof(*b));
        for (size_t i = 0; i < v->n; i++) {
            b[i] = v->meta[i];
            b[i].data = kvt_xmalloc(v->lens[i] ? v->lens[i] : 1);
            b[i].len = v->lens[i];
            memcpy(b[i].data, v->ptrs[i], v->lens[i]);
        }
        size_t cnt = v->n;
        rc = kvt_retrieve_end(c, v);
        if (rc) {
            kvt_blobs_free(b, cnt);
            return rc;
        }
        *out = b;
        *n = cnt;
        return 0;
    }
    msgpack_sbuffer sb;
    fetch_body(c, keys, &sb);
    struct rep r;
    rc = kvt_c_call(c, "retrieve", &sb, NULL, NULL, 0, &r);
    msgpack_sbuffer_destroy(&sb);
    if (rc)
        return rc;
    uint64_t cnt = 0;
    kvt_mp_u64(&r.up.data, "n", false, &cnt, NULL);
    const msgpack_object *metas = kvt_mp_get(&r.up.data, "metas");
    if (cnt != r.nframes || cnt > keys->n || !metas || metas->type != MSGPACK_OBJECT_ARRAY ||
        metas->via.array.size != cnt) {
        kvt_c_rep_free(&r);
        return kvt_c_seterr(c, KVT_E_PROTO, "retrieve: reply frames do not match its header");
    }
    kvt_blob *b = kvt_xcalloc(cnt ? cnt : 1, sizeof(*b));
    for (uint32_t i = 0; i < cnt; i++) {
        /* the blob owns the received frame: no copy */
        zmq_msg_t *m = kvt_xmalloc(sizeof(*m));
        memcpy(m, &r.frames[i], sizeof(*m));
        b[i].priv_ = m;
        b[i].data = zmq_msg_data(m);
        b[i].len = zmq_msg_size(m);
        decode_meta(&metas->via.array.ptr[i], &b[i]);
        if (meta_len(&metas->via.array.ptr[i]) != b[i].len) {
            r.nframes = 0;
            for (uint32_t k = i + 1; k < cnt; k++)
                zmq_msg_close(&r.frames[k]);
            kvt_blobs_free(b, i + 1);
            kvt_c_rep_free(&r);
            return kvt_c_seterr(c, KVT_E_PROTO, "retrieve: frame %u length differs from its header",
                                i);
        }
    }
    r.nframes = 0; /* frames moved into blobs */
    kvt_c_rep_free(&r);
    *out = b;
    *n = cnt;
    return 0;
}

static void rview_free(kvt_rview *v)
{
    free(v->ptrs);
    free(v->lens);
    free(v->meta);
    free(v);
}

static int retrieve_begin_once(kvt_client *c, const kvt_keys *keys, kvt_rview **out, bool *stale)
{
    msgpack_sbuffer sb;
    fetch_body(c, keys, &sb);
    struct rep r;
    int rc = kvt_c_call(c, "prepare_retrieve", &sb, NULL, NULL, 0, &r);
    msgpack_sbuffer_destroy(&sb);
    if (rc)
        return rc;
    uint64_t lease = 0, cnt = 0, pool = 0;
    kvt_mp_u64(&r.up.data, "lease", false, &lease, NULL);
    kvt_mp_u64(&r.up.data, "n", false, &cnt, NULL);
    kvt_mp_u64(&r.up.data, "pool", false, &pool, NULL);
    const char *bad = NULL;
    const msgpack_object *ents = kvt_mp_get(&r.up.data, "entries");
    if (pool != c->pool_id) {
        *stale = true;
        bad = "the server's pool changed (restart)";
    } else if (!ents || ents->type != MSGPACK_OBJECT_ARRAY || ents->via.array.size != cnt ||
               cnt > keys->n) {
        bad = "prepare_retrieve: bad reply";
    }
    kvt_rview *v = kvt_xcalloc(1, sizeof(*v));
    v->n = cnt;
    v->lease_ = lease;
    v->ptrs = kvt_xcalloc(cnt ? cnt : 1, sizeof(void *));
    v->lens = kvt_xcalloc(cnt ? cnt : 1, sizeof(size_t));
    v->meta = kvt_xcalloc(cnt ? cnt : 1, sizeof(kvt_blob));
    for (uint32_t i = 0; !bad && i < cnt; i++) {
        const msgpack_object *e = &ents->via.array.ptr[i];
        if (e->type != MSGPACK_OBJECT_ARRAY || e->via.array.size != 2 ||
            e->via.array.ptr[0].type != MSGPACK_OBJECT_POSITIVE_INTEGER) {
            bad = "prepare_retrieve: bad entry";
            break;
        }
        uint64_t off = e->via.array.ptr[0].via.u64, len = meta_len(&e->via.array.ptr[1]);
        if (len == UINT64_MAX || off > c->shm_size || len > c->shm_size - off) {
            bad = "prepare_retrieve: entry outside the pool";
            break;
        }
        v->ptrs[i] = c->shm + off;
        v->lens[i] = len;
        decode_meta(&e->via.array.ptr[1], &v->meta[i]);
        v->meta[i].len = len;
    }
    kvt_c_rep_free(&r);
    if (bad) {
        if (lease)
            cast_free_lease(c, lease); /* never leave read locks behind */
        rview_free(v);
        return kvt_c_seterr(c, *stale ? KVT_E_EXPIRED : KVT_E_PROTO, "%s", bad);
    }
    *out = v;
    return 0;
}

int kvt_retrieve_begin(kvt_client *c, const kvt_keys *keys, kvt_rview **out)
{
    int rc = check_keys(c, keys);
    if (rc)
        return rc;
    for (int attempt = 0; attempt < 2; attempt++) {
        if (!c->shm)
            return kvt_c_seterr(c, KVT_E_UNSUPPORTED, "the shared-memory path is not available");
        bool stale = false;
        rc = retrieve_begin_once(c, keys, out, &stale);
        if (!stale)
            return rc;
        int hr = kvt_c_shm_reattach(c); /* the server restarted: map its new pool */
        if (hr)
            return hr;
    }
    return rc;
}

int kvt_retrieve_end(kvt_client *c, kvt_rview *v)
{
    int rc = 0;
    if (v->lease_) {
        msgpack_sbuffer sb;
        msgpack_packer pk;
        body_init(&sb, &pk, 1);
        kvt_mp_str0(&pk, "lease");
        msgpack_pack_uint64(&pk, v->lease_);
        struct rep r;
        rc = kvt_c_call(c, "commit_retrieve", &sb, NULL, NULL, 0, &r);
        msgpack_sbuffer_destroy(&sb);
        if (!rc)
            kvt_c_rep_free(&r);
    }
    rview_free(v);
    return rc;
}

/* ------------------------------------------------------------- admin */

int kvt_status_json(kvt_client *c, char **json)
{
    struct rep r;
    int rc = kvt_c_call(c, "status", NULL, NULL, NULL, 0, &r);
    if (rc)
        return rc;
    json_t *j = kvt_mp_to_json(&r.up.data);
    *json = json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(j);
    kvt_c_rep_free(&r);
    return *json ? 0 : -ENOMEM;
}

int kvt_delete(kvt_client *c, const kvt_keys *keys, size_t *removed)
{
    int rc = check_keys(c, keys);
    if (rc)
        return rc;
    msgpack_sbuffer sb;
    msgpack_packer pk;
    body_init(&sb, &pk, 1);
    pack_keys(&pk, keys);
    struct rep r;
    rc = kvt_c_call(c, "delete", &sb, NULL, NULL, 0, &r);
    msgpack_sbuffer_destroy(&sb);
    if (rc)
        return rc;
    size_t total = 0;
    const msgpack_object *l2 = kvt_mp_get(&r.up.data, "removed_l2");
    if (l2 && l2->type == MSGPACK_OBJECT_ARRAY)
        for (uint32_t i = 0; i < l2->via.array.size; i++)
            total += l2->via.array.ptr[i].via.u64;
    kvt_c_rep_free(&r);
    if (removed)
        *removed = total;
    return 0;
}
