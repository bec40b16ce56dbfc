/*
 * lz4 serde: LZ4 block compression in the shared compressor frame
 * (cframe.c). Config: acceleration (1 = default LZ4, higher = faster and
 * larger), byte_split (default true: split 16-bit elements into byte
 * planes before compressing).
 */
#include "serde/serde_int.h"
#include "common/util.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

#include <lz4.h>

struct lz4_cfg {
    int accel;
    bool split;
};

static int lz4_parse(struct kvt_cfg *c, struct kvt_sd *sd)
{
    int64_t accel = 1;
    bool split = true;
    kvt_cfg_int(c, "acceleration", false, 1, 1, 65537, &accel);
    kvt_cfg_bool(c, "byte_split", true, &split);
    if (c->rc)
        return c->rc;
    struct lz4_cfg *l = kvt_xcalloc(1, sizeof(*l));
    l->accel = (int)accel;
    l->split = split;
    sd->priv = l;
    return 0;
}

static void lz4_free(struct kvt_sd *sd)
{
    free(sd->priv);
    sd->priv = NULL;
}

static uint64_t lz4_bound(const struct kvt_sd *sd, uint64_t n)
{
    (void)sd;
    uint64_t b = n <= LZ4_MAX_INPUT_SIZE ? (uint64_t)LZ4_compressBound((int)n) : n;
    return KVT_MAX(b, n) + KVT_SD_CFRAME_HDR;
}

void kvt_sd_lz4_wctx_free(struct kvt_serde_wctx *w)
{
    free(w->lz4);
    w->lz4 = NULL;
}

static size_t lz4_c(const struct kvt_sd *sd, struct kvt_serde_wctx *w, const uint8_t *in, size_t n,
                    uint8_t *out, size_t cap)
{
    const struct lz4_cfg *l = sd->priv;
    if (n > LZ4_MAX_INPUT_SIZE)
        return 0;
    if (!w->lz4 && !(w->lz4 = malloc((size_t)LZ4_sizeofState())))
        return 0;
    int r = LZ4_compress_fast_extState(w->lz4, (const char *)in, (char *)out, (int)n,
                                       (int)KVT_MIN(cap, (size_t)INT_MAX), l->accel);
    return r > 0 ? (size_t)r : 0;
}

static size_t lz4_d(struct kvt_serde_wctx *w, const uint8_t *in, size_t n, uint8_t *out, size_t cap)
{
    (void)w;
    if (n > INT_MAX || cap > INT_MAX)
        return SIZE_MAX;
    int r = LZ4_decompress_safe((const char *)in, (char *)out, (int)n, (int)cap);
    return r < 0 ? SIZE_MAX : (size_t)r;
}

static int lz4_encode(const struct kvt_sd *sd, struct kvt_serde_wctx *w, struct kvt_sd_obj *o,
                      const uint8_t *in, size_t n, uint8_t *out, size_t cap, size_t *outn)
{
    const struct lz4_cfg *l = sd->priv;
    return kvt_sd_cframe_encode(sd, l->split, lz4_c, w, o, in, n, out, cap, outn);
}

static int lz4_decode(const struct kvt_sd *sd, struct kvt_serde_wctx *w, struct kvt_sd_obj *o,
                      const uint8_t *in, size_t n, uint8_t *out, size_t cap, size_t *outn)
{
    (void)sd;
    return kvt_sd_cframe_decode(lz4_d, w, o, in, n, out, cap, outn);
}

const struct kvt_sd_ops kvt_sd_lz4_ops = {
    .type = "lz4",
    .parse = lz4_parse,
    .bound = lz4_bound,
    .encode = lz4_encode,
    .decode = lz4_decode,
    .free = lz4_free,
};
