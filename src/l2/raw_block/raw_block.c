/*
 * raw_block adapter: fixed-size slots on a block device or a pre-sized
 * file, with a checkpointed and journaled index (formats in raw_block.h).
 *
 * Store:  reserve (usage counts whole slots) -> take a free slot and a new
 *         generation -> one write of [object header + trailer | payload]
 *         into the slot on the I/O engine -> append a PUT record to the
 *         journal -> acknowledge once the journal block holding it is on
 *         the device. A store acknowledged before a SIGKILL is therefore
 *         found after restart (LMCache loses everything after the last
 *         checkpoint).
 * Delete: append a DEL record; the slot is free for reuse only once the
 *         record is durable, so recovery can never pair an old index entry
 *         with new bytes.
 * Lookup: memory index (inline). Load: one read of header + payload,
 *         verified against the index (identity, generation, instance,
 *         length, checksum): any mismatch is a miss.
 * Journal: records are packed into blocks; one block write is in flight at
 *         a time and records arriving meanwhile share the next block (group
 *         commit). The ring is reclaimed by checkpoints.
 * Checkpoint: the slot table as PUT records in the older of two copies
 *         (payload, fdatasync, header); taken when the journal is half
 *         full, periodically when idle (meta_checkpoint_interval_sec after
 *         meta_idle_quiet_ms without changes), and at close. One that does
 *         not fit its copy is an error in status (is_healthy false); when
 *         the journal is then 3/4 full, new stores are refused (deletes and
 *         evictions still go through) until a checkpoint fits again.
 * Start-up: open refuses a device in use and reads what the device holds
 *         (raw_block_probe.c, the same checks as --dry-run): kvtier's own
 *         index is recovered (another layout, format or version is a clear
 *         error), an empty device is formatted, anything else is refused
 *         unless "format": "force". A slot is header_bytes + slot_bytes.
 *         Payload, journal replay and slot-header verification run in the
 *         background while stores wait.
 * O_DIRECT: header, offsets and lengths are block aligned; the payload is
 *         written from the caller's buffer when aligned (enable_zero_copy),
 *         its last partial block and misaligned buffers go through an
 *         aligned bounce buffer (counted), never an EINVAL.
 *
 * Threads: store workers ("rbs<i>"), load workers ("rbl<i>"), the I/O
 * engine, a checkpoint thread, a one-shot recovery thread.
 * Locks: e->jlock guards the slot table, the free list, generations, the
 * journal and checkpoint state. l2->lock (base) is never held with it.
 * Neither is held across I/O except that block writes are *submitted*
 * under jlock (submission never blocks).
 */
#include "common/log.h"
#include "common/util.h"
#include "io/engine.h"
#include "io/tpool.h"
#include "kvtier/error.h"
#include "l2/adapters.h"
#include "l2/engine.h"
#include "l2/life.h"
#include "l2/kit/objfmt.h"
#include "l2/raw_block/raw_block.h"
#include "l2/raw_block/raw_block_int.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------ batches */

static void batch_op_done(struct rb_batch *b)
{
    if (atomic_fetch_sub_explicit(&b->left, 1, memory_order_acq_rel) != 1)
        return;
    kvt_l2 *l2 = b->l2;
    struct rb_engine *e = l2->engine;
    for (uint32_t i = 0; i < b->t->n; i++) {
        free(b->ops[i].hdr);
        free(b->ops[i].bounce);
        free(b->ops[i].ios);
    }
    kvt_l2_task_finish(l2, b->t);
    free(b);
    kvt_l2_drain_leave(&e->drain);
}

/* Split a byte stream of up to 3 segments into requests of at most
 * e->max_xfer bytes (block multiples), all at consecutive device offsets. */
static void build_ios(struct rb_engine *e, struct rb_op *op, enum kvt_io_op kind, uint64_t off,
                      struct iovec *seg, int nseg, void (*cb)(struct kvt_io *))
{
    uint64_t total = 0;
    for (int k = 0; k < nseg; k++)
        total += seg[k].iov_len;
    uint64_t chunk = e->max_xfer ? e->max_xfer : total;
    uint32_t n = (uint32_t)((total + chunk - 1) / chunk);
    op->ios = kvt_xcalloc(n, sizeof(struct kvt_io));
    op->nios = n;
    int k = 0;
    uint64_t in_seg = 0, at = 0;
    for (uint32_t i = 0; i < n; i++) {
        struct kvt_io *io = &op->ios[i];
        kvt_io_prep(io, kind, e->fd, off + at, cb, op);
        uint64_t want = KVT_MIN(chunk, total - at);
        while (want && k < nseg) {
            uint64_t take = KVT_MIN(want, seg[k].iov_len - in_seg);
            kvt_io_add(io, (char *)seg[k].iov_base + in_seg, take);
            want -= take;
            at += take;
            in_seg += take;
            if (in_seg == seg[k].iov_len) {
                k++;
                in_seg = 0;
            }
        }
    }
    atomic_store(&op->ios_left, n);
}

/* Submit an op's requests; the op may complete (and be freed) as soon as
 * its last request is submitted, so nothing of it is read after that. */
static void submit_all(struct rb_engine *e, struct rb_op *op)
{
    struct kvt_io *ios = op->ios;
    uint32_t n = op->nios, k = 0;
    struct kvt_io *pp[64];
    while (k < n) {
        uint32_t m = 0;
        while (m < 64 && k < n)
            pp[m++] = &ios[k++];
        kvt_ioeng_submitv(e->io, pp, m);
    }
}

/* ------------------------------------------------------------- store */

static void slot_free(struct rb_engine *e, uint32_t s)
{
    pthread_mutex_lock(&e->jlock);
    e->freev[e->nfree++] = s;
    pthread_mutex_unlock(&e->jlock);
}

