/*
 * An object's engine block hashes: the hashes an inference engine gave
 * the blocks of one stored chunk (vLLM's request block hashes), with the
 * hash of the block before them and the block size. KV events name a
 * chunk by these when it has them (docs/events.md), so a router that
 * indexes the engine's hashes recognises kvtier's chunks.
 *
 * Immutable once made, shared by reference (refs is atomic): the wire
 * decoder makes one per stored key, the core's tier-event queue keeps it
 * while a tier holds the key, each queued event holds one.
 */
#ifndef KVT_KEY_BLOCKTAG_H
#define KVT_KEY_BLOCKTAG_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define KVT_BLOCKTAG_MAX 64 /* blocks of one chunk */

struct kvt_blocktag {
    _Atomic uint32_t refs;
    uint32_t block_size; /* tokens per block */
    uint16_t nblocks;    /* 1..KVT_BLOCKTAG_MAX */
    uint8_t hash_len;    /* bytes of each hash, 1..32; 0: unsigned 64-bit integers, each
                          * stored as 8 bytes big-endian (vLLM's int block hashes) */
    uint8_t has_parent;  /* 0: the chunk's first block starts the prompt */
    uint8_t parent[32];  /* the block before the chunk's first (hash_len bytes, or 8) */
    uint32_t ntokens;    /* token ids of the chunk's blocks (0: not given) */
    uint32_t *tokens;    /* ntokens, in the same allocation */
    uint8_t hashes[];    /* nblocks x kvt_blocktag_hsize() bytes */
};

/* Bytes of one hash as stored. */
static inline size_t kvt_blocktag_hsize(const struct kvt_blocktag *t)
{
    return t->hash_len ? t->hash_len : 8;
}

/* A tag with room for nblocks hashes and ntokens token ids, zeroed, one
 * reference. */
struct kvt_blocktag *kvt_blocktag_new(uint32_t block_size, uint16_t nblocks, uint8_t hash_len,
                                      uint32_t ntokens);
void kvt_blocktag_ref(struct kvt_blocktag *t);
/* Drop one reference (NULL: nothing); the last frees it. */
void kvt_blocktag_put(struct kvt_blocktag *t);

#endif
