/*
 * On-storage object header, shared by every persistent adapter (fs files,
 * nixl files, raw_block and dax slots, Redis values, S3 objects).
 *
 * Layout (little-endian), padded with zeros to hdr_len bytes:
 *
 *   0   magic "KVTOBJ1\n"      8
 *   8   version                u16   1: no tag; 2: a tag after the salt
 *  10   hdr_len                u16   header area incl. padding (512, the
 *                                    O_DIRECT block size, or a multiple of
 *                                    either that holds a tag)
 *  12   flags                  u32   serde chain id (kvt_objmeta.serde; 0 = raw)
 *  16   payload_len            u64   bytes after the header as stored
 *  24   logical_len            u64   bytes the client stored (before serde)
 *  32   payload_xxh3           u64   XXH3-64 of the stored payload
 *  40   kv_rank                u32
 *  44   group                  u32
 *  48   hash_len u8, ndim u8, dtype u16
 *  52   model_len u16, salt_len u16
 *  56   hash[32]
 *  88   shape[6]               u32 x 6
 * 112   tag_len u32, zero u32        version 1: reserved (written 0, ignored)
 * 120   model bytes, salt bytes
 *  ..   tag                    tag_len bytes (version 2 only), below
 *  ..   header_xxh3            u64   XXH3-64 of every byte before it
 *  ..   zeros up to hdr_len          (verified: a nonzero byte is corrupt)
 *
 * The tag (version 2): the object's engine block hashes (key/blocktag.h),
 * so that KV events name the object by them after a restart
 * (docs/events.md):
 *
 *   0   block_size             u32   tokens per block, >= 1
 *   4   nblocks                u16   1..KVT_BLOCKTAG_MAX
 *   6   hash_len               u8    0..32 (0: integer hashes, 8 bytes each)
 *   7   tag flags              u8    1: has a parent hash; 2: has token ids
 *   8   parent                 hsize bytes (hsize = hash_len, or 8), if flag 1
 *  ..   hashes                 nblocks x hsize bytes
 *  ..   ntokens u32, token ids u32 x ntokens (>= 1), if flag 2
 *
 * tag_len is exactly that length; anything else is corrupt. A header
 * without a tag is written as version 1, byte for byte as before tags
 * existed. The tag is optional: an adapter whose header area is fixed
 * (512 bytes) keeps what fits (kvt_objhdr_encode: the token ids only when
 * they fit too, the tag only when its hashes fit); one that may grow its
 * header area asks kvt_objhdr_len for the size that holds it.
 *
 * A torn, truncated, foreign or corrupt object fails kvt_objhdr_decode or
 * kvt_objhdr_check_payload and is a miss, never a hit.
 */
#ifndef KVT_OBJFMT_H
#define KVT_OBJFMT_H

#include <stddef.h>
#include <stdint.h>

#include "key/key.h"
#include "l2/engine.h"

#define KVT_OBJHDR_MAGIC "KVTOBJ1\n"
#define KVT_OBJHDR_VERSION 1     /* a header without a tag */
#define KVT_OBJHDR_VERSION_TAG 2 /* a header with a tag */
#define KVT_OBJHDR_MIN 512       /* smallest header area; every header without a tag fits */
#define KVT_OBJHDR_MAX 8192      /* a tag lies within a header's first 8192 bytes */
#define KVT_OBJHDR_FIXED 120

struct kvt_blocktag;

struct kvt_objhdr {
    uint16_t hdr_len;
    uint32_t flags;
    uint64_t payload_len;
    uint64_t logical_len;
    uint64_t payload_xxh3;
    kvt_key key; /* interned from the header's model and salt */
    kvt_objmeta meta;
    uint32_t tag_off, tag_len; /* the verified tag within the header; tag_len 0: none */
};

/* The header area (hdr_len) for key with tag (NULL: none): the smallest
 * multiple of align (a power of two, or 512 when smaller) of at least
 * KVT_OBJHDR_MIN that holds the header with the whole tag, or else with the
 * tag without its token ids, when that is at most max (>= KVT_OBJHDR_MIN);
 * else the area without a tag. kvt_objhdr_encode into that area keeps the
 * same part of the tag. */
uint16_t kvt_objhdr_len(const kvt_key *key, const struct kvt_blocktag *tag, uint32_t align,
                        uint32_t max);

/* Encode a header for key/meta into buf (hdr_len bytes, >= KVT_OBJHDR_MIN).
 * meta->len is the logical length; payload_len the stored bytes. tag
 * (NULL: none): the engine block hashes, kept as far as they fit in hdr_len
 * (the whole tag; else without its token ids; else none: version 1). */
int kvt_objhdr_encode(void *buf, uint16_t hdr_len, const kvt_key *key, const kvt_objmeta *meta,
                      const struct kvt_blocktag *tag, uint32_t flags, uint64_t payload_len,
                      uint64_t payload_xxh3);

/* Decode and verify a header from len bytes at buf. Returns 0, or
 * KVT_E_CORRUPT with *why naming the failed check (magic, version, length,
 * header checksum, nonzero padding within the len bytes given, bad key
 * fields). Pass the whole header area (hdr_len bytes) where it was read, so
 * that every byte of it is checked. */
int kvt_objhdr_decode(const void *buf, size_t len, struct kvt_objhdr *h, const char **why);

/* The tag of a header decoded from buf (a new tag with one reference, or
 * NULL when the header has none). */
struct kvt_blocktag *kvt_objhdr_tag(const void *buf, const struct kvt_objhdr *h);

/* Is the header's key exactly want (same model and salt bytes, kv_rank,
 * group and hash)? */
int kvt_objhdr_matches(const struct kvt_objhdr *h, enum kvt_codec codec, const kvt_key *want);

uint64_t kvt_payload_hash(const void *p, size_t n);

#endif
