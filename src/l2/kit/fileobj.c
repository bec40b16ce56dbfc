/*
 * File-backed objects: header reads, verification, corrupt-file handling
 * and index bookkeeping shared by fs.c and nixl_dynamic.c (see fileobj.h).
 */
#include "l2/kit/fileobj.h"
#include "common/log.h"
#include "common/util.h"
#include "kvtier/error.h"
#include "l2/adapters.h"
#include "l2/kit/budget_file.h"
#include "l2/kit/dirlock.h"
#include "common/le.h"
#include "key/blocktag.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

/* Read and verify just the header of a file (its first KVT_OBJHDR_MAX
 * bytes at most: a tag lies within them); fills h and st, and the tag when
 * tag is not NULL (*tag NULL: none). */
static int read_header(int dirfd, const char *name, enum kvt_codec codec, const kvt_key *want,
                       struct kvt_objhdr *h, struct stat *st, const char **why,
                       struct kvt_blocktag **tag)
{
    int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    uint8_t buf[KVT_OBJHDR_MAX];
    size_t got = 0;
    int rc = fstat(fd, st) < 0 ? -errno : 0;
    if (!rc)
        rc = kvt_pread_all(fd, buf, KVT_OBJHDR_MIN, 0, &got);
    /* a header area beyond 512 bytes (a tag, or an O_DIRECT block): the
     * rest of it, up to the buffer */
    size_t hl =
        got == KVT_OBJHDR_MIN && memcmp(buf, KVT_OBJHDR_MAGIC, 8) == 0 ? kvt_get16(buf + 10) : 0;
    if (!rc && hl > KVT_OBJHDR_MIN) {
        size_t more = KVT_MIN(hl, sizeof(buf)) - KVT_OBJHDR_MIN, got2 = 0;
        rc = kvt_pread_all(fd, buf + KVT_OBJHDR_MIN, more, KVT_OBJHDR_MIN, &got2);
        got += got2;
    }
    close(fd);
    if (rc == -EIO) {
        *why = "file shorter than a header";
        return KVT_E_CORRUPT;
    }
    if (rc)
        return rc;
    rc = kvt_objhdr_decode(buf, got, h, why);
    if (rc)
        return rc;
    if (!kvt_objhdr_matches(h, codec, want)) {
        *why = "header names another key";
        return KVT_E_CORRUPT;
    }
    if ((uint64_t)st->st_size != h->hdr_len + h->payload_len) {
        *why = "file size does not match the header (torn or extended file)";
        return KVT_E_CORRUPT;
    }
    if (tag)
        *tag = kvt_objhdr_tag(buf, h);
    return 0;
}

int kvt_fileobj_read_header(int dirfd, const char *name, enum kvt_codec codec, const kvt_key *want,
                            struct kvt_objhdr *h, struct stat *st, const char **why)
{
    return read_header(dirfd, name, codec, want, h, st, why, NULL);
}

struct kvt_blocktag *kvt_fileobj_read_tag(int dirfd, const char *name, enum kvt_codec codec,
                                          const kvt_key *want, uint64_t size)
{
    struct kvt_objhdr h;
    struct stat st;
    const char *why = NULL;
    struct kvt_blocktag *tag = NULL;
    /* a file changed since the scan's stat is left to the first load */
    if (read_header(dirfd, name, codec, want, &h, &st, &why, &tag) == 0 &&
        (uint64_t)st.st_size != size) {
        kvt_blocktag_put(tag);
        tag = NULL;
    }
    return tag;
}

void kvt_fileobj_corrupt(kvt_l2 *l2, int dirfd, const char *name, const kvt_key *k, const char *why)
{
    char ks[400];
    atomic_fetch_add(&l2->counters.corrupt, 1);
    kvt_warn("%s: corrupt object %s (%s): removed, treated as a miss", l2->name,
             kvt_key_str(k, ks, sizeof(ks)), why);
    unlinkat(dirfd, name, 0);
}

/* An index entry the start-up scan (or an adopted file) left without its
 * header learns it from a verified header on disk: later lookups take the
 * fast path and loads skip the header read. Only while the entry is still
 * there and its header is still unknown. */
static void learn_header(kvt_l2 *l2, const kvt_key *ck, const struct kvt_objhdr *h)
{
    pthread_mutex_lock(&l2->lock);
    struct kvt_l2_obj *p = kvt_l2_find_locked(l2, ck);
    if (p && p->aux == 0) {
        p->aux = h->hdr_len;
        kvt_l2_obj_set_len_locked(l2, p, (uint32_t)h->logical_len);
    }
    pthread_mutex_unlock(&l2->lock);
}

