/*
 * fs adapter: one file per object under base_path, named by the LMCache fs
 * codec ("model@0x00000000@0@<hash hex>[@salt].data").
 *
 * File = object header (objfmt.h, 512 bytes, or one block with O_DIRECT)
 *        + payload.
 *
 * Store:  reserve capacity -> write "<name>.tmp.<pid>-<start>-<seq>" (O_EXCL,
 *         O_DIRECT when usable) -> optional fdatasync -> renameat2 with
 *         RENAME_NOREPLACE (first publisher wins) -> READY.
 * Lookup: index, then a secondary check on disk (files written after start-up
 *         by another host or process sharing the directory).
 * Load:   one preadv of header + payload into the destination, then verify
 *         header, identity, sizes and the payload checksum. Any mismatch is a
 *         miss, counted as corrupt, and the bad file is removed.
 * Start-up: a background thread scans the directory and restores accounting
 *         and LRU order (by mtime); stores wait until it is done so the cap
 *         holds, lookups and loads are served meanwhile.
 *
 * The fs_native type runs on this engine too: num_workers I/O threads are
 * its real queue depth, and its O_DIRECT rules are the seed's: a length
 * that is not a multiple of the block size is buffered for that operation
 * (counted in odirect_fallbacks); a misaligned buffer is refused with
 * EINVAL and a message naming --l1-align-bytes (counted in
 * odirect_misaligned), never a crash and never a silent fallback.
 *
 * Threads: num_workers I/O threads (tpool "fs<i>"), one scan thread at
 * start-up. Locks: l2->lock (base) is taken for index updates only, never
 * across I/O; e->park.lock guards the parked store list.
 */
#include "l2/adapters.h"
#include "common/log.h"
#include "common/util.h"
#include "io/tpool.h"
#include "kvtier/error.h"
#include "common/cfg.h"
#include "l2/kit/fileobj.h"
#include "l2/engine.h"
#include "l2/life.h"
#include "l2/kit/objfmt.h"
#include "l2/kit/scanq.h"
#include "l2/kit/dirlock.h"
#include "l2/kit/budget_file.h"
#include "l2/budget.h"
#include "l2/kit/tmpguard.h"
#include "key/blocktag.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#ifndef RENAME_NOREPLACE
#define RENAME_NOREPLACE (1 << 0)
#endif

enum fs_op { OP_STORE, OP_LOOKUP, OP_LOAD };

struct fs_batch;

struct fs_job {
    struct kvt_job job;
    struct fs_batch *b;
    uint32_t i;
};

struct fs_batch {
    kvt_l2 *l2;
    kvt_l2_task *t;
    enum fs_op op;
    _Atomic uint32_t left;
    struct fs_job jobs[];
};

struct fs_engine {
    char *base;
    char *tmp_rel; /* relative_tmp_dir or "" */
    int dirfd, tmpfd;
    int lockfd; /* l2/kit/dirlock.h: held until close; -1 where locks are unsupported */
    bool shared;
    struct kvt_odirect od;
    uint64_t read_ahead;
    bool durable;
    bool native; /* fs_native */
    int nworkers;
    struct kvt_tpool *pool;
    pid_t pid;
    uint64_t starttime;
    _Atomic uint64_t seq;

    pthread_t scan_thr;
    bool scan_started;
    _Atomic bool stop;

    struct kvt_l2_park park; /* store jobs waiting for recovery */

    _Atomic uint64_t tmp_removed;
};

/* The header buffer: the largest header area fs writes (a tag grows it up
 * to KVT_OBJHDR_MAX, an O_DIRECT block may be larger) and reads. */
static uint32_t hdr_buf_len(const struct fs_engine *e)
{
    return KVT_MAX((uint32_t)KVT_OBJHDR_MAX, e->od.blksz);
}

/* Per worker: an aligned header buffer for O_DIRECT transfers. */
static void *worker_ctx_new(int i, void *arg)
{
    (void)i;
    struct fs_engine *e = arg;
    void *p = NULL;
    if (posix_memalign(&p, KVT_MAX(4096u, e->od.blksz), hdr_buf_len(e)))
        return NULL;
    return p;
}

