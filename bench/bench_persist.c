/*
 * bench_persist: store and load GB/s (1e9 bytes/s) of 4 MiB objects for each
 * persistent adapter and I/O engine, measured through the kvt_l2 contract
 * (the adapter, not the network), side by side in one run with the
 * physical limit on the same directory: fio with the same block size
 * (4 MiB), O_DIRECT and the same queue depth (posix engine: psync with
 * numjobs = threads; io_uring: iodepth = queue depth); for dax, memcpy into
 * a shared file mapping with as many threads as the adapter's workers.
 * Sides alternate every round; the table shows the medians of each side
 * and the median of the per-round ratios (adapter / peer).
 *
 *   build/bench/bench_persist [--dir D] [--objects N] [--rounds R] [--qd Q]
 *                             [--only LABEL]
 *
 * The adapters store with checksums (xxh3) and headers and verify on load;
 * fio moves raw blocks. A ratio of 1.0 means the adapter adds nothing.
 */
#include "common/log.h"
#include "common/util.h"
#include "l2/adapters.h"
#include "l2/engine.h"
#include "l2/evict.h"
#include "l2/l2.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>
#define BENCH_WITH_FIO
#include "bench_util.h"

#define OBJ (4u << 20)
#define BATCH 16

static const char *dir = "/tmp/kvt-bench";
static uint32_t nobj = 24;
static int rounds = 7;
static int qd = 4;
static const char *only;
static bool no_peer; /* --no-peer: adapter side only (profiling) */

struct cfg {
    const char *label;
    const char *type; /* fs_native, nixl_store_dynamic, nixl_store, raw_block, dax */
    const char *engine;
};

static const struct cfg cfgs[] = {
    {"fs_native", "fs_native", "posix"},
    {"nixl_store_dynamic", "nixl_store_dynamic", "posix"},
    {"nixl_store_dynamic", "nixl_store_dynamic", "io_uring"},
    {"nixl_store", "nixl_store", "posix"},
    {"nixl_store", "nixl_store", "io_uring"},
    {"raw_block", "raw_block", "posix"},
    {"raw_block", "raw_block", "io_uring"},
    {"dax", "dax", "memcpy"},
};

static uint8_t **src, **dst;

static void sh(const char *fmt, const char *a)
{
    char cmd[2200];
    snprintf(cmd, sizeof(cmd), fmt, a, a);
    if (system(cmd) != 0)
        fprintf(stderr, "command failed: %s\n", cmd);
}

static void adapter_json(const struct cfg *c, const char *path, char *js, size_t cap)
{
    uint64_t total = (uint64_t)nobj * OBJ;
    if (!strcmp(c->type, "fs_native"))
        snprintf(js, cap,
                 "{\"type\": \"fs_native\", \"base_path\": \"%s\", \"num_workers\": %d, "
                 "\"use_odirect\": true}",
                 path, qd);
    else if (!strcmp(c->type, "nixl_store_dynamic"))
        snprintf(js, cap,
                 "{\"type\": \"nixl_store_dynamic\", \"backend\": \"POSIX\", \"backend_params\": "
                 "{\"file_path\": \"%s\", \"use_direct_io\": \"true\", \"max_capacity_gb\": 64}, "
                 "\"io_engine\": \"%s\", \"num_workers\": %d, \"iouring_queue_depth\": %d}",
                 path, c->engine, qd, qd);
    else if (!strcmp(c->type, "nixl_store"))
        snprintf(js, cap,
                 "{\"type\": \"nixl_store\", \"backend\": \"POSIX\", \"backend_params\": "
                 "{\"file_path\": \"%s\", \"use_direct_io\": \"true\", \"file_size\": %llu}, "
                 "\"pool_size\": %d, \"io_engine\": \"%s\", \"num_workers\": %d, "
                 "\"iouring_queue_depth\": %d}",
                 path, (unsigned long long)((total / qd + 2 * OBJ) / 4096 * 4096), qd, c->engine,
                 qd, qd);
    else if (!strcmp(c->type, "raw_block"))
        /* a slot takes header_bytes (4096) + slot_bytes of the device */
        snprintf(js, cap,
                 "{\"type\": \"raw_block\", \"device_path\": \"%s/dev.img\", \"slot_bytes\": %u, "
                 "\"capacity_bytes\": %llu, \"meta_total_bytes\": 4194304, \"io_engine\": "
                 "\"%s\", \"iouring_queue_depth\": %d, \"num_store_workers\": %d, "
                 "\"num_load_workers\": %d}",
                 path, OBJ + 4096, (unsigned long long)(4194304 + (uint64_t)nobj * (OBJ + 8192)),
                 c->engine, qd, qd / 2 > 0 ? qd / 2 : 1, qd - qd / 2 > 0 ? qd - qd / 2 : 1);
    else
        snprintf(js, cap,
                 "{\"type\": \"dax\", \"device_path\": \"%s/dax.img\", \"max_dax_size_gb\": %.4f, "
                 "\"slot_bytes\": %u, \"num_store_workers\": 2, \"num_load_workers\": 2}",
                 path, (double)(total + 2 * OBJ) / KVT_GIB, OBJ);
}