static void store_fail(kvt_l2 *l2, struct rb_op *op, int rc)
{
    kvt_l2_task_fail(op->b->t, op->i, rc);
    atomic_fetch_add(&l2->counters.store_failed, 1);
}

/* The PUT record is durable (rc 0) or will never be. */
static void store_journaled(struct rb_jw *w, int rc)
{
    struct rb_op *op = (struct rb_op *)((char *)w - offsetof(struct rb_op, jw));
    kvt_l2 *l2 = op->b->l2;
    struct rb_engine *e = l2->engine;
    kvt_l2_task *t = op->b->t;
    kvt_key ck;
    kvt_l2_canon(l2, &t->keys[op->i], &ck);
    if (rc == 0) {
        kvt_l2_publish_aux(l2, &ck, op->slot);
        atomic_fetch_add(&l2->counters.store_ok, 1);
        kvt_l2_task_ok(t, op->i, e->g.header_bytes + op->plen);
    } else {
        pthread_mutex_lock(&e->jlock);
        struct rb_slot *s = &e->slots[op->slot];
        if (s->used && s->gen == op->gen)
            s->used = 0;
        e->freev[e->nfree++] = op->slot;
        pthread_mutex_unlock(&e->jlock);
        kvt_l2_unreserve(l2, &ck);
        store_fail(l2, op, rc);
    }
    batch_op_done(op->b);
}

static void store_io_cb(struct kvt_io *io)
{
    struct rb_op *op = io->udata;
    if (io->res < 0 || (uint64_t)io->res != io->len) {
        int zero = 0;
        atomic_compare_exchange_strong(&op->err, &zero, io->res < 0 ? io->res : -EIO);
    }
    if (atomic_fetch_sub_explicit(&op->ios_left, 1, memory_order_acq_rel) != 1)
        return;
    kvt_l2 *l2 = op->b->l2;
    struct rb_engine *e = l2->engine;
    kvt_l2_task *t = op->b->t;
    int err = atomic_load(&op->err);
    if (err) {
        /* nothing journaled: the slot simply goes back */
        kvt_key ck;
        kvt_l2_canon(l2, &t->keys[op->i], &ck);
        slot_free(e, op->slot);
        kvt_l2_unreserve(l2, &ck);
        store_fail(l2, op, err);
        char ks[400];
        kvt_warn("%s: store %s failed: %s", l2->name, kvt_key_str(&t->keys[op->i], ks, sizeof(ks)),
                 kvt_strerror(err));
        batch_op_done(op->b);
        return;
    }
    op->jw.fn = store_journaled;
    pthread_mutex_lock(&e->jlock);
    if (e->fatal) {
        pthread_mutex_unlock(&e->jlock);
        store_journaled(&op->jw, KVT_E_FATAL);
        return;
    }
    if (rb_ring_tight_locked(e) || e->putq_head) {
        if (e->ckpt_err[0]) {
            /* checkpoints fail: refuse new objects; deletes still shrink
             * the index until one fits again */
            pthread_mutex_unlock(&e->jlock);
            atomic_fetch_add(&l2->counters.rejected_writes, 1);
            store_journaled(&op->jw, KVT_E_FULL);
            return;
        }
        op->putq_next = NULL; /* wait for the checkpoint that makes room */
        if (e->putq_tail)
            e->putq_tail->putq_next = op;
        else
            e->putq_head = op;
        e->putq_tail = op;
        e->putq_n++;
        pthread_cond_signal(&e->ckpt_cond);
        pthread_mutex_unlock(&e->jlock);
        return;
    }
    rb_put_append_locked(e, op);
    pthread_mutex_unlock(&e->jlock);
}

/* The PUT record of a written slot. call with jlock held */
void rb_put_append_locked(struct rb_engine *e, struct rb_op *op)
{
    kvt_l2 *l2 = op->b->l2;
    kvt_l2_task *t = op->b->t;
    struct rb_rec r = {.op = RB_PUT,
                       .slot = op->slot,
                       .gen = op->gen,
                       .len = t->meta[op->i].len,
                       .plen = op->plen,
                       .xxh3 = op->xxh3};
    kvt_l2_canon(l2, &t->keys[op->i], &r.key);
    rb_jappend_locked(e, &r, &op->jw);
}

/* Lay out the transfer of header + payload for O_DIRECT or buffered I/O:
 * segments [hdr][caller's aligned part][bounce]. For a load, `into` marks
 * the bounce as the destination of the unaligned rest. */
static int plan_segments(kvt_l2 *l2, struct rb_engine *e, struct rb_op *op, uint8_t *user,
                         uint64_t len, bool is_store, struct iovec seg[3])
{
    int n = 0;
    seg[n++] = (struct iovec){op->hdr, e->g.header_bytes};
    if (!e->odirect || e->odirect_refused) {
        if (len)
            seg[n++] = (struct iovec){user, len};
        op->direct_part = len;
        return n;
    }
    uint32_t blk = e->g.block;
    uint64_t direct = 0;
    if (e->zero_copy && (uintptr_t)user % blk == 0)
        direct = len / blk * blk;
    else
        atomic_fetch_add(&e->bounced, 1);
    op->direct_part = direct;
    if (direct)
        seg[n++] = (struct iovec){user, direct};
    uint64_t rest = len - direct;
    if (rest) {
        uint64_t padded = KVT_ALIGN_UP(rest, blk);
        op->bounce = kvt_xmemalign(blk, padded);
        if (is_store)
            memcpy(op->bounce, user + direct, rest);
        seg[n++] = (struct iovec){op->bounce, padded};
    }
    (void)l2;
    return n;
}

