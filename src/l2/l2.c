/*
 * L2 base: the object index and its accounting, base init/destroy,
 * accessors, the engine helpers (reserve, publish, pin, adopt) and close.
 * The other parts of the base: base_int.h. See l2.h and engine.h for the
 * rules.
 */
#include "l2/base_int.h"
#include "l2/evict.h"
#include "l2/adapters.h"
#include "common/log.h"
#include "common/util.h"
#include "policy/policy.h"
#include "io/tpool.h"
#include "kvtier/error.h"
#include "l2/stage.h"
#include "key/blocktag.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <unistd.h>

/* ------------------------------------------------------------- index */

/* Insert a new entry (key must be absent); returns its handle. */
uint32_t kvt_l2b_idx_insert(kvt_l2 *l2, const kvt_key *k)
{
    struct kvt_l2_index *x = &l2->idx;
    uint32_t h;
    if (x->free_head != NOHANDLE) {
        h = x->free_head;
        x->free_head = x->objs[h].aux;
    } else {
        if (x->hwm == x->cap_objs) {
            uint32_t ncap = x->cap_objs ? x->cap_objs * 2 : 1024;
            x->objs = kvt_xrealloc(x->objs, (size_t)ncap * sizeof(*x->objs));
            x->map.base = (const char *)x->objs;
            x->cap_objs = ncap;
            kvt_policy_reserve(l2->policy, ncap);
        }
        h = x->hwm++;
    }
    memset(&x->objs[h], 0, sizeof(x->objs[h]));
    x->objs[h].key = *k;
    x->nobjs++;
    kvt_kindex_put(&x->map, h);
    return h;
}

static void idx_remove(kvt_l2 *l2, uint32_t h)
{
    struct kvt_l2_index *x = &l2->idx;
    /* only a live, unpinned entry leaves the index (kvt_kindex_del checks
     * that the key maps to it) */
    KVT_ASSERT(h < x->hwm && x->nobjs > 0);
    KVT_ASSERT(x->objs[h].pins == 0);
    if (st(&x->objs[h]) != KVT_OBJ_WRITING) /* READY or DELETING: it was announced */
        obj_announce_locked(l2, &x->objs[h], KVT_TIER_REMOVED);
    kvt_kindex_del(&x->map, h);
    obj_set_state(&x->objs[h], FROM_LIVE, KVT_OBJ_FREE);
    x->objs[h].aux = x->free_head;
    x->free_head = h;
    x->nobjs--;
}

void kvt_l2_set_event_hook(kvt_l2 *l2, const struct kvt_tier_hook *hook)
{
    pthread_mutex_lock(&l2->lock);
    l2->ev = *hook;
    kvt_l2b_early_tags_flush_locked(l2);         /* before what they name is announced */
    for (uint32_t h = 0; h < l2->idx.hwm; h++) { /* what a scan adopted before now */
        uint8_t s = st(&l2->idx.objs[h]);
        if (s == KVT_OBJ_READY || s == KVT_OBJ_DELETING)
            obj_announce_locked(l2, &l2->idx.objs[h], KVT_TIER_STORED);
    }
    pthread_mutex_unlock(&l2->lock);
}

bool kvt_l2_index_scan(kvt_l2 *l2, uint32_t *cursor,
                       bool (*visit)(const struct kvt_l2_obj *o, void *arg), void *arg)
{
    pthread_mutex_lock(&l2->lock);
    uint32_t h = *cursor;
    bool more = true;
    for (; h < l2->idx.hwm && more; h++)
        if (st(&l2->idx.objs[h]) != KVT_OBJ_FREE)
            more = visit(&l2->idx.objs[h], arg);
    bool end = h >= l2->idx.hwm;
    pthread_mutex_unlock(&l2->lock);
    *cursor = h;
    return end;
}