void kvt_fileobj_lookup(kvt_l2 *l2, int dirfd, const char *name, kvt_l2_task *t, uint32_t i)
{
    kvt_key ck;
    kvt_l2_canon(l2, &t->keys[i], &ck);
    struct kvt_l2_obj o;
    bool pinned = kvt_l2_pin(l2, &ck, &o);
    if (pinned && o.aux) {
        t->meta[i].len = o.len;
        kvt_l2_task_ok(t, i, 0);
        return;
    }
    /* not indexed (secondary lookup: a file published by another process or
     * host sharing the directory), or indexed by the start-up scan without
     * its header read */
    struct kvt_objhdr h;
    struct stat st;
    const char *why = NULL;
    /* with KV events on, an adopted object is named by the engine block
     * hashes its header holds */
    struct kvt_blocktag *tag = NULL;
    int rc = read_header(dirfd, name, l2->codec, &t->keys[i], &h, &st, &why,
                         !pinned && l2->keep_tags ? &tag : NULL);
    if (rc) {
        if (rc == KVT_E_CORRUPT)
            kvt_fileobj_corrupt(l2, dirfd, name, &t->keys[i], why);
        if (pinned)
            kvt_l2_forget(l2, &ck);
        return;
    }
    if (pinned) {
        learn_header(l2, &ck, &h);
    } else {
        kvt_l2_adopt_tag(l2, &ck, tag, (uint32_t)st.st_size, (uint32_t)h.logical_len, h.hdr_len, 0,
                         true, false);
        atomic_fetch_add(&l2->counters.secondary_hits, 1);
    }
    t->meta[i] = h.meta;
    kvt_l2_task_ok(t, i, 0);
}

int kvt_fileobj_load_hdr_len(kvt_l2 *l2, int dirfd, const char *name, const kvt_key *key,
                             uint32_t max_hl, uint16_t *out)
{
    kvt_key ck;
    kvt_l2_canon(l2, key, &ck);
    uint16_t hl = 0;
    pthread_mutex_lock(&l2->lock);
    struct kvt_l2_obj *o = kvt_l2_find_locked(l2, &ck);
    bool indexed = o != NULL;
    if (o)
        hl = (uint16_t)o->aux;
    pthread_mutex_unlock(&l2->lock);
    if (hl == 0 || hl > max_hl) {
        struct kvt_objhdr h;
        struct stat st;
        const char *why = NULL;
        int rc = kvt_fileobj_read_header(dirfd, name, l2->codec, key, &h, &st, &why);
        if (rc) {
            if (rc == KVT_E_CORRUPT)
                kvt_fileobj_corrupt(l2, dirfd, name, key, why);
            return rc;
        }
        hl = h.hdr_len;
        if (hl > max_hl)
            return KVT_E_CORRUPT;
        if (indexed) /* indexed without its header: remember it for the next load */
            learn_header(l2, &ck, &h);
    }
    *out = hl;
    return 0;
}

int kvt_fileobj_load_size(kvt_l2 *l2, const kvt_key *key, uint64_t st_size, uint16_t hl,
                          uint64_t cap, uint64_t *plen, const char **why)
{
    kvt_key ck;
    kvt_l2_canon(l2, key, &ck);
    uint64_t stored = 0;
    pthread_mutex_lock(&l2->lock);
    const struct kvt_l2_obj *o = kvt_l2_find_locked(l2, &ck);
    if (o && kvt_l2_obj_state(o) == KVT_OBJ_READY)
        stored = o->stored;
    pthread_mutex_unlock(&l2->lock);
    if (st_size < hl) {
        *why = "file shorter than its header (emptied or torn)";
        return KVT_E_CORRUPT;
    }
    if (stored && st_size != stored) {
        *why = st_size > stored ? "file larger than the object written (extended behind the "
                                  "server's back)"
                                : "file smaller than the object written (cut behind the "
                                  "server's back)";
        return KVT_E_CORRUPT;
    }
    if (st_size - hl > cap)
        return -EOVERFLOW;
    *plen = st_size - hl;
    return 0;
}

