/* Description: fs adapter through the L2 contract: store, lookup-and-lock, load, unlock, delete,
 * usage, recovery, cap. */
#include "l2_harness.h"

#include "core/events.h"
#include "key/blocktag.h"
#include "kvtier/error.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/stat.h>

static char dir[256];

static void fill(void *p, size_t n, int seed)
{
    unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        c[i] = (unsigned char)(seed * 31 + i * 7);
}

static void test_contract(void)
{
    char spec[512];
    snprintf(spec, sizeof(spec), "{\"type\":\"fs\",\"base_path\":\"%s/a\"}", dir);
    kvt_l2 *l2 = open_adapter(spec);
    wait_recovered(l2);
    enum { N = 10, SZ = 100000 };
    static char src[N][SZ], dst[N][SZ];
    kvt_l2_task *t = kvt_l2_task_new(KVT_L2_STORE, N);
    for (int i = 0; i < N; i++) {
        t->keys[i] = hkey("unit", "", i);
        fill(src[i], SZ, i);
        t->bufs[i].ptr = src[i];
        t->bufs[i].len = SZ;
        t->meta[i].len = SZ;
    }
    run_task(l2, t);
    TEST_ASSERT(kvt_bm_count(t->ok, N) == N);
    kvt_l2_task_free(t);

    struct kvt_l2_usage u;
    kvt_l2_usage(l2, &u);
    TEST_ASSERT(u.objects == N && u.used_bytes == N * (SZ + 512));
    TEST_ASSERT(u.fraction == -1.0); /* no cap */

    /* lookup: keys 0..9 hit, 10 misses */
    t = kvt_l2_task_new(KVT_L2_LOOKUP, N + 1);
    for (int i = 0; i <= N; i++)
        t->keys[i] = hkey("unit", "", i);
    run_task(l2, t);
    TEST_ASSERT(kvt_bm_count(t->ok, N + 1) == N && !kvt_bm_test(t->ok, N));
    TEST_ASSERT(t->meta[3].len == SZ);
    kvt_l2_task_free(t);

    /* pinned keys are not deleted */
    kvt_key k0 = hkey("unit", "", 0);
    TEST_ASSERT(kvt_l2_delete(l2, &k0, 1, NULL) == 0);

    t = kvt_l2_task_new(KVT_L2_LOAD, N);
    for (int i = 0; i < N; i++) {
        t->keys[i] = hkey("unit", "", i);
        t->bufs[i].ptr = dst[i];
        t->bufs[i].len = SZ;
    }
    run_task(l2, t);
    TEST_ASSERT(kvt_bm_count(t->ok, N) == N);
    for (int i = 0; i < N; i++)
        TEST_ASSERT(t->bufs[i].len == SZ && memcmp(src[i], dst[i], SZ) == 0);
    kvt_l2_unlock(l2, t->keys, N);
    kvt_l2_unlock(l2, t->keys, N); /* underflow is a no-op */

    uint64_t removed[1] = {0};
    TEST_ASSERT(kvt_l2_delete(l2, t->keys, 2, removed) == 2 && removed[0] == 3);
    kvt_l2_task_free(t);

    /* a load into a too small buffer is refused, never an overrun */
    t = kvt_l2_task_new(KVT_L2_LOAD, 1);
    t->keys[0] = hkey("unit", "", 5);
    t->bufs[0].ptr = dst[0];
    t->bufs[0].len = SZ - 1;
    run_task(l2, t);
    TEST_ASSERT(!kvt_bm_test(t->ok, 0));
    kvt_l2_task_free(t);

    json_t *st = kvt_l2_status(l2);
    TEST_ASSERT(json_integer_value(json_object_get(st, "objects")) == N - 2);
    TEST_ASSERT(json_is_true(json_object_get(st, "is_healthy")));
    json_decref(st);
    close_adapter(l2);

    /* reopen: accounting restored by the scan */
    l2 = open_adapter(spec);
    wait_recovered(l2);
    kvt_l2_usage(l2, &u);
    TEST_ASSERT(u.objects == N - 2 && u.used_bytes == (N - 2) * (SZ + 512));
    t = kvt_l2_task_new(KVT_L2_LOOKUP, 1);
    t->keys[0] = hkey("unit", "", 9);
    run_task(l2, t);
    TEST_ASSERT(kvt_bm_test(t->ok, 0) && t->meta[0].len == SZ);
    kvt_l2_unlock(l2, t->keys, 1);
    kvt_l2_task_free(t);
    close_adapter(l2);
}