kvt_key *kvt_l2_index_keys(kvt_l2 *l2, uint32_t *n)
{
    pthread_mutex_lock(&l2->lock);
    uint32_t hwm = l2->idx.hwm, k = 0;
    kvt_key *keys = kvt_xmalloc((hwm ? hwm : 1) * sizeof(*keys));
    for (uint32_t h = 0; h < hwm; h++)
        if (st(&l2->idx.objs[h]) != KVT_OBJ_FREE)
            keys[k++] = l2->idx.objs[h].key;
    pthread_mutex_unlock(&l2->lock);
    *n = k;
    return keys;
}

struct kvt_l2_obj *kvt_l2_find_locked(kvt_l2 *l2, const kvt_key *ck)
{
    uint32_t h = idx_find(&l2->idx, ck);
    return h == NOHANDLE ? NULL : &l2->idx.objs[h];
}

uint32_t kvt_l2_handle_locked(kvt_l2 *l2, const struct kvt_l2_obj *o)
{
    return (uint32_t)(o - l2->idx.objs);
}

/* May a lookup pin this entry? */
static bool pinnable(const struct kvt_l2_obj *o)
{
    return st(o) == KVT_OBJ_READY && !(o->state & ST_DOOMED) && o->pins < UINT16_MAX;
}

/* -------------------------------------------------- accounting (locked) */

static void ns_add_locked(kvt_l2 *l2, uint32_t ns, int64_t delta, int objs)
{
    if (ns >= l2->ns_bytes_cap) {
        uint32_t ncap = l2->ns_bytes_cap ? l2->ns_bytes_cap : 64;
        while (ncap <= ns)
            ncap *= 2;
        l2->ns_bytes = kvt_xrealloc(l2->ns_bytes, ncap * sizeof(uint64_t));
        memset(l2->ns_bytes + l2->ns_bytes_cap, 0, (ncap - l2->ns_bytes_cap) * sizeof(uint64_t));
        l2->ns_objs = kvt_xrealloc(l2->ns_objs, ncap * sizeof(uint32_t));
        memset(l2->ns_objs + l2->ns_bytes_cap, 0, (ncap - l2->ns_bytes_cap) * sizeof(uint32_t));
        l2->ns_bytes_cap = ncap;
    }
    KVT_ASSERT(delta >= 0 || l2->ns_bytes[ns] >= (uint64_t)-delta); /* no underflow */
    KVT_ASSERT(objs >= 0 || l2->ns_objs[ns] > 0);
    l2->ns_bytes[ns] = (uint64_t)((int64_t)l2->ns_bytes[ns] + delta);
    l2->ns_objs[ns] = (uint32_t)((int32_t)l2->ns_objs[ns] + objs);
}

/* The quota of a namespace id of one kind (tenant: the "@salt" quota,
 * else the namespace's), resolved by name once per id: its index, or -1
 * when it has none. */
static int quota_of_locked(kvt_l2 *l2, uint32_t ns, bool tenant)
{
    if (!l2->nquotas)
        return -1;
    if (ns >= l2->ns_quota_cap) {
        uint32_t old = l2->ns_quota_cap, ncap = old ? old : 64;
        while (ncap <= ns)
            ncap *= 2;
        l2->ns_quota = kvt_xrealloc(l2->ns_quota, ncap * sizeof(uint32_t));
        l2->ns_tquota = kvt_xrealloc(l2->ns_tquota, ncap * sizeof(uint32_t));
        memset(l2->ns_quota + old, 0, (ncap - old) * sizeof(uint32_t));
        memset(l2->ns_tquota + old, 0, (ncap - old) * sizeof(uint32_t));
        l2->ns_quota_cap = ncap;
    }
    uint32_t *slot = tenant ? &l2->ns_tquota[ns] : &l2->ns_quota[ns];
    if (*slot == 0) {
        const char *name = tenant ? kvt_ns_salt(ns) : kvt_ns_name(ns);
        *slot = 1;
        for (uint32_t i = 0; name && (!tenant || name[0]) && i < l2->nquotas; i++) {
            const struct kvt_l2_quota *q = &l2->quotas[i];
            if (q->tenant == tenant && strcmp(q->name + tenant, name) == 0)
                *slot = 2 + i;
        }
    }
    return (int)*slot - 2;
}

