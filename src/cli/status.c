/*
 * kvtier status: what a cache holds, as a table or JSON.
 *
 *   kvtier status [--url URL]                 a running server (all tiers)
 *   kvtier status --root DIR [--budget-gb N]  offline: a scan of a cache root
 *   kvtier status --config cache.env          the server at KVP_SERVER_URL if it
 *                                             serves KVP_CACHE_ROOT, else a scan
 *
 * Both modes report the kv-persistence seed's fields for the cache root
 * (docs/operations.md): used_bytes, free_bytes, usage_fraction,
 * soft_pressure, per_namespace_bytes, namespaces, evictions,
 * reclaimed_bytes, rejected_writes, tmp_files, tmp_files_bytes, plus
 * quotas, the file system and per-adapter health. Online, they are merged
 * into the server's full status object (--json).
 */
#include "cli/cli.h"
#include "common/util.h"
#include "kvtier/error.h"
#include "ops/cli.h"
#include "l2/kit/quota.h"
#include "ops/rpc.h"
#include "ops/scan.h"

#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#define human kvt_human

static json_int_t ji(const json_t *o, const char *k)
{
    return json_integer_value(json_object_get(o, k));
}

static void print_table(const json_t *st)
{
    char a[32], b[32];
    const json_t *h = json_object_get(st, "health");
    printf("%s  pid %lld  listening %s  uptime %.0f s\n",
           json_string_value(json_object_get(st, "server")), (long long)ji(st, "pid"),
           json_string_value(json_object_get(st, "listen")),
           json_real_value(json_object_get(st, "uptime_seconds")));
    printf("health: %s (%s)\n\n",
           json_is_true(json_object_get(h, "is_healthy")) ? "healthy" : "UNHEALTHY",
           json_string_value(json_object_get(h, "detail")));
    const json_t *l1 = json_object_get(st, "l1");
    const json_t *c1 = json_object_get(l1, "counters");
    const char *l1warn =
        json_string_value(json_object_get(json_object_get(l1, "host_memory"), "warning"));
    if (l1warn)
        printf("warning: L1: %s\n\n", l1warn);
    human(a, sizeof(a), (double)ji(l1, "used_bytes"));
    human(b, sizeof(b), (double)ji(l1, "capacity_bytes"));
    /* column widths fit the longest adapter name and type */
    int nw = 10, tw = 8;
    size_t i;
    const json_t *ad;
    json_array_foreach(json_object_get(st, "l2"), i, ad)
    {
        const char *n = json_string_value(json_object_get(ad, "name"));
        const char *t = json_string_value(json_object_get(ad, "type"));
        if (n && (int)strlen(n) > nw)
            nw = (int)strlen(n);
        if (t && (int)strlen(t) > tw)
            tw = (int)strlen(t);
    }
    printf("%-*s %-*s %12s %12s %7s %10s %10s %10s %9s  %s\n", nw, "TIER", tw, "TYPE", "USED",
           "CAPACITY", "USE%", "OBJECTS", "HITS", "MISSES", "EVICTED", "HEALTH");
    printf("%-*s %-*s %12s %12s %6.1f%% %10lld %10lld %10lld %9lld  %s\n", nw, "L1", tw, "memory",
           a, b, 100 * json_real_value(json_object_get(l1, "usage_fraction")),
           (long long)ji(l1, "objects"), (long long)ji(c1, "hits"), (long long)ji(c1, "misses"),
           (long long)ji(c1, "evictions"), "ok");
    json_array_foreach(json_object_get(st, "l2"), i, ad)
    {
        const json_t *c = json_object_get(ad, "counters");
        human(a, sizeof(a), (double)ji(ad, "used_bytes"));
        json_int_t cap = ji(ad, "capacity_bytes");
        if (cap)
            human(b, sizeof(b), (double)cap);
        else
            snprintf(b, sizeof(b), "unlimited");
        double frac = json_real_value(json_object_get(ad, "usage_fraction"));
        char pct[16];
        if (frac >= 0)
            snprintf(pct, sizeof(pct), "%5.1f%%", 100 * frac);
        else
            snprintf(pct, sizeof(pct), "%6s", "-");
        printf("%-*s %-*s %12s %12s %7s %10lld %10lld %10lld %9lld  %s\n", nw,
               json_string_value(json_object_get(ad, "name")), tw,
               json_string_value(json_object_get(ad, "type")), a, b, pct,
               (long long)ji(ad, "objects"), (long long)ji(c, "lookup_hits"),
               (long long)ji(c, "lookup_misses"), (long long)ji(c, "evictions"),
               json_string_value(json_object_get(ad, "health")));
    }
    json_array_foreach(json_object_get(st, "l2"), i, ad)
    {
        size_t k;
        const json_t *nd;
        json_array_foreach(json_object_get(ad, "nodes"), k, nd)
        {
            const char *err = json_string_value(json_object_get(nd, "last_error"));
            if (json_is_true(json_object_get(nd, "up")) && !err)
                continue;
            printf("  %s node %s (%s): %s", json_string_value(json_object_get(ad, "name")),
                   json_string_value(json_object_get(nd, "node")),
                   json_string_value(json_object_get(nd, "role")),
                   json_string_value(json_object_get(nd, "state")));
            if (!json_is_true(json_object_get(nd, "up")))
                printf(" for %.1f s", json_number_value(json_object_get(nd, "down_seconds")));
            if (err)
                printf(": %s", err);
            printf("\n");
        }
    }
    printf("\nL1 fragmentation %.3f, %lld read / %lld write leases\n",
           json_real_value(json_object_get(l1, "fragmentation")), (long long)ji(l1, "read_leases"),
           (long long)ji(l1, "write_leases"));
    json_array_foreach(json_object_get(st, "l2"), i, ad)
    {
        const json_t *c = json_object_get(ad, "counters");
        const json_t *rec = json_object_get(ad, "recovery");
        printf("%s: rejected_writes %lld, corrupt %lld, store_failed %lld (too big %lld), "
               "recovery %s (%lld objects)\n",
               json_string_value(json_object_get(ad, "name")), (long long)ji(c, "rejected_writes"),
               (long long)ji(c, "corrupt"), (long long)ji(c, "store_failed"),
               (long long)ji(c, "too_big"), json_string_value(json_object_get(rec, "state")),
               (long long)ji(rec, "objects"));
    }
    const json_t *sc = json_object_get(st, "store");
    printf("store controller: %lld batches in flight, %lld keys to L2 ok, %lld failed\n",
           (long long)ji(sc, "in_flight_batches"), (long long)ji(sc, "l2_keys_ok"),
           (long long)ji(sc, "l2_keys_failed"));
}

