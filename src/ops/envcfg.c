/* cache.env reader (rules in envcfg.h). */
#include "ops/envcfg.h"

#include "kvtier/error.h"
#include "l2/kit/quota.h"
#include "policy/policy.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#define MAX_FILE (1 << 20)
#define MAX_VALUE 4096

struct parser {
    const char *file;
    char dir[PATH_MAX];
    int line;
    json_t *vars; /* name -> {value, src, dir} */
    char *err;
    size_t errcap;
};

static int perr(struct parser *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int perr(struct parser *p, const char *fmt, ...)
{
    int n = snprintf(p->err, p->errcap, "%s:%d: ", p->file, p->line);
    va_list ap;
    va_start(ap, fmt);
    if (n >= 0 && (size_t)n < p->errcap)
        vsnprintf(p->err + n, p->errcap - (size_t)n, fmt, ap);
    va_end(ap);
    return KVT_E_CONFIG;
}

static bool name_start(int c)
{
    return isalpha(c) || c == '_';
}
static bool name_char(int c)
{
    return isalnum(c) || c == '_';
}

static const char *lookup(struct parser *p, const char *name)
{
    json_t *v = json_object_get(p->vars, name);
    if (v)
        return json_string_value(json_object_get(v, "value"));
    return getenv(name);
}

struct buf {
    char s[MAX_VALUE];
    size_t n;
};

static int put(struct parser *p, struct buf *b, const char *s, size_t n)
{
    if (b->n + n >= sizeof(b->s))
        return perr(p, "value longer than %d bytes", MAX_VALUE - 1);
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
    return 0;
}

/* $NAME, ${NAME}, ${NAME:-default}; *pp points at '$'. */
static int expand(struct parser *p, const char **pp, struct buf *b)
{
    const char *s = *pp + 1;
    char name[128];
    size_t n = 0;
    if (*s == '{') {
        s++;
        while (name_char((unsigned char)*s) && n < sizeof(name) - 1)
            name[n++] = *s++;
        name[n] = 0;
        if (!n || !name_start((unsigned char)name[0]))
            return perr(p, "bad expansion: expected ${NAME} or ${NAME:-default}");
        const char *val = lookup(p, name);
        if (s[0] == ':' && s[1] == '-') {
            const char *d = s + 2, *e = strchr(d, '}');
            if (!e)
                return perr(p, "unterminated ${%s:-...}", name);
            if (!val || !val[0]) {
                if (put(p, b, d, (size_t)(e - d)))
                    return KVT_E_CONFIG;
                val = NULL;
            } else if (put(p, b, val, strlen(val))) {
                return KVT_E_CONFIG;
            }
            *pp = e + 1;
            return 0;
        }
        if (*s != '}')
            return perr(p,
                        "bad expansion ${%s...}: only ${NAME} and ${NAME:-default} are "
                        "supported",
                        name);
        s++;
        if (!val)
            return perr(p,
                        "${%s} is not set (set it earlier in the file or in the environment, "
                        "or write ${%s:-default})",
                        name, name);
        *pp = s;
        return put(p, b, val, strlen(val));
    }
    if (!name_start((unsigned char)*s))
        return put(p, b, "$", 1) ? KVT_E_CONFIG : (*pp = s, 0); /* a lone '$' is literal */
    while (name_char((unsigned char)*s) && n < sizeof(name) - 1)
        name[n++] = *s++;
    name[n] = 0;
    const char *val = lookup(p, name);
    if (!val)
        return perr(p,
                    "$%s is not set (set it earlier in the file or in the environment, or "
                    "write ${%s:-default})",
                    name, name);
    *pp = s;
    return put(p, b, val, strlen(val));
}

/* Parse one VALUE up to the end of the line (shell word rules, subset). */
static int parse_value(struct parser *p, const char *s, struct buf *b)
{
    b->n = 0;
    b->s[0] = 0;
    while (*s && !isspace((unsigned char)*s)) {
        if (*s == '\'') {
            const char *e = strchr(s + 1, '\'');
            if (!e)
                return perr(p, "unterminated single quote");
            if (put(p, b, s + 1, (size_t)(e - s - 1)))
                return KVT_E_CONFIG;
            s = e + 1;
        } else if (*s == '"') {
            s++;
            while (*s && *s != '"') {
                if (*s == '\\' && s[1] && strchr("\"\\$`", s[1])) {
                    if (put(p, b, s + 1, 1))
                        return KVT_E_CONFIG;
                    s += 2;
                } else if (*s == '$') {
                    if (expand(p, &s, b))
                        return KVT_E_CONFIG;
                } else if (*s == '`') {
                    return perr(p, "command substitution is not supported");
                } else {
                    if (put(p, b, s, 1))
                        return KVT_E_CONFIG;
                    s++;
                }
            }
            if (*s != '"')
                return perr(p, "unterminated double quote");
            s++;
        } else if (*s == '\\' && s[1]) {
            if (put(p, b, s + 1, 1))
                return KVT_E_CONFIG;
            s += 2;
        } else if (*s == '$') {
            if (s[1] == '(')
                return perr(p, "command substitution is not supported");
            if (expand(p, &s, b))
                return KVT_E_CONFIG;
        } else if (strchr("`;&|<>()", *s)) {
            return perr(p, "'%c' is not supported here: quote the value", *s);
        } else {
            if (put(p, b, s, 1))
                return KVT_E_CONFIG;
            s++;
        }
    }
    while (isspace((unsigned char)*s))
        s++;
    if (*s && *s != '#')
        return perr(p, "unexpected text after the value: '%s' (quote values with spaces)", s);
    return 0;
}

static int parse_line(struct parser *p, char *line)
{
    char *s = line;
    while (isspace((unsigned char)*s))
        s++;
    if (!*s || *s == '#')
        return 0;
    if (strncmp(s, "export", 6) == 0 && isspace((unsigned char)s[6])) {
        s += 6;
        while (isspace((unsigned char)*s))
            s++;
    }
    const char *name = s;
    if (!name_start((unsigned char)*s))
        return perr(p, "expected NAME=VALUE");
    while (name_char((unsigned char)*s))
        s++;
    if (*s != '=')
        return perr(p, "expected NAME=VALUE (no spaces around '=')");
    *s++ = 0;
    struct buf b;
    if (parse_value(p, s, &b))
        return KVT_E_CONFIG;
    json_t *v = json_object();
    char src[PATH_MAX + 32];
    snprintf(src, sizeof(src), "%s:%d", p->file, p->line);
    json_object_set_new(v, "value", json_string(b.s));
    json_object_set_new(v, "src", json_string(src));
    json_object_set_new(v, "dir", json_string(p->dir));
    json_object_set_new(p->vars, name, v);
    return 0;
}

static int parse_file(struct parser *p, const char *path, bool optional)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        if (optional && errno == ENOENT)
            return 0;
        snprintf(p->err, p->errcap, "cannot read config file %s: %s", path, kvt_strerror(-errno));
        return KVT_E_CONFIG;
    }
    p->file = path;
    p->line = 0;
    snprintf(p->dir, sizeof(p->dir), "%s", path);
    char *slash = strrchr(p->dir, '/');
    if (slash)
        slash[slash == p->dir ? 1 : 0] = 0;
    else
        snprintf(p->dir, sizeof(p->dir), ".");
    char *line = NULL;
    size_t cap = 0, total = 0;
    ssize_t n;
    int rc = 0;
    while ((n = getline(&line, &cap, f)) >= 0) {
        p->line++;
        total += (size_t)n;
        if (total > MAX_FILE) {
            rc = perr(p, "file larger than %d bytes", MAX_FILE);
            break;
        }
        if (strlen(line) != (size_t)n) {
            rc = perr(p, "NUL byte in the file");
            break;
        }
        if (n && line[n - 1] == '\n')
            line[--n] = 0;
        if (n && line[n - 1] == '\\') {
            rc = perr(p, "line continuations are not supported");
            break;
        }
        if ((rc = parse_line(p, line)))
            break;
    }
    free(line);
    fclose(f);
    return rc;
}

