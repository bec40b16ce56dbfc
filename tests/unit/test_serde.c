/* Description: serde chains: round trips, tampering, identity binding, key
 * files, fp8 error bounds, malformed frames. */
#include "test.h"
#include "test_serde_data.h"

#include "kvtier/error.h"
#include "common/util.h"
#include "l2/adapters.h"
#include "l2/kit/objfmt.h"
#include "serde/serde.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char keyfile[320], keyfile2[320], tmpdir[64];

/* A chain from an adapter spec with the given "serde" JSON; NULL with the
 * message in err when the config is refused. */
static struct kvt_serde *mk_err(const char *serde_json, char *err, size_t cap, int *rc_out)
{
    char spec[4096];
    snprintf(spec, sizeof(spec),
             "{\"type\":\"mock\",\"max_size_gb\":1,\"mock_bandwidth_gb\":1,\"serde\":%s}",
             serde_json);
    struct kvt_l2_spec s;
    int rc = kvt_l2_spec_parse(spec, 0, &s, err, cap);
    if (rc_out)
        *rc_out = rc;
    if (rc)
        return NULL;
    struct kvt_serde *c = kvt_serde_ref(s.serde);
    kvt_l2_spec_free(&s);
    return c;
}

static struct kvt_serde *mk(const char *serde_json)
{
    char err[1024] = "";
    struct kvt_serde *c = mk_err(serde_json, err, sizeof(err), NULL);
    if (!c)
        fprintf(stderr, "config refused: %s\n", err);
    TEST_ASSERT(c != NULL);
    return c;
}

static kvt_key key_of(const char *model, const char *salt, int i)
{
    uint32_t ns;
    TEST_ASSERT(kvt_ns_intern(model, strlen(model), salt, strlen(salt), &ns, NULL) == 0);
    uint8_t h[32] = {0};
    memcpy(h, &i, sizeof(i));
    h[31] = 0x5a;
    kvt_key k;
    TEST_ASSERT(kvt_key_make(&k, ns, h, 32, 7, 0) == 0);
    return k;
}

static void write_key(const char *path, const void *data, size_t n, mode_t mode)
{
    unlink(path);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    TEST_ASSERT(fd >= 0);
    TEST_ASSERT(write(fd, data, n) == (ssize_t)n);
    close(fd);
    TEST_ASSERT(chmod(path, mode) == 0);
}

static const char *enc_json(const char *path, int bits, char *buf, size_t cap)
{
    snprintf(buf, cap, "{\"type\":\"encrypt\",\"master_key_path\":\"%s\",\"aes_bits\":%d}", path,
             bits);
    return buf;
}

/* Encode then decode; returns the decode rc, fills dec (cap = n). */
static int round_trip(struct kvt_serde *c, struct kvt_serde_wctx *w, const kvt_key *k,
                      uint16_t dtype, const void *src, size_t n, void *dec, size_t *stored,
                      enum kvt_serde_fail *why)
{
    kvt_objmeta m = {.len = (uint32_t)n, .dtype = dtype};
    void *enc = NULL;
    size_t elen = 0;
    TEST_ASSERT(kvt_serde_encode(c, w, k, &m, src, n, &enc, &elen) == 0);
    TEST_ASSERT(elen <= kvt_serde_bound(c, n));
    if (stored)
        *stored = elen;
    int rc = kvt_serde_decode(c, w, k, &m, enc, elen, dec, n, why);
    free(enc);
    return rc;
}

static void fill_bytes(uint8_t *p, size_t n, uint64_t seed)
{
    uint64_t s = seed;
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)sd_rng(&s);
}

