/*
 * LFU with dynamic aging, GreedyDual-Size-Frequency style:
 * "eviction_policy": "LFU".
 *
 * Each object has a priority H = L + F x C / S, where F is its use count
 * (stores and reads since it entered, capped at KVT_LFU_FCAP so that an old
 * favourite cannot stay forever), and L, the inflation value, is the
 * priority of the last object evicted. An object touched now starts from
 * today's L, so objects that were popular once age out as L rises past
 * them: LFU's frequency, with recency as the tie-breaker that grows. The
 * size term C / S of GDSF is 1 here: the cost of a KV chunk (the prefill it
 * saves) grows with its bytes, so cost per byte is the same for all.
 *
 * Priorities are integers and every present one lies in [L, L + FCAP]
 * (L never passes the minimum; a touch sets H <= L_now + FCAP), so they live
 * in a ring of 64 buckets, each an LRU list, with a bitmap of the non-empty
 * ones: insert, access, remove and finding the minimum are O(1).
 *
 * Prefix order: within a bucket, least recent first; the tiers insert and
 * touch a request's chunks tail first, so on a tie of priority the deeper
 * chunk goes first. A prefix lookup that hits chunk i hits every chunk
 * before it, so a head's F is never below its tail's.
 *
 * Per handle: two u32 links, the priority (8), the count (1): 17 bytes.
 *
 * Thread rules: none of its own; called under the tier's lock (policy.h).
 */
#include "common/util.h"
#include "policy/dlist.h"
#include "policy/policy.h"

#include <stdlib.h>
#include <string.h>

#define NIL KVT_DL_NIL
#define RING 64
_Static_assert(KVT_LFU_FCAP < RING, "priorities span FCAP + 1 buckets of the ring");

struct lfu {
    struct kvt_policy base;
    uint32_t *prev, *next;
    uint64_t *prio;
    uint8_t *freq; /* 0 = absent */
    struct kvt_dl b[RING];
    uint64_t nonempty; /* bit i: bucket i has objects */
    uint64_t L;        /* inflation: priority of the last eviction */
    uint32_t n;
};

static bool present(const struct lfu *f, uint32_t h)
{
    return h < f->base.nhandles && f->freq[h];
}

static void put(struct lfu *f, uint32_t h, uint64_t prio, bool tail)
{
    f->prio[h] = prio;
    struct kvt_dl *l = &f->b[prio % RING];
    if (tail)
        kvt_dl_push_tail(f->prev, f->next, l, h);
    else
        kvt_dl_push_head(f->prev, f->next, l, h);
    f->nonempty |= 1ull << (prio % RING);
}

static void take(struct lfu *f, uint32_t h)
{
    unsigned i = (unsigned)(f->prio[h] % RING);
    kvt_dl_unlink(f->prev, f->next, &f->b[i], h);
    if (!f->b[i].n)
        f->nonempty &= ~(1ull << i);
}

/* The lowest priority present (f->n > 0): the first non-empty bucket at or
 * after L's in ring order. */
static uint64_t min_prio(const struct lfu *f)
{
    unsigned s = (unsigned)(f->L % RING);
    uint64_t rot = s ? (f->nonempty >> s) | (f->nonempty << (RING - s)) : f->nonempty;
    return f->L + (uint64_t)__builtin_ctzll(rot);
}

static void lfu_insert(struct kvt_policy *p, uint32_t h, bool cold,
                       const struct kvt_policy_hint *hint)
{
    (void)hint;
    struct lfu *f = (struct lfu *)p;
    kvt_policy_reserve(p, h + 1);
    if (present(f, h)) {
        take(f, h);
        f->n--;
    }
    f->freq[h] = 1;
    f->n++;
    if (cold) /* recovered: at the lowest priority, below what is there */
        put(f, h, f->L, true);
    else
        put(f, h, f->L + 1, false);
}

static void lfu_access(struct kvt_policy *p, uint32_t h)
{
    struct lfu *f = (struct lfu *)p;
    if (!present(f, h))
        return;
    take(f, h);
    if (f->freq[h] < KVT_LFU_FCAP)
        f->freq[h]++;
    put(f, h, f->L + f->freq[h], false);
}

static void lfu_remove(struct kvt_policy *p, uint32_t h)
{
    struct lfu *f = (struct lfu *)p;
    if (!present(f, h))
        return;
    uint64_t pr = f->prio[h];
    if (pr == min_prio(f))
        f->L = pr; /* an eviction (or a delete at the minimum): age everyone */
    take(f, h);
    f->freq[h] = 0;
    f->n--;
}

static void lfu_walk(struct kvt_policy *p, bool (*visit)(uint32_t, void *), void *arg)
{
    struct lfu *f = (struct lfu *)p;
    for (uint64_t pr = f->L; pr < f->L + RING; pr++)
        for (uint32_t h = f->b[pr % RING].tail; h != NIL;) {
            uint32_t prev = f->prev[h];
            if (!visit(h, arg))
                return;
            h = prev;
        }
}

static void lfu_reserve(struct kvt_policy *p, uint32_t n)
{
    struct lfu *f = (struct lfu *)p;
    if (n <= p->nhandles)
        return;
    uint32_t o = p->nhandles, ncap = o ? o : 1024;
    while (ncap < n)
        ncap *= 2;
    f->prev = kvt_xrealloc(f->prev, (size_t)ncap * sizeof(uint32_t));
    f->next = kvt_xrealloc(f->next, (size_t)ncap * sizeof(uint32_t));
    f->prio = kvt_xrealloc(f->prio, (size_t)ncap * sizeof(uint64_t));
    f->freq = kvt_xrealloc(f->freq, ncap);
    memset(f->freq + o, 0, ncap - o);
    p->nhandles = ncap;
}

static void lfu_destroy(struct kvt_policy *p)
{
    struct lfu *f = (struct lfu *)p;
    free(f->prev);
    free(f->next);
    free(f->prio);
    free(f->freq);
    free(f);
}

static const struct kvt_policy_ops lfu_ops = {
    .name = "LFU",
    .insert = lfu_insert,
    .access = lfu_access,
    .remove = lfu_remove,
    .walk = lfu_walk,
    .reserve = lfu_reserve,
    .destroy = lfu_destroy,
};

struct kvt_policy *kvt_lfu_create(void)
{
    struct lfu *f = kvt_xcalloc(1, sizeof(*f));
    f->base.ops = &lfu_ops;
    for (int i = 0; i < RING; i++)
        kvt_dl_init(&f->b[i]);
    return &f->base;
}

static struct kvt_policy *lfu_from_cfg(const struct kvt_policy_cfg *cfg)
{
    (void)cfg;
    return kvt_lfu_create();
}

const struct kvt_policy_desc kvt_policy_lfu = {
    .name = "LFU",
    .help = "least frequently used, with aging",
    .flags = KVT_POLICY_CACHE_ENV,
    .create = lfu_from_cfg,
};

/* For tests: the priority of a handle (0 when absent) and the inflation L. */
uint64_t kvt_lfu_priority(const struct kvt_policy *p, uint32_t h, uint64_t *inflation)
{
    const struct lfu *f = (const struct lfu *)p;
    if (p->ops != &lfu_ops)
        return 0;
    *inflation = f->L;
    return present(f, h) ? f->prio[h] : 0;
}