static kvt_l2 *open_adapter(const char *js)
{
    struct kvt_l2_spec spec;
    char err[1024];
    if (kvt_l2_spec_parse(js, 0, &spec, err, sizeof(err))) {
        fprintf(stderr, "%s\n", err);
        exit(2);
    }
    kvt_l2 *l2 = NULL;
    if (kvt_l2_open(&spec, &l2, err, sizeof(err))) {
        fprintf(stderr, "%s\n", err);
        exit(2);
    }
    kvt_l2_spec_free(&spec);
    for (;;) {
        pthread_mutex_lock(&l2->lock);
        bool r = l2->recovering;
        pthread_mutex_unlock(&l2->lock);
        if (!r)
            return l2;
        usleep(1000);
    }
}

static void key_of(kvt_key *k, uint32_t i)
{
    uint32_t ns;
    kvt_ns_intern("bench/model", 11, "", 0, &ns, NULL);
    uint8_t h[32] = {0};
    memcpy(h, &i, sizeof(i));
    h[31] = 0x5a;
    kvt_key_make(k, ns, h, 32, 0, 0);
}

/* Submit all tasks of a kind at once, wait for all; returns seconds. */
static double run_all(kvt_l2 *l2, kvt_l2_task **t, uint32_t nt)
{
    uint64_t t0 = kvt_now_ns();
    for (uint32_t k = 0; k < nt; k++)
        kvt_l2_submit(l2, t[k]);
    uint32_t got = 0;
    while (got < nt) {
        struct pollfd p = {.fd = l2->efd[t[0]->kind], .events = POLLIN};
        poll(&p, 1, 60000);
        kvt_l2_task *out[64];
        got += (uint32_t)kvt_l2_pop_done(l2, t[0]->kind, out, 64);
    }
    return (double)(kvt_now_ns() - t0) / 1e9;
}

static void bench_adapter(const struct cfg *c, double *st_gbps, double *ld_gbps)
{
    char path[512], js[2048];
    snprintf(path, sizeof(path), "%s/a", dir);
    sh("rm -rf '%s'; mkdir -p '%s'", path);
    adapter_json(c, path, js, sizeof(js));
    kvt_l2 *l2 = open_adapter(js);
    uint32_t nt = (nobj + BATCH - 1) / BATCH;
    kvt_l2_task **t = calloc(nt, sizeof(*t));
    for (uint32_t k = 0; k < nt; k++) {
        uint32_t n = KVT_MIN(BATCH, nobj - k * BATCH);
        t[k] = kvt_l2_task_new(KVT_L2_STORE, n);
        for (uint32_t i = 0; i < n; i++) {
            uint32_t j = k * BATCH + i;
            key_of(&t[k]->keys[i], j);
            t[k]->bufs[i] = (kvt_buf){src[j], OBJ};
            t[k]->meta[i].len = OBJ;
        }
    }
    double s = run_all(l2, t, nt);
    uint32_t ok = 0;
    for (uint32_t k = 0; k < nt; k++) {
        ok += (uint32_t)kvt_bm_count(t[k]->ok, t[k]->n);
        kvt_l2_task_free(t[k]);
    }
    if (ok != nobj) {
        fprintf(stderr, "%s/%s: only %u of %u stored\n", c->label, c->engine, ok, nobj);
        exit(1);
    }
    *st_gbps = (double)nobj * OBJ / s / 1e9;
    /* lookup-and-lock, then load */
    kvt_l2_task *lk = kvt_l2_task_new(KVT_L2_LOOKUP, nobj);
    for (uint32_t j = 0; j < nobj; j++)
        key_of(&lk->keys[j], j);
    run_all(l2, &lk, 1);
    for (uint32_t k = 0; k < nt; k++) {
        uint32_t n = KVT_MIN(BATCH, nobj - k * BATCH);
        t[k] = kvt_l2_task_new(KVT_L2_LOAD, n);
        for (uint32_t i = 0; i < n; i++) {
            uint32_t j = k * BATCH + i;
            key_of(&t[k]->keys[i], j);
            t[k]->bufs[i] = (kvt_buf){dst[j], OBJ};
        }
    }
    s = run_all(l2, t, nt);
    ok = 0;
    for (uint32_t k = 0; k < nt; k++) {
        ok += (uint32_t)kvt_bm_count(t[k]->ok, t[k]->n);
        kvt_l2_task_free(t[k]);
    }
    for (uint32_t j = 0; j < nobj; j++)
        if (memcmp(src[j], dst[j], OBJ)) {
            fprintf(stderr, "%s/%s: object %u differs after load\n", c->label, c->engine, j);
            exit(1);
        }
    if (ok != nobj) {
        fprintf(stderr, "%s/%s: only %u of %u loaded\n", c->label, c->engine, ok, nobj);
        exit(1);
    }
    *ld_gbps = (double)nobj * OBJ / s / 1e9;
    kvt_l2_unlock(l2, lk->keys, nobj);
    kvt_l2_task_free(lk);
    free(t);
    kvt_l2_close(l2);
    free(l2);
    sh("rm -rf '%s'; mkdir -p '%s'", path);
}

