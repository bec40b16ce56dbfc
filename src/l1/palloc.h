/*
 * palloc: a page-run allocator for the L1 pool (TLSF over page counts).
 *
 * The pool is divided into pages of --l1-align-bytes; an object takes a run
 * of whole pages, so every object starts aligned. Free runs sit in
 * segregated lists indexed by a two-level bitmap (Masmano et al., TLSF):
 * allocation and free are O(1); a request is served from the smallest class
 * whose every run fits (good fit), the remainder stays free, and a freed run
 * merges with its free neighbours at once. That bounds fragmentation for
 * mixed sizes: no free run ever sits next to another free run.
 *
 * Metadata lives outside the shared memory (clients cannot corrupt it) and
 * grows with the number of free runs, not with the number of pages.
 * No locking: the L1 lock guards it.
 */
#ifndef KVT_PALLOC_H
#define KVT_PALLOC_H

#include <stdint.h>

#include "common/u32map.h"

#define KVT_PA_SLB 4 /* 16 second-level classes per power of two */
#define KVT_PA_FL 29

struct kvt_pa_run {
    uint32_t start, len;
    uint32_t next, prev; /* class list links (node ids) */
};

struct kvt_palloc {
    uint64_t total; /* pages managed */
    uint64_t free_pages;
    struct kvt_pa_run *runs;             /* node slab */
    uint32_t nruns, cap_runs, free_node; /* free_node: list through .next */
    uint32_t live_runs;
    struct kvt_u32map by_start, by_last; /* first page / last page -> node */
    uint32_t fl_bits;
    uint32_t sl_bits[KVT_PA_FL];
    uint32_t heads[KVT_PA_FL][1 << KVT_PA_SLB];
};

void kvt_palloc_init(struct kvt_palloc *a);
void kvt_palloc_destroy(struct kvt_palloc *a);
/* Add pages [total, new_total) as free (pool growth). */
void kvt_palloc_grow(struct kvt_palloc *a, uint64_t new_total);
/* Allocate n pages; returns 0 and *start, or -ENOSPC. */
int kvt_palloc_alloc(struct kvt_palloc *a, uint32_t n, uint32_t *start);
void kvt_palloc_free(struct kvt_palloc *a, uint32_t start, uint32_t n);
/* Largest free run in pages (walks only the top non-empty class). */
uint64_t kvt_palloc_largest(const struct kvt_palloc *a);
/* 1 - largest free run / free pages (0 when nothing is free). */
double kvt_palloc_fragmentation(const struct kvt_palloc *a);

#endif
