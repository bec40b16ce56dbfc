/*
 * Client-side data-path benchmarks against a running kvtier server.
 *
 *   bench_client zc     URL [--size B] [--batch N] [--rounds R]
 *       zero-copy store (prepare, memcpy into the pool, commit) and retrieve
 *       (prepare, memcpy out of the pool, commit) vs single-thread memcpy of
 *       the same bytes, alternating, median GB/s and ratios.
 *   bench_client inline URL [--size B] [--conc C] [--seconds S]
 *       inline store / retrieve, one object per request, C client threads;
 *       prints requests/s and GB/s (compare with redis-benchmark SET/GET).
 *   bench_client small  URL [--conc C] [--seconds S] [--tcp 1]
 *       ping and one-key lookup per request, C threads; prints ops/s.
 *       Over the same-host socket a client on this host uses, or with
 *       --tcp 1 over ZeroMQ/TCP loopback (what bench_zmq_echo measures).
 *   bench_client l2     URL [--size B] [--batch N]
 *       for each line "TAG" read on stdin: one store + flush of N objects
 *       of fresh keys (named by TAG): kvt_store of all N in one call (the
 *       client sends it in parts), then kvt_flush, which returns once every
 *       L2 adapter has them; prints the seconds of each and the GB/s of
 *       the whole, then deletes the keys (not timed). One process for all
 *       rounds, as an engine keeps its client: its mapping of the pool is
 *       warm after the first. bench/bench_store_l2.py runs it beside fio.
 *
 * Output lines "RESULT <name> <value>" are parsed by bench/run.sh.
 */
#include "kvtier/client.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>
#include "bench_util.h"

static const char *url;
static size_t size = 4u << 20;
static int batch = 16, rounds = 5, conc = 4, warmup = 12;
static double seconds = 3, warmup_seconds = 2;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void die(const char *what, kvt_client *c)
{
    fprintf(stderr, "bench_client: %s: %s\n", what,
            c ? kvt_client_last_error(c) : kvt_client_open_error());
    exit(1);
}

static void make_hashes(uint8_t *h, int n, uint64_t tag)
{
    memset(h, 0, (size_t)n * 32);
    for (int i = 0; i < n; i++) {
        memcpy(h + 32 * i, &tag, 8);
        memcpy(h + 32 * i + 8, &i, 4);
    }
}

static int cmd_zc(void)
{
    uint64_t run_tag = ((uint64_t)getpid() << 32) ^ (uint64_t)(now() * 1e6);
    kvt_client *c;
    if (kvt_client_open(url, NULL, &c))
        die("connect", NULL);
    if (!kvt_client_shm_active(c))
        die("the shared-memory path is not available (same host?)", NULL);
    char *src = aligned_alloc(4096, size * (size_t)batch);
    char *dst = aligned_alloc(4096, size * (size_t)batch);
    for (size_t i = 0; i < size * (size_t)batch; i++)
        src[i] = (char)(i * 131);
    memset(dst, 1, size * (size_t)batch);
    uint8_t *h = malloc((size_t)batch * 32);
    size_t *sizes = malloc(sizeof(size_t) * (size_t)batch);
    for (int i = 0; i < batch; i++)
        sizes[i] = size;
    double mc[64], st[64], rt[64];
    if (rounds > 64)
        rounds = 64;
    double bytes = (double)size * batch;
    /* warm-up rounds cycle through the pool (run the server with an L1 a few
     * times the batch), so the timed rounds measure the steady state: pages
     * already mapped on both sides, objects evicted and their pages reused */
    for (int r = -warmup; r < rounds; r++) {
        double t0 = now();
        for (int i = 0; i < batch; i++)
            memcpy(dst + (size_t)i * size, src + (size_t)i * size, size);
        double t_mc = now() - t0;

        /* keys new to the server in every round of every run: a rerun
         * against the same server must not find (skip) last run's keys */
        make_hashes(h, batch, run_tag + (uint64_t)(r + warmup + 2) * 7919);
        kvt_keys k = {.model = "bench", .hashes = h, .hash_len = 32, .n = (size_t)batch};
        kvt_wview *wv;
        t0 = now();
        if (kvt_store_begin(c, &k, sizes, NULL, &wv))
            die("store_begin", c);
        for (int i = 0; i < batch; i++)
            if (wv->ptrs[i])
                memcpy(wv->ptrs[i], src + (size_t)i * size, size);
        size_t acc;
        if (kvt_store_commit(c, wv, NULL, &acc) || acc != (size_t)batch)
            die("store_commit", c);
        double t_st = now() - t0;

        kvt_rview *rv;
        t0 = now();
        if (kvt_retrieve_begin(c, &k, &rv) || rv->n != (size_t)batch)
            die("retrieve_begin", c);
        for (size_t i = 0; i < rv->n; i++)
            memcpy(dst + i * size, rv->ptrs[i], rv->lens[i]);
        if (kvt_retrieve_end(c, rv))
            die("retrieve_end", c);
        double t_rt = now() - t0;
        if (memcmp(src, dst, size * (size_t)batch))
            die("retrieved bytes differ", NULL);
        if (r >= 0) {
            mc[r] = bytes / t_mc / 1e9;
            st[r] = bytes / t_st / 1e9;
            rt[r] = bytes / t_rt / 1e9;
        }
    }
    double m = bench_median(mc, rounds), s = bench_median(st, rounds), t = bench_median(rt, rounds);
    printf("zero-copy, %d x %zu MiB per request, %d rounds (medians)\n", batch, size >> 20, rounds);
    printf("  memcpy            %6.2f GB/s\n", m);
    printf("  zero-copy store   %6.2f GB/s   ratio %.2f\n", s, s / m);
    printf("  zero-copy retrieve%6.2f GB/s   ratio %.2f\n", t, t / m);
    printf("RESULT memcpy_gbps %.3f\nRESULT zc_store_gbps %.3f\nRESULT zc_retrieve_gbps %.3f\n", m,
           s, t);
    kvt_client_close(c);
    return 0;
}

