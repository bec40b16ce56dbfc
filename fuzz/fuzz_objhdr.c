/* libFuzzer target: the on-disk object header decoder (files, slots and
 * remote values are untrusted input after a crash or tampering), its tag
 * of engine block hashes included. */
#include "key/blocktag.h"
#include "l2/kit/objfmt.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct kvt_objhdr h;
    const char *why = NULL;
    if (kvt_objhdr_decode(data, size, &h, &why) == 0) {
        if (h.hdr_len < KVT_OBJHDR_MIN || h.meta.ndim > KVT_MAX_DIMS ||
            (uint64_t)h.tag_off + h.tag_len + 8 > size)
            abort();
        /* a decoded header re-encodes to the same identity and hashes */
        struct kvt_blocktag *t = kvt_objhdr_tag(data, &h);
        if ((t != NULL) != (h.tag_len != 0))
            abort();
        uint16_t hl = kvt_objhdr_len(&h.key, t, KVT_OBJHDR_MIN, KVT_OBJHDR_MAX);
        uint8_t *buf = malloc(hl);
        if (kvt_objhdr_encode(buf, hl, &h.key, &h.meta, t, h.flags, h.payload_len,
                              h.payload_xxh3) == 0) {
            struct kvt_objhdr h2;
            if (kvt_objhdr_decode(buf, hl, &h2, &why) || !kvt_key_eq(&h.key, &h2.key))
                abort();
            struct kvt_blocktag *t2 = kvt_objhdr_tag(buf, &h2);
            if (t2 &&
                (!t || t2->nblocks != t->nblocks || t2->hash_len != t->hash_len ||
                 memcmp(t2->hashes, t->hashes, (size_t)t->nblocks * kvt_blocktag_hsize(t)) != 0))
                abort();
            kvt_blocktag_put(t2);
        }
        free(buf);
        kvt_blocktag_put(t);
    } else if (!why) {
        abort();
    }
    return 0;
}
