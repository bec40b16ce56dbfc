/*
 * L1 object table: reserve (allocating, growing the pool or evicting as
 * needed), publish (the first publisher of a key wins), references and
 * lookups, deletes, eviction batches in policy order, and the quarantine of
 * memory a lease's holder may still touch.
 */
#include "l1/l1.h"
#include "l1/l1_int.h"
#include "common/log.h"
#include "common/util.h"
#include "policy/policy.h"
#include "key/kindex.h"
#include "kvtier/error.h"
#include "l1/palloc.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/memfd.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

static uint32_t obj_new_locked(struct kvt_l1 *l1)
{
    uint32_t h;
    if (l1->free_obj != NIL) {
        h = l1->free_obj;
        l1->free_obj = l1->objs[h].next_free;
    } else {
        if (l1->hwm == l1->cap_objs) {
            l1->cap_objs = l1->cap_objs ? l1->cap_objs * 2 : 1024;
            l1->objs = kvt_xrealloc(l1->objs, (size_t)l1->cap_objs * sizeof(struct l1_obj));
            l1->map.base = (const char *)l1->objs;
            kvt_policy_reserve(l1->policy, l1->cap_objs);
        }
        h = l1->hwm++;
    }
    memset(&l1->objs[h], 0, sizeof(struct l1_obj));
    return h;
}

static void quarantine_push_locked(struct kvt_l1 *l1, uint32_t page, uint32_t npages)
{
    if (l1->q_tail - l1->q_head == l1->q_cap) {
        uint32_t ncap = l1->q_cap ? l1->q_cap * 2 : 64;
        struct quarantined *nq = kvt_xmalloc(ncap * sizeof(*nq));
        for (uint32_t i = l1->q_head; i != l1->q_tail; i++)
            nq[i - l1->q_head] = l1->q[i % l1->q_cap];
        free(l1->q);
        l1->q = nq;
        l1->q_tail -= l1->q_head;
        l1->q_head = 0;
        l1->q_cap = ncap;
    }
    uint64_t ttl = KVT_MAX(l1->ttl_ns[0], l1->ttl_ns[1]);
    l1->q[l1->q_tail++ % l1->q_cap] = (struct quarantined){page, npages, kvt_now_ns() + ttl};
    l1->q_pages += npages;
    l1->c.quarantined_bytes += (uint64_t)npages * l1->align;
}

void kvt_l1_quarantine_release_locked(struct kvt_l1 *l1, uint64_t now)
{
    while (l1->q_head != l1->q_tail) {
        struct quarantined *q = &l1->q[l1->q_head % l1->q_cap];
        if (q->until_ns > now)
            break;
        kvt_palloc_free(&l1->pa, q->page, q->npages);
        l1->q_pages -= q->npages;
        l1->q_head++;
    }
}

/* Return an unreferenced object's memory and slot. */
static void obj_free_locked(struct kvt_l1 *l1, uint32_t h)
{
    struct l1_obj *o = obj(l1, h);
    KVT_ASSERT(o->refs == 0);
    uint32_t page = (uint32_t)(o->off / l1->align);
    if (o->flags & F_QUARANTINE)
        quarantine_push_locked(l1, page, o->npages);
    else
        kvt_palloc_free(&l1->pa, page, o->npages);
    obj_set_state(o, FROM(ST_DEAD), ST_FREE);
    o->next_free = l1->free_obj;
    l1->free_obj = h;
}

/* Take an object out of the table (it becomes DEAD or is freed now). */
void kvt_l1_obj_unlink_locked(struct kvt_l1 *l1, uint32_t h)
{
    struct l1_obj *o = obj(l1, h);
    if (o->state != ST_WRITING && o->state != ST_READY)
        return;
    if (o->state == ST_READY)
        l1->nready--;
    else
        l1->nwriting--;
    if (!(o->flags & F_UNMAPPED))
        kvt_kindex_del(&l1->map, h);
    if (o->flags & F_TRACKED) {
        kvt_policy_remove(l1->policy, h);
        o->flags &= (uint8_t)~F_TRACKED;
    }
    if (o->flags & F_ANNOUNCED) {
        l1->ev.fn(l1->ev.arg, l1->ev.tier, KVT_TIER_REMOVED, &o->key);
        o->flags &= (uint8_t)~F_ANNOUNCED;
    }
    obj_set_state(o, FROM(ST_WRITING) | FROM(ST_READY), ST_DEAD);
    if (o->refs == 0)
        obj_free_locked(l1, h);
}

