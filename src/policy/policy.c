/* Policy registry, the "eviction" config block, and the noop policy. */
#include "policy/policy.h"
#include "common/util.h"
#include "kvtier/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static void noop_insert(struct kvt_policy *p, uint32_t h, bool cold,
                        const struct kvt_policy_hint *hint)
{
    (void)p, (void)h, (void)cold, (void)hint;
}
static void noop_h(struct kvt_policy *p, uint32_t h)
{
    (void)p, (void)h;
}
static void noop_walk(struct kvt_policy *p, bool (*visit)(uint32_t, void *), void *arg)
{
    (void)p, (void)visit, (void)arg;
}
static void noop_reserve(struct kvt_policy *p, uint32_t n)
{
    p->nhandles = n;
}
static void noop_destroy(struct kvt_policy *p)
{
    free(p);
}

static const struct kvt_policy_ops noop_ops = {
    .name = "noop",
    .insert = noop_insert,
    .access = noop_h,
    .remove = noop_h,
    .walk = noop_walk,
    .reserve = noop_reserve,
    .destroy = noop_destroy,
};

const char *kvt_policy_names(void)
{
    return "LRU, ARC, LFU, adaptive, noop, value";
}

struct kvt_policy *kvt_policy_create(const char *name, double watermark, double ratio)
{
    struct kvt_policy *p = NULL;
    if (strcasecmp(name, "LRU") == 0) {
        p = kvt_lru_create();
    } else if (strcasecmp(name, "ARC") == 0) {
        p = kvt_arc_create();
    } else if (strcasecmp(name, "LFU") == 0) {
        p = kvt_lfu_create();
    } else if (strcasecmp(name, "adaptive") == 0) {
        p = kvt_adaptive_create();
    } else if (strcasecmp(name, "value") == 0) {
        p = kvt_value_create(NULL);
    } else if (strcasecmp(name, "noop") == 0) {
        p = kvt_xcalloc(1, sizeof(*p));
        p->ops = &noop_ops;
    }
    if (p) {
        p->trigger_watermark = watermark;
        p->eviction_ratio = ratio;
    }
    return p;
}

void kvt_policy_destroy(struct kvt_policy *p)
{
    if (p)
        p->ops->destroy(p);
}

void kvt_policy_reserve(struct kvt_policy *p, uint32_t n)
{
    if (p && n > p->nhandles)
        p->ops->reserve(p, n);
}

/* A number in [0, 1], given as a JSON number or a numeric string. */
static int unit_interval(const json_t *v, double *out)
{
    double d;
    if (json_is_number(v)) {
        d = json_number_value(v);
    } else if (json_is_string(v)) {
        char *end;
        d = strtod(json_string_value(v), &end);
        if (*end || end == json_string_value(v))
            return -1;
    } else {
        return -1;
    }
    if (!(d >= 0 && d <= 1))
        return -1;
    *out = d;
    return 0;
}

/* A finite number >= 0, given as a JSON number or a numeric string. */
static int nonneg(const json_t *v, double *out)
{
    double d;
    if (json_is_number(v)) {
        d = json_number_value(v);
    } else if (json_is_string(v)) {
        char *end;
        d = strtod(json_string_value(v), &end);
        if (*end || end == json_string_value(v))
            return -1;
    } else {
        return -1;
    }
    if (!(d >= 0 && d < 1e12))
        return -1;
    *out = d;
    return 0;
}

static const char *const value_keys[] = {"half_life_hours", "reuse_weight",   "length_weight",
                                         "cost_weight",     "follow_recency", NULL};
enum { NUMERIC_VALUE_KEYS = 4 }; /* the first ones; then the boolean */

static bool is_value_key(const char *k)
{
    for (int i = 0; value_keys[i]; i++)
        if (strcmp(k, value_keys[i]) == 0)
            return true;
    return false;
}

/* The value policy's optional keys; weights may be 0 (that factor off). */
static int value_params(const json_t *ev, struct kvt_value_params *prm, char *err, size_t errcap)
{
    kvt_value_defaults(prm);
    double *dst[] = {&prm->half_life_s, &prm->reuse_w, &prm->len_w, &prm->cost_w};
    const json_t *fr = json_object_get(ev, "follow_recency");
    if (fr && !json_is_boolean(fr)) {
        snprintf(err, errcap, "\"eviction.follow_recency\" must be true or false");
        return KVT_E_CONFIG;
    }
    if (fr)
        prm->follow_recency = json_is_true(fr);
    for (int i = 0; i < NUMERIC_VALUE_KEYS; i++) {
        const json_t *v = json_object_get(ev, value_keys[i]);
        double d = 0;
        if (!v)
            continue;
        if (nonneg(v, &d) || (i == 0 && d == 0) || (i > 0 && d > 100)) {
            snprintf(err, errcap, "\"eviction.%s\" must be %s", value_keys[i],
                     i == 0 ? "a number of hours > 0" : "a number in [0, 100]");
            return KVT_E_CONFIG;
        }
        *dst[i] = i == 0 ? d * 3600.0 : d;
    }
    return 0;
}