int kvt_l2b_quota_of_locked(kvt_l2 *l2, uint32_t ns)
{
    return quota_of_locked(l2, ns, false);
}

int kvt_l2b_tquota_of_locked(kvt_l2 *l2, uint32_t ns)
{
    return quota_of_locked(l2, ns, true);
}

/* Would stored more bytes of namespace ns go over one of its quotas? The
 * first such quota's index (its refusal counted), else -1. call with
 * l2->lock held */
static int quota_refuses_locked(kvt_l2 *l2, uint32_t ns, uint32_t stored)
{
    int qs[2] = {kvt_l2b_quota_of_locked(l2, ns), kvt_l2b_tquota_of_locked(l2, ns)};
    for (int k = 0; k < 2; k++) {
        struct kvt_l2_quota *q = qs[k] >= 0 ? &l2->quotas[qs[k]] : NULL;
        if (q && !q->off && q->used + stored > q->limit) {
            q->rejected++;
            return qs[k];
        }
    }
    return -1;
}

static void quota_add_locked(kvt_l2 *l2, int q, int64_t d)
{
    if (q < 0)
        return;
    KVT_ASSERT(d >= 0 || l2->quotas[q].used >= (uint64_t)-d);
    l2->quotas[q].used = (uint64_t)((int64_t)l2->quotas[q].used + d);
}

/* An entry enters (sign +1: reserved, adopted) or leaves (-1) the counted
 * set: every running total follows, so that stats never walk the index.
 * Removing more than was added is a bookkeeping bug: assert. call with
 * l2->lock held */
void kvt_l2b_account_locked(kvt_l2 *l2, const struct kvt_l2_obj *o, int sign)
{
    int64_t d = sign * (int64_t)o->stored;
    KVT_ASSERT(d >= 0 || l2->used_bytes >= (uint64_t)-d);
    l2->used_bytes = (uint64_t)((int64_t)l2->used_bytes + d);
    if (o->len) {
        KVT_ASSERT(sign > 0 || (l2->logical_bytes >= o->len && l2->stored_known >= o->stored));
        l2->logical_bytes = (uint64_t)((int64_t)l2->logical_bytes + sign * (int64_t)o->len);
        l2->stored_known = (uint64_t)((int64_t)l2->stored_known + d);
    } else if (o->stored) {
        KVT_ASSERT(sign > 0 || l2->logical_unknown > 0);
        l2->logical_unknown = (uint64_t)((int64_t)l2->logical_unknown + sign);
    }
    ns_add_locked(l2, o->key.ns, d, sign);
    quota_add_locked(l2, kvt_l2b_quota_of_locked(l2, o->key.ns), d);
    quota_add_locked(l2, kvt_l2b_tquota_of_locked(l2, o->key.ns), d);
}

static void pin_locked_obj(kvt_l2 *l2, struct kvt_l2_obj *o)
{
    if (o->pins++ == 0)
        l2->pinned_objs++;
}

void kvt_l2b_unpin_locked_obj(kvt_l2 *l2, struct kvt_l2_obj *o)
{
    if (--o->pins == 0)
        l2->pinned_objs--;
}

void kvt_l2_obj_pin_locked(kvt_l2 *l2, struct kvt_l2_obj *o)
{
    pin_locked_obj(l2, o);
}

void kvt_l2_obj_set_len_locked(kvt_l2 *l2, struct kvt_l2_obj *o, uint32_t len)
{
    kvt_l2b_account_locked(l2, o, -1);
    o->len = len;
    kvt_l2b_account_locked(l2, o, +1);
}

void kvt_l2_obj_set_stored_locked(kvt_l2 *l2, struct kvt_l2_obj *o, uint32_t stored)
{
    kvt_l2b_account_locked(l2, o, -1);
    o->stored = stored;
    kvt_l2b_account_locked(l2, o, +1);
}

/* Drop an entry: policy, accounting, index. */
void kvt_l2b_drop_locked(kvt_l2 *l2, uint32_t h)
{
    struct kvt_l2_obj *o = &l2->idx.objs[h];
    if (o->state & ST_TRACKED)
        kvt_policy_remove(l2->policy, h);
    kvt_l2b_account_locked(l2, o, -1);
    idx_remove(l2, h);
}