void kvt_l1_obj_put_locked(struct kvt_l1 *l1, uint32_t h)
{
    struct l1_obj *o = obj(l1, h);
    KVT_ASSERT(o->refs > 0);
    if (--o->refs)
        return;
    if (o->state == ST_DEAD)
        obj_free_locked(l1, h);
    else if (o->state == ST_READY && (o->flags & F_TEMP))
        kvt_l1_obj_unlink_locked(l1, h);
}

struct victims {
    struct kvt_l1 *l1;
    uint32_t hs[64];
    uint32_t n;
    uint64_t want, pages; /* pages wanted, pages the victims hold */
};

static bool pick_victim(uint32_t h, void *arg)
{
    struct victims *v = arg;
    struct l1_obj *o = obj(v->l1, h);
    if (o->state == ST_READY && o->refs == 0) {
        v->hs[v->n++] = h;
        v->pages += o->npages;
    }
    return v->n < KVT_ARRAY_LEN(v->hs) && v->pages < v->want; /* stop once enough */
}

/* Evict unreferenced objects in policy order until want_pages are freed (at
 * most 64 per call); returns pages freed. */
uint64_t kvt_l1_evict_batch_locked(struct kvt_l1 *l1, uint64_t want_pages)
{
    struct victims v = {.l1 = l1, .want = want_pages};
    l1->policy->ops->walk(l1->policy, pick_victim, &v);
    uint64_t freed = 0;
    for (uint32_t i = 0; i < v.n && freed < want_pages; i++) {
        struct l1_obj *o = obj(l1, v.hs[i]);
        freed += o->npages;
        l1->c.evictions++;
        l1->c.evicted_bytes += o->meta.len;
        kvt_l1_obj_unlink_locked(l1, v.hs[i]);
    }
    return freed;
}

static int reserve(struct kvt_l1 *l1, const kvt_key *k, const kvt_objmeta *meta,
                   struct kvt_l1_ref *out, bool beside)
{
    uint64_t pages = KVT_MAX(1, KVT_ALIGN_UP((uint64_t)meta->len, l1->align) / l1->align);
    if ((uint64_t)meta->len > KVT_MAX_OBJECT || pages * l1->align > l1->map_size)
        return KVT_E_TOOBIG;
    pthread_mutex_lock(&l1->lock);
    uint32_t have = kvt_kindex_find(&l1->map, k);
    if (have != KVT_NOHANDLE && (obj(l1, have)->state == ST_READY || !beside)) {
        /* stored again: the engine is using this prefix, as good as a read */
        if (obj(l1, have)->flags & F_TRACKED)
            kvt_policy_access(l1->policy, have);
        pthread_mutex_unlock(&l1->lock);
        return -EEXIST;
    }
    /* being written by another (not yet published): this writer gets its
     * own object too, and the first to publish wins (kvt_l1_obj_publish_locked); told
     * "present" instead, it would count a key its first writer may still
     * give up */
    uint32_t page;
    int rc;
    for (;;) {
        rc = kvt_palloc_alloc(&l1->pa, (uint32_t)pages, &page);
        if (rc == 0)
            break;
        if (kvt_l1_pool_grow_locked(l1))
            continue;
        kvt_l1_quarantine_release_locked(l1, kvt_now_ns());
        if (kvt_palloc_alloc(&l1->pa, (uint32_t)pages, &page) == 0) {
            rc = 0;
            break;
        }
        /* only what this object needs (more when fragmentation leaves the
         * freed pages unusable: the loop comes back), not a whole batch */
        if (kvt_l1_evict_batch_locked(l1, pages) == 0)
            break; /* nothing evictable left */
    }
    if (rc) {
        l1->c.store_full++;
        pthread_mutex_unlock(&l1->lock);
        return KVT_E_FULL;
    }
    uint32_t h = obj_new_locked(l1);
    struct l1_obj *o = obj(l1, h);
    o->key = *k;
    o->off = (uint64_t)page * l1->align;
    o->npages = (uint32_t)pages;
    o->meta = *meta;
    o->refs = 1;
    obj_set_state(o, FROM(ST_FREE), ST_WRITING);
    if (have == KVT_NOHANDLE)
        kvt_kindex_put(&l1->map, h);
    else
        o->flags |= F_UNMAPPED;
    l1->nwriting++;
    out->h = h;
    out->off = o->off;
    out->ptr = l1->base + o->off;
    out->meta = o->meta;
    bool pressure =
        (double)kvt_l1_used_pages_locked(l1) * l1->align >= l1->watermark * (double)l1->size_bytes;
    pthread_mutex_unlock(&l1->lock);
    if (pressure && l1->pressure_fn)
        l1->pressure_fn(l1->pressure_arg);
    return 0;
}