static void worker_ctx_free(void *ctx)
{
    free(ctx);
}

/* The header area of key's object: 512 bytes, or the O_DIRECT block size
 * for an O_DIRECT transfer, grown to a multiple of either to hold the
 * engine block hashes (tag, may be NULL) */
static uint16_t hdr_len_for(struct fs_engine *e, bool direct, const kvt_key *key,
                            const struct kvt_blocktag *tag)
{
    return kvt_objhdr_len(key, tag, direct ? e->od.blksz : KVT_OBJHDR_MIN, hdr_buf_len(e));
}

/* Is hl a header area written for O_DIRECT (a multiple of the block size)? */
static bool hdr_direct(const struct fs_engine *e, uint16_t hl)
{
    return e->od.blksz && hl % e->od.blksz == 0;
}

static void batch_job_done(struct fs_batch *b)
{
    if (atomic_fetch_sub_explicit(&b->left, 1, memory_order_acq_rel) == 1) {
        kvt_l2_task_finish(b->l2, b->t);
        free(b);
    }
}

/* ------------------------------------------------------------- store */

/* fs_native with O_DIRECT: a transfer whose length qualifies for O_DIRECT
 * but whose buffer is not block aligned is an error (its seed section),
 * where fs falls back to buffered I/O. Returns 0 or -EINVAL. */
static int misaligned_native(kvt_l2 *l2, struct fs_engine *e, const void *buf, uint64_t len)
{
    struct kvt_odirect *od = &e->od;
    if (!e->native || !od->on || atomic_load(&od->refused) || len % od->blksz ||
        (uintptr_t)buf % od->blksz == 0)
        return 0;
    atomic_fetch_add(&od->misaligned, 1);
    kvt_warn_once(&od->warned_align,
                  "%s: buffer %p is not aligned to the block size %u that O_DIRECT requires: "
                  "transfer refused with EINVAL (raise --l1-align-bytes to a multiple of %u, "
                  "or set use_odirect false); counted in odirect_misaligned",
                  l2->name, buf, od->blksz, od->blksz);
    return -EINVAL;
}

static int write_object(kvt_l2 *l2, struct fs_engine *e, void *hdrbuf, const char *name,
                        const kvt_key *key, const kvt_objmeta *meta, const struct kvt_blocktag *tag,
                        const kvt_buf *src, uint16_t *hdr_out)
{
    char tmp[KVT_NAME_MAX + 64];
    int rc = misaligned_native(l2, e, src->ptr, src->len);
    if (rc)
        return rc;
    bool direct = kvt_odirect_ok(l2, &e->od, src->ptr, src->len);
    uint16_t hl = hdr_len_for(e, direct, key, tag);
    const kvt_objmeta *m = meta;
    uint64_t sum = kvt_payload_hash(src->ptr, src->len);
    rc = kvt_objhdr_encode(hdrbuf, hl, key, m, tag, m->serde, src->len, sum);
    if (rc)
        return rc;
    /* the name marks the writer by (pid, start time): l2/kit/tmpguard.h */
    rc = kvt_tmpguard_name(tmp, sizeof(tmp), name, e->pid, e->starttime,
                           atomic_fetch_add(&e->seq, 1));
    if (rc < 0)
        return rc;
    int fd = kvt_odirect_openat(l2, &e->od, e->tmpfd, tmp, O_WRONLY | O_CREAT | O_EXCL, &direct);
    if (fd < 0)
        return fd;
    /* the lock shows the write as live to guards in other pid namespaces;
     * a file system without locks still has the name */
    kvt_tmpguard_hold(fd);
    if (!direct && hl != hdr_len_for(e, false, key, tag)) { /* O_DIRECT fell back at open */
        hl = hdr_len_for(e, false, key, tag);
        kvt_objhdr_encode(hdrbuf, hl, key, m, tag, m->serde, src->len, sum);
    }
    struct iovec iov[2] = {{hdrbuf, hl}, {src->ptr, src->len}};
    uint64_t total = hl + src->len, done = 0;
    while (done < total) {
        ssize_t w = pwritev(fd, iov, 2, (off_t)done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            rc = w < 0 ? -errno : -EIO;
            goto fail;
        }
        done += (uint64_t)w;
        /* advance the iovecs past what was written (short write) */
        size_t adv = (size_t)w;
        for (int k = 0; k < 2 && adv; k++) {
            size_t take = KVT_MIN(adv, iov[k].iov_len);
            iov[k].iov_base = (char *)iov[k].iov_base + take;
            iov[k].iov_len -= take;
            adv -= take;
        }
        if (direct && done < total) {
            /* a short O_DIRECT write leaves an unaligned remainder */
            rc = -EIO;
            goto fail;
        }
    }
    if (e->durable && fdatasync(fd) < 0) {
        rc = -errno;
        goto fail;
    }
    if (close(fd) < 0) {
        fd = -1;
        rc = -errno;
        goto fail;
    }
    fd = -1;
    if (renameat2(e->tmpfd, tmp, e->dirfd, name, RENAME_NOREPLACE) < 0) {
        rc = -errno;
        goto fail;
    }
    if (e->durable)
        fsync(e->dirfd);
    *hdr_out = hl;
    return 0;
fail:
    if (fd >= 0)
        close(fd);
    unlinkat(e->tmpfd, tmp, 0);
    return rc;
}

