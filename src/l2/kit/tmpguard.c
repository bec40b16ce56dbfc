/* tmp guard: liveness of tmp files' writers. Rules in tmpguard.h. */
#include "l2/kit/tmpguard.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <unistd.h>

static const char *const verdict_names[KVT_TMP_NVERDICTS] = {
    "ours", "live", "undecidable", "recent", "dead", "stale",
};

const char *kvt_tmp_verdict_name(enum kvt_tmp_verdict v)
{
    return (unsigned)v < KVT_TMP_NVERDICTS ? verdict_names[v] : "?";
}

/* ------------------------------------------------------------ processes */

/*
 * The liveness rule. A pid alone could be reused by an unrelated process,
 * so the start time must match too. /proc/<pid> missing is only proof of
 * death when kill(pid, 0) agrees (with hidepid=2 other users' processes are
 * invisible in /proc but still exist).
 */
int kvt_proc_alive(pid_t pid, uint64_t start)
{
    if (pid <= 0)
        return 0;
    char st;
    uint64_t s;
    int rc = kvt_proc_stat(pid, &st, &s);
    if (rc == 0) {
        if (s != start)
            return 0; /* the pid was reused */
        return st == 'Z' || st == 'X' ? 0 : 1;
    }
    if (rc == -ENOENT) {
        if (kill(pid, 0) < 0 && errno == ESRCH)
            return 0;
        return -1; /* exists but invisible to us */
    }
    return -1;
}

/* ------------------------------------------------------------ names */

int kvt_tmpguard_name(char *out, size_t cap, const char *final, pid_t pid, uint64_t start,
                      uint64_t seq)
{
    int n = snprintf(out, cap, "%s.tmp.%x-%" PRIx64 "-%" PRIx64, final, (unsigned)pid, start, seq);
    return n < 0 || (size_t)n >= cap ? -ENAMETOOLONG : n;
}

bool kvt_tmpguard_is_tmp(const char *name)
{
    const char *p = strstr(name, ".tmp.");
    return p && p[5] != 0;
}

static bool all_hex(const char *s, size_t n)
{
    if (n == 0 || n > 16)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return false;
    return true;
}

bool kvt_tmpguard_parse(const char *name, pid_t *pid, uint64_t *start)
{
    /* the last ".tmp." starts the suffix: "<pid>-<start>-<seq>", all hex */
    const char *p = NULL;
    for (const char *q = strstr(name, ".tmp."); q; q = strstr(q + 1, ".tmp."))
        p = q;
    if (!p)
        return false;
    p += 5;
    const char *d1 = strchr(p, '-');
    const char *d2 = d1 ? strchr(d1 + 1, '-') : NULL;
    if (!d1 || !d2 || strchr(d2 + 1, '-'))
        return false;
    if (!all_hex(p, (size_t)(d1 - p)) || (size_t)(d1 - p) > 8 ||
        !all_hex(d1 + 1, (size_t)(d2 - d1 - 1)) || !all_hex(d2 + 1, strlen(d2 + 1)))
        return false;
    *pid = (pid_t)strtoul(p, NULL, 16);
    *start = strtoull(d1 + 1, NULL, 16);
    return *pid > 0;
}

int kvt_tmpguard_hold(int fd)
{
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0};
    return fcntl(fd, F_OFD_SETLK, &fl) < 0 ? -errno : 0;
}

/* Is a write lock held on the file by anyone (any process, any pid
 * namespace on this kernel)? 1 yes, 0 no, -1 cannot tell. */
static int locked(int dfd, const char *name)
{
    int fd = openat(dfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY);
    if (fd < 0)
        return -1;
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0};
    int rc = fcntl(fd, F_OFD_GETLK, &fl) < 0 ? -1 : fl.l_type != F_UNLCK;
    close(fd);
    return rc;
}

/* ------------------------------------------------------------ the guard */

