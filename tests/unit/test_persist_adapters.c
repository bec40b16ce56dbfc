/*
 * Description: nixl_store (page pool: dry batch ends the batch, slots freed
 * on delete, fragmentation scatters but round-trips; the pool is removed at
 * close, a pool larger than the free space is refused at open before any
 * file is allocated, leaving nothing), nixl_store_dynamic
 * with both engines, dax (restart from slot headers, death right after an
 * acknowledged store, persist_enabled false wipes), fs_native's O_DIRECT
 * rule for misaligned buffers (an error, counted) against fs (buffered),
 * and mock's shared bandwidth (two concurrent tasks take the time of their
 * combined bytes).
 */
#include "persist_harness.h"
#include "test.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char dir[256];

static void rm_rf(const char *p)
{
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", p);
    if (system(cmd) != 0)
        fprintf(stderr, "cleanup of %s failed\n", p);
}

/* ---------------------------------------------------------- nixl_store */

static void nixl_store_pool(const char *engine)
{
    fprintf(stderr, "   engine %s\n", engine);
    char js[1024], path[300];
    snprintf(path, sizeof(path), "%s/pool", dir);
    rm_rf(path);
    /* 2 files x 1 MiB, 4 KiB pages: 512 pages; an object of 100 KiB takes 26 */
    snprintf(js, sizeof(js),
             "{\"type\": \"nixl_store\", \"backend\": \"POSIX\", \"backend_params\": "
             "{\"file_path\": \"%s\", \"use_direct_io\": \"true\", \"file_size\": 1048576}, "
             "\"pool_size\": 2, \"io_engine\": \"%s\"}",
             path, engine);
    kvt_l2 *l2 = h_open(js);
    TEST_ASSERT(l2);
    /* O_DIRECT through struct kvt_odirect: its status, with the block size */
    long long blksz = h_status_int(l2, "block_size", NULL);
    TEST_ASSERT(blksz >= 512 && blksz <= 4096 && (blksz & (blksz - 1)) == 0);
    const size_t len = 100 * 1024;
    TEST_ASSERT(h_store(l2, "ns/m", 0, 16, len) == 16); /* 416 pages */
    TEST_ASSERT(h_check(l2, "ns/m", 0, 16, len) == 16);
    /* 96 pages left: of a batch of 6, 3 fit and the batch ends there */
    TEST_ASSERT(h_store(l2, "ns/m", 100, 6, len) == 3);
    TEST_ASSERT(h_status_int(l2, "dry_batches", NULL) == 1);
    TEST_ASSERT(h_status_int(l2, "pool_free_pages", NULL) == 512 - 19 * 26);
    /* delete every other object; a larger object must gather pieces */
    for (uint32_t i = 0; i < 16; i += 2)
        TEST_ASSERT(h_delete(l2, "ns/m", i, 1) == 1);
    TEST_ASSERT(h_status_int(l2, "pool_free_pages", NULL) == 512 - 11 * 26);
    TEST_ASSERT(h_store(l2, "ns/big", 0, 1, 400 * 1024) == 1); /* 101 pages */
    TEST_ASSERT(h_status_int(l2, "scattered_objects", NULL) >= 1);
    TEST_ASSERT(h_check(l2, "ns/big", 0, 1, 400 * 1024) == 1);
    TEST_ASSERT(h_check(l2, "ns/m", 1, 1, len) == 1);
    /* unaligned length: buffered for that object, still exact */
    TEST_ASSERT(h_store(l2, "ns/odd", 0, 1, 5000) == 1);
    TEST_ASSERT(h_check(l2, "ns/odd", 0, 1, 5000) == 1);
    struct kvt_l2_usage u;
    kvt_l2_usage(l2, &u);
    TEST_ASSERT(u.cap_bytes == 2 << 20 &&
                u.used_bytes == (uint64_t)(512 - h_status_int(l2, "pool_free_pages", NULL)) * 4096);
    h_close(l2);
}

static void test_nixl_store(void)
{
    nixl_store_pool("posix");
    nixl_store_pool("io_uring");
}

/* The pool holds nothing a restart could use: close removes it (and the
 * directory open created); a pool the file system cannot hold is refused
 * by open itself (not only by the config check) before it allocates. */