int kvt_policy_parse(const json_t *ev, struct kvt_policy_cfg *cfg, char *err, size_t errcap)
{
    memset(cfg, 0, sizeof(*cfg));
    if (!json_is_object(ev)) {
        snprintf(err, errcap, "\"eviction\" must be an object");
        return KVT_E_CONFIG;
    }
    const json_t *pol = json_object_get(ev, "eviction_policy");
    bool value = pol && json_is_string(pol) && strcasecmp(json_string_value(pol), "value") == 0;
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)ev, key, val)
    {
        if (is_value_key(key) && !value) {
            snprintf(err, errcap, "\"eviction.%s\" applies to eviction_policy \"value\" only", key);
            return KVT_E_CONFIG;
        }
        if (strcmp(key, "eviction_policy") && strcmp(key, "trigger_watermark") &&
            strcmp(key, "eviction_ratio") && !is_value_key(key)) {
            snprintf(err, errcap,
                     "\"eviction.%s\": unknown field (known: eviction_policy, trigger_watermark, "
                     "eviction_ratio; for \"value\": half_life_hours, reuse_weight, "
                     "length_weight, cost_weight, follow_recency)",
                     key);
            return KVT_E_CONFIG;
        }
    }
    if (!pol) {
        snprintf(err, errcap, "\"eviction.eviction_policy\" is required (%s)", kvt_policy_names());
        return KVT_E_CONFIG;
    }
    if (!json_is_string(pol)) {
        snprintf(err, errcap, "\"eviction.eviction_policy\" must be a string (%s)",
                 kvt_policy_names());
        return KVT_E_CONFIG;
    }
    double wm = 0.8, ratio = 0.2;
    const json_t *v = json_object_get(ev, "trigger_watermark");
    if (v && unit_interval(v, &wm)) {
        snprintf(err, errcap, "\"eviction.trigger_watermark\" must be a number in [0, 1]");
        return KVT_E_CONFIG;
    }
    v = json_object_get(ev, "eviction_ratio");
    if (v && unit_interval(v, &ratio)) {
        snprintf(err, errcap, "\"eviction.eviction_ratio\" must be a number in [0, 1]");
        return KVT_E_CONFIG;
    }
    static const char *const known[] = {"LRU", "ARC", "LFU", "adaptive", "noop", "value"};
    const char *name = json_string_value(pol);
    for (size_t k = 0; k < sizeof(known) / sizeof(known[0]) && !cfg->name[0]; k++)
        if (strcasecmp(name, known[k]) == 0)
            snprintf(cfg->name, sizeof(cfg->name), "%s", known[k]);
    if (!cfg->name[0]) {
        snprintf(err, errcap, "\"eviction.eviction_policy\": unknown policy \"%s\" (known: %s)",
                 name, kvt_policy_names());
        return KVT_E_CONFIG;
    }
    cfg->watermark = wm;
    cfg->ratio = ratio;
    cfg->value = value;
    if (value) {
        int rc = value_params(ev, &cfg->value_params, err, errcap);
        if (rc)
            return rc;
    }
    return 0;
}

struct kvt_policy *kvt_policy_build(const struct kvt_policy_cfg *cfg)
{
    if (!cfg->value)
        return kvt_policy_create(cfg->name, cfg->watermark, cfg->ratio);
    struct kvt_policy *p = kvt_value_create(&cfg->value_params);
    p->trigger_watermark = cfg->watermark;
    p->eviction_ratio = cfg->ratio;
    return p;
}

int kvt_policy_from_json(const json_t *ev, struct kvt_policy **out, char *err, size_t errcap)
{
    *out = NULL;
    struct kvt_policy_cfg cfg;
    int rc = kvt_policy_parse(ev, &cfg, err, errcap);
    if (rc)
        return rc;
    *out = kvt_policy_build(&cfg);
    return 0;
}

json_t *kvt_policy_describe(const struct kvt_policy *p)
{
    json_t *r = json_object();
    json_object_set_new(r, "eviction_policy", json_string(p->ops->name));
    json_object_set_new(r, "trigger_watermark", json_real(p->trigger_watermark));
    json_object_set_new(r, "eviction_ratio", json_real(p->eviction_ratio));
    struct kvt_value_params prm;
    if (kvt_value_get_params(p, &prm)) {
        /* no half-life: freshness by aging (value.c), no clock */
        json_object_set_new(r, "half_life_hours",
                            prm.half_life_s > 0 ? json_real(prm.half_life_s / 3600.0)
                                                : json_null());
        json_object_set_new(r, "reuse_weight", json_real(prm.reuse_w));
        json_object_set_new(r, "length_weight", json_real(prm.len_w));
        json_object_set_new(r, "cost_weight", json_real(prm.cost_w));
        json_object_set_new(r, "follow_recency", json_boolean(prm.follow_recency));
    }
    return r;
}
