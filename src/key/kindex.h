/*
 * kindex: an open-addressing hash index from kvt_key to a 32-bit handle.
 *
 * The keys live in the owner's slab (an array of records, each holding a
 * kvt_key at key_off); the index stores only handle + 1 per slot, so it adds
 * about 6 bytes per object at the 0.7 load factor. Linear probing with
 * backward-shift deletion: no tombstones, lookups stay short.
 *
 * The owner must update base after moving its slab (realloc).
 * No locking: the owner's lock guards the index.
 */
#ifndef KVT_KINDEX_H
#define KVT_KINDEX_H

#include <stddef.h>
#include <stdint.h>

#include "key/key.h"

#define KVT_NOHANDLE UINT32_MAX

struct kvt_kindex {
    uint32_t *table; /* handle + 1, 0 = empty */
    uint32_t cap;    /* power of two, or 0 */
    uint32_t n;
    const char *base; /* owner's slab */
    size_t stride;    /* bytes per record */
    size_t key_off;   /* offset of the kvt_key in a record */
};

void kvt_kindex_init(struct kvt_kindex *x, size_t stride, size_t key_off);
void kvt_kindex_free(struct kvt_kindex *x);
static inline const kvt_key *kvt_kindex_key(const struct kvt_kindex *x, uint32_t h)
{
    return (const kvt_key *)(x->base + (size_t)h * x->stride + x->key_off);
}
uint32_t kvt_kindex_find(const struct kvt_kindex *x, const kvt_key *k);
/* Insert handle h whose record already holds its key (key must be absent). */
void kvt_kindex_put(struct kvt_kindex *x, uint32_t h);
/* Grow the table so that n entries fit without another rehash. */
void kvt_kindex_reserve(struct kvt_kindex *x, uint32_t n);
/* Remove handle h (must be present). */
void kvt_kindex_del(struct kvt_kindex *x, uint32_t h);

#endif
