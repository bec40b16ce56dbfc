/*
 * nixl_store adapter (static pool): LMCache's NIXL static mode served
 * natively for the file backends POSIX and HF3FS.
 *
 * Storage: pool_size files "<file_path>/nixl_pool_<i>.bin" (16 MiB by
 * default), preallocated (fallocate) once the file system was found to
 * have the space, removed at stop, and divided into pages of page_size
 * bytes (the L1 page, 4096 by default). An object takes
 * 1 + ceil(len / page_size) pages: its header (objfmt.h) fills the first
 * page, the payload follows. Pages are taken as whole extents where
 * possible (exact-size free extents first, then never-used pages, then
 * pieces of the largest free extents), so an object is usually one
 * contiguous range and one I/O; a fragmented pool scatters it over several.
 *
 * Store:  pages for every key of the task are allocated in order; when the
 *         pool runs dry the batch ends there (later keys fail, counted in
 *         dry_batches and reported in status). Headers and checksums are
 *         computed in parallel on the workers, then the whole task goes to
 *         the I/O engine as one batched submission. Pages of a failed
 *         object are freed at once.
 * Lookup: memory index only (inline, no thread hop).
 * Load:   one batched read of every extent, then header, identity, length
 *         and checksum verified; any mismatch is a miss.
 * Usage:  slot based: pages in use x page_size, capacity = all pages.
 * Restart: like LMCache's static pool the index is volatile (files are
 *         named by slot, not by key, so nothing can be recovered without a
 *         journal; use nixl_store_dynamic or raw_block for persistence):
 *         the pool is removed at stop and at a failed start; files a
 *         killed server left are reused, empty.
 *
 * Threads: num_workers workers (tpool "nixlp<i>"), the I/O engine.
 * Locks: e->lock guards the page allocator and the record table; it is
 * taken after l2->lock is released, never together, never across I/O.
 */
#include "common/log.h"
#include "common/util.h"
#include "io/engine.h"
#include "io/tpool.h"
#include "kvtier/error.h"
#include "l2/adapters.h"
#include "l2/kit/fileobj.h"
#include "l2/engine.h"
#include "l2/life.h"
#include "l2/kit/objfmt.h"
#include "l2/nixl/nixl.h"
#include "l2/s3/s3_nixl.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

/* ---------------------------------------------------- page allocator */

static void cls_push_locked(struct ns_engine *e, uint32_t page, uint32_t n)
{
    struct ns_stack *s = &e->cls[n];
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 8;
        s->v = kvt_xrealloc(s->v, s->cap * sizeof(uint32_t));
    }
    s->v[s->n++] = page;
    e->cls_bm[n / 64] |= 1ull << (n % 64);
    e->free_extents++;
}

static uint32_t cls_pop_locked(struct ns_engine *e, uint32_t n)
{
    struct ns_stack *s = &e->cls[n];
    uint32_t p = s->v[--s->n];
    if (!s->n)
        e->cls_bm[n / 64] &= ~(1ull << (n % 64));
    e->free_extents--;
    return p;
}

static uint32_t cls_largest_locked(struct ns_engine *e)
{
    for (uint32_t w = (e->ppf + 64) / 64; w-- > 0;)
        if (e->cls_bm[w])
            return w * 64 + 63 - (uint32_t)__builtin_clzll(e->cls_bm[w]);
    return 0;
}

/* Release extents to the free classes. */
static void pages_free_locked(struct ns_engine *e, const struct ns_ext *x, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        cls_push_locked(e, x[i].page, x[i].n);
        e->free_pages += x[i].n;
    }
}

/*
 * Allocate `need` pages as few extents as the pool allows: an exact free
 * extent, else never-used pages (bump, within one file), else pieces of
 * the largest free extents (the rest of a split goes back). Returns the
 * extent count (0 when fewer than `need` pages are free: nothing taken).
 * Runs in O(extents x classes/64) with no scan over pages.
 */