static void store_prep(struct rb_op *op)
{
    struct rb_batch *b = op->b;
    kvt_l2 *l2 = b->l2;
    struct rb_engine *e = l2->engine;
    kvt_l2_task *t = b->t;
    uint32_t i = op->i;
    const kvt_buf *src = &t->bufs[i];
    kvt_key ck;
    kvt_l2_canon(l2, &t->keys[i], &ck);
    if (src->len > e->g.slot_bytes - e->g.header_bytes || src->len > KVT_MAX_OBJECT) {
        /* a slot holds header_bytes of header, then the payload: loud,
         * counted (too_big, in status) and reported by flush, never silent */
        kvt_l2_too_big(l2, t, i, src->len,
                       KVT_MIN(e->g.slot_bytes - e->g.header_bytes, KVT_MAX_OBJECT),
                       "slot_bytes: raise it");
        batch_op_done(b);
        return;
    }
    uint32_t logical = t->meta[i].len ? t->meta[i].len : (uint32_t)src->len;
    t->meta[i].len = logical;
    int rc = kvt_l2_reserve(l2, &ck, (uint32_t)KVT_MIN(e->g.slot_bytes, UINT32_MAX), logical,
                            UINT32_MAX, 0);
    if (rc == -EEXIST) {
        atomic_fetch_add(&l2->counters.store_skipped, 1);
        kvt_l2_task_ok(t, i, 0);
        batch_op_done(b);
        return;
    }
    if (rc) {
        store_fail(l2, op, rc);
        batch_op_done(b);
        return;
    }
    pthread_mutex_lock(&e->jlock);
    bool fatal = e->fatal;
    bool have = !fatal && e->nfree > 0;
    if (have) {
        op->slot = e->freev[--e->nfree];
        op->gen = e->next_gen++;
    }
    pthread_mutex_unlock(&e->jlock);
    if (!have) {
        kvt_l2_unreserve(l2, &ck);
        store_fail(l2, op, fatal ? KVT_E_FATAL : KVT_E_FULL);
        batch_op_done(b);
        return;
    }
    op->plen = (uint32_t)src->len;
    op->xxh3 = kvt_payload_hash(src->ptr, src->len);
    op->hdr = kvt_xmemalign(e->g.block, e->g.header_bytes);
    kvt_objhdr_encode(op->hdr, KVT_OBJHDR_MIN, &ck, &t->meta[i], t->meta[i].serde, src->len,
                      op->xxh3);
    struct rb_trailer tr = {.slot = op->slot,
                            .gen = op->gen,
                            .plen = src->len,
                            .xxh3 = op->xxh3,
                            .instance = e->instance};
    rb_trailer_encode(&tr, op->hdr + e->g.header_bytes - RB_TRAILER);
    struct iovec seg[3];
    int nseg = plan_segments(l2, e, op, src->ptr, src->len, true, seg);
    build_ios(e, op, KVT_IO_WRITE, rb_slot_off(&e->g, op->slot), seg, nseg, store_io_cb);
    submit_all(e, op);
}

/* -------------------------------------------------------------- load */

static void load_verify(struct rb_op *op)
{
    kvt_l2 *l2 = op->b->l2;
    struct rb_engine *e = l2->engine;
    kvt_l2_task *t = op->b->t;
    kvt_buf *dst = &t->bufs[op->i];
    int rc = atomic_load(&op->err);
    const char *why = NULL;
    struct kvt_objhdr h;
    if (!rc) {
        struct rb_trailer tr;
        rc = kvt_objhdr_decode(op->hdr, KVT_OBJHDR_MIN, &h, &why);
        if (!rc && !kvt_objhdr_matches(&h, KVT_CODEC_OBJ, &t->keys[op->i])) {
            why = "slot header names another key";
            rc = KVT_E_CORRUPT;
        }
        if (!rc && rb_trailer_decode(op->hdr + e->g.header_bytes - RB_TRAILER, &tr)) {
            why = "slot trailer damaged";
            rc = KVT_E_CORRUPT;
        }
        if (!rc && (tr.slot != op->slot || tr.gen != op->gen || tr.instance != e->instance ||
                    tr.plen != op->plen || tr.xxh3 != op->xxh3 || h.payload_len != op->plen)) {
            why = "slot holds another generation than the index";
            rc = KVT_E_CORRUPT;
        }
        if (!rc && op->bounce)
            memcpy((uint8_t *)dst->ptr + op->direct_part, op->bounce, op->plen - op->direct_part);
        if (!rc && kvt_payload_hash(dst->ptr, op->plen) != op->xxh3) {
            why = "payload checksum mismatch";
            rc = KVT_E_CORRUPT;
        }
        if (rc == KVT_E_CORRUPT) {
            atomic_fetch_add(&e->verify_failed, 1);
            kvt_l2_slot_corrupt(l2, &t->keys[op->i], op->slot, why);
        }
    }
    if (rc) {
        kvt_l2_task_fail(t, op->i, rc);
    } else {
        t->meta[op->i] = h.meta;
        dst->len = op->plen;
        kvt_l2_task_ok(t, op->i, e->g.header_bytes + op->plen);
    }
    batch_op_done(op->b);
}

static void load_io_cb(struct kvt_io *io)
{
    struct rb_op *op = io->udata;
    if (io->res < 0 || (uint64_t)io->res != io->len) {
        int zero = 0;
        atomic_compare_exchange_strong(&op->err, &zero, io->res < 0 ? io->res : KVT_E_CORRUPT);
    }
    if (atomic_fetch_sub_explicit(&op->ios_left, 1, memory_order_acq_rel) != 1)
        return;
    struct rb_engine *e = op->b->l2->engine;
    if (kvt_ioeng_cb_may_block(e->io)) {
        load_verify(op);
    } else { /* checksum work off the ring thread */
        op->stage = ST_LOAD_VERIFY;
        kvt_tpool_push(e->lpool, &op->job);
    }
}

