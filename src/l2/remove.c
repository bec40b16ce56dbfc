/* L2 base: unlock, doom and reap, delete, eviction (on a store's thread
 * and by the eviction controller). */
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

/* Queue a doomed, unpinned READY entry for kvt_l2_reap. call with lock held */
static void reap_queue_locked(kvt_l2 *l2, uint32_t h)
{
    struct kvt_l2_obj *o = &l2->idx.objs[h];
    obj_set_state(o, FROM(KVT_OBJ_READY), KVT_OBJ_DELETING);
    if (l2->nreap == l2->reap_cap) {
        l2->reap_cap = l2->reap_cap ? 2 * l2->reap_cap : 16;
        l2->reap_h = kvt_xrealloc(l2->reap_h, l2->reap_cap * sizeof(*l2->reap_h));
        l2->reap_copy = kvt_xrealloc(l2->reap_copy, l2->reap_cap * sizeof(*l2->reap_copy));
    }
    l2->reap_h[l2->nreap] = h;
    l2->reap_copy[l2->nreap++] = *o;
}

void kvt_l2_unlock(kvt_l2 *l2, const kvt_key *keys, uint32_t n)
{
    pthread_mutex_lock(&l2->lock);
    for (uint32_t i = 0; i < n; i++) {
        kvt_key ck;
        kvt_l2_canon(l2, &keys[i], &ck);
        uint32_t h = idx_find(&l2->idx, &ck);
        if (h == NOHANDLE || l2->idx.objs[h].pins == 0)
            continue;
        struct kvt_l2_obj *o = &l2->idx.objs[h];
        kvt_l2b_unpin_locked_obj(l2, o);
        if (o->pins == 0 && (o->state & ST_DOOMED) && st(o) == KVT_OBJ_READY)
            reap_queue_locked(l2, h);
    }
    pthread_mutex_unlock(&l2->lock);
}

void kvt_l2_doom(kvt_l2 *l2, const kvt_key *ck)
{
    pthread_mutex_lock(&l2->lock);
    uint32_t h = idx_find(&l2->idx, ck);
    if (h != NOHANDLE && st(&l2->idx.objs[h]) == KVT_OBJ_READY) {
        l2->idx.objs[h].state |= ST_DOOMED;
        if (l2->idx.objs[h].pins == 0)
            reap_queue_locked(l2, h);
    }
    pthread_mutex_unlock(&l2->lock);
}

/*
 * Remove entries already marked DELETING: the engine removes the bytes
 * without the lock (an unlink must not stall lookups), then the entry goes.
 * If the engine fails to remove, the entry is forgotten anyway only when the
 * object is gone (ENOENT); otherwise it returns to READY.
 */
