/*
 * Description: raw_block metadata formats: CRC-32 vector, record and
 * journal-block round trips and rejections, checkpoint headers (foreign
 * magic, other format, damaged CRC), a torn newest checkpoint falling back
 * to the older copy, and journal replay stopping at the first gap.
 */
#include "l2/raw_block/raw_block.h"
#include "test.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>

static uint32_t ns_of(const char *model, const char *salt)
{
    uint32_t ns;
    TEST_ASSERT(kvt_ns_intern(model, strlen(model), salt, strlen(salt), &ns, NULL) == 0);
    return ns;
}

static struct rb_rec put(uint32_t slot, uint64_t gen, const char *model, const char *salt)
{
    struct rb_rec r = {.op = RB_PUT,
                       .slot = slot,
                       .gen = gen,
                       .len = 100 + slot,
                       .plen = 100 + slot,
                       .xxh3 = gen * 7};
    uint8_t h[32];
    memset(h, (int)slot, sizeof(h));
    kvt_key_make(&r.key, ns_of(model, salt), h, 32, 0x01010000u, 3);
    return r;
}

static void test_crc(void)
{
    TEST_ASSERT(rb_crc32(0, "123456789", 9) == 0xCBF43926u);
    TEST_ASSERT(rb_crc32(0, "", 0) == 0);
    /* incremental = one shot */
    TEST_ASSERT(rb_crc32(rb_crc32(0, "1234", 4), "56789", 5) == 0xCBF43926u);
}

static void test_records(void)
{
    uint8_t buf[1024];
    struct rb_rec a = put(7, 42, "meta-llama/Llama-3", "tenant-a"), b;
    size_t n = rb_rec_encode(&a, buf), used = 0;
    TEST_ASSERT(n == rb_rec_size(&a));
    TEST_ASSERT(rb_rec_decode(buf, n, &b, &used) == 0 && used == n);
    TEST_ASSERT(b.op == RB_PUT && b.slot == 7 && b.gen == 42 && b.len == 107 && b.xxh3 == 294);
    TEST_ASSERT(kvt_key_eq(&a.key, &b.key));
    TEST_ASSERT(rb_rec_decode(buf, n - 1, &b, &used) == -EINVAL); /* truncated */
    buf[2] = 9;                                                   /* unknown op */
    TEST_ASSERT(rb_rec_decode(buf, n, &b, &used) == -EINVAL);
    struct rb_rec d = {.op = RB_DEL, .slot = 7, .gen = 42};
    n = rb_rec_encode(&d, buf);
    TEST_ASSERT(rb_rec_decode(buf, n, &b, &used) == 0 && b.op == RB_DEL && b.gen == 42);

    /* apply: DEL only removes the matching generation */
    struct rb_slot slots[8] = {0};
    rb_apply(slots, 8, &a);
    TEST_ASSERT(slots[7].used && slots[7].gen == 42);
    struct rb_rec stale = {.op = RB_DEL, .slot = 7, .gen = 41};
    rb_apply(slots, 8, &stale);
    TEST_ASSERT(slots[7].used);
    rb_apply(slots, 8, &d);
    TEST_ASSERT(!slots[7].used);
    struct rb_rec far = put(9, 1, "m", "");
    rb_apply(slots, 8, &far); /* beyond the table: ignored */
}

static void test_jblock(void)
{
    uint8_t blk[4096];
    struct rb_rec a = put(1, 5, "m", "");
    size_t n = rb_rec_encode(&a, blk + RB_JBLK_HDR);
    rb_jblk_seal(blk, sizeof(blk), 0xabc, 17, 1, (uint32_t)n);
    uint32_t nrec, used;
    TEST_ASSERT(rb_jblk_check(blk, sizeof(blk), 0xabc, 17, &nrec, &used) == 0);
    TEST_ASSERT(nrec == 1 && used == n);
    TEST_ASSERT(rb_jblk_check(blk, sizeof(blk), 0xabd, 17, &nrec, &used) == -ENOENT);
    TEST_ASSERT(rb_jblk_check(blk, sizeof(blk), 0xabc, 18, &nrec, &used) == -ENOENT);
    blk[RB_JBLK_HDR + 5] ^= 1;
    TEST_ASSERT(rb_jblk_check(blk, sizeof(blk), 0xabc, 17, &nrec, &used) == -EBADMSG);
}

