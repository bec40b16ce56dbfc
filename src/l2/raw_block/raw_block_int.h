/*
 * raw_block adapter internals shared by raw_block.c (removal, status,
 * open/close), raw_block_io.c (stores and loads), raw_block_start.c
 * (opening the device, recovery), raw_block_journal.c (journal and
 * checkpoints), raw_block_meta.c (records and checkpoint copies),
 * raw_block_probe.c (device checks) and raw_block_cfg.c (configuration).
 * Formats: raw_block.h.
 */
#ifndef KVT_L2_RAW_BLOCK_INT_H
#define KVT_L2_RAW_BLOCK_INT_H

#include "common/util.h"
#include "io/engine.h"
#include "io/tpool.h"
#include "l2/engine.h"
#include "l2/raw_block/raw_block.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

struct rb_jw { /* a journal waiter: called once its record is durable */
    struct rb_jw *next;
    void (*fn)(struct rb_jw *w, int rc);
};

struct rb_jblock {
    struct rb_jblock *next;
    uint8_t *buf;
    uint32_t used, nrec;
    uint64_t bseq;
    struct rb_jw *wh, *wt;
    struct kvt_io io;
    struct rb_engine *e;
};

enum rb_stage { ST_STORE, ST_LOAD, ST_LOAD_VERIFY };

struct rb_batch;

struct rb_op {
    struct kvt_job job;
    struct rb_jw jw;
    struct rb_batch *b;
    struct rb_op *putq_next; /* guarded by e->jlock */
    uint32_t i;
    uint8_t stage;
    uint32_t slot;
    uint64_t gen, xxh3;
    uint32_t plen;
    uint64_t direct_part; /* payload bytes moved straight from/to the caller */
    uint8_t *hdr;         /* header_bytes, aligned */
    uint8_t *bounce;      /* aligned copy of (part of) the payload */
    struct kvt_io *ios;
    uint32_t nios;
    _Atomic uint32_t ios_left;
    _Atomic int err;
};

struct rb_batch {
    kvt_l2 *l2;
    kvt_l2_task *t;
    _Atomic uint32_t left;
    struct rb_op ops[];
};

struct rb_engine {
    char *path;
    int fd;
    bool odirect, odirect_refused, zero_copy, verify, periodic, durable;
    uint32_t interval_s, quiet_ms;
    char magic[9];
    uint32_t version;
    uint64_t max_xfer; /* 0: no split */
    uint64_t dev_size, usable;
    bool blockdev;
    bool created; /* this start created the file (capacity_bytes) */
    struct rb_geom g;
    struct kvt_ioeng *io;
    struct kvt_tpool *spool, *lpool;
    int nstore, nlookup, nload;

    pthread_mutex_t jlock; /* guards everything from here to the next comment */
    struct rb_slot *slots;
    uint32_t *freev, nfree;
    uint64_t next_gen, instance;
    struct rb_jblock *cur, *sq_head, *sq_tail, *inflight;
    uint64_t jnext; /* bseq of the next block to seal */
    uint64_t jtail; /* first live block: jstart of the latest durable checkpoint */
    bool jblocked;  /* the ring is full: waiting for a checkpoint */
    uint64_t recs_since_ckpt, jwrites, jrecs;
    uint64_t last_change_ns, last_ckpt_ns;
    uint64_t ckpt_seq, ckpts, ckpt_bytes_last;
    uint32_t ckpt_nrec_last;
    char ckpt_err[256];
    bool fatal;
    char fatal_msg[256];
    /* fatal came from a journal write: a checkpoint of the slot table, taken
     * once every waiter of the failed write was told (jfail_cbs 0), holds
     * all the lost records said, and clears it */
    bool jrecover;
    uint32_t jfail_cbs;
    uint32_t *lost, nlost; /* slots of DELs whose record was lost: free after that checkpoint */
    uint64_t jrecoveries;
    bool ckpt_stop;
    pthread_cond_t ckpt_cond;
    pthread_cond_t jcond;                /* journal progress: block written */
    struct rb_op *putq_head, *putq_tail; /* PUTs waiting for journal room */
    uint64_t putq_n;

    pthread_t ckpt_thr, rec_thr;
    bool ckpt_started, rec_started;
    _Atomic bool stop;
    bool fresh;
    char recovered_from[160];
    _Atomic uint64_t verify_dropped, bounced, verify_failed;

    struct kvt_l2_park park; /* stores waiting for recovery */

    struct kvt_l2_drain drain; /* batches in flight */
};

/* ---- journal (raw_block_journal.c); "_locked": call with e->jlock held */
void rb_jappend_locked(struct rb_engine *e, const struct rb_rec *r, struct rb_jw *w);
void rb_jkick_locked(struct rb_engine *e);
bool rb_ring_tight_locked(struct rb_engine *e);
void rb_set_fatal_locked(struct rb_engine *e, const char *fmt, int rc);
struct rb_jw *rb_drop_pending_locked(struct rb_engine *e);
void rb_call_waiters(struct rb_jw *w, int rc);
void rb_journal_drain(struct rb_engine *e);
void *rb_ckpt_main(void *arg);
void rb_jblock_free(struct rb_jblock *b);

/* ---- task path (raw_block_io.c) */
/* Append the PUT record of an op whose slot write completed. */
void rb_put_append_locked(struct rb_engine *e, struct rb_op *op);
/* kvt_l2_ops.submit */
void rb_submit(kvt_l2 *l2, kvt_l2_task *t);

/* ---- start-up (raw_block_start.c); o: the parsed options */
/* Open device_path (creating a file of capacity_bytes), refusing one in
 * use; 0 or an error with the message in err. */
int rb_open_device(struct rb_engine *e, const struct kvt_raw_block_opts *o, char *err,
                   size_t errcap);
/* The layout: kvtier's own (recovered), empty (e->fresh: formatted), or
 * refused. */
int rb_plan_device(struct rb_engine *e, const struct kvt_raw_block_opts *o, char *err,
                   size_t errcap);
/* Write both checkpoint copies of an empty index. */
int rb_format_fresh(struct rb_engine *e);
/* The recovery thread (arg: the kvt_l2): checkpoint, journal, slots. */
void *rb_recover_main(void *arg);

#endif
