/*
 * The frame shared by the lz4 and zstd serdes (layout in serde_int.h),
 * with the optional byte split: KV tensors of 16-bit floats compress
 * poorly as raw bytes because each element's high byte (sign, exponent,
 * top of the mantissa) repeats a few values while its low byte is noise;
 * grouping all high bytes together gives the compressor long runs of
 * similar bytes. The split width comes from the stream's dtype at this
 * point of the chain (2 for fp16/bf16/raw, 4 for fp32, none after fp8) and
 * is recorded in the frame, so decode never needs the dtype.
 */
#include "serde/serde_int.h"

#include <string.h>

int kvt_sd_cframe_encode(const struct kvt_sd *sd, bool split, kvt_sd_compress_fn fn,
                         struct kvt_serde_wctx *w, struct kvt_sd_obj *o, const uint8_t *in,
                         size_t n, uint8_t *out, size_t cap, size_t *outn)
{
    if (cap < n + KVT_SD_CFRAME_HDR)
        return -ENOSPC;
    unsigned width = split ? kvt_sd_split_width(o->dtype) : 1;
    const uint8_t *src = in;
    if (width > 1 && n >= 2 * width) {
        uint8_t *tmp = kvt_sd_scratch(w, 2, n);
        if (!tmp)
            return -ENOMEM;
        kvt_sd_split(in, n, width, tmp);
        src = tmp;
    } else {
        width = 1;
    }
    memset(out, 0, KVT_SD_CFRAME_HDR);
    kvt_sd_put64(out + 8, n);
    size_t c = n ? fn(sd, w, src, n, out + KVT_SD_CFRAME_HDR, cap - KVT_SD_CFRAME_HDR) : 0;
    if (c == 0 || c >= n) { /* incompressible: store the original bytes */
        memcpy(out + KVT_SD_CFRAME_HDR, in, n);
        out[0] = 0;
        out[1] = 1;
        *outn = n + KVT_SD_CFRAME_HDR;
    } else {
        out[0] = 1;
        out[1] = (uint8_t)width;
        *outn = c + KVT_SD_CFRAME_HDR;
    }
    o->dtype = KVT_DTYPE_U8; /* compressed bytes: nothing left to split */
    return 0;
}

int kvt_sd_cframe_decode(kvt_sd_decompress_fn fn, struct kvt_serde_wctx *w, struct kvt_sd_obj *o,
                         const uint8_t *in, size_t n, uint8_t *out, size_t cap, size_t *outn)
{
    if (n < KVT_SD_CFRAME_HDR)
        return kvt_sd_bad(o, KVT_SERDE_FORMAT);
    unsigned mode = in[0], width = in[1];
    uint64_t olen = kvt_sd_get64(in + 8);
    const uint8_t *data = in + KVT_SD_CFRAME_HDR;
    size_t dlen = n - KVT_SD_CFRAME_HDR;
    if (mode > 1 || (width != 1 && width != 2 && width != 4))
        return kvt_sd_bad(o, KVT_SERDE_FORMAT);
    if (olen > cap)
        return kvt_sd_bad(o, KVT_SERDE_LENGTH);
    if (mode == 0) {
        if (dlen != olen)
            return kvt_sd_bad(o, KVT_SERDE_FORMAT);
        memcpy(out, data, dlen);
        *outn = dlen;
        return 0;
    }
    uint8_t *dst = out;
    if (width > 1) {
        dst = kvt_sd_scratch(w, 2, olen);
        if (!dst)
            return kvt_sd_bad(o, KVT_SERDE_NOMEM);
    }
    size_t got = fn(w, data, dlen, dst, (size_t)olen);
    if (got != olen)
        return kvt_sd_bad(o, got == SIZE_MAX ? KVT_SERDE_FORMAT : KVT_SERDE_LENGTH);
    if (width > 1)
        kvt_sd_unsplit(dst, (size_t)olen, width, out);
    *outn = (size_t)olen;
    return 0;
}