static void test_cap_and_eviction(void)
{
    char spec[512];
    /* cap: 5 objects of 1 MiB + header; LRU evicts at 0.8 down to 60% */
    double cap_gb = 5.0 * (1048576 + 512) / 1073741824.0;
    snprintf(spec, sizeof(spec),
             "{\"type\":\"fs\",\"base_path\":\"%s/b\",\"max_capacity_gb\":%.12f,"
             "\"eviction\":{\"eviction_policy\":\"LRU\",\"trigger_watermark\":0.8,"
             "\"eviction_ratio\":0.4}}",
             dir, cap_gb);
    kvt_l2 *l2 = open_adapter(spec);
    wait_recovered(l2);
    l2->no_sync_evict = true; /* the cap alone: refused (the next test evicts) */
    static char buf[1 << 20];
    int stored = 0, refused = 0;
    for (int i = 0; i < 8; i++) {
        kvt_l2_task *t = kvt_l2_task_new(KVT_L2_STORE, 1);
        t->keys[0] = hkey("cap", "", i);
        t->bufs[0].ptr = buf;
        t->bufs[0].len = sizeof(buf);
        run_task(l2, t);
        if (kvt_bm_test(t->ok, 0))
            stored++;
        else {
            TEST_ASSERT(t->err == KVT_E_FULL);
            refused++;
        }
        kvt_l2_task_free(t);
        struct kvt_l2_usage u;
        kvt_l2_usage(l2, &u);
        TEST_ASSERT(u.used_bytes <= u.cap_bytes);
    }
    TEST_ASSERT(stored == 5 && refused == 3);
    /* eviction: used 5/5 >= 0.8 -> down to 60%: 3 objects, oldest gone */
    uint64_t freed = kvt_l2_evict_to(l2, (uint64_t)(0.6 * 5 * (1048576 + 512)), 16);
    TEST_ASSERT(freed == 2 * (1048576 + 512));
    kvt_l2_task *t = kvt_l2_task_new(KVT_L2_LOOKUP, 5);
    for (int i = 0; i < 5; i++)
        t->keys[i] = hkey("cap", "", i);
    run_task(l2, t);
    TEST_ASSERT(!kvt_bm_test(t->ok, 0) && !kvt_bm_test(t->ok, 1) && kvt_bm_test(t->ok, 4));
    kvt_l2_unlock(l2, t->keys, 5);
    kvt_l2_task_free(t);
    close_adapter(l2);
}

/* Description: with an eviction policy, a store over the cap evicts
 * synchronously (oldest first) instead of being refused: all 8 of 8 are
 * stored, usage stays under the cap. */
