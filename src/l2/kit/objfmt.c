#include "l2/kit/objfmt.h"
#include "kvtier/error.h"
#include "common/le.h"

#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

uint64_t kvt_payload_hash(const void *p, size_t n)
{
    return XXH3_64bits(p, n);
}

int kvt_objhdr_encode(void *buf, uint16_t hdr_len, const kvt_key *key, const kvt_objmeta *meta,
                      uint32_t flags, uint64_t payload_len, uint64_t payload_xxh3)
{
    const char *model = kvt_ns_model(key->ns), *salt = kvt_ns_salt(key->ns);
    size_t ml = strlen(model), sl = strlen(salt);
    if (hdr_len < KVT_OBJHDR_MIN || KVT_OBJHDR_FIXED + ml + sl + 8 > hdr_len)
        return KVT_E_BADKEY;
    uint8_t *p = buf;
    memset(p, 0, hdr_len);
    memcpy(p, KVT_OBJHDR_MAGIC, 8);
    kvt_put16(p + 8, KVT_OBJHDR_VERSION);
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
    memcpy(p + KVT_OBJHDR_FIXED, model, ml);
    memcpy(p + KVT_OBJHDR_FIXED + ml, salt, sl);
    size_t end = KVT_OBJHDR_FIXED + ml + sl;
    kvt_put64(p + end, XXH3_64bits(p, end));
    return 0;
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
    if (kvt_get16(p + 8) != KVT_OBJHDR_VERSION) {
        w = "unknown header version";
        goto bad;
    }
    h->hdr_len = kvt_get16(p + 10);
    size_t ml = kvt_get16(p + 52), sl = kvt_get16(p + 54);
    size_t end = KVT_OBJHDR_FIXED + ml + sl;
    if (h->hdr_len < KVT_OBJHDR_MIN || ml > KVT_MODEL_MAX || sl > KVT_SALT_MAX ||
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

int kvt_objhdr_matches(const struct kvt_objhdr *h, enum kvt_codec codec, const kvt_key *want)
{
    /* exact: the header holds the model and salt bytes, and names are
     * injective, so no two keys are ever the same object */
    (void)codec;
    return kvt_key_eq(&h->key, want);
}
