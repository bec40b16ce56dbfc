/*
 * fp8 serde: fp16/bf16 payloads to float8 e4m3 ("e4m3fn": finite, max 448)
 * with one power-of-two scale per block of block_size elements (default
 * 128, about one attention head vector).
 *
 * Why a scale per block: e4m3 spans 2^-9 .. 448. KV values outside it
 * (fp16 up to 65504, bf16 up to 3e38, or blocks of tiny values) would be
 * clipped or flushed to zero by a plain cast (LMCache's fp8 serde). Each
 * block is divided by s = 2^e, the smallest power of two with
 * amax(block) / s <= 448, so the largest element lands in e4m3's top
 * binade. A power of two is exact to apply and to undo, and fits in one
 * byte (e as int8), so the scale costs 1 byte per block.
 *
 * Error (round to nearest even; docs/serde.md has the measurements): for an
 * element x of a block with maximum magnitude amax,
 *   |x' - x| <= |x| / 16 + amax / 2^17        (before the output rounding)
 * the first term is half an e4m3 ulp (3 mantissa bits), the second the
 * subnormal step of e4m3 (2^-9 * s / 2, s < amax / 224). Dequantizing
 * rounds once more to the output type: + |x| * 2^-11 (fp16), 2^-8 (bf16).
 *
 * Frame: [mode u8: 1 quantized, 0 passthrough][dtype u8][2 zero bytes]
 *        [block_size le32][elements le64 (passthrough: bytes)]
 *        quantized: [int8 exponent per block][one e4m3 code per element]
 *        passthrough: [the input bytes]
 * Passthrough (counted in fp8_passthrough): a dtype other than fp16/bf16
 * (raw bytes, fp32, uint8, fp8), an odd length, or an inf/NaN anywhere.
 * Values are 16-bit words in host byte order (little-endian hosts).
 *
 * Dequantization is a table lookup per element: one 256-entry table per
 * (output dtype, scale exponent), built on first use in the worker's
 * context.
 */
#include "serde/serde_int.h"
#include "common/util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HDR 16
#define E_MIN (-126)
#define E_MAX 126

struct fp8_cfg {
    uint32_t block;
};

static int fp8_parse(struct kvt_cfg *c, struct kvt_sd *sd)
{
    static const char *const kinds[] = {"float8_e4m3fn", "float8_e4m3", "e4m3", NULL};
    int64_t block = 128;
    const char *kind = NULL;
    kvt_cfg_int(c, "block_size", false, 128, 8, 1 << 20, &block);
    kvt_cfg_enum(c, "fp8_dtype", false, "float8_e4m3fn", kinds, true, &kind);
    if (c->rc)
        return c->rc;
    struct fp8_cfg *f = kvt_xcalloc(1, sizeof(*f));
    f->block = (uint32_t)block;
    sd->priv = f;
    return 0;
}

static void fp8_free(struct kvt_sd *sd)
{
    free(sd->priv);
    sd->priv = NULL;
}

static uint64_t fp8_bound(const struct kvt_sd *sd, uint64_t n)
{
    (void)sd;
    return n + HDR; /* passthrough is the largest outcome */
}

/* ------------------------------------------------------- conversions */

static inline uint32_t f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t ld16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

/* fp16 bits -> float, branchless, with no operation on subnormal floats:
 * normal halves are rebased by an exponent offset and a multiply by
 * 2^-112; subnormal halves are built as 0.5 + m * 2^-24 and 0.5
 * subtracted. */
