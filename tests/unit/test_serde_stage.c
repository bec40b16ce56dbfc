/* Description: the serde stage in front of real engines (fs, mock): round
 * trips, stored-byte accounting, per-key failures in a batch, objects of
 * another chain, close with work in flight. */
#include "test.h"
#include "test_serde_data.h"

#include "common/util.h"
#include "kvtier/error.h"
#include "l2/adapters.h"
#include "l2/l2.h"
#include "l2/kit/objfmt.h"
#include "serde/serde.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[64], keyfile[128];

static kvt_l2 *open_adapter(const char *json)
{
    struct kvt_l2_spec s;
    char err[1024];
    int rc = kvt_l2_spec_parse(json, 0, &s, err, sizeof(err));
    if (rc)
        fprintf(stderr, "%s\n", err);
    TEST_ASSERT(rc == 0);
    kvt_l2 *l2 = NULL;
    rc = kvt_l2_open(&s, &l2, err, sizeof(err));
    if (rc)
        fprintf(stderr, "%s\n", err);
    TEST_ASSERT(rc == 0);
    kvt_l2_spec_free(&s); /* the adapter keeps its own reference to the chain */
    return l2;
}

static void close_adapter(kvt_l2 *l2)
{
    kvt_l2_close(l2);
    free(l2);
}

/* Wait for one task of a kind and pop it. */
static kvt_l2_task *wait_task(kvt_l2 *l2, enum kvt_l2_kind kind)
{
    for (int i = 0; i < 600; i++) {
        kvt_l2_task *t = NULL;
        if (kvt_l2_pop_done(l2, kind, &t, 1) == 1)
            return t;
        struct pollfd p = {.fd = l2->efd[kind], .events = POLLIN};
        poll(&p, 1, 100);
    }
    TEST_ASSERT(!"task did not complete");
    return NULL;
}

static kvt_key key_n(const char *model, int i)
{
    uint32_t ns;
    TEST_ASSERT(kvt_ns_intern(model, strlen(model), "", 0, &ns, NULL) == 0);
    uint8_t h[32] = {0};
    memcpy(h, &i, sizeof(i));
    h[20] = 0x77;
    kvt_key k;
    TEST_ASSERT(kvt_key_make(&k, ns, h, 32, 0, 0) == 0);
    return k;
}

struct payloads {
    uint32_t n;
    size_t len;
    uint8_t **p;
};

static struct payloads mk_payloads(uint32_t n, size_t len, uint64_t seed)
{
    struct payloads pl = {n, len, calloc(n, sizeof(uint8_t *))};
    for (uint32_t i = 0; i < n; i++) {
        pl.p[i] = malloc(len);
        sd_kv_tensor((uint16_t *)pl.p[i], len / 2, seed + i, 0, 1.0);
    }
    return pl;
}

static void free_payloads(struct payloads *pl)
{
    for (uint32_t i = 0; i < pl->n; i++)
        free(pl->p[i]);
    free(pl->p);
}

static void store_all(kvt_l2 *l2, const char *model, struct payloads *pl)
{
    kvt_l2_task *t = kvt_l2_task_new(KVT_L2_STORE, pl->n);
    for (uint32_t i = 0; i < pl->n; i++) {
        t->keys[i] = key_n(model, (int)i);
        t->bufs[i].ptr = pl->p[i];
        t->bufs[i].len = pl->len;
        t->meta[i].len = (uint32_t)pl->len;
        t->meta[i].dtype = KVT_DTYPE_FP16;
        t->meta[i].ndim = 1;
        t->meta[i].shape[0] = (uint32_t)pl->len / 2;
    }
    kvt_l2_submit(l2, t);
    TEST_ASSERT(wait_task(l2, KVT_L2_STORE) == t);
    TEST_ASSERT(kvt_bm_count(t->ok, t->n) == pl->n);
    kvt_l2_task_free(t);
}

