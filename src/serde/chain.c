/*
 * Serde chains: config parsing, the chain id, size bounds, worker scratch,
 * and the encode/decode drivers that run the serdes in order (store) and in
 * reverse (load).
 *
 * Buffers: the first serde reads the caller's bytes, the last one on encode
 * writes a new exact-size buffer that the engine stores; serdes in between
 * ping-pong through two per-worker scratch buffers, so a chain of k serdes
 * costs k passes over the data and one allocation per object.
 */
#include "serde/serde_int.h"
#include "common/util.h"
#include "kvtier/error.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

struct kvt_serde {
    _Atomic int refs;
    int n;
    struct kvt_sd sd[KVT_SERDE_MAX_STAGES];
    uint32_t id;
    int max_workers;
    struct kvt_serde_stats stats;
};

static const struct kvt_sd_ops *const all_ops[] = {
    &kvt_sd_checksum_ops, &kvt_sd_encrypt_ops, &kvt_sd_fp8_ops, &kvt_sd_lz4_ops, &kvt_sd_zstd_ops,
};
static const char *const all_names[] = {"checksum", "encrypt", "fp8", "lz4", "zstd", NULL};

/* ------------------------------------------------------------ lifetime */

static void chain_free(struct kvt_serde *s)
{
    for (int i = 0; i < s->n; i++)
        if (s->sd[i].ops && s->sd[i].ops->free)
            s->sd[i].ops->free(&s->sd[i]);
    free(s);
}

struct kvt_serde *kvt_serde_ref(struct kvt_serde *s)
{
    if (s)
        atomic_fetch_add_explicit(&s->refs, 1, memory_order_relaxed);
    return s;
}

void kvt_serde_unref(struct kvt_serde *s)
{
    /* acq_rel: the last owner sees every other owner's writes before freeing */
    if (s && atomic_fetch_sub_explicit(&s->refs, 1, memory_order_acq_rel) == 1)
        chain_free(s);
}

uint32_t kvt_serde_id(const struct kvt_serde *s)
{
    return s->id;
}

int kvt_serde_max_workers(const struct kvt_serde *s)
{
    return s->max_workers;
}

int kvt_serde_count(const struct kvt_serde *s)
{
    return s->n;
}

const char *kvt_serde_type(const struct kvt_serde *s, int i)
{
    return i >= 0 && i < s->n ? s->sd[i].ops->type : "?";
}

struct kvt_serde_stats *kvt_serde_stats(struct kvt_serde *s)
{
    return &s->stats;
}

/* ------------------------------------------------------------- parsing */

static const struct kvt_sd_ops *find_ops(const char *type)
{
    for (size_t i = 0; i < KVT_ARRAY_LEN(all_ops); i++)
        if (strcmp(all_ops[i]->type, type) == 0)
            return all_ops[i];
    return NULL;
}

/* Parse one serde object into sd; errors land in c (shared message buffer). */
static int parse_one(struct kvt_cfg *c, const json_t *elem, const char *name, struct kvt_sd *sd,
                     json_t *resolved_out)
{
    if (!json_is_object(elem))
        return kvt_cfg_fail(c, name, "must be an object like {\"type\": \"zstd\"}");
    struct kvt_cfg sub;
    kvt_cfg_init(&sub, elem, c->index, c->type, c->err, c->errcap);
    snprintf(sub.prefix, sizeof(sub.prefix), "%.30s%.24s.", c->prefix, name);
    const char *type = NULL;
    int64_t mw = 1;
    kvt_cfg_enum(&sub, "type", true, NULL, all_names, false, &type);
    kvt_cfg_int(&sub, "max_workers", false, 1, 1, 256, &mw);
    if (!sub.rc) {
        sd->ops = find_ops(type);
        sd->max_workers = (int)mw;
        sd->ops->parse(&sub, sd);
    }
    if (!sub.rc)
        kvt_cfg_finish(&sub);
    int rc = sub.rc;
    if (!rc)
        json_array_append(resolved_out, sub.resolved);
    kvt_cfg_free(&sub);
    if (rc)
        c->rc = rc; /* the message is already in the shared buffer */
    return rc;
}

/* The chain id: a hash of what decides how stored bytes must be read. */
static uint32_t chain_id(const struct kvt_serde *s)
{
    char desc[1024];
    size_t l = (size_t)snprintf(desc, sizeof(desc), "kvtier-serde-v1");
    for (int i = 0; i < s->n && l < sizeof(desc); i++) {
        l += (size_t)snprintf(desc + l, sizeof(desc) - l, "|%s", s->sd[i].ops->type);
        if (s->sd[i].ops->describe && l < sizeof(desc))
            s->sd[i].ops->describe(&s->sd[i], desc + l, sizeof(desc) - l), l = strlen(desc);
    }
    uint64_t h = XXH3_64bits(desc, strlen(desc));
    uint32_t id = (uint32_t)(h ^ (h >> 32));
    return id ? id : 1;
}

