/* Drive an L2 adapter through the kvt_l2 contract, as the controllers do:
 * open from --l2-adapter JSON, submit a task, wait on its eventfd. */
#ifndef KVT_TEST_PERSIST_HARNESS_H
#define KVT_TEST_PERSIST_HARNESS_H

#include "common/util.h"
#include "kvtier/error.h"
#include "key/key.h"
#include "l2/adapters.h"
#include "l2/engine.h"
#include "l2/evict.h"
#include "l2/l2.h"

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

__attribute__((unused)) static kvt_l2 *h_open(const char *json)
{
    struct kvt_l2_spec spec;
    char err[1024];
    if (kvt_l2_spec_parse(json, 0, &spec, err, sizeof(err))) {
        fprintf(stderr, "parse: %s\n", err);
        return NULL;
    }
    kvt_l2 *l2 = NULL;
    int rc = kvt_l2_open(&spec, &l2, err, sizeof(err));
    kvt_l2_spec_free(&spec);
    if (rc) {
        fprintf(stderr, "open: %s\n", err);
        return NULL;
    }
    return l2;
}

static void h_close(kvt_l2 *l2)
{
    kvt_l2_close(l2);
    free(l2);
}

/* Error text of a failed open, for tests that expect one. */
__attribute__((unused)) static int h_open_err(const char *json, char *err, size_t cap)
{
    struct kvt_l2_spec spec;
    int rc = kvt_l2_spec_parse(json, 0, &spec, err, cap);
    if (rc)
        return rc;
    kvt_l2 *l2 = NULL;
    rc = kvt_l2_open(&spec, &l2, err, cap);
    kvt_l2_spec_free(&spec);
    if (!rc) {
        kvt_l2_close(l2);
        free(l2);
    }
    return rc;
}

__attribute__((unused)) static void h_wait_recovered(kvt_l2 *l2)
{
    for (int i = 0; i < 20000; i++) {
        pthread_mutex_lock(&l2->lock);
        bool r = l2->recovering;
        pthread_mutex_unlock(&l2->lock);
        if (!r)
            return;
        usleep(1000);
    }
    fprintf(stderr, "recovery did not finish\n");
    exit(1);
}

/* Submit and wait for this task to come back (returns the same task). */
__attribute__((unused)) static kvt_l2_task *h_run(kvt_l2 *l2, kvt_l2_task *t)
{
    kvt_l2_submit(l2, t);
    for (;;) {
        struct pollfd p = {.fd = l2->efd[t->kind], .events = POLLIN};
        if (poll(&p, 1, 30000) <= 0) {
            fprintf(stderr, "task did not complete within 30 s\n");
            exit(1);
        }
        kvt_l2_task *out = NULL;
        if (kvt_l2_pop_done(l2, t->kind, &out, 1)) {
            if (out != t) {
                fprintf(stderr, "unexpected task\n");
                exit(1);
            }
            return out;
        }
    }
}

__attribute__((unused)) static void h_key(kvt_key *k, const char *model, uint32_t i)
{
    uint32_t ns;
    if (kvt_ns_intern(model, strlen(model), "", 0, &ns, NULL))
        abort();
    uint8_t hash[32];
    for (int b = 0; b < 32; b++)
        hash[b] = (uint8_t)(i * 31 + b * 7 + (i >> 8));
    memcpy(hash, &i, sizeof(i));
    kvt_key_make(k, ns, hash, 32, 0, 0);
}

/* Page-aligned buffer with a pattern derived from (seed, i). */
__attribute__((unused)) static void *h_payload(size_t len, uint32_t seed)
{
    void *p = NULL;
    if (posix_memalign(&p, 4096, len ? len : 4096))
        abort();
    uint8_t *b = p;
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t j = 0; j < len; j++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        b[j] = (uint8_t)x;
    }
    return p;
}

/* Store n keys [first, first+n) of len bytes; returns how many succeeded
 * and, when ok_bits is not NULL, sets bit i there for each key first+i the
 * adapter acknowledged (n <= 64). */
