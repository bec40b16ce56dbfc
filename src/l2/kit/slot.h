/*
 * The slot formats shared by the slot-table engines (raw_block on a block
 * device, dax on persistent memory): CRC-32, the 64-byte slot trailer that
 * says which slot and generation an object header belongs to, and the
 * newest-first order in which a start-up scan adopts used slots.
 * All integers little-endian.
 */
#ifndef KVT_L2_KIT_SLOT_H
#define KVT_L2_KIT_SLOT_H

#include <stddef.h>
#include <stdint.h>

#define RB_TRAILER_MAGIC "KVTRBSL1"
#define RB_TRAILER 64u

/* CRC-32 (IEEE 802.3, as zlib's crc32). */
uint32_t rb_crc32(uint32_t crc, const void *p, size_t n);

/* Slot trailer (last RB_TRAILER bytes of the header area). */
struct rb_trailer {
    uint32_t slot;
    uint64_t gen;
    uint64_t plen;
    uint64_t xxh3;
    uint64_t instance;
};
void rb_trailer_encode(const struct rb_trailer *t, uint8_t *p);
int rb_trailer_decode(const uint8_t *p, struct rb_trailer *t);

/* A used slot found at start-up (raw_block's slot table, dax's header
 * table), sorted newest generation first: adopted in that order at the
 * policy's cold end, the oldest is evicted first and, of two slots with one
 * key, the newer wins. */
struct rb_gen_slot {
    uint64_t gen;
    uint32_t slot;
};
void rb_sort_newest_first(struct rb_gen_slot *v, size_t n);

#endif