int kvt_serde_parse(struct kvt_cfg *c, const json_t *v, struct kvt_serde **out)
{
    if (c->rc)
        return c->rc;
    bool single = json_is_object(v);
    if (!single && !json_is_array(v))
        return kvt_cfg_fail(c, "serde", "must be an object or an array of objects");
    size_t n = single ? 1 : json_array_size(v);
    if (n == 0)
        return kvt_cfg_fail(c, "serde", "must name at least one serde");
    if (n > KVT_SERDE_MAX_STAGES)
        return kvt_cfg_fail(c, "serde", "has %zu serdes; at most %d may be chained", n,
                            KVT_SERDE_MAX_STAGES);
    struct kvt_serde *s = kvt_xcalloc(1, sizeof(*s));
    atomic_init(&s->refs, 1);
    json_t *res = json_array();
    for (size_t i = 0; i < n; i++) {
        char name[24];
        if (single)
            snprintf(name, sizeof(name), "serde");
        else
            snprintf(name, sizeof(name), "serde[%zu]", i);
        const json_t *elem = single ? v : json_array_get(v, i);
        if (parse_one(c, elem, name, &s->sd[i], res)) {
            s->n = (int)i + 1; /* free what the failed serde may have set up */
            chain_free(s);
            json_decref(res);
            return c->rc;
        }
        s->n = (int)i + 1;
        if (s->sd[i].max_workers > s->max_workers)
            s->max_workers = s->sd[i].max_workers;
    }
    s->id = chain_id(s);
    if (single) {
        json_object_set(c->resolved, "serde", json_array_get(res, 0));
        json_decref(res);
    } else {
        json_object_set_new(c->resolved, "serde", res);
    }
    *out = s;
    return 0;
}

/* -------------------------------------------------------------- bounds */

uint64_t kvt_serde_bound(const struct kvt_serde *s, uint64_t logical)
{
    uint64_t n = logical;
    for (int i = 0; i < s->n; i++)
        n = s->sd[i].ops->bound(&s->sd[i], n);
    return n;
}

/* ------------------------------------------------------------- scratch */

struct kvt_serde_wctx *kvt_serde_wctx_new(void)
{
    return calloc(1, sizeof(struct kvt_serde_wctx));
}

void kvt_serde_wctx_free(struct kvt_serde_wctx *w)
{
    if (!w)
        return;
    for (int i = 0; i < 3; i++)
        free(w->buf[i]);
    for (int d = 0; d < 2; d++)
        for (int e = 0; e < 256; e++)
            free(w->fp8_lut[d][e]);
    kvt_sd_zstd_wctx_free(w);
    kvt_sd_lz4_wctx_free(w);
    kvt_sd_encrypt_wctx_free(w);
    free(w);
}

uint8_t *kvt_sd_scratch(struct kvt_serde_wctx *w, int slot, size_t n)
{
    if (w->cap[slot] >= n && w->buf[slot])
        return w->buf[slot];
    /* grow geometrically so a mix of sizes settles on one buffer */
    size_t want = KVT_MAX(n, w->cap[slot] + w->cap[slot] / 2);
    free(w->buf[slot]);
    w->cap[slot] = 0;
    w->buf[slot] = malloc(want ? want : 1);
    if (!w->buf[slot])
        return NULL;
    w->cap[slot] = want;
    return w->buf[slot];
}

/* ---------------------------------------------------------- byte split */

unsigned kvt_sd_split_width(uint16_t dtype)
{
    switch (dtype) {
    case KVT_DTYPE_FP16:
    case KVT_DTYPE_BF16:
    case KVT_DTYPE_RAW: /* unknown bytes: KV caches are 16-bit nearly always */
        return 2;
    case KVT_DTYPE_FP32:
        return 4;
    default:
        return 1;
    }
}

void kvt_sd_split(const uint8_t *in, size_t n, unsigned width, uint8_t *out)
{
    size_t ne = n / width;
    if (width == 2) {
        uint8_t *lo = out, *hi = out + ne;
        for (size_t i = 0; i < ne; i++) {
            lo[i] = in[2 * i];
            hi[i] = in[2 * i + 1];
        }
    } else {
        for (unsigned b = 0; b < width; b++)
            for (size_t i = 0; i < ne; i++)
                out[b * ne + i] = in[i * width + b];
    }
    memcpy(out + ne * width, in + ne * width, n - ne * width);
}

