/*
 * nixl_store_dynamic adapter: one file per object with deterministic names,
 * LMCache's NIXL "dynamic" file mode served natively (backends POSIX and
 * HF3FS, the latter as a shared file system path).
 *
 * Name:  {model with / -> --}_{kv_rank:08x}_{group:x}_{chunk_hex}[@salt].bin
 *        under file_path, or under file_path/hex[0:2]/hex[2:4]/ with
 *        shard_dirs. File = object header (objfmt.h: 512 bytes, or one block
 *        with O_DIRECT) + payload.
 *
 * Store:  reserve capacity (the hard cap holds before any byte is written)
 *         -> header + checksum -> open "<final>.tmp.<pid>-<start>-<seq>"
 *         (O_EXCL, O_DIRECT when usable) -> one write of header + payload on
 *         the I/O engine -> optional fdatasync -> renameat2(RENAME_NOREPLACE)
 *         -> READY. Keys already indexed or in flight are skipped.
 * Lookup: the index, then a secondary lookup on disk (files published by
 *         another process sharing the directory): header read and verified.
 * Load:   one read of header + payload into the destination on the engine,
 *         then header, identity, size and checksum verified: any mismatch is
 *         a miss, counted as corrupt, and the bad file is removed.
 * Start-up: an eager background scan (flat and sharded layouts) restores
 *         usage and LRU order and removes tmp files of dead writers; stores
 *         wait for it (so the cap holds right after a restart), lookups and
 *         loads are served meanwhile.
 * Close:  persist_enabled keeps the files, otherwise indexed files are
 *         removed; tmp leftovers are always removed (ours, dead writers',
 *         and foreign-format ones older than 15 minutes: l2/kit/tmpguard.h).
 * Owner:  file_path is locked for the adapter's life (l2/kit/dirlock.h):
 *         exclusively, or shared with other servers that all set "shared"
 *         (persist_enabled false is refused with it: nothing removes files
 *         of another server at close).
 *
 * The pipeline per key: a metadata worker (tpool "nixlm<i>", num_workers
 * threads) prepares and opens, the I/O engine (posix threads or io_uring)
 * moves the bytes, and the finishing step (close, rename, verify) runs on
 * the engine thread when it may block (posix) or back on a metadata worker
 * (io_uring).
 *
 * Locks: l2->lock (base) for index updates, never across I/O;
 * e->park.lock guards the parked-store list; e->drain.lock the live count.
 */
#include "common/log.h"
#include "common/util.h"
#include "io/engine.h"
#include "io/tpool.h"
#include "kvtier/error.h"
#include "l2/adapters.h"
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
#include "l2/nixl/nixl.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#ifndef RENAME_NOREPLACE
#define RENAME_NOREPLACE (1 << 0)
#endif

#define ND_HDR_MAX 4096u
#define ND_PATH_MAX (KVT_NAME_MAX + 96)

enum nd_stage { ST_STORE, ST_STORE_FIN, ST_LOOKUP, ST_LOAD, ST_LOAD_FIN };

struct nd_batch;

struct nd_op {
    struct kvt_job job; /* metadata-pool job */
    struct kvt_io io;   /* the data transfer */
    struct nd_batch *b;
    uint32_t i;
    uint8_t stage;
    bool direct;
    uint16_t hl;
    int fd;
    uint64_t plen;
    char rel[ND_PATH_MAX];
    char tmp[ND_PATH_MAX + 64];
};

struct nd_batch {
    kvt_l2 *l2;
    kvt_l2_task *t;
    uint8_t *hdrs; /* n x ND_HDR_MAX, 4096-aligned (STORE, LOAD) */
    _Atomic uint32_t left;
    struct nd_op ops[];
};

struct nd_engine {
    char *base;
    int dirfd;
    int lockfd; /* l2/kit/dirlock.h: held until close; -1 where locks are unsupported */
    bool shared;
    const char *backend;
    bool shard;
    struct kvt_odirect od;
    bool durable;
    int nworkers;
    struct kvt_tpool *meta;
    struct kvt_ioeng *io;
    pid_t pid;
    uint64_t starttime;
    _Atomic uint64_t seq;
    _Atomic uint64_t shard_made[65536 / 64]; /* "xx/yy" created, by first two bytes */

    pthread_t scan_thr;
    bool scan_started;
    _Atomic bool stop;

    struct kvt_l2_park park;   /* store ops waiting for the scan */
    struct kvt_l2_drain drain; /* live batches */

