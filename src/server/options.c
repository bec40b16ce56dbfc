/*
 * The server's flags: one table. Each row names a flag, its type, the
 * field of struct kvt_server_cfg it sets, its range, its default and its
 * --help text; the defaults, the parsing (getopt_long's list is built from
 * it), the range checks with their messages and the usage text all read
 * the table. A flag that needs more than a type gives (a path list, a
 * policy name) has a setter. Adding a flag is a field in config.h and a
 * row here (docs/extending.md).
 *
 * Errors name the flag ("kvtier server: --port: ...") and make the parse
 * return 2; what needs more than one flag is checked afterwards (config.c).
 */
#include "common/log.h"
#include "common/util.h"
#include "policy/policy.h"
#include "server/config_int.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum opt_type {
    OPT_INT,    /* an integer in [min, max] into an int (or uint32_t) field */
    OPT_NUM,    /* a finite number in [min, max] into a double */
    OPT_STR,    /* text copied into a char array (cut to its size) */
    OPT_PATH,   /* a non-empty file path that fits its char array */
    OPT_TRUE,   /* a switch: the bool field becomes true */
    OPT_FALSE,  /* a switch: the bool field becomes false */
    OPT_CHOICE, /* one of choices[] into an int-sized enum (its index) */
    OPT_FN,     /* set() does it all */
};

struct opt {
    const char *name; /* the flag, without "--" */
    enum opt_type type;
    size_t off, size;           /* the field in struct kvt_server_cfg */
    double min, max;            /* OPT_INT, OPT_NUM */
    const char *def;            /* the default, parsed as a value of the flag; NULL: none */
    const char *arg;            /* the value's name in --help; NULL for a switch */
    const char *help;           /* --help text; a '\n' starts an indented line */
    const char *const *choices; /* OPT_CHOICE */
    int (*set)(struct kvt_opt_parse *p, const struct opt *o, const char *v); /* OPT_FN, or a
                                                                              * check after */
    void (*more)(FILE *f); /* more --help lines (the policy list) */
    const char *group;     /* a --help heading before this flag */
};

#define F(field) offsetof(struct kvt_server_cfg, field), sizeof(((struct kvt_server_cfg *)0)->field)

/* ------------------------------------------------------------ setters */

static int set_bind_flag(struct kvt_opt_parse *p, const struct opt *o, const char *v)
{
    (void)o, (void)v;
    p->bind_given = true; /* --host, --port or --bind: not --config's KVP_SERVER_URL */
    return 0;
}

static int set_bind(struct kvt_opt_parse *p, const struct opt *o, const char *v)
{
    p->bind_given = true;
    if (strncmp(v, "tcp://", 6) && strncmp(v, "ipc://", 6))
        return kvt_opt_fail(o->name, "expected tcp://HOST:PORT or ipc://PATH, got '%s'", v);
    snprintf(p->c->bind, sizeof(p->c->bind), "%s", v);
    return 0;
}

static int check_power_of_two(struct kvt_opt_parse *p, const struct opt *o, const char *v)
{
    uint32_t a = p->c->l1_align;
    return a & (a - 1) ? kvt_opt_fail(o->name, "must be a power of two, got '%s'", v) : 0;
}

static int set_policy(struct kvt_opt_parse *p, const struct opt *o, const char *v)
{
    (void)o;
    const struct kvt_policy_desc *pd = kvt_policy_find(v);
    if (!pd) {
        fprintf(stderr, "kvtier server: --eviction-policy: unknown policy '%s' (known: %s)\n", v,
                kvt_policy_names());
        return 2;
    }
    snprintf(p->c->eviction_policy, sizeof(p->c->eviction_policy), "%s", pd->name);
    return 0;
}

static void policy_list(FILE *f)
{
    const struct kvt_policy_desc *d;
    for (size_t i = 0; (d = kvt_policy_at(i)); i++)
        fprintf(f, "                                  %-9s %s\n", d->name, d->help);
}