/* ------------------------------------------------------- the seed report */

static void set_u(json_t *o, const char *k, uint64_t v)
{
    json_object_set_new(o, k, json_integer((json_int_t)v));
}

/* used/free/fraction/pressure from used and budget (capacity). */
static void put_usage(json_t *o, uint64_t used, uint64_t cap, double wm)
{
    set_u(o, "used_bytes", used);
    set_u(o, "budget_bytes", cap);
    json_object_set_new(o, "free_bytes",
                        cap ? json_integer((json_int_t)(cap > used ? cap - used : 0))
                            : json_null());
    double frac = cap ? (double)used / (double)cap : -1.0;
    json_object_set_new(o, "usage_fraction", json_real(frac));
    json_object_set_new(o, "trigger_watermark", json_real(wm));
    json_object_set_new(o, "soft_pressure", json_boolean(cap && frac >= wm));
}

static void put_namespaces(json_t *o, json_t *per_ns)
{
    json_t *names = json_array();
    const char *k;
    json_t *v;
    json_object_foreach(per_ns, k, v) json_array_append_new(names, json_string(k));
    /* jansson keeps insertion order: sort for people and diffs */
    size_t n = json_array_size(names);
    for (size_t i = 1; i < n; i++)
        for (size_t j = i; j > 0 && strcmp(json_string_value(json_array_get(names, j - 1)),
                                           json_string_value(json_array_get(names, j))) > 0;
             j--) {
            json_t *a = json_incref(json_array_get(names, j - 1));
            json_array_set(names, j - 1, json_array_get(names, j));
            json_array_set_new(names, j, a);
        }
    json_object_set(o, "per_namespace_bytes", per_ns);
    json_object_set_new(o, "namespaces", names);
}