static void run_store(struct fs_job *j, void *hdrbuf)
{
    struct fs_batch *b = j->b;
    kvt_l2 *l2 = b->l2;
    struct fs_engine *e = l2->engine;
    kvt_l2_task *t = b->t;
    uint32_t i = j->i;
    const kvt_buf *src = &t->bufs[i];
    kvt_key ck;
    kvt_l2_canon(l2, &t->keys[i], &ck);
    if (!hdrbuf) {
        kvt_l2_task_fail(t, i, -ENOMEM);
        atomic_fetch_add(&l2->counters.store_failed, 1);
        return;
    }
    if (src->len > KVT_MAX_OBJECT) {
        kvt_l2_task_fail(t, i, KVT_E_TOOBIG);
        atomic_fetch_add(&l2->counters.store_failed, 1);
        return;
    }
    /* the reservation uses the header size the write will most likely use;
     * it is corrected after the write if O_DIRECT fell back */
    /* the engine block hashes kept for the key (KV events) go into the
     * header, so that a restart names the object by them */
    struct kvt_blocktag *tag = kvt_l2_tag_of(l2, &ck);
    uint16_t hl = hdr_len_for(e, kvt_odirect_usable(&e->od, src->ptr, src->len), &ck, tag);
    uint32_t logical = t->meta[i].len ? t->meta[i].len : (uint32_t)src->len;
    t->meta[i].len = logical;
    int rc = kvt_l2_reserve(l2, &ck, (uint32_t)(hl + src->len), logical, hl, 0);
    if (rc == -EEXIST) {
        kvt_blocktag_put(tag);
        atomic_fetch_add(&l2->counters.store_skipped, 1);
        kvt_l2_task_ok(t, i, 0);
        return;
    }
    if (rc) {
        kvt_blocktag_put(tag);
        kvt_l2_task_fail(t, i, rc);
        atomic_fetch_add(&l2->counters.store_failed, 1);
        return;
    }
    uint16_t used_hl = hl;
    char name[KVT_NAME_MAX + 1];
    rc = kvt_key_encode(KVT_CODEC_FS, &t->keys[i], name);
    if (rc >= 0)
        rc = write_object(l2, e, hdrbuf, name, &t->keys[i], &t->meta[i], tag, src, &used_hl);
    kvt_blocktag_put(tag);
    if (rc == -EEXIST) {
        /* another writer published this name first: adopt its file */
        kvt_fileobj_store_adopt(l2, e->dirfd, name, t, i, &ck);
        return;
    }
    if (rc) {
        kvt_l2_unreserve(l2, &ck);
        kvt_l2_task_fail(t, i, rc);
        atomic_fetch_add(&l2->counters.store_failed, 1);
        char ks[400];
        kvt_debug("%s: store %s failed: %s", l2->name, kvt_key_str(&t->keys[i], ks, sizeof(ks)),
                  kvt_strerror(rc));
        return;
    }
    if (used_hl != hl) /* header size changed (O_DIRECT fell back at open): fix accounting */
        kvt_fileobj_set_hdr_len(l2, &ck, used_hl, src->len);
    kvt_l2_publish(l2, &ck);
    atomic_fetch_add(&l2->counters.store_ok, 1);
    kvt_l2_task_ok(t, i, used_hl + src->len);
}

