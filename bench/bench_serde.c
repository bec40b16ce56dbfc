/*
 * bench_serde: throughput of each serde on one core against memcpy of the
 * same bytes, compression ratios on 16-bit KV-like tensors, and the fp8
 * error against a plain (unscaled) cast, in one run.
 *
 *   ./build/bench/bench_serde [--mib 48] [--obj-mib 4] [--rounds 5]
 *
 * Method: one thread pinned to one CPU. The working set (--mib, in objects
 * of --obj-mib) is larger than the caches, so every pass streams from
 * memory. Each round runs, alternately, memcpy of the working set and
 * the serde's encode and decode of the same objects; the table prints the
 * median GB/s of logical bytes over the rounds and the ratio to the
 * median memcpy of the same round set. Data: KV-like fp16 (see
 * tests/unit/test_serde_data.h), so compressors and fp8 see realistic
 * values.
 */
#include "common/util.h"
#include "kvtier/error.h"
#include "l2/adapters.h"
#include "serde/serde.h"

#include "../tests/unit/test_serde_data.h"

#include <fcntl.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), cmp_d);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static struct kvt_serde *mk(const char *serde_json)
{
    char spec[2048], err[1024];
    snprintf(spec, sizeof(spec),
             "{\"type\":\"mock\",\"max_size_gb\":1,\"mock_bandwidth_gb\":1,\"serde\":%s}",
             serde_json);
    struct kvt_l2_spec s;
    if (kvt_l2_spec_parse(spec, 0, &s, err, sizeof(err))) {
        fprintf(stderr, "bench_serde: %s\n", err);
        exit(1);
    }
    struct kvt_serde *c = kvt_serde_ref(s.serde);
    kvt_l2_spec_free(&s);
    return c;
}

struct ws {
    int n;
    size_t len;
    uint8_t **src, **dst, **enc;
    size_t *elen;
    kvt_key *keys;
    uint16_t dtype;
};

static double now(void)
{
    return (double)kvt_now_ns() / 1e9;
}

static double pass_memcpy(struct ws *w)
{
    double t0 = now();
    for (int i = 0; i < w->n; i++)
        memcpy(w->dst[i], w->src[i], w->len);
    return (double)w->n * (double)w->len / (now() - t0) / 1e9;
}

static double pass_encode(struct ws *w, struct kvt_serde *c, struct kvt_serde_wctx *x)
{
    kvt_objmeta m = {.len = (uint32_t)w->len, .dtype = w->dtype};
    double t0 = now();
    for (int i = 0; i < w->n; i++) {
        free(w->enc[i]);
        w->enc[i] = NULL;
        if (kvt_serde_encode(c, x, &w->keys[i], &m, w->src[i], w->len, (void **)&w->enc[i],
                             &w->elen[i])) {
            fprintf(stderr, "encode failed\n");
            exit(1);
        }
    }
    return (double)w->n * (double)w->len / (now() - t0) / 1e9;
}

static double pass_decode(struct ws *w, struct kvt_serde *c, struct kvt_serde_wctx *x)
{
    kvt_objmeta m = {.len = (uint32_t)w->len, .dtype = w->dtype};
    double t0 = now();
    for (int i = 0; i < w->n; i++) {
        enum kvt_serde_fail why;
        if (kvt_serde_decode(c, x, &w->keys[i], &m, w->enc[i], w->elen[i], w->dst[i], w->len,
                             &why)) {
            fprintf(stderr, "decode failed: %s\n", kvt_serde_fail_str(why));
            exit(1);
        }
    }
    return (double)w->n * (double)w->len / (now() - t0) / 1e9;
}

static double stored_ratio(struct ws *w)
{
    double s = 0;
    for (int i = 0; i < w->n; i++)
        s += (double)w->elen[i];
    return s / ((double)w->n * (double)w->len);
}

/* e4m3 value nearest to v with no scale, saturating at 448 (a plain cast,
 * as LMCache's fp8 serde does with torch .to(float8_e4m3fn)). */
