/*
 * The shared budget record in a shared directory (budget_file.h).
 *
 * Locks: f->lock (a process-local mutex; OFD locks taken through one open
 * file description do not exclude each other, so this process's threads
 * take turns here first) is held across one step's file I/O; it is a leaf:
 * the base never holds l2->lock or any engine lock while it calls in.
 */
#include "l2/kit/budget_file.h"
#include "l2/engine.h"
#include "common/log.h"
#include "common/util.h"
#include "kvtier/error.h"
#include "l2/kit/brec.h"
#include "l2/kit/dirlock.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* byte offsets of the locks: the record's (0) and the servers' (LIVE + slot) */
#define LIVE ((off_t)1 << 20)

struct bfile {
    pthread_mutex_t lock; /* one step at a time from this process (see the top) */
    int fd;
    int dirfd; /* our own duplicate: load() checks the name still leads to fd's file */
    char path[PATH_MAX];
    bool durable;
    uint64_t cap;
    uint64_t id; /* random, per open: a restarted server is a new entry */
    uint32_t pid;
    char host[KVT_BREC_HOST];
    int slot;      /* guarded by lock: our entry, -1 before the first step */
    uint32_t live; /* guarded by lock: live entries at the last census */
    bool warned_torn;
};

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static int ofd(int fd, int cmd, short type, off_t at)
{
    struct flock fl;
    memset(&fl, 0, sizeof(fl));
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    fl.l_start = at;
    fl.l_len = 1;
    while (fcntl(fd, cmd, &fl) < 0) {
        if (errno != EINTR)
            return -errno;
    }
    return 0;
}

/* Does a live process hold entry slot's byte? Ours always lives; a failed
 * query counts as alive (never fold what may still write). call with
 * f->lock and the record lock held */
static bool alive(struct bfile *f, int slot)
{
    if (slot == f->slot)
        return true;
    struct flock fl;
    memset(&fl, 0, sizeof(fl));
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = LIVE + slot;
    fl.l_len = 1;
    if (fcntl(f->fd, F_OFD_GETLK, &fl) < 0)
        return true;
    return fl.l_type != F_UNLCK;
}

/* Fold the entries of dead servers; count the live ones. Returns how many
 * were folded (a kvt_brec_census_fn). call with f->lock and the record lock
 * held */
static uint32_t census(void *ctx, struct kvt_brec *r, uint64_t now)
{
    (void)now; /* the kernel's locks tell the dead */
    struct bfile *f = ctx;
    uint32_t folded = 0, live = 0;
    for (int i = 0; i < KVT_BREC_NODES; i++) {
        if (!r->node[i].id)
            continue;
        if (alive(f, i)) {
            live++;
        } else {
            kvt_info("shared budget %s: the server %s pid %u is gone: its entry (part %lld "
                     "bytes, %llu pending) is folded into the total",
                     f->path, r->node[i].host, r->node[i].pid, (long long)r->node[i].part,
                     (unsigned long long)r->node[i].pending);
            kvt_brec_fold(r, i);
            folded++;
        }
    }
    f->live = live;
    return folded;
}

/* Read the record (the record lock held). An empty one (just created:
 * the first server, or one re-creating a removed record while objects
 * remain) and a torn or foreign one start full (total = cap) until a
 * recount: the file is created at open and the opener's start-up walk
 * (begin, then end) follows at once; charging against 0 meanwhile could
 * let the running servers fill a tier that already holds a cap. */
static int load(struct bfile *f, struct kvt_brec *r)
{
    struct stat st, at;
    if (fstat(f->fd, &st) < 0)
        return -errno;
    if (st.st_nlink == 0)
        return -ESTALE; /* removed under us: a new one would split the servers */
    /* A record removed on NFS by this host is silly-renamed (.nfsXXXX) and
     * keeps nlink 1, and one replaced by a rename is another file at the
     * name: either way our descriptor is no longer the record the others
     * open. Treated as removed. */
    if (fstatat(f->dirfd, KVT_BUDGET_FILE_NAME, &at, AT_SYMLINK_NOFOLLOW) < 0)
        return errno == ENOENT ? -ESTALE : -errno;
    if (at.st_dev != st.st_dev || at.st_ino != st.st_ino)
        return -ESTALE;
    uint8_t buf[KVT_BREC_BYTES + 1];
    ssize_t n = pread(f->fd, buf, sizeof(buf), 0);
    if (n < 0)
        return -errno;
    int rc = kvt_brec_decode(buf, (size_t)n, r);
    if (rc == -ENODATA) {
        kvt_brec_init(r, f->cap, now_ms());
        r->total = (int64_t)f->cap;
    } else if (rc) {
        if (!f->warned_torn)
            kvt_warn("shared budget %s: the record is torn or of another format (%zd bytes): "
                     "rebuilt as full (total = the cap) until a recount (the next server "
                     "start) counts the directory",
                     f->path, n);
        f->warned_torn = true;
        kvt_brec_init(r, f->cap, now_ms());
        r->total = (int64_t)f->cap;
    }
    return 0;
}

