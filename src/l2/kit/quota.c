/* "namespace_quotas": parsing and validation (rules in quota.h). */
#include "l2/kit/quota.h"

#include "common/util.h"
#include "key/key.h"
#include "kvtier/error.h"

#include <errno.h>
#include <stdbool.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NS_NAME_MAX 256 /* > any interned namespace name (names <= KVT_NAME_MAX) */

/* A name without '/' that is the namespace name of a valid model. */
static bool is_ns_name(const char *in)
{
    char model[KVT_NAME_MAX + 1];
    return !strchr(in, '/') && kvt_ns_name_model(in, strlen(in), model, sizeof(model)) >= 0;
}

int kvt_quota_ns_name(const char *in, char *out, size_t cap)
{
    size_t n = strlen(in);
    if (in[0] == '@' || is_ns_name(in)) { /* a tenant's name is taken as written */
        if (n >= cap)
            return -1;
        memcpy(out, in, n + 1);
        return (int)n;
    }
    return kvt_ns_name_of(in, n, out, cap);
}

/*
 * A quota's name: a namespace name (key.c's kvt_ns_name: the model as the
 * nixl codec writes it, "--" for each '/'), taken as written when it is the
 * namespace name of a valid model and has no '/'; otherwise a model, which
 * must pass kvt_validate_model. 0, or -1 with *why.
 */
static int quota_name_ok(const char *name, const char **why)
{
    if (name[0] == '@') { /* a tenant: "@" + a cache salt */
        if (!name[1]) {
            *why = "a tenant's quota is \"@\" and its cache salt";
            return -1;
        }
        return kvt_validate_salt(name + 1, strlen(name + 1), why) ? -1 : 0;
    }
    if (is_ns_name(name))
        return 0;
    return kvt_validate_model(name, strlen(name), why) ? -1 : 0;
}

/* A number from 0 to max from a JSON number or a numeric string. */
static int number(const json_t *v, double max, double *out)
{
    double d;
    if (json_is_number(v)) {
        d = json_number_value(v);
    } else if (json_is_string(v)) {
        const char *s = json_string_value(v);
        char *end;
        errno = 0;
        d = strtod(s, &end);
        if (end == s || *end || errno)
            return -1;
    } else {
        return -1;
    }
    if (!isfinite(d) || d < 0 || d > max)
        return -1;
    *out = d;
    return 0;
}

/* A size in GiB (at most 1e9). */
static int gib(const json_t *v, double *out)
{
    return number(v, 1e9, out);
}

/* One entry's limit in bytes: a number of GiB, or {max_gb} / {max_bytes}. */
static int entry_bytes(const char *name, const json_t *v, uint64_t *bytes, char *err, size_t cap)
{
    double d;
    if (!json_is_object(v)) {
        if (gib(v, &d)) {
            snprintf(err, cap,
                     "quota of \"%s\" must be a number of GiB >= 0 or an object "
                     "{\"max_gb\": N} / {\"max_bytes\": N}",
                     name);
            return -1;
        }
        *bytes = (uint64_t)(d * KVT_GIB);
        return 0;
    }
    const char *k;
    json_t *x;
    int found = 0;
    json_object_foreach((json_t *)v, k, x)
    {
        if (strcmp(k, "max_gb") == 0) {
            if (gib(x, &d)) {
                snprintf(err, cap, "\"%s\".max_gb must be a number >= 0", name);
                return -1;
            }
            *bytes = (uint64_t)(d * KVT_GIB);
        } else if (strcmp(k, "max_bytes") == 0) {
            /* bytes: exact up to 2^53 (8 PiB) */
            if (number(x, 9007199254740992.0, &d) || d != floor(d)) {
                snprintf(err, cap, "\"%s\".max_bytes must be an integer >= 0", name);
                return -1;
            }
            *bytes = (uint64_t)d;
        } else {
            snprintf(err, cap, "\"%s\": unknown field \"%s\" (known: max_gb, max_bytes)", name, k);
            return -1;
        }
        found++;
    }
    if (found != 1) {
        snprintf(err, cap, "\"%s\" needs exactly one of max_gb, max_bytes", name);
        return -1;
    }
    return 0;
}

int kvt_quota_parse(const json_t *v, json_t **out, char *err, size_t errcap)
{
    *out = NULL;
    json_t *file = NULL;
    if (json_is_string(v)) {
        const char *path = json_string_value(v);
        json_error_t je;
        file = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
        if (!file) {
            /* jansson gives line -1 when the file cannot be opened at all */
            if (je.line > 0)
                snprintf(err, errcap, "cannot read quotas file %s: %s (line %d)", path, je.text,
                         je.line);
            else
                snprintf(err, errcap, "cannot read quotas file %s: %s", path, je.text);
            return KVT_E_CONFIG;
        }
        v = file;
    }
    if (!json_is_object(v)) {
        snprintf(err, errcap,
                 "must be an object {namespace: GiB, ...} or the path of a JSON "
                 "file holding one");
        json_decref(file);
        return KVT_E_CONFIG;
    }
    json_t *res = json_object();
    const char *name;
    json_t *x;
    json_object_foreach((json_t *)v, name, x)
    {
        char ns[NS_NAME_MAX + 1];
        uint64_t bytes = 0;
        const char *why = NULL;
        if (quota_name_ok(name, &why) || kvt_quota_ns_name(name, ns, sizeof(ns)) < 0) {
            snprintf(err, errcap, "\"%.300s\" is not a %s (%s)", name,
                     name[0] == '@' ? "tenant (@ and a cache salt)" : "namespace name",
                     why ? why : "too long");
            goto fail;
        }
        if (entry_bytes(name, x, &bytes, err, errcap))
            goto fail;
        if (json_object_get(res, ns)) {
            snprintf(err, errcap, "\"%s\" is given twice (as a model and as a namespace name)", ns);
            goto fail;
        }
        json_object_set_new(res, ns, json_integer((json_int_t)bytes));
    }
    json_decref(file);
    *out = res;
    return 0;
fail:
    json_decref(res);
    json_decref(file);
    return KVT_E_CONFIG;
}
