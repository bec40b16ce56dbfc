/*
 * Description: the table of eviction policies (policy.h, registry.c): every
 * descriptor is complete, the names accepted before are all there (a new
 * policy needs no change here); every name round-trips, in any case, through
 * kvt_policy_find, kvt_policy_create and an adapter's "eviction" object (the
 * policy built and its description carry the canonical name); an unknown
 * name is refused by each of them, the messages naming every known policy;
 * the flags give kvtier replay every policy but noop and cache.env the ones
 * it offered before (LRU, ARC, LFU, value); a policy's own fields are
 * refused for the others and listed in the unknown-field message.
 */
#include "test.h"

#include "kvtier/error.h"
#include "policy/policy.h"

#include <ctype.h>
#include <string.h>
#include <strings.h>

static size_t count(void)
{
    size_t n = 0;
    while (kvt_policy_at(n))
        n++;
    return n;
}

static void recase(const char *in, char *out, size_t cap, int (*f)(int))
{
    size_t i = 0;
    for (; in[i] && i + 1 < cap; i++)
        out[i] = (char)f((unsigned char)in[i]);
    out[i] = 0;
}

static void test_descriptors_are_complete_and_unique(void)
{
    size_t n = count();
    TEST_ASSERT(n >= 6);
    for (size_t i = 0; i < n; i++) {
        const struct kvt_policy_desc *d = kvt_policy_at(i);
        TEST_ASSERT(d->name && d->name[0] && strlen(d->name) < 16);  /* fits kvt_server_cfg */
        TEST_ASSERT(d->help && d->help[0] && strlen(d->help) <= 44); /* one --help line */
        TEST_ASSERT(d->create != NULL);
        TEST_ASSERT(!d->fields == !d->parse); /* own fields come with their parser */
        for (size_t j = 0; j < i; j++)
            TEST_ASSERT(strcasecmp(d->name, kvt_policy_at(j)->name) != 0);
    }
    TEST_ASSERT(kvt_policy_at(n) == NULL);
    /* the names accepted before the table, each under its canonical name */
    const char *before[] = {"LRU", "ARC", "LFU", "value", "adaptive", "noop"};
    for (size_t i = 0; i < 6; i++)
        TEST_ASSERT(kvt_policy_find(before[i]) &&
                    !strcmp(kvt_policy_find(before[i])->name, before[i]));
    /* kvt_policy_names: the table's names, in its order */
    char want[256] = "";
    for (size_t i = 0; i < n; i++)
        snprintf(want + strlen(want), sizeof(want) - strlen(want), "%s%s", i ? ", " : "",
                 kvt_policy_at(i)->name);
    TEST_ASSERT(strcmp(kvt_policy_names(), want) == 0);
}

static void test_every_name_round_trips(void)
{
    const struct kvt_policy_desc *d;
    for (size_t i = 0; (d = kvt_policy_at(i)); i++) {
        char lower[32], upper[32];
        recase(d->name, lower, sizeof(lower), tolower);
        recase(d->name, upper, sizeof(upper), toupper);
        const char *spellings[] = {d->name, lower, upper};
        for (size_t s = 0; s < 3; s++) {
            TEST_ASSERT(kvt_policy_find(spellings[s]) == d);
            struct kvt_policy *p = kvt_policy_create(spellings[s], 0.7, 0.3);
            TEST_ASSERT(p && strcmp(p->ops->name, d->name) == 0);
            TEST_ASSERT(p->trigger_watermark == 0.7 && p->eviction_ratio == 0.3);
            kvt_policy_destroy(p);
            /* an adapter's "eviction" object */
            json_t *ev = json_pack("{s:s}", "eviction_policy", spellings[s]);
            struct kvt_policy_cfg cfg;
            char err[512] = "";
            TEST_ASSERT(kvt_policy_parse(ev, &cfg, err, sizeof(err)) == 0 && cfg.desc == d);
            TEST_ASSERT(cfg.watermark == 0.8 && cfg.ratio == 0.2); /* the defaults */
            p = kvt_policy_build(&cfg);
            json_t *desc = kvt_policy_describe(p);
            TEST_ASSERT(
                strcmp(json_string_value(json_object_get(desc, "eviction_policy")), d->name) == 0);
            json_decref(desc);
            kvt_policy_destroy(p);
            json_decref(ev);
        }
        TEST_ASSERT(strstr(kvt_policy_names(), d->name) != NULL);
    }
}