/* ------------------------------------------------------------ base */

int kvt_l2_base_init(kvt_l2 *l2, const struct kvt_l2_ops *ops, const struct kvt_l2_spec *spec,
                     enum kvt_codec codec, uint64_t cap_bytes)
{
    memset(l2, 0, sizeof(*l2));
    l2->taker = -1; /* no filter yet */
    for (int i = 0; i < 3; i++)
        l2->efd[i] = -1; /* before any failure: the caller's cleanup closes them */
    l2->ops = ops;
    snprintf(l2->type, sizeof(l2->type), "%s", spec->type);
    snprintf(l2->name, sizeof(l2->name), "%s[%d]",
             spec->name_prefix[0] ? spec->name_prefix : spec->type, spec->index);
    l2->index = spec->index;
    l2->codec = codec;
    l2->cap_bytes = cap_bytes;
    l2->persist_enabled = spec->persist_enabled;
    l2->keep_tags = spec->keep_tags;
    if (spec->has_eviction) /* as kvt_l2_spec_parse read it, value parameters included */
        l2->policy = kvt_policy_build(&spec->eviction);
    if (spec->quotas && json_object_size(spec->quotas)) {
        l2->nquotas = (uint32_t)json_object_size(spec->quotas);
        l2->quotas = kvt_xcalloc(l2->nquotas, sizeof(*l2->quotas));
        const char *qn;
        json_t *qv;
        uint32_t i = 0;
        json_object_foreach(spec->quotas, qn, qv)
        {
            l2->quotas[i].name = kvt_xstrdup(qn);
            l2->quotas[i].tenant = qn[0] == '@';
            l2->quotas[i++].limit = (uint64_t)json_integer_value(qv);
        }
    }
    l2->idx.free_head = NOHANDLE;
    pthread_cond_init(&l2->evict_cv, NULL);
    kvt_kindex_init(&l2->idx.map, sizeof(struct kvt_l2_obj), offsetof(struct kvt_l2_obj, key));
    for (int i = 0; i < 3; i++) {
        l2->efd[i] = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (l2->efd[i] < 0) {
            int e = -errno;
            kvt_l2_base_destroy(l2);
            return e;
        }
    }
    pthread_mutex_init(&l2->lock, NULL);
    return 0;
}

void kvt_l2_base_destroy(kvt_l2 *l2)
{
    kvt_l2b_early_tags_free(l2);
    kvt_l2b_budget_free(l2); /* this server's entry leaves the shared record */
    for (int i = 0; i < 3; i++)
        if (l2->efd[i] >= 0)
            close(l2->efd[i]);
    for (int k = 0; k < 3; k++) {
        kvt_l2_task *t = l2->done_head[k];
        while (t) {
            kvt_l2_task *n = t->next;
            kvt_l2_task_free(t);
            t = n;
        }
    }
    free(l2->idx.objs);
    kvt_kindex_free(&l2->idx.map);
    free(l2->reap_h);
    free(l2->reap_copy);
    free(l2->ns_bytes);
    free(l2->ns_objs);
    for (uint32_t i = 0; i < l2->nquotas; i++)
        free(l2->quotas[i].name);
    free(l2->quotas);
    free(l2->ns_quota);
    free(l2->ns_tquota);
    l2->quotas = NULL;
    l2->nquotas = 0;
    kvt_policy_destroy(l2->policy);
    l2->policy = NULL;
    pthread_cond_destroy(&l2->evict_cv);
}

const char *kvt_l2_name(const kvt_l2 *l2)
{
    return l2->name;
}

const char *kvt_l2_type(const kvt_l2 *l2)
{
    return l2->type;
}

int kvt_l2_efd(const kvt_l2 *l2, enum kvt_l2_kind kind)
{
    return l2->efd[kind];
}