static void test_store_over_cap_evicts(void)
{
    char spec[512];
    double cap_gb = 5.0 * (1048576 + 512) / 1073741824.0;
    snprintf(spec, sizeof(spec),
             "{\"type\":\"fs\",\"base_path\":\"%s/c\",\"max_capacity_gb\":%.12f,"
             "\"eviction\":{\"eviction_policy\":\"LRU\",\"trigger_watermark\":0.8,"
             "\"eviction_ratio\":0.2}}",
             dir, cap_gb);
    kvt_l2 *l2 = open_adapter(spec);
    wait_recovered(l2);
    static char buf[1 << 20];
    for (int i = 0; i < 8; i++) {
        kvt_l2_task *t = kvt_l2_task_new(KVT_L2_STORE, 1);
        t->keys[0] = hkey("ev", "", i);
        t->bufs[0].ptr = buf;
        t->bufs[0].len = sizeof(buf);
        run_task(l2, t);
        TEST_ASSERT(kvt_bm_test(t->ok, 0));
        kvt_l2_task_free(t);
        struct kvt_l2_usage u;
        kvt_l2_usage(l2, &u);
        TEST_ASSERT(u.used_bytes <= u.cap_bytes);
    }
    TEST_ASSERT(atomic_load(&l2->counters.rejected_writes) == 0);
    TEST_ASSERT(atomic_load(&l2->counters.sync_evictions) > 0);
    kvt_l2_task *t = kvt_l2_task_new(KVT_L2_LOOKUP, 8);
    for (int i = 0; i < 8; i++)
        t->keys[i] = hkey("ev", "", i);
    run_task(l2, t);
    TEST_ASSERT(!kvt_bm_test(t->ok, 0) && kvt_bm_test(t->ok, 7)); /* oldest went */
    kvt_l2_unlock(l2, t->keys, 8);
    kvt_l2_task_free(t);
    close_adapter(l2);
}

/* Description: many store threads over the cap at once, each object alone
 * in its task: the synchronous eviction of one thread must not make another
 * refuse (two threads that read the same usage evict to the same target;
 * the second then finds nothing to free and used to answer E_FULL although
 * there was room). Every store of every round succeeds, usage stays under
 * the cap. */
static void concurrent_stores_over_cap(const char *policy)
{
    char spec[512];
    enum { SZ = 65536, CAPN = 20, N = 400, BATCH = 16 };
    double cap_gb = (double)CAPN * (SZ + 512) / 1073741824.0;
    snprintf(spec, sizeof(spec),
             "{\"type\":\"fs\",\"base_path\":\"%s/cc-%s\",\"max_capacity_gb\":%.12f,"
             "\"num_workers\":8,\"eviction\":{\"eviction_policy\":\"%s\","
             "\"trigger_watermark\":0.9,\"eviction_ratio\":0.1}}",
             dir, policy, cap_gb, policy);
    kvt_l2 *l2 = open_adapter(spec);
    wait_recovered(l2);
    static char buf[SZ];
    uint32_t refused = 0;
    for (int r = 0; r < N / BATCH; r++) {
        kvt_l2_task *t[BATCH];
        for (int i = 0; i < BATCH; i++) {
            t[i] = kvt_l2_task_new(KVT_L2_STORE, 1);
            t[i]->keys[0] = hkey("cc", "", r * BATCH + i);
            t[i]->bufs[0].ptr = buf;
            t[i]->bufs[0].len = sizeof(buf);
            kvt_l2_submit(l2, t[i]);
        }
        for (int got = 0; got < BATCH;) {
            struct pollfd p = {.fd = l2->efd[KVT_L2_STORE], .events = POLLIN};
            TEST_ASSERT(poll(&p, 1, 30000) == 1);
            kvt_l2_task *done[BATCH];
            size_t n = kvt_l2_pop_done(l2, KVT_L2_STORE, done, BATCH);
            for (size_t k = 0; k < n; k++) {
                refused += !kvt_bm_test(done[k]->ok, 0);
                kvt_l2_task_free(done[k]);
            }
            got += (int)n;
        }
        struct kvt_l2_usage u;
        kvt_l2_usage(l2, &u);
        TEST_ASSERT(u.used_bytes <= u.cap_bytes);
    }
    if (refused)
        fprintf(stderr, "%s: refused %u of %d stores\n", policy, refused, N);
    TEST_ASSERT(refused == 0);
    TEST_ASSERT(atomic_load(&l2->counters.rejected_writes) == 0);
    close_adapter(l2);
}

static void test_concurrent_stores_over_cap(void)
{
    static const char *const policies[] = {"LRU", "ARC", "LFU", "value", "adaptive"};
    for (size_t i = 0; i < sizeof(policies) / sizeof(policies[0]); i++)
        concurrent_stores_over_cap(policies[i]);
}