static uint32_t pages_alloc_locked(struct ns_engine *e, uint32_t need, struct ns_ext **out)
{
    if (need == 0 || need > e->free_pages)
        return 0;
    if (need <= e->ppf && e->cls[need].n) {
        struct ns_ext *x = kvt_xmalloc(sizeof(*x));
        x->page = cls_pop_locked(e, need);
        x->n = need;
        e->free_pages -= need;
        *out = x;
        return 1;
    }
    uint32_t cap = 4, n = 0;
    struct ns_ext *x = kvt_xmalloc(cap * sizeof(*x));
    while (need) {
        uint32_t page, take;
        if (e->bump < e->pages) {
            uint32_t left_in_file = e->ppf - e->bump % e->ppf;
            if (left_in_file < need && need <= e->ppf && e->bump + left_in_file < e->pages &&
                n == 0) {
                /* keep the object whole: the file's tail becomes a free
                 * extent and the object starts in the next file */
                cls_push_locked(e, e->bump, left_in_file);
                e->bump += left_in_file;
                continue;
            }
            page = e->bump;
            take = KVT_MIN(need, left_in_file);
            e->bump += take;
        } else {
            uint32_t c = cls_largest_locked(e);
            KVT_ASSERT(c > 0); /* free_pages said there is room */
            page = cls_pop_locked(e, c);
            take = KVT_MIN(need, c);
            if (c > take)
                cls_push_locked(e, page + take, c - take);
        }
        if (n == cap) {
            cap *= 2;
            x = kvt_xrealloc(x, cap * sizeof(*x));
        }
        x[n].page = page;
        x[n].n = take;
        n++;
        need -= take;
        e->free_pages -= take;
    }
    *out = x;
    return n;
}

static uint32_t rec_new_locked(struct ns_engine *e)
{
    if (e->rec_free != UINT32_MAX) {
        uint32_t r = e->rec_free;
        e->rec_free = e->recs[r].next_free;
        return r;
    }
    if (e->nrecs == e->cap_recs) {
        e->cap_recs = e->cap_recs ? e->cap_recs * 2 : 1024;
        e->recs = kvt_xrealloc(e->recs, e->cap_recs * sizeof(*e->recs));
    }
    return e->nrecs++;
}

/* Free a record and its pages. */
static void rec_release(struct ns_engine *e, uint32_t r)
{
    pthread_mutex_lock(&e->lock);
    if (r < e->nrecs && e->recs[r].ext) {
        pages_free_locked(e, e->recs[r].ext, e->recs[r].nexts);
        free(e->recs[r].ext);
        e->recs[r].ext = NULL;
        e->recs[r].nexts = 0;
        e->recs[r].next_free = e->rec_free;
        e->rec_free = r;
    }
    pthread_mutex_unlock(&e->lock);
}

/* ------------------------------------------------------------- tasks */

struct ns_task;

struct ns_obj {
    struct kvt_job job; /* prep (store) or verify (load) on a worker */
    struct ns_task *nt;
    uint32_t i;
    uint32_t rec;
    struct ns_ext *ext; /* copy of the record's extents (owned) */
    uint32_t nexts;
    uint32_t plen;
    bool direct;
    bool active; /* store: pages allocated; load: record found */
    _Atomic uint32_t ios_left;
    _Atomic int err;
    struct kvt_io *ios;
    uint8_t *hdr; /* page-size aligned header buffer */
};

struct ns_task {
    kvt_l2 *l2;
    kvt_l2_task *t;
    _Atomic uint32_t prep_left; /* store: workers still preparing */
    _Atomic uint32_t objs_left; /* objects with I/O still running */
    uint32_t nios;
    struct kvt_io **iov; /* every request of the task, for one submitv */
    struct ns_obj objs[];
};

static void task_end(struct ns_task *nt)
{
    kvt_l2 *l2 = nt->l2;
    struct ns_engine *e = l2->engine;
    for (uint32_t i = 0; i < nt->t->n; i++) {
        free(nt->objs[i].ios);
        free(nt->objs[i].hdr);
        free(nt->objs[i].ext);
    }
    free(nt->iov);
    kvt_l2_task_finish(l2, nt->t);
    free(nt);
    kvt_l2_drain_leave(&e->drain);
}

static void obj_done(struct ns_task *nt)
{
    if (atomic_fetch_sub_explicit(&nt->objs_left, 1, memory_order_acq_rel) == 1)
        task_end(nt);
}