/* Lossless serdes and chains: exact round trips for many sizes and dtypes. */
static void test_lossless_round_trips(void)
{
    char e128[512], e256[512];
    enc_json(keyfile, 128, e128, sizeof(e128));
    enc_json(keyfile, 256, e256, sizeof(e256));
    char chain1[2048], chain2[2048];
    snprintf(chain1, sizeof(chain1), "[{\"type\":\"zstd\",\"level\":1},%s,{\"type\":\"checksum\"}]",
             e256);
    snprintf(chain2, sizeof(chain2), "[{\"type\":\"checksum\"},{\"type\":\"lz4\"},%s]", e128);
    const char *cfgs[] = {
        "{\"type\":\"checksum\"}",
        e128,
        e256,
        "{\"type\":\"lz4\"}",
        "{\"type\":\"lz4\",\"byte_split\":false,\"acceleration\":4}",
        "{\"type\":\"zstd\"}",
        "{\"type\":\"zstd\",\"level\":-5,\"byte_split\":\"false\"}",
        "{\"type\":\"zstd\",\"level\":19}",
        chain1,
        chain2,
    };
    size_t sizes[] = {0, 1, 7, 4096, 65537, (1u << 20) + 3};
    uint16_t dtypes[] = {KVT_DTYPE_RAW, KVT_DTYPE_FP16, KVT_DTYPE_BF16, KVT_DTYPE_FP32,
                         KVT_DTYPE_U8};
    struct kvt_serde_wctx *w = kvt_serde_wctx_new();
    size_t maxn = (1u << 20) + 3;
    uint8_t *src = malloc(maxn), *dec = malloc(maxn);
    kvt_key k = key_of("org/model-a", "", 1);
    for (size_t c = 0; c < KVT_ARRAY_LEN(cfgs); c++) {
        struct kvt_serde *ch = mk(cfgs[c]);
        for (size_t si = 0; si < KVT_ARRAY_LEN(sizes); si++) {
            size_t n = sizes[si];
            for (size_t d = 0; d < KVT_ARRAY_LEN(dtypes); d++) {
                if (d % 2)
                    fill_bytes(src, n, si * 31 + d);
                else
                    sd_kv_tensor((uint16_t *)src, n / 2, si + d, 0, 1.0);
                if (n % 2)
                    src[n - 1] = 0xab;
                memset(dec, 0xee, n);
                size_t stored = 0;
                enum kvt_serde_fail why;
                int rc = round_trip(ch, w, &k, dtypes[d], src, n, dec, &stored, &why);
                if (rc)
                    fprintf(stderr, "cfg %zu size %zu dtype %u: %s\n", c, n, dtypes[d],
                            kvt_serde_fail_str(why));
                TEST_ASSERT(rc == 0);
                TEST_ASSERT(memcmp(src, dec, n) == 0);
            }
        }
        kvt_serde_unref(ch);
    }
    free(src);
    free(dec);
    kvt_serde_wctx_free(w);
}

/* Compression helps on KV-like fp16 data, more with the byte split, and
 * random bytes are stored, not grown. */
static void test_compression_ratios(void)
{
    size_t n = 1 << 20;
    uint16_t *src = malloc(n);
    uint8_t *dec = malloc(n);
    sd_kv_tensor(src, n / 2, 3, 0, 1.0);
    struct kvt_serde_wctx *w = kvt_serde_wctx_new();
    kvt_key k = key_of("m", "", 2);
    const char *cfgs[] = {"{\"type\":\"zstd\"}", "{\"type\":\"zstd\",\"byte_split\":false}",
                          "{\"type\":\"lz4\"}", "{\"type\":\"lz4\",\"byte_split\":false}"};
    size_t st[4];
    for (int c = 0; c < 4; c++) {
        struct kvt_serde *ch = mk(cfgs[c]);
        TEST_ASSERT(round_trip(ch, w, &k, KVT_DTYPE_FP16, src, n, dec, &st[c], NULL) == 0);
        TEST_ASSERT(memcmp(src, dec, n) == 0);
        fprintf(stderr, "   %-45s stored/logical %.3f\n", cfgs[c], (double)st[c] / (double)n);
        kvt_serde_unref(ch);
    }
    TEST_ASSERT(st[0] < st[1] && st[0] < n * 0.9);
    /* lz4 has no entropy coder: Gaussian-like exponent bytes do not shrink,
     * it must store rather than grow */
    TEST_ASSERT(st[2] <= n + 16 && st[3] <= n + 16);
    /* random bytes: stored as is behind the 16-byte frame */
    fill_bytes((uint8_t *)src, n, 9);
    struct kvt_serde *ch = mk("{\"type\":\"zstd\"}");
    size_t s = 0;
    TEST_ASSERT(round_trip(ch, w, &k, KVT_DTYPE_RAW, src, n, dec, &s, NULL) == 0);
    TEST_ASSERT(s == n + 16);
    kvt_serde_unref(ch);
    free(src);
    free(dec);
    kvt_serde_wctx_free(w);
}