/* Per-key error codes: each failed key keeps its own, for every task kind;
 * a key failed without a code of its own reports the task's first error. */
static void test_task_codes(void)
{
    const enum kvt_l2_kind kinds[] = {KVT_L2_STORE, KVT_L2_LOOKUP, KVT_L2_LOAD};
    for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++) {
        kvt_l2_task *t = kvt_l2_task_new(kinds[k], 4);
        TEST_ASSERT(t->codes == NULL); /* nothing allocated until a key fails */
        kvt_l2_task_ok(t, 0, 10);
        kvt_l2_task_fail(t, 1, KVT_E_TOOBIG);
        kvt_l2_task_fail(t, 2, -ENOSPC);
        TEST_ASSERT(kvt_l2_task_code(t, 0) == 0);
        TEST_ASSERT(kvt_l2_task_code(t, 1) == KVT_E_TOOBIG);
        TEST_ASSERT(kvt_l2_task_code(t, 2) == -ENOSPC);
        TEST_ASSERT(kvt_l2_task_code(t, 3) == KVT_E_TOOBIG); /* the task's first */
        kvt_l2_task_free(t);
    }
    kvt_l2_task *t = kvt_l2_task_new(KVT_L2_LOAD, 2);
    TEST_ASSERT(kvt_l2_task_code(t, 1) == -EIO); /* not ok, no code at all */
    kvt_l2_task_free(t);
}

static int key_id_of(const kvt_key *k)
{
    int i;
    memcpy(&i, k->hash, sizeof(i));
    return i;
}

static kvt_l2 *open_keeping_tags(const char *json, bool keep)
{
    struct kvt_l2_spec spec;
    char err[512];
    TEST_ASSERT(kvt_l2_spec_parse(json, 0, &spec, err, sizeof(err)) == 0);
    spec.keep_tags = keep;
    kvt_l2 *l2 = NULL;
    TEST_ASSERT(kvt_l2_open(&spec, &l2, err, sizeof(err)) == 0);
    kvt_l2_spec_free(&spec);
    return l2;
}

static void set_hook(kvt_l2 *l2, struct kvt_events *q)
{
    kvt_l2_set_event_hook(l2, &(struct kvt_tier_hook){.fn = kvt_events_hook,
                                                      .arg = q,
                                                      .tier = 1,
                                                      .tag_of = kvt_events_tag_of,
                                                      .tag = kvt_events_tag_hook});
}

/* Engine block hashes written with the objects: a reopened adapter that
 * keeps tags gives them to the events before announcing what it recovered
 * (here the scan ends before the hook is set: they wait for it); without
 * keep_tags the objects are named by their keys. Tagged headers are
 * bigger and still load. */
