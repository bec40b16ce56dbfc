/* "namespace_quotas": parsing and validation (rules in quota.h). */
#include "ops/quota.h"

#include "common/util.h"
#include "key/key.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NS_NAME_MAX 256 /* 128-byte model, each '/' doubled */

int kvt_quota_ns_name(const char *in, char *out, size_t cap)
{
    size_t n = 0;
    for (const char *p = in; *p; p++) {
        size_t need = *p == '/' ? 2 : 1;
        if (n + need >= cap)
            return -1;
        if (*p == '/') {
            out[n++] = '-';
            out[n++] = '-';
        } else {
            out[n++] = *p;
        }
    }
    out[n] = 0;
    return (int)n;
}

/*
 * A quota's name: a model or a namespace name (the model with each '/' as
 * "--", key.c's kvt_ns_name, which only interned namespaces have). Up to
 * 128 bytes it must pass kvt_validate_model as written; a longer one can
 * only be a namespace name of a model with '/': the model it stands for
 * ("--" read back as '/') must pass. 0, or -1 with *why.
 */
static int quota_name_ok(const char *name, const char **why)
{
    size_t len = strlen(name);
    if (len <= KVT_MODEL_MAX)
        return kvt_validate_model(name, len, why) ? -1 : 0;
    if (strchr(name, '/') || len > NS_NAME_MAX) {
        *why = "longer than 128 bytes";
        return -1;
    }
    char model[NS_NAME_MAX + 1];
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (name[i] == '-' && name[i + 1] == '-') {
            model[n++] = '/';
            i++;
        } else {
            model[n++] = name[i];
        }
    }
    if (kvt_validate_model(model, n, why)) {
        if (n > KVT_MODEL_MAX)
            *why = "longer than 128 bytes (as a model, each \"--\" a '/')";
        return -1;
    }
    return 0;
}

/* A size in GiB from a JSON number or a numeric string. */
static int gib(const json_t *v, double *out)
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
    if (!isfinite(d) || d < 0 || d > 1e9)
        return -1;
    *out = d;
    return 0;
}

/* One entry's limit in bytes: a number of GiB, or {max_gb} / {max_bytes}. */
static int entry_bytes(const char *name, const json_t *v, uint64_t *bytes, char *err, size_t cap)
{
    double d;
    if (!json_is_object(v)) {
        if (gib(v, &d)) {
            snprintf(err, cap, "quota of \"%s\" must be a number of GiB >= 0 or an object "
                               "{\"max_gb\": N} / {\"max_bytes\": N}", name);
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
            if (gib(x, &d) || d != floor(d)) {
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
            return -1;
        }
        v = file;
    }
    if (!json_is_object(v)) {
        snprintf(err, errcap, "must be an object {namespace: GiB, ...} or the path of a JSON "
                              "file holding one");
        json_decref(file);
        return -1;
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
            snprintf(err, errcap, "\"%.300s\" is not a namespace name (%s)", name,
                     why ? why : "too long");
            goto fail;
        }
        if (entry_bytes(name, x, &bytes, err, errcap))
            goto fail;
        if (json_object_get(res, ns)) {
            snprintf(err, errcap, "\"%s\" is given twice (as a model and as a namespace name)",
                     ns);
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
    return -1;
}
