#include "key/kindex.h"
#include "common/log.h"
#include "common/util.h"

#include <stdlib.h>
#include <string.h>

void kvt_kindex_init(struct kvt_kindex *x, size_t stride, size_t key_off)
{
    memset(x, 0, sizeof(*x));
    x->stride = stride;
    x->key_off = key_off;
}

void kvt_kindex_free(struct kvt_kindex *x)
{
    free(x->table);
    x->table = NULL;
    x->cap = x->n = 0;
}

static uint32_t home(const struct kvt_kindex *x, const kvt_key *k)
{
    return (uint32_t)kvt_key_hash(k) & (x->cap - 1);
}

uint32_t kvt_kindex_find(const struct kvt_kindex *x, const kvt_key *k)
{
    if (!x->cap)
        return KVT_NOHANDLE;
    uint32_t mask = x->cap - 1;
    for (uint32_t i = home(x, k);; i = (i + 1) & mask) {
        uint32_t e = x->table[i];
        if (!e)
            return KVT_NOHANDLE;
        if (kvt_key_eq(kvt_kindex_key(x, e - 1), k))
            return e - 1;
    }
}

static void place(struct kvt_kindex *x, uint32_t h)
{
    uint32_t mask = x->cap - 1, i = home(x, kvt_kindex_key(x, h));
    while (x->table[i])
        i = (i + 1) & mask;
    x->table[i] = h + 1;
}

static void grow(struct kvt_kindex *x)
{
    uint32_t *old = x->table, ocap = x->cap;
    x->cap = ocap ? ocap * 2 : 1024;
    x->table = kvt_xcalloc(x->cap, sizeof(uint32_t));
    for (uint32_t i = 0; i < ocap; i++)
        if (old[i])
            place(x, old[i] - 1);
    free(old);
}

void kvt_kindex_reserve(struct kvt_kindex *x, uint32_t n)
{
    while ((uint64_t)n * 10 > (uint64_t)x->cap * 7)
        grow(x);
}

void kvt_kindex_put(struct kvt_kindex *x, uint32_t h)
{
    if ((uint64_t)(x->n + 1) * 10 > (uint64_t)x->cap * 7)
        grow(x);
    place(x, h);
    x->n++;
}

void kvt_kindex_del(struct kvt_kindex *x, uint32_t h)
{
    uint32_t mask = x->cap - 1;
    uint32_t i = home(x, kvt_kindex_key(x, h));
    while (x->table[i] != h + 1) {
        KVT_ASSERT(x->table[i] != 0); /* the end of h's probe run: h is not in the index */
        i = (i + 1) & mask;
    }
    /* backward shift: move later members of the probe run into the hole
     * when their home slot is not cyclically inside (i, j] */
    for (uint32_t j = (i + 1) & mask; x->table[j]; j = (j + 1) & mask) {
        uint32_t hm = home(x, kvt_kindex_key(x, x->table[j] - 1));
        bool in_between = (i <= j) ? (hm > i && hm <= j) : (hm > i || hm <= j);
        if (!in_between) {
            x->table[i] = x->table[j];
            i = j;
        }
    }
    x->table[i] = 0;
    x->n--;
}
