/*
 * raw_block metadata: geometry, CRC32, journal records and blocks,
 * checkpoints, recovery reads. Pure functions over buffers and an fd; the
 * adapter (raw_block.c) owns locking and threads. Formats: raw_block.h.
 */
#include "l2/raw_block/raw_block.h"
#include "common/util.h"
#include "common/le.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---------------------------------------------------------- geometry */

int rb_geom_init(struct rb_geom *g, uint64_t usable, uint32_t block, uint32_t header_bytes,
                 uint64_t slot_bytes, uint64_t meta_total, char *err, size_t errcap)
{
    memset(g, 0, sizeof(*g));
    g->block = block;
    g->header_bytes = header_bytes;
    g->slot_bytes = slot_bytes;
    g->meta_total = meta_total;
    uint64_t mblocks = meta_total / block;
    if (mblocks < 16) {
        snprintf(err, errcap,
                 "meta_total_bytes %llu holds %llu blocks of %u: at least 16 are needed for "
                 "two checkpoint copies and a journal",
                 (unsigned long long)meta_total, (unsigned long long)mblocks, block);
        return -EINVAL;
    }
    uint64_t jb = KVT_MIN(KVT_MAX(mblocks / 4, 4), (uint64_t)UINT32_MAX);
    uint64_t cb = (mblocks - jb) / 2;
    g->ckpt_bytes = cb * block;
    g->jrnl_off = 2 * g->ckpt_bytes;
    g->jrnl_blocks = (uint32_t)jb;
    g->data_off = meta_total;
    if (usable < meta_total + slot_bytes) {
        snprintf(err, errcap,
                 "device has %llu usable bytes: not enough for meta_total_bytes %llu plus one "
                 "slot of %llu",
                 (unsigned long long)usable, (unsigned long long)meta_total,
                 (unsigned long long)slot_bytes);
        return -EINVAL;
    }
    uint64_t n = (usable - meta_total) / slot_bytes;
    g->nslots = (uint32_t)KVT_MIN(n, (uint64_t)UINT32_MAX - 1);
    return 0;
}

/* ----------------------------------------------------------- records */

#define REC_FIXED_DEL 16 /* size u16, op u8, hash_len u8, slot u32, gen u64 */
#define REC_FIXED_PUT (REC_FIXED_DEL + 28)

size_t rb_rec_size(const struct rb_rec *r)
{
    if (r->op == RB_DEL)
        return REC_FIXED_DEL;
    return REC_FIXED_PUT + r->key.hash_len + strlen(kvt_ns_model(r->key.ns)) +
           strlen(kvt_ns_salt(r->key.ns));
}

size_t rb_rec_encode(const struct rb_rec *r, uint8_t *out)
{
    size_t n = rb_rec_size(r);
    kvt_put16(out, (uint16_t)n);
    out[2] = r->op;
    out[3] = r->op == RB_PUT ? r->key.hash_len : 0;
    kvt_put32(out + 4, r->slot);
    kvt_put64(out + 8, r->gen);
    if (r->op == RB_DEL)
        return n;
    const char *m = kvt_ns_model(r->key.ns), *s = kvt_ns_salt(r->key.ns);
    size_t ml = strlen(m), sl = strlen(s);
    kvt_put32(out + 16, r->len);
    kvt_put32(out + 20, r->plen);
    kvt_put64(out + 24, r->xxh3);
    kvt_put32(out + 32, r->key.kv_rank);
    kvt_put32(out + 36, r->key.group);
    kvt_put16(out + 40, (uint16_t)ml);
    kvt_put16(out + 42, (uint16_t)sl);
    uint8_t *p = out + REC_FIXED_PUT;
    memcpy(p, r->key.hash, r->key.hash_len);
    p += r->key.hash_len;
    memcpy(p, m, ml);
    memcpy(p + ml, s, sl);
    return n;
}

int rb_rec_decode(const uint8_t *p, size_t avail, struct rb_rec *r, size_t *used)
{
    if (avail < REC_FIXED_DEL)
        return -EINVAL;
    size_t n = kvt_get16(p);
    if (n < REC_FIXED_DEL || n > avail)
        return -EINVAL;
    memset(r, 0, sizeof(*r));
    r->op = p[2];
    r->slot = kvt_get32(p + 4);
    r->gen = kvt_get64(p + 8);
    if (r->op == RB_DEL) {
        if (n != REC_FIXED_DEL)
            return -EINVAL;
        *used = n;
        return 0;
    }
    if (r->op != RB_PUT || n < REC_FIXED_PUT)
        return -EINVAL;
    size_t hl = p[3], ml = kvt_get16(p + 40), sl = kvt_get16(p + 42);
    if (hl == 0 || hl > KVT_HASH_MAX || ml > KVT_MODEL_MAX || sl > KVT_SALT_MAX ||
        REC_FIXED_PUT + hl + ml + sl != n)
        return -EINVAL;
    r->len = kvt_get32(p + 16);
    r->plen = kvt_get32(p + 20);
    r->xxh3 = kvt_get64(p + 24);
    const uint8_t *q = p + REC_FIXED_PUT;
    uint32_t ns;
    if (kvt_ns_intern((const char *)q + hl, ml, (const char *)q + hl + ml, sl, &ns, NULL) ||
        kvt_key_make(&r->key, ns, q, hl, kvt_get32(p + 32), kvt_get32(p + 36)))
        return -EINVAL;
    *used = n;
    return 0;
}

