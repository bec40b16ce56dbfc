#include "l2/kit/objfmt.h"
#include "kvtier/error.h"
#include "common/le.h"
#include "common/util.h"
#include "key/blocktag.h"

#include <stdbool.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

uint64_t kvt_payload_hash(const void *p, size_t n)
{
    return XXH3_64bits(p, n);
}

/* Bytes of tag as encoded: with its token ids or without (0: no tag). */
static size_t tag_bytes(const struct kvt_blocktag *t, bool tokens)
{
    if (!t || t->nblocks < 1 || t->nblocks > KVT_BLOCKTAG_MAX || t->hash_len > 32 || !t->block_size)
        return 0;
    size_t hs = kvt_blocktag_hsize(t);
    size_t n = 8 + (t->has_parent ? hs : 0) + (size_t)t->nblocks * hs;
    if (tokens && t->ntokens)
        n += 4 + (size_t)t->ntokens * 4;
    return n;
}

/* Header bytes before the padding: fixed fields, model, salt, tag, checksum. */
static size_t hdr_bytes(const kvt_key *key, size_t tagb)
{
    return KVT_OBJHDR_FIXED + strlen(kvt_ns_model(key->ns)) + strlen(kvt_ns_salt(key->ns)) + tagb +
           8;
}

/* The part of tag that fits in hdr_len bytes: tokens or not, or none. */
static size_t tag_fit(const kvt_key *key, const struct kvt_blocktag *tag, size_t hdr_len,
                      bool *tokens)
{
    /* within the first KVT_OBJHDR_MAX bytes, so that a reader of that
     * many bytes has the whole tag whatever the area */
    size_t lim = hdr_len < KVT_OBJHDR_MAX ? hdr_len : KVT_OBJHDR_MAX;
    *tokens = true;
    size_t b = tag_bytes(tag, true);
    if (b && tag->ntokens && hdr_bytes(key, b) <= lim)
        return b;
    *tokens = false;
    b = tag_bytes(tag, false);
    if (b && hdr_bytes(key, b) <= lim)
        return b;
    return 0;
}

uint16_t kvt_objhdr_len(const kvt_key *key, const struct kvt_blocktag *tag, uint32_t align,
                        uint32_t max)
{
    size_t a = align < KVT_OBJHDR_MIN ? KVT_OBJHDR_MIN : align;
    size_t lim = max < KVT_OBJHDR_MIN ? KVT_OBJHDR_MIN : max;
    if (lim > UINT16_MAX)
        lim = UINT16_MAX;
    size_t plain = KVT_ALIGN_UP(hdr_bytes(key, 0), a);
    size_t fb = hdr_bytes(key, tag_bytes(tag, true)), hb = hdr_bytes(key, tag_bytes(tag, false));
    size_t hl = plain;
    if (tag_bytes(tag, false) && tag->ntokens && fb <= KVT_OBJHDR_MAX && KVT_ALIGN_UP(fb, a) <= lim)
        hl = KVT_ALIGN_UP(fb, a);
    else if (tag_bytes(tag, false) && hb <= KVT_OBJHDR_MAX && KVT_ALIGN_UP(hb, a) <= lim)
        hl = KVT_ALIGN_UP(hb, a);
    return (uint16_t)(hl < a ? a : hl);
}