/* Every flipped byte of a checksum or encrypt frame is caught; moving the
 * bytes to another key (name, salt, rank), or changing the header's dtype
 * or length, is caught too. */
static void test_tamper_and_identity(void)
{
    char e[512], ch2[1024];
    enc_json(keyfile, 256, e, sizeof(e));
    snprintf(ch2, sizeof(ch2), "[{\"type\":\"fp8\"},{\"type\":\"zstd\"},%s]", e);
    struct {
        const char *cfg;
        enum kvt_serde_fail want;
    } cases[] = {{"{\"type\":\"checksum\"}", KVT_SERDE_CHECKSUM},
                 {e, KVT_SERDE_DECRYPT},
                 {ch2, KVT_SERDE_DECRYPT}};
    size_t n = 8192;
    uint16_t *src = malloc(n);
    uint8_t *dec = malloc(n);
    sd_kv_tensor(src, n / 2, 5, 0, 1.0);
    struct kvt_serde_wctx *w = kvt_serde_wctx_new();
    kvt_key k = key_of("org/model", "tenant-a", 1);
    kvt_key others[] = {key_of("org/model", "tenant-a", 2), key_of("org/model", "tenant-b", 1),
                        key_of("org/model2", "tenant-a", 1)};
    kvt_key rank = k;
    rank.kv_rank ^= 1;
    for (size_t c = 0; c < KVT_ARRAY_LEN(cases); c++) {
        struct kvt_serde *chn = mk(cases[c].cfg);
        kvt_objmeta m = {.len = (uint32_t)n, .dtype = KVT_DTYPE_FP16};
        uint8_t *enc = NULL;
        size_t elen = 0;
        TEST_ASSERT(kvt_serde_encode(chn, w, &k, &m, src, n, (void **)&enc, &elen) == 0);
        enum kvt_serde_fail why;
        TEST_ASSERT(kvt_serde_decode(chn, w, &k, &m, enc, elen, dec, n, &why) == 0);
        for (size_t pos = 0; pos < elen; pos += 1 + elen / 97) {
            enc[pos] ^= 0x10;
            int rc = kvt_serde_decode(chn, w, &k, &m, enc, elen, dec, n, &why);
            enc[pos] ^= 0x10;
            TEST_ASSERT(rc == KVT_E_CORRUPT);
            /* a flip in a frame header in front of the checked bytes may be
             * caught as a malformed frame first */
            TEST_ASSERT(why == cases[c].want || why == KVT_SERDE_FORMAT || why == KVT_SERDE_LENGTH);
        }
        for (size_t o = 0; o < KVT_ARRAY_LEN(others); o++) {
            TEST_ASSERT(kvt_serde_decode(chn, w, &others[o], &m, enc, elen, dec, n, &why) ==
                        KVT_E_CORRUPT);
            TEST_ASSERT(why == cases[c].want);
        }
        TEST_ASSERT(kvt_serde_decode(chn, w, &rank, &m, enc, elen, dec, n, &why) == KVT_E_CORRUPT);
        TEST_ASSERT(why == cases[c].want);
        kvt_objmeta m2 = m;
        m2.dtype = KVT_DTYPE_BF16;
        TEST_ASSERT(kvt_serde_decode(chn, w, &k, &m2, enc, elen, dec, n, &why) == KVT_E_CORRUPT);
        /* truncated */
        TEST_ASSERT(kvt_serde_decode(chn, w, &k, &m, enc, elen - 1, dec, n, &why) == KVT_E_CORRUPT);
        /* wrong destination size: a miss, never an overrun */
        kvt_objmeta m3 = m;
        m3.len = (uint32_t)n - 2;
        TEST_ASSERT(kvt_serde_decode(chn, w, &k, &m3, enc, elen, dec, n - 2, &why) ==
                    KVT_E_CORRUPT);
        TEST_ASSERT(why == KVT_SERDE_LENGTH || why == cases[c].want);
        free(enc);
        struct kvt_serde_stats *st = kvt_serde_stats(chn);
        TEST_ASSERT(atomic_load(&st->decode_failed) > 0);
        kvt_serde_unref(chn);
    }
    free(src);
    free(dec);
    kvt_serde_wctx_free(w);
}