    _Atomic uint64_t tmp_removed;
    /* the start-up scan could not read a directory (set by the scan thread) */
    _Atomic bool scan_incomplete;
    /* tmp files the last scan left in place (live writers, undecidable,
     * recent without a marker): written by the scan thread, read by status */
    _Atomic uint64_t tmp_kept, tmp_kept_bytes;
};

/* ------------------------------------------------------------ helpers */

static bool cb_inline(struct nd_engine *e)
{
    return kvt_ioeng_cb_may_block(e->io);
}

/* Relative path of a key's file: [xx/yy/]name. */
static int relpath(struct nd_engine *e, const kvt_key *k, char *out)
{
    char name[KVT_NAME_MAX + 1];
    int rc = kvt_key_encode(KVT_CODEC_NIXL, k, name);
    if (rc < 0)
        return rc;
    if (!e->shard) {
        memcpy(out, name, (size_t)rc + 1);
        return 0;
    }
    char hex[5];
    kvt_hex(k->hash, k->hash_len >= 2 ? 2 : 1, hex);
    if (k->hash_len < 2)
        snprintf(hex + 2, 3, "00");
    snprintf(out, ND_PATH_MAX, "%.2s/%.2s/%s", hex, hex + 2, name);
    return 0;
}

/* fsync the directory dirfd/rel (best effort: a failure is not reported,
 * as for the sync after a rename). */
