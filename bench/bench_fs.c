/*
 * fs adapter vs fio, side by side in one run.
 *
 *   bench_fs DIR [--type fs|fs_native] [--objects N] [--size BYTES] [--qd N]
 *                [--rounds R] [--odirect]
 *
 * Each round alternates the two sides on the same directory:
 *   kvtier store (one STORE task of N objects, num_workers = qd)
 *   fio write    (psync, numjobs = qd, bs = filesize = object size, N files)
 *   kvtier load  (one LOAD task of the N objects, after a fresh open)
 *   fio read     (the same files)
 * and prints the median GB/s of each side and the ratio kvtier / fio.
 * With --odirect both sides bypass the page cache (use_odirect / --direct=1).
 */
#include "common/log.h"
#include "common/util.h"
#include "key/key.h"
#include "l2/adapters.h"
#include "l2/engine.h"
#include "l2/evict.h"
#include "l2/l2.h"

#include <errno.h>
#include <jansson.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#define BENCH_WITH_FIO
#include "bench_util.h"

static const char *dir = NULL, *type = "fs";
static int objects = 128, qd = 4, rounds = 3;
static size_t size = 4u << 20;
static bool odirect = false;

static void die(const char *m)
{
    fprintf(stderr, "bench_fs: %s\n", m);
    exit(1);
}

static kvt_l2 *open_fs(const char *path)
{
    char json[1024], err[512];
    snprintf(json, sizeof(json),
             "{\"type\":\"%s\",\"base_path\":\"%s\",\"num_workers\":%d,\"use_odirect\":%s}", type,
             path, qd, odirect ? "true" : "false");
    struct kvt_l2_spec spec;
    if (kvt_l2_spec_parse(json, 0, &spec, err, sizeof(err)))
        die(err);
    kvt_l2 *l2;
    if (kvt_l2_open(&spec, &l2, err, sizeof(err)))
        die(err);
    kvt_l2_spec_free(&spec);
    for (;;) {
        pthread_mutex_lock(&l2->lock);
        bool r = l2->recovering;
        pthread_mutex_unlock(&l2->lock);
        if (!r)
            break;
        usleep(1000);
    }
    return l2;
}

static void run(kvt_l2 *l2, kvt_l2_task *t)
{
    kvt_l2_submit(l2, t);
    for (;;) {
        struct pollfd p = {.fd = l2->efd[t->kind], .events = POLLIN};
        poll(&p, 1, -1);
        kvt_l2_task *d;
        if (kvt_l2_pop_done(l2, t->kind, &d, 1))
            return;
    }
}

