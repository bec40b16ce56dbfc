/*
 * faultio: an LD_PRELOAD library that injects I/O errors into the file
 * system calls of the process it is loaded into, for the failure tests.
 *
 *   KVT_FAULTIO="dir=/path,rate=0.2,seed=1,eio,enospc,short"
 *
 * Only files opened (open/openat) under dir are affected. Each read or write
 * on them fails with probability rate, choosing among the enabled kinds:
 *   eio     the call fails with EIO
 *   enospc  a write fails with ENOSPC
 *   short   a write or read transfers only part of what was asked
 * Deterministic for a seed (a counter-based hash, not rand()).
 *
 * Observation, for tests of what the server promises (no faults needed):
 *   delay_ms=N     each read or write of such a file, and each fsync or
 *                  fdatasync of one or of a directory under dir, first
 *                  sleeps N ms (a slow disk: what waits for it shows)
 *   synclog=PATH   each fsync/fdatasync of a file or directory under dir
 *                  appends "fsync PATH" or "fdatasync PATH" to PATH, before
 *                  the call returns
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#define MAXFD 65536

static char dir[1024];
static size_t dirlen;
static double rate;
static uint64_t seed;
static bool k_eio, k_enospc, k_short;
static _Atomic uint8_t watched[MAXFD];
/* the file each watched fd was opened on: an fd closed behind our back (by
 * closedir, or inside libc) and reused for a socket or eventfd must not get
 * faults, so pick() checks the identity before injecting */
static _Atomic uint64_t wdev[MAXFD], wino[MAXFD];
static _Atomic uint64_t counter;
static bool enabled;
static long delay_ms;
static int synclog = -1;

static int (*real_openat)(int, const char *, int, ...);
static int (*real_open)(const char *, int, ...);
static int (*real_close)(int);
static ssize_t (*real_pwrite)(int, const void *, size_t, off_t);
static ssize_t (*real_pwritev)(int, const struct iovec *, int, off_t);
static ssize_t (*real_write)(int, const void *, size_t);
static ssize_t (*real_pread)(int, void *, size_t, off_t);
static ssize_t (*real_preadv)(int, const struct iovec *, int, off_t);
static int (*real_fsync)(int);
static int (*real_fdatasync)(int);

/* dlsym returns void *; POSIX guarantees it converts to a function pointer */
#define LOAD(var, name)                                                                            \
    do {                                                                                           \
        void *p_ = dlsym(RTLD_NEXT, name);                                                         \
        memcpy(&var, &p_, sizeof(p_));                                                             \
    } while (0)

__attribute__((constructor)) static void init(void)
{
    LOAD(real_openat, "openat");
    LOAD(real_open, "open");
    LOAD(real_close, "close");
    LOAD(real_pwrite, "pwrite");
    LOAD(real_pwritev, "pwritev");
    LOAD(real_write, "write");
    LOAD(real_pread, "pread");
    LOAD(real_preadv, "preadv");
    LOAD(real_fsync, "fsync");
    LOAD(real_fdatasync, "fdatasync");
    const char *e = getenv("KVT_FAULTIO");
    if (!e)
        return;
    char buf[2048];
    snprintf(buf, sizeof(buf), "%s", e);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        if (!strncmp(tok, "dir=", 4))
            snprintf(dir, sizeof(dir), "%s", tok + 4);
        else if (!strncmp(tok, "rate=", 5))
            rate = atof(tok + 5);
        else if (!strncmp(tok, "seed=", 5))
            seed = strtoull(tok + 5, NULL, 10);
        else if (!strcmp(tok, "eio"))
            k_eio = true;
        else if (!strcmp(tok, "enospc"))
            k_enospc = true;
        else if (!strcmp(tok, "short"))
            k_short = true;
        else if (!strncmp(tok, "delay_ms=", 9))
            delay_ms = atol(tok + 9);
        else if (!strncmp(tok, "synclog=", 8))
            synclog = real_open(tok + 8, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    }
    dirlen = strlen(dir);
    enabled = dirlen > 0 && (rate > 0 || delay_ms > 0 || synclog >= 0);
}

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

/* 0 = no fault, 1 = eio, 2 = enospc, 3 = short */
static int pick(int fd, bool is_write)
{
    if (!enabled || fd < 0 || fd >= MAXFD || !atomic_load(&watched[fd]))
        return 0;
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) ||
        (uint64_t)st.st_dev != atomic_load(&wdev[fd]) ||
        (uint64_t)st.st_ino != atomic_load(&wino[fd])) {
        atomic_store(&watched[fd], 0);
        return 0;
    }
    if (delay_ms > 0)
        usleep((useconds_t)delay_ms * 1000);
    uint64_t r = mix(seed * 0x9e3779b97f4a7c15ull + atomic_fetch_add(&counter, 1));
    if ((double)(r % 1000000) >= rate * 1000000.0)
        return 0;
    int kinds[3], n = 0;
    if (k_eio)
        kinds[n++] = 1;
    if (k_enospc && is_write)
        kinds[n++] = 2;
    if (k_short)
        kinds[n++] = 3;
    return n ? kinds[(r >> 32) % (uint64_t)n] : 0;
}