static int add_adapter(struct kvt_opt_parse *p, const struct opt *o, const char *v)
{
    (void)o;
    if (p->nl2 == KVT_MAX_ADAPTERS) {
        fprintf(stderr, "kvtier server: --l2-adapter: at most %d adapters\n", KVT_MAX_ADAPTERS);
        return 2;
    }
    p->l2_args[p->nl2++] = v;
    return 0;
}

static int check_nonempty(struct kvt_opt_parse *p, const struct opt *o, const char *v)
{
    (void)p;
    return v[0] ? 0 : kvt_opt_fail(o->name, "must not be empty%s", "");
}

static int set_max_object(struct kvt_opt_parse *p, const struct opt *o, const char *v)
{
    double d;
    int rc = kvt_opt_num(o->name, v, 0.001, (double)KVT_MAX_OBJECT / 1048576.0, &d);
    if (!rc)
        p->c->max_object_bytes = (uint64_t)(d * 1048576.0);
    return rc;
}

static int set_lmc_host(struct kvt_opt_parse *p, const struct opt *o, const char *v)
{
    struct kvt_lmc_cfg *l = &p->c->lmc;
    if (!v[0] || strlen(v) >= sizeof(l->host))
        return kvt_opt_fail(o->name, "expected a host name or address, got '%s'", v);
    if (kvt_lmc_host_is_ipc(v) && v[6] != '/' && v[6] != '@')
        return kvt_opt_fail(o->name, "expected ipc:///ABSOLUTE/PATH or ipc://@NAME, got '%s'", v);
    snprintf(l->host, sizeof(l->host), "%s", v);
    return 0;
}

static int set_lmc_client(struct kvt_opt_parse *p, const struct opt *o, const char *v)
{
    struct kvt_lmc_cfg *l = &p->c->lmc;
    if (!v[0] || strlen(v) >= sizeof(l->client))
        return kvt_opt_fail(o->name, "expected a client's name= label or public key, got '%s'", v);
    snprintf(l->client, sizeof(l->client), "%s", v);
    return 0;
}

static int set_lmc_shm(struct kvt_opt_parse *p, const struct opt *o, const char *v)
{
    /* LMCache's rule: the name always starts with lmcache_l1_pool_ */
    const char *b = v;
    while (*b == '/')
        b++;
    bool pre = strncmp(b, "lmcache_l1_pool_", 16) == 0;
    size_t bl = strlen(b);
    if (!bl || bl > 200 || strchr(b, '/'))
        return kvt_opt_fail(o->name,
                            "expected a POSIX shared-memory name (no '/', at most 200 "
                            "characters), got '%s'",
                            v);
    snprintf(p->c->lmc.shm_name, sizeof(p->c->lmc.shm_name), "%s%.200s",
             pre ? "" : "lmcache_l1_pool_", b);
    return 0;
}

static int set_log_level(struct kvt_opt_parse *p, const struct opt *o, const char *v)
{
    int lv = kvt_log_parse_level(v);
    if (lv < 0)
        return kvt_opt_fail(o->name, "expected debug, info, warn or error, got '%s'", v);
    p->c->log_level = lv;
    return 0;
}

static int set_log_format(struct kvt_opt_parse *p, const struct opt *o, const char *v)
{
    p->c->log_format = kvt_log_parse_format(v);
    if (p->c->log_format < 0)
        return kvt_opt_fail(o->name, "expected text or json, got '%s'", v);
    return 0;
}

static int set_config(struct kvt_opt_parse *p, const struct opt *o, const char *v)
{
    (void)o;
    p->config_path = v;
    return 0;
}

static int show_help(struct kvt_opt_parse *p, const struct opt *o, const char *v)
{
    (void)p, (void)o, (void)v;
    kvt_server_usage(stdout);
    return 1;
}

/* ------------------------------------------------------------ the table */

static const char *const store_policies[] = {"default", "skip_l1", NULL};   /* enum order */
static const char *const prefetch_policies[] = {"default", "retain", NULL}; /* enum order */

#define INT(n, field, lo, hi, d)                                                                   \
    .name = n, .type = OPT_INT, .off = F(field), .min = lo, .max = hi, .def = d
#define NUM(n, field, lo, hi, d)                                                                   \
    .name = n, .type = OPT_NUM, .off = F(field), .min = lo, .max = hi, .def = d
