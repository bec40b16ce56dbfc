/*
 * Intrusive doubly linked lists over u32 handles, for the list-based
 * policies (ARC, LFU's buckets): the links live in two arrays owned by the
 * policy, a list is its head (most recent), tail (least recent) and length.
 * NIL ends a list. Private to src/policy.
 */
#ifndef KVT_EVICT_DLIST_H
#define KVT_EVICT_DLIST_H

#include <stdint.h>

#define KVT_DL_NIL UINT32_MAX

struct kvt_dl {
    uint32_t head, tail, n;
};

static inline void kvt_dl_init(struct kvt_dl *l)
{
    l->head = l->tail = KVT_DL_NIL;
    l->n = 0;
}

static inline void kvt_dl_unlink(uint32_t *prev, uint32_t *next, struct kvt_dl *l, uint32_t x)
{
    uint32_t p = prev[x], n = next[x];
    if (p != KVT_DL_NIL)
        next[p] = n;
    else
        l->head = n;
    if (n != KVT_DL_NIL)
        prev[n] = p;
    else
        l->tail = p;
    l->n--;
}

static inline void kvt_dl_push_head(uint32_t *prev, uint32_t *next, struct kvt_dl *l, uint32_t x)
{
    prev[x] = KVT_DL_NIL;
    next[x] = l->head;
    if (l->head != KVT_DL_NIL)
        prev[l->head] = x;
    l->head = x;
    if (l->tail == KVT_DL_NIL)
        l->tail = x;
    l->n++;
}

static inline void kvt_dl_push_tail(uint32_t *prev, uint32_t *next, struct kvt_dl *l, uint32_t x)
{
    next[x] = KVT_DL_NIL;
    prev[x] = l->tail;
    if (l->tail != KVT_DL_NIL)
        next[l->tail] = x;
    l->tail = x;
    if (l->head == KVT_DL_NIL)
        l->head = x;
    l->n++;
}

#endif
