/* L2 base: the end of a start-up scan (what it found, adopted in one go). */
#include "l2/base_int.h"
#include "l2/budget.h"
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

void kvt_l2_found_push(struct kvt_l2_found_vec *fv, const kvt_key *ck, uint32_t stored,
                       uint32_t len, uint32_t aux, uint8_t flags, int64_t mtime_ns)
{
    if (fv->n == fv->cap) {
        fv->cap = fv->cap ? fv->cap * 2 : 4096;
        fv->v = kvt_xrealloc(fv->v, fv->cap * sizeof(*fv->v));
    }
    fv->v[fv->n++] = (struct kvt_l2_found){
        .key = *ck, .mtime_ns = mtime_ns, .stored = stored, .len = len, .aux = aux, .flags = flags};
}

/* ------------------------------------------------ engine block hashes */

struct kvt_l2_early_tag {
    kvt_key key;
    struct kvt_blocktag *tag;
};

/* call with l2->lock held */
void kvt_l2b_give_tag_locked(kvt_l2 *l2, const kvt_key *ck, struct kvt_blocktag *tag)
{
    if (!tag)
        return;
    if (l2->ev.tag) {
        l2->ev.tag(l2->ev.arg, ck, tag);
        return;
    }
    if (!l2->keep_tags || l2->ev.fn) { /* no events, or a hook without tags */
        kvt_blocktag_put(tag);
        return;
    }
    if (l2->nearly == l2->early_cap) {
        l2->early_cap = l2->early_cap ? 2 * l2->early_cap : 256;
        l2->early = kvt_xrealloc(l2->early, l2->early_cap * sizeof(*l2->early));
    }
    l2->early[l2->nearly++] = (struct kvt_l2_early_tag){.key = *ck, .tag = tag};
}

void kvt_l2_give_tag(kvt_l2 *l2, const kvt_key *ck, struct kvt_blocktag *tag)
{
    pthread_mutex_lock(&l2->lock);
    kvt_l2b_give_tag_locked(l2, ck, tag);
    pthread_mutex_unlock(&l2->lock);
}

struct kvt_blocktag *kvt_l2_tag_of(kvt_l2 *l2, const kvt_key *ck)
{
    pthread_mutex_lock(&l2->lock);
    struct kvt_tier_hook ev = l2->ev;
    pthread_mutex_unlock(&l2->lock);
    /* the queue outlives the adapter (the core closes adapters first) */
    return ev.tag_of ? ev.tag_of(ev.arg, ck) : NULL;
}

void kvt_l2b_early_tags_flush_locked(kvt_l2 *l2)
{
    for (uint32_t i = 0; i < l2->nearly; i++) {
        if (l2->ev.tag)
            l2->ev.tag(l2->ev.arg, &l2->early[i].key, l2->early[i].tag);
        else
            kvt_blocktag_put(l2->early[i].tag);
    }
    free(l2->early);
    l2->early = NULL;
    l2->nearly = l2->early_cap = 0;
}

void kvt_l2b_early_tags_free(kvt_l2 *l2)
{
    for (uint32_t i = 0; i < l2->nearly; i++)
        kvt_blocktag_put(l2->early[i].tag);
    free(l2->early);
    l2->early = NULL;
    l2->nearly = l2->early_cap = 0;
}

struct mt_idx {
    int64_t mtime_ns;
    size_t i;
};

static int by_mtime_desc(const void *a, const void *b)
{
    const struct mt_idx *x = a, *y = b;
    return (x->mtime_ns < y->mtime_ns) - (x->mtime_ns > y->mtime_ns);
}

/* call with l2->lock held: room for `extra` more entries without regrowing */
static void index_reserve_locked(kvt_l2 *l2, size_t extra)
{
    struct kvt_l2_index *x = &l2->idx;
    uint64_t want = (uint64_t)x->nobjs + extra;
    if (want >= UINT32_MAX / 2)
        return;
    if (want > x->cap_objs) {
        uint32_t ncap = x->cap_objs ? x->cap_objs : 1024;
        while (ncap < want)
            ncap *= 2;
        x->objs = kvt_xrealloc(x->objs, (size_t)ncap * sizeof(*x->objs));
        x->map.base = (const char *)x->objs;
        x->cap_objs = ncap;
        kvt_policy_reserve(l2->policy, ncap);
    }
    kvt_kindex_reserve(&x->map, (uint32_t)want);
}

