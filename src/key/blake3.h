/*
 * BLAKE3 hash (32-byte output) and LMCache's token chunk hashing.
 */
#ifndef KVT_BLAKE3_H
#define KVT_BLAKE3_H

#include <stddef.h>
#include <stdint.h>

void kvt_blake3(const void *data, size_t len, uint8_t out[32]);

/* LMCache multi-process TokenHasher, algorithm "blake3" (its default):
 *   none = BLAKE3(int64 0 big-endian || uint32 0 big-endian)   (12 zero bytes)
 *   h_0  = BLAKE3(none || tokens[0:C]   as big-endian uint32)
 *   h_i  = BLAKE3(h_{i-1} || tokens[iC:(i+1)C] as big-endian uint32)
 * Only full chunks. Writes min(n_tokens / C, max_out) hashes of 32 bytes and
 * returns how many. */
size_t kvt_lmc_chunk_hashes(const uint32_t *tokens, size_t n_tokens, size_t chunk_size,
                            uint8_t *out, size_t max_out);

#endif