/* ------------------------------------------------------------ lookup */

static void run_lookup(struct fs_job *j)
{
    struct fs_batch *b = j->b;
    kvt_l2 *l2 = b->l2;
    struct fs_engine *e = l2->engine;
    kvt_l2_task *t = b->t;
    uint32_t i = j->i;
    char name[KVT_NAME_MAX + 1];
    if (kvt_key_encode(KVT_CODEC_FS, &t->keys[i], name) < 0)
        return;
    kvt_fileobj_lookup(l2, e->dirfd, name, t, i);
}

/* -------------------------------------------------------------- load */

static void run_load(struct fs_job *j, void *hdrbuf)
{
    struct fs_batch *b = j->b;
    kvt_l2 *l2 = b->l2;
    struct fs_engine *e = l2->engine;
    kvt_l2_task *t = b->t;
    uint32_t i = j->i;
    kvt_buf *dst = &t->bufs[i];
    char name[KVT_NAME_MAX + 1];
    kvt_key ck;
    kvt_l2_canon(l2, &t->keys[i], &ck);
    if (!hdrbuf || kvt_key_encode(KVT_CODEC_FS, &t->keys[i], name) < 0)
        return;
    uint16_t hl = 0;
    int lrc = kvt_fileobj_load_hdr_len(l2, e->dirfd, name, &t->keys[i], hdr_buf_len(e), &hl);
    if (lrc) {
        kvt_l2_task_fail(t, i, lrc);
        return;
    }
    if (hdr_direct(e, hl) && misaligned_native(l2, e, dst->ptr, dst->len)) {
        kvt_l2_task_fail(t, i, -EINVAL);
        return;
    }
    bool direct = hdr_direct(e, hl) && kvt_odirect_ok(l2, &e->od, dst->ptr, dst->len);
    int fd = kvt_odirect_openat(l2, &e->od, e->dirfd, name, O_RDONLY, &direct);
    if (fd < 0) {
        int rc = fd;
        if (rc == -ENOENT) /* deleted behind our back (purge, another host) */
            kvt_l2_forget(l2, &ck);
        kvt_l2_task_fail(t, i, rc);
        return;
    }
    if (e->read_ahead)
        posix_fadvise(fd, 0, (off_t)KVT_MIN(e->read_ahead, hl + dst->len), POSIX_FADV_WILLNEED);
    struct stat st;
    int rc = 0;
    uint64_t plen = 0;
    const char *why = "file size does not match the destination";
    if (fstat(fd, &st) < 0)
        rc = -errno;
    else /* a changed size is corrupt; larger than the destination: -EOVERFLOW */
        rc =
            kvt_fileobj_load_size(l2, &t->keys[i], (uint64_t)st.st_size, hl, dst->len, &plen, &why);
    if (!rc && direct && plen % e->od.blksz)
        direct = false; /* cannot happen for files we wrote with O_DIRECT */
    struct iovec iov[2] = {{hdrbuf, hl}, {dst->ptr, plen}};
    uint64_t total = hl + plen, done = 0;
    while (!rc && done < total) {
        ssize_t r = preadv(fd, iov, 2, (off_t)done);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            rc = r < 0 ? -errno : KVT_E_CORRUPT;
            break;
        }
        done += (uint64_t)r;
        size_t adv = (size_t)r;
        for (int k = 0; k < 2 && adv; k++) {
            size_t take = KVT_MIN(adv, iov[k].iov_len);
            iov[k].iov_base = (char *)iov[k].iov_base + take;
            iov[k].iov_len -= take;
            adv -= take;
        }
    }
    close(fd);
    kvt_fileobj_load_done(l2, e->dirfd, name, t, i, hdrbuf, hl, plen, rc,
                          rc == KVT_E_CORRUPT ? why : "file shorter than its size at open");
}