/* ---------------------------------------------------------------- values */

enum vkind { V_PATH, V_NUM, V_UNIT, V_BOOL, V_STR, V_INT };

/* KVP_EVICTION_POLICY: a policy of the table that cache.env offers
 * (KVT_POLICY_CACHE_ENV), in any case, or "none" (no eviction block), into
 * out by its canonical name. Otherwise -1 and, in fmt, verr's format for
 * the value: what is expected. */
static int env_policy(const char *val, char *out, size_t outcap, char *fmt, size_t fmtcap)
{
    const struct kvt_policy_desc *d = kvt_policy_find(val);
    if (d && (d->flags & KVT_POLICY_CACHE_ENV)) {
        snprintf(out, outcap, "%s", d->name);
        return 0;
    }
    if (strcasecmp(val, "none") == 0) {
        snprintf(out, outcap, "none");
        return 0;
    }
    size_t n = (size_t)snprintf(fmt, fmtcap, "expected");
    const char *sep = " ";
    for (size_t i = 0; (d = kvt_policy_at(i)) && n < fmtcap; i++) {
        if (d->flags & KVT_POLICY_CACHE_ENV) {
            n += (size_t)snprintf(fmt + n, fmtcap - n, "%s%s", sep, d->name);
            sep = ", ";
        }
    }
    if (n < fmtcap)
        snprintf(fmt + n, fmtcap - n, " or none, got '%%s'");
    return -1;
}