bool kvt_l2_recovering(kvt_l2 *l2)
{
    pthread_mutex_lock(&l2->lock);
    bool rec = l2->recovering;
    pthread_mutex_unlock(&l2->lock);
    return rec;
}

bool kvt_l2_indexed(kvt_l2 *l2, const kvt_key *key)
{
    kvt_key ck;
    kvt_l2_canon(l2, key, &ck);
    pthread_mutex_lock(&l2->lock);
    bool in = idx_find(&l2->idx, &ck) != NOHANDLE;
    pthread_mutex_unlock(&l2->lock);
    return in;
}

void kvt_l2_root(kvt_l2 *l2, char *out, size_t cap)
{
    out[0] = 0;
    if (l2->ops->root)
        l2->ops->root(l2, out, cap);
}

bool kvt_l2_evict_params(kvt_l2 *l2, double *watermark, double *ratio)
{
    if (!l2->policy)
        return false;
    *watermark = l2->policy->trigger_watermark;
    *ratio = l2->policy->eviction_ratio;
    return true;
}

bool kvt_l2_has_quotas(kvt_l2 *l2)
{
    pthread_mutex_lock(&l2->lock);
    bool any = l2->nquotas != 0; /* entries turned off stay: the pass skips them */
    pthread_mutex_unlock(&l2->lock);
    return any;
}

void kvt_l2_close(kvt_l2 *l2)
{
    pthread_mutex_lock(&l2->lock);
    l2->closing = true;
    pthread_mutex_unlock(&l2->lock);
    /* serde: stores still being encoded reach the engine first, the engine
     * drains (its completions queue decodes on the serde pool), then the
     * pool runs what is left */
    for (int f = 0; f < l2->nfilters; f++)
        if (l2->filters[f].ops->quiesce)
            l2->filters[f].ops->quiesce(l2, l2->filters[f].ctx);
    kvt_l2_reap(l2); /* the engine still runs: doomed objects go now */
    if (l2->ops->close)
        l2->ops->close(l2);
    /* last attached first: a detach may still finish tasks (serde's last
     * decodes), which the filters attached before it see */
    for (int f = l2->nfilters; f-- > 0;)
        if (l2->filters[f].ops->detach)
            l2->filters[f].ops->detach(l2, l2->filters[f].ctx);
    l2->nfilters = 0;
    l2->taker = -1;
    kvt_l2_base_destroy(l2);
}

/* ------------------------------------------------------ engine helpers */

/* A new index entry in state `state`, counted in the tier's bytes (a
 * reservation's WRITING entry, or an object adopted READY). call with
 * l2->lock held */
static uint32_t new_entry_locked(kvt_l2 *l2, const kvt_key *ck, uint32_t stored, uint32_t len,
                                 uint32_t aux, uint8_t flags, enum kvt_l2_state state)
{
    uint32_t h = kvt_l2b_idx_insert(l2, ck);
    struct kvt_l2_obj *o = &l2->idx.objs[h];
    o->stored = stored;
    o->len = len;
    o->aux = aux;
    o->flags = flags;
    obj_set_state(o, FROM(KVT_OBJ_FREE), state);
    kvt_l2b_account_locked(l2, o, +1);
    if (state == KVT_OBJ_READY)
        obj_announce_locked(l2, o, KVT_TIER_STORED);
    return h;
}

/* The index part of a reservation with a shared budget: a WRITING entry
 * (a second store of the key, on any thread, sees -EEXIST from now on), or
 * why not. call with l2->lock held */
static int reserve_entry_locked(kvt_l2 *l2, const kvt_key *ck, uint32_t stored, uint32_t len,
                                uint32_t aux, uint8_t flags)
{
    if (l2->closing)
        return -ESHUTDOWN;
    if (idx_find(&l2->idx, ck) != NOHANDLE)
        return -EEXIST;
    if (quota_refuses_locked(l2, ck->ns, stored) >= 0) {
        atomic_fetch_add(&l2->counters.rejected_writes, 1);
        atomic_fetch_add(&l2->counters.quota_rejections, 1);
        return KVT_E_LIMIT;
    }
    new_entry_locked(l2, ck, stored, len, aux, flags, KVT_OBJ_WRITING);
    return 0;
}