/* Build the requests of one object: extent k covers logical bytes
 * [sum of earlier extents, + n*page) of the stream header|payload. */
static void build_ios(struct ns_engine *e, struct ns_obj *ob, enum kvt_io_op op, uint8_t *payload,
                      void (*cb)(struct kvt_io *))
{
    uint64_t total = (uint64_t)e->page + ob->plen, at = 0;
    ob->ios = kvt_xcalloc(ob->nexts, sizeof(struct kvt_io));
    for (uint32_t k = 0; k < ob->nexts; k++) {
        const struct ns_ext *x = &ob->ext[k];
        uint32_t f = x->page / e->ppf;
        uint64_t off = (uint64_t)(x->page % e->ppf) * e->page;
        uint64_t span = KVT_MIN((uint64_t)x->n * e->page, total - at);
        int fd = ob->direct ? e->dfd[f] : e->fd[f];
        struct kvt_io *io = &ob->ios[k];
        kvt_io_prep(io, op, fd, off, cb, ob);
        uint64_t end = at + span;
        if (at < e->page) {
            kvt_io_add(io, ob->hdr + at, e->page - at);
            at = e->page;
        }
        if (end > at)
            kvt_io_add(io, payload + (at - e->page), end - at);
        at = end;
    }
    atomic_store(&ob->ios_left, ob->nexts);
}

/* ------------------------------------------------------------- store */

static void store_obj_finish(struct ns_obj *ob)
{
    struct ns_task *nt = ob->nt;
    kvt_l2 *l2 = nt->l2;
    struct ns_engine *e = l2->engine;
    kvt_l2_task *t = nt->t;
    kvt_key ck;
    kvt_l2_canon(l2, &t->keys[ob->i], &ck);
    int err = atomic_load(&ob->err);
    if (err) {
        kvt_l2_unreserve(l2, &ck);
        rec_release(e, ob->rec);
        kvt_l2_task_fail(t, ob->i, err);
        atomic_fetch_add(&l2->counters.store_failed, 1);
        char ks[400];
        kvt_warn("%s: store %s failed: %s", l2->name, kvt_key_str(&t->keys[ob->i], ks, sizeof(ks)),
                 kvt_strerror(err));
    } else {
        kvt_l2_publish(l2, &ck);
        atomic_fetch_add(&l2->counters.store_ok, 1);
        kvt_l2_task_ok(t, ob->i, (uint64_t)e->page + ob->plen);
    }
    obj_done(nt);
}

static void store_io_cb(struct kvt_io *io)
{
    struct ns_obj *ob = io->udata;
    if (io->res < 0 || (uint64_t)io->res != io->len) {
        int zero = 0;
        atomic_compare_exchange_strong(&ob->err, &zero, io->res < 0 ? io->res : -EIO);
    }
    if (atomic_fetch_sub_explicit(&ob->ios_left, 1, memory_order_acq_rel) == 1)
        store_obj_finish(ob); /* cheap: index updates only */
}

/* Header and checksum of one object, on a worker; the last one submits the
 * whole task's requests at once. */
static void store_prep_job(struct kvt_job *job, void *ctx)
{
    (void)ctx;
    struct ns_obj *ob = (struct ns_obj *)job;
    struct ns_task *nt = ob->nt;
    kvt_l2 *l2 = nt->l2;
    struct ns_engine *e = l2->engine;
    kvt_l2_task *t = nt->t;
    const kvt_buf *src = &t->bufs[ob->i];
    uint64_t sum = kvt_payload_hash(src->ptr, src->len);
    int rc = kvt_objhdr_encode(ob->hdr, (uint16_t)e->page, &t->keys[ob->i], &t->meta[ob->i], NULL,
                               t->meta[ob->i].serde, src->len, sum);
    if (rc)
        atomic_store(&ob->err, rc);
    build_ios(e, ob, KVT_IO_WRITE, src->ptr, store_io_cb);
    if (atomic_fetch_sub_explicit(&nt->prep_left, 1, memory_order_acq_rel) != 1)
        return;
    /* every object prepared: one batched submission. Objects whose header
     * failed are finished after it; nt stays alive until they are, and is
     * not touched after the last of them (it may be freed then). */
    uint32_t m = 0, nerr = 0;
    struct ns_obj **errs = kvt_xcalloc(t->n, sizeof(*errs));
    for (uint32_t i = 0; i < t->n; i++) {
        struct ns_obj *o = &nt->objs[i];
        if (!o->active)
            continue;
        if (atomic_load(&o->err))
            errs[nerr++] = o;
        else
            for (uint32_t k = 0; k < o->nexts; k++)
                nt->iov[m++] = &o->ios[k];
    }
    if (m)
        kvt_ioeng_submitv(e->io, nt->iov, m);
    for (uint32_t k = 0; k < nerr; k++)
        store_obj_finish(errs[k]);
    free(errs);
}

