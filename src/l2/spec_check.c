/*
 * Storage checks a parsed spec allows before anything is opened (--dry-run
 * runs them too), and the storage identity two adapters of one server must
 * not share. See adapters.h.
 */
#include "l2/adapters.h"
#include "common/util.h"
#include "kvtier/error.h"

#include <errno.h>
#include <limits.h>
#include <linux/magic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

const char *kvt_l2_spec_storage(const struct kvt_l2_spec *s, const char **field, bool *is_dir)
{
    if (!s->desc || !s->desc->storage || !s->opts)
        return NULL;
    return s->desc->storage(s->opts, field, is_dir);
}

/* The parent directory of path (for one that does not exist yet). */
static void parent_of(const char *path, char *out, size_t cap)
{
    snprintf(out, cap, "%s", path);
    size_t n = strlen(out);
    while (n > 1 && out[n - 1] == '/')
        out[--n] = 0;
    kvt_path_cut_parent(out, cap);
}

/* The kernel's own file systems: a directory there passes access() for
 * root, but mkdir or creating a data file in it fails (ENOENT, EPERM,
 * EINVAL) or, worse, talks to the kernel. NULL for a file system that
 * holds files. */
static const char *kernel_fs(const char *dir)
{
    static const struct {
        long magic;
        const char *name;
    } fs[] = {
        {PROC_SUPER_MAGIC, "proc"},
        {SYSFS_MAGIC, "sysfs"},
        {CGROUP_SUPER_MAGIC, "cgroup"},
        {CGROUP2_SUPER_MAGIC, "cgroup2"},
        {DEBUGFS_MAGIC, "debugfs"},
        {TRACEFS_MAGIC, "tracefs"},
        {SECURITYFS_MAGIC, "securityfs"},
        {DEVPTS_SUPER_MAGIC, "devpts"},
        {BPF_FS_MAGIC, "bpf"},
        {PSTOREFS_MAGIC, "pstore"},
        {EFIVARFS_MAGIC, "efivarfs"},
        {HUGETLBFS_MAGIC, "hugetlbfs"},
        {BINFMTFS_MAGIC, "binfmt_misc"},
        {SELINUX_MAGIC, "selinuxfs"},
        {NSFS_MAGIC, "nsfs"},
        {0x62656570, "configfs"},
        {0x65735543, "fusectl"},
        {0x19800202, "mqueue"},
    };
    struct statfs sf;
    if (statfs(dir, &sf) < 0)
        return NULL;
    for (size_t i = 0; i < sizeof(fs) / sizeof(fs[0]); i++)
        if ((long)sf.f_type == fs[i].magic)
            return fs[i].name;
    return NULL;
}

int kvt_l2_check_new(const char *path, char *msg, size_t cap)
{
    char par[PATH_MAX];
    parent_of(path, par, sizeof(par));
    struct stat st;
    if (stat(par, &st) < 0) {
        snprintf(msg, cap, "%s cannot be created: its parent %s: %s", path, par,
                 kvt_strerror(-errno));
        return KVT_E_CONFIG;
    }
    if (!S_ISDIR(st.st_mode)) {
        snprintf(msg, cap, "%s cannot be created: its parent %s is not a directory", path, par);
        return KVT_E_CONFIG;
    }
    if (access(par, W_OK | X_OK) < 0) {
        snprintf(msg, cap, "%s cannot be created: its parent %s is not writable: %s", path, par,
                 kvt_strerror(-errno));
        return KVT_E_CONFIG;
    }
    const char *k = kernel_fs(par);
    if (k) {
        snprintf(msg, cap,
                 "%s cannot be created: its parent %s is on the kernel's %s file system, which "
                 "holds no data files; choose a directory on a disk",
                 path, par, k);
        return KVT_E_CONFIG;
    }
    return 0;
}