void rb_apply(struct rb_slot *slots, uint32_t nslots, const struct rb_rec *r)
{
    if (r->slot >= nslots)
        return;
    struct rb_slot *s = &slots[r->slot];
    if (r->op == RB_PUT) {
        s->key = r->key;
        s->gen = r->gen;
        s->xxh3 = r->xxh3;
        s->len = r->len;
        s->plen = r->plen;
        s->used = 1;
    } else if (s->used && s->gen == r->gen) {
        s->used = 0;
    }
}

int64_t rb_apply_all(struct rb_slot *slots, uint32_t nslots, const uint8_t *p, size_t len,
                     uint32_t nrec)
{
    size_t at = 0;
    int64_t n = 0;
    for (uint32_t i = 0; i < nrec; i++) {
        struct rb_rec r;
        size_t used;
        if (rb_rec_decode(p + at, len - at, &r, &used))
            return -EINVAL;
        rb_apply(slots, nslots, &r);
        at += used;
        n++;
    }
    return n;
}

/* ---------------------------------------------------- journal blocks */

static uint32_t jblk_crc(const uint8_t *blk, uint32_t used)
{
    uint8_t h[RB_JBLK_HDR];
    memcpy(h, blk, RB_JBLK_HDR);
    kvt_put32(h + 32, 0);
    uint32_t c = rb_crc32(0, h, RB_JBLK_HDR);
    return rb_crc32(c, blk + RB_JBLK_HDR, used);
}

void rb_jblk_seal(uint8_t *blk, uint32_t blksz, uint64_t instance, uint64_t bseq, uint32_t nrec,
                  uint32_t used)
{
    memset(blk, 0, RB_JBLK_HDR);
    memset(blk + RB_JBLK_HDR + used, 0, blksz - RB_JBLK_HDR - used);
    memcpy(blk, RB_JBLK_MAGIC, 8);
    kvt_put64(blk + 8, instance);
    kvt_put64(blk + 16, bseq);
    kvt_put32(blk + 24, nrec);
    kvt_put32(blk + 28, used);
    kvt_put32(blk + 32, jblk_crc(blk, used));
}

int rb_jblk_check(const uint8_t *blk, uint32_t blksz, uint64_t instance, uint64_t bseq,
                  uint32_t *nrec, uint32_t *used)
{
    if (memcmp(blk, RB_JBLK_MAGIC, 8) != 0 || kvt_get64(blk + 8) != instance ||
        kvt_get64(blk + 16) != bseq)
        return -ENOENT;
    uint32_t u = kvt_get32(blk + 28);
    if (u > blksz - RB_JBLK_HDR || kvt_get32(blk + 32) != jblk_crc(blk, u))
        return -EBADMSG;
    *nrec = kvt_get32(blk + 24);
    *used = u;
    return 0;
}

/* ------------------------------------------------------- checkpoints */

#define CK_CRC_OFF 20
#define CK_LEN 120

void rb_ckpt_hdr_encode(const struct rb_ckpt_hdr *h, uint8_t *blk, uint32_t blksz)
{
    memset(blk, 0, blksz);
    memcpy(blk, h->magic, 8);
    memcpy(blk + 8, RB_CKPT_FORMAT, 8);
    kvt_put32(blk + 16, h->version);
    kvt_put64(blk + 24, h->seq);
    kvt_put64(blk + 32, h->instance);
    kvt_put64(blk + 40, h->payload_len);
    kvt_put32(blk + 48, h->payload_crc);
    kvt_put32(blk + 52, h->nrec);
    kvt_put64(blk + 56, h->jstart);
    kvt_put64(blk + 64, h->next_gen);
    kvt_put32(blk + 72, h->block);
    kvt_put32(blk + 76, h->header_bytes);
    kvt_put64(blk + 80, h->slot_bytes);
    kvt_put64(blk + 88, h->meta_total);
    kvt_put64(blk + 96, h->data_off);
    kvt_put32(blk + 104, h->nslots);
    kvt_put32(blk + CK_CRC_OFF, rb_crc32(0, blk, CK_LEN));
}

