/*
 * nixl_store's pool files: "<file_path>/nixl_pool_<i>.bin", each
 * preallocated to file_size; file 0 locked for the pool's life (one pool
 * per directory); the space the pool needs checked before any is taken;
 * files of a larger earlier pool removed; the whole pool removed at stop.
 * kvt_nixl_pool_check runs the same checks for --dry-run.
 */
#include "common/log.h"
#include "common/util.h"
#include "kvtier/error.h"
#include "l2/adapters.h"
#include "l2/kit/fileobj.h"
#include "l2/engine.h"
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

/*
 * Remove the pool: it holds nothing a restart could use (the index is
 * volatile), so no space stays taken once the server is gone. Files go in
 * reverse order and file 0, whose lock says the pool is ours, last, while
 * it is still locked: a server that starts meanwhile either fails on that
 * lock or creates a new file 0 after every other file of this pool is gone.
 * The directory goes too when this start created it and it is empty.
 */
void kvt_nixl_pool_remove(struct ns_engine *e, uint32_t nfiles)
{
    for (uint32_t i = nfiles; e->locked && e->dirfd >= 0 && i-- > 0;) {
        char nm[64];
        snprintf(nm, sizeof(nm), "nixl_pool_%u.bin", i);
        unlinkat(e->dirfd, nm, 0);
    }
    if (e->made_dir)
        rmdir(e->base);
}

/* Open (create) one pool file, preallocated to its full size (one left by
 * a server that died is reused). */
int kvt_nixl_pool_open_file(kvt_l2 *l2, struct ns_engine *e, uint32_t i, uint64_t size, char *err,
                            size_t errcap)
{
    char nm[64];
    snprintf(nm, sizeof(nm), "nixl_pool_%u.bin", i);
    int fd = e->fd[i] >= 0 ? e->fd[i] : openat(e->dirfd, nm, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        snprintf(err, errcap, "cannot open %s/%s: %s", e->base, nm, kvt_strerror(-errno));
        return -errno;
    }
    e->fd[i] = fd;
    if (ftruncate(fd, (off_t)size) < 0) {
        snprintf(err, errcap, "cannot size %s/%s to %llu bytes: %s", e->base, nm,
                 (unsigned long long)size, kvt_strerror(-errno));
        return -errno;
    }
    int rc = posix_fallocate(fd, 0, (off_t)size);
    if (rc && rc != EOPNOTSUPP && rc != EINVAL) {
        snprintf(err, errcap, "cannot preallocate %s/%s (%llu bytes): %s", e->base, nm,
                 (unsigned long long)size, kvt_strerror(-rc));
        return -rc;
    }
    bool direct = e->od.on && !atomic_load(&e->od.refused);
    if (direct) {
        /* refused by the file system (EINVAL): od says so, transfers buffered */
        int dfd = kvt_odirect_openat(l2, &e->od, e->dirfd, nm, O_RDWR, &direct);
        if (dfd < 0) {
            snprintf(err, errcap, "cannot open %s/%s with O_DIRECT: %s", e->base, nm,
                     kvt_strerror(dfd));
            return dfd;
        }
        if (direct)
            e->dfd[i] = dfd;
        else
            close(dfd);
    }
    return 0;
}

/* Take the pool: file 0, locked (one pool per directory). */
int kvt_nixl_pool_lock(struct ns_engine *e, char *err, size_t errcap)
{
    int fd = openat(e->dirfd, "nixl_pool_0.bin", O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        snprintf(err, errcap, "cannot open %s/nixl_pool_0.bin: %s", e->base, kvt_strerror(-errno));
        return -errno;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
        close(fd);
        snprintf(err, errcap,
                 "%s/nixl_pool_0.bin is in use by another process: one nixl_store pool per "
                 "directory",
                 e->base);
        return -EBUSY;
    }
    e->fd[0] = fd;
    e->locked = true;
    return 0;
}

/* Bytes the pool still has to allocate in dirfd (pool files a server that
 * died left are reused: their allocated blocks count), and bytes free. */
