/*
 * raw_block on-device formats (private to raw_block*.c and its tests).
 *
 * Device layout (all offsets multiples of block_align):
 *
 *   [0, ckpt_bytes)                 checkpoint copy 0
 *   [ckpt_bytes, 2*ckpt_bytes)      checkpoint copy 1
 *   [jrnl_off, +jrnl_blocks*block)  journal ring
 *   [data_off = meta_total_bytes, ...)  nslots slots of slot_bytes
 *
 * Slot = header area (header_bytes) + payload. The header area holds the
 * object header (objfmt.h, 512 bytes, identity + lengths + checksum) at 0
 * and a slot trailer in its last 64 bytes (slot number, generation,
 * payload length and checksum, instance; CRC). A slot is only trusted when
 * both agree with the index entry that points at it.
 *
 * Index changes are journal records (PUT slot/gen/key/lengths/checksum,
 * DEL slot/gen) packed into journal blocks; a block is
 *   [magic "KVTRBJL1" | instance u64 | bseq u64 | nrec u32 | used u32 |
 *    crc32 u32 | pad to 64] + records
 * and lives at ring position bseq % jrnl_blocks. A checkpoint copy is one
 * header block
 *   [meta_magic 8 | "KVTRBCP1" | meta_version u32 | hdr crc32 u32 | seq u64 |
 *    instance u64 | payload_len u64 | payload crc32 u32 | nrec u32 |
 *    jstart u64 | next_gen u64 | block u32 | header_bytes u32 |
 *    slot_bytes u64 | meta_total u64 | data_off u64 | nslots u32]
 * followed by payload_len bytes of PUT records. Copies alternate (seq % 2);
 * recovery takes the valid copy with the highest seq, then replays journal
 * blocks jstart, jstart+1, ... while magic, instance, bseq and CRC match.
 * All integers little-endian.
 */
#ifndef KVT_L2_RAW_BLOCK_H
#define KVT_L2_RAW_BLOCK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include "key/key.h"
#include "l2/kit/slot.h"

struct kvt_cfg;
struct kvt_l2_spec;

/* raw_block's options (raw_block_cfg.c parses them, raw_block.c opens) */
struct kvt_raw_block_opts {
    const char *device_path;
    uint64_t slot_bytes, capacity_bytes, meta_total_bytes, max_xfer;
    uint32_t block_align, header_bytes, meta_version;
    const char *meta_magic;
    uint32_t ckpt_interval_s, idle_quiet_ms;
    bool use_odirect, periodic, load_checkpoint, verify_on_load, zero_copy, durable;
    bool format_force; /* "format": "force": may format a device holding foreign data */
    int io_engine, queue_depth;
    int num_store_workers, num_lookup_workers, num_load_workers;
};
int kvt_raw_block_parse(struct kvt_cfg *c, void *opts);
/* kvt_l2_adapter_desc.storage: the device or file device_path. */
const char *kvt_raw_block_storage(const void *opts, const char **field, bool *is_dir);
/* The host checks of --dry-run and the start (kvt_l2_adapter_desc.check):
 * the path's kind, device state, size and layout, content
 * (raw_block_probe.c). */
int kvt_raw_block_check(const struct kvt_l2_spec *spec, const void *opts, const char **field,
                        char *msg, size_t cap);

#define RB_JBLK_MAGIC "KVTRBJL1"
#define RB_CKPT_FORMAT "KVTRBCP1"
#define RB_JBLK_HDR 64u
#define RB_MIN_HEADER 1024u /* objhdr (512) + trailer (64), block rounded */
#define RB_REC_MAX (48 + KVT_HASH_MAX + KVT_MODEL_MAX + KVT_SALT_MAX)

enum { RB_PUT = 1, RB_DEL = 2 };

struct rb_geom {
    uint32_t block;
    uint32_t header_bytes;
    uint64_t slot_bytes;
    uint64_t meta_total;
    uint64_t ckpt_bytes; /* per copy, header block included */
    uint64_t jrnl_off;
    uint32_t jrnl_blocks;
    uint64_t data_off;
    uint32_t nslots;
};

