/*
 * raw_block journal and checkpoints: group-committed journal blocks (one
 * write in flight, records arriving meanwhile share the next block), the
 * ring reclaimed by checkpoints, the checkpoint thread, PUT gating when the
 * ring is 3/4 full. Rules in raw_block.c's top comment; formats in
 * raw_block.h. Locks: everything here runs under e->jlock except the
 * device writes of a checkpoint and the waiter callbacks.
 */
#include "common/log.h"
#include "common/util.h"
#include "kvtier/error.h"
#include "l2/raw_block/raw_block_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ----------------------------------------------------------- journal */

static void jwrite_done(struct kvt_io *io);

static struct rb_jblock *jblock_new(struct rb_engine *e)
{
    struct rb_jblock *b = kvt_xcalloc(1, sizeof(*b));
    b->buf = kvt_xmemalign(e->g.block, e->g.block);
    b->e = e;
    return b;
}

void rb_jblock_free(struct rb_jblock *b)
{
    free(b->buf);
    free(b);
}

/* call with jlock held */
static void seal_cur_locked(struct rb_engine *e)
{
    struct rb_jblock *b = e->cur;
    e->cur = NULL;
    b->bseq = e->jnext++;
    rb_jblk_seal(b->buf, e->g.block, e->instance, b->bseq, b->nrec, b->used);
    b->next = NULL;
    if (e->sq_tail)
        e->sq_tail->next = b;
    else
        e->sq_head = b;
    e->sq_tail = b;
}

/* Start the next block write if none is in flight. call with jlock held */
void rb_jkick_locked(struct rb_engine *e)
{
    if (e->inflight || e->fatal)
        return;
    if (!e->sq_head && e->cur && e->cur->nrec)
        seal_cur_locked(e);
    struct rb_jblock *b = e->sq_head;
    if (!b)
        return;
    /* a block sealed before the latest checkpoint (bseq < jtail) is below
     * the replay start: writing it is harmless (its records are in the
     * checkpoint) and its ring position cannot hold a newer block */
    if (b->bseq >= e->jtail && b->bseq - e->jtail >= e->g.jrnl_blocks) {
        /* the ring is full: the block would overwrite one a recovery still
         * needs; wait for a checkpoint to move the tail */
        if (!e->jblocked) {
            e->jblocked = true;
            pthread_cond_signal(&e->ckpt_cond);
        }
        return;
    }
    e->sq_head = b->next;
    if (!e->sq_head)
        e->sq_tail = NULL;
    b->next = NULL;
    e->inflight = b;
    e->jblocked = false;
    uint64_t off = e->g.jrnl_off + (b->bseq % e->g.jrnl_blocks) * (uint64_t)e->g.block;
    kvt_io_prep(&b->io, KVT_IO_WRITE, e->fd, off, jwrite_done, b);
    kvt_io_add(&b->io, b->buf, e->g.block);
    kvt_ioeng_submit(e->io, &b->io);
    /* nudge the checkpoint thread when the ring passes half full */
    if ((e->jnext - e->jtail) * 2 >= e->g.jrnl_blocks)
        pthread_cond_signal(&e->ckpt_cond);
}

/*
 * Append a record and its waiter, and apply the record to the slot table
 * (under the same lock, so a checkpoint snapshot and the journal position
 * it notes always agree). call with jlock held.
 */
void rb_jappend_locked(struct rb_engine *e, const struct rb_rec *r, struct rb_jw *w)
{
    size_t sz = rb_rec_size(r);
    if (e->cur && RB_JBLK_HDR + e->cur->used + sz > e->g.block)
        seal_cur_locked(e);
    if (!e->cur)
        e->cur = jblock_new(e);
    struct rb_jblock *b = e->cur;
    rb_rec_encode(r, b->buf + RB_JBLK_HDR + b->used);
    b->used += (uint32_t)sz;
    b->nrec++;
    w->next = NULL;
    if (b->wt)
        b->wt->next = w;
    else
        b->wh = w;
    b->wt = w;
    rb_apply(e->slots, e->g.nslots, r);
    e->recs_since_ckpt++;
    e->jrecs++;
    e->last_change_ns = kvt_now_ns();
    rb_jkick_locked(e);
}

