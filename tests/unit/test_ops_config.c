/*
 * Description: cache.env parsing (quotes, expansions, defaults, .local
 * overrides, errors naming file:line and variable), the adapter JSON it
 * stands for, quotas.json forms and errors, and quota enforcement in the
 * L2 base through a real nixl_store_dynamic adapter: a write over its
 * namespace quota is refused and counted, other namespaces are not
 * affected, the quota pass of the eviction controller brings a namespace
 * under its watermark, status reports quota and use.
 */
#include "l2_harness.h"

#include "kvtier/error.h"
#include "ops/envcfg.h"
#include "l2/kit/quota.h"

#include <stdlib.h>
#include <sys/stat.h>

static char dir[256];

static void write_file(const char *name, const char *text)
{
    char p[512];
    snprintf(p, sizeof(p), "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    TEST_ASSERT(f != NULL);
    fputs(text, f);
    fclose(f);
}

static int load(const char *text, const char *local, struct kvt_envcfg *c, char *err)
{
    write_file("cache.env", text);
    char p[512];
    snprintf(p, sizeof(p), "%s/cache.env.local", dir);
    unlink(p);
    if (local)
        write_file("cache.env.local", local);
    snprintf(p, sizeof(p), "%s/cache.env", dir);
    return kvt_envcfg_load(p, c, err, 1024);
}

static void test_envcfg(void)
{
    struct kvt_envcfg c;
    char err[1024];
    setenv("KVT_TEST_BASE", "/data/nvme", 1);
    unsetenv("KVT_TEST_UNSET");
    write_file("quotas.json", "{\"--models--a\": 2}");
    TEST_ASSERT(load("# the seed's variables\n"
                     "export KVP_CACHE_ROOT=\"${KVT_TEST_BASE}/kv cache\"   # quoted, expanded\n"
                     "KVP_CACHE_BUDGET_GB=${KVT_TEST_UNSET:-750}\n"
                     "KVP_EVICTION_POLICY='value'\n"
                     "KVP_QUOTAS_FILE=quotas.json\n"
                     "OTHER_TOOL=$KVT_TEST_BASE/x\n"
                     "\n",
                     "KVP_CACHE_BUDGET_GB=100\nKVP_USE_DIRECT_IO=true\n", &c, err) == 0);
    TEST_ASSERT(strcmp(c.root, "/data/nvme/kv cache") == 0);
    TEST_ASSERT(c.budget_gb == 100); /* .local wins */
    TEST_ASSERT(strcmp(c.policy, "value") == 0 && c.direct_io);
    TEST_ASSERT(c.watermark == 0.9 && c.ratio == 0.1 && c.half_life_h == 0);
    char want[600];
    snprintf(want, sizeof(want), "%s/quotas.json", dir); /* relative to the file */
    TEST_ASSERT(strcmp(c.quotas, want) == 0);
    TEST_ASSERT(strcmp(c.url, "tcp://127.0.0.1:5555") == 0 && !c.url_set);
    TEST_ASSERT(strstr(json_string_value(json_object_get(c.sources, "KVP_CACHE_BUDGET_GB")),
                       "cache.env.local:1") != NULL);
    char *js = kvt_envcfg_adapter_json(&c);
    json_t *j = json_loads(js, 0, NULL);
    TEST_ASSERT(strcmp(json_string_value(json_object_get(j, "type")), "nixl_store_dynamic") == 0);
    json_t *bp = json_object_get(j, "backend_params");
    TEST_ASSERT(json_real_value(json_object_get(bp, "max_capacity_gb")) == 100);
    TEST_ASSERT(strcmp(json_string_value(
                           json_object_get(json_object_get(j, "eviction"), "eviction_policy")),
                       "value") == 0);
    /* the file's absolute path: the adapter reads it again (checked here
     * first), and the admin API writes quotas set at run time back there */
    TEST_ASSERT(strcmp(json_string_value(json_object_get(j, "namespace_quotas")), want) == 0);
    TEST_ASSERT(json_integer_value(json_object_get(c.quotas_bytes, "--models--a")) == 2LL << 30);
    json_decref(j);
    free(js);
    kvt_envcfg_free(&c);

    /* cache.env.local sets KVP_QUOTAS_FILE again: the last one holds, and
     * empty means none (no namespace_quotas for the adapter) */
    TEST_ASSERT(load("KVP_CACHE_ROOT=/d\nKVP_QUOTAS_FILE=quotas.json\n", "KVP_QUOTAS_FILE=\n", &c,
                     err) == 0);
    TEST_ASSERT(c.quotas_bytes == NULL);
    js = kvt_envcfg_adapter_json(&c);
    j = json_loads(js, 0, NULL);
    TEST_ASSERT(j && json_object_get(j, "namespace_quotas") == NULL);
    json_decref(j);
    free(js);
    kvt_envcfg_free(&c);

    /* defaults: only the root is required */
    TEST_ASSERT(load("KVP_CACHE_ROOT=/d\n", NULL, &c, err) == 0);
    TEST_ASSERT(c.budget_gb == 1500 && strcmp(c.policy, "LRU") == 0 && c.num_workers == 4);
    kvt_envcfg_free(&c);

    const char *bad[][3] = {
        {"KVP_CACHE_BUDGET_GB=10\n", "KVP_CACHE_ROOT", "is required"},
        {"KVP_CACHE_ROOT=/d\nKVP_CACHE_BUDGET=10\n", "cache.env:2: KVP_CACHE_BUDGET", "unknown"},
        {"KVP_CACHE_ROOT=/d\nKVP_CACHE_BUDGET_GB=ten\n", "cache.env:2: KVP_CACHE_BUDGET_GB",
         "got 'ten'"},
        {"KVP_CACHE_ROOT=/d\nKVP_TRIGGER_WATERMARK=1.5\n", "KVP_TRIGGER_WATERMARK", "[0, 1]"},
        {"KVP_CACHE_ROOT=/d\nKVP_EVICTION_POLICY=MRU\n", "KVP_EVICTION_POLICY", "LRU, ARC, LFU"},
        {"KVP_CACHE_ROOT=/d\nKVP_VALUE_HALF_LIFE_HOURS=-1\n", "KVP_VALUE_HALF_LIFE_HOURS", ">= 0"},
        {"KVP_CACHE_ROOT=/d\nKVP_USE_DIRECT_IO=maybe\n", "KVP_USE_DIRECT_IO", "true or false"},
        {"KVP_CACHE_ROOT=/d\nKVP_QUOTAS_FILE=nope.json\n", "cache.env:2: KVP_QUOTAS_FILE",
         "cannot read quotas file"},
        {"KVP_CACHE_ROOT=$KVT_TEST_UNSET/x\n", "cache.env:1", "is not set"},
        {"KVP_CACHE_ROOT = /d\n", "cache.env:1", "NAME=VALUE"},
        {"KVP_CACHE_ROOT=\"/d\n", "cache.env:1", "unterminated"},
        {"KVP_CACHE_ROOT=$(rm -rf /)\n", "cache.env:1", "not supported"},
        {"KVP_CACHE_ROOT=/d extra\n", "cache.env:1", "unexpected text"},
        {"KVP_CACHE_ROOT=/\n", "KVP_CACHE_ROOT", "not a cache directory"},
        {"KVP_CACHE_ROOT=/d\nKVP_SERVER_URL=http://x\n", "KVP_SERVER_URL", "tcp://"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int rc = load(bad[i][0], NULL, &c, err);
        if (rc == 0 || !strstr(err, bad[i][1]) || !strstr(err, bad[i][2]))
            fprintf(stderr, "case %zu: rc %d: %s\n", i, rc, err);
        TEST_ASSERT(rc == KVT_E_CONFIG && strstr(err, bad[i][1]) && strstr(err, bad[i][2]));
    }
    /* a missing file names itself */
    TEST_ASSERT(kvt_envcfg_load("/nonexistent/cache.env", &c, err, sizeof(err)) == KVT_E_CONFIG &&
                strstr(err, "/nonexistent/cache.env"));
}

static void test_quota_parse(void)
{
    char err[400];
    json_t *out = NULL;
    json_t *v = json_loads("{\"--models--A--v1\": 200, \"/models/B/v2\": {\"max_gb\": \"0.5\"}, "
                           "\"C\": {\"max_bytes\": 1000}, \"D\": \"2\", "
                           "\"E\": {\"max_bytes\": 5000000000000}}",
                           0, NULL);
    TEST_ASSERT(kvt_quota_parse(v, &out, err, sizeof(err)) == 0);
    TEST_ASSERT(json_integer_value(json_object_get(out, "--models--A--v1")) == 200ll << 30);
    TEST_ASSERT(json_integer_value(json_object_get(out, "--models--B--v2")) == 512ll << 20);
    TEST_ASSERT(json_integer_value(json_object_get(out, "C")) == 1000);
    TEST_ASSERT(json_integer_value(json_object_get(out, "D")) == 2ll << 30);
    /* bytes are not bounded as GiB are (1e9): 5 TB was refused */
    TEST_ASSERT(json_integer_value(json_object_get(out, "E")) == 5000000000000ll);
    json_decref(out);
    json_decref(v);
    const char *bad[][2] = {
        {"[1]", "must be an object"},
        {"{\"A\": -1}", "number of GiB"},
        {"{\"A\": {\"max_gb\": 1, \"max_bytes\": 2}}", "exactly one"},
        {"{\"A\": {\"limit\": 1}}", "unknown field"},
        {"{\"A@salt\": 1}", "not a namespace name"},
        {"{\"/m/x\": 1, \"--m--x\": 2}", "given twice"},
        {"\"/nonexistent/quotas.json\"", "cannot read quotas file"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        v = json_loads(bad[i][0], JSON_DECODE_ANY, NULL);
        out = NULL;
        TEST_ASSERT(kvt_quota_parse(v, &out, err, sizeof(err)) == KVT_E_CONFIG && out == NULL);
        if (!strstr(err, bad[i][1]))
            fprintf(stderr, "%s -> %s\n", bad[i][0], err);
        TEST_ASSERT(strstr(err, bad[i][1]) != NULL);
        json_decref(v);
    }
    /* names: a model is 1..128 bytes; a namespace name of a model with '/'
     * may be longer (each "--" one byte of the model) */
    char name[300], js[400];
    memset(name, 'm', 129);
    name[129] = 0;
    snprintf(js, sizeof(js), "{\"%s\": 1}", name);
    v = json_loads(js, 0, NULL);
    out = NULL;
    TEST_ASSERT(kvt_quota_parse(v, &out, err, sizeof(err)) == KVT_E_CONFIG && out == NULL);
    TEST_ASSERT(strstr(err, "not a namespace name") && strstr(err, "128"));
    json_decref(v);
    for (int i = 0; i < 60; i++)
        memcpy(name + 3 * i, "--m", 3); /* 180 bytes: the model "/m" x 60, 120 bytes */
    name[180] = 0;
    snprintf(js, sizeof(js), "{\"%s\": 1}", name);
    v = json_loads(js, 0, NULL);
    out = NULL;
    TEST_ASSERT(kvt_quota_parse(v, &out, err, sizeof(err)) == 0);
    TEST_ASSERT(json_integer_value(json_object_get(out, name)) == 1ll << 30);
    json_decref(out);
    json_decref(v);
    v = json_loads("{\"A\\u0001\": 1}", 0, NULL);
    out = NULL;
    TEST_ASSERT(kvt_quota_parse(v, &out, err, sizeof(err)) == KVT_E_CONFIG &&
                strstr(err, "control"));
    json_decref(v);
}

#define OBJ 300000u

static uint64_t store_one(kvt_l2 *l2, const char *model, int i, int *rc)
{
    static uint8_t payload[OBJ];
    kvt_l2_task *t = kvt_l2_task_new(KVT_L2_STORE, 1);
    t->keys[0] = hkey(model, "", i);
    t->bufs[0].ptr = payload;
    t->bufs[0].len = OBJ;
    t->meta[0].len = OBJ;
    run_task(l2, t);
    uint64_t ok = kvt_bm_test(t->ok, 0);
    *rc = atomic_load(&t->err);
    kvt_l2_task_free(t);
    return ok;
}

/* Whether key i of model is in the adapter's index (a lookup; the pin it
 * takes on a hit is released). */
static bool has_key(kvt_l2 *l2, const char *model, int i)
{
    kvt_l2_task *t = kvt_l2_task_new(KVT_L2_LOOKUP, 1);
    t->keys[0] = hkey(model, "", i);
    run_task(l2, t);
    bool hit = kvt_bm_test(t->ok, 0);
    if (hit)
        kvt_l2_unlock(l2, t->keys, 1);
    kvt_l2_task_free(t);
    return hit;
}

/* issue 18: quota names resolve to the injective namespace names of key.c */
static void test_quota_names_escaped(void)
{
    char ns[300];
    TEST_ASSERT(kvt_quota_ns_name("/models/a-b/v1", ns, sizeof(ns)) > 0 &&
                strcmp(ns, "--models--a-b--v1") == 0);
    TEST_ASSERT(kvt_quota_ns_name("x--y", ns, sizeof(ns)) > 0 && strcmp(ns, "x--y") == 0);
    TEST_ASSERT(kvt_quota_ns_name("x%2D-y", ns, sizeof(ns)) > 0 && strcmp(ns, "x%2D-y") == 0);
    TEST_ASSERT(kvt_quota_ns_name("50%", ns, sizeof(ns)) > 0 && strcmp(ns, "50%25") == 0);
    TEST_ASSERT(kvt_quota_ns_name("a-/b", ns, sizeof(ns)) > 0 && strcmp(ns, "a%2D--b") == 0);
    /* the model x--y and the namespace of x/y are two quotas */
    char err[400];
    json_t *out = NULL;
    json_t *v = json_loads("{\"x/y\": 1, \"x%2D-y\": 2}", 0, NULL);
    TEST_ASSERT(kvt_quota_parse(v, &out, err, sizeof(err)) == 0);
    TEST_ASSERT(json_integer_value(json_object_get(out, "x--y")) == 1ll << 30);
    TEST_ASSERT(json_integer_value(json_object_get(out, "x%2D-y")) == 2ll << 30);
    json_decref(out);
    json_decref(v);
}

static void test_quota_enforced(void)
{
    char spec[1024];
    snprintf(spec, sizeof(spec),
             "{\"type\": \"nixl_store_dynamic\", \"backend\": \"POSIX\", \"backend_params\": "
             "{\"file_path\": \"%s/q\", \"max_capacity_gb\": 1}, \"eviction\": "
             "{\"eviction_policy\": \"LRU\", \"trigger_watermark\": 0.9, \"eviction_ratio\": 0.1}, "
             "\"namespace_quotas\": {\"/models/qa\": {\"max_bytes\": 1000000}}}",
             dir);
    kvt_l2 *l2 = open_adapter(spec);
    wait_recovered(l2);
    int rc;
    uint64_t stored = OBJ + 512; /* header + payload */
    for (int i = 0; i < 3; i++)
        TEST_ASSERT(store_one(l2, "/models/qa", i, &rc) == 1);
    TEST_ASSERT(store_one(l2, "/models/qa", 3, &rc) == 0 && rc == KVT_E_LIMIT);
    TEST_ASSERT(store_one(l2, "/models/qa", 4, &rc) == 0 && rc == KVT_E_LIMIT);
    for (int i = 0; i < 5; i++) /* another namespace: only the adapter cap applies */
        TEST_ASSERT(store_one(l2, "/models/qb", i, &rc) == 1);
    TEST_ASSERT(atomic_load(&l2->counters.quota_rejections) == 2);
    TEST_ASSERT(atomic_load(&l2->counters.rejected_writes) == 2);
    json_t *st = kvt_l2_status(l2);
    json_t *q = json_object_get(json_object_get(st, "namespace_quotas"), "--models--qa");
    TEST_ASSERT(q &&
                json_integer_value(json_object_get(q, "used_bytes")) == (json_int_t)(3 * stored));
    TEST_ASSERT(json_integer_value(json_object_get(q, "quota_bytes")) == 1000000);
    TEST_ASSERT(json_integer_value(json_object_get(q, "rejected_writes")) == 2);
    json_decref(st);
    /* the eviction controller's quota pass: 901536 >= 0.9 x 1e6, so the
     * namespace loses 10% of its bytes (one object, the least recent) */
    uint64_t freed = kvt_l2_evict_quotas(l2, 256);
    TEST_ASSERT(freed == stored);
    TEST_ASSERT(atomic_load(&l2->counters.quota_evictions) == 1);
    pthread_mutex_lock(&l2->lock);
    TEST_ASSERT(l2->quotas[0].used == 2 * stored);
    TEST_ASSERT(l2->used_bytes == 7 * stored); /* qb untouched */
    pthread_mutex_unlock(&l2->lock);
    /* the one evicted is the least recent (qa 0); qa's others and qb stay */
    TEST_ASSERT(!has_key(l2, "/models/qa", 0));
    TEST_ASSERT(has_key(l2, "/models/qa", 1) && has_key(l2, "/models/qa", 2));
    for (int i = 0; i < 5; i++)
        TEST_ASSERT(has_key(l2, "/models/qb", i));
    TEST_ASSERT(store_one(l2, "/models/qa", 3, &rc) == 1); /* room again */
    close_adapter(l2);

    /* restart: the quota counts the files found by the scan */
    l2 = open_adapter(spec);
    wait_recovered(l2);
    pthread_mutex_lock(&l2->lock);
    TEST_ASSERT(l2->quotas[0].used == 3 * stored);
    pthread_mutex_unlock(&l2->lock);
    TEST_ASSERT(store_one(l2, "/models/qa", 9, &rc) == 0 && rc == KVT_E_LIMIT);
    close_adapter(l2);
}

int main(void)
{
    snprintf(dir, sizeof(dir), "/tmp/kvt-opscfg-%d", (int)getpid());
    TEST_ASSERT(mkdir(dir, 0755) == 0);
    RUN(test_envcfg);
    RUN(test_quota_parse);
    RUN(test_quota_names_escaped);
    RUN(test_quota_enforced);
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    TEST_ASSERT(system(cmd) == 0);
    return TEST_RESULT();
}