static int verr(char *err, size_t cap, const json_t *v, const char *name, const char *fmt,
                const char *val)
{
    const char *src = v ? json_string_value(json_object_get(v, "src")) : "default";
    int n = snprintf(err, cap, "%s: %s: ", src, name);
    if (n >= 0 && (size_t)n < cap)
        snprintf(err + n, cap - (size_t)n, fmt, val);
    return KVT_E_CONFIG;
}

static int get_path(const json_t *v, const char *val, char *out, size_t cap)
{
    if (!val[0] || val[0] == '/' || !v)
        return snprintf(out, cap, "%s", val) >= (int)cap ? -1 : 0;
    const char *dir = json_string_value(json_object_get(v, "dir"));
    if (!dir || !dir[0] || strcmp(dir, ".") == 0) {
        char cwd[PATH_MAX];
        if (!getcwd(cwd, sizeof(cwd)))
            return -1;
        return snprintf(out, cap, "%s/%s", cwd, val) >= (int)cap ? -1 : 0;
    }
    if (dir[0] != '/') {
        char cwd[PATH_MAX];
        if (!getcwd(cwd, sizeof(cwd)))
            return -1;
        return snprintf(out, cap, "%s/%s/%s", cwd, dir, val) >= (int)cap ? -1 : 0;
    }
    return snprintf(out, cap, "%s/%s", dir, val) >= (int)cap ? -1 : 0;
}

static int parse_bool(const char *s, bool *out)
{
    if (!strcasecmp(s, "true") || !strcmp(s, "1") || !strcasecmp(s, "yes") || !strcasecmp(s, "on"))
        *out = true;
    else if (!strcasecmp(s, "false") || !strcmp(s, "0") || !strcasecmp(s, "no") ||
             !strcasecmp(s, "off"))
        *out = false;
    else
        return -1;
    return 0;
}

static int parse_num(const char *s, double *out)
{
    char *end;
    errno = 0;
    double d = strtod(s, &end);
    if (end == s || *end || errno || !isfinite(d))
        return -1;
    *out = d;
    return 0;
}

/* ------------------------------------------------------------ setters */

/* One variable's value, checked by its kind (num or b hold it parsed),
 * into c. v: where it was set (NULL: the default). 0 or KVT_E_CONFIG with
 * err naming the file, line and variable. */
struct val {
    const json_t *v;
    const char *name, *s;
    double num;
    bool b;
};
typedef int (*var_set)(struct kvt_envcfg *c, const struct val *x, char *err, size_t cap);

static int set_root(struct kvt_envcfg *c, const struct val *x, char *err, size_t cap)
{
    if (!x->s[0] || get_path(x->v, x->s, c->root, sizeof(c->root)))
        return verr(err, cap, x->v, x->name, "must be a directory path, got '%s'", x->s);
    if (!strcmp(c->root, "/"))
        return verr(err, cap, x->v, x->name, "'%s' is not a cache directory", x->s);
    return 0;
}

static int set_budget(struct kvt_envcfg *c, const struct val *x, char *err, size_t cap)
{
    if (x->num > 1e9)
        return verr(err, cap, x->v, x->name, "%s GB is out of range", x->s);
    c->budget_gb = x->num;
    return 0;
}

static int set_device(struct kvt_envcfg *c, const struct val *x, char *err, size_t cap)
{
    if (get_path(x->v, x->s, c->device, sizeof(c->device)))
        return verr(err, cap, x->v, x->name, "path too long: '%s'", x->s);
    return 0;
}