/* Load every key; returns the ok bitmap's count and fills got[i] (caller frees). */
static uint32_t load_all(kvt_l2 *l2, const char *model, uint32_t n, size_t len, uint8_t **got,
                         uint64_t *okbm)
{
    kvt_l2_task *t = kvt_l2_task_new(KVT_L2_LOAD, n);
    for (uint32_t i = 0; i < n; i++) {
        t->keys[i] = key_n(model, (int)i);
        got[i] = malloc(len);
        memset(got[i], 0xcc, len);
        t->bufs[i].ptr = got[i];
        t->bufs[i].len = len;
    }
    kvt_l2_submit(l2, t);
    TEST_ASSERT(wait_task(l2, KVT_L2_LOAD) == t);
    uint32_t ok = (uint32_t)kvt_bm_count(t->ok, n);
    for (uint32_t i = 0; i < n; i++) {
        if (okbm && kvt_bm_test(t->ok, i))
            kvt_bm_set(okbm, i);
        if (kvt_bm_test(t->ok, i)) {
            TEST_ASSERT(t->bufs[i].len == len && t->meta[i].len == len);
            TEST_ASSERT(t->meta[i].dtype == KVT_DTYPE_FP16 && t->meta[i].serde == 0);
            TEST_ASSERT(t->meta[i].shape[0] == len / 2);
        }
    }
    kvt_l2_task_free(t);
    return ok;
}

static uint64_t dir_bytes(const char *d, int *nfiles)
{
    DIR *dir = opendir(d);
    TEST_ASSERT(dir != NULL);
    struct dirent *de;
    uint64_t total = 0;
    *nfiles = 0;
    while ((de = readdir(dir))) {
        if (!strstr(de->d_name, ".data"))
            continue;
        char p[512];
        snprintf(p, sizeof(p), "%s/%s", d, de->d_name);
        struct stat st;
        TEST_ASSERT(stat(p, &st) == 0);
        total += (uint64_t)st.st_size;
        (*nfiles)++;
    }
    closedir(dir);
    return total;
}

static json_t *status_of(kvt_l2 *l2)
{
    return kvt_l2_status(l2);
}

static uint64_t jint(json_t *o, const char *a, const char *b)
{
    json_t *v = json_object_get(o, a);
    if (b)
        v = json_object_get(v, b);
    TEST_ASSERT(v != NULL);
    return (uint64_t)json_integer_value(v);
}

/* fs + [fp8, zstd, encrypt]: round trip within the fp8 bound, capacity
 * counts stored bytes (= the files), status shows logical vs stored. */
static void test_fs_chain(void)
{
    char dir[128], json[1024];
    snprintf(dir, sizeof(dir), "%s/fs1", tmpdir);
    snprintf(json, sizeof(json),
             "{\"type\":\"fs\",\"base_path\":\"%s\",\"max_capacity_gb\":1,\"serde\":"
             "[{\"type\":\"fp8\",\"max_workers\":2},{\"type\":\"zstd\",\"level\":1},"
             "{\"type\":\"encrypt\",\"master_key_path\":\"%s\"}]}",
             dir, keyfile);
    kvt_l2 *l2 = open_adapter(json);
    size_t len = 256 * 1024;
    struct payloads pl = mk_payloads(24, len, 1);
    store_all(l2, "stage/model", &pl);
    int nf;
    uint64_t disk = dir_bytes(dir, &nf);
    json_t *st = status_of(l2);
    TEST_ASSERT(nf == 24);
    TEST_ASSERT(jint(st, "used_bytes", NULL) == disk);
    TEST_ASSERT(jint(st, "logical_bytes", NULL) == 24 * len);
    TEST_ASSERT(disk < 24 * len * 6 / 10); /* fp8 halves it, headers and scales on top */
    double ratio = json_real_value(json_object_get(st, "stored_to_logical_ratio"));
    TEST_ASSERT(ratio > 0.3 && ratio < 0.6);
    TEST_ASSERT(jint(st, "serde", "encoded") == 24);
    TEST_ASSERT(jint(st, "counters", "bytes_written") == disk);
    json_decref(st);
    uint8_t *got[24];
    TEST_ASSERT(load_all(l2, "stage/model", 24, len, got, NULL) == 24);
    for (uint32_t i = 0; i < 24; i++) {
        const uint16_t *a = (const uint16_t *)pl.p[i], *b = (const uint16_t *)got[i];
        for (size_t e = 0; e < len / 2; e++) {
            double x = sd_h2d(a[e]), y = sd_h2d(b[e]);
            TEST_ASSERT(fabs(y - x) <= fabs(x) * 0.0631 + 0.01);
        }
        free(got[i]);
    }
    /* storing again is a skip, nothing re-encoded */
    store_all(l2, "stage/model", &pl);
    st = status_of(l2);
    TEST_ASSERT(jint(st, "serde", "encoded") == 24);
    TEST_ASSERT(jint(st, "counters", "store_skipped") == 24);
    json_decref(st);
    free_payloads(&pl);
    close_adapter(l2);
}