int kvt_objhdr_encode(void *buf, uint16_t hdr_len, const kvt_key *key, const kvt_objmeta *meta,
                      const struct kvt_blocktag *tag, uint32_t flags, uint64_t payload_len,
                      uint64_t payload_xxh3)
{
    const char *model = kvt_ns_model(key->ns), *salt = kvt_ns_salt(key->ns);
    size_t ml = strlen(model), sl = strlen(salt);
    if (hdr_len < KVT_OBJHDR_MIN || KVT_OBJHDR_FIXED + ml + sl + 8 > hdr_len)
        return KVT_E_BADKEY;
    bool tokens = false;
    size_t tagb = tag_fit(key, tag, hdr_len, &tokens);
    uint8_t *p = buf;
    memset(p, 0, hdr_len);
    memcpy(p, KVT_OBJHDR_MAGIC, 8);
    kvt_put16(p + 8, tagb ? KVT_OBJHDR_VERSION_TAG : KVT_OBJHDR_VERSION);
    kvt_put16(p + 10, hdr_len);
    kvt_put32(p + 12, flags);
    kvt_put64(p + 16, payload_len);
    kvt_put64(p + 24, meta ? meta->len : payload_len);
    kvt_put64(p + 32, payload_xxh3);
    kvt_put32(p + 40, key->kv_rank);
    kvt_put32(p + 44, key->group);
    p[48] = key->hash_len;
    p[49] = meta ? meta->ndim : 0;
    kvt_put16(p + 50, meta ? meta->dtype : 0);
    kvt_put16(p + 52, (uint16_t)ml);
    kvt_put16(p + 54, (uint16_t)sl);
    memcpy(p + 56, key->hash, KVT_HASH_MAX);
    for (int i = 0; i < KVT_MAX_DIMS; i++)
        kvt_put32(p + 88 + 4 * i, meta ? meta->shape[i] : 0);
    kvt_put32(p + 112, (uint32_t)tagb);
    memcpy(p + KVT_OBJHDR_FIXED, model, ml);
    memcpy(p + KVT_OBJHDR_FIXED + ml, salt, sl);
    size_t end = KVT_OBJHDR_FIXED + ml + sl;
    if (tagb) {
        uint8_t *q = p + end;
        size_t hs = kvt_blocktag_hsize(tag);
        kvt_put32(q, tag->block_size);
        kvt_put16(q + 4, tag->nblocks);
        q[6] = tag->hash_len;
        q[7] = (uint8_t)((tag->has_parent ? 1 : 0) | (tokens ? 2 : 0));
        q += 8;
        if (tag->has_parent) {
            memcpy(q, tag->parent, hs);
            q += hs;
        }
        memcpy(q, tag->hashes, (size_t)tag->nblocks * hs);
        q += (size_t)tag->nblocks * hs;
        if (tokens) {
            kvt_put32(q, tag->ntokens);
            q += 4;
            for (uint32_t i = 0; i < tag->ntokens; i++, q += 4)
                kvt_put32(q, tag->tokens[i]);
        }
        end += tagb;
    }
    kvt_put64(p + end, XXH3_64bits(p, end));
    return 0;
}

/* Check a tag's structure (tag_len bytes at q): its length is exactly what
 * its fields say. */
static bool tag_valid(const uint8_t *q, size_t tag_len)
{
    if (tag_len < 8)
        return false;
    uint32_t bs = kvt_get32(q);
    uint16_t nb = kvt_get16(q + 4);
    uint8_t hl = q[6], fl = q[7];
    if (!bs || nb < 1 || nb > KVT_BLOCKTAG_MAX || hl > 32 || (fl & ~3u))
        return false;
    size_t hs = hl ? hl : 8;
    size_t n = 8 + ((fl & 1) ? hs : 0) + (size_t)nb * hs;
    if (fl & 2) {
        if (n + 4 > tag_len)
            return false;
        uint32_t nt = kvt_get32(q + n);
        if (!nt || nt > (tag_len - n - 4) / 4)
            return false;
        n += 4 + (size_t)nt * 4;
    }
    return n == tag_len;
}