static void test_ckpt_header(void)
{
    uint8_t blk[4096];
    struct rb_ckpt_hdr h = {.version = 1,
                            .seq = 9,
                            .instance = 77,
                            .payload_len = 10,
                            .block = 4096,
                            .header_bytes = 4096,
                            .slot_bytes = 1 << 20},
                       o;
    memcpy(h.magic, "LMCIDX01", 8);
    rb_ckpt_hdr_encode(&h, blk, sizeof(blk));
    TEST_ASSERT(rb_ckpt_hdr_decode(blk, sizeof(blk), "LMCIDX01", 1, &o) == 0);
    TEST_ASSERT(o.seq == 9 && o.instance == 77 && o.slot_bytes == 1 << 20);
    TEST_ASSERT(rb_ckpt_hdr_decode(blk, sizeof(blk), "OTHERMAG", 1, &o) == -ENOENT);
    TEST_ASSERT(rb_ckpt_hdr_decode(blk, sizeof(blk), "LMCIDX01", 2, &o) == -EPROTO);
    blk[30] ^= 1;
    TEST_ASSERT(rb_ckpt_hdr_decode(blk, sizeof(blk), "LMCIDX01", 1, &o) == -EBADMSG);
    /* LMCache's own checkpoint under the same magic: another format */
    memset(blk, 0, sizeof(blk));
    memcpy(blk, "LMCIDX01", 8);
    TEST_ASSERT(rb_ckpt_hdr_decode(blk, sizeof(blk), "LMCIDX01", 1, &o) == -EPROTO);
}

static void test_geometry(void)
{
    struct rb_geom g;
    char err[256];
    TEST_ASSERT(rb_geom_init(&g, 64 << 20, 4096, 4096, 1 << 20, 8 * 4096, err, sizeof(err)) ==
                -EINVAL);
    TEST_ASSERT(strstr(err, "at least 16"));
    TEST_ASSERT(rb_geom_init(&g, 1 << 20, 4096, 4096, 1 << 20, 1 << 20, err, sizeof(err)) ==
                -EINVAL);
    TEST_ASSERT(strstr(err, "not enough"));
    TEST_ASSERT(rb_geom_init(&g, 65 << 20, 4096, 4096, 1 << 20, 1 << 20, err, sizeof(err)) == 0);
    TEST_ASSERT(g.nslots == 64 && g.jrnl_blocks == 64 && g.ckpt_bytes == 96 * 4096);
    TEST_ASSERT(g.jrnl_off + (uint64_t)g.jrnl_blocks * 4096 <= g.data_off);
}

