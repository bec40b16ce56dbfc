/* One owner per cache directory (see dirlock.h). */
#include "l2/kit/dirlock.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

/* The pid of the process holding an flock on the file open at fd, from
 * /proc/locks ("1: FLOCK ADVISORY WRITE <pid> <maj>:<min>:<ino> 0 EOF";
 * pids as seen from this pid namespace); 0 when not found or ours. */
static pid_t holder_pid(int fd)
{
    struct stat st;
    if (fstat(fd, &st) < 0)
        return 0;
    FILE *f = fopen("/proc/locks", "re");
    if (!f)
        return 0;
    char line[256];
    pid_t found = 0;
    while (!found && fgets(line, sizeof(line), f)) {
        char kind[16];
        int pid;
        unsigned maj, min;
        unsigned long long ino;
        if (strstr(line, "->")) /* a waiter, not a holder */
            continue;
        if (sscanf(line, "%*d: %15s %*s %*s %d %x:%x:%llu", kind, &pid, &maj, &min, &ino) != 5)
            continue;
        if (strcmp(kind, "FLOCK") != 0 || ino != (unsigned long long)st.st_ino ||
            maj != major(st.st_dev) || min != minor(st.st_dev))
            continue;
        if (pid > 0 && pid != getpid())
            found = pid;
    }
    fclose(f);
    return found;
}

static bool unsupported(int e)
{
    return e == ENOLCK || e == EOPNOTSUPP || e == ENOSYS || e == EINVAL;
}

static int take(int dirfd, const char *path, const char *what, bool shared, bool create,
                pid_t *holder, char *err, size_t errcap)
{
    if (holder)
        *holder = 0;
    int flags = O_RDWR | O_CLOEXEC | O_NOFOLLOW | (create ? O_CREAT : 0);
    int fd = openat(dirfd, KVT_DIRLOCK_NAME, flags, 0644);
    if (fd < 0) {
        int e = errno;
        snprintf(err, errcap, "%s %s: cannot %s its lock file %s: %s", what, path,
                 create ? "create" : "open", KVT_DIRLOCK_NAME, strerror(e));
        return -e;
    }
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, errcap, "%s %s: %s is not a regular file", what, path, KVT_DIRLOCK_NAME);
        close(fd);
        return -EINVAL;
    }
    if (flock(fd, (shared ? LOCK_SH : LOCK_EX) | LOCK_NB) == 0)
        return fd; /* the file stays empty: it counts no bytes in du */
    int e = errno;
    if (unsupported(e)) {
        snprintf(err, errcap,
                 "%s %s: the file system does not support locks (%s): kvtier cannot "
                 "make sure that no other server uses this directory",
                 what, path, strerror(e));
        close(fd);
        return -ENOLCK;
    }
    if (e != EWOULDBLOCK) {
        snprintf(err, errcap, "%s %s: cannot lock %s: %s", what, path, KVT_DIRLOCK_NAME,
                 strerror(e));
        close(fd);
        return -e;
    }
    /* who holds it: shared holders let another shared lock in */
    bool others_shared = !shared && flock(fd, LOCK_SH | LOCK_NB) == 0;
    pid_t pid = others_shared ? -1 : holder_pid(fd);
    close(fd);
    if (holder)
        *holder = pid;
    char who[48] = "";
    if (pid > 0)
        snprintf(who, sizeof(who), " (pid %d)", (int)pid);
    if (others_shared)
        snprintf(err, errcap,
                 "%s %s is in use by kvtier servers that share it (\"shared\": true): set "
                 "\"shared\": true here too, or give this server its own directory",
                 what, path);
    else if (shared)
        snprintf(err, errcap,
                 "%s %s is in use by a kvtier server%s that owns it alone: directories shared "
                 "by several servers need \"shared\": true in every server's config",
                 what, path, who);
    else
        snprintf(err, errcap,
                 "%s %s is in use by another kvtier server%s: one server per directory; stop "
                 "it, or give this server its own directory (servers that share one on "
                 "purpose, e.g. on HF3FS, all set \"shared\": true)",
                 what, path, who);
    return -EBUSY;
}

int kvt_dirlock_take(int dirfd, const char *path, const char *what, bool shared, pid_t *holder,
                     char *err, size_t errcap)
{
    return take(dirfd, path, what, shared, true, holder, err, errcap);
}

int kvt_dirlock_take_existing(int dirfd, const char *path, const char *what, pid_t *holder,
                              char *err, size_t errcap)
{
    return take(dirfd, path, what, false, false, holder, err, errcap);
}