/* ------------------------------------------------------------ submit */

static void job_fn(struct kvt_job *job, void *ctx)
{
    struct fs_job *j = (struct fs_job *)job;
    struct fs_batch *b = j->b;
    struct fs_engine *e = b->l2->engine;
    if (b->op == OP_STORE) {
        /* stores wait for the start-up scan so the cap counts old files */
        if (kvt_l2_park(&e->park, job))
            return;
        run_store(j, ctx);
    } else if (b->op == OP_LOOKUP) {
        run_lookup(j);
    } else {
        run_load(j, ctx);
    }
    batch_job_done(b);
}

static void fs_submit(kvt_l2 *l2, kvt_l2_task *t)
{
    struct fs_engine *e = l2->engine;
    enum fs_op op = t->kind == KVT_L2_STORE    ? OP_STORE
                    : t->kind == KVT_L2_LOOKUP ? OP_LOOKUP
                                               : OP_LOAD;
    /* fast path: every key indexed with a known header: no thread hop */
    if (op == OP_LOOKUP && kvt_l2_lookup_known(l2, t))
        return;
    struct fs_batch *b = kvt_xcalloc(1, sizeof(*b) + t->n * sizeof(struct fs_job));
    b->l2 = l2;
    b->t = t;
    b->op = op;
    atomic_store(&b->left, t->n);
    for (uint32_t i = 0; i < t->n; i++) {
        b->jobs[i].b = b;
        b->jobs[i].i = i;
        b->jobs[i].job.fn = job_fn;
    }
    /* the last job may finish (and the task be freed by its owner) before
     * this loop ends: never read t or b after the final push */
    uint32_t n = t->n;
    for (uint32_t i = 0; i < n; i++)
        kvt_tpool_push(e->pool, &b->jobs[i].job);
}

static int fs_remove(kvt_l2 *l2, const struct kvt_l2_obj *o)
{
    struct fs_engine *e = l2->engine;
    char name[KVT_NAME_MAX + 1];
    int rc = kvt_key_encode(KVT_CODEC_FS, &o->key, name);
    if (rc < 0)
        return rc;
    return unlinkat(e->dirfd, name, 0) < 0 ? -errno : 0;
}

/* ------------------------------------------------------ recovery scan */

/* Remove the tmp file nm in dfd when the tmp guard allows it
 * (kvt_tmpguard_sweep: our own only when closing). */
static void sweep_one(struct fs_engine *e, struct kvt_tmpguard *g, int dfd, const char *nm,
                      bool closing)
{
    if (kvt_tmpguard_sweep(g, dfd, nm, closing, NULL) == KVT_SWEEP_REMOVED)
        atomic_fetch_add(&e->tmp_removed, 1);
}

static void sweep_tmp(struct fs_engine *e, int dfd, bool closing)
{
    int fd = openat(dfd, ".",
                    O_RDONLY | O_DIRECTORY | O_CLOEXEC); /* not dup: a dup shares the read offset */
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0)
            close(fd);
        return;
    }
    struct kvt_tmpguard g;
    kvt_tmpguard_init(&g, e->dirfd);
    struct dirent *de;
    while ((de = readdir(d)))
        if (de->d_name[0] != '.' && kvt_tmpguard_is_tmp(de->d_name))
            sweep_one(e, &g, dfd, de->d_name, closing);
    kvt_tmpguard_fini(&g);
    closedir(d);
}

/* The start-up sweep of the tmp files the scan saw in the object directory
 * (no second pass over a directory of a million names). */
static void sweep_tmp_names(struct fs_engine *e, char **names, size_t n)
{
    struct kvt_tmpguard g;
    kvt_tmpguard_init(&g, e->dirfd);
    for (size_t i = 0; i < n; i++) {
        sweep_one(e, &g, e->dirfd, names[i], false);
        free(names[i]);
    }
    kvt_tmpguard_fini(&g);
    free(names);
}