static void submit_store(kvt_l2 *l2, struct ns_engine *e, struct ns_task *nt)
{
    kvt_l2_task *t = nt->t;
    uint32_t active = 0, nios = 0;
    bool dry = false;
    for (uint32_t i = 0; i < t->n; i++) {
        struct ns_obj *ob = &nt->objs[i];
        ob->nt = nt;
        ob->i = i;
        const kvt_buf *src = &t->bufs[i];
        if (dry) {
            kvt_l2_task_fail(t, i, KVT_E_FULL);
            atomic_fetch_add(&l2->counters.store_failed, 1);
            continue;
        }
        if (src->len > KVT_MAX_OBJECT || src->len + e->page > (uint64_t)e->pages * e->page) {
            /* one header page + the payload pages must fit the pool */
            kvt_l2_too_big(l2, t, i, src->len,
                           KVT_MIN((uint64_t)(e->pages - 1) * e->page, KVT_MAX_OBJECT),
                           "pool_size x file_size minus one header page: raise them");
            continue;
        }
        uint32_t npages = 1 + (uint32_t)((src->len + e->page - 1) / e->page);
        uint32_t logical = t->meta[i].len ? t->meta[i].len : (uint32_t)src->len;
        t->meta[i].len = logical;
        kvt_key ck;
        kvt_l2_canon(l2, &t->keys[i], &ck);
        pthread_mutex_lock(&e->lock);
        uint32_t rec = rec_new_locked(e);
        e->recs[rec].ext = NULL;
        pthread_mutex_unlock(&e->lock);
        int rc = kvt_l2_reserve(l2, &ck, npages * e->page, logical, rec, 0);
        struct ns_ext *x = NULL;
        uint32_t n = 0;
        if (rc == 0) {
            pthread_mutex_lock(&e->lock);
            n = pages_alloc_locked(e, npages, &x);
            if (n) {
                e->recs[rec].ext = kvt_xmalloc(n * sizeof(*x));
                memcpy(e->recs[rec].ext, x, n * sizeof(*x));
                e->recs[rec].nexts = n;
                e->recs[rec].plen = (uint32_t)src->len;
                if (n > 1)
                    e->scattered++;
            }
            pthread_mutex_unlock(&e->lock);
            if (!n) {
                kvt_l2_unreserve(l2, &ck);
                rc = KVT_E_FULL;
            }
        }
        if (rc) {
            pthread_mutex_lock(&e->lock);
            e->recs[rec].next_free = e->rec_free; /* unused record back */
            e->rec_free = rec;
            pthread_mutex_unlock(&e->lock);
        }
        if (rc == -EEXIST) {
            atomic_fetch_add(&l2->counters.store_skipped, 1);
            kvt_l2_task_ok(t, i, 0);
            continue;
        }
        if (rc == KVT_E_FULL) {
            /* the pool ran dry: this batch ends here (LMCache semantics) */
            dry = true;
            pthread_mutex_lock(&e->lock);
            e->dry_batches++;
            uint32_t fp = e->free_pages;
            pthread_mutex_unlock(&e->lock);
            kvt_warn_once(&e->warned_dry,
                          "%s: page pool ran dry (%u pages free, %u needed): the batch ends "
                          "there; counted in dry_batches (add an eviction block or raise "
                          "pool_size/file_size)",
                          l2->name, fp, npages);
            kvt_l2_task_fail(t, i, rc);
            atomic_fetch_add(&l2->counters.store_failed, 1);
            continue;
        }
        if (rc) {
            kvt_l2_task_fail(t, i, rc);
            atomic_fetch_add(&l2->counters.store_failed, 1);
            continue;
        }
        ob->rec = rec;
        ob->ext = x;
        ob->nexts = n;
        ob->plen = (uint32_t)src->len;
        ob->active = true;
        ob->direct = kvt_odirect_ok(l2, &e->od, src->ptr, src->len);
        ob->hdr = kvt_xmemalign(KVT_MAX(4096u, e->page), e->page);
        active++;
        nios += n;
    }
    if (!active) {
        task_end(nt);
        return;
    }
    nt->iov = kvt_xcalloc(nios, sizeof(struct kvt_io *));
    atomic_store(&nt->objs_left, active);
    atomic_store(&nt->prep_left, active);
    /* nt may be freed once the last job is queued: collect them first */
    struct kvt_job **jobs = kvt_xcalloc(active, sizeof(*jobs));
    uint32_t m = 0;
    for (uint32_t i = 0; i < t->n; i++) {
        struct ns_obj *ob = &nt->objs[i];
        if (!ob->active)
            continue;
        ob->job.fn = store_prep_job;
        jobs[m++] = &ob->job;
    }
    for (uint32_t k = 0; k < m; k++)
        kvt_tpool_push(e->work, jobs[k]);
    free(jobs);
}