void kvt_sd_unsplit(const uint8_t *in, size_t n, unsigned width, uint8_t *out)
{
    size_t ne = n / width;
    if (width == 2) {
        const uint8_t *lo = in, *hi = in + ne;
        for (size_t i = 0; i < ne; i++) {
            out[2 * i] = lo[i];
            out[2 * i + 1] = hi[i];
        }
    } else {
        for (unsigned b = 0; b < width; b++)
            for (size_t i = 0; i < ne; i++)
                out[i * width + b] = in[b * ne + i];
    }
    memcpy(out + ne * width, in + ne * width, n - ne * width);
}

/* ------------------------------------------------------------ identity */

/*
 * The identity of an object, bound into checksums and GCM tags:
 *   "kvtier-obj-v1" NUL model NUL salt NUL kv_rank(le32) group(le32)
 *   hash_len(u8) hash logical_len(le64) dtype(le16)
 * From the canonical key, so a key and the twin that shares its file name
 * agree. The header's dtype and length are covered too: changing them in a
 * stored header makes the object fail to decode.
 */
static size_t sd_identity(const kvt_key *ck, const kvt_objmeta *m, uint8_t *buf)
{
    const char *model = kvt_ns_model(ck->ns), *salt = kvt_ns_salt(ck->ns);
    size_t ml = strlen(model), sl = strlen(salt), p = 0;
    static const char tag[] = "kvtier-obj-v1";
    memcpy(buf + p, tag, sizeof(tag));
    p += sizeof(tag);
    memcpy(buf + p, model, ml + 1);
    p += ml + 1;
    memcpy(buf + p, salt, sl + 1);
    p += sl + 1;
    kvt_sd_put32(buf + p, ck->kv_rank);
    kvt_sd_put32(buf + p + 4, ck->group);
    p += 8;
    buf[p++] = ck->hash_len;
    memcpy(buf + p, ck->hash, ck->hash_len);
    p += ck->hash_len;
    kvt_sd_put64(buf + p, m->len);
    p += 8;
    buf[p++] = (uint8_t)m->dtype;
    buf[p++] = (uint8_t)(m->dtype >> 8);
    return p;
}

_Static_assert(KVT_SD_ID_MAX >=
                   14 + KVT_MODEL_MAX + 1 + KVT_SALT_MAX + 1 + 8 + 1 + KVT_HASH_MAX + 8 + 2,
               "identity buffer");

static void obj_init(struct kvt_serde *s, struct kvt_sd_obj *o, uint8_t *idbuf, const kvt_key *ck,
                     const kvt_objmeta *m)
{
    memset(o, 0, sizeof(*o));
    o->ck = ck;
    o->meta = m;
    o->idlen = sd_identity(ck, m, idbuf);
    o->id = idbuf;
    o->seed = XXH3_64bits(idbuf, o->idlen);
    o->dtype = m->dtype;
    o->stats = &s->stats;
}

/* -------------------------------------------------------------- encode */

int kvt_serde_encode(struct kvt_serde *s, struct kvt_serde_wctx *w, const kvt_key *ck,
                     const kvt_objmeta *m, const void *src, size_t len, void **out, size_t *outlen)
{
    uint64_t t0 = kvt_now_ns();
    uint8_t idbuf[KVT_SD_ID_MAX];
    struct kvt_sd_obj o;
    obj_init(s, &o, idbuf, ck, m);
    const uint8_t *cur = src;
    size_t curlen = len;
    uint8_t *final = NULL;
    int rc = 0;
    if (len > KVT_MAX_OBJECT || m->len != len) {
        rc = len > KVT_MAX_OBJECT ? KVT_E_TOOBIG : -EINVAL;
        goto out;
    }
    for (int k = 0; k < s->n; k++) {
        const struct kvt_sd *sd = &s->sd[k];
        uint64_t cap = sd->ops->bound(sd, curlen);
        if (cap > 2ull * KVT_MAX_OBJECT) {
            rc = KVT_E_TOOBIG;
            goto out;
        }
        uint8_t *dst;
        if (k == s->n - 1) {
            dst = final = malloc(cap ? cap : 1);
        } else {
            dst = kvt_sd_scratch(w, k & 1, cap);
        }
        if (!dst) {
            rc = -ENOMEM;
            goto out;
        }
        size_t outn = 0;
        rc = sd->ops->encode(sd, w, &o, cur, curlen, dst, cap, &outn);
        if (rc)
            goto out;
        cur = dst;
        curlen = outn;
    }
    /* shrink to what the engine stores: the bound may be far above it */
    if (curlen && final) {
        void *shrunk = realloc(final, curlen);
        if (shrunk)
            final = shrunk;
    }
    *out = final;
    *outlen = curlen;
    final = NULL;
out:
    free(final);
    if (rc) {
        atomic_fetch_add(&s->stats.encode_failed, 1);
    } else {
        atomic_fetch_add(&s->stats.encoded, 1);
        atomic_fetch_add(&s->stats.logical_in, len);
        atomic_fetch_add(&s->stats.stored_out, *outlen);
    }
    atomic_fetch_add(&s->stats.encode_ns, kvt_now_ns() - t0);
    return rc;
}