void rb_call_waiters(struct rb_jw *w, int rc)
{
    while (w) {
        struct rb_jw *nx = w->next;
        w->fn(w, rc);
        w = nx;
    }
}

/* Take every block not yet written (sealed and current) off the journal,
 * returning their waiters; the block sequence restarts at the first of
 * them so the on-device journal stays gap-free. call with jlock held */
struct rb_jw *rb_drop_pending_locked(struct rb_engine *e)
{
    struct rb_jw *all = NULL, **tail = &all;
    if (e->sq_head)
        e->jnext = KVT_MAX(e->sq_head->bseq, e->jtail);
    struct rb_jblock *b = e->sq_head;
    e->sq_head = e->sq_tail = NULL;
    if (e->cur) {
        e->cur->next = NULL;
        if (b) {
            struct rb_jblock *x = b;
            while (x->next)
                x = x->next;
            x->next = e->cur;
        } else {
            b = e->cur;
        }
        e->cur = NULL;
    }
    while (b) {
        struct rb_jblock *nx = b->next;
        if (b->wh) {
            *tail = b->wh;
            tail = &b->wt->next;
        }
        rb_jblock_free(b);
        b = nx;
    }
    e->jblocked = false;
    return all;
}

void rb_set_fatal_locked(struct rb_engine *e, const char *fmt, int rc)
{
    if (e->fatal)
        return;
    e->fatal = true;
    snprintf(e->fatal_msg, sizeof(e->fatal_msg), fmt, kvt_strerror(rc));
    kvt_error("raw_block %s: %s", e->path, e->fatal_msg);
}

static void jwrite_done(struct kvt_io *io)
{
    struct rb_jblock *b = io->udata;
    struct rb_engine *e = b->e;
    int rc = io->res < 0 ? io->res : (uint64_t)io->res == io->len ? 0 : -EIO;
    if (!rc && e->durable && io->op == KVT_IO_WRITE) {
        /* power-fail durability: fdatasync before anyone is told */
        kvt_io_prep(&b->io, KVT_IO_FSYNC, e->fd, 0, jwrite_done, b);
        kvt_ioeng_submit(e->io, &b->io);
        return;
    }
    struct rb_jw *failed = NULL;
    pthread_mutex_lock(&e->jlock);
    e->inflight = NULL;
    if (rc) {
        if (!e->fatal) /* not on top of a fatal error of another kind */
            e->jrecover = true;
        rb_set_fatal_locked(e,
                            "journal write failed (%s): stores are refused until a checkpoint "
                            "replaces the lost records (retried every second)",
                            rc);
        e->jfail_cbs++;
        failed = rb_drop_pending_locked(e);
    } else {
        e->jwrites++;
        rb_jkick_locked(e);
    }
    pthread_cond_broadcast(&e->jcond);
    pthread_mutex_unlock(&e->jlock);
    rb_call_waiters(b->wh, rc);
    rb_jblock_free(b);
    rb_call_waiters(failed, KVT_E_FATAL);
    if (rc) { /* every waiter knows: failed PUTs rolled back, lost DELs listed */
        pthread_mutex_lock(&e->jlock);
        e->jfail_cbs--;
        pthread_cond_signal(&e->ckpt_cond);
        pthread_mutex_unlock(&e->jlock);
    }
}

/* The recovery checkpoint is durable: the journal starts again after it. */
static void journal_recovered_locked(struct rb_engine *e)
{
    for (uint32_t i = 0; i < e->nlost; i++)
        e->freev[e->nfree++] = e->lost[i];
    e->nlost = 0;
    e->fatal = false;
    e->jrecover = false;
    e->fatal_msg[0] = 0;
    e->jrecoveries++;
    kvt_info("raw_block %s: journal recovered: checkpoint %llu holds what the failed write "
             "lost; stores resume",
             e->path, (unsigned long long)e->ckpt_seq);
    rb_jkick_locked(e);
    pthread_cond_broadcast(&e->jcond);
}