static uint64_t remove_marked(kvt_l2 *l2, uint32_t *hs, struct kvt_l2_obj *copies, uint32_t n,
                              uint64_t *removed_bits, const uint32_t *bit_of, bool eviction,
                              uint32_t *nremoved)
{
    uint32_t cnt = 0;
    /* shared budget: the epoch before any byte goes (budget.h, "removed") */
    uint64_t epoch = l2->budget && n ? kvt_l2b_budget_epoch(l2) : 0;
    int *rcs = kvt_xcalloc(n ? n : 1, sizeof(int));
    if (l2->ops->remove_batch && n)
        l2->ops->remove_batch(l2, copies, n, rcs);
    else
        for (uint32_t i = 0; i < n; i++)
            rcs[i] = l2->ops->remove ? l2->ops->remove(l2, &copies[i]) : 0;
    uint64_t freed = 0, removed = 0;
    pthread_mutex_lock(&l2->lock);
    for (uint32_t i = 0; i < n; i++) {
        struct kvt_l2_obj *o = &l2->idx.objs[hs[i]];
        if (eviction) /* marked by victim_visit: settled now, either way */
            l2->evicting_bytes -= KVT_MIN(l2->evicting_bytes, (uint64_t)copies[i].stored);
        if (rcs[i] == 0) /* this server removed it (-ENOENT: someone else did) */
            removed += copies[i].stored;
        if (rcs[i] == 0 || rcs[i] == -ENOENT) {
            freed += o->stored;
            cnt++;
            kvt_l2b_drop_locked(l2, hs[i]);
            atomic_fetch_add(&l2->counters.deleted, 1);
            if (eviction) {
                atomic_fetch_add(&l2->counters.evictions, 1);
                atomic_fetch_add(&l2->counters.reclaimed_bytes, copies[i].stored);
            }
            if (removed_bits && bit_of)
                kvt_bm_set(removed_bits, bit_of[i]);
        } else {
            /* back to READY; a doomed one stays doomed (never pinned again)
             * and is queued for the next reap */
            obj_set_state(o, FROM(KVT_OBJ_DELETING), KVT_OBJ_READY);
            if ((o->state & ST_DOOMED) && o->pins == 0)
                reap_queue_locked(l2, hs[i]);
            char ks[400];
            kvt_warn("%s: could not remove %s: %s", l2->name,
                     kvt_key_str(&copies[i].key, ks, sizeof(ks)), kvt_strerror(rcs[i]));
        }
    }
    if (eviction)
        pthread_cond_broadcast(&l2->evict_cv);
    pthread_mutex_unlock(&l2->lock);
    free(rcs);
    if (l2->budget)
        kvt_l2b_budget_removed(l2, removed, epoch);
    if (nremoved)
        *nremoved = cnt;
    return freed;
}

/* The handle of key's ready, unpinned entry (what a delete may take), or
 * NOHANDLE. call with l2->lock held */
static uint32_t deletable_locked(kvt_l2 *l2, const kvt_key *key)
{
    kvt_key ck;
    kvt_l2_canon(l2, key, &ck);
    uint32_t h = idx_find(&l2->idx, &ck);
    if (h == NOHANDLE)
        return NOHANDLE;
    const struct kvt_l2_obj *o = &l2->idx.objs[h];
    return st(o) == KVT_OBJ_READY && !o->pins ? h : NOHANDLE;
}

uint32_t kvt_l2_delete(kvt_l2 *l2, const kvt_key *keys, uint32_t n, uint64_t *removed)
{
    uint32_t *hs = kvt_xcalloc(n ? n : 1, sizeof(uint32_t));
    uint32_t *bit = kvt_xcalloc(n ? n : 1, sizeof(uint32_t));
    struct kvt_l2_obj *copies = kvt_xcalloc(n ? n : 1, sizeof(*copies));
    uint32_t m = 0;
    pthread_mutex_lock(&l2->lock);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t h = deletable_locked(l2, &keys[i]);
        if (h == NOHANDLE)
            continue;
        struct kvt_l2_obj *o = &l2->idx.objs[h];
        obj_set_state(o, FROM(KVT_OBJ_READY), KVT_OBJ_DELETING);
        hs[m] = h;
        bit[m] = i;
        copies[m++] = *o;
    }
    pthread_mutex_unlock(&l2->lock);
    uint32_t count = 0;
    remove_marked(l2, hs, copies, m, removed, bit, false, &count);
    free(hs);
    free(bit);
    free(copies);
    return count;
}

uint32_t kvt_l2_drop_gone(kvt_l2 *l2, const kvt_key *ck, uint32_t n)
{
    uint32_t count = 0;
    pthread_mutex_lock(&l2->lock);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t h = deletable_locked(l2, &ck[i]);
        if (h == NOHANDLE)
            continue;
        kvt_l2b_drop_locked(l2, h);
        atomic_fetch_add(&l2->counters.deleted, 1);
        count++;
    }
    pthread_mutex_unlock(&l2->lock);
    return count;
}