static void *scan_main(void *arg)
{
    kvt_l2 *l2 = arg;
    struct fs_engine *e = l2->engine;
    pthread_setname_np(pthread_self(), "fs-scan");
    uint64_t t0 = kvt_now_ns();
    struct kvt_l2_found_vec fv = {0};
    struct kvt_l2_scanq *sq = kvt_l2_scanq_new(&fv);
    int fd = openat(e->dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0)
            close(fd);
        kvt_error("%s: cannot scan %s: %s", l2->name, e->base, kvt_strerror(-errno));
    }
    char **tmps = NULL;
    size_t ntmp = 0, tmpcap = 0;
    struct dirent *de = NULL;
    /* a walk cut short (closing, a directory that cannot be read) may have
     * missed objects: the shared budget's recount is skipped then */
    bool incomplete = !d;
    while (d && !atomic_load(&e->stop) &&
           (errno = 0, de = readdir(d), incomplete = !de && errno, de)) {
        size_t len = strlen(de->d_name);
        if (len < 6 || strcmp(de->d_name + len - 5, ".data") != 0) {
            if (de->d_name[0] != '.' && kvt_tmpguard_is_tmp(de->d_name)) {
                if (ntmp == tmpcap) {
                    tmpcap = tmpcap ? 2 * tmpcap : 16;
                    tmps = kvt_xrealloc(tmps, tmpcap * sizeof(*tmps));
                }
                tmps[ntmp++] = kvt_xstrdup(de->d_name);
            }
            continue;
        }
        kvt_key k, ck;
        if (kvt_key_decode(KVT_CODEC_FS, de->d_name, len, &k))
            continue;
        kvt_key_canon(KVT_CODEC_FS, &k, &ck);
        /* stat'ed in batches; the header is read at the first lookup */
        kvt_l2_scanq_add(sq, e->dirfd, de->d_name, &ck);
    }
    kvt_l2_scanq_free(sq);
    if (d)
        closedir(d);
    sweep_tmp_names(e, tmps, ntmp);
    if (e->tmpfd != e->dirfd)
        sweep_tmp(e, e->tmpfd, false);
    if (incomplete || atomic_load(&e->stop))
        kvt_l2_budget_recount_end(l2, 0, false);
    /* with KV events on, the engine block hashes each object was written
     * with name it in the events (a header read per object; the rest of the
     * header is verified at its first lookup or load, as without events) */
    for (size_t i = 0; l2->keep_tags && i < fv.n && !atomic_load(&e->stop); i++) {
        char name[KVT_NAME_MAX + 1];
        if (kvt_key_encode(KVT_CODEC_FS, &fv.v[i].key, name) >= 0)
            fv.v[i].tag =
                kvt_fileobj_read_tag(e->dirfd, name, l2->codec, &fv.v[i].key, fv.v[i].stored);
    }
    kvt_l2_finish_recovery(l2, &fv, t0, e->base);
    if (atomic_load(&e->tmp_removed))
        kvt_info("%s: removed %llu tmp files left by dead writers", l2->name,
                 (unsigned long long)atomic_load(&e->tmp_removed));
    /* release the stores that waited for the scan */
    kvt_l2_park_release(&e->park, e->pool);
    return NULL;
}

/* ------------------------------------------------------- status/close */

static void fs_status(kvt_l2 *l2, json_t *out)
{
    struct fs_engine *e = l2->engine;
    json_object_set_new(out, "base_path", json_string(e->base));
    json_object_set_new(out, "num_workers", json_integer(e->nworkers));
    json_object_set_new(out, "queued_jobs", json_integer((json_int_t)kvt_tpool_queued(e->pool)));
    kvt_odirect_status(&e->od, out);
    json_object_set_new(out, "durable", json_boolean(e->durable));
    json_object_set_new(out, "shared", json_boolean(e->shared));
    if (e->native)
        json_object_set_new(out, "odirect_misaligned",
                            json_integer((json_int_t)atomic_load(&e->od.misaligned)));
    json_object_set_new(out, "tmp_removed_at_start",
                        json_integer((json_int_t)atomic_load(&e->tmp_removed)));
}

static void fs_root(kvt_l2 *l2, char *out, size_t cap)
{
    const struct fs_engine *e = l2->engine;
    snprintf(out, cap, "%s", e->base);
}