int kvt_objhdr_decode(const void *buf, size_t len, struct kvt_objhdr *h, const char **why)
{
    const uint8_t *p = buf;
    const char *w = NULL;
    if (len < KVT_OBJHDR_FIXED + 8) {
        w = "short header";
        goto bad;
    }
    if (memcmp(p, KVT_OBJHDR_MAGIC, 8) != 0) {
        w = "bad magic";
        goto bad;
    }
    uint16_t ver = kvt_get16(p + 8);
    if (ver != KVT_OBJHDR_VERSION && ver != KVT_OBJHDR_VERSION_TAG) {
        w = "unknown header version";
        goto bad;
    }
    h->hdr_len = kvt_get16(p + 10);
    size_t ml = kvt_get16(p + 52), sl = kvt_get16(p + 54);
    /* version 1 wrote the reserved field as zeros and never read it */
    size_t tl = ver == KVT_OBJHDR_VERSION_TAG ? kvt_get32(p + 112) : 0;
    size_t end = KVT_OBJHDR_FIXED + ml + sl + tl;
    if (h->hdr_len < KVT_OBJHDR_MIN || ml > KVT_MODEL_MAX || sl > KVT_SALT_MAX || tl > h->hdr_len ||
        end + 8 > h->hdr_len || end + 8 > len) {
        w = "bad header lengths";
        goto bad;
    }
    if (kvt_get64(p + end) != XXH3_64bits(p, end)) {
        w = "header checksum mismatch";
        goto bad;
    }
    /* the padding after the checksum is written as zeros: every byte of the
     * header area the caller holds is verified, not only the fields */
    for (size_t k = end + 8, lim = h->hdr_len < len ? h->hdr_len : len; k < lim; k++)
        if (p[k]) {
            w = "header padding not zero";
            goto bad;
        }
    h->tag_off = (uint32_t)(KVT_OBJHDR_FIXED + ml + sl);
    h->tag_len = (uint32_t)tl;
    if (ver == KVT_OBJHDR_VERSION_TAG && (kvt_get32(p + 116) || !tag_valid(p + h->tag_off, tl))) {
        w = "bad tag in header";
        goto bad;
    }
    h->flags = kvt_get32(p + 12);
    h->payload_len = kvt_get64(p + 16);
    h->logical_len = kvt_get64(p + 24);
    h->payload_xxh3 = kvt_get64(p + 32);
    if (h->payload_len > KVT_MAX_OBJECT * 2ull || h->logical_len > KVT_MAX_OBJECT) {
        w = "payload length out of range";
        goto bad;
    }
    uint32_t ns;
    if (kvt_ns_intern((const char *)p + KVT_OBJHDR_FIXED, ml,
                      (const char *)p + KVT_OBJHDR_FIXED + ml, sl, &ns, NULL) ||
        kvt_key_make(&h->key, ns, p + 56, p[48], kvt_get32(p + 40), kvt_get32(p + 44))) {
        w = "invalid key in header";
        goto bad;
    }
    memset(&h->meta, 0, sizeof(h->meta));
    h->meta.len = (uint32_t)h->logical_len;
    h->meta.ndim = p[49];
    h->meta.dtype = kvt_get16(p + 50);
    if (h->meta.ndim > KVT_MAX_DIMS || h->meta.dtype > KVT_DTYPE_MAX) {
        w = "bad dtype or shape";
        goto bad;
    }
    for (int i = 0; i < KVT_MAX_DIMS; i++)
        h->meta.shape[i] = kvt_get32(p + 88 + 4 * i);
    h->meta.serde = h->flags;
    return 0;
bad:
    if (why)
        *why = w;
    return KVT_E_CORRUPT;
}

struct kvt_blocktag *kvt_objhdr_tag(const void *buf, const struct kvt_objhdr *h)
{
    if (!h->tag_len)
        return NULL;
    const uint8_t *q = (const uint8_t *)buf + h->tag_off;
    uint8_t fl = q[7];
    size_t hs = q[6] ? q[6] : 8;
    uint16_t nb = kvt_get16(q + 4);
    const uint8_t *r = q + 8 + ((fl & 1) ? hs : 0) + (size_t)nb * hs;
    uint32_t nt = (fl & 2) ? kvt_get32(r) : 0;
    struct kvt_blocktag *t = kvt_blocktag_new(kvt_get32(q), nb, q[6], nt);
    t->has_parent = fl & 1;
    if (t->has_parent)
        memcpy(t->parent, q + 8, hs);
    memcpy(t->hashes, q + 8 + ((fl & 1) ? hs : 0), (size_t)nb * hs);
    for (uint32_t i = 0; i < nt; i++)
        t->tokens[i] = kvt_get32(r + 4 + 4 * (size_t)i);
    return t;
}

int kvt_objhdr_matches(const struct kvt_objhdr *h, enum kvt_codec codec, const kvt_key *want)
{
    /* exact: the header holds the model and salt bytes, and names are
     * injective, so no two keys are ever the same object */
    (void)codec;
    return kvt_key_eq(&h->key, want);
}