/* The encrypted bytes contain no 16-byte window of the plaintext, and two
 * encryptions of the same object differ (random IV). */
static void test_no_plaintext(void)
{
    char e[512];
    struct kvt_serde *c = mk(enc_json(keyfile, 256, e, sizeof(e)));
    size_t n = 64 * 1024;
    uint8_t *src = malloc(n);
    for (size_t i = 0; i < n; i++)
        src[i] = (uint8_t)("SECRET-PLAINTEXT-MARKER-"[i % 24]);
    struct kvt_serde_wctx *w = kvt_serde_wctx_new();
    kvt_key k = key_of("m", "", 3);
    kvt_objmeta m = {.len = (uint32_t)n};
    uint8_t *a = NULL, *b = NULL;
    size_t al, bl;
    TEST_ASSERT(kvt_serde_encode(c, w, &k, &m, src, n, (void **)&a, &al) == 0);
    TEST_ASSERT(kvt_serde_encode(c, w, &k, &m, src, n, (void **)&b, &bl) == 0);
    TEST_ASSERT(al == n + 28 && bl == al);
    TEST_ASSERT(memcmp(a, b, al) != 0);
    TEST_ASSERT(memmem(a, al, src, 16) == NULL && memmem(a, al, "SECRET", 6) == NULL);
    free(a);
    free(b);
    free(src);
    kvt_serde_wctx_free(w);
    kvt_serde_unref(c);
}

/* Key files: bad ones are config errors naming the field; the chain id
 * follows the key and the format, not format-neutral knobs. */
