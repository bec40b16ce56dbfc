/*
 * File-backed objects: header reads, verification, corrupt-file handling
 * and index bookkeeping shared by fs.c and nixl_dynamic.c (see fileobj.h).
 */
#include "l2/fileobj.h"
#include "common/log.h"
#include "common/util.h"
#include "kvtier/error.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <unistd.h>

/* Read and verify just the header of a file; fills h and st. */
int kvt_fileobj_read_header(int dirfd, const char *name, enum kvt_codec codec, const kvt_key *want,
                            struct kvt_objhdr *h, struct stat *st, const char **why)
{
    int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -errno;
    uint8_t buf[KVT_OBJHDR_MIN];
    size_t got = 0;
    int rc = fstat(fd, st) < 0 ? -errno : 0;
    if (!rc) rc = kvt_pread_all(fd, buf, sizeof(buf), 0, &got);
    close(fd);
    if (rc == -EIO) {
        *why = "file shorter than a header";
        return KVT_E_CORRUPT;
    }
    if (rc) return rc;
    rc = kvt_objhdr_decode(buf, got, h, why);
    if (rc) return rc;
    if (!kvt_objhdr_matches(h, codec, want)) {
        *why = "header names another key";
        return KVT_E_CORRUPT;
    }
    if ((uint64_t)st->st_size != h->hdr_len + h->payload_len) {
        *why = "file size does not match the header (torn or extended file)";
        return KVT_E_CORRUPT;
    }
    return 0;
}

void kvt_fileobj_corrupt(kvt_l2 *l2, int dirfd, const char *name, const kvt_key *k, const char *why)
{
    char ks[400];
    atomic_fetch_add(&l2->counters.corrupt, 1);
    kvt_warn("%s: corrupt object %s (%s): removed, treated as a miss", l2->name,
             kvt_key_str(k, ks, sizeof(ks)), why);
    unlinkat(dirfd, name, 0);
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
    int rc = kvt_fileobj_read_header(dirfd, name, l2->codec, &t->keys[i], &h, &st, &why);
    if (rc) {
        if (rc == KVT_E_CORRUPT) kvt_fileobj_corrupt(l2, dirfd, name, &t->keys[i], why);
        if (pinned) kvt_l2_forget(l2, &ck);
        return;
    }
    if (pinned) {
        pthread_mutex_lock(&l2->lock);
        struct kvt_l2_obj *p = kvt_l2_find_locked(l2, &ck);
        if (p) {
            p->aux = h.hdr_len;
            p->len = (uint32_t)h.logical_len;
        }
        pthread_mutex_unlock(&l2->lock);
    } else {
        kvt_l2_adopt(l2, &ck, (uint32_t)st.st_size, (uint32_t)h.logical_len, h.hdr_len, 0, true,
                     false);
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
    if (o) hl = (uint16_t)o->aux;
    pthread_mutex_unlock(&l2->lock);
    if (hl == 0 || hl > max_hl) {
        struct kvt_objhdr h;
        struct stat st;
        const char *why = NULL;
        int rc = kvt_fileobj_read_header(dirfd, name, l2->codec, key, &h, &st, &why);
        if (rc) {
            if (rc == KVT_E_CORRUPT) kvt_fileobj_corrupt(l2, dirfd, name, key, why);
            return rc;
        }
        hl = h.hdr_len;
        if (hl > max_hl) return KVT_E_CORRUPT;
    }
    *out = hl;
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
    pthread_mutex_lock(&l2->lock);
    struct kvt_l2_obj *o = kvt_l2_find_locked(l2, ck);
    if (o) {
        l2->used_bytes = l2->used_bytes - o->stored + hl + plen;
        o->stored = (uint32_t)(hl + plen);
        o->aux = hl;
    }
    pthread_mutex_unlock(&l2->lock);
}

void kvt_fileobj_remove_indexed(kvt_l2 *l2)
{
    uint64_t n = 0;
    pthread_mutex_lock(&l2->lock);
    for (uint32_t h = 0; h < l2->idx.hwm; h++) {
        const struct kvt_l2_obj *o = &l2->idx.objs[h];
        if ((o->state & 0x7f) == KVT_OBJ_FREE) continue;
        if (l2->ops->remove(l2, o) == 0) n++;
    }
    pthread_mutex_unlock(&l2->lock);
    kvt_info("%s: persist_enabled is false: removed %llu files", l2->name, (unsigned long long)n);
}
