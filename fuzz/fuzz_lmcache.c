/* libFuzzer target: the LMCache MP protocol decoder (src/proto/lmc_wire.c)
 * on arbitrary bytes. An input is one request as its frames:
 *   repeated [u32 little-endian length][bytes]   ([uid][operation][payload...])
 * the format of fuzz/corpus/lmcache/, captured from real LMCache client
 * sessions (tests/lmcache/lmc_probe.py --capture). Each payload goes through
 * every decoder the front end uses, and a decoded key's tokens through the
 * BLAKE3 chunk hashing. */
#include "key/blake3.h"
#include "proto/lmc_wire.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *fr[16];
    size_t fl[16];
    size_t n = 0, off = 0;
    while (n < 16 && off + 4 <= size) {
        uint32_t l;
        memcpy(&l, data + off, 4);
        off += 4;
        if (l > size - off)
            l = (uint32_t)(size - off);
        fr[n] = data + off;
        fl[n++] = l;
        off += l;
    }
    if (n < 2)
        return 0;
    enum lmc_op op;
    char name[80];
    if (lmc_decode_op(fr[1], fl[1], &op, name, sizeof(name)) == 0) {
        if ((unsigned)op >= LMC_OP_COUNT)
            abort();
        if (op == LMC_OP_UNKNOWN && strlen(name) >= sizeof(name))
            abort();
    }
    for (size_t i = 2; i < n; i++) {
        msgpack_unpacked up;
        msgpack_unpacked_init(&up);
        if (lmc_unpack(fr[i], fl[i], &up) == 0) {
            char why[256];
            struct lmc_key k;
            if (lmc_key_decode(&up.data, &k, why, sizeof(why)) == 0) {
                if (k.world_size == 0 || k.world_size > LMC_MAX_WORLD ||
                    (k.has_worker && k.worker_id >= k.world_size) || k.rid_len > LMC_MAX_RID)
                    abort(); /* a decoded key is always within bounds */
                size_t nt = k.ntokens < 4096 ? k.ntokens : 4096;
                uint8_t h[32 * 256];
                kvt_lmc_chunk_hashes(k.tokens, nt, 16, h, 256);
                lmc_key_free(&k);
            }
            struct lmc_register r;
            if (lmc_register_decode(&up.data, &r, why, sizeof(why)) == 0 &&
                (lmc_dtype_size(r.dtype) == 0 || !r.num_layers || !r.hidden_dim))
                abort();
            int64_t v;
            double d;
            const char *s;
            size_t sl;
            (void)lmc_get_int(&up.data, &v);
            (void)lmc_get_float(&up.data, &d);
            (void)lmc_get_str(&up.data, &s, &sl);
        }
        msgpack_unpacked_destroy(&up);
    }
    return 0;
}
