/*
 * L2 base: the operator's calls (l2.h, "operator calls"): run a task and
 * wait for it, hold entries against eviction, quotas at run time. The
 * admin API (src/core/admin.c) is their one user.
 */
#include "l2/base_int.h"
#include "common/util.h"
#include "kvtier/error.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct kvt_l2_waiter {
    pthread_mutex_t lock; /* guards done */
    pthread_cond_t cond;
    bool done;
};

void kvt_l2b_wake(kvt_l2_task *t)
{
    struct kvt_l2_waiter *w = t->waiter;
    pthread_mutex_lock(&w->lock);
    w->done = true;
    pthread_cond_signal(&w->cond);
    pthread_mutex_unlock(&w->lock);
}

void kvt_l2_run(kvt_l2 *l2, kvt_l2_task *t)
{
    struct kvt_l2_waiter w = {.done = false};
    pthread_mutex_init(&w.lock, NULL);
    pthread_cond_init(&w.cond, NULL);
    t->waiter = &w;
    kvt_l2_submit(l2, t);
    pthread_mutex_lock(&w.lock);
    while (!w.done)
        pthread_cond_wait(&w.cond, &w.lock);
    pthread_mutex_unlock(&w.lock);
    t->waiter = NULL;
    pthread_cond_destroy(&w.cond);
    pthread_mutex_destroy(&w.lock);
}

uint32_t kvt_l2_hold(kvt_l2 *l2, const kvt_key *keys, uint32_t n, uint64_t *held)
{
    uint32_t count = 0;
    pthread_mutex_lock(&l2->lock);
    for (uint32_t i = 0; i < n; i++) {
        kvt_key ck;
        kvt_l2_canon(l2, &keys[i], &ck);
        struct kvt_l2_obj *o = kvt_l2_find_locked(l2, &ck);
        if (!o || kvt_l2_obj_state(o) != KVT_OBJ_READY || (o->state & ST_DOOMED) ||
            o->pins == UINT16_MAX)
            continue;
        kvt_l2_obj_pin_locked(l2, o);
        kvt_bm_set(held, i);
        count++;
    }
    pthread_mutex_unlock(&l2->lock);
    return count;
}

/* The entry named name, or -1. call with l2->lock held */
static int quota_find_locked(kvt_l2 *l2, const char *name)
{
    for (uint32_t i = 0; i < l2->nquotas; i++)
        if (strcmp(l2->quotas[i].name, name) == 0)
            return (int)i;
    return -1;
}

/* The bytes this adapter holds of a quota's namespaces (or tenant), from
 * the per-namespace totals. call with l2->lock held */
static uint64_t name_bytes_locked(kvt_l2 *l2, const char *name)
{
    bool tenant = name[0] == '@';
    uint64_t sum = 0;
    for (uint32_t ns = 1; ns < l2->ns_bytes_cap; ns++) {
        if (!l2->ns_bytes[ns])
            continue;
        const char *n = tenant ? kvt_ns_salt(ns) : kvt_ns_name(ns);
        if (n && strcmp(n, name + tenant) == 0)
            sum += l2->ns_bytes[ns];
    }
    return sum;
}

int kvt_l2_quota_get(kvt_l2 *l2, const char *name, struct kvt_l2_quota_info *out)
{
    pthread_mutex_lock(&l2->lock);
    int q = quota_find_locked(l2, name);
    bool on = q >= 0 && !l2->quotas[q].off;
    if (on)
        *out = (struct kvt_l2_quota_info){l2->quotas[q].limit, l2->quotas[q].used,
                                          l2->quotas[q].rejected};
    pthread_mutex_unlock(&l2->lock);
    return on ? 0 : -ENOENT;
}

/*
 * A new entry starts with the bytes its namespaces hold now, and every
 * namespace id is resolved again (ids resolved to "no quota" before it
 * existed would never count towards it otherwise): the caches are wiped
 * and refilled lazily, which is exact because an id resolves to the same
 * entry whenever it is looked up. An existing entry (on or off) keeps its
 * index and its use, which the accounting kept current all along.
 */
int kvt_l2_quota_set(kvt_l2 *l2, const char *name, uint64_t limit, uint64_t *used)
{
    int rc = 0;
    pthread_mutex_lock(&l2->lock);
    int q = quota_find_locked(l2, name);
    *used = q >= 0 ? l2->quotas[q].used : name_bytes_locked(l2, name);
    if (*used > limit) {
        rc = -EOVERFLOW;
    } else if (q >= 0) {
        l2->quotas[q].limit = limit;
        l2->quotas[q].off = false;
    } else if (l2->nquotas >= KVT_L2_MAX_QUOTAS) {
        rc = -ENOSPC;
    } else {
        l2->quotas = kvt_xrealloc(l2->quotas, (l2->nquotas + 1) * sizeof(*l2->quotas));
        l2->quotas[l2->nquotas] = (struct kvt_l2_quota){
            .name = kvt_xstrdup(name), .limit = limit, .used = *used, .tenant = name[0] == '@'};
        l2->nquotas++;
        if (l2->ns_quota_cap) {
            memset(l2->ns_quota, 0, l2->ns_quota_cap * sizeof(uint32_t));
            memset(l2->ns_tquota, 0, l2->ns_quota_cap * sizeof(uint32_t));
        }
    }
    pthread_mutex_unlock(&l2->lock);
    return rc;
}

int kvt_l2_quota_del(kvt_l2 *l2, const char *name)
{
    pthread_mutex_lock(&l2->lock);
    int q = quota_find_locked(l2, name);
    bool on = q >= 0 && !l2->quotas[q].off;
    if (on) /* kept, counting, so that the ids resolved to it stay valid */
        l2->quotas[q].off = true;
    pthread_mutex_unlock(&l2->lock);
    return on ? 0 : -ENOENT;
}

json_t *kvt_l2_quotas(kvt_l2 *l2)
{
    json_t *o = json_object();
    pthread_mutex_lock(&l2->lock);
    for (uint32_t i = 0; i < l2->nquotas; i++) {
        const struct kvt_l2_quota *qt = &l2->quotas[i];
        if (qt->off)
            continue;
        json_t *e = json_object();
        json_object_set_new(e, "quota_bytes", json_integer((json_int_t)qt->limit));
        json_object_set_new(e, "used_bytes", json_integer((json_int_t)qt->used));
        json_object_set_new(e, "rejected_writes", json_integer((json_int_t)qt->rejected));
        json_object_set_new(o, qt->name, e);
    }
    pthread_mutex_unlock(&l2->lock);
    return o;
}