static void test_key_files_and_ids(void)
{
    char e[512], err[1024];
    int rc;
    struct {
        const char *content;
        size_t len;
        mode_t mode;
        const char *msg;
    } bad[] = {
        {"0123456789abcdef0123456789abcde", 31, 0600, "32 raw bytes or 64 hex"},
        {"zz23456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", 64, 0600, "64 hex"},
        {"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", 64, 0644,
         "group or others"},
        {"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", 64, 0640, "chmod 600"},
    };
    char path[300];
    snprintf(path, sizeof(path), "%s/bad.key", tmpdir);
    for (size_t i = 0; i < KVT_ARRAY_LEN(bad); i++) {
        write_key(path, bad[i].content, bad[i].len, bad[i].mode);
        TEST_ASSERT(mk_err(enc_json(path, 256, e, sizeof(e)), err, sizeof(err), &rc) == NULL);
        TEST_ASSERT(rc == KVT_E_CONFIG);
        TEST_ASSERT(strstr(err, "--l2-adapter #0 (mock)") && strstr(err, "master_key_path"));
        TEST_ASSERT(strstr(err, bad[i].msg));
        TEST_ASSERT(!strstr(err, "0123456789abcdef")); /* never the key */
    }
    unlink(path);
    TEST_ASSERT(mk_err(enc_json(path, 256, e, sizeof(e)), err, sizeof(err), &rc) == NULL);
    TEST_ASSERT(strstr(err, "No such file"));
    TEST_ASSERT(mk_err(enc_json(tmpdir, 256, e, sizeof(e)), err, sizeof(err), &rc) == NULL);
    TEST_ASSERT(strstr(err, "regular file") || strstr(err, "group or others"));
    /* a FIFO must not block the start-up */
    char fifo[340];
    snprintf(fifo, sizeof(fifo), "%s/fifo", tmpdir);
    TEST_ASSERT(mkfifo(fifo, 0600) == 0);
    TEST_ASSERT(mk_err(enc_json(fifo, 256, e, sizeof(e)), err, sizeof(err), &rc) == NULL);
    TEST_ASSERT(strstr(err, "not a regular file"));
    unlink(fifo);
    TEST_ASSERT(mk_err("{\"type\":\"encrypt\"}", err, sizeof(err), &rc) == NULL);
    TEST_ASSERT(strstr(err, "\"serde.master_key_path\" is required"));
    TEST_ASSERT(mk_err("[{\"type\":\"fp8\"},{\"type\":\"encrypt\",\"master_key_path\":\"/x\","
                       "\"aes_bits\":192}]",
                       err, sizeof(err), &rc) == NULL);
    TEST_ASSERT(strstr(err, "\"serde[1].aes_bits\" must be 128 or 256"));
    TEST_ASSERT(mk_err("[]", err, sizeof(err), &rc) == NULL && strstr(err, "at least one"));
    TEST_ASSERT(mk_err("[1]", err, sizeof(err), &rc) == NULL && strstr(err, "serde[0]"));
    TEST_ASSERT(mk_err("{\"type\":\"fp8\",\"fp8_dtype\":\"float8_e5m2\"}", err, sizeof(err), &rc) ==
                NULL);
    TEST_ASSERT(strstr(err, "serde.fp8_dtype"));
    /* hex with a trailing newline is accepted; same key, same id */
    const char *hex = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n";
    write_key(path, hex, strlen(hex), 0400);
    struct kvt_serde *a = mk(enc_json(path, 256, e, sizeof(e)));
    uint8_t raw[32];
    for (int i = 0; i < 32; i++)
        raw[i] = (uint8_t)(((i % 16) << 4) | (i % 16));
    write_key(keyfile2, raw, 32, 0600);
    struct kvt_serde *b = mk(enc_json(keyfile2, 256, e, sizeof(e)));
    TEST_ASSERT(kvt_serde_id(a) == kvt_serde_id(b));
    struct kvt_serde *c = mk(enc_json(keyfile, 256, e, sizeof(e)));
    TEST_ASSERT(kvt_serde_id(a) != kvt_serde_id(c)); /* another key */
    struct kvt_serde *d = mk(enc_json(keyfile, 128, e, sizeof(e)));
    TEST_ASSERT(kvt_serde_id(c) != kvt_serde_id(d)); /* another key size */
    struct kvt_serde *z1 = mk("{\"type\":\"zstd\",\"level\":1}");
    struct kvt_serde *z2 = mk("{\"type\":\"zstd\",\"level\":9,\"byte_split\":false}");
    struct kvt_serde *l1 = mk("{\"type\":\"lz4\"}");
    TEST_ASSERT(kvt_serde_id(z1) == kvt_serde_id(z2) && kvt_serde_id(z1) != kvt_serde_id(l1));
    TEST_ASSERT(kvt_serde_id(z1) != 0);
    /* a different key with the same id space: decrypt fails */
    size_t n = 1000;
    uint8_t src[1000], dec[1000];
    fill_bytes(src, n, 4);
    struct kvt_serde_wctx *w = kvt_serde_wctx_new();
    kvt_key k = key_of("m", "", 4);
    kvt_objmeta m = {.len = (uint32_t)n};
    void *enc = NULL;
    size_t elen;
    TEST_ASSERT(kvt_serde_encode(c, w, &k, &m, src, n, &enc, &elen) == 0);
    enum kvt_serde_fail why;
    TEST_ASSERT(kvt_serde_decode(a, w, &k, &m, enc, elen, dec, n, &why) == KVT_E_CORRUPT);
    TEST_ASSERT(why == KVT_SERDE_DECRYPT);
    free(enc);
    kvt_serde_wctx_free(w);
    struct kvt_serde *all[] = {a, b, c, d, z1, z2, l1};
    for (size_t i = 0; i < KVT_ARRAY_LEN(all); i++)
        kvt_serde_unref(all[i]);
    unlink(path);
}