void kvt_l2_slot_corrupt(kvt_l2 *l2, const kvt_key *key, uint32_t slot, const char *why)
{
    kvt_key ck;
    kvt_l2_canon(l2, key, &ck);
    atomic_fetch_add(&l2->counters.corrupt, 1);
    kvt_l2_doom(l2, &ck);
    char ks[400], where[32] = "";
    if (slot != UINT32_MAX)
        snprintf(where, sizeof(where), " in slot %u", slot);
    kvt_warn("%s: %s%s failed verification (%s): a miss, removed once its readers are done",
             l2->name, kvt_key_str(key, ks, sizeof(ks)), where, why);
}

uint32_t kvt_l2_reap(kvt_l2 *l2)
{
    pthread_mutex_lock(&l2->lock);
    uint32_t n = l2->nreap, count = 0;
    uint32_t *hs = l2->reap_h;
    struct kvt_l2_obj *copies = l2->reap_copy;
    l2->reap_h = NULL;
    l2->reap_copy = NULL;
    l2->nreap = l2->reap_cap = 0;
    pthread_mutex_unlock(&l2->lock);
    if (n) {
        remove_marked(l2, hs, copies, n, NULL, NULL, false, &count);
        char ks[400];
        kvt_info("%s: removed %u of %u objects that failed verification (first: %s)", l2->name,
                 count, n, kvt_key_str(&copies[0].key, ks, sizeof(ks)));
    }
    free(hs);
    free(copies);
    return count;
}

struct victim_ctx {
    kvt_l2 *l2;
    uint32_t *hs;
    struct kvt_l2_obj *copies;
    uint32_t n, max;
    uint64_t need; /* bytes still to free */
};

static bool victim_visit(uint32_t h, void *arg)
{
    struct victim_ctx *v = arg;
    struct kvt_l2_obj *o = &v->l2->idx.objs[h];
    if (st(o) == KVT_OBJ_READY && o->pins == 0) {
        obj_set_state(o, FROM(KVT_OBJ_READY), KVT_OBJ_DELETING);
        v->hs[v->n] = h;
        v->copies[v->n++] = *o;
        v->l2->evicting_bytes += o->stored;
        v->need = v->need > o->stored ? v->need - o->stored : 0;
    }
    return v->n < v->max && v->need > 0;
}

/* kvt_l2_evict_to; *stuck: it stopped above the target because nothing
 * left could be marked (pinned, in flight, or marked by another eviction). */
static uint64_t evict_to(kvt_l2 *l2, uint64_t target, uint32_t batch, bool *stuck)
{
    *stuck = false;
    if (!l2->policy || batch == 0)
        return 0;
    uint64_t total = 0;
    uint32_t *hs = kvt_xcalloc(batch, sizeof(uint32_t));
    struct kvt_l2_obj *copies = kvt_xcalloc(batch, sizeof(*copies));
    for (;;) {
        struct victim_ctx v = {.l2 = l2, .hs = hs, .copies = copies, .max = batch};
        pthread_mutex_lock(&l2->lock);
        uint64_t live = l2->used_bytes - KVT_MIN(l2->used_bytes, l2->evicting_bytes);
        if (live <= target || l2->closing) {
            pthread_mutex_unlock(&l2->lock);
            break; /* there, or other evictions in flight will get it there */
        }
        v.need = live - target;
        l2->policy->ops->walk(l2->policy, victim_visit, &v);
        pthread_mutex_unlock(&l2->lock);
        if (v.n == 0) {
            *stuck = true; /* everything left is pinned or in flight: retry next wake */
            break;
        }
        uint64_t freed = remove_marked(l2, hs, copies, v.n, NULL, NULL, true, NULL);
        total += freed;
        if (freed == 0) {
            *stuck = true;
            break;
        }
    }
    free(hs);
    free(copies);
    return total;
}

uint64_t kvt_l2_evict_to(kvt_l2 *l2, uint64_t target, uint32_t batch)
{
    bool stuck;
    return evict_to(l2, target, batch, &stuck);
}

struct qvictim_ctx {
    struct victim_ctx v;
    int quota;
};

