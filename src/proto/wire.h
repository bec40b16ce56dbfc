/*
 * Wire protocol helpers shared by the server and the C client.
 * The protocol itself is specified in docs/protocol.md.
 *
 * Messages are ZeroMQ multipart:
 *   request  [request id][op name][msgpack body][data frames...]
 *   reply    [request id][status: int32 LE][msgpack body][data frames...]
 * Bulk bytes never pass through msgpack.
 */
#ifndef KVT_WIRE_H
#define KVT_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>
#include <msgpack.h>

#include "key/key.h"
#include "key/objmeta.h"

#define KVT_PROTO_VERSION 1
#define KVT_MAX_BODY (16u << 20) /* largest msgpack body accepted */
#define KVT_MAX_BATCH 65536u     /* keys per request */
#define KVT_MAX_RID 32           /* request id frame bytes */

/* ---- reading a decoded body ---- */

/* Value of key in a msgpack map, or NULL (also NULL if m is not a map). */
const msgpack_object *kvt_mp_get(const msgpack_object *m, const char *key);
/* Typed getters: 0, or KVT_E_BADREQ with a message in *why when present but
 * of the wrong type. A missing key leaves *out unchanged and returns 0 unless
 * required (then KVT_E_BADREQ). */
int kvt_mp_u64(const msgpack_object *m, const char *key, bool required, uint64_t *out,
               const char **why);
int kvt_mp_str(const msgpack_object *m, const char *key, bool required, const char **s, size_t *len,
               const char **why);
int kvt_mp_bool(const msgpack_object *m, const char *key, bool *out, const char **why);

/* Decode the "keys" batch {model, kv_rank, group, salt, hashes: [bin...]}
 * into n validated keys (interning the namespace). keys is malloc'd.
 * Returns 0, KVT_E_BADREQ (shape) or KVT_E_BADKEY (validation), with *why. */
int kvt_wire_keys_decode(const msgpack_object *body, kvt_key **keys, uint32_t *n, const char **why);

/* Decode a request body: a msgpack map (an empty frame is an empty map).
 * up must be initialized; on success up->data is the map. */
int kvt_wire_body_decode(const void *data, size_t len, msgpack_unpacked *up, const char **why);
/* 0 when data is one msgpack value whose every declared length fits in len
 * (nesting <= 32), so unpacking it allocates at most O(len); -1 otherwise. */
int kvt_wire_precheck(const void *data, size_t len);
/* Optional "dtype" (name) and "shape" (<= 6 dims) of a request into m. */
int kvt_wire_meta_decode(const msgpack_object *body, kvt_objmeta *m, const char **why);

/* ---- writing ---- */

/* Encode a keys batch: all keys must share ns, kv_rank and group. */
void kvt_wire_keys_encode(msgpack_packer *pk, const char *model, uint32_t kv_rank, uint32_t group,
                          const char *salt, const uint8_t *hashes, size_t hash_len, uint32_t n);
void kvt_mp_str0(msgpack_packer *pk, const char *s);

/* JSON <-> msgpack (status bodies). */
void kvt_mp_pack_json(msgpack_packer *pk, const json_t *j);
json_t *kvt_mp_to_json(const msgpack_object *o);

/* Status frame. */
static inline void kvt_wire_put_status(uint8_t b[4], int32_t st)
{
    uint32_t u = (uint32_t)st;
    b[0] = (uint8_t)u;
    b[1] = (uint8_t)(u >> 8);
    b[2] = (uint8_t)(u >> 16);
    b[3] = (uint8_t)(u >> 24);
}
static inline int32_t kvt_wire_get_status(const uint8_t b[4])
{
    return (int32_t)((uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
                     (uint32_t)b[3] << 24);
}

#endif
