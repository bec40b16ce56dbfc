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
 * context. Quantization runs eight elements at a time with AVX2 + F16C
 * where the CPU has them (same arithmetic, same codes as the portable
 * path; KVT_SERDE_NO_SIMD=1 forces the portable path).
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

/*
 * The smallest e with amax <= 448 * 2^e, within [E_MIN, E_MAX]. From the
 * float's bits: amax = 1.M * 2^E and 448 = 1.75 * 2^8, so e = E - 8 when
 * 1.M <= 1.75, else E - 7. Zero and subnormal maxima take the slow path.
 */
static int scale_exp(float amax)
{
    uint32_t a = f2u(amax);
    int e;
    if (a >= 0x00800000u) {
        int E = (int)(a >> 23) - 127;
        e = (a & 0x7fffffu) <= 0x600000u ? E - 8 : E - 7;
    } else if (a == 0) {
        return 0;
    } else {
        frexpf(amax / 448.0f, &e);
        while (e > E_MIN && amax <= ldexpf(448.0f, e - 1))
            e--;
        while (e < E_MAX && amax > ldexpf(448.0f, e))
            e++;
    }
    return e < E_MIN ? E_MIN : e > E_MAX ? E_MAX : e;
}

/* 2^-e as a float, exact for e in [E_MIN, E_MAX]. */
static inline float inv_scale(int e)
{
    return u2f((uint32_t)(127 - e) << 23);
}

/* ---------------------------------------------- AVX2 + F16C kernels */

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#define HAVE_X86_KERNEL 1

/* Same arithmetic as f32_to_e4m3, eight lanes at a time. */
__attribute__((target("avx2,f16c"))) static inline __m256i e4m3_x8(__m256 f)
{
    const __m256i u0 = _mm256_castps_si256(f);
    __m256i sign = _mm256_and_si256(_mm256_srli_epi32(u0, 24), _mm256_set1_epi32(0x80));
    __m256i u = _mm256_and_si256(u0, _mm256_set1_epi32(0x7fffffff));
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 20), _mm256_set1_epi32(1));
    __m256i nrm = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7ffff)), odd);
    nrm = _mm256_sub_epi32(_mm256_srli_epi32(nrm, 20), _mm256_set1_epi32(120 << 3));
    __m256 magic = _mm256_set1_ps(16384.0f);
    __m256i sub =
        _mm256_sub_epi32(_mm256_castps_si256(_mm256_add_ps(_mm256_castsi256_ps(u), magic)),
                         _mm256_castps_si256(magic));
    __m256i is_sub = _mm256_cmpgt_epi32(_mm256_set1_epi32(121 << 23), u);
    __m256i code = _mm256_blendv_epi8(nrm, sub, is_sub);
    code = _mm256_min_epu32(code, _mm256_set1_epi32(0x7e));
    return _mm256_or_si256(code, sign);
}

/* Low byte of each 32-bit lane of two vectors -> 16 bytes at out. */
__attribute__((target("avx2,f16c"))) static inline void store_codes16(__m256i a, __m256i b,
                                                                      uint8_t *out)
{
    /* packs work within 128-bit lanes: a0-3 b0-3 | a4-7 b4-7 as 16-bit */
    __m256i ab = _mm256_packus_epi32(a, b);
    ab = _mm256_permute4x64_epi64(ab, 0xd8);       /* a0-3 a4-7 | b0-3 b4-7 */
    __m256i bytes = _mm256_packus_epi16(ab, ab);   /* a0-7 a0-7 | b0-7 b0-7 */
    bytes = _mm256_permute4x64_epi64(bytes, 0x08); /* a0-7 b0-7 | ... */
    _mm_storeu_si128((__m128i *)out, _mm256_castsi256_si128(bytes));
}