static void load_prep(struct rb_op *op)
{
    struct rb_batch *b = op->b;
    kvt_l2 *l2 = b->l2;
    struct rb_engine *e = l2->engine;
    kvt_l2_task *t = b->t;
    uint32_t i = op->i;
    kvt_buf *dst = &t->bufs[i];
    kvt_key ck;
    kvt_l2_canon(l2, &t->keys[i], &ck);
    uint32_t slot = UINT32_MAX;
    pthread_mutex_lock(&l2->lock);
    struct kvt_l2_obj *o = kvt_l2_find_locked(l2, &ck);
    if (o && kvt_l2_obj_state(o) == KVT_OBJ_READY)
        slot = o->aux;
    pthread_mutex_unlock(&l2->lock);
    bool ok = false;
    pthread_mutex_lock(&e->jlock);
    if (slot < e->g.nslots && e->slots[slot].used && kvt_key_eq(&e->slots[slot].key, &ck)) {
        op->slot = slot;
        op->gen = e->slots[slot].gen;
        op->plen = e->slots[slot].plen;
        op->xxh3 = e->slots[slot].xxh3;
        ok = true;
    }
    pthread_mutex_unlock(&e->jlock);
    if (!ok) {
        kvt_l2_task_fail(t, i, KVT_E_NOTFOUND);
        batch_op_done(b);
        return;
    }
    if (op->plen > dst->len) {
        kvt_l2_task_fail(t, i, KVT_E_TOOBIG); /* never an overrun */
        batch_op_done(b);
        return;
    }
    op->hdr = kvt_xmemalign(e->g.block, e->g.header_bytes);
    struct iovec seg[3];
    int nseg = plan_segments(l2, e, op, dst->ptr, op->plen, false, seg);
    build_ios(e, op, KVT_IO_READ, rb_slot_off(&e->g, op->slot), seg, nseg, load_io_cb);
    submit_all(e, op);
}

/* ---------------------------------------------------------- dispatch */

static void job_fn(struct kvt_job *job, void *ctx)
{
    (void)ctx;
    struct rb_op *op = (struct rb_op *)job;
    struct rb_engine *e = op->b->l2->engine;
    switch (op->stage) {
    case ST_STORE:
        if (kvt_l2_park(&e->park, job)) /* stores wait for recovery: slots and the cap */
            return;
        store_prep(op);
        break;
    case ST_LOAD:
        load_prep(op);
        break;
    default:
        load_verify(op);
        break;
    }
}

static void rb_submit(kvt_l2 *l2, kvt_l2_task *t)
{
    struct rb_engine *e = l2->engine;
    if (t->kind == KVT_L2_LOOKUP) { /* the index is complete: no I/O */
        kvt_l2_lookup_index(l2, t);
        return;
    }
    struct rb_batch *b = kvt_xcalloc(1, sizeof(*b) + t->n * sizeof(struct rb_op));
    b->l2 = l2;
    b->t = t;
    atomic_store(&b->left, t->n);
    kvt_l2_drain_enter(&e->drain);
    bool store = t->kind == KVT_L2_STORE;
    uint32_t n = t->n;
    for (uint32_t i = 0; i < n; i++) {
        b->ops[i].b = b;
        b->ops[i].i = i;
        b->ops[i].stage = store ? ST_STORE : ST_LOAD;
        b->ops[i].job.fn = job_fn;
    }
    /* b and t may be freed once the last op is queued: read nothing after */
    struct rb_op *ops = b->ops;
    struct kvt_tpool *pool = store ? e->spool : e->lpool;
    for (uint32_t i = 0; i < n; i++)
        kvt_tpool_push(pool, &ops[i].job);
}

/* ------------------------------------------------------------ delete */

struct del_wait {
    struct rb_jw jw;
    struct rb_engine *e;
    uint32_t slot;
    int refs;  /* guarded by jlock: the journal, and the waiting remover */
    bool done; /* guarded by jlock */
};

/* The DEL record is durable: only now may the slot be reused, so that no
 * recovery can pair the old index entry with new bytes. */
static void del_journaled(struct rb_jw *w, int rc)
{
    struct del_wait *dw = (struct del_wait *)w;
    struct rb_engine *e = dw->e;
    pthread_mutex_lock(&e->jlock);
    if (rc == 0)
        e->freev[e->nfree++] = dw->slot;
    else if (e->jrecover) /* free once the recovery checkpoint holds the DEL */
        e->lost[e->nlost++] = dw->slot;
    /* else: the slot stays out of use until a restart */
    dw->done = true;
    pthread_cond_broadcast(&e->jcond);
    bool last = --dw->refs == 0;
    pthread_mutex_unlock(&e->jlock);
    if (last)
        free(dw);
}

/*
 * Delete or evict: append a DEL record (applied to the slot table at once,
 * so the next checkpoint no longer carries the object) and wait, up to two
 * seconds, until it is durable; the slot is freed then. While checkpoints
 * fail a delete does not wait at all: deletes must always be able to
 * shrink an index whose checkpoint does not fit. A delete whose record was
 * not yet written when the process died leaves the object (intact) after
 * restart.
 */
static int rb_remove(kvt_l2 *l2, const struct kvt_l2_obj *o)
{
    struct rb_engine *e = l2->engine;
    uint32_t s = o->aux;
    pthread_mutex_lock(&e->jlock);
    if (e->fatal) {
        pthread_mutex_unlock(&e->jlock);
        return KVT_E_FATAL;
    }
    if (s >= e->g.nslots || !e->slots[s].used || !kvt_key_eq(&e->slots[s].key, &o->key)) {
        pthread_mutex_unlock(&e->jlock);
        return -ENOENT; /* not on the device: forget the entry */
    }
    struct del_wait *dw = kvt_xcalloc(1, sizeof(*dw));
    dw->jw.fn = del_journaled;
    dw->e = e;
    dw->slot = s;
    dw->refs = 2;
    struct rb_rec r = {.op = RB_DEL, .slot = s, .gen = e->slots[s].gen};
    rb_jappend_locked(e, &r, &dw->jw);
    if (e->ckpt_err[0]) { /* a smaller index may fit now */
        pthread_cond_signal(&e->ckpt_cond);
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_sec += 2;
        while (!dw->done && !e->fatal &&
               pthread_cond_timedwait(&e->jcond, &e->jlock, &ts) != ETIMEDOUT)
            ;
    }
    bool last = --dw->refs == 0;
    pthread_mutex_unlock(&e->jlock);
    if (last)
        free(dw);
    return 0;
}

