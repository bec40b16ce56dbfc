/* Policy registry, the "eviction" config block, and the noop policy. */
#include "evict/policy.h"
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
    return "LRU, noop";
}

struct kvt_policy *kvt_policy_create(const char *name, double watermark, double ratio)
{
    struct kvt_policy *p = NULL;
    if (strcasecmp(name, "LRU") == 0) {
        p = kvt_lru_create();
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

int kvt_policy_from_json(const json_t *ev, struct kvt_policy **out, char *err, size_t errcap)
{
    *out = NULL;
    if (!json_is_object(ev)) {
        snprintf(err, errcap, "\"eviction\" must be an object");
        return KVT_E_CONFIG;
    }
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)ev, key, val)
    {
        if (strcmp(key, "eviction_policy") && strcmp(key, "trigger_watermark") &&
            strcmp(key, "eviction_ratio")) {
            snprintf(err, errcap,
                     "\"eviction.%s\": unknown field (known: eviction_policy, trigger_watermark, "
                     "eviction_ratio)",
                     key);
            return KVT_E_CONFIG;
        }
    }
    const json_t *pol = json_object_get(ev, "eviction_policy");
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
    struct kvt_policy *p = kvt_policy_create(json_string_value(pol), wm, ratio);
    if (!p) {
        snprintf(err, errcap, "\"eviction.eviction_policy\": unknown policy \"%s\" (known: %s)",
                 json_string_value(pol), kvt_policy_names());
        return KVT_E_CONFIG;
    }
    *out = p;
    return 0;
}