static void put_tmp(json_t *o, const struct kvt_scan *sc, const char *source)
{
    set_u(o, "tmp_files", sc->tmp_files);
    set_u(o, "tmp_files_bytes", sc->tmp_bytes);
    json_t *t = json_object();
    for (int v = 0; v < KVT_TMP_NVERDICTS; v++) {
        if (v == KVT_TMP_OURS)
            continue;
        json_t *e = json_object();
        set_u(e, "files", sc->tmp_n[v]);
        set_u(e, "bytes", sc->tmp_b[v]);
        json_object_set_new(t, kvt_tmp_verdict_name((enum kvt_tmp_verdict)v), e);
    }
    json_object_set_new(t, "source", json_string(source));
    set_u(t, "registry_markers", sc->markers);
    json_object_set_new(o, "tmp", t);
}

/* The seed's fields from a server's status and the chosen adapter. */
static json_t *report_online(const json_t *st, const json_t *ad, const struct kvt_cli_target *t)
{
    json_t *o = json_object();
    const json_t *c = json_object_get(ad, "counters");
    const json_t *ev = json_object_get(ad, "eviction");
    const json_t *wmv = json_object_get(ev, "trigger_watermark");
    double wm = wmv ? json_real_value(wmv) : t->have_cfg ? t->cfg.watermark : 0.9;
    const char *fp = kvt_cli_adapter_root(ad);
    json_object_set_new(o, "source", json_string("server"));
    json_object_set_new(o, "url", json_string(t->url));
    json_object_set_new(o, "root", fp ? json_string(fp) : json_null());
    json_object_set(o, "adapter", json_object_get(ad, "name"));
    put_usage(o, (uint64_t)ji(ad, "used_bytes"), (uint64_t)ji(ad, "capacity_bytes"), wm);
    set_u(o, "objects", (uint64_t)ji(ad, "objects"));
    put_namespaces(o, json_object_get(ad, "per_namespace_bytes"));
    const json_t *pno = json_object_get(ad, "per_namespace_objects");
    if (pno)
        json_object_set(o, "per_namespace_objects", (json_t *)pno);
    set_u(o, "evictions", (uint64_t)ji(c, "evictions"));
    set_u(o, "reclaimed_bytes", (uint64_t)ji(c, "reclaimed_bytes"));
    set_u(o, "rejected_writes", (uint64_t)ji(c, "rejected_writes"));
    set_u(o, "quota_rejections", (uint64_t)ji(c, "quota_rejections"));
    struct kvt_scan sc;
    if (fp && kvt_scan_root(fp, &sc, true) == 0) { /* the root is on this host */
        put_tmp(o, &sc, "scan");
        kvt_scan_free(&sc);
    } else {
        memset(&sc, 0, sizeof(sc));
        sc.tmp_files = (uint64_t)ji(ad, "tmp_kept");
        sc.tmp_bytes = (uint64_t)ji(ad, "tmp_kept_bytes");
        put_tmp(o, &sc, "server (kept at start-up)");
    }
    const json_t *q = json_object_get(ad, "namespace_quotas");
    json_object_set(o, "namespace_quotas", q ? (json_t *)q : json_null());
    const json_t *fs = json_object_get(ad, "filesystem");
    json_object_set(o, "filesystem", fs ? (json_t *)fs : json_null());
    json_t *ads = json_array();
    size_t i;
    const json_t *a;
    json_array_foreach(json_object_get(st, "l2"), i, a)
    {
        json_t *e = json_object();
        static const char *const keys[] = {"name",       "type",           "is_healthy", "health",
                                           "used_bytes", "capacity_bytes", "objects",    NULL};
        for (int k = 0; keys[k]; k++)
            json_object_set(e, keys[k], json_object_get(a, keys[k]));
        json_object_set(e, "recovery", json_object_get(json_object_get(a, "recovery"), "state"));
        json_array_append_new(ads, e);
    }
    json_object_set_new(o, "adapters", ads);
    return o;
}