/* ---------------------------------------------------------- recovery */

/* Read each used slot's header area and drop entries that do not match. */
static void verify_slots(kvt_l2 *l2, struct rb_engine *e)
{
    uint8_t *buf = kvt_xmemalign(e->g.block, e->g.header_bytes);
    for (uint32_t s = 0; s < e->g.nslots && !atomic_load(&e->stop); s++) {
        struct rb_slot *sl = &e->slots[s];
        if (!sl->used)
            continue;
        const char *why = NULL;
        struct kvt_objhdr h;
        struct rb_trailer tr;
        bool ok = kvt_pread_all(e->fd, buf, e->g.header_bytes, rb_slot_off(&e->g, s), NULL) == 0 &&
                  kvt_objhdr_decode(buf, KVT_OBJHDR_MIN, &h, &why) == 0 &&
                  kvt_objhdr_matches(&h, KVT_CODEC_OBJ, &sl->key) &&
                  rb_trailer_decode(buf + e->g.header_bytes - RB_TRAILER, &tr) == 0 &&
                  tr.slot == s && tr.gen == sl->gen && tr.plen == sl->plen && tr.xxh3 == sl->xxh3 &&
                  tr.instance == e->instance;
        if (!ok) {
            sl->used = 0;
            atomic_fetch_add(&e->verify_dropped, 1);
        }
    }
    free(buf);
    if (atomic_load(&e->verify_dropped))
        kvt_warn("%s: %llu index entries did not match their slot headers: dropped", l2->name,
                 (unsigned long long)atomic_load(&e->verify_dropped));
}

/*
 * Background start-up: checkpoint payload, journal replay, slot-header
 * verification, then the free list and the base index (oldest generation
 * coldest). The slot table is not shared yet: no store runs before the
 * parked stores are released, loads find nothing in the base index until
 * adoption.
 */
static void *recover_main(void *arg)
{
    kvt_l2 *l2 = arg;
    struct rb_engine *e = l2->engine;
    pthread_setname_np(pthread_self(), "rb-recover");
    uint64_t t0 = kvt_now_ns();
    if (!e->fresh) {
        struct rb_ckpt_hdr h;
        int copy = -1;
        int rc = rb_read_checkpoint(e->fd, &e->g, e->magic, e->version, e->slots, &h, &copy);
        uint64_t next_bseq = 0, nrecs = 0, maxgen = 0;
        if (rc == 0)
            rc = rb_replay_journal(e->fd, &e->g, h.instance, h.jstart, e->slots, &next_bseq, &nrecs,
                                   &maxgen);
        pthread_mutex_lock(&e->jlock);
        if (rc) {
            rb_set_fatal_locked(e,
                                "cannot read the metadata checkpoint (%s): set "
                                "\"load_checkpoint_on_init\": false to start empty",
                                rc);
            memset(e->slots, 0, (size_t)e->g.nslots * sizeof(*e->slots));
        } else {
            e->instance = h.instance;
            e->next_gen = KVT_MAX(h.next_gen, maxgen + 1);
            e->jtail = h.jstart;
            e->jnext = next_bseq;
            e->ckpt_seq = h.seq;
            snprintf(e->recovered_from, sizeof(e->recovered_from),
                     "checkpoint %llu (copy %d, %u objects) + %llu journal records",
                     (unsigned long long)h.seq, copy, h.nrec, (unsigned long long)nrecs);
        }
        pthread_mutex_unlock(&e->jlock);
        if (!rc && e->verify)
            verify_slots(l2, e);
    }
    /* free list (lowest slot first) and adoption */
    uint32_t nused = 0;
    for (uint32_t s = 0; s < e->g.nslots; s++)
        nused += e->slots[s].used;
    struct rb_gen_slot *v = kvt_xcalloc(nused ? nused : 1, sizeof(*v));
    uint32_t k = 0;
    pthread_mutex_lock(&e->jlock);
    e->nfree = 0;
    for (uint32_t s = e->g.nslots; s-- > 0;) {
        if (e->slots[s].used)
            v[k++] = (struct rb_gen_slot){e->slots[s].gen, s};
        else
            e->freev[e->nfree++] = s;
    }
    pthread_mutex_unlock(&e->jlock);
    rb_sort_newest_first(v, nused);
    uint64_t objs = 0, bytes = 0;
    for (uint32_t i = 0; i < nused; i++) {
        struct rb_slot *sl = &e->slots[v[i].slot];
        if (kvt_l2_adopt(l2, &sl->key, (uint32_t)KVT_MIN(e->g.slot_bytes, UINT32_MAX), sl->len,
                         v[i].slot, 0, false, true)) {
            objs++;
            bytes += e->g.slot_bytes;
        } else { /* two slots for one key (cannot happen): keep the newer */
            pthread_mutex_lock(&e->jlock);
            sl->used = 0;
            e->freev[e->nfree++] = v[i].slot;
            pthread_mutex_unlock(&e->jlock);
        }
    }
    free(v);
    double secs = kvt_l2_recovery_done(l2, objs, bytes, t0);
    kvt_info("%s: recovered %llu objects (%s) from %s in %.3f s", l2->name,
             (unsigned long long)objs, e->fresh ? "fresh device" : e->recovered_from, e->path,
             secs);
    kvt_l2_park_release(&e->park, e->spool);
    return NULL;
}

/* ------------------------------------------------------- status/close */