/* One tampered file in a batch fails that key only; the neighbours load. */
static void test_tamper_fails_one_key(void)
{
    char dir[128], json[1024];
    snprintf(dir, sizeof(dir), "%s/fs2", tmpdir);
    snprintf(json, sizeof(json),
             "{\"type\":\"fs\",\"base_path\":\"%s\",\"serde\":[{\"type\":\"lz4\"},"
             "{\"type\":\"encrypt\",\"master_key_path\":\"%s\",\"aes_bits\":128}]}",
             dir, keyfile);
    kvt_l2 *l2 = open_adapter(json);
    size_t len = 64 * 1024;
    struct payloads pl = mk_payloads(8, len, 2);
    store_all(l2, "tamper", &pl);
    close_adapter(l2);
    /* rewrite one ciphertext byte and the header's payload checksum, so the
     * engine's own check passes and the GCM tag is what catches it */
    kvt_key k3 = key_n("tamper", 3);
    char name[KVT_NAME_MAX + 1], path[512];
    TEST_ASSERT(kvt_key_encode(KVT_CODEC_FS, &k3, name) > 0);
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    int fd = open(path, O_RDWR);
    TEST_ASSERT(fd >= 0);
    struct stat stt;
    fstat(fd, &stt);
    uint8_t *f = malloc((size_t)stt.st_size);
    TEST_ASSERT(pread(fd, f, (size_t)stt.st_size, 0) == stt.st_size);
    f[512 + 100] ^= 0x01;
    {
        struct kvt_objhdr h;
        const char *why;
        TEST_ASSERT(kvt_objhdr_decode(f, 512, &h, &why) == 0);
        TEST_ASSERT(kvt_objhdr_encode(f, 512, &h.key, &h.meta, NULL, h.flags, h.payload_len,
                                      kvt_payload_hash(f + 512, h.payload_len)) == 0);
    }
    TEST_ASSERT(pwrite(fd, f, (size_t)stt.st_size, 0) == stt.st_size);
    close(fd);
    free(f);
    l2 = open_adapter(json);
    uint8_t *got[8];
    uint64_t okbm[1] = {0};
    TEST_ASSERT(load_all(l2, "tamper", 8, len, got, okbm) == 7);
    TEST_ASSERT(!kvt_bm_test(okbm, 3));
    for (uint32_t i = 0; i < 8; i++) {
        if (i != 3)
            TEST_ASSERT(memcmp(got[i], pl.p[i], len) == 0);
        free(got[i]);
    }
    json_t *st = status_of(l2);
    TEST_ASSERT(jint(st, "serde", "decrypt_failures") == 1);
    TEST_ASSERT(jint(st, "counters", "load_failed") == 1);
    json_decref(st);
    close_adapter(l2);
    free_payloads(&pl);
}

/* Objects written by another chain, or without serde, are misses both
 * ways, and counted. */