static void test_tags_persist(void)
{
    char spec[512];
    snprintf(spec, sizeof(spec), "{\"type\":\"fs\",\"base_path\":\"%s/tags\"}", dir);
    enum { N = 4, SZ = 1000 };
    static char src[N][SZ], dst[N][SZ];
    struct kvt_events *q;
    TEST_ASSERT(kvt_events_new(64, &q) == 0);
    kvt_l2 *l2 = open_keeping_tags(spec, true);
    wait_recovered(l2);
    set_hook(l2, q);
    kvt_l2_task *t = kvt_l2_task_new(KVT_L2_STORE, N);
    for (int i = 0; i < N; i++) {
        t->keys[i] = hkey("unit", "", 100 + i);
        if (i < N - 1) { /* the last key has no tag */
            struct kvt_blocktag *tg = kvt_blocktag_new(16, 20, 32, 320);
            memset(tg->hashes, 0xa0 + i, 20 * 32);
            for (int k = 0; k < 320; k++)
                tg->tokens[k] = (uint32_t)(i * 1000 + k);
            kvt_events_tag(q, &t->keys[i], tg);
        }
        fill(src[i], SZ, i);
        t->bufs[i].ptr = src[i];
        t->bufs[i].len = SZ;
        t->meta[i].len = SZ;
    }
    run_task(l2, t);
    TEST_ASSERT(kvt_bm_count(t->ok, N) == N);
    kvt_l2_task_free(t);
    struct kvt_l2_usage u;
    kvt_l2_usage(l2, &u);
    /* 20 hashes and 320 tokens: 120 + 4 + 8 + 640 + 4 + 1280 + 8 -> 2560 */
    TEST_ASSERT(u.objects == N && u.used_bytes == 3 * (SZ + 2560) + SZ + 512);
    struct kvt_event ev[16];
    uint32_t n = kvt_events_pop(q, ev, 16);
    TEST_ASSERT(n == N);
    for (uint32_t i = 0; i < n; i++)
        kvt_blocktag_put(ev[i].tag);
    close_adapter(l2);
    kvt_events_free(q); /* a new server: the table is gone */

    TEST_ASSERT(kvt_events_new(64, &q) == 0);
    l2 = open_keeping_tags(spec, true);
    wait_recovered(l2);
    pthread_mutex_lock(&l2->lock);
    TEST_ASSERT(l2->nearly == N - 1); /* read, waiting for the hook */
    pthread_mutex_unlock(&l2->lock);
    set_hook(l2, q);
    n = kvt_events_pop(q, ev, 16);
    TEST_ASSERT(n == N);
    for (uint32_t i = 0; i < n; i++) {
        int id = key_id_of(&ev[i].key) - 100;
        TEST_ASSERT(ev[i].ev == KVT_TIER_STORED && id >= 0 && id < N);
        if (id == N - 1) {
            TEST_ASSERT(!ev[i].tag);
        } else {
            TEST_ASSERT(ev[i].tag && ev[i].tag->nblocks == 20 && ev[i].tag->block_size == 16);
            TEST_ASSERT(ev[i].tag->hashes[0] == 0xa0 + id && ev[i].tag->hashes[639] == 0xa0 + id);
            TEST_ASSERT(ev[i].tag->ntokens == 320 && ev[i].tag->tokens[319] == id * 1000u + 319);
        }
        kvt_blocktag_put(ev[i].tag);
    }
    struct kvt_events_stats st;
    kvt_events_stats(q, &st);
    TEST_ASSERT(st.tagged == N - 1 && st.orphans == 0);
    /* the bytes load through the bigger headers */
    t = kvt_l2_task_new(KVT_L2_LOOKUP, N);
    for (int i = 0; i < N; i++)
        t->keys[i] = hkey("unit", "", 100 + i);
    run_task(l2, t);
    TEST_ASSERT(kvt_bm_count(t->ok, N) == N);
    kvt_l2_task_free(t);
    t = kvt_l2_task_new(KVT_L2_LOAD, N);
    for (int i = 0; i < N; i++) {
        t->keys[i] = hkey("unit", "", 100 + i);
        t->bufs[i].ptr = dst[i];
        t->bufs[i].len = SZ;
    }
    run_task(l2, t);
    TEST_ASSERT(kvt_bm_count(t->ok, N) == N);
    for (int i = 0; i < N; i++)
        TEST_ASSERT(t->bufs[i].len == SZ && memcmp(dst[i], src[i], SZ) == 0);
    kvt_l2_unlock(l2, t->keys, N);
    /* removals name the same hashes, and the table empties */
    TEST_ASSERT(kvt_l2_delete(l2, t->keys, N, NULL) == N);
    kvt_l2_task_free(t);
    n = kvt_events_pop(q, ev, 16);
    TEST_ASSERT(n == N);
    for (uint32_t i = 0; i < n; i++) {
        int id = key_id_of(&ev[i].key) - 100;
        TEST_ASSERT(ev[i].ev == KVT_TIER_REMOVED && (id == N - 1 ? !ev[i].tag : ev[i].tag != NULL));
        kvt_blocktag_put(ev[i].tag);
    }
    kvt_events_stats(q, &st);
    TEST_ASSERT(st.tagged == 0 && st.orphans == 0);
    close_adapter(l2);
    kvt_events_free(q);
}