static void sync_dir(int dirfd, const char *rel)
{
    int fd = openat(dirfd, rel, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return;
    fsync(fd);
    close(fd);
}

/* Create the shard directories of a key once per process (cached). With
 * durable, each new directory's entry is synced into its parent: the one
 * under file_path and the "xx/yy" one under "xx". The sync runs also when
 * another thread or process created the directory (EEXIST), since that one
 * may not have synced yet; it is once per shard per process (cached). */
static int ensure_shard(struct nd_engine *e, const kvt_key *k)
{
    if (!e->shard)
        return 0;
    uint32_t id = (uint32_t)k->hash[0] << 8 | (k->hash_len >= 2 ? k->hash[1] : 0);
    uint64_t bit = 1ull << (id % 64);
    if (atomic_load_explicit(&e->shard_made[id / 64], memory_order_relaxed) & bit)
        return 0;
    char d1[3], d2[6];
    snprintf(d1, sizeof(d1), "%02x", id >> 8);
    snprintf(d2, sizeof(d2), "%02x/%02x", id >> 8, id & 0xff);
    if (mkdirat(e->dirfd, d1, 0755) < 0 && errno != EEXIST)
        return -errno;
    if (mkdirat(e->dirfd, d2, 0755) < 0 && errno != EEXIST)
        return -errno;
    if (e->durable) { /* best effort, like the sync after each rename */
        fsync(e->dirfd);
        sync_dir(e->dirfd, d1);
    }
    atomic_fetch_or_explicit(&e->shard_made[id / 64], bit, memory_order_relaxed);
    return 0;
}

/* durable: make a rename in the key's directory (file_path, or its shard
 * directory "xx/yy" with shard_dirs) survive a power loss. */
static void sync_key_dir(struct nd_engine *e, const char *rel)
{
    const char *slash = strrchr(rel, '/');
    if (!slash) {
        fsync(e->dirfd);
        return;
    }
    char dir[ND_PATH_MAX];
    snprintf(dir, sizeof(dir), "%.*s", (int)(slash - rel), rel);
    sync_dir(e->dirfd, dir);
}

static void batch_op_done(struct nd_batch *b)
{
    if (atomic_fetch_sub_explicit(&b->left, 1, memory_order_acq_rel) != 1)
        return;
    kvt_l2 *l2 = b->l2;
    struct nd_engine *e = l2->engine;
    kvt_l2_task_finish(l2, b->t);
    free(b->hdrs);
    free(b);
    kvt_l2_drain_leave(&e->drain);
}

static void store_fail(kvt_l2 *l2, kvt_l2_task *t, uint32_t i, int rc)
{
    kvt_l2_task_fail(t, i, rc);
    atomic_fetch_add(&l2->counters.store_failed, 1);
}

/* ------------------------------------------------------------- store */

static void io_done(struct kvt_io *io);

/* First half of a store, on a metadata worker: reserve, header, open the
 * tmp file, hand the write to the engine. Returns true when the op went to
 * the engine (it finishes later), false when it is finished here. */
static bool store_prep(struct nd_op *op)
{
    struct nd_batch *b = op->b;
    kvt_l2 *l2 = b->l2;
    struct nd_engine *e = l2->engine;
    kvt_l2_task *t = b->t;
    uint32_t i = op->i;
    const kvt_buf *src = &t->bufs[i];
    kvt_key ck;
    kvt_l2_canon(l2, &t->keys[i], &ck);
    if (src->len > KVT_MAX_OBJECT) {
        store_fail(l2, t, i, KVT_E_TOOBIG);
        return false;
    }
    op->direct = kvt_odirect_ok(l2, &e->od, src->ptr, src->len);
    op->hl = op->direct ? (uint16_t)e->od.blksz : KVT_OBJHDR_MIN;
    uint32_t logical = t->meta[i].len ? t->meta[i].len : (uint32_t)src->len;
    t->meta[i].len = logical;
    int rc = kvt_l2_reserve(l2, &ck, (uint32_t)(op->hl + src->len), logical, op->hl, 0);
    if (rc == -EEXIST) {
        atomic_fetch_add(&l2->counters.store_skipped, 1);
        kvt_l2_task_ok(t, i, 0);
        return false;
    }
    if (rc) {
        store_fail(l2, t, i, rc);
        return false;
    }
    rc = relpath(e, &t->keys[i], op->rel);
    if (!rc)
        rc = ensure_shard(e, &t->keys[i]);
    if (rc)
        goto fail;
    void *hdr = b->hdrs + (size_t)i * ND_HDR_MAX;
    uint64_t sum = kvt_payload_hash(src->ptr, src->len);
    rc = kvt_objhdr_encode(hdr, op->hl, &t->keys[i], &t->meta[i], NULL, t->meta[i].serde, src->len,
                           sum);
    if (rc)
        goto fail;
    /* the tmp name is the tmp guard's marker: it names this writer by
     * (pid, start time), created atomically with the file (l2/kit/tmpguard.h) */
    rc = kvt_tmpguard_name(op->tmp, sizeof(op->tmp), op->rel, e->pid, e->starttime,
                           atomic_fetch_add(&e->seq, 1));
    if (rc < 0)
        goto fail;
    bool direct = op->direct;
    op->fd =
        kvt_odirect_openat(l2, &e->od, e->dirfd, op->tmp, O_WRONLY | O_CREAT | O_EXCL, &direct);
    if (op->fd < 0) {
        rc = op->fd;
        op->fd = -1;
        goto fail;
    }
    /* the lock shows the write as live to guards in other pid namespaces;
     * a file system without locks still has the name */
    kvt_tmpguard_hold(op->fd);
    if (direct != op->direct) { /* O_DIRECT refused at open: small header */
        op->direct = false;
        uint16_t nhl = KVT_OBJHDR_MIN;
        kvt_objhdr_encode(hdr, nhl, &t->keys[i], &t->meta[i], NULL, t->meta[i].serde, src->len,
                          sum);
        kvt_fileobj_set_hdr_len(l2, &ck, nhl, src->len);
        op->hl = nhl;
    }
    if (op->direct && kvt_ioeng_kind_of(e->io) == KVT_IOENG_URING) {
        /* allocate the blocks here, on the worker: an O_DIRECT write into
         * a hole must allocate, which io_uring cannot do without blocking,
         * so the kernel would hand every such write to an io-wq thread */
        if (fallocate(op->fd, 0, 0, (off_t)(op->hl + src->len)) < 0 && errno == ENOSPC) {
            rc = -ENOSPC;
            close(op->fd);
            op->fd = -1;
            unlinkat(e->dirfd, op->tmp, 0);
            goto fail;
        }
    }
    op->stage = ST_STORE_FIN;
    kvt_io_prep(&op->io, KVT_IO_WRITE, op->fd, 0, io_done, op);
    kvt_io_add(&op->io, hdr, op->hl);
    kvt_io_add(&op->io, src->ptr, src->len);
    kvt_ioeng_submit(e->io, &op->io);
    return true;
fail:
    kvt_l2_unreserve(l2, &ck);
    store_fail(l2, t, i, rc);
    char ks[400];
    kvt_debug("%s: store %s failed: %s", l2->name, kvt_key_str(&t->keys[i], ks, sizeof(ks)),
              kvt_strerror(rc));
    return false;
}

/* Second half of a store: check the write, publish by rename. */
static void store_fin(struct nd_op *op)
{
    struct nd_batch *b = op->b;
    kvt_l2 *l2 = b->l2;
    struct nd_engine *e = l2->engine;
    kvt_l2_task *t = b->t;
    uint32_t i = op->i;
    const kvt_buf *src = &t->bufs[i];
    kvt_key ck;
    kvt_l2_canon(l2, &t->keys[i], &ck);
    int rc = op->io.res < 0 ? op->io.res : (uint64_t)op->io.res == op->io.len ? 0 : -EIO;
    if (!rc && e->durable && fdatasync(op->fd) < 0)
        rc = -errno;
    if (close(op->fd) < 0 && !rc)
        rc = -errno;
    op->fd = -1;
    if (!rc && renameat2(e->dirfd, op->tmp, e->dirfd, op->rel, RENAME_NOREPLACE) < 0)
        rc = -errno;
    if (rc) {
        unlinkat(e->dirfd, op->tmp, 0);
        if (rc == -EEXIST) {
            /* another process published this name first: adopt its file */
            kvt_fileobj_store_adopt(l2, e->dirfd, op->rel, t, i, &ck);
        } else {
            kvt_l2_unreserve(l2, &ck);
            store_fail(l2, t, i, rc);
            char ks[400];
            kvt_warn("%s: store %s failed: %s", l2->name, kvt_key_str(&t->keys[i], ks, sizeof(ks)),
                     kvt_strerror(rc));
        }
        return;
    }
    if (e->durable)
        sync_key_dir(e, op->rel);
    kvt_l2_publish(l2, &ck);
    atomic_fetch_add(&l2->counters.store_ok, 1);
    kvt_l2_task_ok(t, i, op->hl + src->len);
}

/* ------------------------------------------------------------ lookup */

static void run_lookup(struct nd_op *op)
{
    struct nd_batch *b = op->b;
    kvt_l2 *l2 = b->l2;
    struct nd_engine *e = l2->engine;
    if (relpath(e, &b->t->keys[op->i], op->rel) < 0)
        return;
    kvt_fileobj_lookup(l2, e->dirfd, op->rel, b->t, op->i);
}

/* -------------------------------------------------------------- load */

static bool load_prep(struct nd_op *op)
{
    struct nd_batch *b = op->b;
    kvt_l2 *l2 = b->l2;
    struct nd_engine *e = l2->engine;
    kvt_l2_task *t = b->t;
    uint32_t i = op->i;
    kvt_buf *dst = &t->bufs[i];
    kvt_key ck;
    kvt_l2_canon(l2, &t->keys[i], &ck);
    if (relpath(e, &t->keys[i], op->rel) < 0)
        return false;
    uint16_t hl = 0;
    int lrc = kvt_fileobj_load_hdr_len(l2, e->dirfd, op->rel, &t->keys[i], ND_HDR_MAX, &hl);
    if (lrc) {
        kvt_l2_task_fail(t, i, lrc);
        return false;
    }
    op->hl = hl;
    op->direct = hl == e->od.blksz && kvt_odirect_ok(l2, &e->od, dst->ptr, dst->len);
    op->fd = kvt_odirect_openat(l2, &e->od, e->dirfd, op->rel, O_RDONLY, &op->direct);
    if (op->fd < 0) {
        int rc = op->fd;
        if (rc == -ENOENT) /* deleted behind our back (purge, another host) */
            kvt_l2_forget(l2, &ck);
        kvt_l2_task_fail(t, i, rc);
        return false;
    }
    struct stat st;
    int rc = 0;
    const char *why = NULL;
    if (fstat(op->fd, &st) < 0)
        rc = -errno;
    else /* a changed size is corrupt; larger than the destination: -EOVERFLOW */
        rc = kvt_fileobj_load_size(l2, &t->keys[i], (uint64_t)st.st_size, hl, dst->len, &op->plen,
                                   &why);
    if (rc) {
        close(op->fd);
        op->fd = -1;
        /* a corrupt file is counted, removed and forgotten there */
        kvt_fileobj_load_done(l2, e->dirfd, op->rel, t, i, NULL, hl, 0, rc, why);
        return false;
    }
    if (op->direct && op->plen % e->od.blksz) {
        /* cannot happen for files we wrote with O_DIRECT; reopen buffered */
        close(op->fd);
        op->direct = false;
        op->fd = openat(e->dirfd, op->rel, O_RDONLY | O_CLOEXEC);
        if (op->fd < 0) {
            kvt_l2_task_fail(t, i, -errno);
            return false;
        }
    }
    if (e->od.on && !op->direct)
        posix_fadvise(op->fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    op->stage = ST_LOAD_FIN;
    kvt_io_prep(&op->io, KVT_IO_READ, op->fd, 0, io_done, op);
    kvt_io_add(&op->io, b->hdrs + (size_t)i * ND_HDR_MAX, hl);
    kvt_io_add(&op->io, dst->ptr, op->plen);
    kvt_ioeng_submit(e->io, &op->io);
    return true;
}

static void load_fin(struct nd_op *op)
{
    struct nd_batch *b = op->b;
    kvt_l2 *l2 = b->l2;
    struct nd_engine *e = l2->engine;
    close(op->fd);
    op->fd = -1;
    int rc = op->io.res < 0 ? op->io.res : 0;
    if (!rc && (uint64_t)op->io.res != op->io.len)
        rc = KVT_E_CORRUPT;
    kvt_fileobj_load_done(l2, e->dirfd, op->rel, b->t, op->i, b->hdrs + (size_t)op->i * ND_HDR_MAX,
                          op->hl, op->plen, rc,
                          "file shorter than its size at open (truncated while reading)");
}

/* ---------------------------------------------------------- dispatch */

/* Run one stage of an op; finishes the op unless it went to the engine. */
static void run_stage(struct nd_op *op)
{
    bool pending = false;
    switch (op->stage) {
    case ST_STORE:
        pending = store_prep(op);
        break;
    case ST_STORE_FIN:
        store_fin(op);
        break;
    case ST_LOOKUP:
        run_lookup(op);
        break;
    case ST_LOAD:
        pending = load_prep(op);
        break;
    case ST_LOAD_FIN:
        load_fin(op);
        break;
    }
    if (!pending)
        batch_op_done(op->b);
}

static void job_fn(struct kvt_job *job, void *ctx)
{
    (void)ctx;
    struct nd_op *op = (struct nd_op *)job;
    struct nd_engine *e = op->b->l2->engine;
    if (op->stage == ST_STORE) {
        /* stores wait for the start-up scan so the cap counts old files */
        if (kvt_l2_park(&e->park, job))
            return;
    }
    run_stage(op);
}

/* Engine completion: finish here when the engine thread may block,
 * otherwise hand the finishing step back to a metadata worker. */
static void io_done(struct kvt_io *io)
{
    struct nd_op *op = io->udata;
    struct nd_engine *e = op->b->l2->engine;
    if (cb_inline(e))
        run_stage(op);
    else
        kvt_tpool_push(e->meta, &op->job);
}

static void nd_submit(kvt_l2 *l2, kvt_l2_task *t)
{
    struct nd_engine *e = l2->engine;
    /* fast path: every key indexed with a known header: no thread hop */
    if (t->kind == KVT_L2_LOOKUP && kvt_l2_lookup_known(l2, t))
        return;
    struct nd_batch *b = kvt_xcalloc(1, sizeof(*b) + t->n * sizeof(struct nd_op));
    b->l2 = l2;
    b->t = t;
    if (t->kind != KVT_L2_LOOKUP) {
        void *p = NULL;
        if (posix_memalign(&p, 4096, (size_t)t->n * ND_HDR_MAX)) {
            free(b);
            for (uint32_t i = 0; i < t->n; i++)
                kvt_l2_task_fail(t, i, -ENOMEM);
            kvt_l2_task_finish(l2, t);
            return;
        }
        b->hdrs = p;
    }
    atomic_store(&b->left, t->n);
    uint8_t stage = t->kind == KVT_L2_STORE    ? ST_STORE
                    : t->kind == KVT_L2_LOOKUP ? ST_LOOKUP
                                               : ST_LOAD;
    kvt_l2_drain_enter(&e->drain);
    for (uint32_t i = 0; i < t->n; i++) {
        struct nd_op *op = &b->ops[i];
        op->b = b;
        op->i = i;
        op->fd = -1;
        op->stage = stage;
        op->job.fn = job_fn;
    }
    /* the batch (and t) may be finished and freed as soon as its last op
     * is queued: nothing of them is read after that */
    struct nd_op *ops = b->ops;
    for (uint32_t i = 0, n = t->n; i < n; i++)
        kvt_tpool_push(e->meta, &ops[i].job);
}

static int nd_remove(kvt_l2 *l2, const struct kvt_l2_obj *o)
{
    struct nd_engine *e = l2->engine;
    char rel[ND_PATH_MAX];
    int rc = relpath(e, &o->key, rel);
    if (rc < 0)
        return rc;
    return unlinkat(e->dirfd, rel, 0) < 0 ? -errno : 0;
}

/* ------------------------------------------------------ recovery scan */

/* Remove the tmp file name in dfd when the tmp guard allows it
 * (kvt_tmpguard_sweep: our own only when closing); another writer's kept
 * files are counted for status. */
static void sweep_one(struct nd_engine *e, struct kvt_tmpguard *g, int dfd, const char *name,
                      bool closing)
{
    uint64_t size = 0;
    switch (kvt_tmpguard_sweep(g, dfd, name, closing, &size)) {
    case KVT_SWEEP_REMOVED:
        atomic_fetch_add(&e->tmp_removed, 1);
        break;
    case KVT_SWEEP_KEPT:
        atomic_fetch_add(&e->tmp_kept, 1);
        atomic_fetch_add(&e->tmp_kept_bytes, size);
        break;
    case KVT_SWEEP_NONE:
        break;
    }
}

static bool is_hex2(const char *s)
{
    return strlen(s) == 2 && strspn(s, "0123456789abcdef") == 2;
}

/* Scan one directory: collect object files, remove dead writers' tmp
 * files, descend into shard directories (two levels of two hex digits). */
static void scan_dir(kvt_l2 *l2, struct nd_engine *e, struct kvt_tmpguard *g, int dfd, int depth,
                     bool closing, struct kvt_l2_scanq *sq)
{
    int fd = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0)
            close(fd);
        atomic_store(&e->scan_incomplete, true);
        return;
    }
    struct dirent *de = NULL;
    int rerr = 0; /* readdir's error, if it failed */
    while (!(atomic_load(&e->stop) && !closing) &&
           (errno = 0, de = readdir(d), rerr = de ? 0 : errno, de)) {
        const char *nm = de->d_name;
        if (nm[0] == '.')
            continue;
        if (strstr(nm, ".tmp.")) {
            sweep_one(e, g, dfd, nm, closing);
            continue;
        }
        if (depth < 2 && is_hex2(nm)) {
            int sub = openat(dfd, nm, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
            if (sub >= 0) {
                scan_dir(l2, e, g, sub, depth + 1, closing, sq);
                close(sub);
            } else if (errno != ENOENT) {
                atomic_store(&e->scan_incomplete, true);
            }
            continue;
        }
        if (!sq)
            continue;
        size_t len = strlen(nm);
        if (len < 5 || strcmp(nm + len - 4, ".bin") != 0)
            continue;
        kvt_key k;
        if (kvt_key_decode(KVT_CODEC_NIXL, nm, len, &k))
            continue;
        /* a sharded file must sit in its own shard directory and vice versa:
         * the lookup path is derived from the key, so anything else is junk */
        if ((depth == 2) != e->shard)
            continue;
        kvt_key ck;
        kvt_key_canon(KVT_CODEC_NIXL, &k, &ck);
        kvt_l2_scanq_add(sq, dfd, nm, &ck); /* stat'ed in batches */
    }
    if (rerr)
        atomic_store(&e->scan_incomplete, true);
    if (sq)
        kvt_l2_scanq_flush(sq); /* the batch refers to dfd: done before it closes */
    closedir(d);
}

/* Free and total bytes of the file system under file_path. */
static int fs_space(struct nd_engine *e, uint64_t *free_b, uint64_t *total_b)
{
    struct statvfs sv;
    if (fstatvfs(e->dirfd, &sv) < 0)
        return -errno;
    *free_b = (uint64_t)sv.f_bavail * sv.f_frsize;
    *total_b = (uint64_t)sv.f_blocks * sv.f_frsize;
    return 0;
}

/* Pre-flight, once the scan knows what the cache holds: can the file system
 * hold the cap (free space + the cache's own bytes)? A warning only: the
 * cache is never wiped, and writes fail with ENOSPC (counted) if the disk
 * fills first. Status reports the same check live ("filesystem"). */
static void preflight_warn(kvt_l2 *l2, struct nd_engine *e)
{
    uint64_t fr = 0, tot = 0;
    if (fs_space(e, &fr, &tot))
        return;
    pthread_mutex_lock(&l2->lock);
    uint64_t used = l2->used_bytes, cap = l2->cap_bytes;
    pthread_mutex_unlock(&l2->lock);
    if (cap && fr + used < cap)
        kvt_warn("%s: the file system under %s cannot hold the budget: %.1f GiB free + %.1f GiB "
                 "of cache files < max_capacity %.1f GiB (total size %.1f GiB); writes will fail "
                 "with ENOSPC before the cap is reached",
                 l2->name, e->base, (double)fr / KVT_GIB, (double)used / KVT_GIB,
                 (double)cap / KVT_GIB, (double)tot / KVT_GIB);
}

static void *scan_main(void *arg)
{
    kvt_l2 *l2 = arg;
    struct nd_engine *e = l2->engine;
    pthread_setname_np(pthread_self(), "nixl-scan");
    uint64_t t0 = kvt_now_ns();
    struct kvt_l2_found_vec sv = {0};
    struct kvt_l2_scanq *sq = kvt_l2_scanq_new(&sv);
    struct kvt_tmpguard g;
    kvt_tmpguard_init(&g, e->dirfd);
    scan_dir(l2, e, &g, e->dirfd, 0, false, sq);
    kvt_tmpguard_fini(&g);
    kvt_l2_scanq_free(sq);
    /* a walk cut short (closing, an unreadable directory) may have missed
     * objects: the shared budget's recount is skipped, not under-counted */
    if (atomic_load(&e->stop) || atomic_load(&e->scan_incomplete))
        kvt_l2_budget_recount_end(l2, 0, false);
    kvt_l2_finish_recovery(l2, &sv, t0, e->base);
    if (atomic_load(&e->tmp_removed))
        kvt_info("%s: removed %llu tmp files left by dead writers", l2->name,
                 (unsigned long long)atomic_load(&e->tmp_removed));
    preflight_warn(l2, e);
    kvt_l2_park_release(&e->park, e->meta);
    return NULL;
}

/* ------------------------------------------------------- status/close */

static void nd_status(kvt_l2 *l2, json_t *out)
{
    struct nd_engine *e = l2->engine;
    json_object_set_new(out, "file_path", json_string(e->base));
    json_object_set_new(out, "backend", json_string(e->backend));
    json_object_set_new(out, "shard_dirs", json_boolean(e->shard));
    json_object_set_new(out, "num_workers", json_integer(e->nworkers));
    json_object_set_new(out, "io", kvt_ioeng_status(e->io));
    kvt_odirect_status(&e->od, out);
    json_object_set_new(out, "durable", json_boolean(e->durable));
    json_object_set_new(out, "shared", json_boolean(e->shared));
    json_object_set_new(out, "tmp_removed", json_integer((json_int_t)atomic_load(&e->tmp_removed)));
    json_object_set_new(out, "tmp_kept", json_integer((json_int_t)atomic_load(&e->tmp_kept)));
    json_object_set_new(out, "tmp_kept_bytes",
                        json_integer((json_int_t)atomic_load(&e->tmp_kept_bytes)));
    uint64_t fr = 0, tot = 0;
    if (fs_space(e, &fr, &tot) == 0) {
        pthread_mutex_lock(&l2->lock);
        uint64_t used = l2->used_bytes, cap = l2->cap_bytes;
        pthread_mutex_unlock(&l2->lock);
        json_t *fs = json_object();
        json_object_set_new(fs, "free_bytes", json_integer((json_int_t)fr));
        json_object_set_new(fs, "total_bytes", json_integer((json_int_t)tot));
        json_object_set_new(fs, "can_hold_capacity", json_boolean(!cap || fr + used >= cap));
        json_object_set_new(out, "filesystem", fs);
    }
    json_object_set_new(out, "parked_stores", json_integer((json_int_t)kvt_l2_parked(&e->park)));
}

static bool nd_healthy(kvt_l2 *l2, char *msg, size_t cap)
{
    struct nd_engine *e = l2->engine;
    return kvt_fileobj_healthy(e->dirfd, &e->od, "file_path", msg, cap);
}

static void engine_free(struct nd_engine *e)
{
    if (e->dirfd >= 0)
        close(e->dirfd);
    if (e->lockfd >= 0)
        close(e->lockfd); /* last: what close removed was ours to remove */
    free(e->base);
    kvt_l2_park_destroy(&e->park);
    kvt_l2_drain_destroy(&e->drain);
    free(e);
}

static void nd_close(kvt_l2 *l2)
{
    struct nd_engine *e = l2->engine;
    /* parked stores are released, then every live batch drains: the pool
     * and the io engine keep running until nothing can push to the other
     * any more */
    kvt_l2_life_stop(l2, &(struct kvt_l2_life){.stop_flag = &e->stop,
                                               .thread = &e->scan_thr,
                                               .thread_started = &e->scan_started,
                                               .park = &e->park,
                                               .park_pool = e->meta,
                                               .drain = &e->drain,
                                               .pools = {e->meta}});
    kvt_ioeng_destroy(e->io);
    if (!l2->persist_enabled)
        kvt_fileobj_remove_indexed(l2);
    struct kvt_tmpguard g; /* tmp leftovers: ours always removed, others by the guard */
    kvt_tmpguard_init(&g, e->dirfd);
    atomic_store(&e->tmp_kept, 0);
    atomic_store(&e->tmp_kept_bytes, 0);
    scan_dir(l2, e, &g, e->dirfd, 0, true, NULL);
    kvt_tmpguard_fini(&g);
    engine_free(e);
    l2->engine = NULL;
}

static void nd_root(kvt_l2 *l2, char *out, size_t cap)
{
    const struct nd_engine *e = l2->engine;
    snprintf(out, cap, "%s", e->base);
}

static const struct kvt_l2_ops nd_ops = {
    .submit = nd_submit,
    .remove = nd_remove,
    .status = nd_status,
    .healthy = nd_healthy,
    .root = nd_root,
    .close = nd_close,
};

/* ---------------------------------------------------------- creation */

static int nd_parse(struct kvt_cfg *c, void *o)
{
    return kvt_nixl_parse(c, o, true);
}

static int nd_open(kvt_l2 *l2, const struct kvt_l2_spec *spec, const void *opts, char *err,
                   size_t errcap)
{
    const struct kvt_nixl_opts *o = opts;
    int rc =
        kvt_l2_life_init(l2, &nd_ops, spec, KVT_CODEC_NIXL, o->max_capacity_bytes, err, errcap);
    if (rc)
        return rc;
    struct nd_engine *e = kvt_xcalloc(1, sizeof(*e));
    e->dirfd = e->lockfd = -1;
    kvt_l2_park_init(&e->park);
    kvt_l2_drain_init(&e->drain);
    char abs[PATH_MAX];
    if (o->file_path[0] != '/' && getcwd(abs, sizeof(abs)))
        snprintf(abs + strlen(abs), sizeof(abs) - strlen(abs), "/%s", o->file_path);
    else
        snprintf(abs, sizeof(abs), "%s", o->file_path);
    e->base = kvt_xstrdup(abs);
    e->backend = strcmp(o->backend, "HF3FS") == 0 ? "HF3FS" : "POSIX";
    e->shard = o->shard_dirs;
    e->durable = o->durable;
    e->nworkers = o->num_workers;
    e->pid = getpid();
    e->starttime = kvt_proc_starttime(e->pid);
    l2->engine = e;
    e->shared = o->shared;
    rc = kvt_fileobj_dir_take(l2, spec, e->base, "file_path", e->shared, e->durable, &e->dirfd,
                              &e->lockfd, err, errcap);
    if (rc)
        goto fail;
    kvt_odirect_init(&e->od, o->use_direct_io, e->dirfd, ND_HDR_MAX, e->base);
    char nm[16];
    snprintf(nm, sizeof(nm), "nixlio%d", spec->index);
    int depth = o->io_engine == KVT_IOENG_URING ? o->queue_depth : o->num_workers;
    rc = kvt_ioeng_create(&e->io, (enum kvt_ioeng_kind)o->io_engine, nm, depth, err, errcap);
    if (rc)
        goto fail;
    snprintf(nm, sizeof(nm), "nixlm%d", spec->index);
    rc = kvt_tpool_create(&e->meta, nm, o->num_workers, NULL, NULL, NULL);
    if (rc) {
        snprintf(err, errcap, "cannot start worker threads: %s", kvt_strerror(rc));
        goto fail;
    }
    rc = kvt_l2_life_start_scan(l2, &e->park, &e->scan_thr, &e->scan_started, scan_main,
                                "the scan thread", err, errcap);
    if (rc)
        goto fail;
    return 0;
fail:
    if (e->meta)
        kvt_tpool_destroy(e->meta);
    kvt_ioeng_destroy(e->io);
    engine_free(e);
    l2->engine = NULL;
    kvt_l2_base_destroy(l2);
    return rc ? rc : KVT_E_CONFIG;
}

/* the record is a locked file in the directory (l2/kit/budget_file.h) */
static int nd_shared_budget(struct kvt_cfg *c, const void *opts)
{
    const struct kvt_nixl_opts *o = opts;
    return kvt_l2_budget_needs_shared(c, o->shared);
}

const struct kvt_l2_adapter_desc kvt_l2_nixl_dynamic_desc = {
    .name = "nixl_store_dynamic",
    .opts_size = sizeof(struct kvt_nixl_opts),
    .parse = nd_parse,
    .open = nd_open,
    .storage = kvt_nixl_storage,
    .shared_budget = nd_shared_budget,
    .shared_budget_needs = "with \"shared\": true",
};
