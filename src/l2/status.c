/* L2 base: stats, usage, health, the status object, the index scan. */
#include "l2/base_int.h"
#include "l2/evict.h"
#include "l2/adapters.h"
#include "common/log.h"
#include "common/util.h"
#include "policy/policy.h"
#include "io/tpool.h"
#include "kvtier/error.h"
#include "l2/stage.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define LOAD(f) out->f = atomic_load_explicit(&c->f, memory_order_relaxed)

void kvt_l2_stats(kvt_l2 *l2, struct kvt_l2_stats *out)
{
    memset(out, 0, sizeof(*out));
    const struct kvt_l2_counters *c = &l2->counters;
    LOAD(store_ok);
    LOAD(store_failed);
    LOAD(store_skipped);
    LOAD(rejected_writes);
    LOAD(lookups);
    LOAD(lookup_hits);
    LOAD(lookup_misses);
    LOAD(secondary_hits);
    LOAD(load_ok);
    LOAD(load_failed);
    LOAD(corrupt);
    LOAD(bytes_written);
    LOAD(bytes_read);
    LOAD(deleted);
    LOAD(evictions);
    LOAD(reclaimed_bytes);
    LOAD(sync_evictions);
    LOAD(too_big);
    LOAD(failovers);
    LOAD(odirect_fallbacks);
    LOAD(serde_mismatches);
    LOAD(quota_rejections);
    LOAD(quota_evictions);
    pthread_mutex_lock(&l2->lock);
    out->used_bytes = l2->used_bytes;
    out->cap_bytes = l2->cap_bytes;
    out->objects = l2->idx.nobjs;
    out->logical_bytes = l2->logical_bytes;
    out->stored_known_bytes = l2->stored_known;
    out->logical_unknown = l2->logical_unknown;
    out->pinned_objects = l2->pinned_objs;
    out->recovering = l2->recovering;
    out->recovered_objs = l2->recovered_objs;
    out->recovered_bytes = l2->recovered_bytes;
    out->recovery_seconds = l2->recovery_seconds;
    pthread_mutex_unlock(&l2->lock);
    kvt_l2b_budget_stats(l2, out);
}

#undef LOAD

struct entry_visit {
    bool (*visit)(const struct kvt_l2_entry *e, void *arg);
    void *arg;
};

static bool entry_visit(const struct kvt_l2_obj *o, void *arg)
{
    const struct entry_visit *v = arg;
    struct kvt_l2_entry e = {.key = o->key,
                             .stored = o->stored,
                             .len = o->len,
                             .pins = o->pins,
                             .ready = st(o) == KVT_OBJ_READY};
    return v->visit(&e, v->arg);
}

bool kvt_l2_scan(kvt_l2 *l2, uint32_t *cursor,
                 bool (*visit)(const struct kvt_l2_entry *e, void *arg), void *arg)
{
    struct entry_visit v = {visit, arg};
    return kvt_l2_index_scan(l2, cursor, entry_visit, &v);
}

void kvt_l2_usage(kvt_l2 *l2, struct kvt_l2_usage *u)
{
    pthread_mutex_lock(&l2->lock);
    u->used_bytes = l2->used_bytes;
    u->cap_bytes = l2->cap_bytes;
    u->objects = l2->idx.nobjs;
    pthread_mutex_unlock(&l2->lock);
    u->fraction = u->cap_bytes ? (double)u->used_bytes / (double)u->cap_bytes : -1.0;
    /* the shared record's total, as last read, while it is current; a
     * record that stopped answering (removed, its Redis down) leaves an old
     * total that removals can no longer lower: evicting on it every cycle
     * would drain the index, so the usage is unknown (-1) until it answers */
    int64_t total;
    if (l2->budget && u->cap_bytes)
        u->fraction =
            kvt_l2b_budget_fresh_total(l2, &total) ? (double)total / (double)u->cap_bytes : -1.0;
}

bool kvt_l2_healthy(kvt_l2 *l2, char *msg, size_t cap)
{
    if (l2->ops->healthy)
        return l2->ops->healthy(l2, msg, cap);
    snprintf(msg, cap, "ok");
    return true;
}

const char *kvt_l2_node_state_name(enum kvt_l2_node_state st)
{
    static const char *const n[] = {"up", "down", "probing"};
    return (unsigned)st < KVT_ARRAY_LEN(n) ? n[st] : "?";
}

const char *kvt_l2_breaker_name(enum kvt_l2_breaker_state b)
{
    static const char *const n[] = {NULL, "closed", "open", "half_open"};
    return (unsigned)b < KVT_ARRAY_LEN(n) ? n[b] : NULL;
}

int kvt_l2_nodes(kvt_l2 *l2, struct kvt_l2_node *out, int max)
{
    return l2->ops->nodes ? l2->ops->nodes(l2, out, max) : 0;
}

