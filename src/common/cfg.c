#include "common/cfg.h"
#include "kvtier/error.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <ctype.h>

void kvt_cfg_init(struct kvt_cfg *c, const json_t *obj, int index, const char *type, char *err,
                  size_t errcap)
{
    memset(c, 0, sizeof(*c));
    c->obj = obj;
    c->resolved = json_object();
    c->seen = json_object();
    c->index = index;
    c->type = type;
    c->err = err;
    c->errcap = errcap;
}

void kvt_cfg_free(struct kvt_cfg *c)
{
    json_decref(c->resolved);
    json_decref(c->seen);
    json_decref(c->own);
    c->resolved = c->seen = c->own = NULL;
}

static int vfail(struct kvt_cfg *c, const char *key, const char *fmt, va_list ap)
{
    if (c->rc)
        return c->rc;
    char msg[512];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    if (key)
        snprintf(c->err, c->errcap, "--l2-adapter #%d (%s): \"%s%s\" %s", c->index, c->type,
                 c->prefix, key, msg);
    else
        snprintf(c->err, c->errcap, "--l2-adapter #%d (%s): %s", c->index, c->type, msg);
    c->rc = KVT_E_CONFIG;
    return c->rc;
}

int kvt_cfg_fail(struct kvt_cfg *c, const char *key, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = vfail(c, key, fmt, ap);
    va_end(ap);
    return rc;
}

int kvt_cfg_unsupported(struct kvt_cfg *c, const char *key, const char *fmt, ...)
{
    if (c->rc)
        return c->rc;
    va_list ap;
    va_start(ap, fmt);
    vfail(c, key, fmt, ap);
    va_end(ap);
    c->rc = KVT_E_UNSUPPORTED;
    return c->rc;
}

/* Edit distance between a and b (case-insensitive; insertions, deletions,
 * substitutions and swaps of neighbours count 1), or SIZE_MAX for keys
 * longer than 63 bytes. */
static size_t distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63)
        return SIZE_MAX;
    size_t d[64][64];
    for (size_t i = 0; i <= la; i++)
        d[i][0] = i;
    for (size_t j = 0; j <= lb; j++)
        d[0][j] = j;
    for (size_t i = 1; i <= la; i++)
        for (size_t j = 1; j <= lb; j++) {
            int ca = tolower((unsigned char)a[i - 1]), cb = tolower((unsigned char)b[j - 1]);
            size_t v = d[i - 1][j - 1] + (ca != cb);
            if (d[i - 1][j] + 1 < v)
                v = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < v)
                v = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && ca == tolower((unsigned char)b[j - 2]) &&
                tolower((unsigned char)a[i - 2]) == cb && d[i - 2][j - 2] + 1 < v)
                v = d[i - 2][j - 2] + 1;
            d[i][j] = v;
        }
    return d[la][lb];
}

/* Whether typed is close enough to known to be a typo of it: a quarter of
 * the known name's length, at least 1 and at most 3 edits. */
static bool near(const char *typed, const char *known)
{
    size_t lim = (strlen(known) + 3) / 4;
    lim = lim < 1 ? 1 : lim > 3 ? 3 : lim;
    return distance(typed, known) <= lim;
}

/* The key of c's object nearest to `key` among those not read (yet): the
 * typo a required key is missing by. NULL if none is near. */
static const char *near_unread(struct kvt_cfg *c, const char *key)
{
    const char *best = NULL, *k;
    size_t bd = SIZE_MAX;
    json_t *v;
    json_object_foreach((json_t *)c->obj, k, v)
    {
        if (json_object_get(c->seen, k) || !strcmp(k, key) || !near(k, key))
            continue;
        size_t d = distance(k, key);
        if (d < bd)
            bd = d, best = k;
    }
    return best;
}

int kvt_cfg_missing(struct kvt_cfg *c, const char *key, const char *fmt, ...)
{
    if (c->rc)
        return c->rc;
    char why[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    const char *typo = near_unread(c, key);
    if (typo)
        return kvt_cfg_fail(c, typo, "is not a known field: did you mean \"%s%s\"? (\"%s%s\" %s)",
                            c->prefix, key, c->prefix, key, why);
    return kvt_cfg_fail(c, key, "%s", why);
}

static const json_t *get(struct kvt_cfg *c, const char *key)
{
    json_object_set_new(c->seen, key, json_true());
    return json_object_get(c->obj, key);
}

bool kvt_cfg_has(struct kvt_cfg *c, const char *key)
{
    return json_object_get(c->obj, key) != NULL;
}

void kvt_cfg_ignore(struct kvt_cfg *c, const char *key)
{
    json_object_set_new(c->seen, key, json_true());
}

const json_t *kvt_cfg_raw(struct kvt_cfg *c, const char *key)
{
    return get(c, key);
}

static char *show(const json_t *v)
{
    return json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
}

int kvt_cfg_bool(struct kvt_cfg *c, const char *key, bool def, bool *out)
{
    const json_t *v = get(c, key);
    bool b = def;
    if (v && !json_is_null(v)) {
        if (json_is_boolean(v)) {
            b = json_is_true(v);
        } else if (json_is_string(v) && strcasecmp(json_string_value(v), "true") == 0) {
            b = true;
        } else if (json_is_string(v) && strcasecmp(json_string_value(v), "false") == 0) {
            b = false;
        } else {
            char *s = show(v);
            int rc = kvt_cfg_fail(c, key, "must be true or false (got %s)", s);
            free(s);
            return rc;
        }
    }
    *out = b;
    json_object_set_new(c->resolved, key, json_boolean(b));
    return c->rc;
}

static int num_of(const json_t *v, double *d)
{
    if (json_is_integer(v)) {
        *d = (double)json_integer_value(v);
        return 0;
    }
    if (json_is_real(v)) {
        *d = json_real_value(v);
        return 0;
    }
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        char *end;
        errno = 0;
        *d = strtod(s, &end);
        while (*end == ' ')
            end++;
        if (end == s || *end || errno || !isfinite(*d))
            return -1;
        return 0;
    }
    return -1;
}