int rb_ckpt_hdr_decode(const uint8_t *blk, uint32_t blksz, const char *magic, uint32_t version,
                       struct rb_ckpt_hdr *h)
{
    if (blksz < CK_LEN || memcmp(blk, magic, 8) != 0)
        return -ENOENT;
    if (memcmp(blk + 8, RB_CKPT_FORMAT, 8) != 0 || kvt_get32(blk + 16) != version)
        return -EPROTO;
    uint8_t tmp[CK_LEN];
    memcpy(tmp, blk, CK_LEN);
    kvt_put32(tmp + CK_CRC_OFF, 0);
    if (kvt_get32(blk + CK_CRC_OFF) != rb_crc32(0, tmp, CK_LEN))
        return -EBADMSG;
    memset(h, 0, sizeof(*h));
    memcpy(h->magic, blk, 8);
    h->version = kvt_get32(blk + 16);
    h->seq = kvt_get64(blk + 24);
    h->instance = kvt_get64(blk + 32);
    h->payload_len = kvt_get64(blk + 40);
    h->payload_crc = kvt_get32(blk + 48);
    h->nrec = kvt_get32(blk + 52);
    h->jstart = kvt_get64(blk + 56);
    h->next_gen = kvt_get64(blk + 64);
    h->block = kvt_get32(blk + 72);
    h->header_bytes = kvt_get32(blk + 76);
    h->slot_bytes = kvt_get64(blk + 80);
    h->meta_total = kvt_get64(blk + 88);
    h->data_off = kvt_get64(blk + 96);
    h->nslots = kvt_get32(blk + 104);
    return 0;
}

bool rb_ckpt_geom_matches(const struct rb_ckpt_hdr *h, const struct rb_geom *g)
{
    return h->block == g->block && h->header_bytes == g->header_bytes &&
           h->slot_bytes == g->slot_bytes && h->meta_total == g->meta_total &&
           h->data_off == g->data_off && h->nslots == g->nslots;
}

/* ----------------------------------------------------------- recovery */

/* kvt_xmemalign for the bulk buffers (checkpoint payloads, 1 MiB journal
 * chunks): NULL on OOM, which the callers report as -ENOMEM (util.h's rule
 * for bulk buffers). One-block buffers use kvt_xmemalign. */
static void *memalign_zeroed_or_null(size_t align, size_t n)
{
    void *p = NULL;
    if (posix_memalign(&p, align, n ? n : align))
        return NULL;
    memset(p, 0, n ? n : align);
    return p;
}

static int read_payload(int fd, const struct rb_geom *g, const struct rb_ckpt_hdr *h, int copy,
                        uint8_t **out)
{
    uint64_t len = KVT_ALIGN_UP(h->payload_len, g->block);
    if (h->payload_len > g->ckpt_bytes - g->block)
        return -EBADMSG;
    uint8_t *p = memalign_zeroed_or_null(g->block, len);
    if (!p)
        return -ENOMEM;
    int rc = len ? kvt_pread_all(fd, p, len, (uint64_t)copy * g->ckpt_bytes + g->block, NULL) : 0;
    if (rc) {
        free(p);
        return rc;
    }
    if (rb_crc32(0, p, h->payload_len) != h->payload_crc) {
        free(p);
        return -EBADMSG;
    }
    *out = p;
    return 0;
}

int rb_read_checkpoint(int fd, const struct rb_geom *g, const char *magic, uint32_t version,
                       struct rb_slot *slots, struct rb_ckpt_hdr *out, int *copy_out)
{
    struct rb_ckpt_hdr h[2];
    int rc[2];
    uint8_t *blk = kvt_xmemalign(g->block, g->block);
    for (int c = 0; c < 2; c++) {
        int r = kvt_pread_all(fd, blk, g->block, (uint64_t)c * g->ckpt_bytes, NULL);
        rc[c] = r ? r : rb_ckpt_hdr_decode(blk, g->block, magic, version, &h[c]);
    }
    free(blk);
    /* valid headers, newest first */
    int order[2], n = 0;
    if (rc[0] == 0)
        order[n++] = 0;
    if (rc[1] == 0) {
        if (n && h[1].seq > h[0].seq) {
            order[1] = order[0];
            order[0] = 1;
            n++;
        } else {
            order[n++] = 1;
        }
    }
    int last = rc[0] == -EPROTO || rc[1] == -EPROTO     ? -EPROTO
               : rc[0] == -EBADMSG || rc[1] == -EBADMSG ? -EBADMSG
               : rc[0] == -ENOENT && rc[1] == -ENOENT   ? -ENOENT
                                                        : (rc[0] ? rc[0] : rc[1]);
    for (int k = 0; k < n; k++) {
        int c = order[k];
        if (!rb_ckpt_geom_matches(&h[c], g)) {
            *out = h[c];
            return -ESTALE;
        }
        uint8_t *pay = NULL;
        int r = read_payload(fd, g, &h[c], c, &pay);
        if (r) {
            last = r == -EBADMSG ? -EBADMSG : r; /* torn copy: try the other one */
            continue;
        }
        memset(slots, 0, (size_t)g->nslots * sizeof(*slots));
        int64_t m = rb_apply_all(slots, g->nslots, pay, h[c].payload_len, h[c].nrec);
        free(pay);
        if (m < 0) {
            last = -EBADMSG;
            continue;
        }
        *out = h[c];
        *copy_out = c;
        return 0;
    }
    return last;
}