static int save(struct bfile *f, const struct kvt_brec *r)
{
    uint8_t buf[KVT_BREC_BYTES];
    kvt_brec_encode(r, buf);
    ssize_t n = pwrite(f->fd, buf, sizeof(buf), 0);
    if (n < 0)
        return -errno;
    if ((size_t)n != sizeof(buf))
        return -EIO;
    if (f->durable && fdatasync(f->fd) < 0)
        return -errno;
    return 0;
}

/* Our entry in r, joining (a free entry, after folding the dead) when we
 * have none: the first step, or the record was rebuilt. call with f->lock
 * and the record lock held */
static int join(struct bfile *f, struct kvt_brec *r, bool *rejoined, uint32_t *folded)
{
    int s = kvt_brec_find(r, f->id);
    if (s >= 0) {
        f->slot = s;
        return 0;
    }
    *rejoined = true;
    if (f->slot >= 0) { /* our old entry is gone (rebuilt record): let its byte go */
        ofd(f->fd, F_OFD_SETLK, F_UNLCK, LIVE + f->slot);
        f->slot = -1;
    }
    *folded += census(f, r, 0);
    for (int i = 0; i < KVT_BREC_NODES; i++) {
        if (r->node[i].id)
            continue;
        /* a free entry whose byte someone holds belongs to a server that
         * joined a record since rebuilt: not ours to take */
        if (ofd(f->fd, F_OFD_SETLK, F_WRLCK, LIVE + i))
            continue;
        kvt_brec_join(r, i, f->id, f->pid, f->host, now_ms());
        f->slot = i;
        f->live++;
        return 0;
    }
    return -ENOSPC;
}

/* One step under both locks. */
static int step(struct bfile *f, const struct kvt_brec_op *op, struct kvt_budget_view *out,
                char *err, size_t errcap)
{
    struct kvt_brec r;
    pthread_mutex_lock(&f->lock);
    int rc = ofd(f->fd, F_OFD_SETLKW, F_WRLCK, 0);
    if (rc) {
        snprintf(err, errcap, "cannot lock %s: %s", f->path, kvt_strerror(rc));
        pthread_mutex_unlock(&f->lock);
        return rc;
    }
    bool rejoined = false;
    uint32_t folded = 0;
    rc = load(f, &r);
    if (!rc)
        rc = join(f, &r, &rejoined, &folded);
    if (rc) {
        snprintf(err, errcap, "%s: %s", f->path,
                 rc == -ENOSPC   ? "every entry is taken by a live server (at most 62 servers)"
                 : rc == -ESTALE ? "the record file was removed or replaced while servers use it"
                                 : kvt_strerror(rc));
        goto out;
    }
    folded += kvt_brec_step(&r, f->slot, op, rejoined, now_ms(), census, f, out);
    if (out) {
        out->nodes = f->live;
        out->folded = folded;
    }
    rc = save(f, &r);
    if (rc)
        snprintf(err, errcap, "cannot write %s: %s", f->path, kvt_strerror(rc));
out:
    ofd(f->fd, F_OFD_SETLK, F_UNLCK, 0);
    pthread_mutex_unlock(&f->lock);
    return rc;
}

static int bf_apply(void *rec, const struct kvt_budget_req *rq, struct kvt_budget_view *out,
                    char *err, size_t errcap)
{
    struct kvt_brec_op op = {.kind = KVT_BREC_APPLY, .rq = rq};
    return step(rec, &op, out, err, errcap);
}

static int bf_begin(void *rec, uint64_t inflight, struct kvt_budget_snap *snap, char *err,
                    size_t errcap)
{
    struct kvt_brec_op op = {.kind = KVT_BREC_BEGIN, .inflight = inflight, .snap = snap};
    return step(rec, &op, NULL, err, errcap);
}

static int bf_end(void *rec, uint64_t inflight, const struct kvt_budget_snap *snap, uint64_t walked,
                  struct kvt_budget_view *out, char *err, size_t errcap)
{
    struct kvt_budget_snap s = *snap;
    struct kvt_brec_op op = {
        .kind = KVT_BREC_END, .inflight = inflight, .snap = &s, .walked = walked};
    return step(rec, &op, out, err, errcap);
}

static void bf_where(void *rec, char *out, size_t cap)
{
    const struct bfile *f = rec;
    snprintf(out, cap, "file:%s", f->path);
}

