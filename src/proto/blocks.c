#include "proto/blocks.h"
#include "common/util.h"
#include "kvtier/error.h"
#include "proto/wire.h"

#include <stdlib.h>
#include <string.h>

/* One hash: a bin of len bytes (len 0: the first one sets it) or an
 * unsigned integer (8 bytes big-endian), as the first one was. */
static bool hash_of(const msgpack_object *v, int *kind, uint8_t *len, uint8_t out[32])
{
    if (v->type == MSGPACK_OBJECT_POSITIVE_INTEGER && *kind != 1) {
        *kind = 0;
        for (int i = 0; i < 8; i++)
            out[i] = (uint8_t)(v->via.u64 >> (56 - 8 * i));
        return true;
    }
    if (v->type == MSGPACK_OBJECT_BIN && *kind != 0 && v->via.bin.size >= 1 &&
        v->via.bin.size <= 32 && (!*len || v->via.bin.size == *len)) {
        *kind = 1;
        *len = (uint8_t)v->via.bin.size;
        memcpy(out, v->via.bin.ptr, *len);
        return true;
    }
    return false;
}

int kvt_wire_blocks_decode(const msgpack_object *body, uint32_t n, struct kvt_blocktag ***tags,
                           const char **why)
{
    *tags = NULL;
    const msgpack_object *b = kvt_mp_get(body, "blocks");
    if (!b || b->type == MSGPACK_OBJECT_NIL || n == 0)
        return 0;
    uint64_t size = 0;
    if (b->type != MSGPACK_OBJECT_MAP || kvt_mp_u64(b, "size", true, &size, why))
        goto bad;
    const msgpack_object *hs = kvt_mp_get(b, "hashes"), *par = kvt_mp_get(b, "parent"),
                         *tk = kvt_mp_get(b, "tokens");
    if (!hs || hs->type != MSGPACK_OBJECT_ARRAY || hs->via.array.size % n || size == 0 ||
        size > UINT32_MAX)
        goto bad;
    uint32_t per = hs->via.array.size / n, tper = 0;
    if (per < 1 || per > KVT_BLOCKTAG_MAX)
        goto bad;
    if (tk && tk->type != MSGPACK_OBJECT_NIL) {
        if (tk->type != MSGPACK_OBJECT_ARRAY || tk->via.array.size % n)
            goto bad;
        tper = tk->via.array.size / n;
        for (uint32_t i = 0; i < tk->via.array.size; i++)
            if (tk->via.array.ptr[i].type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
                tk->via.array.ptr[i].via.u64 > UINT32_MAX)
                goto bad;
    }
    int kind = -1; /* 0: integers, 1: bins */
    uint8_t len = 0, h[32], parent[32];
    for (uint32_t i = 0; i < hs->via.array.size; i++)
        if (!hash_of(&hs->via.array.ptr[i], &kind, &len, h))
            goto bad;
    bool has_parent = par && par->type != MSGPACK_OBJECT_NIL;
    if (has_parent && !hash_of(par, &kind, &len, parent))
        goto bad;
    uint8_t hl = kind == 1 ? len : 0;
    size_t hsz = hl ? hl : 8;
    struct kvt_blocktag **t = kvt_xcalloc(n, sizeof(*t));
    for (uint32_t k = 0; k < n; k++) {
        t[k] = kvt_blocktag_new((uint32_t)size, (uint16_t)per, hl, tper);
        for (uint32_t j = 0; j < per; j++)
            hash_of(&hs->via.array.ptr[k * per + j], &kind, &len, t[k]->hashes + j * hsz);
        if (k > 0) {
            t[k]->has_parent = 1;
            memcpy(t[k]->parent, t[k - 1]->hashes + (per - 1) * hsz, hsz);
        } else if (has_parent) {
            t[k]->has_parent = 1;
            memcpy(t[k]->parent, parent, hsz);
        }
        for (uint32_t j = 0; j < tper; j++)
            t[k]->tokens[j] = (uint32_t)tk->via.array.ptr[k * tper + j].via.u64;
    }
    *tags = t;
    return 0;
bad:
    *why = "\"blocks\" must be {size: uint, hashes: [bin | uint, ...] (1..64 per key, bins of one "
           "length 1..32, or all integers), parent?: a hash of the same kind, tokens?: [uint, "
           "...] (as many per key)}";
    return KVT_E_BADREQ;
}

void kvt_wire_blocks_free(struct kvt_blocktag **tags, uint32_t n)
{
    if (!tags)
        return;
    for (uint32_t i = 0; i < n; i++)
        kvt_blocktag_put(tags[i]);
    free(tags);
}
