/*
 * Per-object metadata carried from a client into an object's header, and
 * the largest object any tier accepts. Shared by the wire protocol, the
 * client, L1 and L2: it lives here so that none of them includes the L2
 * engine header for it.
 */
#ifndef KVT_KEY_OBJMETA_H
#define KVT_KEY_OBJMETA_H

#include <stdint.h>

#define KVT_MAX_OBJECT (1u << 30) /* largest object any tier accepts: 1 GiB */
#define KVT_MAX_DIMS 6

/* Per-object metadata carried into the object header. */
typedef struct kvt_objmeta {
    uint32_t len;   /* logical payload bytes (what the client stored) */
    uint16_t dtype; /* enum kvt_dtype, 0 = raw bytes */
    uint8_t ndim;
    uint8_t pad;
    uint32_t shape[KVT_MAX_DIMS];
    uint32_t serde; /* serde chain that produced the stored bytes; 0 = raw */
} kvt_objmeta;

#endif