/* Is the ring 3/4 full? New objects then wait for a checkpoint (or are
 * refused while checkpoints fail); the last quarter is for deletes.
 * call with jlock held */
bool rb_ring_tight_locked(struct rb_engine *e)
{
    return (e->jnext - e->jtail) * 4 >= (uint64_t)e->g.jrnl_blocks * 3;
}

/* Append the PUTs that waited for room, while there is room. */
static void putq_drain_locked(struct rb_engine *e)
{
    while (e->putq_head && !rb_ring_tight_locked(e)) {
        struct rb_op *op = e->putq_head;
        e->putq_head = op->putq_next;
        if (!e->putq_head)
            e->putq_tail = NULL;
        e->putq_n--;
        rb_put_append_locked(e, op);
    }
}

/* -------------------------------------------------------- checkpoint */

/*
 * Take one checkpoint. call with jlock held; drops it during the write.
 * The snapshot is the slot table now and P = the next block sequence:
 * every record appended so far is in the snapshot, and replay from P
 * covers every record appended later (replaying a record the snapshot
 * already reflects is harmless: records apply in order per slot).
 */
static int checkpoint_locked(struct rb_engine *e)
{
    uint64_t P = e->jnext;
    uint64_t recs_at = e->recs_since_ckpt;
    uint8_t *payload = NULL;
    uint32_t nrec = 0;
    uint64_t len = rb_serialize(e->slots, e->g.nslots, e->g.block, &payload, &nrec);
    struct rb_ckpt_hdr h = {
        .version = e->version,
        .seq = e->ckpt_seq + 1,
        .instance = e->instance,
        .payload_len = len,
        .nrec = nrec,
        .jstart = P,
        .next_gen = e->next_gen,
        .block = e->g.block,
        .header_bytes = e->g.header_bytes,
        .slot_bytes = e->g.slot_bytes,
        .meta_total = e->g.meta_total,
        .data_off = e->g.data_off,
        .nslots = e->g.nslots,
    };
    memcpy(h.magic, e->magic, 8);
    pthread_mutex_unlock(&e->jlock);
    /* the snapshot is ours now: its CRC needs no lock (stores and deletes
     * append records meanwhile) */
    h.payload_crc = len == UINT64_MAX ? 0 : rb_crc32(0, payload, len);
    int rc = len == UINT64_MAX
                 ? -ENOMEM
                 : rb_write_checkpoint(e->fd, &e->g, &h, payload, len, (int)(h.seq % 2));
    free(payload);
    pthread_mutex_lock(&e->jlock);
    if (rc == 0) {
        e->jtail = P;
        e->ckpt_seq = h.seq;
        e->ckpts++;
        e->recs_since_ckpt -= recs_at;
        e->last_ckpt_ns = kvt_now_ns();
        e->ckpt_bytes_last = len;
        e->ckpt_nrec_last = nrec;
        if (e->ckpt_err[0])
            kvt_info("raw_block %s: checkpoint %llu written: the earlier error is cleared", e->path,
                     (unsigned long long)h.seq);
        e->ckpt_err[0] = 0;
        rb_jkick_locked(e);
        putq_drain_locked(e);
    } else {
        bool first = !e->ckpt_err[0];
        if (rc == -EFBIG)
            snprintf(e->ckpt_err, sizeof(e->ckpt_err),
                     "checkpoint of %u objects needs %llu bytes but each copy holds %llu: raise "
                     "meta_total_bytes (new stores are refused once the journal is 3/4 full)",
                     nrec, (unsigned long long)len,
                     (unsigned long long)(e->g.ckpt_bytes - e->g.block));
        else
            snprintf(e->ckpt_err, sizeof(e->ckpt_err), "checkpoint write failed: %s",
                     kvt_strerror(rc));
        if (first) /* retried every second: log the transition, status has the rest */
            kvt_error("raw_block %s: %s", e->path, e->ckpt_err);
    }
    return rc;
}