int kvt_cfg_num(struct kvt_cfg *c, const char *key, bool required, double def, double min,
                double max, double *out)
{
    const json_t *v = get(c, key);
    double d = def;
    if (!v || json_is_null(v)) {
        if (required)
            return kvt_cfg_missing(c, key, "is required");
    } else if (num_of(v, &d)) {
        char *s = show(v);
        int rc = kvt_cfg_fail(c, key, "must be a number (got %s)", s);
        free(s);
        return rc;
    } else if (d < min || d > max) {
        return kvt_cfg_fail(c, key, "must be between %g and %g (got %g)", min, max, d);
    }
    *out = d;
    json_object_set_new(c->resolved, key, json_real(d));
    return c->rc;
}

int kvt_cfg_int(struct kvt_cfg *c, const char *key, bool required, int64_t def, int64_t min,
                int64_t max, int64_t *out)
{
    const json_t *v = get(c, key);
    int64_t i = def;
    if (!v || json_is_null(v)) {
        if (required)
            return kvt_cfg_missing(c, key, "is required");
    } else {
        double d;
        if (json_is_boolean(v) || num_of(v, &d) || d != floor(d)) {
            char *s = show(v);
            int rc = kvt_cfg_fail(c, key, "must be an integer (got %s)", s);
            free(s);
            return rc;
        }
        if (d < (double)min || d > (double)max)
            return kvt_cfg_fail(c, key, "must be between %lld and %lld (got %.0f)", (long long)min,
                                (long long)max, d);
        i = (int64_t)d;
    }
    *out = i;
    json_object_set_new(c->resolved, key, json_integer((json_int_t)i));
    return c->rc;
}

int kvt_cfg_str(struct kvt_cfg *c, const char *key, bool required, const char *def,
                const char **out)
{
    const json_t *v = get(c, key);
    const char *s = def;
    if (!v || json_is_null(v)) {
        if (required)
            return kvt_cfg_missing(c, key, "is required");
    } else if (!json_is_string(v)) {
        char *x = show(v);
        int rc = kvt_cfg_fail(c, key, "must be a string (got %s)", x);
        free(x);
        return rc;
    } else {
        s = json_string_value(v);
    }
    *out = s;
    json_object_set_new(c->resolved, key, s ? json_string(s) : json_null());
    return c->rc;
}

int kvt_cfg_enum(struct kvt_cfg *c, const char *key, bool required, const char *def,
                 const char *const *choices, bool icase, const char **out)
{
    const char *s;
    if (kvt_cfg_str(c, key, required, def, &s))
        return c->rc;
    if (!s) {
        *out = NULL;
        return 0;
    }
    char list[256] = "";
    for (const char *const *ch = choices; *ch; ch++) {
        if ((icase ? strcasecmp(*ch, s) : strcmp(*ch, s)) == 0) {
            *out = *ch;
            json_object_set_new(c->resolved, key, json_string(*ch));
            return 0;
        }
        size_t l = strlen(list);
        snprintf(list + l, sizeof(list) - l, "%s%s", l ? ", " : "", *ch);
    }
    return kvt_cfg_fail(c, key, "must be one of %s (got \"%s\")", list, s);
}

int kvt_cfg_sub(struct kvt_cfg *c, const char *key, bool required, struct kvt_cfg *sub)
{
    const json_t *v = get(c, key);
    json_t *empty = json_object();
    kvt_cfg_init(sub, empty, c->index, c->type, c->err, c->errcap);
    sub->own = empty;
    snprintf(sub->prefix, sizeof(sub->prefix), "%.31s%.30s.", c->prefix, key);
    sub->rc = c->rc;
    if (!v || json_is_null(v)) {
        if (required)
            return kvt_cfg_missing(c, key, "is required");
        return c->rc;
    }
    if (!json_is_object(v))
        return kvt_cfg_fail(c, key, "must be an object");
    sub->obj = v;
    return c->rc;
}

void kvt_cfg_sub_done(struct kvt_cfg *c, const char *key, struct kvt_cfg *sub)
{
    if (!sub->resolved)
        return;
    if (!c->rc && sub->rc)
        c->rc = sub->rc; /* message already in the shared buffer */
    json_object_set(c->resolved, key, sub->resolved);
    kvt_cfg_free(sub);
}

int kvt_cfg_finish(struct kvt_cfg *c)
{
    if (c->rc)
        return c->rc;
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)c->obj, key, val)
    {
        if (!json_object_get(c->seen, key)) {
            char known[512] = "";
            const char *k2;
            json_t *v2;
            json_object_foreach(c->seen, k2, v2)
            {
                size_t l = strlen(known);
                snprintf(known + l, sizeof(known) - l, "%s%s", l ? ", " : "", k2);
            }
            /* the nearest known field, when the key looks like a typo of one */
            const char *best = NULL;
            size_t bd = SIZE_MAX;
            json_object_foreach(c->seen, k2, v2)
            {
                size_t d = distance(key, k2);
                if (near(key, k2) && d < bd)
                    bd = d, best = k2;
            }
            if (best)
                return kvt_cfg_fail(c, key,
                                    "is not a known field: did you mean \"%s%s\"? (known: %s)",
                                    c->prefix, best, known);
            return kvt_cfg_fail(c, key, "is not a known field (known: %s)", known);
        }
    }
    return 0;
}
