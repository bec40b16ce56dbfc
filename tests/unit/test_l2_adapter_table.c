/*
 * Description: the table of L2 adapter types (adapters.h, registry.c): every
 * descriptor is complete and its name unique, the types accepted before are
 * all there (a new adapter needs no change here), "known types" lists the
 * table; an unknown type is refused naming every type; what is type-specific
 * comes from the descriptors: where a spec stores (a wrapper answers for its
 * inner adapter), which types share a budget (the refusal lists them) and the
 * longest eviction interval with a shared budget.
 */
#include "test.h"

#include "kvtier/error.h"
#include "l2/adapters.h"

#include <string.h>

static size_t count(void)
{
    size_t n = 0;
    while (kvt_l2_adapter_at(n))
        n++;
    return n;
}

static void test_descriptors_are_complete_and_unique(void)
{
    size_t n = count();
    TEST_ASSERT(n >= 12);
    char want[512] = "";
    for (size_t i = 0; i < n; i++) {
        const struct kvt_l2_adapter_desc *d = kvt_l2_adapter_at(i);
        TEST_ASSERT(d->name && d->name[0] && strlen(d->name) < 32); /* fits kvt_l2_spec.type */
        TEST_ASSERT(d->opts_size > 0 && d->parse && d->open);
        /* what a type needs beside "shared_budget" only with the hook */
        TEST_ASSERT(d->shared_budget || !d->shared_budget_needs);
        TEST_ASSERT(d->budget_max_interval_ms >= 0);
        TEST_ASSERT(d->shared_budget || d->budget_max_interval_ms == 0);
        for (size_t j = 0; j < i; j++)
            TEST_ASSERT(strcmp(d->name, kvt_l2_adapter_at(j)->name) != 0);
        snprintf(want + strlen(want), sizeof(want) - strlen(want), "%s%s", i ? ", " : "", d->name);
    }
    TEST_ASSERT(kvt_l2_adapter_at(n) == NULL);
    TEST_ASSERT(strcmp(kvt_l2_types(), want) == 0);
    const char *before[] = {
        "fs",   "fs_native", "mock", "nixl_store_dynamic", "nixl_store",  "raw_block", "dax",
        "resp", "valkey",    "s3",   "mooncake_store",     "fault_inject"};
    for (size_t i = 0; i < sizeof(before) / sizeof(before[0]); i++) {
        bool found = false;
        for (size_t j = 0; j < n && !found; j++)
            found = strcmp(kvt_l2_adapter_at(j)->name, before[i]) == 0;
        TEST_ASSERT(found);
    }
}

static void test_unknown_type_names_every_type(void)
{
    struct kvt_l2_spec s;
    char err[1024];
    int rc = kvt_l2_spec_parse("{\"type\": \"tape\"}", 3, &s, err, sizeof(err));
    TEST_ASSERT(rc == KVT_E_CONFIG);
    TEST_ASSERT(strstr(err, "--l2-adapter #3: unknown type \"tape\"") != NULL);
    for (size_t i = 0; kvt_l2_adapter_at(i); i++)
        TEST_ASSERT(strstr(err, kvt_l2_adapter_at(i)->name) != NULL);
}

static void test_storage_comes_from_the_descriptor(void)
{
    struct kvt_l2_spec s;
    char err[1024];
    const char *field = NULL;
    bool is_dir = false;
    TEST_ASSERT(kvt_l2_spec_parse("{\"type\": \"fs\", \"base_path\": \"/tmp/kvt-a\"}", 0, &s, err,
                                  sizeof(err)) == 0);
    const char *p = kvt_l2_spec_storage(&s, &field, &is_dir);
    TEST_ASSERT(p && !strcmp(p, "/tmp/kvt-a") && !strcmp(field, "base_path") && is_dir);
    kvt_l2_spec_free(&s);
    TEST_ASSERT(
        kvt_l2_spec_parse(
            "{\"type\": \"fault_inject\", \"inner\": {\"type\": \"dax\", "
            "\"device_path\": \"/tmp/kvt-d\", \"max_dax_size_gb\": 1, \"slot_bytes\": 4096}}",
            0, &s, err, sizeof(err)) == 0);
    p = kvt_l2_spec_storage(&s, &field, &is_dir);
    TEST_ASSERT(p && !strcmp(p, "/tmp/kvt-d") && !strcmp(field, "device_path") && !is_dir);
    kvt_l2_spec_free(&s);
    TEST_ASSERT(kvt_l2_spec_parse("{\"type\": \"resp\", \"host\": \"127.0.0.1\"}", 0, &s, err,
                                  sizeof(err)) == 0);
    TEST_ASSERT(kvt_l2_spec_storage(&s, &field, &is_dir) == NULL);
    kvt_l2_spec_free(&s);
}

static void test_shared_budget_comes_from_the_descriptor(void)
{
    struct kvt_l2_spec s;
    char err[1024];
    /* refused on a type without the hook, naming the types that have one */
    int rc = kvt_l2_spec_parse("{\"type\": \"mock\", \"max_size_gb\": 1, \"mock_bandwidth_gb\": 1, "
                               "\"shared_budget\": true}",
                               0, &s, err, sizeof(err));
    TEST_ASSERT(rc == KVT_E_CONFIG && strstr(err, "is for tiers several servers share") &&
                strstr(err, "(not mock)"));
    for (size_t i = 0; kvt_l2_adapter_at(i); i++)
        if (kvt_l2_adapter_at(i)->shared_budget)
            TEST_ASSERT(strstr(err, kvt_l2_adapter_at(i)->name) != NULL);
    /* a directory type needs "shared": true */
    rc = kvt_l2_spec_parse("{\"type\": \"fs\", \"base_path\": \"/tmp/kvt-b\", \"max_capacity_gb\": "
                           "1, \"shared_budget\": true}",
                           0, &s, err, sizeof(err));
    TEST_ASSERT(rc == KVT_E_CONFIG && strstr(err, "needs \"shared\": true"));
    rc = kvt_l2_spec_parse("{\"type\": \"fs\", \"base_path\": \"/tmp/kvt-b\", \"max_capacity_gb\": "
                           "1, \"shared\": true, \"shared_budget\": true}",
                           0, &s, err, sizeof(err));
    TEST_ASSERT(rc == 0 && kvt_l2_spec_max_interval_ms(&s) == 0);
    kvt_l2_spec_free(&s);
    /* a record on a remote tier: the eviction interval is bounded by its lease */
    rc =
        kvt_l2_spec_parse("{\"type\": \"valkey\", \"host\": \"127.0.0.1\", \"max_capacity_gb\": 1, "
                          "\"shared_budget\": true}",
                          0, &s, err, sizeof(err));
    TEST_ASSERT(rc == 0 && kvt_l2_spec_max_interval_ms(&s) == KVT_L2_BUDGET_LEASE_MS / 3);
    kvt_l2_spec_free(&s);
    rc = kvt_l2_spec_parse("{\"type\": \"valkey\", \"host\": \"127.0.0.1\"}", 0, &s, err,
                           sizeof(err));
    TEST_ASSERT(rc == 0 && kvt_l2_spec_max_interval_ms(&s) == 0);
    kvt_l2_spec_free(&s);
}

int main(void)
{
    RUN(test_descriptors_are_complete_and_unique);
    RUN(test_unknown_type_names_every_type);
    RUN(test_storage_comes_from_the_descriptor);
    RUN(test_shared_budget_comes_from_the_descriptor);
    return TEST_RESULT();
}