static bool qvictim_visit(uint32_t h, void *arg)
{
    struct qvictim_ctx *q = arg;
    kvt_l2 *l2 = q->v.l2;
    uint32_t ns = l2->idx.objs[h].key.ns;
    if (kvt_l2b_quota_of_locked(l2, ns) != q->quota && kvt_l2b_tquota_of_locked(l2, ns) != q->quota)
        return true; /* another namespace (tenant): keep walking */
    return victim_visit(h, &q->v);
}

/*
 * Per-namespace eviction. The policy walk is shared by all namespaces, so
 * this visits other namespaces' entries on its way (O(objects) in the worst
 * case, under l2->lock like kvt_l2_evict_to's walk); it runs on the eviction
 * thread only for namespaces at their quota watermark.
 */
uint64_t kvt_l2_evict_quotas(kvt_l2 *l2, uint32_t batch)
{
    if (!l2->policy || batch == 0)
        return 0;
    uint64_t total = 0;
    uint32_t *hs = kvt_xcalloc(batch, sizeof(uint32_t));
    struct kvt_l2_obj *copies = kvt_xcalloc(batch, sizeof(*copies));
    double wm = l2->policy->trigger_watermark, ratio = l2->policy->eviction_ratio;
    /* the list may grow (and move) at run time: each look is by index,
     * under the lock */
    for (uint32_t qi = 0;; qi++) {
        pthread_mutex_lock(&l2->lock);
        if (qi >= l2->nquotas) {
            pthread_mutex_unlock(&l2->lock);
            break;
        }
        const struct kvt_l2_quota *qt = &l2->quotas[qi];
        bool over = !qt->off && qt->used && (double)qt->used >= wm * (double)qt->limit;
        uint64_t target = (uint64_t)((double)qt->used * (1.0 - ratio));
        if (qt->used > qt->limit && target > qt->limit)
            target = qt->limit;
        pthread_mutex_unlock(&l2->lock);
        while (over) {
            struct qvictim_ctx q = {.v = {.l2 = l2, .hs = hs, .copies = copies, .max = batch},
                                    .quota = (int)qi};
            pthread_mutex_lock(&l2->lock);
            uint64_t used = l2->quotas[qi].used;
            if (used <= target || l2->quotas[qi].off || l2->closing) {
                pthread_mutex_unlock(&l2->lock);
                break;
            }
            q.v.need = used - target;
            l2->policy->ops->walk(l2->policy, qvictim_visit, &q);
            pthread_mutex_unlock(&l2->lock);
            if (q.v.n == 0)
                break; /* pinned or in flight: next wake */
            uint32_t nrem = 0;
            uint64_t freed = remove_marked(l2, hs, copies, q.v.n, NULL, NULL, true, &nrem);
            atomic_fetch_add(&l2->counters.quota_evictions, nrem);
            total += freed;
            if (freed == 0)
                break;
        }
    }
    free(hs);
    free(copies);
    return total;
}

/* Wait (l2->lock held) until an eviction in flight settles, at most 2 s.
 * Returns whether there was one to wait for. */
static bool wait_evictions_locked(kvt_l2 *l2)
{
    if (!l2->evicting_bytes || l2->closing)
        return false;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 2;
    uint64_t before = l2->evicting_bytes;
    while (!l2->closing && l2->evicting_bytes == before)
        if (pthread_cond_timedwait(&l2->evict_cv, &l2->lock, &until) == ETIMEDOUT)
            break;
    return true;
}

/*
 * A store that does not fit under the cap, on an adapter with an eviction
 * policy: make room now, as the eviction controller would on its next
 * wake (down to used x (1 - eviction_ratio)), but at least room for this
 * object; the policy chooses, pinned and in-flight objects are never taken
 * (kvt_l2_evict_to). Runs on the engine's store thread, without l2->lock.
 * Returns whether the store may try again: this thread freed something, or
 * there is room now (evictions in flight elsewhere made it).
 */
