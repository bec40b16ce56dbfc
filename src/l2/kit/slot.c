/* Slot formats shared by raw_block and dax: see slot.h. */
#include "l2/kit/slot.h"
#include "common/le.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------- crc */

static uint32_t crc_table[8][256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = crc_table[t - 1][i] >> 8 ^ crc_table[0][crc_table[t - 1][i] & 0xff];
}

/* CRC-32 (IEEE 802.3, as zlib's crc32), slicing by 8. */
uint32_t rb_crc32(uint32_t crc, const void *buf, size_t n)
{
    pthread_once(&crc_once, crc_init);
    const uint8_t *p = buf;
    crc = ~crc;
    while (n >= 8) {
        uint32_t a = crc ^ kvt_get32(p), b = kvt_get32(p + 4);
        crc = crc_table[7][a & 0xff] ^ crc_table[6][(a >> 8) & 0xff] ^
              crc_table[5][(a >> 16) & 0xff] ^ crc_table[4][a >> 24] ^ crc_table[3][b & 0xff] ^
              crc_table[2][(b >> 8) & 0xff] ^ crc_table[1][(b >> 16) & 0xff] ^
              crc_table[0][b >> 24];
        p += 8;
        n -= 8;
    }
    while (n--)
        crc = crc_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return ~crc;
}

/* ------------------------------------------------------------ trailer */

void rb_trailer_encode(const struct rb_trailer *t, uint8_t *p)
{
    memset(p, 0, RB_TRAILER);
    memcpy(p, RB_TRAILER_MAGIC, 8);
    kvt_put32(p + 8, t->slot);
    kvt_put64(p + 16, t->gen);
    kvt_put64(p + 24, t->plen);
    kvt_put64(p + 32, t->xxh3);
    kvt_put64(p + 40, t->instance);
    kvt_put32(p + 60, rb_crc32(0, p, 60));
}

int rb_trailer_decode(const uint8_t *p, struct rb_trailer *t)
{
    if (memcmp(p, RB_TRAILER_MAGIC, 8) != 0 || kvt_get32(p + 60) != rb_crc32(0, p, 60))
        return -EBADMSG;
    t->slot = kvt_get32(p + 8);
    t->gen = kvt_get64(p + 16);
    t->plen = kvt_get64(p + 24);
    t->xxh3 = kvt_get64(p + 32);
    t->instance = kvt_get64(p + 40);
    return 0;
}

static int by_gen_desc(const void *a, const void *b)
{
    const struct rb_gen_slot *x = a, *y = b;
    return (x->gen < y->gen) - (x->gen > y->gen);
}

void rb_sort_newest_first(struct rb_gen_slot *v, size_t n)
{
    qsort(v, n, sizeof(*v), by_gen_desc);
}