#define STR(n, field, d) .name = n, .type = OPT_STR, .off = F(field), .def = d
#define PATHF(n, field) .name = n, .type = OPT_PATH, .off = F(field)
#define SWITCH(n, t, field) .name = n, .type = t, .off = F(field)
#define FN(n, fn) .name = n, .type = OPT_FN, .set = fn

/* clang-format off */
static const struct opt opts[] = {
    {STR("host", host, "127.0.0.1"), .set = set_bind_flag, .arg = "HOST",
     .help = "bind address (127.0.0.1)", .group = "Listening"},
    {INT("port", port, 1, 65535, "5555"), .set = set_bind_flag, .arg = "N", .help = "port (5555)"},
    {FN("bind", set_bind), .arg = "URL",
     .help = "ZeroMQ endpoint instead of host/port (tcp://..., ipc://...)"},
    {STR("http-host", http_host, "127.0.0.1"), .arg = "HOST",
     .help = "HTTP address for /healthz /status /metrics (127.0.0.1)"},
    {INT("http-port", http_port, 0, 65535, "8080"), .arg = "N", .help = "HTTP port (8080; 0 = off)"},
    {INT("max-workers", max_workers, 1, 1024, "4"), .arg = "N", .help = "handler threads (4)"},
    {INT("io-threads", io_threads, 1, 64, NULL), .arg = "N",
     .help = "ZeroMQ I/O threads of the client port (1; with\n"
             "--auth-key half the CPUs, 1..4: CURVE encrypts there)"},
    {INT("chunk-size", chunk_size, 1, 1 << 20, "256"), .arg = "N",
     .help = "tokens per chunk, reported to clients (256)"},
    {FN("max-object-mb", set_max_object), .def = "1024", .arg = "N",
     .help = "largest object accepted (1024)"},
    {SWITCH("no-shm", OPT_FALSE, shm), .def = "true",
     .help = "do not offer the shared-memory data path"},
    {SWITCH("no-local-socket", OPT_FALSE, local), .def = "true",
     .help = "do not offer the same-host unix socket"},

    /* its range depends on --l1-align-bytes: checked after (config.c) */
    {NUM("l1-size-gb", l1_size_gb, -HUGE_VAL, HUGE_VAL, "1.0"), .arg = "G",
     .help = "pool size (1.0); checked against the host's memory", .group = "L1 (shared memory)"},
    {NUM("l1-init-size-gb", l1_init_size_gb, 0.001, 65536, "20.0"), .arg = "G",
     .help = "initial size with lazy growth (20, capped)"},
    {SWITCH("l1-use-lazy", OPT_TRUE, l1_lazy), .def = "true",
     .help = "grow on demand (default: lazy)"},
    {SWITCH("no-l1-use-lazy", OPT_FALSE, l1_lazy), .help = "preallocate the pool at start"},
    {INT("l1-align-bytes", l1_align, 512, 1 << 24, "4096"), .set = check_power_of_two,
     .arg = "N", .help = "object alignment (4096)"},
    {SWITCH("l1-use-hugepages", OPT_TRUE, l1_hugepages), .help = "back the pool with huge pages"},
    {NUM("l1-write-ttl-seconds", l1_write_ttl_s, 0.001, 1e7, "600"), .arg = "S",
     .help = "write reservation TTL (600)"},
    {NUM("l1-read-ttl-seconds", l1_read_ttl_s, 0.001, 1e7, "300"), .arg = "S",
     .help = "read lock TTL (300)"},
    {FN("eviction-policy", set_policy), .def = "adaptive", .arg = "P",
     .help = "L1 policy, any case (adaptive):", .more = policy_list},
    {NUM("eviction-trigger-watermark", eviction_watermark, 0, 1, "0.8"), .arg = "F",
     .help = "(0.8)"},
    {NUM("eviction-ratio", eviction_ratio, 0, 1, "0.2"), .arg = "F", .help = "(0.2)"},
    {INT("eviction-interval-ms", eviction_interval_ms, 1, 3600000, "1000"), .arg = "N",
     .help = "eviction controller period (1000)"},

    {FN("l2-adapter", add_adapter), .arg = "JSON",
     .help = "repeatable; order = adapter index. Without it: fs under --data-dir", .group = "L2"},
    {STR("data-dir", data_dir, "./kvtier-data"), .set = check_nonempty, .arg = "DIR",
     .help = "embedded default L2 directory (./kvtier-data)"},
    {SWITCH("no-l2", OPT_TRUE, no_l2), .help = "no L2 at all: a memory-only cache"},
    {.name = "l2-store-policy", .type = OPT_CHOICE, .off = F(store_policy),
     .choices = store_policies, .arg = "default|skip_l1",
     .help = "(default); skip_l1: objects leave L1 once in L2"},
    {.name = "l2-prefetch-policy", .type = OPT_CHOICE, .off = F(prefetch_policy),
     .choices = prefetch_policies, .arg = "default|retain", .help = "(default)"},
    {INT("l2-prefetch-max-in-flight", prefetch_max_in_flight, 1, 4096, "8"), .arg = "N",
     .help = "(8)"},
    {INT("max-pinned-mb", max_pinned_mb, 0, 1 << 30, "256"), .arg = "N",
     .help = "most MiB of objects the admin API may pin (256)"},
    {FN("config", set_config), .arg = "FILE",
     .help = "operator config (cache.env + cache.env.local): one\n"
             "nixl_store_dynamic adapter under KVP_CACHE_ROOT with\n"
             "the hard cap KVP_CACHE_BUDGET_GB (adapter #0); see\n"
             "docs/operations.md"},

    {INT("lmcache-port", lmc.port, 0, 65535, NULL), .arg = "N",
     .help = "also answer LMCache's multi-process protocol\n"
             "(vLLM's LMCacheMPConnector, engine_driven) on N (0 = off)",
     .group = "LMCache drop-in (docs/lmcache-protocol.md)"},
    {FN("lmcache-host", set_lmc_host), .def = "localhost", .arg = "HOST",
     .help = "its bind address (localhost, as lmcache server), or\n"
             "ipc://PATH: a Unix socket PATH:PORT (with --auth-key)"},
    {FN("lmcache-client", set_lmc_client), .arg = "NAME",
     .help = "with --auth-key: the authorized client (name= or\n"
             "public key) that requests on the LMCache port act as"},
    {FN("lmcache-shm-name", set_lmc_shm), .arg = "NAME",
     .help = "POSIX shm name of the L1 pool handed to workers\n"
             "(lmcache_l1_pool_kvtier_<pid>)"},

    {STR("kv-events-endpoint", events.endpoint, ""), .arg = "URL",
     .help = "publish KV events in vLLM's format on a ZeroMQ PUB\n"
             "socket bound here (tcp://127.0.0.1:5557; off)",
     .group = "KV events (docs/events.md)"},
    {STR("kv-events-replay-endpoint", events.replay, ""), .arg = "URL",
     .help = "ROUTER socket that replays buffered batches from a\n"
             "sequence number on (off)"},
    {STR("kv-events-topic", events.topic, ""), .arg = "TOPIC",
     .help = "first frame of every message (\"\")"},
    {INT("kv-events-buffer", events.buffer, 1, 10000000, "10000"), .arg = "N",
     .help = "batches kept for replay (10000)"},
    {INT("kv-events-queue", events.queue, 1, 1 << 26, "262144"), .arg = "N",
     .help = "tier events waiting to be published; more are\n"
             "dropped and counted (262144)"},
    {INT("kv-events-hwm", events.hwm, 0, 1 << 30, "100000"), .arg = "N",
     .help = "PUB send high-water mark in messages (100000)"},
    {INT("kv-events-wait-subscriber-ms", events.wait_sub_ms, 0, 600000, "10000"), .arg = "MS",
     .help = "at start, hold the first batches (AllBlocksCleared,\n"
             "what recovery found) until a subscriber has\n"
             "subscribed, at most this long (10000; 0: never)"},

    {PATHF("auth-key", auth_key_file), .arg = "FILE",
     .help = "the server's CURVE secret key (kvtier keygen; mode\n"
             "0600): TCP clients must present a listed key",
     .group = "Authentication (docs/security.md)"},
    {PATHF("auth-clients", auth_clients_file), .arg = "FILE",
     .help = "authorized clients: one public key a line with\n"
             "ro|rw, its tenants (cache salts) and [admin]"},
    {PATHF("http-token", http_token_file), .arg = "FILE",
     .help = "bearer token /status and /metrics require (mode 0600)"},
    {PATHF("admin-token", admin_token_file), .arg = "FILE",
     .help = "bearer token the admin API (/admin/...) requires\n"
             "(mode 0600); without it the admin API answers\n"
             "loopback only, and nobody with --auth-key"},
    {SWITCH("insecure-no-auth", OPT_TRUE, insecure_no_auth),
     .help = "allow listening beyond loopback without\n"
             "authentication (warned at start, shown in /healthz)"},

    {SWITCH("dry-run", OPT_TRUE, dry_run),
     .help = "validate (config, directories, devices,\n"
             "credentials), print the resolved config, exit",
     .group = "Other"},
    {SWITCH("no-storage-check", OPT_TRUE, no_storage_check),
     .help = "with --dry-run: the config only, not the storage\n"
             "it names (a config for another machine)"},
    {FN("log-level", set_log_level), .arg = "debug|info|warn|error", .help = "(info)"},
    {FN("log-format", set_log_format), .arg = "text|json",
     .help = "json: one JSON object per line {ts, level, msg}\n"
             "(text; or KVT_LOG_FORMAT)"},
    {FN("help", show_help), .help = "this text"},
};
/* clang-format on */