/* -------------------------------------------------------------- load */

static void load_verify(struct ns_obj *ob)
{
    struct ns_task *nt = ob->nt;
    kvt_l2 *l2 = nt->l2;
    struct ns_engine *e = l2->engine;
    kvt_l2_task *t = nt->t;
    kvt_buf *dst = &t->bufs[ob->i];
    int rc = atomic_load(&ob->err);
    const char *why = NULL;
    struct kvt_objhdr h;
    if (!rc) {
        rc = kvt_objhdr_decode(ob->hdr, e->page, &h, &why);
        if (!rc && !kvt_objhdr_matches(&h, KVT_CODEC_OBJ, &t->keys[ob->i])) {
            why = "header names another key";
            rc = KVT_E_CORRUPT;
        }
        if (!rc && h.payload_len != ob->plen) {
            why = "payload length does not match the index";
            rc = KVT_E_CORRUPT;
        }
        if (!rc && kvt_payload_hash(dst->ptr, ob->plen) != h.payload_xxh3) {
            why = "payload checksum mismatch";
            rc = KVT_E_CORRUPT;
        }
        if (rc == KVT_E_CORRUPT)
            kvt_l2_slot_corrupt(l2, &t->keys[ob->i], UINT32_MAX, why);
    }
    if (rc) {
        kvt_l2_task_fail(t, ob->i, rc);
    } else {
        t->meta[ob->i] = h.meta;
        dst->len = ob->plen;
        kvt_l2_task_ok(t, ob->i, (uint64_t)e->page + ob->plen);
    }
    obj_done(nt);
}

static void load_verify_job(struct kvt_job *job, void *ctx)
{
    (void)ctx;
    load_verify((struct ns_obj *)job);
}

static void load_io_cb(struct kvt_io *io)
{
    struct ns_obj *ob = io->udata;
    if (io->res < 0 || (uint64_t)io->res != io->len) {
        int zero = 0;
        atomic_compare_exchange_strong(&ob->err, &zero, io->res < 0 ? io->res : KVT_E_CORRUPT);
    }
    if (atomic_fetch_sub_explicit(&ob->ios_left, 1, memory_order_acq_rel) != 1)
        return;
    struct ns_engine *e = ob->nt->l2->engine;
    if (kvt_ioeng_cb_may_block(e->io)) {
        load_verify(ob);
    } else { /* the checksum is CPU work: not on the ring thread */
        ob->job.fn = load_verify_job;
        kvt_tpool_push(e->work, &ob->job);
    }
}