void *rb_ckpt_main(void *arg)
{
    struct rb_engine *e = arg;
    pthread_setname_np(pthread_self(), "rb-ckpt");
    pthread_mutex_lock(&e->jlock);
    for (;;) {
        uint64_t now = kvt_now_ns();
        bool half = (e->jnext - e->jtail) * 2 >= e->g.jrnl_blocks;
        bool urgent = e->jblocked || half;
        bool quiet = now - e->last_change_ns >= (uint64_t)e->quiet_ms * 1000000ull;
        bool due = e->periodic && e->recs_since_ckpt &&
                   now - e->last_ckpt_ns >= (uint64_t)e->interval_s * 1000000000ull;
        if (e->ckpt_stop) {
            if (e->recs_since_ckpt && !e->fatal)
                checkpoint_locked(e); /* the final one, at close */
            break;
        }
        if (e->fatal && e->jrecover) {
            /* a failed journal write: once its waiters are told and no write
             * is in flight, a checkpoint replaces what it lost */
            if (!e->jfail_cbs && !e->inflight && checkpoint_locked(e) == 0) {
                journal_recovered_locked(e);
                continue;
            }
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            ts.tv_sec += 1;
            pthread_cond_timedwait(&e->ckpt_cond, &e->jlock, &ts);
            continue;
        }
        if (!e->fatal && (urgent || (due && quiet))) {
            int rc = checkpoint_locked(e);
            if (rc && e->putq_head) {
                /* no room will come soon: refuse the stores that wait */
                struct rb_op *q = e->putq_head;
                e->putq_head = e->putq_tail = NULL;
                e->putq_n = 0;
                pthread_mutex_unlock(&e->jlock);
                while (q) {
                    struct rb_op *nx = q->putq_next;
                    atomic_fetch_add(&q->b->l2->counters.rejected_writes, 1);
                    q->jw.fn(&q->jw, KVT_E_FULL);
                    q = nx;
                }
                pthread_mutex_lock(&e->jlock);
            }
            if (rc) { /* retry after a second or the next delete, not in a tight loop */
                struct timespec ts;
                clock_gettime(CLOCK_MONOTONIC, &ts);
                ts.tv_sec += 1;
                pthread_cond_timedwait(&e->ckpt_cond, &e->jlock, &ts);
            }
            continue;
        }
        /* sleep until the next reason to look again */
        uint64_t wait = 3600ull * 1000000000ull;
        if (e->periodic && e->recs_since_ckpt) {
            uint64_t t_int = e->last_ckpt_ns + (uint64_t)e->interval_s * 1000000000ull;
            uint64_t t_q = e->last_change_ns + (uint64_t)e->quiet_ms * 1000000ull;
            uint64_t at = KVT_MAX(t_int, t_q);
            wait = at > now ? at - now : 1000000ull;
        }
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t ns = (uint64_t)ts.tv_nsec + wait % 1000000000ull;
        ts.tv_sec += (time_t)(wait / 1000000000ull + ns / 1000000000ull);
        ts.tv_nsec = (long)(ns % 1000000000ull);
        pthread_cond_timedwait(&e->ckpt_cond, &e->jlock, &ts);
    }
    pthread_mutex_unlock(&e->jlock);
    return NULL;
}

/* Close: wait (bounded) until every appended record is on the device. */
void rb_journal_drain(struct rb_engine *e)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += 10;
    pthread_mutex_lock(&e->jlock);
    while (!e->fatal && (e->inflight || e->sq_head || (e->cur && e->cur->nrec))) {
        rb_jkick_locked(e);
        if (e->jblocked)
            pthread_cond_signal(&e->ckpt_cond);
        if (pthread_cond_timedwait(&e->jcond, &e->jlock, &ts) == ETIMEDOUT) {
            kvt_warn("raw_block %s: journal not drained at close (checkpoint failing?): "
                     "the last deletes may come back after restart",
                     e->path);
            break;
        }
    }
    struct rb_jw *w = rb_drop_pending_locked(e);
    pthread_mutex_unlock(&e->jlock);
    rb_call_waiters(w, KVT_E_CLOSED);
}