static int set_watermark(struct kvt_envcfg *c, const struct val *x, char *err, size_t cap)
{
    (void)err, (void)cap;
    c->watermark = x->num;
    return 0;
}

static int set_ratio(struct kvt_envcfg *c, const struct val *x, char *err, size_t cap)
{
    (void)err, (void)cap;
    c->ratio = x->num;
    return 0;
}

static int set_policy(struct kvt_envcfg *c, const struct val *x, char *err, size_t cap)
{
    char expected[256];
    if (env_policy(x->s, c->policy, sizeof(c->policy), expected, sizeof(expected)))
        return verr(err, cap, x->v, x->name, expected, x->s);
    return 0;
}

static int set_half_life(struct kvt_envcfg *c, const struct val *x, char *err, size_t cap)
{
    (void)err, (void)cap;
    c->half_life_h = x->num;
    return 0;
}

static int set_quotas(struct kvt_envcfg *c, const struct val *x, char *err, size_t cap)
{
    if (get_path(x->v, x->s, c->quotas, sizeof(c->quotas)))
        return verr(err, cap, x->v, x->name, "path too long: '%s'", x->s);
    /* read and checked here first, so an error names file:line; the
     * adapter gets the path and reads it again (the admin API writes
     * quotas set at run time there) */
    json_decref(c->quotas_bytes); /* set again (cache.env.local): the last one holds */
    c->quotas_bytes = NULL;
    char qerr[PATH_MAX + 256];
    json_t *qpath = c->quotas[0] ? json_string(c->quotas) : NULL; /* empty: none */
    int rc = qpath ? kvt_quota_parse(qpath, &c->quotas_bytes, qerr, sizeof(qerr)) : 0;
    json_decref(qpath);
    return rc ? verr(err, cap, x->v, x->name, "%s", qerr) : 0;
}

static int set_url(struct kvt_envcfg *c, const struct val *x, char *err, size_t cap)
{
    if (strncmp(x->s, "tcp://", 6) && strncmp(x->s, "ipc://", 6))
        return verr(err, cap, x->v, x->name, "expected tcp://HOST:PORT or ipc://PATH, got '%s'",
                    x->s);
    snprintf(c->url, sizeof(c->url), "%s", x->s);
    c->url_set = x->v != NULL;
    return 0;
}

static int set_direct_io(struct kvt_envcfg *c, const struct val *x, char *err, size_t cap)
{
    (void)err, (void)cap;
    c->direct_io = x->b;
    return 0;
}

static int set_io_engine(struct kvt_envcfg *c, const struct val *x, char *err, size_t cap)
{
    if (strcmp(x->s, "posix") && strcmp(x->s, "io_uring"))
        return verr(err, cap, x->v, x->name, "expected posix or io_uring, got '%s'", x->s);
    snprintf(c->io_engine, sizeof(c->io_engine), "%s", x->s);
    return 0;
}

static int set_workers(struct kvt_envcfg *c, const struct val *x, char *err, size_t cap)
{
    if (x->num > 1024)
        return verr(err, cap, x->v, x->name, "%s is out of range [1, 1024]", x->s);
    c->num_workers = (int)x->num;
    return 0;
}

static int set_durable(struct kvt_envcfg *c, const struct val *x, char *err, size_t cap)
{
    (void)err, (void)cap;
    c->durable = x->b;
    return 0;
}

static int set_shard_dirs(struct kvt_envcfg *c, const struct val *x, char *err, size_t cap)
{
    (void)err, (void)cap;
    c->shard_dirs = x->b;
    return 0;
}

/* ------------------------------------------------------------ the table */

/* Every cache.env variable: its kind (the check before its setter), its
 * default (NULL: required), and where it goes. */