static int cmd_l2(void)
{
    kvt_client *c;
    if (kvt_client_open(url, NULL, &c))
        die("connect", NULL);
    size_t n = (size_t)batch, total = size * n;
    char *src = aligned_alloc(4096, total);
    for (size_t i = 0; i < total; i += 64)
        memcpy(src + i, &(uint64_t){i * 0x9e3779b97f4a7c15ull}, 8);
    const void **bufs = malloc(sizeof(void *) * n);
    size_t *lens = malloc(sizeof(size_t) * n);
    for (size_t i = 0; i < n; i++) {
        bufs[i] = src + i * size;
        lens[i] = size;
    }
    uint8_t *h = malloc(n * 32);
    char line[64];
    while (fgets(line, sizeof(line), stdin)) {
        make_hashes(h, (int)n, strtoull(line, NULL, 0));
        kvt_keys k = {.model = "bench-l2", .hashes = h, .hash_len = 32, .n = n};
        size_t acc;
        double t0 = now();
        if (kvt_store(c, &k, (const void *const *)bufs, lens, NULL, &acc) || acc != n)
            die("store", c);
        double t1 = now();
        kvt_flush_report rep;
        if (kvt_flush_ex(c, &rep))
            die("flush", c);
        double t2 = now();
        if (rep.l2_failed) {
            fprintf(stderr, "bench_client: %llu store(s) did not reach L2\n",
                    (unsigned long long)rep.l2_failed);
            return 1;
        }
        kvt_flush_report_free(&rep);
        size_t removed;
        if (kvt_delete(c, &k, &removed))
            die("delete", c);
        printf("RESULT l2_store_s %.4f\nRESULT l2_flush_s %.4f\nRESULT l2_gbps %.3f\n", t1 - t0,
               t2 - t1, (double)total / (t2 - t0) / 1e9);
        fflush(stdout);
    }
    kvt_client_close(c);
    return 0;
}

struct worker {
    pthread_t thr;
    int id;
    const char *mode; /* store, retrieve, ping, lookup */
    uint64_t ops;
};

static _Atomic bool go, stop_flag;
static bool inline_tcp;
static char *payload;