static void test_foreign_chain(void)
{
    char dir[128], jz[1024], jl[1024], jraw[512];
    snprintf(dir, sizeof(dir), "%s/fs3", tmpdir);
    snprintf(jz, sizeof(jz), "{\"type\":\"fs\",\"base_path\":\"%s\",\"serde\":{\"type\":\"zstd\"}}",
             dir);
    snprintf(jl, sizeof(jl), "{\"type\":\"fs\",\"base_path\":\"%s\",\"serde\":{\"type\":\"lz4\"}}",
             dir);
    snprintf(jraw, sizeof(jraw), "{\"type\":\"fs\",\"base_path\":\"%s\"}", dir);
    size_t len = 32 * 1024;
    struct payloads pl = mk_payloads(4, len, 3);
    kvt_l2 *l2 = open_adapter(jz);
    store_all(l2, "foreign", &pl);
    close_adapter(l2);
    uint8_t *got[4];
    l2 = open_adapter(jl);
    TEST_ASSERT(load_all(l2, "foreign", 4, len, got, NULL) == 0);
    json_t *st = status_of(l2);
    TEST_ASSERT(jint(st, "serde", "chain_mismatches") == 4);
    json_decref(st);
    for (int i = 0; i < 4; i++)
        free(got[i]);
    close_adapter(l2);
    l2 = open_adapter(jraw);
    TEST_ASSERT(load_all(l2, "foreign", 4, len, got, NULL) == 0);
    st = status_of(l2);
    TEST_ASSERT(jint(st, "counters", "serde_mismatches") == 4);
    json_decref(st);
    for (int i = 0; i < 4; i++)
        free(got[i]);
    close_adapter(l2);
    l2 = open_adapter(jz);
    TEST_ASSERT(load_all(l2, "foreign", 4, len, got, NULL) == 4);
    for (int i = 0; i < 4; i++) {
        TEST_ASSERT(memcmp(got[i], pl.p[i], len) == 0);
        free(got[i]);
    }
    close_adapter(l2);
    free_payloads(&pl);
}

/* mock engine, many tasks in flight, closed without waiting: every task
 * either completes or is freed by close; nothing leaks (ASan build). */
static void test_mock_close_in_flight(void)
{
    kvt_l2 *l2 = open_adapter("{\"type\":\"mock\",\"max_size_gb\":1,\"mock_bandwidth_gb\":2,"
                              "\"serde\":[{\"type\":\"checksum\"},{\"type\":\"lz4\","
                              "\"max_workers\":3}]}");
    size_t len = 128 * 1024;
    struct payloads pl = mk_payloads(16, len, 4);
    store_all(l2, "mock", &pl);
    uint8_t *got[16];
    TEST_ASSERT(load_all(l2, "mock", 16, len, got, NULL) == 16);
    for (int i = 0; i < 16; i++) {
        TEST_ASSERT(memcmp(got[i], pl.p[i], len) == 0);
        free(got[i]);
    }
    /* 20 more stores in flight at close */
    for (int r = 0; r < 20; r++) {
        kvt_l2_task *t = kvt_l2_task_new(KVT_L2_STORE, 4);
        for (uint32_t i = 0; i < 4; i++) {
            t->keys[i] = key_n("mock-close", r * 4 + (int)i);
            t->bufs[i].ptr = pl.p[i];
            t->bufs[i].len = len;
            t->meta[i].len = (uint32_t)len;
        }
        kvt_l2_submit(l2, t);
    }
    close_adapter(l2); /* frees the finished tasks it still holds */
    free_payloads(&pl);
}

int main(void)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/kvt-stage-test-XXXXXX");
    TEST_ASSERT(mkdtemp(tmpdir) != NULL);
    snprintf(keyfile, sizeof(keyfile), "%s/k", tmpdir);
    const char *hex = "a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90\n";
    int fd = open(keyfile, O_WRONLY | O_CREAT | O_EXCL, 0600);
    TEST_ASSERT(fd >= 0 && write(fd, hex, strlen(hex)) == (ssize_t)strlen(hex));
    close(fd);
    RUN(test_fs_chain);
    RUN(test_tamper_fails_one_key);
    RUN(test_foreign_chain);
    RUN(test_mock_close_in_flight);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
    TEST_ASSERT(system(cmd) == 0);
    return TEST_RESULT();
}