void kvt_l2_finish_recovery(kvt_l2 *l2, struct kvt_l2_found_vec *fv, uint64_t t0_ns,
                            const char *where)
{
    /* sort 16-byte (mtime, position) pairs, not the entries themselves */
    struct mt_idx *order = kvt_xmalloc((fv->n ? fv->n : 1) * sizeof(*order));
    for (size_t i = 0; i < fv->n; i++)
        order[i] = (struct mt_idx){fv->v[i].mtime_ns, i};
    qsort(order, fv->n, sizeof(*order), by_mtime_desc);
    uint64_t objs = 0, bytes = 0, walked = 0;
    for (size_t i = 0; i < fv->n; i++)
        walked += fv->v[i].stored; /* everything found, indexed meanwhile or not */
    pthread_mutex_lock(&l2->lock);
    index_reserve_locked(l2, fv->n);
    pthread_mutex_unlock(&l2->lock);
    /* in chunks, so lookups and stores are not held up behind one long lock */
    for (size_t base = 0; base < fv->n; base += 4096) {
        size_t end = KVT_MIN(fv->n, base + 4096);
        pthread_mutex_lock(&l2->lock);
        for (size_t k = base; k < end; k++) {
            const struct kvt_l2_found *f = &fv->v[order[k].i];
            if (idx_find(&l2->idx, &f->key) != NOHANDLE) {
                kvt_blocktag_put(f->tag);
                continue; /* found by a lookup meanwhile */
            }
            if (f->tag) /* the hashes it was written with name it */
                kvt_l2b_give_tag_locked(l2, &f->key, f->tag);
            uint32_t h = kvt_l2b_idx_insert(l2, &f->key);
            struct kvt_l2_obj *o = &l2->idx.objs[h];
            o->stored = f->stored;
            o->len = f->len;
            o->aux = f->aux;
            o->flags = f->flags;
            obj_set_state(o, FROM(KVT_OBJ_FREE), KVT_OBJ_READY);
            kvt_l2b_account_locked(l2, o, +1);
            obj_announce_locked(l2, o, KVT_TIER_STORED);
            if (l2->policy) {
                struct kvt_policy_hint hint = {
                    .prefix_pos = 0, .bytes = f->stored, .fp = kvt_key_hash(&f->key)};
                kvt_policy_insert(l2->policy, h, true, &hint);
                o->state |= ST_TRACKED;
            }
            objs++;
            bytes += f->stored;
        }
        pthread_mutex_unlock(&l2->lock);
    }
    free(order);
    free(fv->v);
    fv->v = NULL;
    fv->n = fv->cap = 0;
    if (fv->corrupt) {
        atomic_fetch_add(&l2->counters.corrupt, fv->corrupt);
        kvt_warn("%s: %llu object files under %s were shorter than an object header (emptied "
                 "or torn): counted as corrupt and removed",
                 l2->name, (unsigned long long)fv->corrupt, where);
    }
    double secs = kvt_l2_recovery_done(l2, objs, bytes, t0_ns);
    kvt_info("%s: recovered %llu objects, %llu bytes from %s in %.3f s", l2->name,
             (unsigned long long)objs, (unsigned long long)bytes, where, secs);
    /* the scan walked the whole tier: the shared record's start-up recount */
    kvt_l2_budget_recount_end(l2, walked, true);
}

double kvt_l2_recovery_done(kvt_l2 *l2, uint64_t objs, uint64_t bytes, uint64_t t0_ns)
{
    double secs = (double)(kvt_now_ns() - t0_ns) / 1e9;
    pthread_mutex_lock(&l2->lock);
    l2->recovered_objs = objs;
    l2->recovered_bytes = bytes;
    l2->recovery_seconds = secs;
    l2->recovering = false;
    pthread_mutex_unlock(&l2->lock);
    return secs;
}

void kvt_l2_set_recovering(kvt_l2 *l2, bool on)
{
    pthread_mutex_lock(&l2->lock);
    l2->recovering = on;
    pthread_mutex_unlock(&l2->lock);
}
