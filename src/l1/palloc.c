#include "l1/palloc.h"
#include "common/log.h"
#include "common/util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define NIL UINT32_MAX

static int log2u(uint32_t n)
{
    return 31 - __builtin_clz(n);
}

/* Class of a run of n pages (n >= 1). */
static void mapping(uint32_t n, int *fl, int *sl)
{
    if (n < (1u << KVT_PA_SLB)) {
        *fl = 0;
        *sl = (int)n;
    } else {
        int l = log2u(n);
        *fl = l - KVT_PA_SLB + 1;
        *sl = (int)((n >> (l - KVT_PA_SLB)) - (1u << KVT_PA_SLB));
    }
}

void kvt_palloc_init(struct kvt_palloc *a)
{
    memset(a, 0, sizeof(*a));
    a->free_node = NIL;
    for (int f = 0; f < KVT_PA_FL; f++)
        for (int s = 0; s < (1 << KVT_PA_SLB); s++)
            a->heads[f][s] = NIL;
    kvt_u32map_init(&a->by_start);
    kvt_u32map_init(&a->by_last);
}

void kvt_palloc_destroy(struct kvt_palloc *a)
{
    free(a->runs);
    kvt_u32map_free(&a->by_start);
    kvt_u32map_free(&a->by_last);
}

static uint32_t node_new(struct kvt_palloc *a)
{
    if (a->free_node != NIL) {
        uint32_t id = a->free_node;
        a->free_node = a->runs[id].next;
        return id;
    }
    if (a->nruns == a->cap_runs) {
        a->cap_runs = a->cap_runs ? a->cap_runs * 2 : 64;
        a->runs = kvt_xrealloc(a->runs, a->cap_runs * sizeof(*a->runs));
    }
    return a->nruns++;
}

static void list_insert(struct kvt_palloc *a, uint32_t id)
{
    int fl, sl;
    mapping(a->runs[id].len, &fl, &sl);
    struct kvt_pa_run *r = &a->runs[id];
    r->prev = NIL;
    r->next = a->heads[fl][sl];
    if (r->next != NIL)
        a->runs[r->next].prev = id;
    a->heads[fl][sl] = id;
    a->fl_bits |= 1u << fl;
    a->sl_bits[fl] |= 1u << sl;
}

static void list_remove(struct kvt_palloc *a, uint32_t id)
{
    int fl, sl;
    struct kvt_pa_run *r = &a->runs[id];
    mapping(r->len, &fl, &sl);
    if (r->prev != NIL)
        a->runs[r->prev].next = r->next;
    else
        a->heads[fl][sl] = r->next;
    if (r->next != NIL)
        a->runs[r->next].prev = r->prev;
    if (a->heads[fl][sl] == NIL) {
        a->sl_bits[fl] &= ~(1u << sl);
        if (!a->sl_bits[fl])
            a->fl_bits &= ~(1u << fl);
    }
}

/* Register a free run (not yet in any map) and list it. */
static void run_add(struct kvt_palloc *a, uint32_t start, uint32_t len)
{
    uint32_t id = node_new(a);
    a->runs[id].start = start;
    a->runs[id].len = len;
    kvt_u32map_put(&a->by_start, start, id);
    kvt_u32map_put(&a->by_last, start + len - 1, id);
    list_insert(a, id);
    a->live_runs++;
}

static void run_drop(struct kvt_palloc *a, uint32_t id)
{
    struct kvt_pa_run *r = &a->runs[id];
    list_remove(a, id);
    kvt_u32map_del(&a->by_start, r->start);
    kvt_u32map_del(&a->by_last, r->start + r->len - 1);
    r->next = a->free_node;
    a->free_node = id;
    a->live_runs--;
}

/* Free [start, start+len) merging with free neighbours. */
static void free_run(struct kvt_palloc *a, uint32_t start, uint32_t len)
{
    uint32_t id;
    if (start > 0 && kvt_u32map_get(&a->by_last, start - 1, &id)) {
        start = a->runs[id].start;
        len += a->runs[id].len;
        run_drop(a, id);
    }
    if (kvt_u32map_get(&a->by_start, start + len, &id)) {
        len += a->runs[id].len;
        run_drop(a, id);
    }
    run_add(a, start, len);
}

void kvt_palloc_grow(struct kvt_palloc *a, uint64_t new_total)
{
    if (new_total <= a->total)
        return;
    KVT_ASSERT(new_total < UINT32_MAX);
    uint32_t start = (uint32_t)a->total;
    uint32_t len = (uint32_t)(new_total - a->total);
    a->total = new_total;
    a->free_pages += len;
    free_run(a, start, len);
}

int kvt_palloc_alloc(struct kvt_palloc *a, uint32_t n, uint32_t *start)
{
    if (n == 0 || n > a->free_pages)
        return -ENOSPC;
    /* round up to the next class boundary so any run in the class fits */
    uint32_t r = n;
    if (n >= (1u << KVT_PA_SLB)) {
        uint64_t up = (uint64_t)n + (1u << (log2u(n) - KVT_PA_SLB)) - 1;
        if (up >= UINT32_MAX)
            return -ENOSPC;
        r = (uint32_t)up;
    }
    int fl, sl;
    mapping(r, &fl, &sl);
    if (fl >= KVT_PA_FL)
        return -ENOSPC;
    uint32_t sbits = a->sl_bits[fl] & (~0u << sl);
    if (!sbits) {
        uint32_t fbits = fl + 1 < 32 ? a->fl_bits & (~0u << (fl + 1)) : 0;
        if (!fbits)
            goto exact; /* no class guarantees a fit: look for an exact-size run */
        fl = __builtin_ctz(fbits);
        sbits = a->sl_bits[fl];
    }
    sl = __builtin_ctz(sbits);
    uint32_t id = a->heads[fl][sl];
    goto take;
exact:
    /* runs in n's own class may still fit (sizes n..class max) */
    mapping(n, &fl, &sl);
    for (id = a->heads[fl][sl]; id != NIL; id = a->runs[id].next)
        if (a->runs[id].len >= n)
            goto take;
    return -ENOSPC;
take:;
    uint32_t s = a->runs[id].start, len = a->runs[id].len;
    run_drop(a, id);
    if (len > n)
        run_add(a, s + n, len - n);
    a->free_pages -= n;
    *start = s;
    return 0;
}

void kvt_palloc_free(struct kvt_palloc *a, uint32_t start, uint32_t n)
{
    if (n == 0)
        return;
    a->free_pages += n;
    free_run(a, start, n);
}

uint64_t kvt_palloc_largest(const struct kvt_palloc *a)
{
    if (!a->fl_bits)
        return 0;
    int fl = log2u(a->fl_bits);
    int sl = log2u(a->sl_bits[fl]);
    uint64_t best = 0;
    for (uint32_t id = a->heads[fl][sl]; id != NIL; id = a->runs[id].next)
        if (a->runs[id].len > best)
            best = a->runs[id].len;
    return best;
}

double kvt_palloc_fragmentation(const struct kvt_palloc *a)
{
    if (!a->free_pages)
        return 0.0;
    return 1.0 - (double)kvt_palloc_largest(a) / (double)a->free_pages;
}