static void rb_status(kvt_l2 *l2, json_t *out)
{
    struct rb_engine *e = l2->engine;
    json_object_set_new(out, "device_path", json_string(e->path));
    json_object_set_new(out, "device_bytes", json_integer((json_int_t)e->dev_size));
    json_object_set_new(out, "block_device", json_boolean(e->blockdev));
    /* a slot: header_bytes, then up to slot_bytes of payload */
    json_object_set_new(out, "slot_bytes",
                        json_integer((json_int_t)(e->g.slot_bytes - e->g.header_bytes)));
    json_object_set_new(out, "slot_stride_bytes", json_integer((json_int_t)e->g.slot_bytes));
    json_object_set_new(out, "header_bytes", json_integer(e->g.header_bytes));
    json_object_set_new(out, "block_align", json_integer(e->g.block));
    json_object_set_new(out, "slots", json_integer(e->g.nslots));
    json_object_set_new(out, "data_offset", json_integer((json_int_t)e->g.data_off));
    json_object_set_new(out, "odirect",
                        json_string(!e->odirect          ? "off"
                                    : e->odirect_refused ? "refused by file system (buffered)"
                                                         : "on"));
    json_object_set_new(out, "zero_copy", json_boolean(e->zero_copy));
    json_object_set_new(out, "bounced_transfers",
                        json_integer((json_int_t)atomic_load(&e->bounced)));
    json_object_set_new(out, "verify_failed",
                        json_integer((json_int_t)atomic_load(&e->verify_failed)));
    json_object_set_new(out, "io", kvt_ioeng_status(e->io));
    json_object_set_new(out, "num_store_workers", json_integer(e->nstore));
    json_object_set_new(out, "num_lookup_workers", json_integer(e->nlookup));
    json_object_set_new(out, "num_load_workers", json_integer(e->nload));
    json_t *m = json_object();
    pthread_mutex_lock(&e->jlock);
    json_object_set_new(out, "free_slots", json_integer(e->nfree));
    json_object_set_new(m, "checkpoint_seq", json_integer((json_int_t)e->ckpt_seq));
    json_object_set_new(m, "checkpoints_written", json_integer((json_int_t)e->ckpts));
    json_object_set_new(m, "checkpoint_bytes", json_integer((json_int_t)e->ckpt_bytes_last));
    json_object_set_new(m, "checkpoint_objects", json_integer(e->ckpt_nrec_last));
    json_object_set_new(m, "checkpoint_capacity_bytes",
                        json_integer((json_int_t)(e->g.ckpt_bytes - e->g.block)));
    json_object_set_new(m, "checkpoint_error",
                        e->ckpt_err[0] ? json_string(e->ckpt_err) : json_null());
    json_object_set_new(m, "journal_blocks", json_integer(e->g.jrnl_blocks));
    json_object_set_new(m, "journal_used_blocks", json_integer((json_int_t)(e->jnext - e->jtail)));
    json_object_set_new(m, "journal_writes", json_integer((json_int_t)e->jwrites));
    json_object_set_new(m, "journal_records", json_integer((json_int_t)e->jrecs));
    json_object_set_new(m, "records_since_checkpoint",
                        json_integer((json_int_t)e->recs_since_ckpt));
    json_object_set_new(m, "journal_blocked", json_boolean(e->jblocked));
    json_object_set_new(m, "recovered_from",
                        json_string(e->fresh ? "fresh device" : e->recovered_from));
    json_object_set_new(m, "verify_dropped",
                        json_integer((json_int_t)atomic_load(&e->verify_dropped)));
    json_object_set_new(m, "fatal", e->fatal ? json_string(e->fatal_msg) : json_null());
    json_object_set_new(m, "journal_recoveries", json_integer((json_int_t)e->jrecoveries));
    json_object_set_new(m, "journal_offset", json_integer((json_int_t)e->g.jrnl_off));
    json_object_set_new(m, "journal_next_block", json_integer((json_int_t)e->jnext));
    pthread_mutex_unlock(&e->jlock);
    json_object_set_new(out, "meta", m);
}

static bool rb_healthy(kvt_l2 *l2, char *msg, size_t cap)
{
    struct rb_engine *e = l2->engine;
    bool ok = true;
    pthread_mutex_lock(&e->jlock);
    if (e->fatal) {
        snprintf(msg, cap, "%s", e->fatal_msg);
        ok = false;
    } else if (e->ckpt_err[0]) {
        snprintf(msg, cap, "%s", e->ckpt_err);
        ok = false;
    } else if (e->odirect && e->odirect_refused) {
        snprintf(msg, cap, "ok (O_DIRECT refused by the file system: buffered I/O)");
    } else {
        snprintf(msg, cap, "ok");
    }
    pthread_mutex_unlock(&e->jlock);
    return ok;
}

static void engine_free(struct rb_engine *e)
{
    if (e->fd >= 0)
        close(e->fd);
    free(e->path);
    free(e->slots);
    free(e->freev);
    free(e->lost);
    if (e->cur)
        rb_jblock_free(e->cur);
    pthread_mutex_destroy(&e->jlock);
    pthread_cond_destroy(&e->ckpt_cond);
    pthread_cond_destroy(&e->jcond);
    kvt_l2_park_destroy(&e->park);
    kvt_l2_drain_destroy(&e->drain);
    free(e);
}

static void rb_close(kvt_l2 *l2)
{
    struct rb_engine *e = l2->engine;
    kvt_l2_life_stop(l2, &(struct kvt_l2_life){.stop_flag = &e->stop,
                                               .thread = &e->rec_thr,
                                               .thread_started = &e->rec_started,
                                               .park = &e->park,
                                               .park_pool = e->spool,
                                               .drain = &e->drain,
                                               .pools = {e->spool, e->lpool}});
    /* then raw_block's own: the journal, the final checkpoint, the device */
    rb_journal_drain(e);
    if (e->ckpt_started) { /* takes the final checkpoint */
        pthread_mutex_lock(&e->jlock);
        e->ckpt_stop = true;
        pthread_cond_signal(&e->ckpt_cond);
        pthread_mutex_unlock(&e->jlock);
        pthread_join(e->ckpt_thr, NULL);
    }
    kvt_ioeng_destroy(e->io);
    engine_free(e);
    l2->engine = NULL;
}

