/*
 * Test and benchmark data for the serdes: a deterministic PRNG, reference
 * fp16/bf16 conversions written independently of src/serde/fp8.c, and
 * KV-cache-like tensors.
 *
 * "Realistic" KV values (what LLM K/V caches look like, per the KV
 * quantization literature: KIVI, KVQuant): a tensor of tokens x heads x
 * head_dim, Gaussian per channel, with a log-normal scale per channel
 * (sigma 0.75) and 2 % outlier channels 8x larger, i.e. per-channel
 * outliers as seen in keys; a second kind is a plain N(0,1) tensor
 * (values). Used by tests/unit/test_serde.c and bench/serde_bench.c.
 */
#ifndef KVT_TEST_SERDE_DATA_H
#define KVT_TEST_SERDE_DATA_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline uint64_t sd_rng(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull); /* splitmix64 */
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static inline double sd_unif(uint64_t *s)
{
    return ((double)(sd_rng(s) >> 11) + 0.5) / 9007199254740992.0;
}

static inline double sd_gauss(uint64_t *s)
{
    double u = sd_unif(s), v = sd_unif(s);
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

/* fp16 bits -> double (exact). */
static inline double sd_h2d(uint16_t h)
{
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
    return h & 0x8000 ? -v : v;
}

/* double -> fp16 bits, round to nearest even (overflow -> inf). */
static inline uint16_t sd_d2h(double d)
{
    uint16_t sign = signbit(d) ? 0x8000 : 0;
    double a = fabs(d);
    if (isnan(a))
        return 0x7e00;
    if (a < 0x1p-14)
        return sign | (uint16_t)nearbyint(a * 0x1p24);
    int e;
    frexp(a, &e);
    int E = e - 1;
    double m = nearbyint(ldexp(a, 10 - E));
    if (m >= 2048) {
        m = 1024;
        E++;
    }
    if (E > 15)
        return sign | 0x7c00;
    return sign | (uint16_t)((E + 15) << 10) | (uint16_t)(m - 1024);
}

static inline double sd_b2d(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t sd_d2b(double d)
{
    float f = (float)d;
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* KV-like tensor of n 16-bit elements (bf16 when bf16, else fp16), scaled
 * by `scale`. head_dim 128; channels = position modulo 1024 (8 heads). */
static inline void sd_kv_tensor(uint16_t *out, size_t n, uint64_t seed, int bf16, double scale)
{
    enum { CH = 1024 };
    double chs[CH];
    uint64_t s = seed * 7919 + 1;
    for (int c = 0; c < CH; c++) {
        chs[c] = exp(0.75 * sd_gauss(&s));
        if (sd_unif(&s) < 0.02)
            chs[c] *= 8.0;
    }
    for (size_t i = 0; i < n; i++) {
        double v = sd_gauss(&s) * chs[i % CH] * scale;
        out[i] = bf16 ? sd_d2b(v) : sd_d2h(v);
    }
}

/* Plain N(0, scale^2) tensor (V-like). */
static inline void sd_gauss_tensor(uint16_t *out, size_t n, uint64_t seed, int bf16, double scale)
{
    uint64_t s = seed * 104729 + 7;
    for (size_t i = 0; i < n; i++) {
        double v = sd_gauss(&s) * scale;
        out[i] = bf16 ? sd_d2b(v) : sd_d2h(v);
    }
}

#endif