/* WRITING h (position pos of a commit of n) becomes READY under its key.
 * The first publisher wins: an object reserved while another writer held
 * the key (F_UNMAPPED) takes it over if that writer has not published (the
 * other becomes unmapped in turn, and loses at its own publish), and is
 * dropped if it has. false: dropped (the key is held, by the other). */
bool kvt_l1_obj_publish_locked(struct kvt_l1 *l1, uint32_t h, uint32_t pos, uint32_t n, bool temp)
{
    struct l1_obj *o = obj(l1, h);
    if (o->flags & F_UNMAPPED) {
        uint32_t m = kvt_kindex_find(&l1->map, &o->key);
        if (m != KVT_NOHANDLE && obj(l1, m)->state == ST_READY) {
            kvt_l1_obj_unlink_locked(l1, h);
            l1->c.stores_raced++;
            return false;
        }
        if (m != KVT_NOHANDLE) {
            kvt_kindex_del(&l1->map, m);
            obj(l1, m)->flags |= F_UNMAPPED;
        }
        o->flags &= (uint8_t)~F_UNMAPPED;
        kvt_kindex_put(&l1->map, h);
    }
    obj_set_state(o, FROM(ST_WRITING), ST_READY);
    l1->nwriting--;
    l1->nready++;
    l1->c.stores++;
    if (temp) {
        o->flags |= F_TEMP;
    } else {
        struct kvt_policy_hint hint = {
            .prefix_pos = pos, .prefix_len = n, .bytes = o->meta.len, .fp = kvt_key_hash(&o->key)};
        kvt_policy_insert(l1->policy, h, false, &hint);
        o->flags |= F_TRACKED;
    }
    return true;
}

void kvt_l1_obj_announce_locked(struct kvt_l1 *l1, uint32_t h)
{
    struct l1_obj *o = obj(l1, h);
    /* a temporary object serves one reader: not announced */
    if (l1->ev.fn && o->state == ST_READY && !(o->flags & (F_TEMP | F_ANNOUNCED))) {
        l1->ev.fn(l1->ev.arg, l1->ev.tier, KVT_TIER_STORED, &o->key);
        o->flags |= F_ANNOUNCED;
    }
}

int kvt_l1_reserve(struct kvt_l1 *l1, const kvt_key *k, const kvt_objmeta *meta,
                   struct kvt_l1_ref *out)
{
    return reserve(l1, k, meta, out, true);
}

int kvt_l1_reserve_free(struct kvt_l1 *l1, const kvt_key *k, const kvt_objmeta *meta,
                        struct kvt_l1_ref *out)
{
    return reserve(l1, k, meta, out, false);
}