/*
 * kvt_l2_reserve with a shared budget (l2/budget.h): the cap is the shared
 * record's, charged outside the lock after the entry went in. Refused, the
 * entry goes again and, with an eviction policy, this server evicts from
 * its own index (kvt_l2b_make_room_shared: each server frees what it
 * holds) and asks again; a record that does not answer fails the store
 * (the cap cannot be checked, so nothing is written).
 */
static int reserve_shared(kvt_l2 *l2, const kvt_key *ck, uint32_t stored, uint32_t len,
                          uint32_t aux, uint8_t flags)
{
    for (int attempt = 0;; attempt++) {
        pthread_mutex_lock(&l2->lock);
        int rc = reserve_entry_locked(l2, ck, stored, len, aux, flags);
        pthread_mutex_unlock(&l2->lock);
        if (rc)
            return rc;
        rc = kvt_l2b_budget_take(l2, stored);
        if (rc == 0)
            return 0;
        pthread_mutex_lock(&l2->lock); /* not charged: the entry goes, nothing to give back */
        uint32_t h = idx_find(&l2->idx, ck);
        KVT_ASSERT(h != NOHANDLE && st(&l2->idx.objs[h]) == KVT_OBJ_WRITING);
        kvt_l2b_drop_locked(l2, h);
        pthread_mutex_unlock(&l2->lock);
        if (rc != KVT_E_FULL)
            return rc;
        if (!(l2->policy && !l2->no_sync_evict && attempt < 16 &&
              kvt_l2b_make_room_shared(l2, stored))) {
            atomic_fetch_add(&l2->counters.rejected_writes, 1);
            return KVT_E_FULL;
        }
    }
}

int kvt_l2_reserve(kvt_l2 *l2, const kvt_key *ck, uint32_t stored, uint32_t len, uint32_t aux,
                   uint8_t flags)
{
    if (l2->budget)
        return reserve_shared(l2, ck, stored, len, aux, flags);
    int rc;
    for (int attempt = 0;; attempt++) {
        pthread_mutex_lock(&l2->lock);
        bool over = !l2->closing && l2->cap_bytes && l2->used_bytes + stored > l2->cap_bytes &&
                    idx_find(&l2->idx, ck) == NOHANDLE;
        bool evict = over && l2->policy && !l2->no_sync_evict && attempt < 16;
        if (!evict)
            break; /* with the lock held */
        pthread_mutex_unlock(&l2->lock);
        if (!kvt_l2b_make_room(l2, stored)) {
            pthread_mutex_lock(&l2->lock);
            break; /* everything left is pinned or in flight: refused below */
        }
    }
    /* over the cap is refused as full, unless closing or already there
     * (reserve_entry_locked answers those) */
    if (l2->cap_bytes && l2->used_bytes + stored > l2->cap_bytes && !l2->closing &&
        idx_find(&l2->idx, ck) == NOHANDLE) {
        rc = KVT_E_FULL;
        atomic_fetch_add(&l2->counters.rejected_writes, 1);
    } else {
        rc = reserve_entry_locked(l2, ck, stored, len, aux, flags);
    }
    pthread_mutex_unlock(&l2->lock);
    return rc;
}

static void publish(kvt_l2 *l2, const kvt_key *ck, bool set_aux, uint32_t aux)
{
    uint32_t settled = 0;
    pthread_mutex_lock(&l2->lock);
    uint32_t h = idx_find(&l2->idx, ck);
    if (h != NOHANDLE && st(&l2->idx.objs[h]) == KVT_OBJ_WRITING) {
        if (set_aux)
            l2->idx.objs[h].aux = aux;
        obj_set_state(&l2->idx.objs[h], FROM(KVT_OBJ_WRITING), KVT_OBJ_READY);
        obj_announce_locked(l2, &l2->idx.objs[h], KVT_TIER_STORED);
        settled = l2->idx.objs[h].stored;
    }
    pthread_mutex_unlock(&l2->lock);
    if (l2->budget && settled)
        kvt_l2b_budget_settle(l2, settled);
}

