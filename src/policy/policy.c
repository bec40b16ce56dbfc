/* Policies by name, and the "eviction" config block (its common fields;
 * a policy's own fields are parsed by its descriptor). */
#include "policy/policy.h"
#include "common/util.h"
#include "kvtier/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

struct kvt_policy *kvt_policy_create(const char *name, double watermark, double ratio)
{
    const struct kvt_policy_desc *d = kvt_policy_find(name);
    if (!d)
        return NULL;
    struct kvt_policy *p = d->create(NULL);
    p->trigger_watermark = watermark;
    p->eviction_ratio = ratio;
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

/* The policy whose own fields include key; NULL if none. */
static const struct kvt_policy_desc *owner_of(const char *key)
{
    const struct kvt_policy_desc *d;
    for (size_t i = 0; (d = kvt_policy_at(i)); i++)
        for (const char *const *f = d->fields; f && *f; f++)
            if (strcmp(key, *f) == 0)
                return d;
    return NULL;
}

/* Append to err at *n, as far as it fits. */
static void append(char *err, size_t errcap, size_t *n, const char *a, const char *b)
{
    if (*n < errcap)
        *n += (size_t)snprintf(err + *n, errcap - *n, "%s%s", a, b);
}

/* "unknown field" names the common fields and each policy's own. */
static void unknown_field(const char *key, char *err, size_t errcap)
{
    size_t n = 0;
    append(err, errcap, &n, "\"eviction.", key);
    append(err, errcap, &n, "\": unknown field (known: eviction_policy, trigger_watermark, ",
           "eviction_ratio");
    const struct kvt_policy_desc *d;
    for (size_t i = 0; (d = kvt_policy_at(i)); i++) {
        for (const char *const *f = d->fields; f && *f; f++) {
            if (f == d->fields) {
                append(err, errcap, &n, "; for \"", d->name);
                append(err, errcap, &n, "\": ", *f);
            } else {
                append(err, errcap, &n, ", ", *f);
            }
        }
    }
    append(err, errcap, &n, ")", "");
}

int kvt_policy_parse(const json_t *ev, struct kvt_policy_cfg *cfg, char *err, size_t errcap)
{
    memset(cfg, 0, sizeof(*cfg));
    if (!json_is_object(ev)) {
        snprintf(err, errcap, "\"eviction\" must be an object");
        return KVT_E_CONFIG;
    }
    const json_t *pol = json_object_get(ev, "eviction_policy");
    const struct kvt_policy_desc *d =
        json_is_string(pol) ? kvt_policy_find(json_string_value(pol)) : NULL;
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)ev, key, val)
    {
        const struct kvt_policy_desc *owner = owner_of(key);
        if (owner && owner != d) {
            snprintf(err, errcap, "\"eviction.%s\" applies to eviction_policy \"%s\" only", key,
                     owner->name);
            return KVT_E_CONFIG;
        }
        if (!owner && strcmp(key, "eviction_policy") && strcmp(key, "trigger_watermark") &&
            strcmp(key, "eviction_ratio")) {
            unknown_field(key, err, errcap);
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
    if (!d) {
        snprintf(err, errcap, "\"eviction.eviction_policy\": unknown policy \"%s\" (known: %s)",
                 json_string_value(pol), kvt_policy_names());
        return KVT_E_CONFIG;
    }
    cfg->desc = d;
    cfg->watermark = wm;
    cfg->ratio = ratio;
    return d->parse ? d->parse(ev, cfg, err, errcap) : 0;
}

struct kvt_policy *kvt_policy_build(const struct kvt_policy_cfg *cfg)
{
    struct kvt_policy *p = cfg->desc->create(cfg);
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
    const struct kvt_policy_desc *d = kvt_policy_find(p->ops->name);
    if (d && d->describe)
        d->describe(p, r);
    return r;
}