static void track(int fd, int dirfd, const char *path)
{
    if (fd < 0 || fd >= MAXFD || !enabled)
        return;
    bool w = false;
    if (path[0] == '/') {
        w = strncmp(path, dir, dirlen) == 0;
    } else {
        char lnk[64], target[4096];
        if (dirfd == AT_FDCWD)
            snprintf(lnk, sizeof(lnk), "/proc/self/cwd");
        else
            snprintf(lnk, sizeof(lnk), "/proc/self/fd/%d", dirfd);
        ssize_t n = readlink(lnk, target, sizeof(target) - 1);
        if (n > 0) {
            target[n] = 0;
            w = strncmp(target, dir, dirlen) == 0;
        }
    }
    struct stat st;
    if (w && (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)))
        w = false; /* only regular files get faults */
    if (w) {
        atomic_store(&wdev[fd], (uint64_t)st.st_dev);
        atomic_store(&wino[fd], (uint64_t)st.st_ino);
    }
    atomic_store(&watched[fd], w);
}

int openat(int dirfd, const char *path, int flags, ...)
{
    mode_t mode = 0;
    if (flags & (O_CREAT | O_TMPFILE)) {
        va_list ap;
        va_start(ap, flags);
        mode = va_arg(ap, mode_t);
        va_end(ap);
    }
    int fd = real_openat(dirfd, path, flags, mode);
    track(fd, dirfd, path);
    return fd;
}

int open(const char *path, int flags, ...)
{
    mode_t mode = 0;
    if (flags & (O_CREAT | O_TMPFILE)) {
        va_list ap;
        va_start(ap, flags);
        mode = va_arg(ap, mode_t);
        va_end(ap);
    }
    int fd = real_open(path, flags, mode);
    track(fd, AT_FDCWD, path);
    return fd;
}

int close(int fd)
{
    if (fd >= 0 && fd < MAXFD)
        atomic_store(&watched[fd], 0);
    return real_close(fd);
}

static ssize_t fail(int kind)
{
    errno = kind == 2 ? ENOSPC : EIO;
    return -1;
}

ssize_t pwrite(int fd, const void *b, size_t n, off_t off)
{
    int k = pick(fd, true);
    if (k == 3 && n > 1)
        return real_pwrite(fd, b, n / 2, off);
    return k && k != 3 ? fail(k) : real_pwrite(fd, b, n, off);
}

ssize_t write(int fd, const void *b, size_t n)
{
    int k = pick(fd, true);
    if (k == 3 && n > 1)
        return real_write(fd, b, n / 2);
    return k && k != 3 ? fail(k) : real_write(fd, b, n);
}

ssize_t pwritev(int fd, const struct iovec *iov, int cnt, off_t off)
{
    int k = pick(fd, true);
    if (k == 3 && cnt > 0 && iov[0].iov_len > 1) /* only part of the first vector */
        return real_pwrite(fd, iov[0].iov_base, iov[0].iov_len / 2, off);
    return k && k != 3 ? fail(k) : real_pwritev(fd, iov, cnt, off);
}

ssize_t pread(int fd, void *b, size_t n, off_t off)
{
    int k = pick(fd, false);
    if (k == 3 && n > 1)
        return real_pread(fd, b, n / 2, off);
    return k && k != 3 ? fail(k) : real_pread(fd, b, n, off);
}

ssize_t preadv(int fd, const struct iovec *iov, int cnt, off_t off)
{
    int k = pick(fd, false);
    if (k == 3 && cnt > 0 && iov[0].iov_len > 1)
        return real_pread(fd, iov[0].iov_base, iov[0].iov_len / 2, off);
    return k && k != 3 ? fail(k) : real_preadv(fd, iov, cnt, off);
}

/* synclog: which file or directory under dir was synced, in call order */
static void log_sync(const char *what, int fd)
{
    if (synclog < 0 || !enabled)
        return;
    char lnk[64], target[4096], line[4200];
    snprintf(lnk, sizeof(lnk), "/proc/self/fd/%d", fd);
    ssize_t n = readlink(lnk, target, sizeof(target) - 1);
    if (n <= 0)
        return;
    target[n] = 0;
    if (strncmp(target, dir, dirlen) != 0)
        return;
    int len = snprintf(line, sizeof(line), "%s %s\n", what, target);
    if (len > 0 && real_write(synclog, line, (size_t)len) < 0)
        return;
}

static void sync_delay(int fd)
{
    char lnk[64], target[4096];
    snprintf(lnk, sizeof(lnk), "/proc/self/fd/%d", fd);
    ssize_t n = readlink(lnk, target, sizeof(target) - 1);
    if (enabled && delay_ms > 0 && n > 0 && (target[n] = 0, !strncmp(target, dir, dirlen)))
        usleep((useconds_t)delay_ms * 1000);
}

int fsync(int fd)
{
    sync_delay(fd);
    int r = real_fsync(fd);
    log_sync("fsync", fd);
    return r;
}

int fdatasync(int fd)
{
    sync_delay(fd);
    int r = real_fdatasync(fd);
    log_sync("fdatasync", fd);
    return r;
}