static void submit_load(kvt_l2 *l2, struct ns_engine *e, struct ns_task *nt)
{
    kvt_l2_task *t = nt->t;
    uint32_t active = 0, nios = 0;
    for (uint32_t i = 0; i < t->n; i++) {
        struct ns_obj *ob = &nt->objs[i];
        ob->nt = nt;
        ob->i = i;
        kvt_key ck;
        kvt_l2_canon(l2, &t->keys[i], &ck);
        uint32_t rec = UINT32_MAX;
        pthread_mutex_lock(&l2->lock);
        struct kvt_l2_obj *o = kvt_l2_find_locked(l2, &ck);
        if (o && kvt_l2_obj_state(o) == KVT_OBJ_READY)
            rec = o->aux;
        pthread_mutex_unlock(&l2->lock);
        if (rec == UINT32_MAX) {
            kvt_l2_task_fail(t, i, KVT_E_NOTFOUND);
            continue;
        }
        pthread_mutex_lock(&e->lock);
        if (rec < e->nrecs && e->recs[rec].ext) {
            ob->nexts = e->recs[rec].nexts;
            ob->plen = e->recs[rec].plen;
            ob->ext = kvt_xmalloc(ob->nexts * sizeof(struct ns_ext));
            memcpy(ob->ext, e->recs[rec].ext, ob->nexts * sizeof(struct ns_ext));
        }
        pthread_mutex_unlock(&e->lock);
        if (!ob->ext) {
            kvt_l2_task_fail(t, i, KVT_E_NOTFOUND);
            continue;
        }
        if (ob->plen > t->bufs[i].len) {
            kvt_l2_task_fail(t, i, KVT_E_TOOBIG); /* never an overrun */
            continue;
        }
        ob->hdr = kvt_xmemalign(KVT_MAX(4096u, e->page), e->page);
        ob->direct = kvt_odirect_ok(l2, &e->od, t->bufs[i].ptr, ob->plen);
        ob->active = true;
        build_ios(e, ob, KVT_IO_READ, t->bufs[i].ptr, load_io_cb);
        active++;
        nios += ob->nexts;
    }
    if (!active) {
        task_end(nt);
        return;
    }
    nt->iov = kvt_xcalloc(nios, sizeof(struct kvt_io *));
    uint32_t m = 0;
    for (uint32_t i = 0; i < t->n; i++)
        for (uint32_t k = 0; nt->objs[i].active && k < nt->objs[i].nexts; k++)
            nt->iov[m++] = &nt->objs[i].ios[k];
    atomic_store(&nt->objs_left, active);
    kvt_ioeng_submitv(e->io, nt->iov, m);
}

static void ns_submit(kvt_l2 *l2, kvt_l2_task *t)
{
    struct ns_engine *e = l2->engine;
    if (t->kind == KVT_L2_LOOKUP) { /* memory index only */
        kvt_l2_lookup_index(l2, t);
        return;
    }
    struct ns_task *nt = kvt_xcalloc(1, sizeof(*nt) + t->n * sizeof(struct ns_obj));
    nt->l2 = l2;
    nt->t = t;
    kvt_l2_drain_enter(&e->drain);
    if (t->kind == KVT_L2_STORE)
        submit_store(l2, e, nt);
    else
        submit_load(l2, e, nt);
}

static int ns_remove(kvt_l2 *l2, const struct kvt_l2_obj *o)
{
    rec_release(l2->engine, o->aux);
    return 0;
}

static void ns_status(kvt_l2 *l2, json_t *out)
{
    struct ns_engine *e = l2->engine;
    json_object_set_new(out, "file_path", json_string(e->base));
    json_object_set_new(out, "pool_size", json_integer(e->nfiles));
    json_object_set_new(out, "file_size", json_integer((json_int_t)e->ppf * e->page));
    json_object_set_new(out, "page_size", json_integer(e->page));
    json_object_set_new(out, "num_workers", json_integer(e->nworkers));
    kvt_odirect_status(&e->od, out);
    json_object_set_new(out, "io", kvt_ioeng_status(e->io));
    pthread_mutex_lock(&e->lock);
    json_object_set_new(out, "pool_pages", json_integer(e->pages));
    json_object_set_new(out, "pool_free_pages", json_integer(e->free_pages));
    json_object_set_new(out, "pool_free_extents", json_integer(e->free_extents));
    json_object_set_new(out, "scattered_objects", json_integer((json_int_t)e->scattered));
    json_object_set_new(out, "dry_batches", json_integer((json_int_t)e->dry_batches));
    pthread_mutex_unlock(&e->lock);
}