/* The seed's fields from an offline scan. */
static json_t *report_offline(const struct kvt_scan *sc, const struct kvt_cli_target *t,
                              double budget_gb)
{
    json_t *o = json_object();
    json_object_set_new(o, "source", json_string("scan"));
    json_object_set_new(o, "root", json_string(t->root));
    double wm = t->have_cfg ? t->cfg.watermark : 0.9;
    put_usage(o, sc->used_bytes, (uint64_t)(budget_gb * KVT_GIB), wm);
    set_u(o, "objects", sc->objects);
    put_namespaces(o, sc->per_ns_bytes);
    json_object_set(o, "per_namespace_objects", sc->per_ns_objects);
    /* counters live in a server: unknown offline */
    json_object_set_new(o, "evictions", json_null());
    json_object_set_new(o, "reclaimed_bytes", json_null());
    json_object_set_new(o, "rejected_writes", json_null());
    put_tmp(o, sc, "scan");
    set_u(o, "legacy_bytes", sc->legacy_bytes);
    set_u(o, "other_files", sc->other_files);
    set_u(o, "other_bytes", sc->other_bytes);
    json_t *quotas = json_null();
    if (t->have_cfg && t->cfg.quotas_bytes) { /* read and checked with the config */
        quotas = json_object();
        const char *k;
        json_t *v;
        json_object_foreach(t->cfg.quotas_bytes, k, v)
        {
            json_t *e = json_object();
            uint64_t lim = (uint64_t)json_integer_value(v);
            uint64_t used = (uint64_t)ji(sc->per_ns_bytes, k);
            set_u(e, "quota_bytes", lim);
            set_u(e, "used_bytes", used);
            json_object_set_new(e, "usage_fraction",
                                lim ? json_real((double)used / (double)lim) : json_null());
            json_object_set_new(e, "rejected_writes", json_null()); /* a server's counter */
            json_object_set_new(quotas, k, e);
        }
    }
    json_object_set_new(o, "namespace_quotas", quotas);
    json_t *fs = json_object();
    set_u(fs, "total_bytes", sc->fs_total_bytes);
    set_u(fs, "free_bytes", sc->fs_free_bytes);
    uint64_t cap = (uint64_t)(budget_gb * KVT_GIB);
    json_object_set_new(fs, "can_hold_capacity",
                        json_boolean(sc->fs_free_bytes + sc->used_bytes >= cap));
    json_object_set_new(o, "filesystem", fs);
    pid_t pids[16];
    int n = kvt_root_users(t->root, pids, 16);
    json_t *users = json_array();
    for (int i = 0; i < n && i < 16; i++)
        json_array_append_new(users, json_integer(pids[i]));
    json_object_set_new(o, "processes_using_root", users);
    return o;
}

