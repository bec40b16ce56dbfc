/*
 * ARC (Megiddo & Modha, FAST '03) over handles: "eviction_policy": "ARC".
 *
 * T1 holds objects seen once since they entered, T2 objects used again; B1
 * and B2 are ghosts: the identities (64-bit key fingerprints from the hint)
 * of objects recently evicted from T1 and T2. A new object whose ghost is in
 * B1 means T1 was too small: the target size p of T1 grows; a ghost in B2
 * shrinks it. The victim comes from T1's tail while |T1| > p, else from
 * T2's tail. So the policy moves between LRU (p = c) and a frequency-biased
 * split on its own, without a parameter.
 *
 * Units are objects: c, the capacity, is the most objects the tier has held
 * at once (the tier, not the policy, knows its byte budget; with chunks of
 * one size that is the budget in objects). Ghosts are bounded as in the
 * paper: |T1| + |B1| <= c and |T1| + |T2| + |B1| + |B2| <= 2c.
 *
 * Prefix order: each list is an LRU list and the tiers insert and touch a
 * request's chunks tail first, so within a list a chunk never goes before
 * the chunks after it in its request. Across the lists it can (a head in T2
 * beside its tail in T1, evicted when p favours T1); the orphaned tail is
 * in T1 then and goes soon after.
 *
 * Removal is eviction or deletion alike (the vtable has one remove): both
 * leave a ghost, which at worst adapts p once for a key deleted on purpose.
 *
 * Per handle: two u32 links, the fingerprint (8), the list (1): 17 bytes;
 * per ghost 17 bytes plus its map slot. Everything O(1).
 *
 * Thread rules: none of its own; called under the tier's lock (policy.h).
 */
#include "common/u32map.h"
#include "common/util.h"
#include "policy/dlist.h"
#include "policy/policy.h"

#include <stdlib.h>
#include <string.h>

#define NIL KVT_DL_NIL

enum { NONE = 0, IN_T1, IN_T2, IN_B1, IN_B2 };

struct arc {
    struct kvt_policy base;
    /* resident objects, by handle */
    uint32_t *prev, *next;
    uint64_t *fp;
    uint8_t *where;
    struct kvt_dl t1, t2;
    /* ghosts, by ghost id; gmap: low 32 bits of the fingerprint -> id */
    uint32_t *gprev, *gnext;
    uint64_t *gfp;
    uint8_t *gwhere;
    uint32_t gcap, gused, gfree; /* gfree: free ids chained through gnext */
    struct kvt_dl b1, b2;
    struct kvt_u32map gmap;
    double p;   /* target size of T1, objects */
    uint32_t c; /* capacity, objects: the most ever resident */
};

static bool resident(const struct arc *a, uint32_t h)
{
    return h < a->base.nhandles && (a->where[h] == IN_T1 || a->where[h] == IN_T2);
}

static struct kvt_dl *list_of(struct arc *a, uint8_t w)
{
    return w == IN_T1 ? &a->t1 : w == IN_T2 ? &a->t2 : w == IN_B1 ? &a->b1 : &a->b2;
}

static void ghost_drop(struct arc *a, uint32_t g)
{
    kvt_dl_unlink(a->gprev, a->gnext, list_of(a, a->gwhere[g]), g);
    kvt_u32map_del(&a->gmap, (uint32_t)a->gfp[g]);
    a->gwhere[g] = NONE;
    a->gnext[g] = a->gfree;
    a->gfree = g;
}

/* The ghost of fingerprint fp, or NIL. */
static uint32_t ghost_find(struct arc *a, uint64_t fp)
{
    uint32_t g;
    if (!fp || !kvt_u32map_get(&a->gmap, (uint32_t)fp, &g) || a->gfp[g] != fp)
        return NIL;
    return g;
}

static void trim_ghosts(struct arc *a)
{
    while (a->b1.n && a->t1.n + a->b1.n > a->c)
        ghost_drop(a, a->b1.tail);
    while (a->b1.n + a->b2.n && a->t1.n + a->t2.n + a->b1.n + a->b2.n > 2ull * a->c)
        ghost_drop(a, a->b2.n ? a->b2.tail : a->b1.tail);
}

static void ghost_add(struct arc *a, uint64_t fp, uint8_t w)
{
    if (!fp)
        return;
    uint32_t g = ghost_find(a, fp);
    if (g == NIL && kvt_u32map_get(&a->gmap, (uint32_t)fp, &g))
        ghost_drop(a, g); /* another key with the same low bits: the newer wins */
    else if (g != NIL)
        ghost_drop(a, g);
    if (a->gfree != NIL) {
        g = a->gfree;
        a->gfree = a->gnext[g];
    } else {
        if (a->gused == a->gcap) {
            a->gcap = a->gcap ? a->gcap * 2 : 1024;
            a->gprev = kvt_xrealloc(a->gprev, a->gcap * sizeof(uint32_t));
            a->gnext = kvt_xrealloc(a->gnext, a->gcap * sizeof(uint32_t));
            a->gfp = kvt_xrealloc(a->gfp, a->gcap * sizeof(uint64_t));
            a->gwhere = kvt_xrealloc(a->gwhere, a->gcap);
        }
        g = a->gused++;
    }
    a->gfp[g] = fp;
    a->gwhere[g] = w;
    kvt_dl_push_head(a->gprev, a->gnext, list_of(a, w), g);
    kvt_u32map_put(&a->gmap, (uint32_t)fp, g);
}

static void unlink_res(struct arc *a, uint32_t h)
{
    kvt_dl_unlink(a->prev, a->next, list_of(a, a->where[h]), h);
    a->where[h] = NONE;
}