static double fio(const char *path, const char *rw)
{
    char cmd[2048];
    snprintf(cmd, sizeof(cmd),
             "fio --name=b --directory=%s --ioengine=psync --rw=%s --bs=%zu --filesize=%zu "
             "--nrfiles=%d --numjobs=%d --file_service_type=sequential --group_reporting "
             "--direct=%d --end_fsync=0 --output-format=json 2>/dev/null",
             path, rw, size, size, (objects + qd - 1) / qd, qd, odirect ? 1 : 0);
    return bench_fio_gbps(cmd, strcmp(rw, "write") == 0 ? "write" : "read");
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--objects") && i + 1 < argc)
            objects = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--size") && i + 1 < argc)
            size = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--qd") && i + 1 < argc)
            qd = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--type") && i + 1 < argc)
            type = argv[++i];
        else if (!strcmp(argv[i], "--odirect"))
            odirect = true;
        else if (argv[i][0] != '-')
            dir = argv[i];
        else
            die("usage: bench_fs DIR [--type fs] [--objects N] [--size B] [--qd N] [--rounds R] "
                "[--odirect]");
    }
    if (!dir)
        die("a directory is required");
    kvt_log_set_level(KVT_LOG_WARN);
    char kdir[1024], fdir[1024], cmd[4200];
    snprintf(kdir, sizeof(kdir), "%s/kvtier", dir);
    snprintf(fdir, sizeof(fdir), "%s/fio", dir);
    void *buf = NULL;
    if (posix_memalign(&buf, 4096, size * (size_t)objects))
        die("out of memory");
    for (size_t i = 0; i < size * (size_t)objects; i++)
        ((unsigned char *)buf)[i] = (unsigned char)(i * 2654435761u >> 13);
    uint32_t ns;
    kvt_ns_intern("bench", 5, "", 0, &ns, NULL);
    double kw[32], kr[32], fw[32], fr[32];
    if (rounds > 32)
        rounds = 32;
    for (int r = 0; r < rounds; r++) {
        snprintf(cmd, sizeof(cmd), "rm -rf %s %s && mkdir -p %s", kdir, fdir, fdir);
        if (system(cmd))
            die("cannot prepare directories");
        kvt_l2 *l2 = open_fs(kdir);
        kvt_l2_task *t = kvt_l2_task_new(KVT_L2_STORE, (uint32_t)objects);
        for (int i = 0; i < objects; i++) {
            uint8_t h[32] = {0};
            memcpy(h, &i, sizeof(i));
            memcpy(h + 8, &r, sizeof(r));
            kvt_key_make(&t->keys[i], ns, h, 32, 0, 0);
            t->bufs[i].ptr = (char *)buf + (size_t)i * size;
            t->bufs[i].len = size;
            t->meta[i].len = (uint32_t)size;
        }
        uint64_t t0 = kvt_now_ns();
        run(l2, t);
        double dt = (double)(kvt_now_ns() - t0) / 1e9;
        if (kvt_bm_count(t->ok, t->n) != (size_t)objects)
            die("kvtier store failed");
        kw[r] = (double)size * objects / dt / 1e9;
        kvt_l2_close(l2);
        free(l2);
        fw[r] = fio(fdir, "write");

        l2 = open_fs(kdir);
        t->kind = KVT_L2_LOAD;
        t0 = kvt_now_ns();
        run(l2, t);
        dt = (double)(kvt_now_ns() - t0) / 1e9;
        if (kvt_bm_count(t->ok, t->n) != (size_t)objects)
            die("kvtier load failed");
        kr[r] = (double)size * objects / dt / 1e9;
        kvt_l2_task_free(t);
        kvt_l2_close(l2);
        free(l2);
        fr[r] = fio(fdir, "read");
        fprintf(stderr, "round %d: store %.2f vs fio write %.2f GB/s, load %.2f vs fio read %.2f\n",
                r + 1, kw[r], fw[r], kr[r], fr[r]);
    }
    double mkw = bench_median(kw, rounds), mfw = bench_median(fw, rounds),
           mkr = bench_median(kr, rounds), mfr = bench_median(fr, rounds);
    printf("%s %s, %d x %zu MiB objects, queue depth %d, %d rounds (medians)\n", type,
           odirect ? "O_DIRECT" : "buffered", objects, size >> 20, qd, rounds);
    printf("  store  kvtier %6.2f GB/s   fio write %6.2f GB/s   ratio %.2f\n", mkw, mfw, mkw / mfw);
    printf("  load   kvtier %6.2f GB/s   fio read  %6.2f GB/s   ratio %.2f\n", mkr, mfr, mkr / mfr);
    /* bench_median sorted each row: its first and last are the min and max */
    printf("  min-max: store kvtier %.2f-%.2f, fio write %.2f-%.2f; load kvtier %.2f-%.2f, fio "
           "read %.2f-%.2f GB/s\n",
           kw[0], kw[rounds - 1], fw[0], fw[rounds - 1], kr[0], kr[rounds - 1], fr[0],
           fr[rounds - 1]);
    snprintf(cmd, sizeof(cmd), "rm -rf %s %s", kdir, fdir);
    if (system(cmd)) {
    }
    free(buf);
    return 0;
}