#define NOPTS (sizeof(opts) / sizeof(opts[0]))

/* ------------------------------------------------------------ parsing */

int kvt_opt_fail(const char *flag, const char *fmt, const char *val)
{
    fprintf(stderr, "kvtier server: --%s: ", flag);
    fprintf(stderr, fmt, val);
    fprintf(stderr, "\n");
    return 2;
}

int kvt_opt_num(const char *flag, const char *s, double min, double max, double *out)
{
    char *end;
    errno = 0;
    double d = strtod(s, &end);
    if (end == s || *end || errno || !isfinite(d))
        return kvt_opt_fail(flag, "expected a number, got '%s'", s);
    if (d < min || d > max) {
        fprintf(stderr, "kvtier server: --%s: %g is out of range [%g, %g]\n", flag, d, min, max);
        return 2;
    }
    *out = d;
    return 0;
}

static int integer(const char *flag, const char *s, long min, long max, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno)
        return kvt_opt_fail(flag, "expected an integer, got '%s'", s);
    if (v < min || v > max) {
        fprintf(stderr, "kvtier server: --%s: %ld is out of range [%ld, %ld]\n", flag, v, min, max);
        return 2;
    }
    *out = v;
    return 0;
}

/* "default or skip_l1": the choices, for an error message */
static void choice_list(const struct opt *o, char *out, size_t cap)
{
    size_t n = 0, len = 0;
    while (o->choices[n])
        n++;
    out[0] = 0;
    for (size_t i = 0; i < n && len < cap; i++)
        len += (size_t)snprintf(out + len, cap - len, "%s%s",
                                i == 0      ? ""
                                : i + 1 < n ? ", "
                                            : " or ",
                                o->choices[i]);
}

