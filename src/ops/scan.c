/* Offline walk and scan of a cache root (see scan.h). */
#include "ops/scan.h"
#include "key/key.h"
#include "l2/kit/dirlock.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

bool kvt_ns_name_ok(const char *name)
{
    size_t n = strlen(name);
    if (n == 0 || n > 255 || strchr(name, '/') || strchr(name, '@'))
        return false;
    if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
        return false;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)name[i] < 0x20 || name[i] == 0x7f)
            return false;
    return true;
}

bool kvt_object_key(const char *name, kvt_key *k, const char **ns)
{
    size_t len = strlen(name);
    if (len > KVT_NAME_MAX)
        return false;
    /* nixl_store_dynamic's "*.bin", or the fs adapter's "*.data" (the
     * embedded default of `kvtier server`, ./kvtier-data) */
    enum kvt_codec codec;
    if (len >= 5 && strcmp(name + len - 4, ".bin") == 0)
        codec = KVT_CODEC_NIXL;
    else if (len >= 6 && strcmp(name + len - 5, ".data") == 0)
        codec = KVT_CODEC_FS;
    else
        return false;
    if (kvt_key_decode(codec, name, len, k))
        return false;
    /* the namespace as the server reports it (kvt_ns_name: the escaped nixl
     * model, injective: key.h), whichever codec wrote the name */
    *ns = kvt_ns_name(k->ns);
    return (*ns)[0] != 0;
}

static bool is_hex2(const char *s)
{
    return strlen(s) == 2 && strspn(s, "0123456789abcdef") == 2;
}

