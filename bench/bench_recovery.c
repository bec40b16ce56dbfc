/*
 * Start-up recovery and memory per indexed object.
 *
 *   bench_recovery DIR [--objects N] [--rounds R] [--type fs|nixl_store_dynamic] [--cold]
 *
 * Builds (once, kept for later runs) a tree of N valid objects under
 * DIR/recovery-<type>-<N>, then alternates, R rounds:
 *   find TREE -type f -printf '%s\n' > /dev/null      (the physical floor:
 *                                                       list + stat every file)
 *   kvtier: open the adapter on TREE and wait until its start-up scan has
 *   restored accounting (bytes, per-namespace bytes, LRU order)
 * and prints the medians and the ratio find / kvtier (>= 1: kvtier is as
 * fast as listing the files). --cold drops the kernel's caches (dentries,
 * inodes, pages: /proc/sys/vm/drop_caches, as root) before each row, as a
 * restart after a reboot sees the tree. It also prints the heap bytes the adapter holds
 * per indexed object after recovery (mallinfo2 in-use delta; goal <= 64).
 */
#include "common/log.h"
#include "common/util.h"
#include "key/key.h"
#include "l2/adapters.h"
#include "l2/l2.h"
#include "l2/kit/objfmt.h"

#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "bench_util.h"

static void die(const char *m)
{
    fprintf(stderr, "bench_recovery: %s\n", m);
    exit(1);
}

static double now_s(void)
{
    return (double)kvt_now_ns() / 1e9;
}

static void build_tree(const char *tree, const char *type, uint64_t n)
{
    char marker[1200];
    snprintf(marker, sizeof(marker), "%s.complete", tree);
    if (access(marker, F_OK) == 0)
        return;
    char cmd[2600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s' && mkdir -p '%s'", tree, tree);
    if (system(cmd))
        die("cannot create the tree directory");
    bool nixl = strcmp(type, "fs") != 0;
    fprintf(stderr, "building %llu objects under %s (kept for later runs) ...\n",
            (unsigned long long)n, tree);
    uint32_t ns[8];
    for (int m = 0; m < 8; m++) {
        char model[32];
        snprintf(model, sizeof(model), "org/model-%d", m);
        kvt_ns_intern(model, strlen(model), "", 0, &ns[m], NULL);
    }
    uint8_t buf[KVT_OBJHDR_MIN + 64];
    memset(buf + KVT_OBJHDR_MIN, 0x5a, 64);
    double t0 = now_s();
    for (uint64_t i = 0; i < n; i++) {
        uint8_t h[32] = {0};
        memcpy(h, &i, sizeof(i));
        kvt_key k;
        kvt_key_make(&k, ns[i % 8], h, 32, 0, 0);
        char name[KVT_NAME_MAX + 1], path[1400];
        kvt_key_encode(nixl ? KVT_CODEC_NIXL : KVT_CODEC_FS, &k, name);
        kvt_objmeta m = {.len = 64};
        kvt_objhdr_encode(buf, KVT_OBJHDR_MIN, &k, &m, NULL, 0, 64,
                          kvt_payload_hash(buf + KVT_OBJHDR_MIN, 64));
        snprintf(path, sizeof(path), "%s/%s", tree, name);
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0 || kvt_pwrite_all(fd, buf, sizeof(buf), 0))
            die("cannot write an object file (disk full?)");
        close(fd);
        if ((i + 1) % 100000 == 0)
            fprintf(stderr, "  %llu/%llu (%.0f s)\n", (unsigned long long)(i + 1),
                    (unsigned long long)n, now_s() - t0);
    }
    int fd = open(marker, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0)
        close(fd);
}

static double time_find(const char *tree)
{
    char cmd[1400];
    snprintf(cmd, sizeof(cmd), "find '%s' -type f -printf '%%s\\n' > /dev/null", tree);
    double t0 = now_s();
    if (system(cmd))
        die("find failed");
    return now_s() - t0;
}