void kvt_l2_publish(kvt_l2 *l2, const kvt_key *ck)
{
    publish(l2, ck, false, 0);
}

void kvt_l2_publish_aux(kvt_l2 *l2, const kvt_key *ck, uint32_t aux)
{
    publish(l2, ck, true, aux);
}

/* Drop a WRITING entry; returns its stored bytes (0: there was none). */
static uint32_t unreserve(kvt_l2 *l2, const kvt_key *ck)
{
    uint32_t stored = 0;
    pthread_mutex_lock(&l2->lock);
    uint32_t h = idx_find(&l2->idx, ck);
    if (h != NOHANDLE && st(&l2->idx.objs[h]) == KVT_OBJ_WRITING) {
        stored = l2->idx.objs[h].stored;
        kvt_l2b_drop_locked(l2, h);
    }
    pthread_mutex_unlock(&l2->lock);
    return stored;
}

void kvt_l2_unreserve(kvt_l2 *l2, const kvt_key *ck)
{
    uint32_t stored = unreserve(l2, ck);
    if (l2->budget && stored)
        kvt_l2b_budget_refund(l2, stored);
}

void kvt_l2_unreserve_unsure(kvt_l2 *l2, const kvt_key *ck)
{
    uint32_t stored = unreserve(l2, ck);
    if (l2->budget && stored)
        kvt_l2b_budget_unsure(l2, stored);
}

/* Pin a ready entry; NULL when there is none (or it cannot take another
 * pin). call with l2->lock held */
static struct kvt_l2_obj *pin_locked(kvt_l2 *l2, const kvt_key *ck)
{
    uint32_t h = idx_find(&l2->idx, ck);
    if (h == NOHANDLE)
        return NULL;
    struct kvt_l2_obj *o = &l2->idx.objs[h];
    if (!pinnable(o))
        return NULL;
    pin_locked_obj(l2, o);
    return o;
}

bool kvt_l2_pin(kvt_l2 *l2, const kvt_key *ck, struct kvt_l2_obj *out)
{
    pthread_mutex_lock(&l2->lock);
    struct kvt_l2_obj *o = pin_locked(l2, ck);
    if (o && out)
        *out = *o;
    pthread_mutex_unlock(&l2->lock);
    return o != NULL;
}

void kvt_l2_lookup_index(kvt_l2 *l2, kvt_l2_task *t)
{
    pthread_mutex_lock(&l2->lock); /* once for the batch, not once per key */
    for (uint32_t i = 0; i < t->n; i++) {
        kvt_key ck;
        kvt_l2_canon(l2, &t->keys[i], &ck);
        struct kvt_l2_obj *o = pin_locked(l2, &ck);
        if (o) {
            t->meta[i].len = o->len;
            kvt_bm_set(t->ok, i);
        }
    }
    pthread_mutex_unlock(&l2->lock);
    kvt_l2_task_finish(l2, t);
}

/* All or nothing under one lock hold: a partial hit would need the slow
 * path for the rest anyway, and pins taken here must not be taken twice. */
bool kvt_l2_lookup_known(kvt_l2 *l2, kvt_l2_task *t)
{
    uint32_t hits = 0;
    kvt_key ck;
    pthread_mutex_lock(&l2->lock);
    for (uint32_t i = 0; i < t->n; i++) {
        kvt_l2_canon(l2, &t->keys[i], &ck);
        uint32_t h = idx_find(&l2->idx, &ck);
        const struct kvt_l2_obj *o = h == NOHANDLE ? NULL : &l2->idx.objs[h];
        if (!(o && pinnable(o) && o->aux))
            break;
        hits++;
    }
    if (hits == t->n) {
        for (uint32_t i = 0; i < t->n; i++) {
            kvt_l2_canon(l2, &t->keys[i], &ck);
            struct kvt_l2_obj *o = &l2->idx.objs[idx_find(&l2->idx, &ck)];
            pin_locked_obj(l2, o);
            t->meta[i].len = o->len;
            kvt_bm_set(t->ok, i);
        }
    }
    pthread_mutex_unlock(&l2->lock);
    if (hits != t->n)
        return false;
    kvt_l2_task_finish(l2, t);
    return true;
}