static double plain_e4m3(double v)
{
    double a = fabs(v);
    if (a >= 448)
        return copysign(448, v);
    if (a < 0x1p-6)
        return copysign(nearbyint(a * 512) / 512, v);
    int e;
    frexp(a, &e);
    double q = ldexp(nearbyint(ldexp(a, 4 - e)), e - 4);
    return copysign(q, v);
}

static void fp8_error_table(struct kvt_serde *fp8, struct kvt_serde_wctx *x)
{
    size_t ne = 1 << 20;
    uint16_t *src = malloc(ne * 2), *dec = malloc(ne * 2);
    struct {
        const char *name;
        int kv;
        double scale;
    } d[] = {
        {"fp16 KV-like (per-channel scales, outliers)", 1, 1.0},
        {"fp16 N(0,1)", 0, 1.0},
        {"fp16 N(0,1) x 3000", 0, 3000.0},
        {"fp16 N(0,1) x 1e-4", 0, 1e-4},
    };
    kvt_key k = {0};
    uint32_t ns;
    kvt_ns_intern("bench", 5, "", 0, &ns, NULL);
    kvt_key_make(&k, ns, (const uint8_t *)"0123456789abcdef0123456789abcdef", 32, 0, 0);
    printf("\nfp8 error (1 Mi elements each; relative errors over |x| >= amax_block/64)\n");
    printf("%-46s %12s %12s %14s %14s\n", "distribution", "max rel", "rms rel", "plain cast max",
           "plain cast rms");
    for (size_t j = 0; j < KVT_ARRAY_LEN(d); j++) {
        if (d[j].kv)
            sd_kv_tensor(src, ne, j + 11, 0, d[j].scale);
        else
            sd_gauss_tensor(src, ne, j + 11, 0, d[j].scale);
        kvt_objmeta m = {.len = (uint32_t)(ne * 2), .dtype = KVT_DTYPE_FP16};
        void *enc = NULL;
        size_t el;
        enum kvt_serde_fail why;
        if (kvt_serde_encode(fp8, x, &k, &m, src, ne * 2, &enc, &el) ||
            kvt_serde_decode(fp8, x, &k, &m, enc, el, dec, ne * 2, &why))
            exit(1);
        free(enc);
        double mr = 0, e2 = 0, x2 = 0, pmr = 0, pe2 = 0;
        for (size_t b0 = 0; b0 < ne; b0 += 128) {
            double amax = 0;
            for (size_t i = b0; i < b0 + 128; i++)
                amax = fmax(amax, fabs(sd_h2d(src[i])));
            for (size_t i = b0; i < b0 + 128; i++) {
                double v = sd_h2d(src[i]), y = sd_h2d(dec[i]), p = plain_e4m3(v);
                e2 += (y - v) * (y - v);
                pe2 += (p - v) * (p - v);
                x2 += v * v;
                if (fabs(v) >= amax / 64 && v != 0) {
                    mr = fmax(mr, fabs(y - v) / fabs(v));
                    pmr = fmax(pmr, fabs(p - v) / fabs(v));
                }
            }
        }
        printf("%-46s %12.4f %12.4f %14.4f %14.4f\n", d[j].name, mr, sqrt(e2 / x2), pmr,
               sqrt(pe2 / x2));
    }
    free(src);
    free(dec);
}