void kvt_fileobj_load_done(kvt_l2 *l2, int dirfd, const char *name, kvt_l2_task *t, uint32_t i,
                           const void *hdr, uint16_t hl, uint64_t plen, int rc, const char *why)
{
    kvt_buf *dst = &t->bufs[i];
    struct kvt_objhdr h;
    if (!rc) {
        rc = kvt_objhdr_decode(hdr, hl, &h, &why);
        if (!rc && !kvt_objhdr_matches(&h, l2->codec, &t->keys[i])) {
            why = "header names another key";
            rc = KVT_E_CORRUPT;
        }
        /* the file is hl + plen bytes: the header must say the same */
        if (!rc && (h.payload_len != plen || h.hdr_len != hl)) {
            why = "file size does not match the header (torn or extended file)";
            rc = KVT_E_CORRUPT;
        }
        if (!rc && kvt_payload_hash(dst->ptr, plen) != h.payload_xxh3) {
            why = "payload checksum mismatch";
            rc = KVT_E_CORRUPT;
        }
    }
    if (rc == KVT_E_CORRUPT) {
        kvt_key ck;
        kvt_l2_canon(l2, &t->keys[i], &ck);
        kvt_fileobj_corrupt(l2, dirfd, name, &t->keys[i], why);
        kvt_l2_forget(l2, &ck);
    }
    if (rc) {
        kvt_l2_task_fail(t, i, rc);
        return;
    }
    t->meta[i] = h.meta;
    dst->len = plen;
    kvt_l2_task_ok(t, i, hl + plen);
}

void kvt_fileobj_store_adopt(kvt_l2 *l2, int dirfd, const char *name, kvt_l2_task *t, uint32_t i,
                             const kvt_key *ck)
{
    kvt_l2_unreserve(l2, ck);
    struct stat st;
    if (fstatat(dirfd, name, &st, 0) == 0)
        kvt_l2_adopt(l2, ck, (uint32_t)KVT_MIN(st.st_size, UINT32_MAX), 0, 0, 0, false, false);
    atomic_fetch_add(&l2->counters.store_skipped, 1);
    kvt_l2_task_ok(t, i, 0);
}

void kvt_fileobj_set_hdr_len(kvt_l2 *l2, const kvt_key *ck, uint16_t hl, uint64_t plen)
{
    uint32_t shrunk = 0;
    pthread_mutex_lock(&l2->lock);
    struct kvt_l2_obj *o = kvt_l2_find_locked(l2, ck);
    if (o) {
        /* the fallback header is the small one: the object only shrinks */
        if (o->stored > hl + plen)
            shrunk = (uint32_t)(o->stored - (hl + plen));
        kvt_l2_obj_set_stored_locked(l2, o, (uint32_t)(hl + plen));
        o->aux = hl;
    }
    pthread_mutex_unlock(&l2->lock);
    kvt_l2_budget_shrunk(l2, shrunk); /* a shared budget gets them back */
}

struct remove_all {
    kvt_l2 *l2;
    uint64_t n;
};

static bool remove_visit(const struct kvt_l2_obj *o, void *arg)
{
    struct remove_all *ra = arg;
    if (ra->l2->ops->remove(ra->l2, o) == 0)
        ra->n++;
    return true;
}

void kvt_fileobj_remove_indexed(kvt_l2 *l2)
{
    struct remove_all ra = {l2, 0};
    uint32_t cursor = 0;
    kvt_l2_index_scan(l2, &cursor, remove_visit, &ra); /* one lock hold: the whole index */
    uint64_t n = ra.n;
    kvt_info("%s: persist_enabled is false: removed %llu files", l2->name, (unsigned long long)n);
}

int kvt_fileobj_dir_open(const char *path, const char *what, int *out, char *err, size_t errcap)
{
    if (mkdir(path, 0755) < 0 && errno != EEXIST) {
        int rc = -errno;
        snprintf(err, errcap, "cannot create %s %s: %s", what, path, kvt_strerror(rc));
        return rc;
    }
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        int rc = -errno;
        snprintf(err, errcap, "cannot open %s %s: %s", what, path, kvt_strerror(rc));
        return rc;
    }
    *out = fd;
    return 0;
}