/* Checkpoints and journal on a real file. */
static void test_recovery_io(void)
{
    char path[] = "/tmp/kvt-test-rbmeta-XXXXXX";
    int fd = mkstemp(path);
    TEST_ASSERT(fd >= 0);
    struct rb_geom g;
    char err[256];
    TEST_ASSERT(rb_geom_init(&g, 9 << 20, 4096, 4096, 1 << 20, 1 << 20, err, sizeof(err)) == 0);
    TEST_ASSERT(ftruncate(fd, 9 << 20) == 0);
    struct rb_slot *slots = calloc(g.nslots, sizeof(*slots));
    struct rb_ckpt_hdr h = {.version = 1,
                            .instance = 5,
                            .block = g.block,
                            .header_bytes = g.header_bytes,
                            .slot_bytes = g.slot_bytes,
                            .meta_total = g.meta_total,
                            .data_off = g.data_off,
                            .nslots = g.nslots},
                       got;
    memcpy(h.magic, "LMCIDX01", 8);
    int copy = -1;
    TEST_ASSERT(rb_read_checkpoint(fd, &g, "LMCIDX01", 1, slots, &got, &copy) == -ENOENT);

    /* checkpoint 1 (copy 1): slots 0,1; checkpoint 2 (copy 0): slots 0,1,2 */
    struct rb_rec r0 = put(0, 1, "m", ""), r1 = put(1, 2, "m", ""), r2 = put(2, 3, "m", "s");
    rb_apply(slots, g.nslots, &r0);
    rb_apply(slots, g.nslots, &r1);
    uint8_t *pay;
    uint32_t nrec;
    uint64_t len = rb_serialize(slots, g.nslots, g.block, &pay, &nrec);
    h.seq = 1, h.payload_len = len, h.payload_crc = rb_crc32(0, pay, len), h.nrec = nrec;
    h.jstart = 0;
    TEST_ASSERT(rb_write_checkpoint(fd, &g, &h, pay, len, 1) == 0);
    free(pay);
    rb_apply(slots, g.nslots, &r2);
    len = rb_serialize(slots, g.nslots, g.block, &pay, &nrec);
    h.seq = 2, h.payload_len = len, h.payload_crc = rb_crc32(0, pay, len), h.nrec = nrec;
    h.jstart = 3;
    TEST_ASSERT(rb_write_checkpoint(fd, &g, &h, pay, len, 0) == 0);
    free(pay);
    memset(slots, 0, g.nslots * sizeof(*slots));
    TEST_ASSERT(rb_read_checkpoint(fd, &g, "LMCIDX01", 1, slots, &got, &copy) == 0);
    TEST_ASSERT(got.seq == 2 && copy == 0 && slots[2].used && got.jstart == 3);

    /* tear the newest payload: the older copy is used */
    uint8_t junk[16] = {1, 2, 3};
    TEST_ASSERT(pwrite(fd, junk, sizeof(junk), g.block + 10) == sizeof(junk));
    memset(slots, 0, g.nslots * sizeof(*slots));
    TEST_ASSERT(rb_read_checkpoint(fd, &g, "LMCIDX01", 1, slots, &got, &copy) == 0);
    TEST_ASSERT(got.seq == 1 && copy == 1 && slots[0].used && slots[1].used && !slots[2].used);

    /* another geometry is reported, not loaded */
    struct rb_geom g2 = g;
    g2.slot_bytes = 2 << 20;
    TEST_ASSERT(rb_read_checkpoint(fd, &g2, "LMCIDX01", 1, slots, &got, &copy) == -ESTALE);

    /* journal: blocks 0,1,2 valid, 3 missing, 4 valid: replay stops at 3 */
    uint8_t *blk = NULL;
    TEST_ASSERT(posix_memalign((void **)&blk, 4096, 4096) == 0);
    for (uint64_t b = 0; b < 5; b++) {
        if (b == 3)
            continue;
        struct rb_rec r = put((uint32_t)(3 + b), 10 + b, "m", "");
        size_t n = rb_rec_encode(&r, blk + RB_JBLK_HDR);
        struct rb_rec d = {.op = RB_DEL, .slot = 0, .gen = 1};
        size_t n2 = b == 1 ? rb_rec_encode(&d, blk + RB_JBLK_HDR + n) : 0;
        rb_jblk_seal(blk, 4096, 5, b, b == 1 ? 2 : 1, (uint32_t)(n + n2));
        TEST_ASSERT(pwrite(fd, blk, 4096, g.jrnl_off + b * 4096) == 4096);
    }
    free(blk);
    memset(slots, 0, g.nslots * sizeof(*slots));
    rb_apply(slots, g.nslots, &r0);
    uint64_t next = 0, nrecs = 0, maxgen = 0;
    TEST_ASSERT(rb_replay_journal(fd, &g, 5, 0, slots, &next, &nrecs, &maxgen) == 0);
    TEST_ASSERT(next == 3 && nrecs == 4 && maxgen == 12);
    TEST_ASSERT(!slots[0].used && slots[3].used && slots[4].used && slots[5].used &&
                !slots[7].used);
    /* another instance's journal is not replayed */
    TEST_ASSERT(rb_replay_journal(fd, &g, 6, 0, slots, &next, &nrecs, &maxgen) == 0 && next == 0 &&
                nrecs == 0);
    free(slots);
    close(fd);
    unlink(path);
}

int main(void)
{
    RUN(test_crc);
    RUN(test_records);
    RUN(test_jblock);
    RUN(test_ckpt_header);
    RUN(test_geometry);
    RUN(test_recovery_io);
    return TEST_RESULT();
}