/* The directory a spec stores into, if any. */
static int check_dir(const struct kvt_l2_spec *s, const char **field, char *msg, size_t cap)
{
    bool is_dir = false;
    *field = NULL;
    const char *p = kvt_l2_spec_storage(s, field, &is_dir);
    if (!p || !p[0] || !is_dir)
        return 0;
    struct stat st;
    if (stat(p, &st) < 0) {
        if (errno != ENOENT) {
            snprintf(msg, cap, "%s: %s", p, kvt_strerror(-errno));
            return KVT_E_CONFIG;
        }
        return kvt_l2_check_new(p, msg, cap);
    }
    if (!S_ISDIR(st.st_mode)) {
        snprintf(msg, cap, "%s is not a directory", p);
        return KVT_E_CONFIG;
    }
    if (access(p, W_OK | X_OK) < 0) {
        snprintf(msg, cap, "%s is not writable: %s", p, kvt_strerror(-errno));
        return KVT_E_CONFIG;
    }
    const char *k = kernel_fs(p);
    if (k) {
        snprintf(msg, cap,
                 "%s is on the kernel's %s file system, which holds no data files; choose a "
                 "directory on a disk",
                 p, k);
        return KVT_E_CONFIG;
    }
    return 0;
}

int kvt_l2_check_device(const char *path, unsigned dev_type, const char *dev_what, char *msg,
                        size_t cap)
{
    struct stat st;
    if (stat(path, &st) < 0) {
        if (errno != ENOENT) {
            snprintf(msg, cap, "%s: %s", path, kvt_strerror(-errno));
            return KVT_E_CONFIG;
        }
        return kvt_l2_check_new(path, msg, cap);
    }
    if ((st.st_mode & S_IFMT) != dev_type && !S_ISREG(st.st_mode)) {
        snprintf(msg, cap, "%s is neither a %s nor a regular file", path, dev_what);
        return KVT_E_CONFIG;
    }
    if (access(path, R_OK | W_OK) < 0) {
        snprintf(msg, cap, "%s cannot be opened for reading and writing: %s", path,
                 kvt_strerror(-errno));
        return KVT_E_CONFIG;
    }
    return 0;
}

int kvt_l2_spec_check(const struct kvt_l2_spec *s, const char **field, char *msg, size_t cap)
{
    int rc = check_dir(s, field, msg, cap);
    if (rc || !s->desc || !s->desc->check)
        return rc;
    *field = NULL;
    return s->desc->check(s, s->opts, field, msg, cap);
}

/* A path made comparable: the real path when it exists, else the real path
 * of its parent plus the last component, else the absolute spelling. */
static void canon(const char *path, char *out, size_t cap)
{
    char buf[PATH_MAX];
    if (realpath(path, buf)) {
        snprintf(out, cap, "%s", buf);
        return;
    }
    char par[PATH_MAX];
    parent_of(path, par, sizeof(par));
    const char *last = strrchr(path, '/');
    last = last ? last + 1 : path;
    int n;
    if (realpath(par, buf))
        n = snprintf(out, cap, "%s/%s", strcmp(buf, "/") ? buf : "", last);
    else if (path[0] != '/' && getcwd(buf, sizeof(buf)))
        n = snprintf(out, cap, "%s/%s", buf, path);
    else
        n = snprintf(out, cap, "%s", path);
    if (n < 0 || (size_t)n >= cap)
        snprintf(out, cap, "%s", path); /* too long to resolve: compared as given */
}

bool kvt_l2_same_storage(const char *a, const char *b, char *shown, size_t cap)
{
    struct stat x, y;
    char ca[PATH_MAX], cb[PATH_MAX];
    canon(a, ca, sizeof(ca));
    canon(b, cb, sizeof(cb));
    bool same =
        (stat(a, &x) == 0 && stat(b, &y) == 0 && x.st_dev == y.st_dev && x.st_ino == y.st_ino) ||
        strcmp(ca, cb) == 0;
    if (same && shown)
        snprintf(shown, cap, "%s", ca);
    return same;
}