static void arc_insert(struct kvt_policy *p, uint32_t h, bool cold,
                       const struct kvt_policy_hint *hint)
{
    struct arc *a = (struct arc *)p;
    kvt_policy_reserve(p, h + 1);
    if (resident(a, h))
        unlink_res(a, h);
    uint64_t fp = hint ? hint->fp : 0;
    a->fp[h] = fp;
    a->c = KVT_MAX(a->c, a->t1.n + a->t2.n + 1);
    uint32_t g = cold ? NIL : ghost_find(a, fp);
    if (g != NIL) {
        /* a miss that a bigger T1 (ghost in B1) or T2 (B2) would have hit */
        double b1 = a->b1.n, b2 = a->b2.n;
        if (a->gwhere[g] == IN_B1)
            a->p = KVT_MIN((double)a->c, a->p + KVT_MAX(1.0, b2 / b1));
        else
            a->p = KVT_MAX(0.0, a->p - KVT_MAX(1.0, b1 / b2));
        ghost_drop(a, g);
        a->where[h] = IN_T2;
        kvt_dl_push_head(a->prev, a->next, &a->t2, h);
    } else {
        a->where[h] = IN_T1;
        if (cold) /* recovered: below everything, like LRU's cold end */
            kvt_dl_push_tail(a->prev, a->next, &a->t1, h);
        else
            kvt_dl_push_head(a->prev, a->next, &a->t1, h);
    }
    trim_ghosts(a);
}

static void arc_access(struct kvt_policy *p, uint32_t h)
{
    struct arc *a = (struct arc *)p;
    if (!resident(a, h))
        return;
    unlink_res(a, h);
    a->where[h] = IN_T2;
    kvt_dl_push_head(a->prev, a->next, &a->t2, h);
}

static void arc_remove(struct kvt_policy *p, uint32_t h)
{
    struct arc *a = (struct arc *)p;
    if (!resident(a, h))
        return;
    uint8_t w = a->where[h];
    unlink_res(a, h);
    ghost_add(a, a->fp[h], w == IN_T1 ? IN_B1 : IN_B2);
    trim_ghosts(a);
}

/* The order ARC's REPLACE would evict in if nothing else happened: from
 * T1's tail while T1 (less what was already visited) is over p, else from
 * T2's tail; whichever list runs out, the other goes on. */
static void arc_walk(struct kvt_policy *p, bool (*visit)(uint32_t, void *), void *arg)
{
    struct arc *a = (struct arc *)p;
    uint32_t c1 = a->t1.tail, c2 = a->t2.tail, n1 = a->t1.n;
    while (c1 != NIL || c2 != NIL) {
        uint32_t h;
        if (c1 != NIL && ((double)n1 > a->p || c2 == NIL)) {
            h = c1;
            c1 = a->prev[c1];
            n1--;
        } else {
            h = c2;
            c2 = a->prev[c2];
        }
        if (!visit(h, arg))
            return;
    }
}

static void arc_reserve(struct kvt_policy *p, uint32_t n)
{
    struct arc *a = (struct arc *)p;
    if (n <= p->nhandles)
        return;
    uint32_t o = p->nhandles, ncap = o ? o : 1024;
    while (ncap < n)
        ncap *= 2;
    a->prev = kvt_xrealloc(a->prev, (size_t)ncap * sizeof(uint32_t));
    a->next = kvt_xrealloc(a->next, (size_t)ncap * sizeof(uint32_t));
    a->fp = kvt_xrealloc(a->fp, (size_t)ncap * sizeof(uint64_t));
    a->where = kvt_xrealloc(a->where, ncap);
    memset(a->where + o, NONE, ncap - o);
    p->nhandles = ncap;
}

static void arc_destroy(struct kvt_policy *p)
{
    struct arc *a = (struct arc *)p;
    free(a->prev);
    free(a->next);
    free(a->fp);
    free(a->where);
    free(a->gprev);
    free(a->gnext);
    free(a->gfp);
    free(a->gwhere);
    kvt_u32map_free(&a->gmap);
    free(a);
}

static const struct kvt_policy_ops arc_ops = {
    .name = "ARC",
    .insert = arc_insert,
    .access = arc_access,
    .remove = arc_remove,
    .walk = arc_walk,
    .reserve = arc_reserve,
    .destroy = arc_destroy,
};

struct kvt_policy *kvt_arc_create(void)
{
    struct arc *a = kvt_xcalloc(1, sizeof(*a));
    a->base.ops = &arc_ops;
    kvt_dl_init(&a->t1);
    kvt_dl_init(&a->t2);
    kvt_dl_init(&a->b1);
    kvt_dl_init(&a->b2);
    a->gfree = NIL;
    kvt_u32map_init(&a->gmap);
    return &a->base;
}

static struct kvt_policy *arc_from_cfg(const struct kvt_policy_cfg *cfg)
{
    (void)cfg;
    return kvt_arc_create();
}

const struct kvt_policy_desc kvt_policy_arc = {
    .name = "ARC",
    .help = "recency and frequency, with ghosts",
    .flags = KVT_POLICY_CACHE_ENV,
    .create = arc_from_cfg,
};

/* For tests: the target size of T1 and the four list lengths. */
void kvt_arc_state(const struct kvt_policy *p, double *target, uint32_t n[4])
{
    const struct arc *a = (const struct arc *)p;
    *target = p->ops == &arc_ops ? a->p : 0;
    if (p->ops != &arc_ops) {
        memset(n, 0, 4 * sizeof(uint32_t));
        return;
    }
    n[0] = a->t1.n;
    n[1] = a->t2.n;
    n[2] = a->b1.n;
    n[3] = a->b2.n;
}
