/*
 * checksum serde: an xxh3 frame bound to the object's identity.
 *
 * Frame: [xxh3-64 (le64)][payload length (le64)][payload]
 * The hash is XXH3-64 of the payload seeded with XXH3-64 of the object's
 * identity (model, salt, kv_rank, group, chunk hash, logical length,
 * dtype), so bytes that rot, are cut short, or land under another key's
 * name fail to verify. A mismatch is a miss plus checksum_mismatches.
 * Detects accidents, not an adversary (who can recompute the hash): use
 * encrypt for that.
 */
#include "serde/serde_int.h"

#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#define HDR 16

static int cs_parse(struct kvt_cfg *c, struct kvt_sd *sd)
{
    (void)sd;
    return c->rc;
}

static uint64_t cs_bound(const struct kvt_sd *sd, uint64_t n)
{
    (void)sd;
    return n + HDR;
}

static int cs_encode(const struct kvt_sd *sd, struct kvt_serde_wctx *w, struct kvt_sd_obj *o,
                     const uint8_t *in, size_t n, uint8_t *out, size_t cap, size_t *outn)
{
    (void)sd;
    (void)w;
    if (cap < n + HDR)
        return -ENOSPC;
    kvt_sd_put64(out, XXH3_64bits_withSeed(in, n, o->seed));
    kvt_sd_put64(out + 8, n);
    memcpy(out + HDR, in, n);
    *outn = n + HDR;
    return 0;
}

static int cs_decode(const struct kvt_sd *sd, struct kvt_serde_wctx *w, struct kvt_sd_obj *o,
                     const uint8_t *in, size_t n, uint8_t *out, size_t cap, size_t *outn)
{
    (void)sd;
    (void)w;
    if (n < HDR || kvt_sd_get64(in + 8) != n - HDR)
        return kvt_sd_bad(o, KVT_SERDE_FORMAT);
    size_t plen = n - HDR;
    if (plen > cap)
        return kvt_sd_bad(o, KVT_SERDE_LENGTH);
    if (XXH3_64bits_withSeed(in + HDR, plen, o->seed) != kvt_sd_get64(in))
        return kvt_sd_bad(o, KVT_SERDE_CHECKSUM);
    memcpy(out, in + HDR, plen);
    *outn = plen;
    return 0;
}

const struct kvt_sd_ops kvt_sd_checksum_ops = {
    .type = "checksum",
    .parse = cs_parse,
    .bound = cs_bound,
    .encode = cs_encode,
    .decode = cs_decode,
};