static void test_nixl_store_leaves_nothing(void)
{
    char js[1024], path[300], f0[400];
    snprintf(path, sizeof(path), "%s/pool2", dir);
    snprintf(f0, sizeof(f0), "%s/nixl_pool_0.bin", path);
    rm_rf(path);
    snprintf(js, sizeof(js),
             "{\"type\": \"nixl_store\", \"backend\": \"POSIX\", \"backend_params\": "
             "{\"file_path\": \"%s\", \"file_size\": 1048576}, \"pool_size\": 3}",
             path);
    kvt_l2 *l2 = h_open(js);
    TEST_ASSERT(l2);
    TEST_ASSERT(access(f0, F_OK) == 0);
    TEST_ASSERT(h_store(l2, "ns/gone", 0, 2, 1000) == 2);
    h_close(l2);
    TEST_ASSERT(access(f0, F_OK) < 0 && access(path, F_OK) < 0);
    /* 64 files of 1 TiB: more than any test file system has free */
    snprintf(js, sizeof(js),
             "{\"type\": \"nixl_store\", \"backend\": \"POSIX\", \"backend_params\": "
             "{\"file_path\": \"%s\", \"file_size\": 1099511627776, \"page_size\": "
             "32768}, \"pool_size\": 64}",
             path);
    char err[1024];
    TEST_ASSERT(h_open_err(js, err, sizeof(err)) == -ENOSPC);
    fprintf(stderr, "   %s\n", err);
    TEST_ASSERT(strstr(err, "the pool needs 65536.00 GiB") && strstr(err, "GiB are free"));
    TEST_ASSERT(access(path, F_OK) < 0); /* nothing left: not even the directory */
}

/* -------------------------------------------------- nixl_store_dynamic */

static void test_nixl_dynamic_engines(void)
{
    const char *engines[] = {"posix", "io_uring"};
    for (int k = 0; k < 2; k++) {
        char js[1024], path[300];
        snprintf(path, sizeof(path), "%s/nd%d", dir, k);
        rm_rf(path);
        snprintf(js, sizeof(js),
                 "{\"type\": \"nixl_store_dynamic\", \"backend\": \"HF3FS\", \"backend_params\": "
                 "{\"file_path\": \"%s\", \"use_direct_io\": \"true\", \"max_capacity_gb\": "
                 "\"0.01\", \"shard_dirs\": \"true\"}, \"io_engine\": \"%s\"}",
                 path, engines[k]);
        kvt_l2 *l2 = h_open(js);
        TEST_ASSERT(l2);
        h_wait_recovered(l2);
        TEST_ASSERT(h_store(l2, "nd/m", 0, 12, 256 * 1024) == 12);
        TEST_ASSERT(h_store(l2, "nd/m", 100, 3, 777) == 3); /* buffered: unaligned length */
        TEST_ASSERT(h_check(l2, "nd/m", 0, 12, 256 * 1024) == 12);
        TEST_ASSERT(h_check(l2, "nd/m", 100, 3, 777) == 3);
        /* 0.01 GiB = 10.24 MiB: 40 objects of 256 KiB + 4 KiB header fit, not 60 */
        uint32_t more = h_store(l2, "nd/m", 200, 48, 256 * 1024);
        TEST_ASSERT(more < 48 && more > 20);
        struct kvt_l2_usage u;
        kvt_l2_usage(l2, &u);
        TEST_ASSERT(u.used_bytes <= u.cap_bytes);
        h_close(l2);
        l2 = h_open(js); /* restart: the scan restores usage before any lookup */
        TEST_ASSERT(l2);
        h_wait_recovered(l2);
        struct kvt_l2_usage u2;
        kvt_l2_usage(l2, &u2);
        TEST_ASSERT(u2.used_bytes == u.used_bytes && u2.objects == u.objects);
        TEST_ASSERT(h_store(l2, "nd/m", 300, 8, 256 * 1024) == 0); /* still full */
        TEST_ASSERT(h_check(l2, "nd/m", 0, 12, 256 * 1024) == 12);
        h_close(l2);
    }
}

/* ----------------------------------------------------------------- dax */

/* Load key i of model into a destination of cap bytes; returns the task's
 * error (0: loaded) and leaves nothing pinned. */
static int load_into(kvt_l2 *l2, const char *model, uint32_t i, size_t cap)
{
    kvt_l2_task *lk = kvt_l2_task_new(KVT_L2_LOOKUP, 1);
    h_key(&lk->keys[0], model, i);
    h_run(l2, lk);
    kvt_l2_task *t = kvt_l2_task_new(KVT_L2_LOAD, 1);
    t->keys[0] = lk->keys[0];
    t->bufs[0].ptr = h_payload(cap, UINT32_MAX);
    t->bufs[0].len = cap;
    h_run(l2, t);
    int err = kvt_bm_test(t->ok, 0) ? 0 : atomic_load(&t->err);
    free(t->bufs[0].ptr);
    if (kvt_bm_test(lk->ok, 0))
        kvt_l2_unlock(l2, lk->keys, 1);
    kvt_l2_task_free(lk);
    kvt_l2_task_free(t);
    return err;
}