/* Apply one flag's value (v: NULL for a switch). 0, 1 (--help) or 2. */
static int apply(struct kvt_opt_parse *p, const struct opt *o, const char *v)
{
    char *field = (char *)p->c + o->off;
    int rc = 0;
    switch (o->type) {
    case OPT_INT: {
        long l = 0;
        rc = integer(o->name, v, (long)o->min, (long)o->max, &l);
        if (!rc && o->size == sizeof(int)) {
            int i = (int)l; /* int and uint32_t fields: the range keeps it positive there */
            memcpy(field, &i, sizeof(i));
        }
        break;
    }
    case OPT_NUM:
        rc = kvt_opt_num(o->name, v, o->min, o->max, (double *)(void *)field);
        break;
    case OPT_STR:
        snprintf(field, o->size, "%s", v);
        break;
    case OPT_PATH:
        if (!v[0] || strlen(v) >= o->size)
            return kvt_opt_fail(o->name, "expected a file path, got '%s'", v);
        snprintf(field, o->size, "%s", v);
        break;
    case OPT_TRUE:
    case OPT_FALSE:
        *(bool *)(void *)field = o->type == OPT_TRUE;
        break;
    case OPT_CHOICE: {
        int i = 0;
        while (o->choices[i] && strcmp(o->choices[i], v))
            i++;
        if (!o->choices[i]) {
            char list[128], fmt[200];
            choice_list(o, list, sizeof(list));
            snprintf(fmt, sizeof(fmt), "expected %s, got '%%s'", list);
            return kvt_opt_fail(o->name, fmt, v);
        }
        memcpy(field, &i, sizeof(i)); /* an enum field, int-sized */
        break;
    }
    case OPT_FN:
        return o->set(p, o, v);
    }
    if (!rc && o->set)
        rc = o->set(p, o, v); /* a check or a side effect after the type's parse */
    return rc;
}