__attribute__((target("avx2,f16c"))) static uint16_t amax_x86(const uint8_t *x, size_t m)
{
    __m256i mx = _mm256_setzero_si256(), mask = _mm256_set1_epi16(0x7fff);
    size_t i = 0;
    for (; i + 16 <= m; i += 16)
        mx = _mm256_max_epu16(
            mx, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(x + 2 * i)), mask));
    __m128i h = _mm_max_epu16(_mm256_castsi256_si128(mx), _mm256_extracti128_si256(mx, 1));
    h = _mm_max_epu16(h, _mm_srli_si128(h, 8));
    h = _mm_max_epu16(h, _mm_srli_si128(h, 4));
    h = _mm_max_epu16(h, _mm_srli_si128(h, 2));
    uint16_t r = (uint16_t)_mm_extract_epi16(h, 0);
    for (; i < m; i++) {
        uint16_t a = ld16(x + 2 * i) & 0x7fffu;
        r = a > r ? a : r;
    }
    return r;
}

__attribute__((target("avx2,f16c"))) static void quant_x86(const uint8_t *x, size_t m, bool bf16,
                                                           float inv, uint8_t *codes)
{
    __m256 vinv = _mm256_set1_ps(inv);
    size_t i = 0;
    for (; i + 16 <= m; i += 16) {
        __m128i h0 = _mm_loadu_si128((const __m128i *)(x + 2 * i));
        __m128i h1 = _mm_loadu_si128((const __m128i *)(x + 2 * i + 16));
        __m256 f0, f1;
        if (bf16) {
            f0 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h0), 16));
            f1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h1), 16));
        } else {
            f0 = _mm256_cvtph_ps(h0);
            f1 = _mm256_cvtph_ps(h1);
        }
        store_codes16(e4m3_x8(_mm256_mul_ps(f0, vinv)), e4m3_x8(_mm256_mul_ps(f1, vinv)),
                      codes + i);
    }
    for (; i < m; i++)
        codes[i] =
            f32_to_e4m3((bf16 ? bf16_to_f32(ld16(x + 2 * i)) : f16_to_f32(ld16(x + 2 * i))) * inv);
}

/*
 * Dequantize m codes with scale 2^e into fp16 or bf16, eight at a time;
 * returns how many it did (a multiple of 8; the caller finishes the tail).
 * Same results as the tables: e4m3 normals are rebased in the integer
 * domain (exponent + 120), subnormals converted as integers times 2^-9 (no
 * operation on subnormal floats), times 2^e, then rounded to nearest even:
 * fp16 by F16C after clamping to +-65504, bf16 in the integer domain with
 * saturation. The NaN codes (never written) give NaN as the tables do.
 */
__attribute__((target("avx2,f16c"))) static size_t dequant_x86(const uint8_t *c, size_t m,
                                                               bool bf16, int e, uint8_t *dst)
{
    const __m256 ks = _mm256_castsi256_ps(_mm256_set1_epi32((127 + e) << 23));
    const __m256 sub_scale = _mm256_set1_ps(0x1p-9f);
    const __m256i x7f = _mm256_set1_epi32(0x7f), eight = _mm256_set1_epi32(8);
    size_t i = 0;
    for (; i + 8 <= m; i += 8) {
        __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(c + i)));
        __m256i sign = _mm256_slli_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0x80)), 24);
        __m256i mag = _mm256_and_si256(v, x7f);
        __m256 fn = _mm256_castsi256_ps(
            _mm256_add_epi32(_mm256_slli_epi32(mag, 20), _mm256_set1_epi32(120 << 23)));
        __m256 fs = _mm256_mul_ps(_mm256_cvtepi32_ps(mag), sub_scale);
        __m256 f = _mm256_blendv_ps(fn, fs, _mm256_castsi256_ps(_mm256_cmpgt_epi32(eight, mag)));
        f = _mm256_mul_ps(f, ks);
        __m256 nan = _mm256_castsi256_ps(_mm256_cmpeq_epi32(mag, x7f));
        if (!bf16) {
            f = _mm256_min_ps(f, _mm256_set1_ps(65504.0f));
            f = _mm256_or_ps(f, _mm256_castsi256_ps(sign));
            f = _mm256_blendv_ps(
                f, _mm256_castsi256_ps(_mm256_or_si256(sign, _mm256_set1_epi32(0x7fc00000))), nan);
            _mm_storeu_si128((__m128i *)(dst + 2 * i),
                             _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        } else {
            __m256i u = _mm256_castps_si256(f);
            __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
            __m256i r = _mm256_srli_epi32(
                _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), odd), 16);
            __m256i inf = _mm256_cmpeq_epi32(_mm256_and_si256(r, _mm256_set1_epi32(0x7f80)),
                                             _mm256_set1_epi32(0x7f80));
            r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7f7f), inf);
            r = _mm256_or_si256(r, _mm256_srli_epi32(sign, 16));
            r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7fc0), _mm256_castps_si256(nan));
            __m256i p = _mm256_packus_epi32(r, r);
            p = _mm256_permute4x64_epi64(p, 0x08);
            _mm_storeu_si128((__m128i *)(dst + 2 * i), _mm256_castsi256_si128(p));
        }
    }
    return i;
}

