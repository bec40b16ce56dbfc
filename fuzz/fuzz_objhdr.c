/* libFuzzer target: the on-disk object header decoder (files, slots and
 * remote values are untrusted input after a crash or tampering). */
#include "l2/kit/objfmt.h"

#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct kvt_objhdr h;
    const char *why = NULL;
    if (kvt_objhdr_decode(data, size, &h, &why) == 0) {
        if (h.hdr_len < KVT_OBJHDR_MIN || h.meta.ndim > KVT_MAX_DIMS)
            abort();
        /* a decoded header re-encodes to the same identity */
        uint8_t buf[KVT_OBJHDR_MIN];
        if (kvt_objhdr_encode(buf, KVT_OBJHDR_MIN, &h.key, &h.meta, h.flags, h.payload_len,
                              h.payload_xxh3) == 0) {
            struct kvt_objhdr h2;
            if (kvt_objhdr_decode(buf, sizeof(buf), &h2, &why) || !kvt_key_eq(&h.key, &h2.key))
                abort();
        }
    } else if (!why) {
        abort();
    }
    return 0;
}