void kvt_opt_defaults(struct kvt_opt_parse *p)
{
    memset(p->c, 0, sizeof(*p->c));
    for (size_t i = 0; i < NOPTS; i++) {
        const struct opt *o = &opts[i];
        if (!o->def)
            continue;
        int rc = 0;
        if (o->type == OPT_TRUE || o->type == OPT_FALSE)
            *(bool *)(void *)((char *)p->c + o->off) = strcmp(o->def, "true") == 0;
        else
            rc = apply(p, o, o->def);
        (void)rc; /* the table's defaults are valid values */
    }
    p->bind_given = false; /* --host's default is not a --host */
    p->c->log_level = kvt_log_level_current;
}

int kvt_opt_parse_args(struct kvt_opt_parse *p, int argc, char **argv)
{
    struct option lo[NOPTS + 1];
    for (size_t i = 0; i < NOPTS; i++) {
        bool takes = opts[i].type != OPT_TRUE && opts[i].type != OPT_FALSE && opts[i].arg;
        lo[i] = (struct option){opts[i].name, takes ? required_argument : no_argument, NULL,
                                256 + (int)i};
    }
    lo[NOPTS] = (struct option){NULL, 0, NULL, 0};
    int ch;
    optind = 1;
    opterr = 0;
    while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        if (ch < 256 || ch >= 256 + (int)NOPTS) {
            if (optopt >= 256 && optopt < 256 + (int)NOPTS)
                fprintf(stderr, "kvtier server: --%s needs a value\n", opts[optopt - 256].name);
            else
                fprintf(stderr, "kvtier server: unknown option '%s' (see kvtier server --help)\n",
                        argv[optind - 1]);
            return 2;
        }
        const struct opt *o = &opts[ch - 256];
        int rc = apply(p, o, lo[ch - 256].has_arg ? optarg : NULL);
        if (rc)
            return rc;
    }
    if (optind < argc) {
        fprintf(stderr, "kvtier server: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    return 0;
}

/* ------------------------------------------------------------ --help */

void kvt_server_usage(FILE *f)
{
    fprintf(f, "usage: kvtier server [options]\n");
    for (size_t i = 0; i < NOPTS; i++) {
        const struct opt *o = &opts[i];
        if (o->group)
            fprintf(f, "%s%s\n", i == 0 ? "\n" : "", o->group);
        char left[64];
        snprintf(left, sizeof(left), "--%s%s%s", o->name, o->arg ? " " : "", o->arg ? o->arg : "");
        fprintf(f, strlen(left) < 30 ? "  %-30s" : "  %s  ", left);
        for (const char *h = o->help; *h;) { /* continuation lines: indented */
            const char *nl = strchr(h, '\n');
            int len = nl ? (int)(nl - h) : (int)strlen(h);
            fprintf(f, "%.*s\n", len, h);
            if (!nl)
                break;
            fprintf(f, "%32s", "");
            h = nl + 1;
        }
        if (!o->help[0])
            fprintf(f, "\n");
        if (o->more)
            o->more(f);
    }
}