static void engine_free(struct ns_engine *e)
{
    for (uint32_t i = 0; e->fd && i < e->nfiles; i++) {
        if (e->fd[i] >= 0)
            close(e->fd[i]);
        if (e->dfd[i] >= 0)
            close(e->dfd[i]);
    }
    free(e->fd);
    free(e->dfd);
    for (uint32_t c = 0; e->cls && c <= e->ppf; c++)
        free(e->cls[c].v);
    free(e->cls);
    free(e->cls_bm);
    for (uint32_t r = 0; r < e->nrecs; r++)
        free(e->recs[r].ext);
    free(e->recs);
    if (e->dirfd >= 0)
        close(e->dirfd);
    free(e->base);
    pthread_mutex_destroy(&e->lock);
    kvt_l2_drain_destroy(&e->drain);
    free(e);
}

static void ns_close(kvt_l2 *l2)
{
    struct ns_engine *e = l2->engine;
    /* no engine thread and no parking: the drain, then the pool */
    kvt_l2_life_stop(l2, &(struct kvt_l2_life){.drain = &e->drain, .pools = {e->work}});
    kvt_ioeng_destroy(e->io);
    kvt_nixl_pool_remove(e, e->nfiles);
    engine_free(e);
    l2->engine = NULL;
}

static const struct kvt_l2_ops ns_ops = {
    .submit = ns_submit,
    .remove = ns_remove,
    .status = ns_status,
    .close = ns_close,
};

static int ns_parse(struct kvt_cfg *c, void *o)
{
    return kvt_nixl_parse(c, o, false);
}