void kvt_l1_commit(struct kvt_l1 *l1, const uint32_t *hs, uint32_t n, unsigned flags)
{
    pthread_mutex_lock(&l1->lock);
    for (uint32_t i = n; i-- > 0;)
        if (obj(l1, hs[i])->state == ST_WRITING)
            kvt_l1_obj_publish_locked(l1, hs[i], i, n, (flags & KVT_L1_TEMP) != 0);
    for (uint32_t i = 0; i < n; i++) /* in request order: a chain's blocks in order */
        kvt_l1_obj_announce_locked(l1, hs[i]);
    pthread_mutex_unlock(&l1->lock);
}

bool kvt_l1_winner(struct kvt_l1 *l1, struct kvt_l1_ref *r)
{
    pthread_mutex_lock(&l1->lock);
    struct l1_obj *o = obj(l1, r->h);
    bool ok = o->state == ST_READY;
    if (!ok) { /* dropped at its publish: the key's READY object won */
        uint32_t m = kvt_kindex_find(&l1->map, &o->key);
        ok = m != KVT_NOHANDLE && obj(l1, m)->state == ST_READY;
        if (ok) {
            uint32_t old = r->h;
            obj(l1, m)->refs++;
            kvt_l1_obj_fill_ref(l1, m, r);
            kvt_l1_obj_put_locked(l1, old);
        }
    }
    pthread_mutex_unlock(&l1->lock);
    return ok;
}

void kvt_l1_set_meta(struct kvt_l1 *l1, uint32_t h, const kvt_objmeta *meta)
{
    pthread_mutex_lock(&l1->lock);
    struct l1_obj *o = obj(l1, h);
    if (o->state == ST_WRITING && meta->len == o->meta.len)
        o->meta = *meta;
    pthread_mutex_unlock(&l1->lock);
}

void kvt_l1_abort(struct kvt_l1 *l1, uint32_t h)
{
    pthread_mutex_lock(&l1->lock);
    if (obj(l1, h)->state == ST_WRITING)
        kvt_l1_obj_unlink_locked(l1, h);
    pthread_mutex_unlock(&l1->lock);
}

void kvt_l1_obj_fill_ref(struct kvt_l1 *l1, uint32_t h, struct kvt_l1_ref *r)
{
    struct l1_obj *o = obj(l1, h);
    r->h = h;
    r->off = o->off;
    r->ptr = l1->base + o->off;
    r->meta = o->meta;
}

int kvt_l1_get(struct kvt_l1 *l1, const kvt_key *k, struct kvt_l1_ref *out)
{
    pthread_mutex_lock(&l1->lock);
    uint32_t h = kvt_kindex_find(&l1->map, k);
    if (h == KVT_NOHANDLE || obj(l1, h)->state != ST_READY) {
        l1->c.misses++;
        pthread_mutex_unlock(&l1->lock);
        return -ENOENT;
    }
    l1->c.hits++;
    obj(l1, h)->refs++;
    kvt_l1_obj_fill_ref(l1, h, out);
    pthread_mutex_unlock(&l1->lock);
    return 0;
}

void kvt_l1_describe(struct kvt_l1 *l1, uint32_t h, struct kvt_l1_ref *r, kvt_key *key)
{
    pthread_mutex_lock(&l1->lock);
    kvt_l1_obj_fill_ref(l1, h, r);
    if (key)
        *key = obj(l1, h)->key;
    pthread_mutex_unlock(&l1->lock);
}

int kvt_l1_get_handle(struct kvt_l1 *l1, uint32_t h, const kvt_key *key, struct kvt_l1_ref *out)
{
    int rc = -ENOENT;
    pthread_mutex_lock(&l1->lock);
    if (h < l1->hwm && obj(l1, h)->state == ST_READY && kvt_key_eq(&obj(l1, h)->key, key)) {
        obj(l1, h)->refs++;
        kvt_l1_obj_fill_ref(l1, h, out);
        rc = 0;
    }
    pthread_mutex_unlock(&l1->lock);
    return rc;
}

void kvt_l1_ref(struct kvt_l1 *l1, uint32_t h)
{
    pthread_mutex_lock(&l1->lock);
    obj(l1, h)->refs++;
    pthread_mutex_unlock(&l1->lock);
}

