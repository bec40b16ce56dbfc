/*
 * Helpers every benchmark uses the same way: medians, and fio's bandwidth
 * read from its JSON output. Header-only (static): each bench is one file.
 */
#ifndef KVT_BENCH_UTIL_H
#define KVT_BENCH_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of v[0..n) (sorts v). */
__attribute__((unused)) static double bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), bench_cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

#ifdef BENCH_WITH_FIO
#include <jansson.h>

/* Run cmd (fio ... --output-format=json) and return jobs[0].<side>.bw_bytes
 * in GB/s; side is "read" or "write". Exits with a message naming cmd when
 * fio is missing or printed something else. */
static double bench_fio_gbps(const char *cmd, const char *side)
{
    FILE *p = popen(cmd, "r");
    if (!p) {
        perror("popen fio");
        exit(1);
    }
    size_t cap = 1 << 16, n = 0, r;
    char *buf = malloc(cap);
    while (buf && (r = fread(buf + n, 1, cap - n - 1, p)) > 0) {
        n += r;
        if (n + 1 == cap)
            buf = realloc(buf, cap *= 2);
    }
    pclose(p);
    if (!buf) {
        fprintf(stderr, "out of memory reading fio output\n");
        exit(1);
    }
    buf[n] = 0;
    const char *start = strchr(buf, '{'); /* fio may print notes before the JSON */
    json_error_t je;
    json_t *j = start ? json_loads(start, JSON_DISABLE_EOF_CHECK, &je) : NULL;
    json_t *job = j ? json_array_get(json_object_get(j, "jobs"), 0) : NULL;
    json_t *bw = job ? json_object_get(json_object_get(job, side), "bw_bytes") : NULL;
    if (!bw) {
        fprintf(stderr, "cannot read fio output (is fio installed?) for: %s\n", cmd);
        exit(1);
    }
    double v = (double)json_integer_value(bw) / 1e9;
    json_decref(j);
    free(buf);
    return v;
}
#endif

#endif