static void bf_free(struct bfile *f)
{
    if (f->fd >= 0)
        close(f->fd); /* drops this description's OFD locks */
    if (f->dirfd >= 0)
        close(f->dirfd);
    pthread_mutex_destroy(&f->lock);
    free(f);
}

/* Leave: our entry folds into the total (what we stored stays counted:
 * the objects are still there), then the locks go with the descriptor. */
static void bf_leave(void *rec)
{
    struct bfile *f = rec;
    pthread_mutex_lock(&f->lock);
    if (f->slot >= 0 && ofd(f->fd, F_OFD_SETLKW, F_WRLCK, 0) == 0) {
        struct kvt_brec r;
        if (load(f, &r) == 0) {
            int s = kvt_brec_find(&r, f->id);
            if (s >= 0) {
                kvt_brec_fold(&r, s);
                save(f, &r);
            }
        }
        ofd(f->fd, F_OFD_SETLK, F_UNLCK, 0);
    }
    pthread_mutex_unlock(&f->lock);
    bf_free(f);
}

const struct kvt_budget_rec_ops kvt_budget_file_ops = {
    .kind = "file",
    .apply = bf_apply,
    .begin = bf_begin,
    .end = bf_end,
    .where = bf_where,
    .leave = bf_leave,
};

int kvt_budget_file_open(int dirfd, const char *dir, bool durable, uint64_t cap, void **rec,
                         char *err, size_t errcap)
{
    struct bfile *f = kvt_xcalloc(1, sizeof(*f));
    pthread_mutex_init(&f->lock, NULL);
    f->slot = -1;
    f->fd = -1;
    f->dirfd = -1;
    f->durable = durable;
    f->cap = cap;
    f->pid = (uint32_t)getpid();
    snprintf(f->path, sizeof(f->path), "%s/%s", dir, KVT_BUDGET_FILE_NAME);
    char host[256] = "";
    gethostname(host, sizeof(host));
    snprintf(f->host, sizeof(f->host), "%.*s", KVT_BREC_HOST - 1, host);
    while (f->id == 0)
        if (getrandom(&f->id, sizeof(f->id), 0) != sizeof(f->id))
            f->id = kvt_now_ns() ^ ((uint64_t)f->pid << 32);
    f->dirfd = fcntl(dirfd, F_DUPFD_CLOEXEC, 0);
    if (f->dirfd < 0) {
        int rc = -errno;
        snprintf(err, errcap, "cannot open the shared budget record %s: %s", f->path,
                 kvt_strerror(rc));
        bf_free(f);
        return rc;
    }
    f->fd = openat(dirfd, KVT_BUDGET_FILE_NAME, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (f->fd < 0) {
        int rc = -errno;
        snprintf(err, errcap, "cannot open the shared budget record %s: %s", f->path,
                 kvt_strerror(rc));
        bf_free(f);
        return rc;
    }
    /* the file system must keep POSIX locks, or the record cannot be shared */
    int rc = ofd(f->fd, F_OFD_SETLK, F_RDLCK, 0);
    if (rc == 0)
        rc = ofd(f->fd, F_OFD_SETLK, F_UNLCK, 0);
    if (rc && rc != -EAGAIN) {
        snprintf(err, errcap,
                 "the file system under %s does not support file locks (%s): a shared budget "
                 "cannot be kept there (remove \"shared_budget\", or give the servers a file "
                 "system with POSIX locks)",
                 dir, kvt_strerror(rc));
        bf_free(f);
        return rc;
    }
    *rec = f;
    return 0;
}

int kvt_budget_file_attach(kvt_l2 *l2, int dirfd, const char *dir, bool durable, char *err,
                           size_t errcap)
{
    void *rec = NULL;
    int rc = kvt_budget_file_open(dirfd, dir, durable, l2->cap_bytes, &rec, err, errcap);
    if (rc)
        return rc;
    rc = kvt_l2_budget_attach(l2, &kvt_budget_file_ops, rec, err, errcap);
    if (rc) {
        bf_leave(rec);
        return rc;
    }
    /* the first step joins: a record that cannot be used fails the open,
     * not the first store (the base leaves it when l2 is destroyed) */
    return kvt_l2_budget_recount_begin(l2, err, errcap);
}

void kvt_budget_file_warn_outside(kvt_l2 *l2, int dirfd, const char *dir)
{
    if (faccessat(dirfd, KVT_BUDGET_FILE_NAME, F_OK, AT_SYMLINK_NOFOLLOW) == 0)
        kvt_warn("%s: %s/%s holds the shared budget of servers sharing this directory, but this "
                 "server has no \"shared_budget\": what it stores is not counted in their cap "
                 "(give every server sharing the directory \"shared_budget\": true)",
                 l2->name, dir, KVT_BUDGET_FILE_NAME);
}
