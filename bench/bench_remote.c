/*
 * bench_remote: store and load throughput of one L2 adapter, driven
 * directly through the adapter contract (kvt_l2_submit + eventfd), without
 * the server or L1 in the way. Used by bench/remote.sh, which runs it side
 * by side with redis-benchmark (resp) or curl (s3) on the same server.
 *
 *   bench_remote '<--l2-adapter JSON>' [--size B] [--count N] [--batch K]
 *                [--inflight D] [--op store|load|both] [--seed S] [--delete]
 *
 * Prints one line per phase: "store <MB/s> <ops/s>" / "load <MB/s> <ops/s>";
 * --delete adds a last phase, "delete <ops/s>": one kvt_l2_delete of every
 * key (as eviction and purge call it).
 * A batch of K keys is one task, D tasks are kept in flight; the adapter
 * decides how it spreads a batch over its connections. Loads verify every
 * byte against what was stored.
 */
#include "common/log.h"
#include "common/util.h"
#include "l2/adapters.h"
#include "l2/engine.h"
#include "l2/evict.h"
#include "l2/l2.h"

#include <getopt.h>
#include <sys/resource.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* CPU seconds (user + system) used by this process so far. */
static double cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

static void wait_task(kvt_l2 *l2, enum kvt_l2_kind kind, kvt_l2_task **out)
{
    for (;;) {
        struct pollfd p = {l2->efd[kind], POLLIN, 0};
        poll(&p, 1, 1000);
        if (kvt_l2_pop_done(l2, kind, out, 1) == 1)
            return;
    }
}