/* fio on the same directory: write then read one file of the same total
 * size, 4 MiB blocks, O_DIRECT, the adapter's queue depth. */
static double fio_one(const char *engine, bool write)
{
    char cmd[1536];
    uint64_t total = (uint64_t)nobj * OBJ;
    if (!strcmp(engine, "io_uring"))
        snprintf(cmd, sizeof(cmd),
                 "fio --name=kvtb --filename=%s/f/fio.dat --rw=%s --bs=4M --direct=1 "
                 "--ioengine=io_uring --iodepth=%d --numjobs=1 --size=%llu --output-format=json "
                 "2>/dev/null",
                 dir, write ? "write" : "read", qd, (unsigned long long)total);
    else
        snprintf(cmd, sizeof(cmd),
                 "fio --name=kvtb --filename=%s/f/fio.dat --rw=%s --bs=4M --direct=1 "
                 "--ioengine=psync --numjobs=%d --size=%llu --offset_increment=%llu "
                 "--group_reporting --output-format=json 2>/dev/null",
                 dir, write ? "write" : "read", qd, (unsigned long long)(total / qd),
                 (unsigned long long)(total / qd));
    return bench_fio_gbps(cmd, write ? "write" : "read");
}

static void bench_fio(const char *engine, double *w, double *r)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/f", dir);
    sh("rm -rf '%s'; mkdir -p '%s'", path);
    *w = fio_one(engine, true);
    *r = fio_one(engine, false);
    sh("rm -rf '%s'; mkdir -p '%s'", path);
}

/* dax's peer: memcpy 4 MiB pieces into/out of a shared file mapping in the
 * same directory, 2 threads like the adapter's 2 workers. */
struct mc_arg {
    uint8_t *map;
    uint32_t from, to;
    bool write;
};

static void *mc_thread(void *a)
{
    struct mc_arg *m = a;
    for (uint32_t j = m->from; j < m->to; j++) {
        if (m->write)
            memcpy(m->map + (uint64_t)j * OBJ, src[j], OBJ);
        else
            memcpy(dst[j], m->map + (uint64_t)j * OBJ, OBJ);
    }
    return NULL;
}