int kvt_fileobj_dir_take(kvt_l2 *l2, const struct kvt_l2_spec *spec, const char *path,
                         const char *what, bool shared, bool durable, int *dirfd, int *lockfd,
                         char *err, size_t errcap)
{
    int rc = kvt_fileobj_dir_open(path, what, dirfd, err, errcap);
    if (rc)
        return rc;
    if (access(path, W_OK) < 0) {
        rc = -errno;
        snprintf(err, errcap, "%s %s is not writable: %s", what, path, kvt_strerror(rc));
        return rc;
    }
    /* one owner: before anything in the directory is read or changed */
    rc = kvt_dirlock_take(*dirfd, path, what, shared, NULL, err, errcap);
    if (rc == -ENOLCK) {
        kvt_warn("%s: %s", l2->name, err);
        err[0] = 0;
    } else if (rc < 0) {
        return rc;
    } else {
        *lockfd = rc;
    }
    /* "shared_budget": the record in the directory, before the scan walks it */
    if (spec->shared_budget)
        return kvt_budget_file_attach(l2, *dirfd, path, durable, err, errcap);
    if (shared)
        kvt_budget_file_warn_outside(l2, *dirfd, path);
    return 0;
}

/* ------------------------------------------------------------ O_DIRECT */

void kvt_odirect_init(struct kvt_odirect *od, bool on, int dirfd, uint32_t max_blksz,
                      const char *base)
{
    struct stat st;
    uint32_t b =
        fstat(dirfd, &st) == 0 ? (uint32_t)KVT_MIN(KVT_MAX(st.st_blksize, 512), max_blksz) : 4096;
    od->on = on;
    od->blksz = (b & (b - 1)) ? 4096 : b;
    od->base = base;
}

bool kvt_odirect_usable(const struct kvt_odirect *od, const void *buf, uint64_t len)
{
    return od->on && !atomic_load(&od->refused) && len % od->blksz == 0 &&
           (uintptr_t)buf % od->blksz == 0;
}

bool kvt_odirect_ok(kvt_l2 *l2, struct kvt_odirect *od, const void *buf, uint64_t len)
{
    if (!od->on)
        return false;
    if (kvt_odirect_usable(od, buf, len))
        return true;
    atomic_fetch_add(&l2->counters.odirect_fallbacks, 1);
    if (atomic_load(&od->refused))
        return false;
    if (len % od->blksz) {
        kvt_warn_once(&od->warned_len,
                      "%s: O_DIRECT not used for an object of %llu bytes: length is not a "
                      "multiple of the block size %u (choose a chunk size whose bytes are a "
                      "multiple of it); such transfers are buffered and counted in "
                      "odirect_fallbacks",
                      l2->name, (unsigned long long)len, od->blksz);
        return false;
    }
    atomic_fetch_add(&od->misaligned, 1);
    kvt_warn_once(&od->warned_align,
                  "%s: O_DIRECT not used: buffer %p is not aligned to %u bytes "
                  "(raise --l1-align-bytes); transfer buffered",
                  l2->name, buf, od->blksz);
    return false;
}

int kvt_odirect_openat(kvt_l2 *l2, struct kvt_odirect *od, int dirfd, const char *name, int flags,
                       bool *direct)
{
    flags |= O_CLOEXEC;
    if (*direct) {
        int fd = openat(dirfd, name, flags | O_DIRECT, 0644);
        if (fd >= 0)
            return fd;
        if (errno != EINVAL)
            return -errno;
        atomic_store(&od->refused, true);
        atomic_fetch_add(&l2->counters.odirect_fallbacks, 1);
        kvt_warn_once(&od->warned_refused,
                      "%s: O_DIRECT refused by the file system under %s (open: EINVAL, "
                      "Invalid argument); all transfers are buffered from now on and counted "
                      "in odirect_fallbacks",
                      l2->name, od->base);
        *direct = false;
    }
    int fd = openat(dirfd, name, flags, 0644);
    return fd >= 0 ? fd : -errno;
}

void kvt_odirect_status(const struct kvt_odirect *od, json_t *out)
{
    const char *s = !od->on                     ? "off"
                    : atomic_load(&od->refused) ? "refused by file system (buffered)"
                                                : "on";
    json_object_set_new(out, "odirect", json_string(s));
    json_object_set_new(out, "block_size", json_integer(od->blksz));
}

bool kvt_fileobj_healthy(int dirfd, const struct kvt_odirect *od, const char *what, char *msg,
                         size_t cap)
{
    struct stat st;
    if (fstat(dirfd, &st) < 0 || st.st_nlink == 0) {
        snprintf(msg, cap, "%s %s is gone", what, od->base);
        return false;
    }
    if (od->on && atomic_load(&od->refused))
        snprintf(msg, cap, "ok (O_DIRECT refused by the file system: buffered I/O)");
    else
        snprintf(msg, cap, "ok");
    return true;
}