static bool fs_healthy(kvt_l2 *l2, char *msg, size_t cap)
{
    struct fs_engine *e = l2->engine;
    return kvt_fileobj_healthy(e->dirfd, &e->od, "base_path", msg, cap);
}

static void fs_close(kvt_l2 *l2)
{
    struct fs_engine *e = l2->engine;
    /* no drain count: the pool runs what is queued, pending writes drain;
     * parked stores are released by the scan itself */
    kvt_l2_life_stop(l2, &(struct kvt_l2_life){.stop_flag = &e->stop,
                                               .thread = &e->scan_thr,
                                               .thread_started = &e->scan_started,
                                               .pools = {e->pool}});
    if (!l2->persist_enabled)
        kvt_fileobj_remove_indexed(l2);
    sweep_tmp(e, e->tmpfd, true); /* tmp leftovers: ours always, others by the guard */
    if (e->tmpfd != e->dirfd)
        close(e->tmpfd);
    close(e->dirfd);
    if (e->lockfd >= 0)
        close(e->lockfd); /* last: the files above were ours to remove */
    free(e->base);
    free(e->tmp_rel);
    kvt_l2_park_destroy(&e->park);
    free(e);
    l2->engine = NULL;
}

static const struct kvt_l2_ops fs_ops = {
    .submit = fs_submit,
    .remove = fs_remove,
    .status = fs_status,
    .healthy = fs_healthy,
    .root = fs_root,
    .close = fs_close,
};

/* ---------------------------------------------------------- creation */

struct kvt_fs_opts {
    const char *base_path;
    const char *relative_tmp_dir;
    uint64_t read_ahead_size;
    bool use_odirect;
    int num_workers;
    uint64_t max_capacity_bytes;
    bool durable;
    bool native; /* fs_native: O_DIRECT on a misaligned buffer is an error */
    bool shared; /* "shared": other servers use base_path too (l2/kit/dirlock.h) */
};

static int fs_parse(struct kvt_cfg *c, struct kvt_fs_opts *o, bool native)
{
    memset(o, 0, sizeof(*o));
    kvt_cfg_str(c, "base_path", true, NULL, &o->base_path);
    kvt_cfg_str(c, "relative_tmp_dir", false, "", &o->relative_tmp_dir);
    int64_t ra = 0, nw = 4;
    if (kvt_cfg_has(c, "read_ahead_size"))
        kvt_cfg_int(c, "read_ahead_size", false, 0, 1, INT64_MAX, &ra);
    o->read_ahead_size = (uint64_t)ra;
    kvt_cfg_bool(c, "use_odirect", false, &o->use_odirect);
    kvt_cfg_int(c, "num_workers", false, 4, 1, 1024, &nw);
    o->num_workers = (int)nw;
    double cap = 0;
    kvt_cfg_num(c, "max_capacity_gb", false, 0, 0, 1e9, &cap);
    o->max_capacity_bytes = (uint64_t)(cap * KVT_GIB);
    kvt_cfg_bool(c, "durable", false, &o->durable);
    kvt_cfg_bool(c, "shared", false, &o->shared);
    o->native = native;
    if (c->rc)
        return c->rc;
    if (o->relative_tmp_dir[0]) {
        const char *r = o->relative_tmp_dir;
        if (r[0] == '/' || strstr(r, "..") || strchr(r, '/'))
            return kvt_cfg_fail(c, "relative_tmp_dir",
                                "must be a single directory name inside base_path (got \"%s\")", r);
    }
    if (!o->base_path[0])
        return kvt_cfg_fail(c, "base_path", "must not be empty");
    return 0;
}

static int fs_parse_plain(struct kvt_cfg *c, void *o)
{
    return fs_parse(c, o, false);
}

static int fs_parse_native(struct kvt_cfg *c, void *o)
{
    return fs_parse(c, o, true);
}

