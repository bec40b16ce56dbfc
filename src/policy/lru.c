/*
 * LRU over handles: an intrusive doubly linked list in two u32 arrays.
 * head = most recent, tail = least recent. NIL marks "not linked".
 * 8 bytes per handle plus one bit of membership.
 */
#include "policy/policy.h"
#include "common/util.h"

#include <stdlib.h>
#include <string.h>

#define NIL UINT32_MAX

struct lru {
    struct kvt_policy base;
    uint32_t *prev, *next;
    uint64_t *linked; /* bitmap */
    uint32_t head, tail;
    uint32_t count;
};

static void unlink_h(struct lru *l, uint32_t h)
{
    uint32_t p = l->prev[h], n = l->next[h];
    if (p != NIL)
        l->next[p] = n;
    else
        l->head = n;
    if (n != NIL)
        l->prev[n] = p;
    else
        l->tail = p;
    l->linked[h / 64] &= ~(1ull << (h % 64));
    l->count--;
}

static void push_head(struct lru *l, uint32_t h)
{
    l->prev[h] = NIL;
    l->next[h] = l->head;
    if (l->head != NIL)
        l->prev[l->head] = h;
    l->head = h;
    if (l->tail == NIL)
        l->tail = h;
    l->linked[h / 64] |= 1ull << (h % 64);
    l->count++;
}

static void push_tail(struct lru *l, uint32_t h)
{
    l->next[h] = NIL;
    l->prev[h] = l->tail;
    if (l->tail != NIL)
        l->next[l->tail] = h;
    l->tail = h;
    if (l->head == NIL)
        l->head = h;
    l->linked[h / 64] |= 1ull << (h % 64);
    l->count++;
}

static bool is_linked(struct lru *l, uint32_t h)
{
    return h < l->base.nhandles && kvt_bm_test(l->linked, h);
}

static void lru_insert(struct kvt_policy *p, uint32_t h, bool cold,
                       const struct kvt_policy_hint *hint)
{
    (void)hint;
    struct lru *l = (struct lru *)p;
    kvt_policy_reserve(p, h + 1);
    if (is_linked(l, h))
        unlink_h(l, h);
    if (cold)
        push_tail(l, h);
    else
        push_head(l, h);
}

static void lru_access(struct kvt_policy *p, uint32_t h)
{
    struct lru *l = (struct lru *)p;
    if (!is_linked(l, h))
        return;
    unlink_h(l, h);
    push_head(l, h);
}

static void lru_remove(struct kvt_policy *p, uint32_t h)
{
    struct lru *l = (struct lru *)p;
    if (is_linked(l, h))
        unlink_h(l, h);
}

static void lru_walk(struct kvt_policy *p, bool (*visit)(uint32_t, void *), void *arg)
{
    struct lru *l = (struct lru *)p;
    for (uint32_t h = l->tail; h != NIL;) {
        uint32_t prev = l->prev[h]; /* visit may not unlink h, but read first anyway */
        if (!visit(h, arg))
            return;
        h = prev;
    }
}

static void lru_reserve(struct kvt_policy *p, uint32_t n)
{
    struct lru *l = (struct lru *)p;
    if (n <= p->nhandles)
        return;
    uint32_t ncap = p->nhandles ? p->nhandles : 1024;
    while (ncap < n)
        ncap *= 2;
    l->prev = kvt_xrealloc(l->prev, (size_t)ncap * sizeof(uint32_t));
    l->next = kvt_xrealloc(l->next, (size_t)ncap * sizeof(uint32_t));
    size_t ow = kvt_bm_words(p->nhandles), nw = kvt_bm_words(ncap);
    l->linked = kvt_xrealloc(l->linked, nw * sizeof(uint64_t));
    memset(l->linked + ow, 0, (nw - ow) * sizeof(uint64_t));
    p->nhandles = ncap;
}

static void lru_destroy(struct kvt_policy *p)
{
    struct lru *l = (struct lru *)p;
    free(l->prev);
    free(l->next);
    free(l->linked);
    free(l);
}

static const struct kvt_policy_ops lru_ops = {
    .name = "LRU",
    .insert = lru_insert,
    .access = lru_access,
    .remove = lru_remove,
    .walk = lru_walk,
    .reserve = lru_reserve,
    .destroy = lru_destroy,
};

struct kvt_policy *kvt_lru_create(void)
{
    struct lru *l = kvt_xcalloc(1, sizeof(*l));
    l->base.ops = &lru_ops;
    l->head = l->tail = NIL;
    return &l->base;
}

static struct kvt_policy *lru_from_cfg(const struct kvt_policy_cfg *cfg)
{
    (void)cfg;
    return kvt_lru_create();
}

const struct kvt_policy_desc kvt_policy_lru = {
    .name = "LRU",
    .help = "least recently used first (LMCache's)",
    .flags = KVT_POLICY_CACHE_ENV,
    .create = lru_from_cfg,
};