static inline float f16_to_f32(uint16_t h)
{
    uint32_t w = (uint32_t)h << 16;
    uint32_t sign = w & 0x80000000u;
    uint32_t two_w = w + w;
    float norm = u2f((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
    float denorm = u2f((two_w >> 17) | (126u << 23)) - 0.5f;
    uint32_t r = sign | (two_w < (1u << 27) ? f2u(denorm) : f2u(norm));
    return u2f(r);
}

static inline float bf16_to_f32(uint16_t h)
{
    return u2f((uint32_t)h << 16);
}

/*
 * float -> e4m3 code, round to nearest even, saturating at 448 (the input
 * is finite and |f| <= 448 after scaling, up to rounding).
 * Normal results (|f| >= 2^-6): round the float's 23-bit mantissa to 3
 * bits in the integer domain and rebias the exponent (127 -> 7).
 * Subnormal results: adding 2^14 (whose ulp is 2^-9, e4m3's subnormal step)
 * makes the FPU round to a multiple of 2^-9; the low bits are the code.
 */
static inline uint8_t f32_to_e4m3(float f)
{
    uint32_t u = f2u(f);
    uint32_t sign = (u >> 24) & 0x80u;
    u &= 0x7fffffffu;
    uint32_t nrm = ((u + 0x7ffffu + ((u >> 20) & 1u)) >> 20) - (120u << 3);
    uint32_t sub = f2u(u2f(u) + 16384.0f) - f2u(16384.0f);
    uint32_t code = u < (121u << 23) ? sub : nrm;
    code = code > 0x7eu ? 0x7eu : code;
    return (uint8_t)(code | sign);
}

static double e4m3_value(uint8_t c)
{
    unsigned e = (c >> 3) & 15u, m = c & 7u;
    double v;
    if ((c & 0x7f) == 0x7f)
        v = NAN;
    else if (e == 0)
        v = ldexp(m, -9);
    else
        v = ldexp(8 + m, (int)e - 10);
    return c & 0x80 ? -v : v;
}

/* float -> fp16 bits, round to nearest even, saturating at +-65504. */
static uint16_t f32_to_f16_sat(float f)
{
    uint32_t u = f2u(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    if (isnan(f))
        return sign | 0x7e00;
    float a = fabsf(f);
    if (a >= 65520.0f)
        return sign | 0x7bff;
    if (a < 0x1p-14f)
        return sign | (uint16_t)lrintf(a * 0x1p24f);
    u &= 0x7fffffffu;
    uint32_t r = u + 0xfffu + ((u >> 13) & 1u);
    return sign | (uint16_t)((r >> 13) - (112u << 10));
}

/* float -> bf16 bits, round to nearest even, saturating at the max finite. */
static uint16_t f32_to_bf16_sat(float f)
{
    if (isnan(f))
        return 0x7fc0;
    uint32_t u = f2u(f);
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    if ((r & 0x7f80u) == 0x7f80u)
        r = (r & 0x8000u) | 0x7f7fu;
    return (uint16_t)r;
}

/* The dequantization table of (dtype, e), built on first use. */
static const uint16_t *lut_get(struct kvt_serde_wctx *w, uint16_t dtype, int e)
{
    int d = dtype == KVT_DTYPE_BF16;
    uint16_t **slot = &w->fp8_lut[d][e + 128];
    if (*slot)
        return *slot;
    uint16_t *t = malloc(256 * sizeof(uint16_t));
    if (!t)
        return NULL;
    for (int c = 0; c < 256; c++) {
        float v = (float)(e4m3_value((uint8_t)c) * ldexp(1.0, e)); /* exact */
        t[c] = d ? f32_to_bf16_sat(v) : f32_to_f16_sat(v);
    }
    *slot = t;
    return t;
}

/* The smallest e with amax <= 448 * 2^e, within [E_MIN, E_MAX]. */
static int scale_exp(float amax)
{
    if (!(amax > 0))
        return 0;
    int e;
    frexpf(amax / 448.0f, &e);
    while (e > E_MIN && amax <= ldexpf(448.0f, e - 1))
        e--;
    while (e < E_MAX && amax > ldexpf(448.0f, e))
        e++;
    return e < E_MIN ? E_MIN : e;
}

/* --------------------------------------------------------- encode */

static int passthrough(struct kvt_sd_obj *o, const uint8_t *in, size_t n, uint8_t *out,
                       size_t *outn)
{
    memset(out, 0, HDR);
    out[1] = (uint8_t)o->dtype;
    kvt_sd_put64(out + 8, n);
    memcpy(out + HDR, in, n);
    *outn = n + HDR;
    atomic_fetch_add(&o->stats->fp8_passthrough, 1);
    return 0;
}

/* Quantize one block of m elements; false if it holds an inf or NaN. */
static bool quant_block(const uint8_t *x, size_t m, bool bf16, int8_t *scale, uint8_t *codes)
{
    uint16_t mx = 0;
    for (size_t i = 0; i < m; i++) {
        uint16_t a = ld16(x + 2 * i) & 0x7fffu;
        mx = a > mx ? a : mx;
    }
    if (mx >= (bf16 ? 0x7f80u : 0x7c00u))
        return false;
    int e = scale_exp(bf16 ? bf16_to_f32(mx) : f16_to_f32(mx));
    *scale = (int8_t)e;
    float inv = ldexpf(1.0f, -e);
    if (bf16)
        for (size_t i = 0; i < m; i++)
            codes[i] = f32_to_e4m3(bf16_to_f32(ld16(x + 2 * i)) * inv);
    else
        for (size_t i = 0; i < m; i++)
            codes[i] = f32_to_e4m3(f16_to_f32(ld16(x + 2 * i)) * inv);
    return true;
}

static int fp8_encode(const struct kvt_sd *sd, struct kvt_serde_wctx *w, struct kvt_sd_obj *o,
                      const uint8_t *in, size_t n, uint8_t *out, size_t cap, size_t *outn)
{
    (void)w;
    const struct fp8_cfg *f = sd->priv;
    if (cap < n + HDR)
        return -ENOSPC;
    uint16_t dt = o->dtype;
    if ((dt != KVT_DTYPE_FP16 && dt != KVT_DTYPE_BF16) || n == 0 || n % 2)
        return passthrough(o, in, n, out, outn);
    size_t ne = n / 2, B = f->block, nb = (ne + B - 1) / B;
    int8_t *scales = (int8_t *)(out + HDR);
    uint8_t *codes = out + HDR + nb;
    bool bf16 = dt == KVT_DTYPE_BF16;
    for (size_t b = 0; b < nb; b++) {
        size_t m = KVT_MIN(B, ne - b * B);
        if (!quant_block(in + 2 * b * B, m, bf16, &scales[b], codes + b * B))
            return passthrough(o, in, n, out, outn);
    }
    memset(out, 0, HDR);
    out[0] = 1;
    out[1] = (uint8_t)dt;
    kvt_sd_put32(out + 4, (uint32_t)B);
    kvt_sd_put64(out + 8, ne);
    *outn = HDR + nb + ne;
    o->dtype = KVT_DTYPE_FP8_E4M3;
    return 0;
}

/* --------------------------------------------------------- decode */

static int fp8_decode(const struct kvt_sd *sd, struct kvt_serde_wctx *w, struct kvt_sd_obj *o,
                      const uint8_t *in, size_t n, uint8_t *out, size_t cap, size_t *outn)
{
    (void)sd;
    if (n < HDR)
        return kvt_sd_bad(o, KVT_SERDE_FORMAT);
    uint8_t mode = in[0];
    uint16_t dt = in[1];
    uint64_t cnt = kvt_sd_get64(in + 8);
    if (mode == 0) {
        if (cnt != n - HDR)
            return kvt_sd_bad(o, KVT_SERDE_FORMAT);
        if (cnt > cap)
            return kvt_sd_bad(o, KVT_SERDE_LENGTH);
        memcpy(out, in + HDR, cnt);
        *outn = cnt;
        return 0;
    }
    uint32_t B = kvt_sd_get32(in + 4);
    if (mode != 1 || (dt != KVT_DTYPE_FP16 && dt != KVT_DTYPE_BF16) || B == 0 ||
        cnt > KVT_MAX_OBJECT)
        return kvt_sd_bad(o, KVT_SERDE_FORMAT);
    uint64_t nb = (cnt + B - 1) / B;
    if (n != HDR + nb + cnt)
        return kvt_sd_bad(o, KVT_SERDE_FORMAT);
    if (2 * cnt > cap)
        return kvt_sd_bad(o, KVT_SERDE_LENGTH);
    const int8_t *scales = (const int8_t *)(in + HDR);
    const uint8_t *codes = in + HDR + nb;
    for (uint64_t b = 0; b < nb; b++) {
        int e = scales[b];
        if (e < E_MIN || e > E_MAX)
            return kvt_sd_bad(o, KVT_SERDE_FORMAT);
        const uint16_t *lut = lut_get(w, dt, e);
        if (!lut)
            return kvt_sd_bad(o, KVT_SERDE_NOMEM);
        uint64_t m = KVT_MIN((uint64_t)B, cnt - b * B);
        const uint8_t *c = codes + b * B;
        uint8_t *dst = out + 2 * b * B;
        for (uint64_t i = 0; i < m; i++)
            memcpy(dst + 2 * i, &lut[c[i]], 2);
    }
    *outn = 2 * cnt;
    return 0;
}

const struct kvt_sd_ops kvt_sd_fp8_ops = {
    .type = "fp8",
    .parse = fp8_parse,
    .bound = fp8_bound,
    .encode = fp8_encode,
    .decode = fp8_decode,
    .free = fp8_free,
};