bool kvt_l2_adopt(kvt_l2 *l2, const kvt_key *ck, uint32_t stored, uint32_t len, uint32_t aux,
                  uint8_t flags, bool pin, bool at_cold_end)
{
    return kvt_l2_adopt_tag(l2, ck, NULL, stored, len, aux, flags, pin, at_cold_end);
}

bool kvt_l2_adopt_tag(kvt_l2 *l2, const kvt_key *ck, struct kvt_blocktag *tag, uint32_t stored,
                      uint32_t len, uint32_t aux, uint8_t flags, bool pin, bool at_cold_end)
{
    bool inserted = false;
    pthread_mutex_lock(&l2->lock);
    uint32_t h = idx_find(&l2->idx, ck);
    if (h != NOHANDLE)
        kvt_blocktag_put(tag); /* indexed and announced already */
    else if (tag)
        kvt_l2b_give_tag_locked(l2, ck, tag); /* before the entry is announced */
    if (h == NOHANDLE) {
        h = new_entry_locked(l2, ck, stored, len, aux, flags, KVT_OBJ_READY);
        if (l2->policy) {
            struct kvt_policy_hint hint = {
                .prefix_pos = 0, .bytes = stored, .fp = kvt_key_hash(ck)};
            kvt_policy_insert(l2->policy, h, at_cold_end, &hint);
            l2->idx.objs[h].state |= ST_TRACKED;
        }
        inserted = true;
    }
    struct kvt_l2_obj *o = &l2->idx.objs[h];
    if (pin && pinnable(o))
        pin_locked_obj(l2, o);
    pthread_mutex_unlock(&l2->lock);
    return inserted;
}

void kvt_l2_forget(kvt_l2 *l2, const kvt_key *ck)
{
    pthread_mutex_lock(&l2->lock);
    uint32_t h = idx_find(&l2->idx, ck);
    if (h != NOHANDLE) {
        struct kvt_l2_obj *o = &l2->idx.objs[h];
        if (st(o) == KVT_OBJ_READY) {
            if (o->pins)
                kvt_l2b_unpin_locked_obj(l2, o); /* the caller's own pin */
            if (o->pins == 0)
                kvt_l2b_drop_locked(l2, h);
        }
    }
    pthread_mutex_unlock(&l2->lock);
}

void kvt_l2_touch(kvt_l2 *l2, const kvt_key *ck, uint32_t n)
{
    if (!l2->policy)
        return;
    pthread_mutex_lock(&l2->lock);
    for (uint32_t i = n; i-- > 0;) {
        uint32_t h = idx_find(&l2->idx, &ck[i]);
        if (h != NOHANDLE && (l2->idx.objs[h].state & ST_TRACKED))
            kvt_policy_access(l2->policy, h);
    }
    pthread_mutex_unlock(&l2->lock);
}

bool kvt_l2_pin_found(kvt_l2 *l2, const kvt_key *ck, uint32_t stored, uint32_t logical,
                      uint32_t aux, uint8_t flag)
{
    pthread_mutex_lock(&l2->lock);
    struct kvt_l2_obj *o = kvt_l2_find_locked(l2, ck);
    bool hit = false, known = o != NULL;
    if (o && pinnable(o)) {
        pin_locked_obj(l2, o);
        if (o->len != logical)
            kvt_l2_obj_set_len_locked(l2, o, logical);
        o->flags |= flag;
        hit = true;
    }
    pthread_mutex_unlock(&l2->lock);
    if (known)
        return hit;
    /* adopt unpinned, then pin: adopt cannot say whether it pinned an entry
     * that someone else inserted meanwhile */
    if (kvt_l2_adopt(l2, ck, stored, logical, aux, flag, false, false))
        atomic_fetch_add(&l2->counters.secondary_hits, 1);
    return kvt_l2_pin(l2, ck, NULL);
}