/* AVX2 and F16C present and enabled by the OS (YMM state in XCR0). */
static bool cpu_has_avx2_f16c(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return false;
    if (!(c & (1u << 27)) || !(c & (1u << 28)) || !(c & (1u << 29))) /* OSXSAVE AVX F16C */
        return false;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & 6u) != 6u)
        return false;
    if (__get_cpuid_max(0, NULL) < 7)
        return false;
    __cpuid_count(7, 0, a, b, c, d);
    return b & (1u << 5); /* AVX2 */
}

static bool use_x86_kernel(void)
{
    /* benign race: every thread computes the same value */
    static _Atomic int cached = -1;
    int v = atomic_load_explicit(&cached, memory_order_relaxed);
    if (v < 0) {
        const char *off = getenv("KVT_SERDE_NO_SIMD");
        v = !(off && *off && *off != '0') && cpu_has_avx2_f16c();
        atomic_store_explicit(&cached, v, memory_order_relaxed);
    }
    return v;
}
#else
static bool use_x86_kernel(void)
{
    return false;
}
#endif

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

/* Quantize one block of m elements; false if it holds an inf or NaN.
 * Largest magnitude by integer max over the bits without the sign: for
 * finite fp16/bf16 the bit patterns order like the values. */
static bool quant_block(const uint8_t *x, size_t m, bool bf16, bool simd, int8_t *scale,
                        uint8_t *codes)
{
    uint16_t mx = 0;
#ifdef HAVE_X86_KERNEL
    if (simd)
        mx = amax_x86(x, m);
    else
#endif
        for (size_t i = 0; i < m; i++) {
            uint16_t a = ld16(x + 2 * i) & 0x7fffu;
            mx = a > mx ? a : mx;
        }
    if (mx >= (bf16 ? 0x7f80u : 0x7c00u))
        return false;
    int e = scale_exp(bf16 ? bf16_to_f32(mx) : f16_to_f32(mx));
    *scale = (int8_t)e;
    float inv = inv_scale(e);
#ifdef HAVE_X86_KERNEL
    if (simd) {
        quant_x86(x, m, bf16, inv, codes);
        return true;
    }
#endif
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
    bool bf16 = dt == KVT_DTYPE_BF16, simd = use_x86_kernel();
    for (size_t b = 0; b < nb; b++) {
        size_t m = KVT_MIN(B, ne - b * B);
        if (!quant_block(in + 2 * b * B, m, bf16, simd, &scales[b], codes + b * B))
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
    bool simd = use_x86_kernel();
    (void)simd;
    for (uint64_t b = 0; b < nb; b++) {
        int e = scales[b];
        if (e < E_MIN || e > E_MAX)
            return kvt_sd_bad(o, KVT_SERDE_FORMAT);
        uint64_t m = KVT_MIN((uint64_t)B, cnt - b * B), i = 0;
        const uint8_t *c = codes + b * B;
        uint8_t *dst = out + 2 * b * B;
#ifdef HAVE_X86_KERNEL
        if (simd)
            i = dequant_x86(c, (size_t)m, dt == KVT_DTYPE_BF16, e, dst);
#endif
        if (i == m)
            continue;
        const uint16_t *lut = lut_get(w, dt, e);
        if (!lut)
            return kvt_sd_bad(o, KVT_SERDE_NOMEM);
        for (; i < m; i++)
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
