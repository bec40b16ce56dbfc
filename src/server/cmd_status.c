/* kvtier status: what a running server holds, as a table or JSON. */
#include "common/util.h"
#include "kvtier/client.h"

#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int kvt_cmd_status(int argc, char **argv);

static void human(char *out, size_t cap, double b)
{
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (b >= 1024 && i < 4) {
        b /= 1024;
        i++;
    }
    snprintf(out, cap, i ? "%.2f %s" : "%.0f %s", b, u[i]);
}

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
    human(a, sizeof(a), (double)ji(l1, "used_bytes"));
    human(b, sizeof(b), (double)ji(l1, "capacity_bytes"));
    printf("%-10s %-8s %12s %12s %7s %10s %10s %10s %9s  %s\n", "TIER", "TYPE", "USED", "CAPACITY",
           "USE%", "OBJECTS", "HITS", "MISSES", "EVICTED", "HEALTH");
    printf("%-10s %-8s %12s %12s %6.1f%% %10lld %10lld %10lld %9lld  %s\n", "L1", "memory", a, b,
           100 * json_real_value(json_object_get(l1, "usage_fraction")),
           (long long)ji(l1, "objects"), (long long)ji(c1, "hits"), (long long)ji(c1, "misses"),
           (long long)ji(c1, "evictions"), "ok");
    size_t i;
    const json_t *ad;
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
        printf("%-10s %-8s %12s %12s %7s %10lld %10lld %10lld %9lld  %s\n",
               json_string_value(json_object_get(ad, "name")),
               json_string_value(json_object_get(ad, "type")), a, b, pct,
               (long long)ji(ad, "objects"), (long long)ji(c, "lookup_hits"),
               (long long)ji(c, "lookup_misses"), (long long)ji(c, "evictions"),
               json_string_value(json_object_get(ad, "health")));
    }
    printf("\nL1 fragmentation %.3f, %lld read / %lld write leases\n",
           json_real_value(json_object_get(l1, "fragmentation")), (long long)ji(l1, "read_leases"),
           (long long)ji(l1, "write_leases"));
    json_array_foreach(json_object_get(st, "l2"), i, ad)
    {
        const json_t *c = json_object_get(ad, "counters");
        const json_t *rec = json_object_get(ad, "recovery");
        printf("%s: rejected_writes %lld, corrupt %lld, store_failed %lld, recovery %s "
               "(%lld objects)\n",
               json_string_value(json_object_get(ad, "name")), (long long)ji(c, "rejected_writes"),
               (long long)ji(c, "corrupt"), (long long)ji(c, "store_failed"),
               json_string_value(json_object_get(rec, "state")), (long long)ji(rec, "objects"));
    }
    const json_t *sc = json_object_get(st, "store");
    printf("store controller: %lld batches in flight, %lld keys to L2 ok, %lld failed\n",
           (long long)ji(sc, "in_flight_batches"), (long long)ji(sc, "l2_keys_ok"),
           (long long)ji(sc, "l2_keys_failed"));
}

int kvt_cmd_status(int argc, char **argv)
{
    static const struct option opts[] = {{"url", required_argument, NULL, 'u'},
                                         {"json", no_argument, NULL, 'j'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    const char *url = "tcp://127.0.0.1:5555";
    bool as_json = false;
    int ch;
    optind = 1;
    opterr = 0;
    while ((ch = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (ch) {
        case 'u':
            url = optarg;
            break;
        case 'j':
            as_json = true;
            break;
        case 'h':
            printf("usage: kvtier status [--url tcp://127.0.0.1:5555] [--json]\n");
            return 0;
        default:
            fprintf(stderr, "kvtier status: unknown option '%s'\n", argv[optind - 1]);
            return 2;
        }
    }
    kvt_client_opts o = {.timeout_ms = 5000, .no_shm = true};
    kvt_client *c;
    int rc = kvt_client_open(url, &o, &c);
    if (rc) {
        fprintf(stderr, "kvtier status: cannot reach a server at %s: %s\n", url,
                kvt_strerror(rc));
        return 1;
    }
    char *js = NULL;
    rc = kvt_status_json(c, &js);
    if (rc) {
        fprintf(stderr, "kvtier status: %s\n", kvt_client_last_error(c));
        kvt_client_close(c);
        return 1;
    }
    kvt_client_close(c);
    if (as_json) {
        printf("%s\n", js);
    } else {
        json_t *st = json_loads(js, 0, NULL);
        print_table(st);
        json_decref(st);
    }
    free(js);
    return 0;
}