/* The adapter's "nodes" array, or NULL when it reports none. */
static json_t *nodes_json(kvt_l2 *l2)
{
    if (!l2->ops->nodes)
        return NULL;
    struct kvt_l2_node *nv = kvt_xcalloc(KVT_L2_NODES_MAX, sizeof(*nv));
    int n = KVT_MIN(kvt_l2_nodes(l2, nv, KVT_L2_NODES_MAX), KVT_L2_NODES_MAX);
    if (n <= 0) {
        free(nv);
        return NULL;
    }
    json_t *a = json_array();
    for (int i = 0; i < n; i++) {
        const struct kvt_l2_node *d = &nv[i];
        json_t *o = json_object();
        json_object_set_new(o, "node", json_string(d->name));
        json_object_set_new(o, "role", json_string(d->role));
        json_object_set_new(o, "state", json_string(kvt_l2_node_state_name(d->state)));
        json_object_set_new(o, "up", json_boolean(d->state == KVT_NODE_UP));
        const char *b = kvt_l2_breaker_name(d->breaker);
        json_object_set_new(o, "breaker", b ? json_string(b) : json_null());
        json_object_set_new(o, "downs", json_integer((json_int_t)d->downs));
        json_object_set_new(o, "down_seconds", json_real(d->down_seconds));
        json_object_set_new(o, "last_error",
                            d->last_error[0] ? json_string(d->last_error) : json_null());
        json_object_set_new(o, "last_error_unix",
                            d->last_error[0] ? json_real(d->last_error_unix) : json_null());
        json_array_append_new(a, o);
    }
    free(nv);
    return a;
}

#define C(name) json_integer((json_int_t)x.name)