int rb_replay_journal(int fd, const struct rb_geom *g, uint64_t instance, uint64_t jstart,
                      struct rb_slot *slots, uint64_t *next_bseq, uint64_t *nrecs,
                      uint64_t *max_gen)
{
    /* read the ring in chunks of up to 1 MiB, in bseq order from jstart */
    uint32_t chunk = (uint32_t)KVT_MAX(1u, (1u << 20) / g->block);
    uint8_t *buf = memalign_zeroed_or_null(g->block, (size_t)chunk * g->block);
    if (!buf)
        return -ENOMEM;
    uint64_t bseq = jstart, applied = 0;
    int rc = 0;
    bool end = false;
    while (!end && bseq - jstart < g->jrnl_blocks) {
        uint32_t pos = (uint32_t)(bseq % g->jrnl_blocks);
        uint32_t n = KVT_MIN(chunk, g->jrnl_blocks - pos);
        rc = kvt_pread_all(fd, buf, (size_t)n * g->block, g->jrnl_off + (uint64_t)pos * g->block,
                           NULL);
        if (rc)
            break;
        for (uint32_t k = 0; k < n && bseq - jstart < g->jrnl_blocks; k++, bseq++) {
            const uint8_t *blk = buf + (size_t)k * g->block;
            uint32_t nrec, used;
            if (rb_jblk_check(blk, g->block, instance, bseq, &nrec, &used)) {
                end = true;
                break;
            }
            size_t at = 0;
            for (uint32_t i = 0; i < nrec; i++) {
                struct rb_rec r;
                size_t u;
                if (rb_rec_decode(blk + RB_JBLK_HDR + at, used - at, &r, &u))
                    break; /* the CRC passed: cannot happen short of a bug */
                rb_apply(slots, g->nslots, &r);
                if (r.gen > *max_gen)
                    *max_gen = r.gen;
                at += u;
                applied++;
            }
        }
    }
    free(buf);
    *next_bseq = bseq;
    *nrecs = applied;
    return rc;
}

uint64_t rb_serialize(const struct rb_slot *slots, uint32_t nslots, uint32_t block, uint8_t **out,
                      uint32_t *nrec)
{
    uint64_t len = 0;
    uint32_t n = 0;
    for (uint32_t s = 0; s < nslots; s++) {
        if (!slots[s].used)
            continue;
        struct rb_rec r = {.op = RB_PUT, .slot = s, .key = slots[s].key};
        len += rb_rec_size(&r);
        n++;
    }
    uint8_t *p = memalign_zeroed_or_null(block, KVT_ALIGN_UP(len, block));
    if (!p) {
        *out = NULL;
        *nrec = 0;
        return UINT64_MAX;
    }
    uint64_t at = 0;
    for (uint32_t s = 0; s < nslots; s++) {
        if (!slots[s].used)
            continue;
        struct rb_rec r = {.op = RB_PUT,
                           .slot = s,
                           .gen = slots[s].gen,
                           .len = slots[s].len,
                           .plen = slots[s].plen,
                           .xxh3 = slots[s].xxh3,
                           .key = slots[s].key};
        at += rb_rec_encode(&r, p + at);
    }
    *out = p;
    *nrec = n;
    return len;
}

int rb_write_checkpoint(int fd, const struct rb_geom *g, const struct rb_ckpt_hdr *h,
                        const uint8_t *payload, uint64_t payload_len, int copy)
{
    if (payload_len > g->ckpt_bytes - g->block)
        return -EFBIG;
    uint64_t base = (uint64_t)copy * g->ckpt_bytes;
    uint64_t padded = KVT_ALIGN_UP(payload_len, g->block);
    int rc = padded ? kvt_pwrite_all(fd, payload, padded, base + g->block) : 0;
    if (!rc && fdatasync(fd) < 0)
        rc = -errno;
    if (rc)
        return rc;
    uint8_t *blk = kvt_xmemalign(g->block, g->block);
    rb_ckpt_hdr_encode(h, blk, g->block);
    rc = kvt_pwrite_all(fd, blk, g->block, base);
    free(blk);
    if (!rc && fdatasync(fd) < 0)
        rc = -errno;
    return rc;
}
