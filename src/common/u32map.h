/* u32 -> u32 open-addressing map (linear probing, backward-shift delete).
 * Key UINT32_MAX is reserved. No locking. */
#ifndef KVT_U32MAP_H
#define KVT_U32MAP_H

#include <stdbool.h>
#include <stdint.h>

struct kvt_u32map {
    uint64_t *slots; /* key << 32 | value; empty = UINT64_MAX */
    uint32_t cap, n;
};

void kvt_u32map_init(struct kvt_u32map *m);
void kvt_u32map_free(struct kvt_u32map *m);
bool kvt_u32map_get(const struct kvt_u32map *m, uint32_t key, uint32_t *val);
void kvt_u32map_put(struct kvt_u32map *m, uint32_t key, uint32_t val); /* insert or replace */
bool kvt_u32map_del(struct kvt_u32map *m, uint32_t key);

#endif
