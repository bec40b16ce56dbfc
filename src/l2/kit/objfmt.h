/*
 * On-storage object header, shared by every persistent adapter (fs files,
 * nixl files, raw_block and dax slots, Redis values, S3 objects).
 *
 * Layout (little-endian), padded with zeros to hdr_len bytes:
 *
 *   0   magic "KVTOBJ1\n"      8
 *   8   version (1)            u16
 *  10   hdr_len                u16   header area incl. padding (512 or the
 *                                    O_DIRECT block size)
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
 * 112   reserved               u64
 * 120   model bytes, salt bytes
 *  ..   header_xxh3            u64   XXH3-64 of every byte before it
 *  ..   zeros up to hdr_len          (verified: a nonzero byte is corrupt)
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
#define KVT_OBJHDR_VERSION 1
#define KVT_OBJHDR_MIN 512 /* smallest header area; every encoded header fits */
#define KVT_OBJHDR_FIXED 120

struct kvt_objhdr {
    uint16_t hdr_len;
    uint32_t flags;
    uint64_t payload_len;
    uint64_t logical_len;
    uint64_t payload_xxh3;
    kvt_key key; /* interned from the header's model and salt */
    kvt_objmeta meta;
};

/* Encode a header for key/meta into buf (hdr_len bytes, >= KVT_OBJHDR_MIN).
 * meta->len is the logical length; payload_len the stored bytes. */
int kvt_objhdr_encode(void *buf, uint16_t hdr_len, const kvt_key *key, const kvt_objmeta *meta,
                      uint32_t flags, uint64_t payload_len, uint64_t payload_xxh3);

/* Decode and verify a header from len bytes at buf. Returns 0, or
 * KVT_E_CORRUPT with *why naming the failed check (magic, version, length,
 * header checksum, nonzero padding within the len bytes given, bad key
 * fields). Pass the whole header area (hdr_len bytes) where it was read, so
 * that every byte of it is checked. */
int kvt_objhdr_decode(const void *buf, size_t len, struct kvt_objhdr *h, const char **why);

/* Is the header's key exactly want (same model and salt bytes, kv_rank,
 * group and hash)? */
int kvt_objhdr_matches(const struct kvt_objhdr *h, enum kvt_codec codec, const kvt_key *want);

uint64_t kvt_payload_hash(const void *p, size_t n);

#endif