static void print_cache(const json_t *r)
{
    char a[32], b[32], c[32];
    const char *src = json_string_value(json_object_get(r, "source"));
    const char *root = json_string_value(json_object_get(r, "root"));
    if (strcmp(src, "server") == 0)
        printf("\ncache %s (server %s, adapter %s)\n", root ? root : "-",
               json_string_value(json_object_get(r, "url")),
               json_string_value(json_object_get(r, "adapter")));
    else
        printf("cache %s (offline scan)\n", root);
    json_int_t cap = ji(r, "budget_bytes");
    human(a, sizeof(a), (double)ji(r, "used_bytes"));
    human(b, sizeof(b), (double)cap);
    human(c, sizeof(c), (double)ji(r, "free_bytes"));
    double wm = json_real_value(json_object_get(r, "trigger_watermark"));
    if (cap)
        printf("  used          %s of %s (%.1f%%), free %s; soft pressure: %s (watermark %.0f%%)\n",
               a, b, 100 * json_real_value(json_object_get(r, "usage_fraction")), c,
               json_is_true(json_object_get(r, "soft_pressure")) ? "YES" : "no", 100 * wm);
    else
        printf("  used          %s (no cap)\n", a);
    printf("  objects       %lld in %zu namespace(s)\n", (long long)ji(r, "objects"),
           json_array_size(json_object_get(r, "namespaces")));
    if (json_is_null(json_object_get(r, "evictions"))) {
        printf("  evictions     - (counters need a running server)\n");
    } else {
        human(a, sizeof(a), (double)ji(r, "reclaimed_bytes"));
        printf("  evictions     %lld (%s reclaimed), rejected writes %lld\n",
               (long long)ji(r, "evictions"), a, (long long)ji(r, "rejected_writes"));
    }
    const json_t *tmp = json_object_get(r, "tmp");
    human(a, sizeof(a), (double)ji(r, "tmp_files_bytes"));
    printf("  tmp files     %lld (%s)", (long long)ji(r, "tmp_files"), a);
    const char *vk;
    json_t *vv;
    bool first = true;
    json_object_foreach((json_t *)tmp, vk, vv)
    {
        if (!json_is_object(vv) || !ji(vv, "files"))
            continue;
        printf("%s%lld %s", first ? ": " : ", ", (long long)ji(vv, "files"), vk);
        first = false;
    }
    printf("\n");
    const json_t *fs = json_object_get(r, "filesystem");
    if (json_is_object(fs)) {
        human(a, sizeof(a), (double)ji(fs, "total_bytes"));
        human(b, sizeof(b), (double)ji(fs, "free_bytes"));
        bool ok = !json_is_false(json_object_get(fs, "can_hold_capacity"));
        printf("  file system   %s, %s free%s\n", a, b,
               ok ? "" : "  WARNING: it cannot hold the budget (free + cache < budget)");
    }
    const json_t *per = json_object_get(r, "per_namespace_bytes");
    const json_t *objs = json_object_get(r, "per_namespace_objects");
    const json_t *quotas = json_object_get(r, "namespace_quotas");
    printf("\n  %-44s %10s %12s %12s %6s\n", "NAMESPACE", "OBJECTS", "BYTES", "QUOTA", "USE%");
    size_t i;
    const json_t *nm;
    json_array_foreach(json_object_get(r, "namespaces"), i, nm)
    {
        const char *n = json_string_value(nm);
        human(a, sizeof(a), (double)ji(per, n));
        const json_t *q = json_object_get(quotas, n);
        char on[24] = "-";
        if (objs)
            snprintf(on, sizeof(on), "%lld", (long long)ji(objs, n));
        if (q) {
            human(b, sizeof(b), (double)ji(q, "quota_bytes"));
            printf("  %-44s %10s %12s %12s %5.1f%%\n", n, on, a, b,
                   100 * json_real_value(json_object_get(q, "usage_fraction")));
        } else {
            printf("  %-44s %10s %12s %12s %6s\n", n, on, a, "-", "-");
        }
    }
    const char *qk;
    const json_t *qv;
    json_object_foreach((json_t *)quotas, qk, qv)
    {
        if (!json_object_get(per, qk)) {
            human(b, sizeof(b), (double)ji(qv, "quota_bytes"));
            printf("  %-44s %10s %12s %12s %6s\n", qk, "0", "0 B", b, "0.0%");
        }
    }
    const json_t *users = json_object_get(r, "processes_using_root");
    if (json_array_size(users))
        printf("\n  note: %zu running process(es) hold this root open (a server?): its counters "
               "are in `kvtier status --url`\n",
               json_array_size(users));
}

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: kvtier status [--url URL] [--json]             a running server\n"
        "       kvtier status --root DIR [--budget-gb N] [--json]   offline scan of a cache root\n"
        "       kvtier status --config FILE [--json]         KVP_SERVER_URL if it serves\n"
        "                                                   KVP_CACHE_ROOT, else a scan\n");
}