/* A tagged object whose tag bytes were flipped on disk: the scan gives no
 * tag for it (it is named by its key), and its first lookup finds the
 * header corrupt: a miss, the file removed, never its bytes. */
static void test_corrupt_tag_on_disk(void)
{
    char spec[512], path[600], name[KVT_NAME_MAX + 1];
    snprintf(spec, sizeof(spec), "{\"type\":\"fs\",\"base_path\":\"%s/ctag\"}", dir);
    enum { SZ = 1000 };
    static char src[SZ];
    struct kvt_events *q;
    TEST_ASSERT(kvt_events_new(64, &q) == 0);
    kvt_l2 *l2 = open_keeping_tags(spec, true);
    wait_recovered(l2);
    set_hook(l2, q);
    kvt_l2_task *t = kvt_l2_task_new(KVT_L2_STORE, 1);
    t->keys[0] = hkey("unit", "", 7);
    struct kvt_blocktag *tg = kvt_blocktag_new(16, 4, 32, 0);
    memset(tg->hashes, 0x77, 4 * 32);
    kvt_events_tag(q, &t->keys[0], tg);
    fill(src, SZ, 7);
    t->bufs[0].ptr = src;
    t->bufs[0].len = SZ;
    t->meta[0].len = SZ;
    run_task(l2, t);
    TEST_ASSERT(kvt_bm_count(t->ok, 1) == 1);
    kvt_key k = t->keys[0];
    kvt_l2_task_free(t);
    struct kvt_event ev[4];
    TEST_ASSERT(kvt_events_pop(q, ev, 4) == 1 && ev[0].tag);
    kvt_blocktag_put(ev[0].tag);
    close_adapter(l2);
    kvt_events_free(q);
    /* one byte of the first hash (after 120 + 4 bytes of model, 8 of tag
     * fields) flipped */
    TEST_ASSERT(kvt_key_encode(KVT_CODEC_FS, &k, name) >= 0);
    snprintf(path, sizeof(path), "%s/ctag/%s", dir, name);
    FILE *f = fopen(path, "r+b");
    TEST_ASSERT(f && fseek(f, 120 + 4 + 8 + 5, SEEK_SET) == 0);
    TEST_ASSERT(fputc(0x76, f) != EOF && fclose(f) == 0);

    TEST_ASSERT(kvt_events_new(64, &q) == 0);
    l2 = open_keeping_tags(spec, true);
    wait_recovered(l2);
    set_hook(l2, q);
    TEST_ASSERT(kvt_events_pop(q, ev, 4) == 1 && ev[0].ev == KVT_TIER_STORED && !ev[0].tag);
    t = kvt_l2_task_new(KVT_L2_LOOKUP, 1);
    t->keys[0] = k;
    run_task(l2, t);
    TEST_ASSERT(kvt_bm_count(t->ok, 1) == 0);
    kvt_l2_task_free(t);
    TEST_ASSERT(access(path, F_OK) != 0);
    TEST_ASSERT(kvt_events_pop(q, ev, 4) == 1 && ev[0].ev == KVT_TIER_REMOVED && !ev[0].tag);
    close_adapter(l2);
    kvt_events_free(q);
}

int main(void)
{
    snprintf(dir, sizeof(dir), "/tmp/kvt-unit-fs-%d", (int)getpid());
    mkdir(dir, 0755);
    RUN(test_task_codes);
    RUN(test_contract);
    RUN(test_cap_and_eviction);
    RUN(test_store_over_cap_evicts);
    RUN(test_concurrent_stores_over_cap);
    RUN(test_tags_persist);
    RUN(test_corrupt_tag_on_disk);
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if (system(cmd)) {
    }
    return TEST_RESULT();
}