int main(int argc, char **argv)
{
    uint64_t size = 4 << 20;
    uint32_t count = 64, batch = 8, seed = 1, inflight = 1;
    bool del = false;
    const char *op = "both";
    static const struct option opts[] = {
        {"size", 1, 0, 's'}, {"count", 1, 0, 'n'},    {"batch", 1, 0, 'b'},  {"op", 1, 0, 'o'},
        {"seed", 1, 0, 'r'}, {"inflight", 1, 0, 'i'}, {"delete", 0, 0, 'd'}, {0, 0, 0, 0}};
    int ch;
    while ((ch = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (ch == 's')
            size = strtoull(optarg, NULL, 0);
        else if (ch == 'n')
            count = (uint32_t)strtoul(optarg, NULL, 0);
        else if (ch == 'b')
            batch = (uint32_t)strtoul(optarg, NULL, 0);
        else if (ch == 'o')
            op = optarg;
        else if (ch == 'r')
            seed = (uint32_t)strtoul(optarg, NULL, 0);
        else if (ch == 'i')
            inflight = (uint32_t)strtoul(optarg, NULL, 0);
        else if (ch == 'd')
            del = true;
        else
            return 2;
    }
    if (optind >= argc || batch == 0 || count == 0 || inflight == 0) {
        fprintf(stderr, "usage: bench_remote '<adapter json>' [--size B] [--count N] "
                        "[--batch K] [--inflight D] [--op store|load|both] [--seed S] "
                        "[--delete]\n");
        return 2;
    }
    kvt_log_set_level(KVT_LOG_WARN);
    struct kvt_l2_spec spec;
    char err[1024];
    if (kvt_l2_spec_parse(argv[optind], 0, &spec, err, sizeof(err))) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    kvt_l2 *l2;
    if (kvt_l2_open(&spec, &l2, err, sizeof(err))) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    /* wait for the start-up scan so stores are not parked behind it */
    for (int i = 0; i < 3000; i++) {
        pthread_mutex_lock(&l2->lock);
        bool rec = l2->recovering;
        pthread_mutex_unlock(&l2->lock);
        if (!rec)
            break;
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    uint32_t ns;
    char model[64];
    snprintf(model, sizeof(model), "bench-%u", seed);
    kvt_ns_intern(model, strlen(model), "", 0, &ns, NULL);
    kvt_key *keys = kvt_xcalloc(count, sizeof(kvt_key));
    uint8_t **bufs = kvt_xcalloc(count, sizeof(uint8_t *));
    uint8_t *dst = NULL;
    for (uint32_t i = 0; i < count; i++) {
        uint8_t h[32] = {0};
        memcpy(h, &i, sizeof(i));
        memcpy(h + 4, &seed, sizeof(seed));
        kvt_key_make(&keys[i], ns, h, 32, 0, 0);
        if (posix_memalign((void **)&bufs[i], 4096, size))
            return 1;
        for (uint64_t k = 0; k < size; k += 8) {
            uint64_t v = (k * 0x9e3779b97f4a7c15ull) ^ i ^ ((uint64_t)seed << 40);
            memcpy(bufs[i] + k, &v, KVT_MIN(8, size - k));
        }
    }
    /* every key gets its own destination, so the bytes are compared after
     * the clock stopped (the adapter verifies its checksum inside it) */
    if (posix_memalign((void **)&dst, 4096, size * count))
        return 1;
    memset(dst, 0, size * count);
    int rc = 0;
    if (strcmp(op, "load") != 0) {
        uint64_t t0 = kvt_now_ns(), ok = 0;
        double c0 = cpu_s();
        uint32_t next = 0, out = 0;
        while (next < count || out) {
            while (next < count && out < inflight) {
                uint32_t n = KVT_MIN(batch, count - next);
                kvt_l2_task *t = kvt_l2_task_new(KVT_L2_STORE, n);
                for (uint32_t j = 0; j < n; j++) {
                    t->keys[j] = keys[next + j];
                    t->bufs[j] = (kvt_buf){bufs[next + j], size};
                    t->meta[j].len = (uint32_t)size;
                }
                next += n;
                out++;
                kvt_l2_submit(l2, t);
            }
            kvt_l2_task *d;
            wait_task(l2, KVT_L2_STORE, &d);
            out--;
            ok += kvt_bm_count(d->ok, d->n);
            kvt_l2_task_free(d);
        }
        double s = (double)(kvt_now_ns() - t0) / 1e9;
        printf("store %.1f MB/s %.1f ops/s (%llu/%u ok) cpu %.3f s\n",
               (double)ok * (double)size / s / 1e6, (double)ok / s, (unsigned long long)ok, count,
               cpu_s() - c0);
        if (ok != count)
            rc = 1;
    }
    if (strcmp(op, "store") != 0) {
        uint64_t t0 = kvt_now_ns(), ok = 0, bad = 0;
        double c0 = cpu_s();
        uint32_t next = 0, out = 0;
        while (next < count || out) {
            while (next < count && out < inflight) {
                uint32_t n = KVT_MIN(batch, count - next);
                kvt_l2_task *t = kvt_l2_task_new(KVT_L2_LOAD, n);
                for (uint32_t j = 0; j < n; j++) {
                    t->keys[j] = keys[next + j];
                    t->bufs[j] = (kvt_buf){dst + (size_t)(next + j) * size, size};
                }
                next += n;
                out++;
                kvt_l2_submit(l2, t);
            }
            kvt_l2_task *d;
            wait_task(l2, KVT_L2_LOAD, &d);
            out--;
            for (uint32_t j = 0; j < d->n; j++)
                if (kvt_bm_test(d->ok, j) && d->bufs[j].len == size)
                    ok++;
            kvt_l2_task_free(d);
        }
        double s = (double)(kvt_now_ns() - t0) / 1e9, cpu = cpu_s() - c0;
        for (uint32_t i = 0; i < count; i++)
            if (memcmp(dst + (size_t)i * size, bufs[i], size))
                bad++;
        printf("load %.1f MB/s %.1f ops/s (%llu/%u ok, %llu wrong) cpu %.3f s\n",
               (double)ok * (double)size / s / 1e6, (double)ok / s, (unsigned long long)ok, count,
               (unsigned long long)bad, cpu);
        if (ok != count || bad)
            rc = 1;
    }
    if (del) {
        uint64_t t0 = kvt_now_ns();
        uint32_t gone = kvt_l2_delete(l2, keys, count, NULL);
        double s = (double)(kvt_now_ns() - t0) / 1e9;
        printf("delete %.1f ops/s (%u/%u removed)\n", (double)gone / s, gone, count);
        if (gone != count)
            rc = 1;
    }
    kvt_l2_close(l2);
    free(l2);
    kvt_l2_spec_free(&spec);
    for (uint32_t i = 0; i < count; i++)
        free(bufs[i]);
    free(bufs);
    free(keys);
    free(dst);
    return rc;
}
