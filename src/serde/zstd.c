/*
 * zstd serde: one zstd frame per object in the shared compressor frame
 * (cframe.c). Config: level (default 3, zstd's own default; negative
 * levels are zstd's fast modes), byte_split (default true). Compression
 * and decompression contexts are kept per worker thread.
 */
#include "serde/serde_int.h"
#include "common/util.h"

#include <stdio.h>
#include <stdlib.h>

#include <zstd.h>

struct zstd_cfg {
    int level;
    bool split;
};

static int zstd_parse(struct kvt_cfg *c, struct kvt_sd *sd)
{
    int64_t level = 3;
    bool split = true;
    kvt_cfg_int(c, "level", false, 3, ZSTD_minCLevel() < -100 ? -100 : ZSTD_minCLevel(),
                ZSTD_maxCLevel(), &level);
    kvt_cfg_bool(c, "byte_split", true, &split);
    if (c->rc)
        return c->rc;
    struct zstd_cfg *z = kvt_xcalloc(1, sizeof(*z));
    z->level = (int)level;
    z->split = split;
    sd->priv = z;
    return 0;
}

static void zstd_free(struct kvt_sd *sd)
{
    free(sd->priv);
    sd->priv = NULL;
}

static uint64_t zstd_bound(const struct kvt_sd *sd, uint64_t n)
{
    (void)sd;
    return KVT_MAX((uint64_t)ZSTD_compressBound((size_t)n), n) + KVT_SD_CFRAME_HDR;
}

void kvt_sd_zstd_wctx_free(struct kvt_serde_wctx *w)
{
    ZSTD_freeCCtx(w->zc);
    ZSTD_freeDCtx(w->zd);
    w->zc = w->zd = NULL;
}

static size_t zstd_c(const struct kvt_sd *sd, struct kvt_serde_wctx *w, const uint8_t *in, size_t n,
                     uint8_t *out, size_t cap)
{
    const struct zstd_cfg *z = sd->priv;
    if (!w->zc && !(w->zc = ZSTD_createCCtx()))
        return 0;
    size_t r = ZSTD_compressCCtx(w->zc, out, cap, in, n, z->level);
    return ZSTD_isError(r) ? 0 : r;
}

static size_t zstd_d(struct kvt_serde_wctx *w, const uint8_t *in, size_t n, uint8_t *out,
                     size_t cap)
{
    if (!w->zd && !(w->zd = ZSTD_createDCtx()))
        return SIZE_MAX;
    size_t r = ZSTD_decompressDCtx(w->zd, out, cap, in, n);
    return ZSTD_isError(r) ? SIZE_MAX : r;
}

static int zstd_encode(const struct kvt_sd *sd, struct kvt_serde_wctx *w, struct kvt_sd_obj *o,
                       const uint8_t *in, size_t n, uint8_t *out, size_t cap, size_t *outn)
{
    const struct zstd_cfg *z = sd->priv;
    return kvt_sd_cframe_encode(sd, z->split, zstd_c, w, o, in, n, out, cap, outn);
}

static int zstd_decode(const struct kvt_sd *sd, struct kvt_serde_wctx *w, struct kvt_sd_obj *o,
                       const uint8_t *in, size_t n, uint8_t *out, size_t cap, size_t *outn)
{
    (void)sd;
    return kvt_sd_cframe_decode(zstd_d, w, o, in, n, out, cap, outn);
}

const struct kvt_sd_ops kvt_sd_zstd_ops = {
    .type = "zstd",
    .parse = zstd_parse,
    .bound = zstd_bound,
    .encode = zstd_encode,
    .decode = zstd_decode,
    .free = zstd_free,
};