void kvt_nixl_pool_space(int dirfd, uint32_t nfiles, uint64_t file_size, uint64_t *need,
                         uint64_t *avail)
{
    *need = 0;
    for (uint32_t i = 0; i < nfiles; i++) {
        char nm[64];
        snprintf(nm, sizeof(nm), "nixl_pool_%u.bin", i);
        struct stat st;
        uint64_t have = 0;
        if (dirfd >= 0 && fstatat(dirfd, nm, &st, 0) == 0 && S_ISREG(st.st_mode))
            have = KVT_MIN((uint64_t)st.st_blocks * 512, file_size);
        *need += file_size - have;
    }
    struct statvfs sv;
    *avail =
        dirfd >= 0 && fstatvfs(dirfd, &sv) == 0 ? (uint64_t)sv.f_bavail * sv.f_frsize : UINT64_MAX;
}

/* The shortfall message: 0, or -ENOSPC with what to change. */
int kvt_nixl_pool_space_check(const char *base, const struct kvt_nixl_opts *o, uint64_t need,
                              uint64_t avail, char *err, size_t errcap)
{
    if (need <= avail)
        return 0;
    uint64_t total = (uint64_t)o->pool_size * o->file_size;
    snprintf(err, errcap,
             "the pool needs %.2f GiB under %s (pool_size %u x file_size %.2f MiB%s) but %.2f "
             "GiB are free: lower pool_size or backend_params.file_size, or free space",
             (double)total / KVT_GIB, base, o->pool_size, (double)o->file_size / (1 << 20),
             need < total ? ", some of it already allocated" : "", (double)avail / KVT_GIB);
    return -ENOSPC;
}

/* Pool files beyond pool_size, left by a larger pool: removed. */
void kvt_nixl_pool_remove_stale(struct ns_engine *e)
{
    DIR *d = fdopendir(dup(e->dirfd));
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d))) {
        const char *p = de->d_name;
        if (strncmp(p, "nixl_pool_", 10) != 0 || p[10] < '0' || p[10] > '9')
            continue;
        char *end;
        unsigned long i = strtoul(p + 10, &end, 10);
        if (strcmp(end, ".bin") == 0 && i >= e->nfiles)
            unlinkat(e->dirfd, p, 0);
    }
    closedir(d);
}

/*
 * --dry-run and the start's config check: the pool's lock, and the space
 * it needs in file_path (or in the parent open would create it in). The
 * object backends (OBJ, AZURE_BLOB) have the s3 type's check (credentials).
 */
int kvt_nixl_pool_check(const struct kvt_l2_spec *spec, const void *opts, const char **field,
                        char *msg, size_t cap)
{
    (void)spec;
    const struct kvt_nixl_opts *o = opts;
    if (o->obj)
        return kvt_s3_nixl_obj_check(o->obj, field, msg, cap);
    *field = "backend_params.file_path";
    char dir[PATH_MAX];
    snprintf(dir, sizeof(dir), "%s", o->file_path);
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) { /* created at open: its parent holds the pool */
        kvt_path_cut_parent(dir, sizeof(dir));
        dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    } else {
        int fd = openat(dfd, "nixl_pool_0.bin", O_RDONLY | O_CLOEXEC);
        bool busy = fd >= 0 && flock(fd, LOCK_SH | LOCK_NB) < 0 && errno == EWOULDBLOCK;
        if (fd >= 0)
            close(fd);
        if (busy) {
            close(dfd);
            snprintf(msg, cap,
                     "%s/nixl_pool_0.bin is in use by another process: one nixl_store pool per "
                     "directory",
                     o->file_path);
            return KVT_E_CONFIG;
        }
    }
    for (uint32_t i = 0; dfd >= 0 && i < o->pool_size; i++) {
        char nm[64];
        snprintf(nm, sizeof(nm), "nixl_pool_%u.bin", i);
        struct stat st;
        if (fstatat(dfd, nm, &st, 0) == 0 && !S_ISREG(st.st_mode)) {
            close(dfd);
            snprintf(msg, cap, "%s/%s is not a regular file: move it away", o->file_path, nm);
            return KVT_E_CONFIG;
        }
    }
    uint64_t need, avail;
    kvt_nixl_pool_space(dfd, o->pool_size, o->file_size, &need, &avail);
    if (dfd >= 0)
        close(dfd);
    return kvt_nixl_pool_space_check(o->file_path, o, need, avail, msg, cap) ? KVT_E_CONFIG : 0;
}
