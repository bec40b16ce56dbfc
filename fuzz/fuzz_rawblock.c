/* libFuzzer target: raw_block's recovery decoders — checkpoint headers,
 * the packed records of checkpoint payloads and journal blocks, journal
 * block headers and slot trailers. The first input byte picks the decoder;
 * CRC-protected structures are also fed with their CRC fixed up, so the
 * fuzzer reaches the field checks behind the CRC. */
#include "l2/raw_block/raw_block.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define NSLOTS 64

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint8_t sel = data[0];
    data++;
    size--;
    switch (sel % 4) {
    case 0: { /* checkpoint header: raw, then re-encoded with a valid CRC */
        uint8_t blk[4096] = {0};
        memcpy(blk, data, size < sizeof(blk) ? size : sizeof(blk));
        struct rb_ckpt_hdr h;
        rb_ckpt_hdr_decode(blk, sizeof(blk), "kvtierRB", 1, &h);
        if (size >= sizeof(h)) {
            memcpy(&h, data, sizeof(h));
            memcpy(h.magic, "kvtierRB", 8);
            rb_ckpt_hdr_encode(&h, blk, sizeof(blk));
            struct rb_ckpt_hdr d;
            if (rb_ckpt_hdr_decode(blk, sizeof(blk), "kvtierRB", h.version, &d) != 0 ||
                d.seq != h.seq || d.nslots != h.nslots || d.payload_len != h.payload_len)
                abort(); /* a valid encoding must decode to itself */
        }
        break;
    }
    case 1: { /* packed records (checkpoint payload / journal contents) */
        static struct rb_slot slots[NSLOTS];
        memset(slots, 0, sizeof(slots));
        uint32_t nrec = size ? data[0] : 0;
        int64_t n = rb_apply_all(slots, NSLOTS, data, size, nrec);
        if (n > (int64_t)nrec)
            abort();
        for (int i = 0; i < NSLOTS; i++)
            if (slots[i].used && (slots[i].key.hash_len == 0 || slots[i].key.hash_len > 32))
                abort();
        break;
    }
    case 2: { /* journal block header */
        uint8_t blk[4096] = {0};
        memcpy(blk, data, size < sizeof(blk) ? size : sizeof(blk));
        uint32_t nrec, used;
        if (rb_jblk_check(blk, sizeof(blk), 1, 0, &nrec, &used) == 0 &&
            used > sizeof(blk) - RB_JBLK_HDR)
            abort();
        /* sealed: the records behind a valid header */
        uint32_t u = size > RB_JBLK_HDR ? (uint32_t)(size - RB_JBLK_HDR) : 0;
        if (u > sizeof(blk) - RB_JBLK_HDR)
            u = sizeof(blk) - RB_JBLK_HDR;
        rb_jblk_seal(blk, sizeof(blk), 7, 3, size ? data[0] : 0, u);
        if (rb_jblk_check(blk, sizeof(blk), 7, 3, &nrec, &used) != 0 || used != u)
            abort();
        static struct rb_slot slots[NSLOTS];
        rb_apply_all(slots, NSLOTS, blk + RB_JBLK_HDR, used, nrec);
        break;
    }
    default: { /* slot trailer */
        uint8_t t[RB_TRAILER] = {0};
        memcpy(t, data, size < sizeof(t) ? size : sizeof(t));
        struct rb_trailer tr;
        rb_trailer_decode(t, &tr);
        break;
    }
    }
    return 0;
}