void kvt_l1_put(struct kvt_l1 *l1, uint32_t h)
{
    pthread_mutex_lock(&l1->lock);
    kvt_l1_obj_put_locked(l1, h);
    pthread_mutex_unlock(&l1->lock);
}

uint32_t kvt_l1_get_prefix(struct kvt_l1 *l1, const kvt_key *keys, uint32_t n,
                           struct kvt_l1_ref *refs)
{
    pthread_mutex_lock(&l1->lock);
    uint32_t i;
    for (i = 0; i < n; i++) {
        uint32_t h = kvt_kindex_find(&l1->map, &keys[i]);
        if (h == KVT_NOHANDLE || obj(l1, h)->state != ST_READY)
            break;
        if (refs) {
            obj(l1, h)->refs++;
            kvt_l1_obj_fill_ref(l1, h, &refs[i]);
        }
    }
    l1->c.hits += i;
    l1->c.misses += n - i;
    pthread_mutex_unlock(&l1->lock);
    return i;
}

bool kvt_l1_contains(struct kvt_l1 *l1, const kvt_key *k)
{
    pthread_mutex_lock(&l1->lock);
    uint32_t h = kvt_kindex_find(&l1->map, k);
    bool r = h != KVT_NOHANDLE && obj(l1, h)->state == ST_READY;
    pthread_mutex_unlock(&l1->lock);
    return r;
}

void kvt_l1_note_request(struct kvt_l1 *l1, const kvt_key *keys, uint32_t n)
{
    if (!n || !l1->policy || !l1->policy->ops->request)
        return;
    uint64_t *fps = kvt_xmalloc(n * sizeof(uint64_t));
    for (uint32_t i = 0; i < n; i++)
        fps[i] = kvt_key_hash(&keys[i]);
    pthread_mutex_lock(&l1->lock);
    kvt_policy_request(l1->policy, fps, n);
    pthread_mutex_unlock(&l1->lock);
    free(fps);
}

void kvt_l1_touch(struct kvt_l1 *l1, const uint32_t *hs, uint32_t n)
{
    pthread_mutex_lock(&l1->lock);
    for (uint32_t i = n; i-- > 0;)
        if (obj(l1, hs[i])->flags & F_TRACKED)
            kvt_policy_access(l1->policy, hs[i]);
    pthread_mutex_unlock(&l1->lock);
}

void kvt_l1_drop(struct kvt_l1 *l1, uint32_t h)
{
    pthread_mutex_lock(&l1->lock);
    kvt_l1_obj_unlink_locked(l1, h);
    pthread_mutex_unlock(&l1->lock);
}

bool kvt_l1_delete(struct kvt_l1 *l1, const kvt_key *k)
{
    pthread_mutex_lock(&l1->lock);
    uint32_t h = kvt_kindex_find(&l1->map, k);
    bool found = h != KVT_NOHANDLE && obj(l1, h)->state == ST_READY;
    if (found)
        kvt_l1_obj_unlink_locked(l1, h);
    pthread_mutex_unlock(&l1->lock);
    return found;
}

int kvt_l1_delete_unleased(struct kvt_l1 *l1, const kvt_key *k)
{
    pthread_mutex_lock(&l1->lock);
    uint32_t h = kvt_kindex_find(&l1->map, k);
    int rc = 0;
    if (h != KVT_NOHANDLE && obj(l1, h)->state == ST_READY) {
        if (obj(l1, h)->rleases) {
            rc = -EBUSY;
        } else {
            kvt_l1_obj_unlink_locked(l1, h);
            rc = 1;
        }
    }
    pthread_mutex_unlock(&l1->lock);
    return rc;
}

void kvt_l1_set_event_hook(struct kvt_l1 *l1, const struct kvt_tier_hook *hook)
{
    pthread_mutex_lock(&l1->lock);
    KVT_ASSERT(l1->nready == 0 && l1->nwriting == 0);
    l1->ev = *hook;
    pthread_mutex_unlock(&l1->lock);
}

void kvt_l1_set_pressure_hook(struct kvt_l1 *l1, void (*fn)(void *), void *arg)
{
    l1->pressure_fn = fn;
    l1->pressure_arg = arg;
}
