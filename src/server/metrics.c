/*
 * GET /metrics: the Prometheus text format, rendered from the numbers the
 * tiers, the controllers, kvtier's protocol front end and authentication
 * keep (structs of counters, never parsed back).
 */
#include "common/util.h"
#include "server/internal.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct sb {
    char *p;
    size_t len, cap;
};

__attribute__((format(printf, 2, 3))) static void sbf(struct sb *b, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n >= 0 && (size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        b->cap = b->cap * 2 + (size_t)(n > 0 ? n : 0) + 256;
        b->p = kvt_xrealloc(b->p, b->cap);
    }
}

static void metric(struct sb *b, const char *name, const char *type, const char *help)
{
    sbf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/*
 * Per node of the adapters that talk to servers (l2.h, struct
 * kvt_l2_node): up or not, its breaker, how often it went down, and per
 * adapter how many masters are down. Label values are the node names the
 * adapter reports ("host:port", an endpoint URL).
 */
static void l2_node_metrics(struct kvt_server *s, struct sb *b)
{
    kvt_l2 *l2s[KVT_MAX_ADAPTERS];
    int nl2 = kvt_core_nl2(s->core);
    for (int i = 0; i < nl2; i++)
        l2s[i] = kvt_core_l2(s->core, i);
    struct kvt_l2_node *nv = kvt_xcalloc(KVT_L2_NODES_MAX, sizeof(*nv));
    bool any = false;
    for (int i = 0; i < nl2 && !any; i++)
        any = kvt_l2_nodes(l2s[i], nv, 0) > 0;
    if (!any) {
        free(nv);
        return;
    }
    static const char *const names[] = {"kvtier_l2_node_up", "kvtier_l2_node_breaker_open",
                                        "kvtier_l2_node_downs_total",
                                        "kvtier_l2_node_down_seconds"};
    static const char *const types[] = {"gauge", "gauge", "counter", "gauge"};
    static const char *const helps[] = {
        "1 if the node answers, 0 while it is marked down (its keys fail at once).",
        "1 while the node's circuit breaker is open or half open (nodes with a breaker).",
        "Times the node was marked down since start.",
        "Seconds the node has been down; 0 when up."};
    for (int m = 0; m < 4; m++) {
        metric(b, names[m], types[m], helps[m]);
        for (int i = 0; i < nl2; i++) {
            int n = KVT_MIN(kvt_l2_nodes(l2s[i], nv, KVT_L2_NODES_MAX), KVT_L2_NODES_MAX);
            for (int k = 0; k < n; k++) {
                const struct kvt_l2_node *d = &nv[k];
                if (m == 1 && d->breaker == KVT_BRK_NONE)
                    continue;
                sbf(b, "%s{adapter=\"%s\",node=\"%s\",role=\"%s\"} ", names[m], kvt_l2_name(l2s[i]),
                    d->name, d->role);
                if (m == 0)
                    sbf(b, "%d\n", d->state == KVT_NODE_UP);
                else if (m == 1)
                    sbf(b, "%d\n", d->breaker == KVT_BRK_OPEN || d->breaker == KVT_BRK_HALF_OPEN);
                else if (m == 2)
                    sbf(b, "%llu\n", (unsigned long long)d->downs);
                else
                    sbf(b, "%.3f\n", d->down_seconds);
            }
        }
    }
    metric(b, "kvtier_l2_masters_down", "gauge",
           "Nodes with the role master (or server) that are marked down, per adapter.");
    for (int i = 0; i < nl2; i++) {
        int n = KVT_MIN(kvt_l2_nodes(l2s[i], nv, KVT_L2_NODES_MAX), KVT_L2_NODES_MAX);
        if (n <= 0)
            continue;
        int down = 0;
        for (int k = 0; k < n; k++)
            down += nv[k].state != KVT_NODE_UP &&
                    (strcmp(nv[k].role, "master") == 0 || strcmp(nv[k].role, "server") == 0);
        sbf(b, "kvtier_l2_masters_down{adapter=\"%s\"} %d\n", kvt_l2_name(l2s[i]), down);
    }
    free(nv);
}

/* One histogram's series: buckets[] are per-bucket counts (not cumulative)
 * for the bounds[] in seconds, the last bound being +Inf. */
static void histogram(struct sb *b, const char *name, const char *labels, const double *bounds,
                      const uint64_t *buckets, int n, uint64_t sum_ns, uint64_t count)
{
    uint64_t cum = 0;
    for (int k = 0; k < n; k++) {
        cum += buckets[k];
        if (k == n - 1)
            sbf(b, "%s_bucket{%s,le=\"+Inf\"} %llu\n", name, labels, (unsigned long long)cum);
        else
            sbf(b, "%s_bucket{%s,le=\"%g\"} %llu\n", name, labels, bounds[k],
                (unsigned long long)cum);
    }
    sbf(b, "%s_sum{%s} %.9f\n", name, labels, (double)sum_ns / 1e9);
    sbf(b, "%s_count{%s} %llu\n", name, labels, (unsigned long long)count);
}

/* Per tier: hits, misses, bytes used, capacity, objects, evictions. */
static void tier_metrics(struct sb *b, struct kvt_l1 *l1, kvt_l2 *const *l2s, int nl2,
                         const struct kvt_l2_stats *st)
{
    struct kvt_l1_usage u;
    struct kvt_l1_counters c;
    kvt_l1_usage(l1, &u);
    kvt_l1_counters(l1, &c);
    metric(b, "kvtier_hits_total", "counter", "Lookup hits per tier (keys).");
    sbf(b, "kvtier_hits_total{tier=\"l1\"} %llu\n", (unsigned long long)c.hits);
    for (int i = 0; i < nl2; i++)
        sbf(b, "kvtier_hits_total{tier=\"l2\",adapter=\"%s\"} %llu\n", kvt_l2_name(l2s[i]),
            (unsigned long long)st[i].lookup_hits);
    metric(b, "kvtier_misses_total", "counter", "Lookup misses per tier (keys).");
    sbf(b, "kvtier_misses_total{tier=\"l1\"} %llu\n", (unsigned long long)c.misses);
    for (int i = 0; i < nl2; i++)
        sbf(b, "kvtier_misses_total{tier=\"l2\",adapter=\"%s\"} %llu\n", kvt_l2_name(l2s[i]),
            (unsigned long long)st[i].lookup_misses);
    metric(b, "kvtier_used_bytes", "gauge", "Bytes in use per tier.");
    sbf(b, "kvtier_used_bytes{tier=\"l1\"} %llu\n", (unsigned long long)u.used_bytes);
    for (int i = 0; i < nl2; i++)
        sbf(b, "kvtier_used_bytes{tier=\"l2\",adapter=\"%s\"} %llu\n", kvt_l2_name(l2s[i]),
            (unsigned long long)st[i].used_bytes);
    metric(b, "kvtier_capacity_bytes", "gauge", "Capacity per tier (0 = unlimited).");
    sbf(b, "kvtier_capacity_bytes{tier=\"l1\"} %llu\n", (unsigned long long)u.cap_bytes);
    for (int i = 0; i < nl2; i++)
        sbf(b, "kvtier_capacity_bytes{tier=\"l2\",adapter=\"%s\"} %llu\n", kvt_l2_name(l2s[i]),
            (unsigned long long)st[i].cap_bytes);
    metric(b, "kvtier_objects", "gauge", "Objects held per tier.");
    sbf(b, "kvtier_objects{tier=\"l1\"} %llu\n", (unsigned long long)u.objects);
    for (int i = 0; i < nl2; i++)
        sbf(b, "kvtier_objects{tier=\"l2\",adapter=\"%s\"} %llu\n", kvt_l2_name(l2s[i]),
            (unsigned long long)st[i].objects);
    metric(b, "kvtier_l1_fragmentation", "gauge", "1 - largest free run / free bytes.");
    sbf(b, "kvtier_l1_fragmentation %.6f\n", u.fragmentation);
    metric(b, "kvtier_evictions_total", "counter", "Objects evicted per tier.");
    sbf(b, "kvtier_evictions_total{tier=\"l1\"} %llu\n", (unsigned long long)c.evictions);
    for (int i = 0; i < nl2; i++)
        sbf(b, "kvtier_evictions_total{tier=\"l2\",adapter=\"%s\"} %llu\n", kvt_l2_name(l2s[i]),
            (unsigned long long)st[i].evictions);
}

/* Per adapter: counters, operation latencies, the shared budget, health. */
static void l2_metrics(struct sb *b, kvt_l2 *const *l2s, int nl2, const struct kvt_l2_stats *st)
{
#define F(f) offsetof(struct kvt_l2_stats, f)
    static const struct {
        const char *metric;
        size_t field; /* of a uint64_t in struct kvt_l2_stats */
        const char *help;
    } l2c[] = {
        {"kvtier_l2_bytes_written_total", F(bytes_written), "Bytes written to the adapter."},
        {"kvtier_l2_bytes_read_total", F(bytes_read), "Bytes read from the adapter."},
        {"kvtier_l2_stores_total", F(store_ok), "Objects stored."},
        {"kvtier_l2_store_failures_total", F(store_failed), "Objects that failed to store."},
        {"kvtier_l2_rejected_writes_total", F(rejected_writes), "Writes refused by the cap."},
        {"kvtier_l2_too_big_total", F(too_big),
         "Stores refused: larger than the adapter's slot or pool."},
        {"kvtier_l2_failovers_total", F(failovers),
         "Remote tiers: failovers seen (a replica took over a failed master's slots)."},
        {"kvtier_l2_sync_evictions_total", F(sync_evictions),
         "Stores over the cap that evicted synchronously to fit."},
        {"kvtier_l2_corrupt_objects_total", F(corrupt), "Objects that failed verification."},
        {"kvtier_l2_odirect_fallbacks_total", F(odirect_fallbacks),
         "Transfers that could not use O_DIRECT."},
    };
#undef F
    for (size_t m = 0; m < KVT_ARRAY_LEN(l2c); m++) {
        metric(b, l2c[m].metric, "counter", l2c[m].help);
        for (int i = 0; i < nl2; i++) {
            uint64_t v;
            memcpy(&v, (const char *)&st[i] + l2c[m].field, sizeof(v));
            sbf(b, "%s{adapter=\"%s\"} %llu\n", l2c[m].metric, kvt_l2_name(l2s[i]),
                (unsigned long long)v);
        }
    }
    static const char *const kinds[3] = {"store", "lookup", "load"};
    metric(b, "kvtier_l2_operation_duration_seconds", "histogram",
           "Time from submitting a batch to an L2 adapter to its completion, per operation.");
    for (int i = 0; i < nl2; i++) {
        for (int k = 0; k < 3; k++) {
            struct kvt_l2_latency lat;
            kvt_l2_latency(l2s[i], (enum kvt_l2_kind)k, &lat);
            char lab[128];
            snprintf(lab, sizeof(lab), "adapter=\"%s\",op=\"%s\"", kvt_l2_name(l2s[i]), kinds[k]);
            histogram(b, "kvtier_l2_operation_duration_seconds", lab, kvt_l2_lat_bounds, lat.bucket,
                      KVT_L2_LAT_BUCKETS, lat.sum_ns, lat.count);
        }
    }
    bool shared = false;
    for (int i = 0; i < nl2; i++)
        shared |= st[i].shared_budget;
    if (shared) { /* adapters with "shared_budget" only (l2/budget.h) */
        metric(b, "kvtier_l2_shared_budget_bytes", "gauge",
               "Bytes of the shared tier in the budget record of the servers sharing it.");
        for (int i = 0; i < nl2; i++)
            if (st[i].shared_budget)
                sbf(b, "kvtier_l2_shared_budget_bytes{adapter=\"%s\"} %lld\n", kvt_l2_name(l2s[i]),
                    (long long)st[i].shared_total);
        metric(b, "kvtier_l2_shared_budget_node_bytes", "gauge",
               "This server's net part of the shared budget (stored minus removed; may be "
               "negative when it removes what others stored).");
        for (int i = 0; i < nl2; i++)
            if (st[i].shared_budget)
                sbf(b, "kvtier_l2_shared_budget_node_bytes{adapter=\"%s\"} %lld\n",
                    kvt_l2_name(l2s[i]), (long long)st[i].shared_part);
        metric(b, "kvtier_l2_shared_budget_nodes", "gauge",
               "Live servers in the shared budget record.");
        for (int i = 0; i < nl2; i++)
            if (st[i].shared_budget)
                sbf(b, "kvtier_l2_shared_budget_nodes{adapter=\"%s\"} %u\n", kvt_l2_name(l2s[i]),
                    st[i].shared_nodes);
    }
    metric(b, "kvtier_l2_healthy", "gauge", "1 if the adapter is healthy.");
    for (int i = 0; i < nl2; i++) {
        char msg[256];
        sbf(b, "kvtier_l2_healthy{adapter=\"%s\"} %d\n", kvt_l2_name(l2s[i]),
            kvt_l2_healthy(l2s[i], msg, sizeof(msg)) ? 1 : 0);
    }
}

/* kvtier's protocol: requests, errors and latency per operation, bytes. */
static void rpc_metrics(struct sb *b, struct kvt_server *s)
{
    metric(b, "kvtier_rpc_requests_total", "counter", "Requests per operation.");
    const struct kvt_native *nv = s->native;
    for (uint32_t i = 0; i < kvt_nops; i++)
        sbf(b, "kvtier_rpc_requests_total{op=\"%s\"} %llu\n", kvt_ops[i].name,
            (unsigned long long)atomic_load(&nv->ops[i].count));
    metric(b, "kvtier_rpc_errors_total", "counter", "Error replies per operation.");
    for (uint32_t i = 0; i < kvt_nops; i++)
        sbf(b, "kvtier_rpc_errors_total{op=\"%s\"} %llu\n", kvt_ops[i].name,
            (unsigned long long)atomic_load(&nv->ops[i].errors));
    metric(b, "kvtier_rpc_latency_seconds", "histogram",
           "Time from request receipt to reply per operation.");
    for (uint32_t i = 0; i < kvt_nops; i++) {
        uint64_t bk[KVT_LAT_BUCKETS];
        for (int k = 0; k < KVT_LAT_BUCKETS; k++)
            bk[k] = atomic_load(&nv->ops[i].bucket[k]);
        char lab[64];
        snprintf(lab, sizeof(lab), "op=\"%s\"", kvt_ops[i].name);
        histogram(b, "kvtier_rpc_latency_seconds", lab, kvt_lat_bounds, bk, KVT_LAT_BUCKETS,
                  atomic_load(&nv->ops[i].sum_ns), atomic_load(&nv->ops[i].count));
    }
    metric(b, "kvtier_rpc_bytes_total", "counter", "Payload bytes received and sent inline.");
    sbf(b, "kvtier_rpc_bytes_total{dir=\"in\"} %llu\n",
        (unsigned long long)atomic_load(&nv->bytes_in));
    sbf(b, "kvtier_rpc_bytes_total{dir=\"out\"} %llu\n",
        (unsigned long long)atomic_load(&s->bytes_out));
}

/* With authentication: handshakes, reloads, denials per client key. */
static void auth_metrics(struct sb *b, struct kvt_server *s)
{
    if (!s->cfg->auth)
        return;
    const struct kvt_auth *a = s->cfg->auth;
    metric(b, "kvtier_auth_handshakes_refused_total", "counter",
           "CURVE handshakes refused: the client's key is not authorized.");
    sbf(b, "kvtier_auth_handshakes_refused_total %llu\n",
        (unsigned long long)atomic_load(&a->handshakes_refused));
    metric(b, "kvtier_auth_handshakes_failed_total", "counter",
           "Handshakes that failed before the key was checked (no key, wrong server key).");
    sbf(b, "kvtier_auth_handshakes_failed_total %llu\n",
        (unsigned long long)atomic_load(&a->handshakes_failed));
    metric(b, "kvtier_auth_lmcache_refused_total", "counter",
           "Connections to the LMCache port (a Unix socket) refused: another uid, or "
           "--lmcache-client no longer in the authorized-clients file.");
    sbf(b, "kvtier_auth_lmcache_refused_total %llu\n",
        (unsigned long long)atomic_load(&a->lmc_refused));
    metric(b, "kvtier_auth_reloads_total", "counter",
           "Reloads of the authorized-clients file (SIGHUP), by result.");
    sbf(b, "kvtier_auth_reloads_total{result=\"ok\"} %llu\n",
        (unsigned long long)atomic_load(&a->reloads));
    sbf(b, "kvtier_auth_reloads_total{result=\"failed\"} %llu\n",
        (unsigned long long)atomic_load(&a->reload_failures));
    metric(b, "kvtier_auth_denied_total", "counter", "Requests answered E_DENIED, per client key.");
    const struct kvt_auth *cur = kvt_server_auth(s); /* the keys in use */
    for (uint32_t i = 0; i < cur->n; i++)
        sbf(b, "kvtier_auth_denied_total{client=\"%s\"} %llu\n", cur->c[i].name,
            (unsigned long long)atomic_load(&cur->c[i].denied));
    metric(b, "kvtier_auth_same_host_denied_total", "counter",
           "Same-host requests refused: a hello without a valid ticket, or any other "
           "request before one.");
    sbf(b, "kvtier_auth_same_host_denied_total %llu\n",
        (unsigned long long)atomic_load(&s->native->local_denied));
}

/* The KV-events publisher (events.h), when it is on. */
static void events_metrics(struct sb *b, struct kvt_server *s)
{
    if (!s->evpub)
        return;
    struct kvt_evpub_stats e;
    kvt_evpub_stats(s->evpub, &e);
    metric(b, "kvtier_kv_events_blocks_total", "counter",
           "Block hashes published in KV events, per event type.");
    sbf(b, "kvtier_kv_events_blocks_total{type=\"BlockStored\"} %llu\n",
        (unsigned long long)e.stored);
    sbf(b, "kvtier_kv_events_blocks_total{type=\"BlockRemoved\"} %llu\n",
        (unsigned long long)e.removed);
    metric(b, "kvtier_kv_events_cleared_total", "counter", "AllBlocksCleared events published.");
    sbf(b, "kvtier_kv_events_cleared_total %llu\n", (unsigned long long)e.cleared);
    metric(b, "kvtier_kv_events_batches_total", "counter",
           "KV event batches published (sequence numbers used).");
    sbf(b, "kvtier_kv_events_batches_total %llu\n", (unsigned long long)e.batches);
    metric(b, "kvtier_kv_events_dropped_total", "counter",
           "Tier events lost because the publisher's queue was full.");
    sbf(b, "kvtier_kv_events_dropped_total %llu\n", (unsigned long long)e.dropped);
    metric(b, "kvtier_kv_events_gaps_total", "counter",
           "Sequence numbers skipped to show subscribers that events were dropped.");
    sbf(b, "kvtier_kv_events_gaps_total %llu\n", (unsigned long long)e.gaps);
    metric(b, "kvtier_kv_events_queue_depth", "gauge", "Tier events waiting to be published.");
    sbf(b, "kvtier_kv_events_queue_depth %u\n", e.queue_depth);
    metric(b, "kvtier_kv_events_replay_requests_total", "counter",
           "Replay requests served on the replay socket.");
    sbf(b, "kvtier_kv_events_replay_requests_total %llu\n", (unsigned long long)e.replay_requests);
}

/* The admin API (core/admin.h, struct kvt_admin_stats): what it changed,
 * its pins, its jobs' work, and the requests it refused. */
static void admin_metrics(struct sb *b, struct kvt_server *s)
{
    if (!s->admin)
        return;
    struct kvt_admin_stats a;
    kvt_admin_stats(s->admin, &a);
    metric(b, "kvtier_admin_operations_total", "counter",
           "Admin API operations that changed data, by operation.");
    const struct {
        const char *op;
        uint64_t v;
    } ops[] = {{"delete", a.deletes},
               {"clear", a.clears},
               {"quota_set", a.quota_sets},
               {"quota_delete", a.quota_deletes},
               {"pin", a.pins},
               {"unpin", a.unpins},
               {"warm", a.warm_jobs},
               {"verify", a.verify_jobs}};
    for (size_t i = 0; i < KVT_ARRAY_LEN(ops); i++)
        sbf(b, "kvtier_admin_operations_total{op=\"%s\"} %llu\n", ops[i].op,
            (unsigned long long)ops[i].v);
    metric(b, "kvtier_admin_removed_objects_total", "counter",
           "Objects removed by the admin API, by operation (delete: every tier's copies).");
    sbf(b, "kvtier_admin_removed_objects_total{op=\"delete\"} %llu\n",
        (unsigned long long)a.deleted_objects);
    sbf(b, "kvtier_admin_removed_objects_total{op=\"clear\"} %llu\n",
        (unsigned long long)a.cleared_objects);
    sbf(b, "kvtier_admin_removed_objects_total{op=\"verify\"} %llu\n",
        (unsigned long long)a.corrupt_removed);
    metric(b, "kvtier_admin_warmed_objects_total", "counter",
           "Objects the warm jobs loaded from L2 into L1.");
    sbf(b, "kvtier_admin_warmed_objects_total %llu\n", (unsigned long long)a.warmed_objects);
    metric(b, "kvtier_admin_verified_objects_total", "counter",
           "Objects the verify jobs read back from L2.");
    sbf(b, "kvtier_admin_verified_objects_total %llu\n", (unsigned long long)a.verified_objects);
    metric(b, "kvtier_admin_corrupt_objects_total", "counter",
           "Objects the verify jobs found corrupt.");
    sbf(b, "kvtier_admin_corrupt_objects_total %llu\n", (unsigned long long)a.corrupt_found);
    metric(b, "kvtier_admin_pinned_objects", "gauge", "Objects pinned by the admin API.");
    sbf(b, "kvtier_admin_pinned_objects %llu\n", (unsigned long long)a.pinned_objects);
    metric(b, "kvtier_admin_pinned_bytes", "gauge", "Payload bytes of the pinned objects.");
    sbf(b, "kvtier_admin_pinned_bytes %llu\n", (unsigned long long)a.pinned_bytes);
    metric(b, "kvtier_admin_max_pinned_bytes", "gauge",
           "The bound on pinned bytes (--max-pinned-mb).");
    sbf(b, "kvtier_admin_max_pinned_bytes %llu\n", (unsigned long long)a.max_pinned_bytes);
    metric(b, "kvtier_admin_refused_total", "counter",
           "Admin API requests refused, by reason (credential: no or wrong token, or not "
           "loopback; input: a 4xx for the request itself).");
    sbf(b, "kvtier_admin_refused_total{reason=\"credential\"} %llu\n",
        (unsigned long long)atomic_load(&s->admin_denied));
    sbf(b, "kvtier_admin_refused_total{reason=\"input\"} %llu\n",
        (unsigned long long)atomic_load(&s->admin_bad));
}

char *kvt_server_metrics(struct kvt_server *s, size_t *len)
{
    struct sb b = {.p = kvt_xmalloc(8192), .cap = 8192};
    kvt_l2 *l2s[KVT_MAX_ADAPTERS];
    int nl2 = kvt_core_nl2(s->core);
    struct kvt_l2_stats *st = kvt_xcalloc((size_t)nl2 + 1, sizeof(*st));
    for (int i = 0; i < nl2; i++) {
        l2s[i] = kvt_core_l2(s->core, i);
        kvt_l2_stats(l2s[i], &st[i]);
    }
    tier_metrics(&b, kvt_core_l1(s->core), l2s, nl2, st);
    l2_metrics(&b, l2s, nl2, st);
    free(st);
    l2_node_metrics(s, &b);
    rpc_metrics(&b, s);
    auth_metrics(&b, s);
    events_metrics(&b, s);
    admin_metrics(&b, s);
    *len = b.len;
    return b.p;
}