/* XXH3 of every fp8 output, to compare the SIMD and portable paths. */
static uint64_t fp8_digest;

struct err_stats {
    double max_abs, max_rel_normal, sum_e2, sum_x2;
    size_t n, violations;
};

/* Quantize through fp8 and check every element against the documented
 * bound |x' - x| <= |x| * (1/16 + out_ulp) + amax_block / 2^17. */
static void fp8_measure(struct kvt_serde *c, struct kvt_serde_wctx *w, const uint16_t *src,
                        size_t ne, int bf16, uint32_t block, struct err_stats *es)
{
    uint16_t *dec = malloc(ne * 2);
    size_t stored = 0;
    kvt_key k = key_of("m", "", 5);
    TEST_ASSERT(round_trip(c, w, &k, bf16 ? KVT_DTYPE_BF16 : KVT_DTYPE_FP16, src, ne * 2, dec,
                           &stored, NULL) == 0);
    TEST_ASSERT(stored == 16 + (ne + block - 1) / block + ne);
    double out_ulp = bf16 ? 0x1p-8 : 0x1p-11;
    memset(es, 0, sizeof(*es));
    for (size_t b0 = 0; b0 < ne; b0 += block) {
        size_t m = KVT_MIN((size_t)block, ne - b0);
        double amax = 0;
        for (size_t i = 0; i < m; i++)
            amax = fmax(amax, fabs(bf16 ? sd_b2d(src[b0 + i]) : sd_h2d(src[b0 + i])));
        for (size_t i = 0; i < m; i++) {
            double x = bf16 ? sd_b2d(src[b0 + i]) : sd_h2d(src[b0 + i]);
            double y = bf16 ? sd_b2d(dec[b0 + i]) : sd_h2d(dec[b0 + i]);
            TEST_ASSERT(isfinite(y));
            double err = fabs(y - x);
            double bound =
                fabs(x) * (1.0 / 16 + out_ulp) * (1 + 1e-9) + amax * 0x1p-17 + (bf16 ? 0 : 0x1p-25);
            if (err > bound) {
                if (es->violations++ < 5)
                    fprintf(stderr, "bound violated: x=%.9g y=%.9g amax=%.9g\n", x, y, amax);
            }
            es->max_abs = fmax(es->max_abs, err);
            if (fabs(x) >= amax * 0x1p-6 && x != 0)
                es->max_rel_normal = fmax(es->max_rel_normal, err / fabs(x));
            es->sum_e2 += err * err;
            es->sum_x2 += x * x;
        }
    }
    es->n = ne;
    fp8_digest = fp8_digest * 31 + kvt_payload_hash(dec, ne * 2);
    free(dec);
}