int kvt_tmpguard_init(struct kvt_tmpguard *g, int rootfd)
{
    memset(g, 0, sizeof(*g));
    g->self_pid = getpid();
    char st;
    g->proc_ok = kvt_proc_stat(g->self_pid, &st, &g->self_start) == 0;
    g->now = time(NULL);
    g->regfd = openat(rootfd, KVT_TMPGUARD_DIR, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    if (g->regfd < 0 && errno != ENOENT && errno != ENOTDIR)
        return -errno;
    return 0;
}

void kvt_tmpguard_fini(struct kvt_tmpguard *g)
{
    if (g->regfd >= 0)
        close(g->regfd);
    g->regfd = -1;
}

/* Read a registry marker: 1 parsed, 0 absent, -1 unreadable or garbled. */
static int read_marker(int regfd, const char *name, pid_t *pid, uint64_t *start, time_t *mtime)
{
    int fd = openat(regfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY);
    if (fd < 0)
        return errno == ENOENT ? 0 : -1;
    char buf[256];
    struct stat st;
    ssize_t n = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? read(fd, buf, sizeof(buf) - 1) : -1;
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = 0;
    long long p = 0;
    unsigned long long s = 0;
    if (sscanf(buf, " pid=%lld start=%llu", &p, &s) != 2 || p <= 0 || p > INT32_MAX)
        return -1;
    *pid = (pid_t)p;
    *start = s;
    if (mtime)
        *mtime = st.st_mtim.tv_sec;
    return 1;
}

static int alive(const struct kvt_tmpguard *g, pid_t pid, uint64_t start)
{
    if (!g->proc_ok)
        return -1;
    return kvt_proc_alive(pid, start);
}

enum kvt_tmp_verdict kvt_tmpguard_classify(struct kvt_tmpguard *g, int dfd, const char *name,
                                           const struct stat *st, const char **why)
{
    const char *w = NULL;
    enum kvt_tmp_verdict v;
    pid_t pid;
    uint64_t start;
    bool named = kvt_tmpguard_parse(name, &pid, &start);
    if (named && g->proc_ok && pid == g->self_pid && start == g->self_start) {
        v = KVT_TMP_OURS;
        w = "written by this process";
        goto out;
    }
    if (locked(dfd, name) == 1) {
        v = KVT_TMP_LIVE;
        w = "its writer holds the file lock";
        goto out;
    }
    if (g->regfd >= 0) {
        pid_t rp;
        uint64_t rs;
        int m = read_marker(g->regfd, name, &rp, &rs, NULL);
        if (m < 0) {
            v = KVT_TMP_UNDECIDABLE;
            w = "registry marker unreadable";
            goto out;
        }
        if (m > 0) {
            int a = alive(g, rp, rs);
            v = a > 0 ? KVT_TMP_LIVE : a < 0 ? KVT_TMP_UNDECIDABLE : KVT_TMP_DEAD;
            w = a > 0   ? "registered writer runs"
                : a < 0 ? "registered writer's liveness cannot be decided"
                        : "registered writer is gone";
            goto out;
        }
    }
    if (named) {
        int a = alive(g, pid, start);
        v = a > 0 ? KVT_TMP_LIVE : a < 0 ? KVT_TMP_UNDECIDABLE : KVT_TMP_DEAD;
        w = a > 0   ? "writer named in the file name runs"
            : a < 0 ? "writer's liveness cannot be decided"
                    : "writer named in the file name is gone";
        goto out;
    }
    if (g->now - st->st_mtim.tv_sec < KVT_TMPGUARD_UNMARKED_GRACE_S) {
        v = KVT_TMP_RECENT;
        w = "no marker, modified less than 15 minutes ago";
    } else {
        v = KVT_TMP_STALE;
        w = "no marker, older than 15 minutes";
    }
out:
    if (why)
        *why = w;
    return v;
}

enum kvt_tmp_sweep kvt_tmpguard_sweep(struct kvt_tmpguard *g, int dfd, const char *name,
                                      bool closing, uint64_t *size)
{
    struct stat st;
    if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode))
        return KVT_SWEEP_NONE;
    enum kvt_tmp_verdict v = kvt_tmpguard_classify(g, dfd, name, &st, NULL);
    if (v == KVT_TMP_OURS ? closing : kvt_tmp_removable(v))
        return unlinkat(dfd, name, 0) == 0 ? KVT_SWEEP_REMOVED : KVT_SWEEP_NONE;
    if (v == KVT_TMP_OURS)
        return KVT_SWEEP_NONE;
    if (size)
        *size = (uint64_t)st.st_size;
    return KVT_SWEEP_KEPT;
}

int kvt_tmpguard_sweep_markers(struct kvt_tmpguard *g, uint64_t *swept, uint64_t *kept)
{
    uint64_t s = 0, k = 0;
    if (g->regfd < 0)
        goto done;
    int fd = openat(g->regfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        int e = -errno;
        if (fd >= 0)
            close(fd);
        return e;
    }
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        pid_t pid;
        uint64_t start;
        time_t mt = 0;
        int m = read_marker(g->regfd, de->d_name, &pid, &start, &mt);
        if (m > 0 && alive(g, pid, start) == 0 && g->now - mt > KVT_TMPGUARD_MARKER_TTL_S &&
            unlinkat(g->regfd, de->d_name, 0) == 0)
            s++;
        else
            k++; /* live, undecidable, unreadable, or dead for less than an hour */
    }
    closedir(d);
done:
    if (swept)
        *swept = s;
    if (kept)
        *kept = k;
    return 0;
}