static int fs_open(kvt_l2 *l2, const struct kvt_l2_spec *spec, const void *opts, char *err,
                   size_t errcap)
{
    const struct kvt_fs_opts *o = opts;
    int rc = kvt_l2_life_init(l2, &fs_ops, spec, KVT_CODEC_FS, o->max_capacity_bytes, err, errcap);
    if (rc)
        return rc;
    struct fs_engine *e = kvt_xcalloc(1, sizeof(*e));
    e->dirfd = e->tmpfd = e->lockfd = -1;
    kvt_l2_park_init(&e->park);
    char abs[PATH_MAX];
    const char *rel = o->base_path;
    while (rel[0] == '.' && rel[1] == '/') /* "./kvtier-data": no "/./" in messages */
        rel += 2;
    if (rel[0] != '/' && getcwd(abs, sizeof(abs)))
        snprintf(abs + strlen(abs), sizeof(abs) - strlen(abs), "/%s", rel[0] ? rel : ".");
    else
        snprintf(abs, sizeof(abs), "%s", rel);
    e->base = kvt_xstrdup(abs);
    e->tmp_rel = kvt_xstrdup(o->relative_tmp_dir);
    e->read_ahead = o->read_ahead_size;
    e->durable = o->durable;
    e->native = o->native;
    e->shared = o->shared;
    e->nworkers = o->num_workers;
    e->pid = getpid();
    e->starttime = kvt_proc_starttime(e->pid);
    l2->engine = e;
    rc = kvt_fileobj_dir_take(l2, spec, e->base, "base_path", e->shared, e->durable, &e->dirfd,
                              &e->lockfd, err, errcap);
    if (rc)
        goto fail;
    if (e->tmp_rel[0]) {
        char tp[PATH_MAX];
        snprintf(tp, sizeof(tp), "%s/%s", e->base, e->tmp_rel);
        rc = kvt_fileobj_dir_open(tp, "relative_tmp_dir", &e->tmpfd, err, errcap);
        if (rc)
            goto fail;
    } else {
        e->tmpfd = e->dirfd;
    }
    kvt_odirect_init(&e->od, o->use_odirect, e->dirfd, 32768, e->base);
    rc = kvt_tpool_create(&e->pool, "fs", e->nworkers, worker_ctx_new, worker_ctx_free, e);
    if (rc) {
        snprintf(err, errcap, "cannot start I/O threads: %s", kvt_strerror(rc));
        goto fail;
    }
    rc = kvt_l2_life_start_scan(l2, &e->park, &e->scan_thr, &e->scan_started, scan_main,
                                "scan thread", err, errcap);
    if (rc)
        goto fail;
    return 0;
fail:
    if (e->pool)
        kvt_tpool_destroy(e->pool);
    if (e->tmpfd >= 0 && e->tmpfd != e->dirfd)
        close(e->tmpfd);
    if (e->dirfd >= 0)
        close(e->dirfd);
    if (e->lockfd >= 0)
        close(e->lockfd);
    free(e->base);
    free(e->tmp_rel);
    free(e);
    l2->engine = NULL;
    kvt_l2_base_destroy(l2);
    return rc ? rc : KVT_E_CONFIG;
}

static const char *fs_storage(const void *opts, const char **field, bool *is_dir)
{
    const struct kvt_fs_opts *o = opts;
    *field = "base_path";
    *is_dir = true;
    return o->base_path;
}

/* the record is a locked file in the directory (l2/kit/budget_file.h) */
static int fs_shared_budget(struct kvt_cfg *c, const void *opts)
{
    const struct kvt_fs_opts *o = opts;
    return kvt_l2_budget_needs_shared(c, o->shared);
}

const struct kvt_l2_adapter_desc kvt_l2_fs_desc = {
    .name = "fs",
    .opts_size = sizeof(struct kvt_fs_opts),
    .parse = fs_parse_plain,
    .open = fs_open,
    .storage = fs_storage,
    .shared_budget = fs_shared_budget,
    .shared_budget_needs = "with \"shared\": true",
};

/* fs_native: O_DIRECT on a misaligned buffer is an error */
const struct kvt_l2_adapter_desc kvt_l2_fs_native_desc = {
    .name = "fs_native",
    .opts_size = sizeof(struct kvt_fs_opts),
    .parse = fs_parse_native,
    .open = fs_open,
    .storage = fs_storage,
    .shared_budget = fs_shared_budget,
    .shared_budget_needs = "with \"shared\": true",
};