int kvt_cmd_status(int argc, char **argv)
{
    static const struct option opts[] = {{"url", required_argument, NULL, 'u'},
                                         {"root", required_argument, NULL, 'r'},
                                         {"config", required_argument, NULL, 'c'},
                                         {"budget-gb", required_argument, NULL, 'b'},
                                         {"json", no_argument, NULL, 'j'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    const char *url = NULL, *root = NULL, *config = NULL;
    double budget_gb = 0;
    bool as_json = false;
    int ch;
    optind = 1;
    opterr = 0;
    while ((ch = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (ch) {
        case 'u':
            url = optarg;
            break;
        case 'r':
            root = optarg;
            break;
        case 'c':
            config = optarg;
            break;
        case 'b': {
            char *end;
            budget_gb = strtod(optarg, &end);
            if (*end || !(budget_gb > 0)) {
                fprintf(stderr, "kvtier status: --budget-gb: expected a number > 0, got '%s'\n",
                        optarg);
                return 2;
            }
            break;
        }
        case 'j':
            as_json = true;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            fprintf(stderr, "kvtier status: unknown option '%s'\n", argv[optind - 1]);
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "kvtier status: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    struct kvt_cli_target t;
    int rc = kvt_cli_target("status", config, root, url, false, &t);
    if (rc)
        return rc;
    /* online unless only a directory was named; with --config, online only
     * if the configured server answers and serves the root */
    bool online = url || !t.root[0] || config;
    json_t *st = NULL, *report = NULL;
    char err[512];
    if (online) {
        int timeout = config && !url ? 1500 : 5000;
        rc = kvt_ops_call(t.url, "status", NULL, timeout, &st, err, sizeof(err));
        if (rc && (url || !t.root[0])) {
            fprintf(stderr, "kvtier status: cannot reach a server at %s: %s\n", t.url,
                    rc == KVT_E_TIMEOUT ? "no answer" : err);
            kvt_cli_target_free(&t);
            return 1;
        }
        json_t *ad = st ? kvt_cli_pick_adapter(st, t.root) : NULL;
        if (st && !ad && t.root[0] && url) {
            fprintf(stderr, "kvtier status: the server at %s keeps no adapter in %s\n", t.url,
                    t.root);
            json_decref(st);
            kvt_cli_target_free(&t);
            return 2;
        }
        if (ad) {
            report = report_online(st, ad, &t);
        } else if (st && !t.root[0]) {
            /* a server without L2 adapters (--no-l2): its tiers are the
             * whole report, there is no cache directory to describe */
        } else {
            json_decref(st);
            st = NULL;
        }
    }
    if (!report && !st) { /* offline */
        struct kvt_scan sc;
        rc = kvt_scan_root(t.root, &sc, false);
        if (rc) {
            fprintf(stderr, "kvtier status: cannot scan %s: %s\n", t.root, kvt_strerror(rc));
            kvt_cli_target_free(&t);
            return 1;
        }
        /* no budget given (--budget-gb, KVP_CACHE_BUDGET_GB): no cap to
         * compare with, rather than a 1500 GiB default that warns on most
         * disks */
        double b = budget_gb ? budget_gb : t.have_cfg ? t.cfg.budget_gb : 0;
        report = report_offline(&sc, &t, b);
        kvt_scan_free(&sc);
    }
    if (as_json) {
        json_t *out = report;
        if (st) { /* the server's full status with the seed's fields on top */
            if (report)
                json_object_update(st, report);
            out = st;
        }
        char *js = json_dumps(out, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(15));
        printf("%s\n", js);
        free(js);
    } else {
        if (st)
            print_table(st);
        if (report)
            print_cache(report);
    }
    json_decref(report);
    json_decref(st);
    kvt_cli_target_free(&t);
    return 0;
}
