/* libFuzzer target: the server's request decoder (body map, keys batch,
 * dtype/shape, integer fields) on arbitrary bytes. */
#include "kvtier/error.h"
#include "proto/wire.h"

#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    const char *why = NULL;
    if (kvt_wire_body_decode(data, size, &up, &why) == 0) {
        kvt_key *keys = NULL;
        uint32_t n = 0;
        if (kvt_wire_keys_decode(&up.data, &keys, &n, &why) == 0) {
            for (uint32_t i = 0; i < n; i++)
                if (keys[i].hash_len == 0 || keys[i].hash_len > KVT_HASH_MAX)
                    abort(); /* a decoded key is always valid */
            free(keys);
        }
        kvt_objmeta m;
        if (kvt_wire_meta_decode(&up.data, &m, &why) == 0 && m.ndim > KVT_MAX_DIMS)
            abort();
        uint64_t v;
        kvt_mp_u64(&up.data, "lease", false, &v, &why);
        json_t *j = kvt_mp_to_json(&up.data);
        json_decref(j);
    }
    msgpack_unpacked_destroy(&up);
    return 0;
}