/* -------------------------------------------------------------- decode */

static void count_fail(struct kvt_serde *s, enum kvt_serde_fail f)
{
    struct kvt_serde_stats *st = &s->stats;
    switch (f) {
    case KVT_SERDE_CHECKSUM:
        atomic_fetch_add(&st->checksum_mismatches, 1);
        break;
    case KVT_SERDE_DECRYPT:
        atomic_fetch_add(&st->decrypt_failures, 1);
        break;
    case KVT_SERDE_LENGTH:
        atomic_fetch_add(&st->length_mismatches, 1);
        break;
    case KVT_SERDE_FORMAT:
        atomic_fetch_add(&st->format_errors, 1);
        break;
    default:
        break;
    }
}

int kvt_serde_decode(struct kvt_serde *s, struct kvt_serde_wctx *w, const kvt_key *ck,
                     const kvt_objmeta *m, const void *src, size_t len, void *dst, size_t cap,
                     enum kvt_serde_fail *fail)
{
    uint64_t t0 = kvt_now_ns();
    uint8_t idbuf[KVT_SD_ID_MAX];
    struct kvt_sd_obj o;
    obj_init(s, &o, idbuf, ck, m);
    int rc = 0;
    /* forward sizes: what entered serde k on encode is at most fwd[k] bytes */
    uint64_t fwd[KVT_SERDE_MAX_STAGES + 1];
    fwd[0] = cap;
    for (int k = 0; k < s->n; k++)
        fwd[k + 1] = s->sd[k].ops->bound(&s->sd[k], fwd[k]);
    if (m->len != cap || cap > KVT_MAX_OBJECT) {
        rc = kvt_sd_bad(&o, KVT_SERDE_LENGTH);
        goto out;
    }
    if (len > fwd[s->n]) { /* larger than any encoding of cap bytes */
        rc = kvt_sd_bad(&o, KVT_SERDE_LENGTH);
        goto out;
    }
    const uint8_t *cur = src;
    size_t curlen = len;
    for (int k = s->n - 1; k >= 0; k--) {
        const struct kvt_sd *sd = &s->sd[k];
        uint8_t *out = k == 0 ? dst : kvt_sd_scratch(w, k & 1, fwd[k]);
        size_t ocap = k == 0 ? cap : fwd[k];
        if (!out) {
            rc = kvt_sd_bad(&o, KVT_SERDE_NOMEM);
            goto out;
        }
        size_t outn = 0;
        rc = sd->ops->decode(sd, w, &o, cur, curlen, out, ocap, &outn);
        if (rc) {
            if (o.fail == KVT_SERDE_OK)
                o.fail = KVT_SERDE_FORMAT;
            goto out;
        }
        cur = out;
        curlen = outn;
    }
    if (curlen != cap)
        rc = kvt_sd_bad(&o, KVT_SERDE_LENGTH);
out:
    if (rc) {
        atomic_fetch_add(&s->stats.decode_failed, 1);
        count_fail(s, o.fail);
    } else {
        atomic_fetch_add(&s->stats.decoded, 1);
    }
    if (fail)
        *fail = rc ? o.fail : KVT_SERDE_OK;
    atomic_fetch_add(&s->stats.decode_ns, kvt_now_ns() - t0);
    return rc;
}

const char *kvt_serde_fail_str(enum kvt_serde_fail f)
{
    switch (f) {
    case KVT_SERDE_OK:
        return "ok";
    case KVT_SERDE_FORMAT:
        return "malformed serde frame";
    case KVT_SERDE_CHECKSUM:
        return "checksum mismatch";
    case KVT_SERDE_DECRYPT:
        return "decryption failed (tag mismatch: tampered, moved or wrong key)";
    case KVT_SERDE_LENGTH:
        return "decoded length differs from the logical length";
    case KVT_SERDE_NOMEM:
        return "out of memory";
    }
    return "?";
}