/* Sum of regular files below a directory (legacy kvp-* trees). */
static uint64_t tree_bytes(int dfd, int depth)
{
    if (depth > 16)
        return 0;
    int fd = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0)
            close(fd);
        return 0;
    }
    uint64_t total = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        struct stat st;
        if (fstatat(dfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
            continue;
        if (S_ISREG(st.st_mode)) {
            total += (uint64_t)st.st_size;
        } else if (S_ISDIR(st.st_mode)) {
            int sub = openat(dfd, de->d_name, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
            if (sub >= 0) {
                total += tree_bytes(sub, depth + 1);
                close(sub);
            }
        }
    }
    closedir(d);
    return total;
}

struct walk {
    kvt_walk_fn fn;
    void *arg;
    bool stop;
    bool tmp_only;    /* report tmp files only: skip lstat of other names */
    uint64_t *legacy; /* NULL: do not measure kvp-* trees */
};

static int walk_dir(struct walk *w, int dfd, int depth)
{
    int fd = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        int e = -errno;
        if (fd >= 0)
            close(fd);
        return e;
    }
    struct dirent *de;
    while (!w->stop && (de = readdir(d))) {
        const char *nm = de->d_name;
        if (!strcmp(nm, ".") || !strcmp(nm, ".."))
            continue;
        if (depth == 0 && (!strcmp(nm, KVT_DIRLOCK_NAME) || !strcmp(nm, KVT_BUDGET_FILE_NAME)))
            continue; /* the owner's lock file and the shared budget's record
                       * (l2/kit/dirlock.h) are no cache files */
        bool tmp = kvt_tmpguard_is_tmp(nm);
        if (w->tmp_only && !tmp && !(depth < 2 && is_hex2(nm)))
            continue;
        struct stat st;
        if (fstatat(dfd, nm, &st, AT_SYMLINK_NOFOLLOW) < 0)
            continue;
        if (S_ISDIR(st.st_mode)) {
            if (depth < 2 && is_hex2(nm)) {
                int sub = openat(dfd, nm, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
                if (sub >= 0) {
                    walk_dir(w, sub, depth + 1);
                    close(sub);
                }
            } else if (depth == 0 && w->legacy && strncmp(nm, "kvp-", 4) == 0) {
                int sub = openat(dfd, nm, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
                if (sub >= 0) {
                    *w->legacy += tree_bytes(sub, 0);
                    close(sub);
                }
            }
            continue;
        }
        if (!S_ISREG(st.st_mode))
            continue; /* links, fifos, sockets: never cache files */
        struct kvt_entry e = {.dfd = dfd, .name = nm, .st = &st};
        if (tmp)
            e.kind = KVT_ENT_TMP;
        else if (kvt_object_key(nm, &e.key, &e.ns))
            e.kind = KVT_ENT_OBJECT;
        else
            e.kind = KVT_ENT_OTHER;
        if (!w->fn(&e, w->arg))
            w->stop = true;
    }
    closedir(d);
    return 0;
}

int kvt_walk_root(int rootfd, kvt_walk_fn fn, void *arg)
{
    struct walk w = {.fn = fn, .arg = arg};
    return walk_dir(&w, rootfd, 0);
}

/* ------------------------------------------------------------ scan */

struct scan_ctx {
    struct kvt_scan *s;
    struct kvt_tmpguard g;
};

static void add(json_t *o, const char *k, uint64_t v)
{
    json_t *cur = json_object_get(o, k);
    json_object_set_new(
        o, k, json_integer((json_int_t)(v + (cur ? (uint64_t)json_integer_value(cur) : 0))));
}

static bool scan_visit(const struct kvt_entry *e, void *arg)
{
    struct scan_ctx *c = arg;
    struct kvt_scan *s = c->s;
    uint64_t sz = (uint64_t)e->st->st_size;
    switch (e->kind) {
    case KVT_ENT_OBJECT:
        s->used_bytes += sz;
        s->objects++;
        add(s->per_ns_bytes, e->ns, sz);
        add(s->per_ns_objects, e->ns, 1);
        break;
    case KVT_ENT_TMP: {
        enum kvt_tmp_verdict v = kvt_tmpguard_classify(&c->g, e->dfd, e->name, e->st, NULL);
        s->tmp_files++;
        s->tmp_bytes += sz;
        s->tmp_n[v]++;
        s->tmp_b[v] += sz;
        break;
    }
    default:
        s->other_files++;
        s->other_bytes += sz;
    }
    return true;
}

int kvt_scan_root(const char *root, struct kvt_scan *s, bool tmp_only)
{
    memset(s, 0, sizeof(*s));
    int rootfd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (rootfd < 0)
        return -errno;
    s->per_ns_bytes = json_object();
    s->per_ns_objects = json_object();
    struct scan_ctx c = {.s = s};
    kvt_tmpguard_init(&c.g, rootfd);
    struct walk w = {.fn = scan_visit,
                     .arg = &c,
                     .tmp_only = tmp_only,
                     .legacy = tmp_only ? NULL : &s->legacy_bytes};
    int rc = walk_dir(&w, rootfd, 0);
    s->used_bytes += s->legacy_bytes;
    if (c.g.regfd >= 0) {
        int fd = openat(c.g.regfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
        struct dirent *de;
        while (d && (de = readdir(d)))
            if (de->d_name[0] != '.')
                s->markers++;
        if (d)
            closedir(d);
        else if (fd >= 0)
            close(fd);
    }
    kvt_tmpguard_fini(&c.g);
    struct statvfs sv;
    if (fstatvfs(rootfd, &sv) == 0) {
        s->fs_total_bytes = (uint64_t)sv.f_blocks * sv.f_frsize;
        s->fs_free_bytes = (uint64_t)sv.f_bavail * sv.f_frsize;
    }
    close(rootfd);
    return rc;
}

void kvt_scan_free(struct kvt_scan *s)
{
    json_decref(s->per_ns_bytes);
    json_decref(s->per_ns_objects);
    s->per_ns_bytes = s->per_ns_objects = NULL;
}

/* ------------------------------------------------------------ users */

int kvt_root_users(const char *root, pid_t *pids, int max)
{
    char want[PATH_MAX];
    if (!realpath(root, want))
        return 0;
    DIR *proc = opendir("/proc");
    if (!proc)
        return 0;
    pid_t self = getpid();
    int n = 0;
    struct dirent *de;
    while ((de = readdir(proc))) {
        char *end;
        long pid = strtol(de->d_name, &end, 10);
        if (*end || pid <= 0 || pid == self)
            continue;
        char fdp[64];
        snprintf(fdp, sizeof(fdp), "/proc/%ld/fd", pid);
        DIR *fds = opendir(fdp);
        if (!fds)
            continue; /* not ours to inspect, or gone */
        struct dirent *fe;
        bool uses = false;
        while (!uses && (fe = readdir(fds))) {
            if (fe->d_name[0] == '.')
                continue;
            char lp[400], target[PATH_MAX];
            snprintf(lp, sizeof(lp), "%s/%s", fdp, fe->d_name);
            ssize_t l = readlink(lp, target, sizeof(target) - 1);
            if (l <= 0)
                continue;
            target[l] = 0;
            uses = strcmp(target, want) == 0;
        }
        closedir(fds);
        if (uses) {
            if (n < max)
                pids[n] = (pid_t)pid;
            n++;
        }
    }
    closedir(proc);
    return n;
}