static void test_unknown_name_is_refused_naming_the_known(void)
{
    const char *bad[] = {"MRU", "", "lru ", "LFUDA", "none"};
    for (size_t b = 0; b < sizeof(bad) / sizeof(bad[0]); b++) {
        TEST_ASSERT(kvt_policy_find(bad[b]) == NULL);
        TEST_ASSERT(kvt_policy_create(bad[b], 0.8, 0.2) == NULL);
        json_t *ev = json_pack("{s:s}", "eviction_policy", bad[b]);
        struct kvt_policy *p = NULL;
        char err[512] = "";
        TEST_ASSERT(kvt_policy_from_json(ev, &p, err, sizeof(err)) == KVT_E_CONFIG && !p);
        TEST_ASSERT(strstr(err, "\"eviction.eviction_policy\": unknown policy") != NULL);
        const struct kvt_policy_desc *d;
        for (size_t i = 0; (d = kvt_policy_at(i)); i++)
            TEST_ASSERT(strstr(err, d->name) != NULL);
        json_decref(ev);
    }
    /* missing, or not a string: the known names too */
    const char *objs[] = {"{}", "{\"eviction_policy\": 3}"};
    for (size_t i = 0; i < 2; i++) {
        json_t *ev = json_loads(objs[i], 0, NULL);
        struct kvt_policy *p = NULL;
        char err[512] = "";
        TEST_ASSERT(kvt_policy_from_json(ev, &p, err, sizeof(err)) == KVT_E_CONFIG && !p);
        TEST_ASSERT(strstr(err, kvt_policy_names()) != NULL);
        json_decref(ev);
    }
}

static bool has(const char *name, unsigned flag)
{
    const struct kvt_policy_desc *d = kvt_policy_find(name);
    return d && (d->flags & flag);
}

static void test_flags(void)
{
    /* kvtier replay compares every policy that keeps an order: not noop */
    const char *ordered[] = {"LRU", "ARC", "LFU", "value", "adaptive"};
    for (size_t i = 0; i < 5; i++)
        TEST_ASSERT(!has(ordered[i], KVT_POLICY_NO_ORDER));
    TEST_ASSERT(has("noop", KVT_POLICY_NO_ORDER));
    /* cache.env offers what it offered before the table */
    const char *env[] = {"LRU", "ARC", "LFU", "value"};
    for (size_t i = 0; i < 4; i++)
        TEST_ASSERT(has(env[i], KVT_POLICY_CACHE_ENV));
    TEST_ASSERT(!has("adaptive", KVT_POLICY_CACHE_ENV) && !has("noop", KVT_POLICY_CACHE_ENV));
}

static void test_own_fields(void)
{
    char err[512] = "";
    struct kvt_policy *p = NULL;
    json_t *ev = json_loads("{\"eviction_policy\": \"ARC\", \"cost_weight\": 1}", 0, NULL);
    TEST_ASSERT(kvt_policy_from_json(ev, &p, err, sizeof(err)) == KVT_E_CONFIG && !p);
    TEST_ASSERT(strcmp(err, "\"eviction.cost_weight\" applies to eviction_policy \"value\" only") ==
                0);
    json_decref(ev);
    ev = json_loads("{\"eviction_policy\": \"LRU\", \"decay\": 1}", 0, NULL);
    TEST_ASSERT(kvt_policy_from_json(ev, &p, err, sizeof(err)) == KVT_E_CONFIG && !p);
    TEST_ASSERT(strcmp(err, "\"eviction.decay\": unknown field (known: eviction_policy, "
                            "trigger_watermark, eviction_ratio; for \"value\": half_life_hours, "
                            "reuse_weight, length_weight, cost_weight, follow_recency)") == 0);
    json_decref(ev);
    /* a message cut to the caller's buffer stays a string */
    char small[24];
    ev = json_loads("{\"eviction_policy\": \"LRU\", \"decay\": 1}", 0, NULL);
    TEST_ASSERT(kvt_policy_from_json(ev, &p, small, sizeof(small)) == KVT_E_CONFIG);
    TEST_ASSERT(strlen(small) == sizeof(small) - 1);
    json_decref(ev);
}

int main(void)
{
    RUN(test_descriptors_are_complete_and_unique);
    RUN(test_every_name_round_trips);
    RUN(test_unknown_name_is_refused_naming_the_known);
    RUN(test_flags);
    RUN(test_own_fields);
    return TEST_RESULT();
}