static void test_dax(void)
{
    char js[1024], path[300];
    snprintf(path, sizeof(path), "%s/dax.img", dir);
    unlink(path);
    snprintf(js, sizeof(js),
             "{\"type\": \"dax\", \"device_path\": \"%s\", \"max_dax_size_gb\": 0.01, "
             "\"slot_bytes\": 131072, \"num_load_workers\": 2}",
             path);
    kvt_l2 *l2 = h_open(js);
    TEST_ASSERT(l2);
    h_wait_recovered(l2);
    long long slots = h_status_int(l2, "slots", NULL);
    TEST_ASSERT(slots == 81); /* (0.01 GiB - page-rounded header table) / 128 KiB */
    TEST_ASSERT(h_store(l2, "dax/m", 0, 20, 131072) == 20); /* a payload of exactly slot_bytes */
    TEST_ASSERT(h_store(l2, "dax/m", 50, 1, 131073) == 0);  /* one byte too many */
    TEST_ASSERT(h_check(l2, "dax/m", 0, 20, 131072) == 20);
    /* a destination one byte short: KVT_E_TOOBIG, not corrupt, still served */
    long long corrupt = h_status_int(l2, "counters", "corrupt");
    TEST_ASSERT(load_into(l2, "dax/m", 3, 131071) == KVT_E_TOOBIG);
    TEST_ASSERT(h_status_int(l2, "counters", "corrupt") == corrupt);
    TEST_ASSERT(h_check(l2, "dax/m", 3, 1, 131072) == 1);
    TEST_ASSERT(h_status_int(l2, "msyncs", NULL) == 0); /* not durable */
    TEST_ASSERT(h_delete(l2, "dax/m", 0, 2) == 2);
    h_close(l2);
    /* a process dies right after its stores were acknowledged */
    int pfd[2]; /* the child reports through a pipe (see test_raw_block_adapter.c) */
    TEST_ASSERT(pipe(pfd) == 0);
    pid_t pid = fork();
    TEST_ASSERT(pid >= 0);
    if (pid == 0) {
        close(pfd[0]);
        kvt_l2 *c = h_open(js);
        char r = 'n';
        if (c) {
            h_wait_recovered(c);
            r = h_store(c, "dax/crash", 0, 10, 70000) == 10 ? 'y' : 'n';
        }
        if (write(pfd[1], &r, 1) != 1)
            _exit(4);
        _exit(0);
    }
    close(pfd[1]);
    char r = 0;
    TEST_ASSERT(read(pfd[0], &r, 1) == 1 && r == 'y');
    close(pfd[0]);
    waitpid(pid, NULL, 0);
    l2 = h_open(js);
    TEST_ASSERT(l2);
    h_wait_recovered(l2);
    struct kvt_l2_usage u;
    kvt_l2_usage(l2, &u);
    TEST_ASSERT(u.objects == 28 && u.used_bytes == 28ull * 131072);
    TEST_ASSERT(h_check(l2, "dax/m", 2, 18, 131072) == 18);
    TEST_ASSERT(h_check(l2, "dax/m", 0, 2, 131072) == 0);
    TEST_ASSERT(h_check(l2, "dax/crash", 0, 10, 70000) == 10);
    /* fill it: the cap counts slots */
    uint32_t more = h_store(l2, "dax/fill", 0, (uint32_t)slots, 1000);
    TEST_ASSERT(more == (uint32_t)slots - 28);
    h_close(l2);
    /* persist_enabled false: the headers are wiped at close */
    char js2[1100];
    snprintf(js2, sizeof(js2), "%.*s, \"persist_enabled\": \"false\"}", (int)strlen(js) - 1, js);
    l2 = h_open(js2);
    TEST_ASSERT(l2);
    h_wait_recovered(l2);
    kvt_l2_usage(l2, &u);
    TEST_ASSERT(u.objects == (uint64_t)slots);
    h_close(l2);
    l2 = h_open(js);
    h_wait_recovered(l2);
    kvt_l2_usage(l2, &u);
    TEST_ASSERT(u.objects == 0);
    h_close(l2);
}

/* ------------------------------------------------------------ fs_native */

