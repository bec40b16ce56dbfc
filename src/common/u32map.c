#include "common/u32map.h"
#include "common/util.h"

#include <stdlib.h>
#include <string.h>

#define EMPTY UINT64_MAX

static uint32_t hash32(uint32_t k)
{
    /* murmur3 finalizer */
    k ^= k >> 16;
    k *= 0x85ebca6bu;
    k ^= k >> 13;
    k *= 0xc2b2ae35u;
    k ^= k >> 16;
    return k;
}

void kvt_u32map_init(struct kvt_u32map *m)
{
    memset(m, 0, sizeof(*m));
}

void kvt_u32map_free(struct kvt_u32map *m)
{
    free(m->slots);
    memset(m, 0, sizeof(*m));
}

static uint32_t find_slot(const struct kvt_u32map *m, uint32_t key)
{
    uint32_t mask = m->cap - 1;
    for (uint32_t i = hash32(key) & mask;; i = (i + 1) & mask)
        if (m->slots[i] == EMPTY || (uint32_t)(m->slots[i] >> 32) == key)
            return i;
}

bool kvt_u32map_get(const struct kvt_u32map *m, uint32_t key, uint32_t *val)
{
    if (!m->cap)
        return false;
    uint32_t i = find_slot(m, key);
    if (m->slots[i] == EMPTY)
        return false;
    if (val)
        *val = (uint32_t)m->slots[i];
    return true;
}

static void grow(struct kvt_u32map *m)
{
    uint64_t *old = m->slots;
    uint32_t ocap = m->cap;
    m->cap = ocap ? ocap * 2 : 64;
    m->slots = kvt_xmalloc((size_t)m->cap * sizeof(uint64_t));
    memset(m->slots, 0xff, (size_t)m->cap * sizeof(uint64_t));
    for (uint32_t i = 0; i < ocap; i++)
        if (old[i] != EMPTY)
            m->slots[find_slot(m, (uint32_t)(old[i] >> 32))] = old[i];
    free(old);
}

void kvt_u32map_put(struct kvt_u32map *m, uint32_t key, uint32_t val)
{
    if ((uint64_t)(m->n + 1) * 10 > (uint64_t)m->cap * 7)
        grow(m);
    uint32_t i = find_slot(m, key);
    if (m->slots[i] == EMPTY)
        m->n++;
    m->slots[i] = (uint64_t)key << 32 | val;
}

bool kvt_u32map_del(struct kvt_u32map *m, uint32_t key)
{
    if (!m->cap)
        return false;
    uint32_t mask = m->cap - 1, i = find_slot(m, key);
    if (m->slots[i] == EMPTY)
        return false;
    for (uint32_t j = (i + 1) & mask; m->slots[j] != EMPTY; j = (j + 1) & mask) {
        uint32_t hm = hash32((uint32_t)(m->slots[j] >> 32)) & mask;
        bool in_between = (i <= j) ? (hm > i && hm <= j) : (hm > i || hm <= j);
        if (!in_between) {
            m->slots[i] = m->slots[j];
            i = j;
        }
    }
    m->slots[i] = EMPTY;
    m->n--;
    return true;
}