json_t *kvt_l2_status(kvt_l2 *l2)
{
    struct kvt_l2_stats x;
    kvt_l2_stats(l2, &x);
    double fraction = x.cap_bytes ? (double)x.used_bytes / (double)x.cap_bytes : -1.0;
    char msg[400];
    bool ok = kvt_l2_healthy(l2, msg, sizeof(msg));
    /* healthy, yet refusing what it is given: the tier's line says so */
    if (x.too_big) {
        size_t l = strlen(msg);
        snprintf(
            msg + l, sizeof(msg) - l, "; %llu stores refused as too big (objects up to %llu bytes)",
            (unsigned long long)x.too_big, (unsigned long long)atomic_load(&l2->too_big_limit));
    }
    json_t *o = json_object();
    json_object_set_new(o, "name", json_string(l2->name));
    json_object_set_new(o, "type", json_string(l2->type));
    json_object_set_new(o, "index", json_integer(l2->index));
    json_object_set_new(o, "is_healthy", json_boolean(ok));
    json_object_set_new(o, "health", json_string(msg));
    json_object_set_new(o, "used_bytes", json_integer((json_int_t)x.used_bytes));
    json_object_set_new(o, "capacity_bytes", json_integer((json_int_t)x.cap_bytes));
    json_object_set_new(
        o, "free_bytes",
        x.cap_bytes ? json_integer(
                          (json_int_t)(x.cap_bytes > x.used_bytes ? x.cap_bytes - x.used_bytes : 0))
                    : json_null());
    json_object_set_new(o, "usage_fraction", json_real(fraction));
    json_object_set_new(o, "objects", json_integer((json_int_t)x.objects));
    json_object_set_new(o, "persist_enabled", json_boolean(l2->persist_enabled));
    json_t *nodes = nodes_json(l2);
    if (nodes)
        json_object_set_new(o, "nodes", nodes);

    json_t *per_ns = json_object(), *per_salt = json_object();
    pthread_mutex_lock(&l2->lock);
    for (uint32_t ns = 1; ns < l2->ns_bytes_cap; ns++) {
        if (!l2->ns_bytes[ns])
            continue;
        const char *name = kvt_ns_name(ns), *salt = kvt_ns_salt(ns);
        json_t *cur = json_object_get(per_ns, name);
        json_int_t v = (json_int_t)l2->ns_bytes[ns];
        json_object_set_new(per_ns, name, json_integer(v + (cur ? json_integer_value(cur) : 0)));
        cur = json_object_get(per_salt, salt);
        json_object_set_new(per_salt, salt, json_integer(v + (cur ? json_integer_value(cur) : 0)));
    }
    json_t *quotas = NULL;
    if (l2->nquotas) {
        quotas = json_object();
        for (uint32_t i = 0; i < l2->nquotas; i++) {
            const struct kvt_l2_quota *qt = &l2->quotas[i];
            if (qt->off)
                continue;
            json_t *e = json_object();
            json_object_set_new(e, "quota_bytes", json_integer((json_int_t)qt->limit));
            json_object_set_new(e, "used_bytes", json_integer((json_int_t)qt->used));
            json_object_set_new(e, "usage_fraction",
                                qt->limit ? json_real((double)qt->used / (double)qt->limit)
                                          : json_null());
            json_object_set_new(e, "rejected_writes", json_integer((json_int_t)qt->rejected));
            json_object_set_new(quotas, qt->name, e);
        }
    }
    json_t *per_ns_objs = json_object();
    for (uint32_t ns = 1; ns < l2->ns_bytes_cap; ns++) {
        if (!l2->ns_objs[ns])
            continue;
        const char *name = kvt_ns_name(ns);
        json_t *cur = json_object_get(per_ns_objs, name);
        json_object_set_new(per_ns_objs, name,
                            json_integer(l2->ns_objs[ns] + (cur ? json_integer_value(cur) : 0)));
    }
    const char *pname = l2->policy ? l2->policy->ops->name : NULL;
    const char *follow = l2->policy ? kvt_policy_following(l2->policy) : NULL;
    double wm = l2->policy ? l2->policy->trigger_watermark : 0,
           ratio = l2->policy ? l2->policy->eviction_ratio : 0;
    pthread_mutex_unlock(&l2->lock);
    json_object_set_new(o, "per_namespace_bytes", per_ns);
    json_object_set_new(o, "per_namespace_objects", per_ns_objs);
    json_object_set_new(o, "namespace_quotas", quotas ? quotas : json_null());
    json_object_set_new(o, "bytes_by_cache_salt", per_salt);
    json_object_set_new(o, "pinned_objects", json_integer((json_int_t)x.pinned_objects));
    /* stored bytes are what the backend holds (after serde and headers);
     * the ratio covers the objects whose logical length is known */
    json_object_set_new(o, "stored_bytes", json_integer((json_int_t)x.used_bytes));
    json_object_set_new(o, "logical_bytes", json_integer((json_int_t)x.logical_bytes));
    json_object_set_new(o, "logical_unknown_objects", json_integer((json_int_t)x.logical_unknown));
    json_object_set_new(o, "stored_to_logical_ratio",
                        x.logical_bytes
                            ? json_real((double)x.stored_known_bytes / (double)x.logical_bytes)
                            : json_null());

    json_t *rec = json_object();
    json_object_set_new(rec, "state", json_string(x.recovering ? "running" : "done"));
    json_object_set_new(rec, "objects", json_integer((json_int_t)x.recovered_objs));
    json_object_set_new(rec, "bytes", json_integer((json_int_t)x.recovered_bytes));
    json_object_set_new(rec, "seconds", json_real(x.recovery_seconds));
    json_object_set_new(o, "recovery", rec);

    json_t *ev = json_object();
    json_object_set_new(ev, "policy", pname ? json_string(pname) : json_null());
    if (pname) {
        json_object_set_new(ev, "trigger_watermark", json_real(wm));
        json_object_set_new(ev, "eviction_ratio", json_real(ratio));
        /* adaptive, value: the order evicted by now (its leader) */
        json_object_set_new(ev, "following", follow ? json_string(follow) : json_null());
    }
    json_object_set_new(o, "eviction", ev);

    json_t *c = json_object();
    json_object_set_new(c, "store_ok", C(store_ok));
    json_object_set_new(c, "store_failed", C(store_failed));
    json_object_set_new(c, "store_skipped", C(store_skipped));
    json_object_set_new(c, "rejected_writes", C(rejected_writes));
    json_object_set_new(c, "lookups", C(lookups));
    json_object_set_new(c, "lookup_hits", C(lookup_hits));
    json_object_set_new(c, "lookup_misses", C(lookup_misses));
    json_object_set_new(c, "secondary_hits", C(secondary_hits));
    json_object_set_new(c, "load_ok", C(load_ok));
    json_object_set_new(c, "load_failed", C(load_failed));
    json_object_set_new(c, "corrupt", C(corrupt));
    json_object_set_new(c, "bytes_written", C(bytes_written));
    json_object_set_new(c, "bytes_read", C(bytes_read));
    json_object_set_new(c, "deleted", C(deleted));
    json_object_set_new(c, "evictions", C(evictions));
    json_object_set_new(c, "sync_evictions", C(sync_evictions));
    json_object_set_new(c, "too_big", C(too_big));
    json_object_set_new(c, "failovers", C(failovers));
    json_object_set_new(c, "reclaimed_bytes", C(reclaimed_bytes));
    json_object_set_new(c, "odirect_fallbacks", C(odirect_fallbacks));
    json_object_set_new(c, "serde_mismatches", C(serde_mismatches));
    json_object_set_new(c, "quota_rejections", C(quota_rejections));
    json_object_set_new(c, "quota_evictions", C(quota_evictions));
    json_object_set_new(o, "counters", c);
    json_object_set_new(o, "serde", json_null()); /* the serde filter fills it in */
    kvt_l2b_budget_status(l2, o);                 /* "shared_budget", with one attached */
    if (l2->ops->status)
        l2->ops->status(l2, o);
    for (int f = 0; f < l2->nfilters; f++)
        if (l2->filters[f].ops->status)
            l2->filters[f].ops->status(l2, l2->filters[f].ctx, o);
    return o;
}