static const struct var {
    const char *name;
    enum vkind kind;
    const char *def;
    const char *help;
    var_set set;
    bool zero_ok; /* a number that may be 0 */
} vars[] = {
    {"KVP_CACHE_ROOT", V_PATH, NULL, "cache directory (flat *.bin files)", set_root, false},
    {"KVP_CACHE_BUDGET_GB", V_NUM, "1500", "hard cap in GB (GiB) = max_capacity_gb", set_budget,
     false},
    {"KVP_CACHE_DEVICE", V_PATH, "", "device or mount point for the pre-flight check", set_device,
     false},
    {"KVP_TRIGGER_WATERMARK", V_UNIT, "0.9", "eviction starts at this fraction of the budget",
     set_watermark, false},
    {"KVP_EVICTION_RATIO", V_UNIT, "0.1", "each eviction cycle frees this fraction of used",
     set_ratio, false},
    {"KVP_EVICTION_POLICY", V_STR, "LRU",
     "a policy cache.env offers (policy.h: KVT_POLICY_CACHE_ENV), or none (hard cap only)",
     set_policy, false},
    /* the value policy's half-life may be 0: freshness by aging */
    {"KVP_VALUE_HALF_LIFE_HOURS", V_NUM, "0",
     "freshness half-life of the value policy; 0: aging, no clock", set_half_life, true},
    {"KVP_QUOTAS_FILE", V_PATH, "", "per-namespace quotas (JSON)", set_quotas, false},
    {"KVP_SERVER_URL", V_STR, "tcp://127.0.0.1:5555", "where the server listens", set_url, false},
    {"KVP_USE_DIRECT_IO", V_BOOL, "false", "O_DIRECT for cache files", set_direct_io, false},
    {"KVP_IO_ENGINE", V_STR, "posix", "posix or io_uring", set_io_engine, false},
    {"KVP_NUM_WORKERS", V_INT, "4", "adapter worker threads", set_workers, false},
    {"KVP_DURABLE", V_BOOL, "false", "fdatasync before a store is acknowledged", set_durable,
     false},
    {"KVP_SHARD_DIRS", V_BOOL, "false", "files under hex[0:2]/hex[2:4]/ instead of flat",
     set_shard_dirs, false},
};
#define NVARS (sizeof(vars) / sizeof(vars[0]))

static const struct var *find_var(const char *name)
{
    for (size_t i = 0; i < NVARS; i++)
        if (strcmp(vars[i].name, name) == 0)
            return &vars[i];
    return NULL;
}

/* A KVP_ name the table does not have: refused, listing the table's. */
static int unknown_var(const json_t *v, const char *name, char *err, size_t cap)
{
    char fmt[1024];
    size_t n = (size_t)snprintf(fmt, sizeof(fmt), "unknown variable%%s (known: ");
    for (size_t i = 0; i < NVARS && n < sizeof(fmt); i++)
        n += (size_t)snprintf(fmt + n, sizeof(fmt) - n, "%s%s", i ? ", " : "", vars[i].name);
    if (n < sizeof(fmt))
        snprintf(fmt + n, sizeof(fmt) - n, ")");
    return verr(err, cap, v, name, fmt, "");
}

/* The value's check by its kind: a number (in [0, 1] for a fraction, > 0
 * or >= 0, whole for a count) or a boolean. 0 or KVT_E_CONFIG. */
static int check_kind(const struct var *d, struct val *x, char *err, size_t cap)
{
    if (d->kind == V_NUM || d->kind == V_UNIT || d->kind == V_INT) {
        double num = 0;
        if (parse_num(x->s, &num) || (d->kind == V_UNIT && (num < 0 || num > 1)) ||
            (d->kind != V_UNIT && (num < 0 || (num == 0 && !d->zero_ok))) ||
            (d->kind == V_INT && num != floor(num)))
            return verr(err, cap, x->v, d->name,
                        d->kind == V_UNIT  ? "expected a number in [0, 1], got '%s'"
                        : d->kind == V_INT ? "expected a whole number > 0, got '%s'"
                        : d->zero_ok       ? "expected a number >= 0, got '%s'"
                                           : "expected a number > 0, got '%s'",
                        x->s);
        x->num = num;
    } else if (d->kind == V_BOOL && parse_bool(x->s, &x->b)) {
        return verr(err, cap, x->v, d->name, "expected true or false, got '%s'", x->s);
    }
    return 0;
}