static const struct kvt_l2_ops rb_ops = {
    .submit = rb_submit,
    .remove = rb_remove,
    .status = rb_status,
    .healthy = rb_healthy,
    .close = rb_close,
};

/* Open the device or file (a block device exclusively: no mount, RAID or
 * second server can claim it while we run); size it; lock it against a
 * second server. A missing file is created only with capacity_bytes, and
 * removed again by rb_open's failure path (e->created). */
static int open_device(struct rb_engine *e, const struct kvt_raw_block_opts *o, char *err,
                       size_t errcap)
{
    struct stat st;
    if (stat(e->path, &st) < 0) {
        if (errno != ENOENT || !o->capacity_bytes) {
            snprintf(err, errcap,
                     "device_path %s: %s (give a block device or a pre-sized file: fallocate "
                     "-l SIZE %s, or set capacity_bytes to create one)",
                     e->path, kvt_strerror(-errno), e->path);
            return -errno;
        }
        int fd = open(e->path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd >= 0)
            e->created = true;
        int frc = fd < 0 ? -errno : -posix_fallocate(fd, 0, (off_t)o->capacity_bytes);
        if (fd >= 0)
            close(fd);
        if (frc) {
            snprintf(err, errcap, "cannot create %s with %llu bytes: %s", e->path,
                     (unsigned long long)o->capacity_bytes, kvt_strerror(frc));
            return frc;
        }
        stat(e->path, &st);
    } else {
        /* mounted, swap, held, a loop's backing file, another server */
        int rc = rb_in_use(e->path, err, errcap);
        if (rc)
            return rc;
    }
    if (!S_ISBLK(st.st_mode) && !S_ISREG(st.st_mode)) {
        snprintf(err, errcap, "device_path %s is neither a block device nor a regular file",
                 e->path);
        return -EINVAL;
    }
    e->blockdev = S_ISBLK(st.st_mode);
    int flags = O_RDWR | O_CLOEXEC | (e->blockdev ? O_EXCL : 0);
    e->fd = open(e->path, flags | (e->odirect ? O_DIRECT : 0));
    if (e->fd < 0 && e->odirect && errno == EINVAL) {
        e->odirect_refused = true;
        kvt_warn("raw_block %s: O_DIRECT refused by the file system: buffered I/O", e->path);
        e->fd = open(e->path, flags);
    }
    if (e->fd < 0 && errno == EBUSY) {
        snprintf(err, errcap,
                 "%s is in use by another process that holds it exclusively (a mount, swap, "
                 "RAID or LVM, or another kvtier server)",
                 e->path);
        return -EBUSY;
    }
    if (e->fd < 0) {
        snprintf(err, errcap, "cannot open device_path %s: %s", e->path, kvt_strerror(-errno));
        return -errno;
    }
    if (flock(e->fd, LOCK_EX | LOCK_NB) < 0) {
        snprintf(err, errcap, "device_path %s is in use by another process", e->path);
        return -EBUSY;
    }
    int rc = rb_dev_size(e->fd, &st, o, &e->dev_size, err, errcap);
    if (rc)
        return rc;
    e->usable = o->capacity_bytes ? KVT_MIN(o->capacity_bytes, e->dev_size) : e->dev_size;
    return 0;
}

/* What the device holds decides what opening does (rb_plan): read through
 * a buffered descriptor of its own (e->fd may be O_DIRECT). Foreign
 * content under "format": "force" loses its signatures here. */
static int plan_device(struct rb_engine *e, const struct kvt_raw_block_opts *o, char *err,
                       size_t errcap)
{
    int fd = open(e->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int rc = -errno;
        snprintf(err, errcap, "cannot open device_path %s: %s", e->path, kvt_strerror(rc));
        return rc;
    }
    struct rb_plan p;
    int rc = rb_plan(o, fd, e->dev_size, e->usable, !e->blockdev, &p, err, errcap);
    close(fd);
    if (rc)
        return rc;
    if (p.wipe) {
        kvt_warn("raw_block %s held %s: \"format\": \"force\" overwrites it", e->path, p.forced);
        rc = rb_wipe_signatures(e->path, err, errcap);
        if (rc)
            return rc;
    }
    if (p.compat)
        kvt_warn("raw_block %s was formatted with slots of slot_bytes %llu, header included: "
                 "kept as it is (objects up to %llu bytes); to get slot_bytes per object, set "
                 "\"load_checkpoint_on_init\": false once (it starts empty)",
                 e->path, (unsigned long long)p.g.slot_bytes,
                 (unsigned long long)(p.g.slot_bytes - p.g.header_bytes));
    e->g = p.g;
    e->fresh = p.fresh;
    return 0;
}

/* A device with no checkpoint of our magic: a new instance and two empty
 * checkpoint copies (both, so an older format's copy can never win). */
static int format_fresh(struct rb_engine *e)
{
    if (getrandom(&e->instance, sizeof(e->instance), 0) != sizeof(e->instance))
        e->instance = kvt_now_ns() ^ ((uint64_t)getpid() << 32);
    e->next_gen = 1;
    e->jnext = e->jtail = 0;
    struct rb_ckpt_hdr h = {.version = e->version,
                            .instance = e->instance,
                            .next_gen = 1,
                            .block = e->g.block,
                            .header_bytes = e->g.header_bytes,
                            .slot_bytes = e->g.slot_bytes,
                            .meta_total = e->g.meta_total,
                            .data_off = e->g.data_off,
                            .nslots = e->g.nslots};
    memcpy(h.magic, e->magic, 8);
    for (uint64_t seq = 1; seq <= 2; seq++) {
        h.seq = seq;
        int rc = rb_write_checkpoint(e->fd, &e->g, &h, NULL, 0, (int)(seq % 2));
        if (rc)
            return rc;
    }
    e->ckpt_seq = 2;
    return 0;
}