static void test_fp8_error(void)
{
    struct kvt_serde *c = mk("{\"type\":\"fp8\"}");
    struct kvt_serde *c32 = mk("{\"type\":\"fp8\",\"block_size\":32}");
    struct kvt_serde_wctx *w = kvt_serde_wctx_new();
    size_t ne = 1 << 20;
    uint16_t *x = malloc(ne * 2);
    struct {
        const char *name;
        int bf16, kv;
        double scale;
    } dists[] = {
        {"fp16 KV-like (per-channel scales, 2% outlier channels)", 0, 1, 1.0},
        {"fp16 N(0,1)", 0, 0, 1.0},
        {"fp16 N(0,1) * 3000 (beyond e4m3's 448)", 0, 0, 3000.0},
        {"fp16 N(0,1) * 1e-4 (below e4m3's 2^-9)", 0, 0, 1e-4},
        {"bf16 KV-like", 1, 1, 1.0},
        {"bf16 N(0,1) * 1e20", 1, 0, 1e20},
    };
    for (size_t d = 0; d < KVT_ARRAY_LEN(dists); d++) {
        if (dists[d].kv)
            sd_kv_tensor(x, ne, d + 1, dists[d].bf16, dists[d].scale);
        else
            sd_gauss_tensor(x, ne, d + 1, dists[d].bf16, dists[d].scale);
        struct err_stats es, es32;
        fp8_measure(c, w, x, ne, dists[d].bf16, 128, &es);
        fp8_measure(c32, w, x, ne, dists[d].bf16, 32, &es32);
        fprintf(stderr,
                "   %-55s block 128: max rel %.4f rms rel %.4f max abs %.3g | block 32: rms rel "
                "%.4f\n",
                dists[d].name, es.max_rel_normal, sqrt(es.sum_e2 / es.sum_x2), es.max_abs,
                sqrt(es32.sum_e2 / es32.sum_x2));
        TEST_ASSERT(es.violations == 0 && es32.violations == 0);
        TEST_ASSERT(es.max_rel_normal <= 1.0 / 16 + (dists[d].bf16 ? 0x1p-8 : 0x1p-11) + 1e-6);
        TEST_ASSERT(sqrt(es.sum_e2 / es.sum_x2) < 0.04);
    }
    /* saturation: values at fp16's max stay finite after the round trip */
    for (size_t i = 0; i < 4096; i++)
        x[i] = (uint16_t)((i & 1 ? 0x8000 : 0) | 0x7bff);
    uint16_t dec[4096];
    kvt_key k = key_of("m", "", 6);
    TEST_ASSERT(round_trip(c, w, &k, KVT_DTYPE_FP16, x, 8192, dec, NULL, NULL) == 0);
    for (size_t i = 0; i < 4096; i++)
        TEST_ASSERT((dec[i] & 0x7fff) == 0x7bff);
    /* passthrough: raw, fp32, odd length, inf -> exact and counted */
    struct kvt_serde_stats *st = kvt_serde_stats(c);
    uint64_t before = atomic_load(&st->fp8_passthrough);
    sd_gauss_tensor(x, 4096, 9, 0, 1.0);
    x[100] = 0x7c00; /* +inf */
    size_t stored;
    TEST_ASSERT(round_trip(c, w, &k, KVT_DTYPE_FP16, x, 8192, dec, &stored, NULL) == 0);
    TEST_ASSERT(memcmp(x, dec, 8192) == 0 && stored == 8192 + 16);
    TEST_ASSERT(round_trip(c, w, &k, KVT_DTYPE_RAW, x, 8192, dec, NULL, NULL) == 0);
    TEST_ASSERT(round_trip(c, w, &k, KVT_DTYPE_FP32, x, 8192, dec, NULL, NULL) == 0);
    TEST_ASSERT(round_trip(c, w, &k, KVT_DTYPE_FP16, x, 8191, dec, NULL, NULL) == 0);
    TEST_ASSERT(memcmp(x, dec, 8191) == 0);
    TEST_ASSERT(atomic_load(&st->fp8_passthrough) == before + 4);
    /* zeros and negative zero survive */
    memset(x, 0, 8192);
    x[3] = 0x8000;
    TEST_ASSERT(round_trip(c, w, &k, KVT_DTYPE_BF16, x, 8192, dec, NULL, NULL) == 0);
    TEST_ASSERT(memcmp(x, dec, 8192) == 0);
    free(x);
    kvt_serde_wctx_free(w);
    kvt_serde_unref(c);
    kvt_serde_unref(c32);
}

/* Random and truncated frames never crash, never write past the
 * destination, and never decode to a wrong length. */