static int ns_open(kvt_l2 *l2, const struct kvt_l2_spec *spec, const void *opts, char *err,
                   size_t errcap)
{
    const struct kvt_nixl_opts *o = opts;
    if (o->obj) /* backend OBJ: the s3 engine */
        return kvt_s3_open_nixl_obj(l2, spec, o->obj, err, errcap);
    uint64_t ppf = o->file_size / o->page_size;
    uint64_t pages = ppf * o->pool_size; /* in range: kvt_nixl_parse checked */
    KVT_ASSERT(ppf >= 2 && pages <= UINT32_MAX - 1);
    int rc = kvt_l2_life_init(l2, &ns_ops, spec, KVT_CODEC_OBJ, pages * o->page_size, err, errcap);
    if (rc)
        return rc;
    l2->persist_enabled = false; /* volatile index, see the top comment */
    struct ns_engine *e = kvt_xcalloc(1, sizeof(*e));
    e->dirfd = -1;
    pthread_mutex_init(&e->lock, NULL);
    kvt_l2_drain_init(&e->drain);
    e->nfiles = o->pool_size;
    e->ppf = (uint32_t)ppf;
    e->page = o->page_size;
    e->pages = (uint32_t)pages;
    e->free_pages = e->pages;
    e->rec_free = UINT32_MAX;
    e->nworkers = o->num_workers;
    e->cls = kvt_xcalloc(e->ppf + 1, sizeof(*e->cls));
    e->cls_bm = kvt_xcalloc((e->ppf + 64) / 64, sizeof(uint64_t));
    e->fd = kvt_xcalloc(e->nfiles, sizeof(int));
    e->dfd = kvt_xcalloc(e->nfiles, sizeof(int));
    for (uint32_t i = 0; i < e->nfiles; i++)
        e->fd[i] = e->dfd[i] = -1;
    l2->engine = e;
    char abs[PATH_MAX];
    if (o->file_path[0] != '/' && getcwd(abs, sizeof(abs)))
        snprintf(abs + strlen(abs), sizeof(abs) - strlen(abs), "/%s", o->file_path);
    else
        snprintf(abs, sizeof(abs), "%s", o->file_path);
    e->base = kvt_xstrdup(abs);
    if (mkdir(e->base, 0755) == 0) {
        e->made_dir = true;
    } else if (errno != EEXIST) {
        rc = -errno;
        snprintf(err, errcap, "cannot create file_path %s: %s", e->base, kvt_strerror(-errno));
        goto fail;
    }
    e->dirfd = open(e->base, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (e->dirfd < 0) {
        rc = -errno;
        snprintf(err, errcap, "cannot open file_path %s: %s", e->base, kvt_strerror(-errno));
        goto fail;
    }
    kvt_odirect_init(&e->od, o->use_direct_io, e->dirfd, 4096, e->base);
    if (e->od.on && e->page % e->od.blksz) {
        kvt_warn("%s: page_size %u is not a multiple of the block size %u: O_DIRECT off", l2->name,
                 e->page, e->od.blksz);
        e->od.on = false;
    }
    rc = kvt_nixl_pool_lock(e, err, errcap);
    if (rc)
        goto fail;
    /* the space first: a pool that cannot be allocated in full is not
     * begun (a start that fails removes what it allocated) */
    uint64_t need, avail;
    kvt_nixl_pool_space(e->dirfd, e->nfiles, o->file_size, &need, &avail);
    rc = kvt_nixl_pool_space_check(e->base, o, need, avail, err, errcap);
    if (rc)
        goto fail;
    kvt_nixl_pool_remove_stale(e);
    kvt_info("%s: preallocating %.2f GiB under %s (pool_size %u x file_size %.2f MiB; removed "
             "at stop)",
             l2->name, (double)o->pool_size * (double)o->file_size / KVT_GIB, e->base, o->pool_size,
             (double)o->file_size / (1 << 20));
    for (uint32_t i = 0; i < e->nfiles; i++) {
        rc = kvt_nixl_pool_open_file(l2, e, i, o->file_size, err, errcap);
        if (rc)
            goto fail;
    }
    char nm[16];
    snprintf(nm, sizeof(nm), "nixlpio%d", spec->index);
    int depth = o->io_engine == KVT_IOENG_URING ? o->queue_depth : o->num_workers;
    rc = kvt_ioeng_create(&e->io, (enum kvt_ioeng_kind)o->io_engine, nm, depth, err, errcap);
    if (rc)
        goto fail;
    snprintf(nm, sizeof(nm), "nixlp%d", spec->index);
    rc = kvt_tpool_create(&e->work, nm, o->num_workers, NULL, NULL, NULL);
    if (rc) {
        snprintf(err, errcap, "cannot start worker threads: %s", kvt_strerror(rc));
        goto fail;
    }
    kvt_info("%s: pool of %u files x %llu bytes (%u pages of %u bytes) under %s", l2->name,
             e->nfiles, (unsigned long long)o->file_size, e->pages, e->page, e->base);
    return 0;
fail:
    kvt_ioeng_destroy(e->io);
    kvt_nixl_pool_remove(e, e->nfiles); /* no partial pool stays behind */
    engine_free(e);
    l2->engine = NULL;
    kvt_l2_base_destroy(l2);
    return rc ? rc : KVT_E_CONFIG;
}

static void ns_opts_free(void *opts)
{
    struct kvt_nixl_opts *o = opts;
    kvt_s3_nixl_obj_free(o->obj);
    o->obj = NULL;
}

/* A budget is shared through a bucket (OBJ) only: the pool's index is
 * volatile and its files are this server's. */
static int ns_shared_budget(struct kvt_cfg *c, const void *opts)
{
    const struct kvt_nixl_opts *o = opts;
    return o->obj ? kvt_s3_nixl_obj_shared_budget(c, o->obj) : KVT_L2_NO_BUDGET;
}

const struct kvt_l2_adapter_desc kvt_l2_nixl_store_desc = {
    .name = "nixl_store",
    .opts_size = sizeof(struct kvt_nixl_opts),
    .parse = ns_parse,
    .open = ns_open,
    .opts_free = ns_opts_free,
    .check = kvt_nixl_pool_check,
    .storage = kvt_nixl_storage,
    .shared_budget = ns_shared_budget,
    .shared_budget_needs = "with backend OBJ",
    .budget_max_interval_ms = KVT_L2_BUDGET_LEASE_MS / 3,
};