int main(int argc, char **argv)
{
    int mib = 48, obj_mib = 4, rounds = 5;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--mib"))
            mib = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--obj-mib"))
            obj_mib = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--rounds"))
            rounds = atoi(argv[i + 1]);
    }
    if (mib < obj_mib || obj_mib < 1 || rounds < 1 || rounds > 64) {
        fprintf(stderr, "usage: bench_serde [--mib N] [--obj-mib N] [--rounds N]\n");
        return 2;
    }
    cpu_set_t cs;
    CPU_ZERO(&cs);
    CPU_SET(sched_getcpu() < 0 ? 0 : sched_getcpu(), &cs);
    sched_setaffinity(0, sizeof(cs), &cs);

    char dir[] = "/tmp/kvt-serde-bench-XXXXXX", key[64];
    if (!mkdtemp(dir))
        return 1;
    snprintf(key, sizeof(key), "%s/k", dir);
    int fd = open(key, O_WRONLY | O_CREAT | O_EXCL, 0600);
    uint8_t kb[32];
    uint64_t s = 5;
    for (int i = 0; i < 32; i++)
        kb[i] = (uint8_t)sd_rng(&s);
    if (fd < 0 || write(fd, kb, 32) != 32)
        return 1;
    close(fd);

    struct ws w = {.n = mib / obj_mib, .len = (size_t)obj_mib << 20, .dtype = KVT_DTYPE_FP16};
    w.src = calloc((size_t)w.n, sizeof(void *));
    w.dst = calloc((size_t)w.n, sizeof(void *));
    w.enc = calloc((size_t)w.n, sizeof(void *));
    w.elen = calloc((size_t)w.n, sizeof(size_t));
    w.keys = calloc((size_t)w.n, sizeof(kvt_key));
    uint32_t ns;
    kvt_ns_intern("bench/model", 11, "", 0, &ns, NULL);
    for (int i = 0; i < w.n; i++) {
        w.src[i] = malloc(w.len);
        w.dst[i] = malloc(w.len);
        memset(w.dst[i], 0, w.len); /* fault the pages in before timing */
        sd_kv_tensor((uint16_t *)w.src[i], w.len / 2, (uint64_t)i + 1, 0, 1.0);
        uint8_t h[32] = {0};
        memcpy(h, &i, sizeof(i));
        kvt_key_make(&w.keys[i], ns, h, 32, 0, 0);
    }
    char e128[256], e256[256], chain[512], chain2[512];
    snprintf(e128, sizeof(e128),
             "{\"type\":\"encrypt\",\"master_key_path\":\"%s\",\"aes_bits\":128}", key);
    snprintf(e256, sizeof(e256), "{\"type\":\"encrypt\",\"master_key_path\":\"%s\"}", key);
    snprintf(chain, sizeof(chain), "[{\"type\":\"fp8\"},{\"type\":\"zstd\",\"level\":1},%s]", e256);
    snprintf(chain2, sizeof(chain2), "[{\"type\":\"fp8\"},{\"type\":\"lz4\"}]");
    struct {
        const char *name, *json;
    } cfg[] = {
        {"checksum", "{\"type\":\"checksum\"}"},
        {"encrypt aes-128-gcm", e128},
        {"encrypt aes-256-gcm", e256},
        {"fp8 (block 128)", "{\"type\":\"fp8\"}"},
        {"lz4 (byte split)", "{\"type\":\"lz4\"}"},
        {"lz4 (raw bytes)", "{\"type\":\"lz4\",\"byte_split\":false}"},
        {"zstd -1 (byte split)", "{\"type\":\"zstd\",\"level\":-1}"},
        {"zstd 1 (byte split)", "{\"type\":\"zstd\",\"level\":1}"},
        {"zstd 3 (byte split)", "{\"type\":\"zstd\",\"level\":3}"},
        {"zstd 3 (raw bytes)", "{\"type\":\"zstd\",\"level\":3,\"byte_split\":false}"},
        {"fp8 + lz4", chain2},
        {"fp8 + zstd 1 + aes-256-gcm", chain},
    };
    struct kvt_serde_wctx *x = kvt_serde_wctx_new();
    printf("bench_serde: %d objects of %d MiB (KV-like fp16), %d rounds, one core (cpu %d)\n", w.n,
           obj_mib, rounds, sched_getcpu());
    printf("%-28s %10s %10s %10s %9s %9s %14s\n", "serde", "memcpy", "encode", "decode",
           "enc/memcpy", "dec/memcpy", "stored/logical");
    double mc_all[64 * 2 * 16];
    int nmc_all = 0;
    for (size_t c = 0; c < KVT_ARRAY_LEN(cfg); c++) {
        struct kvt_serde *ch = mk(cfg[c].json);
        double mc[128], en[64], de[64];
        int nm = 0;
        pass_encode(&w, ch, x); /* warm: scratch, tables, contexts */
        pass_decode(&w, ch, x);
        if (!strstr(cfg[c].json, "fp8")) /* lossless: check before timing */
            for (int i = 0; i < w.n; i++)
                if (memcmp(w.src[i], w.dst[i], w.len)) {
                    fprintf(stderr, "%s: round trip differs\n", cfg[c].name);
                    return 1;
                }
        for (int r = 0; r < rounds; r++) {
            mc[nm++] = pass_memcpy(&w);
            en[r] = pass_encode(&w, ch, x);
            mc[nm++] = pass_memcpy(&w);
            de[r] = pass_decode(&w, ch, x);
        }
        for (int i = 0; i < nm && nmc_all < (int)KVT_ARRAY_LEN(mc_all); i++)
            mc_all[nmc_all++] = mc[i];
        double m = median(mc, nm), e = median(en, rounds), d = median(de, rounds);
        printf("%-28s %8.2f GB/s %6.2f GB/s %6.2f GB/s %9.3f %9.3f %14.3f\n", cfg[c].name, m, e, d,
               e / m, d / m, stored_ratio(&w));
        fflush(stdout);
        kvt_serde_unref(ch);
    }
    printf("memcpy median over all rounds: %.2f GB/s\n", median(mc_all, nmc_all));

    /* compression ratios on several 16-bit distributions (one object each) */
    printf("\nstored/logical on 4 MiB objects (lower is better)\n");
    const char *comp[] = {"{\"type\":\"lz4\",\"byte_split\":false}",
                          "{\"type\":\"lz4\"}",
                          "{\"type\":\"zstd\",\"level\":1,\"byte_split\":false}",
                          "{\"type\":\"zstd\",\"level\":1}",
                          "{\"type\":\"zstd\",\"level\":3,\"byte_split\":false}",
                          "{\"type\":\"zstd\",\"level\":3}",
                          "{\"type\":\"zstd\",\"level\":9}",
                          "[{\"type\":\"fp8\"},{\"type\":\"zstd\",\"level\":3}]"};
    const char *cname[] = {"lz4",   "lz4+split",   "zstd1",       "zstd1+split",
                           "zstd3", "zstd3+split", "zstd9+split", "fp8+zstd3"};
    struct {
        const char *name;
        int kv, bf16;
    } dist[] = {{"fp16 KV-like (keys)", 1, 0},
                {"fp16 N(0,1) (values)", 0, 0},
                {"bf16 KV-like", 1, 1},
                {"bf16 N(0,1)", 0, 1}};
    printf("%-22s", "data");
    for (size_t c = 0; c < KVT_ARRAY_LEN(comp); c++)
        printf(" %12s", cname[c]);
    printf("\n");
    struct ws one = w;
    one.n = 1;
    for (size_t dd = 0; dd < KVT_ARRAY_LEN(dist); dd++) {
        if (dist[dd].kv)
            sd_kv_tensor((uint16_t *)w.src[0], w.len / 2, 100 + dd, dist[dd].bf16, 1.0);
        else
            sd_gauss_tensor((uint16_t *)w.src[0], w.len / 2, 100 + dd, dist[dd].bf16, 1.0);
        one.dtype = dist[dd].bf16 ? KVT_DTYPE_BF16 : KVT_DTYPE_FP16;
        printf("%-22s", dist[dd].name);
        for (size_t c = 0; c < KVT_ARRAY_LEN(comp); c++) {
            struct kvt_serde *ch = mk(comp[c]);
            pass_encode(&one, ch, x);
            printf(" %12.3f", stored_ratio(&one));
            kvt_serde_unref(ch);
        }
        printf("\n");
    }

    struct kvt_serde *fp8 = mk("{\"type\":\"fp8\"}");
    fp8_error_table(fp8, x);
    kvt_serde_unref(fp8);

    kvt_serde_wctx_free(x);
    for (int i = 0; i < w.n; i++) {
        free(w.src[i]);
        free(w.dst[i]);
        free(w.enc[i]);
    }
    free(w.src);
    free(w.dst);
    free(w.enc);
    free(w.elen);
    free(w.keys);
    unlink(key);
    rmdir(dir);
    return 0;
}
