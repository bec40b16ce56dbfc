#include "l2/kit/scanq.h"
#include "common/util.h"
#include "l2/kit/objfmt.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <liburing.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#define BATCH 256

struct ent {
    int dirfd;
    kvt_key key;
    struct statx sx;
    char name[KVT_NAME_MAX + 1];
};

struct kvt_l2_scanq {
    struct kvt_l2_found_vec *fv;
    struct io_uring ring;
    int use; /* 0: not decided yet (first flush), 1: the ring, set up; -1: statx in turn */
    int n;
    struct ent e[BATCH];
};

struct kvt_l2_scanq *kvt_l2_scanq_new(struct kvt_l2_found_vec *fv)
{
    struct kvt_l2_scanq *q = kvt_xcalloc(1, sizeof(*q));
    q->fv = fv;
    return q;
}

/* A local file system, where a statx in turn beats a hand-off to an
 * io_uring worker (scanq.h). */
static bool local_fs(int dirfd)
{
    struct statfs sf;
    if (fstatfs(dirfd, &sf) < 0)
        return false;
    switch ((unsigned long)sf.f_type) {
    case EXT4_SUPER_MAGIC: /* ext2, ext3, ext4 */
    case XFS_SUPER_MAGIC:
    case BTRFS_SUPER_MAGIC:
    case TMPFS_MAGIC:
    case F2FS_SUPER_MAGIC:
    case OVERLAYFS_SUPER_MAGIC:
    case 0x2fc12fc1UL: /* ZFS */
        return true;
    default:
        return false;
    }
}

static void found(struct kvt_l2_scanq *q, struct ent *e)
{
    const struct statx *sx = &e->sx;
    if (S_ISREG(sx->stx_mode) && sx->stx_size < KVT_OBJHDR_MIN) {
        /* an object name (published by rename: complete when written) that
         * cannot hold a header: emptied or torn, a mismatch like any other */
        if (unlinkat(e->dirfd, e->name, 0) == 0)
            q->fv->corrupt++;
        return;
    }
    if (!S_ISREG(sx->stx_mode) || sx->stx_size > UINT32_MAX)
        return;
    kvt_l2_found_push(q->fv, &e->key, (uint32_t)sx->stx_size, 0, 0, 0,
                      (int64_t)sx->stx_mtime.tv_sec * 1000000000 + sx->stx_mtime.tv_nsec);
}

void kvt_l2_scanq_flush(struct kvt_l2_scanq *q)
{
    if (!q->n)
        return;
    const unsigned mask = STATX_TYPE | STATX_SIZE | STATX_MTIME;
    const int flags = AT_SYMLINK_NOFOLLOW | AT_STATX_DONT_SYNC;
    if (!q->use) /* the ring only where it pays, set up once */
        q->use = !local_fs(q->e[0].dirfd) && io_uring_queue_init(BATCH, &q->ring, 0) == 0 ? 1 : -1;
    if (q->use > 0) {
        for (int i = 0; i < q->n; i++) {
            struct io_uring_sqe *s = io_uring_get_sqe(&q->ring);
            io_uring_prep_statx(s, q->e[i].dirfd, q->e[i].name, flags, mask, &q->e[i].sx);
            io_uring_sqe_set_data64(s, (uint64_t)i);
        }
        int left = q->n;
        io_uring_submit_and_wait(&q->ring, (unsigned)left);
        while (left > 0) {
            struct io_uring_cqe *c;
            if (io_uring_wait_cqe(&q->ring, &c) < 0)
                break;
            if (c->res == 0)
                found(q, &q->e[io_uring_cqe_get_data64(c)]);
            io_uring_cqe_seen(&q->ring, c);
            left--;
        }
    } else {
        for (int i = 0; i < q->n; i++)
            if (statx(q->e[i].dirfd, q->e[i].name, flags, mask, &q->e[i].sx) == 0)
                found(q, &q->e[i]);
    }
    q->n = 0;
}

void kvt_l2_scanq_add(struct kvt_l2_scanq *q, int dirfd, const char *name, const kvt_key *ck)
{
    size_t l = strlen(name);
    if (l > KVT_NAME_MAX)
        return;
    struct ent *e = &q->e[q->n++];
    e->dirfd = dirfd;
    e->key = *ck;
    memcpy(e->name, name, l + 1);
    if (q->n == BATCH)
        kvt_l2_scanq_flush(q);
}

void kvt_l2_scanq_free(struct kvt_l2_scanq *q)
{
    if (!q)
        return;
    kvt_l2_scanq_flush(q);
    if (q->use > 0)
        io_uring_queue_exit(&q->ring);
    free(q);
}