__attribute__((unused)) static uint32_t h_store_bits(kvt_l2 *l2, const char *model, uint32_t first,
                                                     uint32_t n, size_t len, uint64_t *ok_bits)
{
    kvt_l2_task *t = kvt_l2_task_new(KVT_L2_STORE, n);
    for (uint32_t i = 0; i < n; i++) {
        h_key(&t->keys[i], model, first + i);
        t->bufs[i].ptr = h_payload(len, first + i);
        t->bufs[i].len = len;
        t->meta[i].len = (uint32_t)len;
    }
    h_run(l2, t);
    uint32_t ok = (uint32_t)kvt_bm_count(t->ok, n);
    if (ok_bits)
        for (uint32_t i = 0; i < n && i < 64; i++)
            *ok_bits |= (uint64_t)kvt_bm_test(t->ok, i) << i;
    for (uint32_t i = 0; i < n; i++)
        free(t->bufs[i].ptr);
    kvt_l2_task_free(t);
    return ok;
}

__attribute__((unused)) static uint32_t h_store(kvt_l2 *l2, const char *model, uint32_t first,
                                                uint32_t n, size_t len)
{
    return h_store_bits(l2, model, first, n, len, NULL);
}

/* Lookup-and-lock then load n keys; returns how many came back with the
 * exact bytes (and unlocks them). */
__attribute__((unused)) static uint32_t h_check(kvt_l2 *l2, const char *model, uint32_t first,
                                                uint32_t n, size_t len)
{
    kvt_l2_task *lk = kvt_l2_task_new(KVT_L2_LOOKUP, n);
    for (uint32_t i = 0; i < n; i++)
        h_key(&lk->keys[i], model, first + i);
    h_run(l2, lk);
    kvt_l2_task *t = kvt_l2_task_new(KVT_L2_LOAD, n);
    for (uint32_t i = 0; i < n; i++) {
        t->keys[i] = lk->keys[i];
        /* capacity larger than needed, filled with a pattern no key has (a
         * load that moved nothing must not match key 0) */
        t->bufs[i].ptr = h_payload(len + 8192, UINT32_MAX);
        t->bufs[i].len = len + 8192;
    }
    h_run(l2, t);
    uint32_t good = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (kvt_bm_test(lk->ok, i) && kvt_bm_test(t->ok, i) && t->bufs[i].len == len) {
            void *want = h_payload(len, first + i);
            good += memcmp(want, t->bufs[i].ptr, len) == 0;
            free(want);
        }
        free(t->bufs[i].ptr);
    }
    kvt_l2_unlock(l2, lk->keys, n);
    kvt_l2_task_free(lk);
    kvt_l2_task_free(t);
    return good;
}

/* Delete keys [first, first+n); bit i of removed_bits (may be NULL, n <= 64)
 * is set for each key the adapter reports removed. */
__attribute__((unused)) static uint32_t h_delete_bits(kvt_l2 *l2, const char *model, uint32_t first,
                                                      uint32_t n, uint64_t *removed_bits)
{
    kvt_key *k = calloc(n, sizeof(*k));
    uint64_t *rm = calloc((n + 63) / 64, sizeof(*rm));
    for (uint32_t i = 0; i < n; i++)
        h_key(&k[i], model, first + i);
    uint32_t r = kvt_l2_delete(l2, k, n, rm);
    if (removed_bits)
        for (uint32_t i = 0; i < n && i < 64; i++)
            *removed_bits |= (uint64_t)kvt_bm_test(rm, i) << i;
    free(rm);
    free(k);
    return r;
}

__attribute__((unused)) static uint32_t h_delete(kvt_l2 *l2, const char *model, uint32_t first,
                                                 uint32_t n)
{
    return h_delete_bits(l2, model, first, n, NULL);
}

/* A field of the adapter's status (integers; -1 when absent). */
__attribute__((unused)) static long long h_status_int(kvt_l2 *l2, const char *path1,
                                                      const char *path2)
{
    json_t *st = kvt_l2_status(l2);
    json_t *v = json_object_get(st, path1);
    if (v && path2)
        v = json_object_get(v, path2);
    long long r = v && json_is_integer(v) ? (long long)json_integer_value(v) : -1;
    json_decref(st);
    return r;
}

#endif
