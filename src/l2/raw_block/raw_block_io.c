/*
 * raw_block task path: a batch's stores (a free slot and generation, one
 * write of header + trailer + payload, the PUT record appended to the
 * journal, acknowledged once durable) and loads (one read, verified against
 * the index), on the store and load workers and the I/O engine.
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
#include "key/blocktag.h"
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
    /* the engine block hashes (KV events) as far as the 512-byte object
     * header holds them (kvt_objhdr_encode), for the recovery to read */
    struct kvt_blocktag *tag = kvt_l2_tag_of(l2, &ck);
    kvt_objhdr_encode(op->hdr, KVT_OBJHDR_MIN, &ck, &t->meta[i], tag, t->meta[i].serde, src->len,
                      op->xxh3);
    kvt_blocktag_put(tag);
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

void rb_submit(kvt_l2 *l2, kvt_l2_task *t)
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