static void *work(void *arg)
{
    struct worker *w = arg;
    /* inline: bytes on ZeroMQ over TCP loopback (as redis-benchmark);
     * small ops: whatever a client on this host uses (the local socket) */
    kvt_client_opts o = {.no_shm = true, .no_local = inline_tcp};
    kvt_client *c;
    if (kvt_client_open(url, &o, &c))
        die("connect", NULL);
    uint8_t h[32];
    make_hashes(h, 1, 1000 + (uint64_t)w->id);
    kvt_keys k = {.model = "bench", .hashes = h, .hash_len = 32, .n = 1};
    const void *bufs[1] = {payload};
    size_t lens[1] = {size}, acc;
    if (kvt_store(c, &k, bufs, lens, NULL, &acc) || acc != 1)
        die("seed store", c);
    uint64_t seq = 0;
    while (!atomic_load(&go))
        ;
    while (!atomic_load(&stop_flag)) {
        int rc;
        if (!strcmp(w->mode, "store")) {
            /* a fresh key each time: the server copies every payload */
            uint64_t tag = ((uint64_t)w->id << 40) | ++seq;
            memcpy(h, &tag, 8);
            rc = kvt_store(c, &k, bufs, lens, NULL, &acc);
        } else if (!strcmp(w->mode, "retrieve")) {
            kvt_blob *b;
            size_t n;
            rc = kvt_retrieve(c, &k, &b, &n);
            if (!rc && (n != 1 || b[0].len != size))
                die("retrieve returned the wrong size", NULL);
            kvt_blobs_free(b, n);
        } else if (!strcmp(w->mode, "lookup")) {
            size_t hits; /* each lookup releases the previous one's locks */
            rc = kvt_lookup(c, &k, &hits);
        } else {
            rc = kvt_ping(c);
        }
        if (rc)
            die(w->mode, c);
        w->ops++;
    }
    kvt_client_close(c);
    return NULL;
}

static double run_workers(const char *mode)
{
    struct worker *ws = calloc((size_t)conc, sizeof(*ws));
    atomic_store(&go, false);
    atomic_store(&stop_flag, false);
    for (int i = 0; i < conc; i++) {
        ws[i].id = i;
        ws[i].mode = mode;
        pthread_create(&ws[i].thr, NULL, work, &ws[i]);
    }
    struct timespec ts = {0, 200000000};
    nanosleep(&ts, NULL); /* connect and seed */
    double t0 = now();
    atomic_store(&go, true);
    while (now() - t0 < seconds) {
        ts.tv_nsec = 10000000;
        nanosleep(&ts, NULL);
    }
    atomic_store(&stop_flag, true);
    double dt = now() - t0;
    uint64_t ops = 0;
    for (int i = 0; i < conc; i++) {
        pthread_join(ws[i].thr, NULL);
        ops += ws[i].ops;
    }
    free(ws);
    return (double)ops / dt;
}

static int cmd_inline(void)
{
    payload = malloc(size);
    for (size_t i = 0; i < size; i++)
        payload[i] = (char)(i * 7);
    inline_tcp = true;
    /* warm-up: fill the pool once, so the timed run measures the steady
     * state (pages mapped, evicted objects' pages reused) */
    double keep = seconds;
    seconds = warmup_seconds;
    run_workers("store");
    seconds = keep;
    double s = run_workers("store"), r = run_workers("retrieve");
    printf("inline over ZeroMQ/TCP loopback, %zu MiB objects, %d clients, %.0f s each\n",
           size >> 20, conc, seconds);
    printf("  store     %8.1f req/s  %6.2f GB/s\n", s, s * (double)size / 1e9);
    printf("  retrieve  %8.1f req/s  %6.2f GB/s\n", r, r * (double)size / 1e9);
    printf("RESULT inline_store_rps %.1f\nRESULT inline_retrieve_rps %.1f\n", s, r);
    return 0;
}

static int cmd_small(void)
{
    size = 64;
    payload = calloc(1, size);
    double p = run_workers("ping"), l = run_workers("lookup");
    printf("small ops, %d clients, %.0f s each, %s\n", conc, seconds,
           inline_tcp ? "ZeroMQ/TCP loopback" : "the same-host socket");
    printf("  ping    %9.0f ops/s\n", p);
    printf("  lookup  %9.0f ops/s (one key; each releases the previous lookup's locks)\n", l);
    printf("RESULT ping_ops %.0f\nRESULT lookup_ops %.0f\n", p, l);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: bench_client zc|inline|small|l2 URL [--size B] [--batch N] "
                        "[--rounds R] [--conc C] [--seconds S]\n");
        return 2;
    }
    url = argv[2];
    for (int i = 3; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--size"))
            size = strtoull(argv[i + 1], NULL, 0);
        else if (!strcmp(argv[i], "--batch"))
            batch = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--rounds"))
            rounds = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--conc"))
            conc = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--warmup-seconds"))
            warmup_seconds = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--warmup"))
            warmup = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--seconds"))
            seconds = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--tcp"))
            inline_tcp = atoi(argv[i + 1]) != 0;
    }
    if (!strcmp(argv[1], "zc"))
        return cmd_zc();
    if (!strcmp(argv[1], "inline"))
        return cmd_inline();
    if (!strcmp(argv[1], "small"))
        return cmd_small();
    if (!strcmp(argv[1], "l2"))
        return cmd_l2();
    fprintf(stderr, "bench_client: unknown mode %s\n", argv[1]);
    return 2;
}