/* Lay out a device of `usable` bytes. Returns 0 or -EINVAL with a message
 * (meta area too small for two checkpoint copies and a journal, no room for
 * a slot). */
int rb_geom_init(struct rb_geom *g, uint64_t usable, uint32_t block, uint32_t header_bytes,
                 uint64_t slot_bytes, uint64_t meta_total, char *err, size_t errcap);
static inline uint64_t rb_slot_off(const struct rb_geom *g, uint32_t slot)
{
    return g->data_off + (uint64_t)slot * g->slot_bytes;
}

/* A journal or checkpoint record. */
struct rb_rec {
    uint8_t op; /* RB_PUT / RB_DEL */
    uint32_t slot;
    uint64_t gen;
    uint32_t len;  /* PUT: logical length */
    uint32_t plen; /* PUT: stored payload bytes */
    uint64_t xxh3; /* PUT: payload checksum */
    kvt_key key;   /* PUT */
};

size_t rb_rec_size(const struct rb_rec *r);
/* Encode into out (rb_rec_size bytes). Returns the size. */
size_t rb_rec_encode(const struct rb_rec *r, uint8_t *out);
/* Decode one record from avail bytes (interning its namespace). Returns 0
 * and *used, or -EINVAL for a malformed record. */
int rb_rec_decode(const uint8_t *p, size_t avail, struct rb_rec *r, size_t *used);

/* Journal blocks. seal writes the header (crc over header and records). */
void rb_jblk_seal(uint8_t *blk, uint32_t blksz, uint64_t instance, uint64_t bseq, uint32_t nrec,
                  uint32_t used);
/* 0 when blk is the journal block bseq of instance; fills nrec/used. */
int rb_jblk_check(const uint8_t *blk, uint32_t blksz, uint64_t instance, uint64_t bseq,
                  uint32_t *nrec, uint32_t *used);

struct rb_ckpt_hdr {
    char magic[8];
    uint32_t version;
    uint64_t seq;
    uint64_t instance;
    uint64_t payload_len;
    uint32_t payload_crc;
    uint32_t nrec;
    uint64_t jstart;
    uint64_t next_gen;
    /* geometry it was written for */
    uint32_t block, header_bytes;
    uint64_t slot_bytes, meta_total, data_off;
    uint32_t nslots;
};

void rb_ckpt_hdr_encode(const struct rb_ckpt_hdr *h, uint8_t *blk, uint32_t blksz);
/* Decode a header block. Returns 0, -ENOENT when it does not carry
 * meta_magic at all (empty or foreign device), -EPROTO when it carries
 * meta_magic in another format or version, -EBADMSG when its CRC fails. */
int rb_ckpt_hdr_decode(const uint8_t *blk, uint32_t blksz, const char *magic, uint32_t version,
                       struct rb_ckpt_hdr *h);
/* Does the header describe this geometry? */
bool rb_ckpt_geom_matches(const struct rb_ckpt_hdr *h, const struct rb_geom *g);

/* Apply records to a slot table: slots[s] gets PUTs, DEL clears a slot
 * whose generation matches. A PUT for a slot beyond nslots is ignored. */
struct rb_slot {
    kvt_key key;
    uint64_t gen;
    uint64_t xxh3;
    uint32_t len, plen;
    uint32_t used; /* 1 = holds an object */
    uint32_t pad;
};
void rb_apply(struct rb_slot *slots, uint32_t nslots, const struct rb_rec *r);

/* Parse a buffer of packed records and apply each; returns the number
 * applied or -EINVAL at the first malformed one. */
int64_t rb_apply_all(struct rb_slot *slots, uint32_t nslots, const uint8_t *p, size_t len,
                     uint32_t nrec);