static int rb_open(kvt_l2 *l2, const struct kvt_l2_spec *spec, const void *opts, char *err,
                   size_t errcap)
{
    const struct kvt_raw_block_opts *o = opts;
    struct rb_engine *e = kvt_xcalloc(1, sizeof(*e));
    e->fd = -1;
    pthread_mutex_init(&e->jlock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&e->ckpt_cond, &ca);
    pthread_cond_init(&e->jcond, &ca);
    pthread_condattr_destroy(&ca);
    kvt_l2_park_init(&e->park);
    kvt_l2_drain_init(&e->drain);
    e->path = kvt_xstrdup(o->device_path);
    e->odirect = o->use_odirect;
    e->zero_copy = o->zero_copy;
    e->verify = o->verify_on_load;
    e->periodic = o->periodic;
    e->durable = o->durable;
    e->interval_s = o->ckpt_interval_s;
    e->quiet_ms = o->idle_quiet_ms;
    memcpy(e->magic, o->meta_magic, 8);
    e->version = o->meta_version;
    e->max_xfer = o->max_xfer;
    e->nstore = o->num_store_workers;
    e->nlookup = o->num_lookup_workers;
    e->nload = o->num_load_workers;
    int rc = open_device(e, o, err, errcap);
    if (rc)
        goto fail;
    rc = plan_device(e, o, err, errcap);
    if (rc)
        goto fail;
    e->slots = kvt_xcalloc(e->g.nslots, sizeof(*e->slots));
    e->freev = kvt_xcalloc(e->g.nslots, sizeof(uint32_t));
    e->lost = kvt_xcalloc(e->g.nslots, sizeof(uint32_t));
    if (e->fresh) {
        rc = format_fresh(e);
        if (rc) {
            snprintf(err, errcap, "cannot write the metadata area of %s: %s", e->path,
                     kvt_strerror(rc));
            goto fail;
        }
    }
    e->last_ckpt_ns = e->last_change_ns = kvt_now_ns();
    rc = kvt_l2_life_init(l2, &rb_ops, spec, KVT_CODEC_OBJ, (uint64_t)e->g.nslots * e->g.slot_bytes,
                          err, errcap);
    if (rc)
        goto fail;
    l2->engine = e;
    char nm[16];
    snprintf(nm, sizeof(nm), "rbio%d", spec->index);
    int depth = o->io_engine == KVT_IOENG_URING ? o->queue_depth
                                                : o->num_store_workers + o->num_load_workers;
    rc = kvt_ioeng_create(&e->io, (enum kvt_ioeng_kind)o->io_engine, nm, depth, err, errcap);
    if (rc)
        goto fail_base;
    snprintf(nm, sizeof(nm), "rbs%d", spec->index);
    rc = kvt_tpool_create(&e->spool, nm, o->num_store_workers, NULL, NULL, NULL);
    snprintf(nm, sizeof(nm), "rbl%d", spec->index);
    if (!rc)
        rc = kvt_tpool_create(&e->lpool, nm, o->num_load_workers, NULL, NULL, NULL);
    if (rc) {
        snprintf(err, errcap, "cannot start worker threads: %s", kvt_strerror(rc));
        goto fail_base;
    }
    rc = pthread_create(&e->ckpt_thr, NULL, rb_ckpt_main, e);
    if (rc) {
        snprintf(err, errcap, "cannot start the checkpoint thread: %s", kvt_strerror(-rc));
        rc = -rc;
        goto fail_base;
    }
    e->ckpt_started = true;
    e->park.parking = true;
    l2->recovering = true;
    rc = pthread_create(&e->rec_thr, NULL, recover_main, l2);
    if (rc) {
        snprintf(err, errcap, "cannot start the recovery thread: %s", kvt_strerror(-rc));
        rc = -rc;
        goto fail_base;
    }
    e->rec_started = true;
    kvt_info("%s: %s: %u slots of %llu bytes (header_bytes %u + objects up to %llu bytes), "
             "meta %llu bytes (2 x %llu checkpoint, %u journal blocks), %s, %s engine",
             l2->name, e->path, e->g.nslots, (unsigned long long)e->g.slot_bytes, e->g.header_bytes,
             (unsigned long long)(e->g.slot_bytes - e->g.header_bytes),
             (unsigned long long)e->g.meta_total, (unsigned long long)e->g.ckpt_bytes,
             e->g.jrnl_blocks, e->odirect && !e->odirect_refused ? "O_DIRECT" : "buffered",
             kvt_ioeng_kind_name((enum kvt_ioeng_kind)o->io_engine));
    return 0;
fail_base:
    if (e->ckpt_started) {
        pthread_mutex_lock(&e->jlock);
        e->ckpt_stop = true;
        e->recs_since_ckpt = 0;
        pthread_cond_signal(&e->ckpt_cond);
        pthread_mutex_unlock(&e->jlock);
        pthread_join(e->ckpt_thr, NULL);
    }
    kvt_tpool_destroy(e->spool);
    kvt_tpool_destroy(e->lpool);
    kvt_ioeng_destroy(e->io);
    l2->engine = NULL;
    kvt_l2_base_destroy(l2);
    if (e->created) /* nothing this start created stays behind */
        unlink(e->path);
    engine_free(e);
    return rc;
fail:
    if (e->created)
        unlink(e->path);
    engine_free(e);
    return rc ? rc : KVT_E_CONFIG;
}

const struct kvt_l2_adapter_desc kvt_l2_raw_block_desc = {
    .name = "raw_block",
    .opts_size = sizeof(struct kvt_raw_block_opts),
    .parse = kvt_raw_block_parse,
    .open = rb_open,
    .check = kvt_raw_block_check,
    .storage = kvt_raw_block_storage,
};