int kvt_envcfg_load(const char *path, struct kvt_envcfg *c, char *err, size_t errcap)
{
    memset(c, 0, sizeof(*c));
    snprintf(c->file, sizeof(c->file), "%s", path);
    struct parser p = {.vars = json_object(), .err = err, .errcap = errcap};
    char local[PATH_MAX + 8];
    snprintf(local, sizeof(local), "%s.local", path);
    int rc = parse_file(&p, path, false);
    if (!rc)
        rc = parse_file(&p, local, true);
    if (rc)
        goto out;
    const char *name;
    json_t *v;
    json_object_foreach(p.vars, name, v)
    {
        if (strncmp(name, "KVP_", 4) == 0 && !find_var(name)) {
            rc = unknown_var(v, name, err, errcap);
            goto out;
        }
    }
    c->sources = json_object();
    for (size_t i = 0; i < NVARS && !rc; i++) {
        const struct var *d = &vars[i];
        v = json_object_get(p.vars, d->name);
        struct val x = {.v = v, .name = d->name};
        x.s = v ? json_string_value(json_object_get(v, "value")) : d->def;
        json_object_set_new(
            c->sources, d->name,
            json_string(v ? json_string_value(json_object_get(v, "src")) : "default"));
        if (!x.s)
            rc = verr(err, errcap, v, d->name, "is required (the cache directory)%s", "");
        else if (!(rc = check_kind(d, &x, err, errcap)))
            rc = d->set(c, &x, err, errcap);
    }
out:
    json_decref(p.vars);
    if (rc)
        kvt_envcfg_free(c);
    return rc;
}

void kvt_envcfg_free(struct kvt_envcfg *c)
{
    json_decref(c->sources);
    c->sources = NULL;
    json_decref(c->quotas_bytes);
    c->quotas_bytes = NULL;
}

char *kvt_envcfg_adapter_json(const struct kvt_envcfg *c)
{
    json_t *j = json_object();
    json_object_set_new(j, "type", json_string("nixl_store_dynamic"));
    json_object_set_new(j, "backend", json_string("POSIX"));
    json_t *bp = json_object();
    json_object_set_new(bp, "file_path", json_string(c->root));
    json_object_set_new(bp, "max_capacity_gb", json_real(c->budget_gb));
    json_object_set_new(bp, "use_direct_io", json_boolean(c->direct_io));
    json_object_set_new(bp, "shard_dirs", json_boolean(c->shard_dirs));
    json_object_set_new(j, "backend_params", bp);
    json_object_set_new(j, "io_engine", json_string(c->io_engine));
    json_object_set_new(j, "num_workers", json_integer(c->num_workers));
    json_object_set_new(j, "durable", json_boolean(c->durable));
    if (strcmp(c->policy, "none") != 0) {
        json_t *ev = json_object();
        json_object_set_new(ev, "eviction_policy", json_string(c->policy));
        json_object_set_new(ev, "trigger_watermark", json_real(c->watermark));
        json_object_set_new(ev, "eviction_ratio", json_real(c->ratio));
        if (strcmp(c->policy, "value") == 0 && c->half_life_h > 0)
            json_object_set_new(ev, "half_life_hours", json_real(c->half_life_h));
        json_object_set_new(j, "eviction", ev);
    }
    /* the file (an absolute path), read again by the adapter's parse: the
     * admin API writes quotas set at run time back into it */
    if (c->quotas_bytes)
        json_object_set_new(j, "namespace_quotas", json_string(c->quotas));
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    return s;
}

json_t *kvt_envcfg_json(const struct kvt_envcfg *c)
{
    json_t *o = json_object();
    json_object_set_new(o, "file", json_string(c->file));
    json_object_set_new(o, "KVP_CACHE_ROOT", json_string(c->root));
    json_object_set_new(o, "KVP_CACHE_BUDGET_GB", json_real(c->budget_gb));
    json_object_set_new(o, "KVP_CACHE_DEVICE", json_string(c->device));
    json_object_set_new(o, "KVP_TRIGGER_WATERMARK", json_real(c->watermark));
    json_object_set_new(o, "KVP_EVICTION_RATIO", json_real(c->ratio));
    json_object_set_new(o, "KVP_EVICTION_POLICY", json_string(c->policy));
    json_object_set_new(o, "KVP_VALUE_HALF_LIFE_HOURS", json_real(c->half_life_h));
    json_object_set_new(o, "KVP_QUOTAS_FILE", json_string(c->quotas));
    json_object_set_new(o, "KVP_SERVER_URL", json_string(c->url));
    json_object_set_new(o, "KVP_USE_DIRECT_IO", json_boolean(c->direct_io));
    json_object_set_new(o, "KVP_IO_ENGINE", json_string(c->io_engine));
    json_object_set_new(o, "KVP_NUM_WORKERS", json_integer(c->num_workers));
    json_object_set_new(o, "KVP_DURABLE", json_boolean(c->durable));
    json_object_set_new(o, "KVP_SHARD_DIRS", json_boolean(c->shard_dirs));
    json_object_set_new(o, "sources", json_deep_copy(c->sources));
    return o;
}