bool kvt_l2b_make_room(kvt_l2 *l2, uint32_t stored)
{
    pthread_mutex_lock(&l2->lock);
    uint64_t used = l2->used_bytes, cap = l2->cap_bytes;
    uint64_t live = used - KVT_MIN(used, l2->evicting_bytes);
    double ratio = l2->policy ? l2->policy->eviction_ratio : 0;
    if (!cap || stored > cap) {
        pthread_mutex_unlock(&l2->lock);
        return false; /* never fits */
    }
    if (live + stored <= cap) { /* room now, or once the evictions in flight settle */
        if (used + stored > cap)
            wait_evictions_locked(l2);
        pthread_mutex_unlock(&l2->lock);
        return true; /* look again */
    }
    pthread_mutex_unlock(&l2->lock);
    uint64_t target = KVT_MIN(cap - stored, (uint64_t)((double)live * (1.0 - ratio)));
    bool stuck;
    uint64_t freed = evict_to(l2, target, 256, &stuck);
    if (freed) {
        atomic_fetch_add(&l2->counters.sync_evictions, 1);
        kvt_debug("%s: a store of %u bytes did not fit under the cap: evicted %llu bytes now",
                  l2->name, stored, (unsigned long long)freed);
        return true;
    }
    /* Nothing freed by this thread: other threads got there first (their
     * evictions settled down to the target, or are in flight with what this
     * one would have marked), or everything left is pinned or in flight.
     * Only the last is a refusal. */
    if (!stuck)
        return true; /* the target was reached by others: look again */
    pthread_mutex_lock(&l2->lock);
    bool again = wait_evictions_locked(l2) || l2->used_bytes + stored <= l2->cap_bytes;
    pthread_mutex_unlock(&l2->lock);
    return again;
}

/*
 * kvt_l2b_make_room with a shared budget: the record refused a store of
 * stored bytes (its total, as the refusal read it, + stored > cap). This
 * server frees what it can from its own index (which may hold objects
 * other servers stored): at least the overshoot, and at least
 * eviction_ratio of what it holds, as the eviction controller would. The
 * removals are subtracted from the record (remove_marked), then the store
 * asks again. Returns whether it may: something was freed here, or others'
 * evictions were in flight. A server holding nothing evictable refuses at
 * once: the others' eviction controllers free the tier on their next wake.
 */
bool kvt_l2b_make_room_shared(kvt_l2 *l2, uint32_t stored)
{
    uint64_t cap = l2->cap_bytes;
    int64_t total = kvt_l2b_budget_total(l2);
    if (!cap || stored > cap)
        return false; /* never fits */
    uint64_t t = total > 0 ? (uint64_t)total : 0;
    uint64_t need = t + stored > cap ? t + stored - cap : stored;
    pthread_mutex_lock(&l2->lock);
    uint64_t used = l2->used_bytes;
    uint64_t live = used - KVT_MIN(used, l2->evicting_bytes);
    double ratio = l2->policy ? l2->policy->eviction_ratio : 0;
    if (live == 0) {
        bool again = wait_evictions_locked(l2);
        pthread_mutex_unlock(&l2->lock);
        return again;
    }
    pthread_mutex_unlock(&l2->lock);
    uint64_t want = KVT_MAX(need, (uint64_t)((double)live * ratio));
    uint64_t target = live > want ? live - want : 0;
    bool stuck;
    uint64_t freed = evict_to(l2, target, 256, &stuck);
    if (freed) {
        atomic_fetch_add(&l2->counters.sync_evictions, 1);
        kvt_debug("%s: a store of %u bytes did not fit under the shared cap: evicted %llu bytes "
                  "now",
                  l2->name, stored, (unsigned long long)freed);
        return true;
    }
    pthread_mutex_lock(&l2->lock);
    bool again = wait_evictions_locked(l2);
    pthread_mutex_unlock(&l2->lock);
    return again || !stuck;
}