static void test_garbage_frames(void)
{
    char e[512], ch[1024];
    enc_json(keyfile, 128, e, sizeof(e));
    snprintf(ch, sizeof(ch), "[{\"type\":\"fp8\"},{\"type\":\"lz4\"},{\"type\":\"zstd\"}]");
    const char *cfgs[] = {"{\"type\":\"fp8\"}",
                          "{\"type\":\"lz4\"}",
                          "{\"type\":\"zstd\"}",
                          "{\"type\":\"checksum\"}",
                          e,
                          ch};
    struct kvt_serde_wctx *w = kvt_serde_wctx_new();
    kvt_key k = key_of("m", "", 7);
    uint64_t s = 42;
    size_t n = 3000;
    uint8_t *good = malloc(n), *garbage = malloc(n + 64);
    sd_kv_tensor((uint16_t *)good, n / 2, 1, 0, 1.0);
    for (size_t c = 0; c < KVT_ARRAY_LEN(cfgs); c++) {
        struct kvt_serde *chn = mk(cfgs[c]);
        kvt_objmeta m = {.len = (uint32_t)n, .dtype = KVT_DTYPE_FP16};
        uint8_t *enc = NULL;
        size_t elen;
        TEST_ASSERT(kvt_serde_encode(chn, w, &k, &m, good, n, (void **)&enc, &elen) == 0);
        for (int it = 0; it < 300; it++) {
            /* an exact-size heap buffer: ASan catches any overrun */
            uint8_t *dst = malloc(n);
            size_t gl;
            uint8_t *in;
            if (it % 3 == 0) { /* truncated valid frame */
                gl = sd_rng(&s) % elen;
                in = enc;
            } else { /* valid frame with random bytes mixed in, or noise */
                gl = it % 3 == 1 ? elen : sd_rng(&s) % (n + 64);
                memcpy(garbage, enc, KVT_MIN(gl, elen));
                for (size_t i = 0; i < gl; i++)
                    if (it % 3 == 2 || sd_rng(&s) % 64 == 0)
                        garbage[i] = (uint8_t)sd_rng(&s);
                if (it % 3 == 2 && gl >= 16)
                    garbage[0] = (uint8_t)(sd_rng(&s) % 3); /* plausible modes */
                in = garbage;
            }
            enum kvt_serde_fail why = KVT_SERDE_OK;
            int rc = kvt_serde_decode(chn, w, &k, &m, in, gl, dst, n, &why);
            TEST_ASSERT(rc == 0 || rc == KVT_E_CORRUPT);
            TEST_ASSERT((rc == 0) == (why == KVT_SERDE_OK));
            free(dst);
        }
        free(enc);
        kvt_serde_unref(chn);
    }
    free(good);
    free(garbage);
    kvt_serde_wctx_free(w);
}

/* The portable fp8 path (KVT_SERDE_NO_SIMD=1, in a child process since the
 * choice is made once per process) meets the same bounds and produces the
 * same bytes as the SIMD path. */
static void test_fp8_portable_path_matches(void)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "KVT_SERDE_NO_SIMD=1 /proc/%d/exe --fp8-only 2>/dev/null",
             (int)getpid());
    FILE *p = popen(cmd, "r");
    TEST_ASSERT(p != NULL);
    unsigned long long child = 0;
    int got = fscanf(p, "fp8 digest %llx", &child);
    int rc = pclose(p);
    TEST_ASSERT(got == 1 && rc == 0);
    TEST_ASSERT(child == fp8_digest);
}

int main(int argc, char **argv)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/kvt-serde-test-XXXXXX");
    TEST_ASSERT(mkdtemp(tmpdir) != NULL);
    snprintf(keyfile, sizeof(keyfile), "%s/master.key", tmpdir);
    snprintf(keyfile2, sizeof(keyfile2), "%s/master2.key", tmpdir);
    uint8_t k[32];
    uint64_t s = 77;
    for (int i = 0; i < 32; i++)
        k[i] = (uint8_t)sd_rng(&s);
    write_key(keyfile, k, 32, 0600);
    if (argc > 1 && strcmp(argv[1], "--fp8-only") == 0) {
        RUN(test_fp8_error);
        printf("fp8 digest %016llx\n", (unsigned long long)fp8_digest);
        unlink(keyfile);
        rmdir(tmpdir);
        return TEST_RESULT();
    }
    RUN(test_lossless_round_trips);
    RUN(test_compression_ratios);
    RUN(test_tamper_and_identity);
    RUN(test_no_plaintext);
    RUN(test_key_files_and_ids);
    RUN(test_fp8_error);
    RUN(test_fp8_portable_path_matches);
    RUN(test_garbage_frames);
    unlink(keyfile);
    unlink(keyfile2);
    rmdir(tmpdir);
    return TEST_RESULT();
}