static void bench_memcpy(double *w, double *r)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/m", dir);
    sh("rm -rf '%s'; mkdir -p '%s'", path);
    strncat(path, "/map.img", sizeof(path) - strlen(path) - 1);
    uint64_t total = (uint64_t)nobj * OBJ;
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || posix_fallocate(fd, 0, (off_t)total)) {
        perror(path);
        exit(1);
    }
    uint8_t *map = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    for (int pass = 0; pass < 2; pass++) {
        pthread_t th[2];
        struct mc_arg a[2] = {{map, 0, nobj / 2, pass == 0}, {map, nobj / 2, nobj, pass == 0}};
        uint64_t t0 = kvt_now_ns();
        for (int k = 0; k < 2; k++)
            pthread_create(&th[k], NULL, mc_thread, &a[k]);
        for (int k = 0; k < 2; k++)
            pthread_join(th[k], NULL);
        double gbps = (double)total / ((double)(kvt_now_ns() - t0) / 1e9) / 1e9;
        *(pass == 0 ? w : r) = gbps;
    }
    munmap(map, total);
    close(fd);
    unlink(path);
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--dir") && i + 1 < argc)
            dir = argv[++i];
        else if (!strcmp(argv[i], "--objects") && i + 1 < argc)
            nobj = (uint32_t)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--qd") && i + 1 < argc)
            qd = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--only") && i + 1 < argc)
            only = argv[++i];
        else if (!strcmp(argv[i], "--no-peer"))
            no_peer = true;
        else {
            fprintf(stderr, "usage: bench_persist [--dir D] [--objects N] [--rounds R] [--qd Q] "
                            "[--only LABEL] [--no-peer]\n");
            return 2;
        }
    }
    if (nobj < 2 || rounds < 1 || rounds > 50 || qd < 1 || qd > 256)
        return 2;
    kvt_log_set_level(KVT_LOG_WARN);
    sh("mkdir -p '%s'; true '%s'", dir);
    src = calloc(nobj, sizeof(*src));
    dst = calloc(nobj, sizeof(*dst));
    uint64_t x = 88172645463325252ull;
    for (uint32_t j = 0; j < nobj; j++) {
        if (posix_memalign((void **)&src[j], 4096, OBJ) ||
            posix_memalign((void **)&dst[j], 4096, OBJ))
            return 1;
        uint64_t *p = (uint64_t *)src[j];
        for (size_t k = 0; k < OBJ / 8; k++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            p[k] = x;
        }
        memset(dst[j], 0, OBJ);
    }
    printf("bench_persist: %u objects of 4 MiB (%.0f MiB) per run, %d rounds, queue depth %d, "
           "dir %s\n",
           nobj, nobj * 4.0, rounds, qd, dir);
    printf("%-20s %-9s %12s %7s %-18s %12s %7s %-18s %s\n", "adapter", "engine", "store", "peer",
           "ratio (min-max)", "load", "peer", "ratio (min-max)", "peer");
    for (size_t c = 0; c < KVT_ARRAY_LEN(cfgs); c++) {
        const struct cfg *cf = &cfgs[c];
        if (only && strcmp(only, cf->label))
            continue;
        double as[50], al[50], ps[50], pl[50];
        for (int r = 0; r < rounds; r++) {
            /* alternate which side goes first */
            for (int side = 0; side < 2; side++) {
                bool adapter = (side == 0) == (r % 2 == 0);
                if (adapter)
                    bench_adapter(cf, &as[r], &al[r]);
                else if (no_peer)
                    ps[r] = pl[r] = 1;
                else if (!strcmp(cf->engine, "memcpy"))
                    bench_memcpy(&ps[r], &pl[r]);
                else
                    bench_fio(cf->engine, &ps[r], &pl[r]);
            }
        }
        /* the ratio is the median of per-round ratios: each round pairs
         * the two sides back to back, which cancels slow drifts of a
         * shared machine better than a ratio of medians */
        double rs[50], rl[50];
        for (int r = 0; r < rounds; r++) {
            rs[r] = as[r] / ps[r];
            rl[r] = al[r] / pl[r];
        }
        double ms = bench_median(as, rounds), ml = bench_median(al, rounds),
               mps = bench_median(ps, rounds), mpl = bench_median(pl, rounds);
        double mrs = bench_median(rs, rounds), mrl = bench_median(rl, rounds);
        /* bench_median sorted each row: the ratios' min and max follow the medians */
        printf(
            "%-20s %-9s %7.3f GB/s %7.3f %6.2f (%.2f-%.2f)   %7.3f GB/s %7.3f %6.2f (%.2f-%.2f)   "
            "%s\n",
            cf->label, cf->engine, ms, mps, mrs, rs[0], rs[rounds - 1], ml, mpl, mrl, rl[0],
            rl[rounds - 1], !strcmp(cf->engine, "memcpy") ? "memcpy (mmap)" : "fio O_DIRECT");
        fflush(stdout);
    }
    for (uint32_t j = 0; j < nobj; j++) {
        free(src[j]);
        free(dst[j]);
    }
    free(src);
    free(dst);
    return 0;
}
