/*
 * The "blocks" field of store and prepare_store (docs/protocol.md): the
 * engine's block hashes of each stored chunk, decoded into one tag per key
 * (key/blocktag.h). Server side only.
 */
#ifndef KVT_PROTO_BLOCKS_H
#define KVT_PROTO_BLOCKS_H

#include <stdint.h>

#include <msgpack.h>

#include "key/blocktag.h"

/*
 * Decode body's optional "blocks" for a request of n keys:
 *   {size: uint, hashes: [bin | uint, ...], parent?: bin | uint | nil,
 *    tokens?: [uint, ...]}
 * hashes: n x B (B = 1..KVT_BLOCKTAG_MAX) hashes, B per key in key order,
 * all bins of one length (1..32 bytes) or all unsigned integers; parent (of
 * the same kind): the block before the first key's first; key i > 0's
 * parent is key i-1's last hash. tokens: n x T token ids (T per key), or
 * absent. *tags = NULL when the field is absent or nil; else n tags
 * (malloc'd array, one reference each). 0 or KVT_E_BADREQ with *why.
 */
int kvt_wire_blocks_decode(const msgpack_object *body, uint32_t n, struct kvt_blocktag ***tags,
                           const char **why);
/* Drop n tags and the array (NULL: nothing). */
void kvt_wire_blocks_free(struct kvt_blocktag **tags, uint32_t n);

#endif