/*
 * Recovery from a device fd (buffers are block aligned: O_DIRECT safe).
 *
 * rb_read_checkpoint: read both copies, pick the valid one with the highest
 * seq (falling back to the other when its payload CRC fails), fill slots.
 * Returns 0 (found: *h filled), -ENOENT (no checkpoint of this magic:
 * a fresh device), -EPROTO (another format or version under this magic),
 * -ESTALE (written for another geometry: *h filled), or -errno.
 *
 * rb_replay_journal: apply blocks jstart, jstart+1, ... while valid; sets
 * *next_bseq to the first block that is not, *nrecs to records applied,
 * and raises *max_gen to the highest generation seen.
 */
int rb_read_checkpoint(int fd, const struct rb_geom *g, const char *magic, uint32_t version,
                       struct rb_slot *slots, struct rb_ckpt_hdr *h, int *copy);
int rb_replay_journal(int fd, const struct rb_geom *g, uint64_t instance, uint64_t jstart,
                      struct rb_slot *slots, uint64_t *next_bseq, uint64_t *nrecs,
                      uint64_t *max_gen);
/* Serialize the used slots as PUT records into a new block-aligned,
 * block-padded buffer; returns the payload length (0 when empty; UINT64_MAX
 * when out of memory), *nrec the count. */
uint64_t rb_serialize(const struct rb_slot *slots, uint32_t nslots, uint32_t block, uint8_t **out,
                      uint32_t *nrec);
/* Write a checkpoint copy: payload first, then (after fdatasync) the header
 * block, so a torn write leaves the old header failing its payload CRC.
 * Returns 0, -EFBIG when the payload does not fit the copy, or -errno. */
int rb_write_checkpoint(int fd, const struct rb_geom *g, const struct rb_ckpt_hdr *h,
                        const uint8_t *payload, uint64_t payload_len, int copy);

/*
 * Device checks (raw_block_probe.c), run by open and by --dry-run alike.
 *
 * rb_in_use: 0, or -EBUSY with a message naming the use (mounted, swap,
 *   held by device-mapper or RAID, a partition in use, claimed by another
 *   program, a loop device's backing file, another kvtier server) and what
 *   to do. Nothing overrides it.
 * rb_content: what fd (read-only, buffered) holds: RB_CONTENT_OURS (this
 *   meta_magic at checkpoint copy 0 or copy 1, at copy1_off),
 *   RB_CONTENT_EMPTY (no libblkid signature and zeros where sampled) or
 *   RB_CONTENT_FOREIGN (what: what was found); or -errno.
 * rb_plan: what opening does with the device: the geometry (a slot is
 *   header_bytes + slot_bytes; a device formatted with slot_bytes as the
 *   whole slot keeps that layout: compat), start empty (fresh) or recover,
 *   wipe foreign signatures first ("format": "force"). An error (with
 *   *field, the key it concerns, and a message) for foreign content without
 *   force, a device too small, an index of another layout, format or
 *   version, or damaged headers (the last three unless
 *   load_checkpoint_on_init is false or format is force).
 * rb_wipe_signatures: erase what libblkid finds (wipefs -a), then fsync.
 * rb_dev_size: the size of a block device (BLKGETSIZE64) or file; refuses a
 *   block_align below the logical block size when O_DIRECT is on.
 */
enum { RB_CONTENT_EMPTY = 0, RB_CONTENT_OURS = 1, RB_CONTENT_FOREIGN = 2 };

struct rb_plan {
    struct rb_geom g;
    bool fresh;        /* format: no index to recover */
    bool wipe;         /* "format": "force" over foreign content */
    bool compat;       /* slots of slot_bytes, header included */
    char forced[400];  /* with wipe: what the device held */
    const char *field; /* the key an error concerns */
};

int rb_in_use(const char *path, char *msg, size_t cap);
int rb_content(int fd, uint64_t size, bool regular, const char *magic, uint64_t copy1_off,
               char *what, size_t cap);
int rb_plan(const struct kvt_raw_block_opts *o, int fd, uint64_t dev_size, uint64_t usable,
            bool regular, struct rb_plan *p, char *msg, size_t cap);
int rb_wipe_signatures(const char *path, char *err, size_t cap);
int rb_dev_size(int fd, const struct stat *st, const struct kvt_raw_block_opts *o, uint64_t *size,
                char *msg, size_t cap);

#endif