static void misaligned_store(const char *type, bool expect_ok)
{
    char js[600], path[300];
    snprintf(path, sizeof(path), "%s/%s", dir, type);
    rm_rf(path);
    snprintf(js, sizeof(js),
             "{\"type\": \"%s\", \"base_path\": \"%s\", \"use_odirect\": true, "
             "\"num_workers\": 3}",
             type, path);
    kvt_l2 *l2 = h_open(js);
    TEST_ASSERT(l2);
    h_wait_recovered(l2);
    TEST_ASSERT(h_status_int(l2, "num_workers", NULL) == 3); /* the real queue depth */
    json_t *st = kvt_l2_status(l2);
    bool refused = strcmp(json_string_value(json_object_get(st, "odirect")), "on") != 0;
    json_decref(st);
    kvt_l2_task *t = kvt_l2_task_new(KVT_L2_STORE, 1);
    h_key(&t->keys[0], "fsn/m", 1);
    uint8_t *raw = h_payload(65536 + 512, 4);
    t->bufs[0].ptr = raw + 512; /* 512-aligned, not 4096-aligned; a block multiple */
    t->bufs[0].len = 65536;
    h_run(l2, t);
    if (refused) {
        fprintf(stderr, "   O_DIRECT unavailable here: only the fallback is checked\n");
        TEST_ASSERT(kvt_bm_test(t->ok, 0));
    } else if (expect_ok) {
        TEST_ASSERT(kvt_bm_test(t->ok, 0));
        TEST_ASSERT(h_status_int(l2, "counters", "odirect_fallbacks") >= 1);
    } else {
        TEST_ASSERT(!kvt_bm_test(t->ok, 0) && atomic_load(&t->err) == -EINVAL);
        TEST_ASSERT(h_status_int(l2, "odirect_misaligned", NULL) == 1);
        /* a length that is not a block multiple is buffered, not refused */
        t->bufs[0].len = 65000;
        h_run(l2, t);
        TEST_ASSERT(kvt_bm_test(t->ok, 0));
        TEST_ASSERT(h_status_int(l2, "counters", "odirect_fallbacks") >= 1);
    }
    free(raw);
    kvt_l2_task_free(t);
    h_close(l2);
}

static void test_fs_native_alignment(void)
{
    misaligned_store("fs_native", false);
    misaligned_store("fs", true);
}

/* ----------------------------------------------------------------- mock */

static void test_mock_shared_bandwidth(void)
{
    /* 0.02 GB/s = 21.5 MB/s: two tasks of 2 MiB each take ~0.2 s together,
     * ~0.1 s if each had its own bucket */
    kvt_l2 *l2 = h_open("{\"type\": \"mock\", \"max_size_gb\": 1, \"mock_bandwidth_gb\": 0.02}");
    TEST_ASSERT(l2);
    kvt_l2_task *t[2];
    for (int k = 0; k < 2; k++) {
        t[k] = kvt_l2_task_new(KVT_L2_STORE, 1);
        h_key(&t[k]->keys[0], "mock/m", (uint32_t)k);
        t[k]->bufs[0].ptr = h_payload(2 << 20, (uint32_t)k);
        t[k]->bufs[0].len = 2 << 20;
    }
    uint64_t t0 = kvt_now_ns();
    kvt_l2_submit(l2, t[0]);
    kvt_l2_submit(l2, t[1]);
    int got = 0;
    while (got < 2) {
        struct pollfd p = {.fd = l2->efd[KVT_L2_STORE], .events = POLLIN};
        TEST_ASSERT(poll(&p, 1, 10000) == 1);
        kvt_l2_task *out[2];
        got += (int)kvt_l2_pop_done(l2, KVT_L2_STORE, out, 2);
    }
    double secs = (double)(kvt_now_ns() - t0) / 1e9;
    double one = (double)(2 << 20) / (0.02 * KVT_GIB);
    fprintf(stderr, "   two concurrent tasks: %.3f s (one task alone: %.3f s)\n", secs, one);
    TEST_ASSERT(secs >= 1.9 * one);
    TEST_ASSERT(kvt_bm_test(t[0]->ok, 0) && kvt_bm_test(t[1]->ok, 0));
    for (int k = 0; k < 2; k++) {
        free(t[k]->bufs[0].ptr);
        kvt_l2_task_free(t[k]);
    }
    h_close(l2);
}

int main(void)
{
    snprintf(dir, sizeof(dir), "/tmp/kvt-test-persist-%d", (int)getpid());
    mkdir(dir, 0755);
    RUN(test_nixl_store);
    RUN(test_nixl_store_leaves_nothing);
    RUN(test_nixl_dynamic_engines);
    RUN(test_dax);
    RUN(test_fs_native_alignment);
    RUN(test_mock_shared_bandwidth);
    rm_rf(dir);
    return TEST_RESULT();
}