static double time_kvtier(const char *tree, const char *type, uint64_t n, double *bytes_per_obj)
{
    char json[1600], err[512];
    if (!strcmp(type, "fs"))
        snprintf(
            json, sizeof(json),
            "{\"type\":\"fs\",\"base_path\":\"%s\",\"eviction\":{\"eviction_policy\":\"LRU\"}}",
            tree);
    else
        snprintf(json, sizeof(json),
                 "{\"type\":\"nixl_store_dynamic\",\"backend\":\"POSIX\",\"backend_params\":"
                 "{\"file_path\":\"%s\",\"use_direct_io\":\"false\",\"max_capacity_gb\":\"1000\"},"
                 "\"eviction\":{\"eviction_policy\":\"LRU\"}}",
                 tree);
    struct kvt_l2_spec spec;
    if (kvt_l2_spec_parse(json, 0, &spec, err, sizeof(err)))
        die(err);
    malloc_trim(0);
    struct mallinfo2 mb = mallinfo2();
    size_t before = mb.uordblks + mb.hblkhd; /* heap in use + mmapped chunks */
    double t0 = now_s();
    kvt_l2 *l2;
    if (kvt_l2_open(&spec, &l2, err, sizeof(err)))
        die(err);
    for (;;) {
        pthread_mutex_lock(&l2->lock);
        bool r = l2->recovering;
        pthread_mutex_unlock(&l2->lock);
        if (!r)
            break;
        usleep(200);
    }
    double dt = now_s() - t0;
    struct kvt_l2_usage u;
    kvt_l2_usage(l2, &u);
    if (u.objects != n)
        die("the scan did not find every object");
    struct mallinfo2 ma = mallinfo2();
    size_t after = ma.uordblks + ma.hblkhd;
    *bytes_per_obj = (double)(after - before) / (double)n;
    kvt_l2_close(l2);
    free(l2);
    kvt_l2_spec_free(&spec);
    return dt;
}

/* sync, then drop the page cache, dentries and inodes (root only) */
static void drop_caches(void)
{
    sync();
    FILE *f = fopen("/proc/sys/vm/drop_caches", "w");
    if (!f || fputs("3\n", f) < 0 || fclose(f) != 0)
        die("--cold: cannot write /proc/sys/vm/drop_caches (run as root)");
}

int main(int argc, char **argv)
{
    const char *dir = NULL, *type = "fs";
    uint64_t n = 100000;
    int rounds = 3;
    bool cold = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--objects") && i + 1 < argc)
            n = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--type") && i + 1 < argc)
            type = argv[++i];
        else if (!strcmp(argv[i], "--cold"))
            cold = true;
        else if (argv[i][0] != '-')
            dir = argv[i];
        else
            die("usage: bench_recovery DIR [--objects N] [--rounds R] [--type "
                "fs|nixl_store_dynamic] [--cold]");
    }
    if (!dir || rounds < 1 || rounds > 32)
        die("a directory is required (and 1..32 rounds)");
    kvt_log_set_level(KVT_LOG_WARN);
    char tree[1024];
    snprintf(tree, sizeof(tree), "%s/recovery-%s-%llu", dir, type, (unsigned long long)n);
    build_tree(tree, type, n);
    double f[32], k[32], bpo = 0;
    for (int r = 0; r < rounds; r++) {
        if (cold)
            drop_caches();
        f[r] = time_find(tree);
        if (cold)
            drop_caches();
        k[r] = time_kvtier(tree, type, n, &bpo);
        fprintf(stderr, "round %d: find %.3f s, kvtier %.3f s\n", r + 1, f[r], k[r]);
    }
    double mf = bench_median(f, rounds), mk = bench_median(k, rounds);
    printf("recovery of %llu %s objects, %d rounds (medians%s)\n", (unsigned long long)n, type,
           rounds, cold ? ", caches dropped before each row" : "");
    printf("  find -printf %%s   %7.3f s   (min-max %.3f-%.3f)\n", mf, f[0], f[rounds - 1]);
    printf("  kvtier scan       %7.3f s   (min-max %.3f-%.3f)   ratio find/kvtier %.2f   (%.0f "
           "objects/s)\n",
           mk, k[0], k[rounds - 1], mf / mk, (double)n / mk);
    printf("  memory per indexed object: %.1f bytes (goal <= 64)\n", bpo);
    printf("RESULT recovery_ratio %.3f\nRESULT bytes_per_object %.1f\n", mf / mk, bpo);
    return 0;
}
