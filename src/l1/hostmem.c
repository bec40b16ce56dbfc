/* What the host can give an L1 pool (hostmem.h). */
#include "l1/hostmem.h"
#include "common/util.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/statvfs.h>

/* root + path into out ("" root: path itself). */
static void at(const char *root, const char *path, char *out, size_t cap)
{
    snprintf(out, cap, "%s%s", root ? root : "", path);
}

/* A "Key:   N kB" line of a /proc file, in bytes; 0 when missing. */
static uint64_t proc_kb(const char *file, const char *key)
{
    FILE *f = fopen(file, "re");
    if (!f)
        return 0;
    char line[256];
    size_t kl = strlen(key);
    uint64_t v = 0;
    while (fgets(line, sizeof(line), f)) {
        if (strncmp(line, key, kl) || line[kl] != ':')
            continue;
        unsigned long long x = strtoull(line + kl + 1, NULL, 10);
        v = strstr(line, "kB") ? (uint64_t)x * 1024 : (uint64_t)x;
        break;
    }
    fclose(f);
    return v;
}

/* One number from a cgroup file: "max" (v2) or a v1 value near 2^63 is no
 * limit (NONE); a missing or unreadable file is -1. */
static int cg_value(const char *file, uint64_t *out)
{
    FILE *f = fopen(file, "re");
    if (!f)
        return -1;
    char buf[64] = "";
    bool ok = fgets(buf, sizeof(buf), f) != NULL;
    fclose(f);
    if (!ok)
        return -1;
    if (!strncmp(buf, "max", 3)) {
        *out = KVT_HOSTMEM_NONE;
        return 0;
    }
    char *end;
    errno = 0;
    unsigned long long x = strtoull(buf, &end, 10);
    if (end == buf || errno)
        return -1;
    *out = x >= (1ull << 62) ? KVT_HOSTMEM_NONE : (uint64_t)x;
    return 0;
}

/* The mount point of the memory cgroup hierarchy (v2: fstype cgroup2; v1:
 * fstype cgroup with "memory" among its super options) and the root of
 * the hierarchy it shows, from mountinfo. 0 or -1. */
static int cg_mount(const char *mountinfo, bool v2, char *mnt, size_t mcap, char *mroot,
                    size_t rcap)
{
    FILE *f = fopen(mountinfo, "re");
    if (!f)
        return -1;
    char *line = NULL;
    size_t lcap = 0;
    int rc = -1;
    while (getline(&line, &lcap, f) > 0) {
        /* id parent maj:min root mountpoint opts [optional...] - fstype source superopts */
        char root[PATH_MAX], mp[PATH_MAX];
        if (sscanf(line, "%*s %*s %*s %4095s %4095s", root, mp) != 2)
            continue;
        char *sep = strstr(line, " - ");
        if (!sep)
            continue;
        char fstype[64], src[256], sopts[1024] = "";
        if (sscanf(sep + 3, "%63s %255s %1023s", fstype, src, sopts) < 2)
            continue;
        bool match;
        if (v2) {
            match = !strcmp(fstype, "cgroup2");
        } else {
            match = false;
            if (!strcmp(fstype, "cgroup"))
                for (char *sp, *tok = strtok_r(sopts, ",", &sp); tok;
                     tok = strtok_r(NULL, ",", &sp))
                    match |= !strcmp(tok, "memory");
        }
        if (match) {
            snprintf(mnt, mcap, "%s", mp);
            snprintf(mroot, rcap, "%s", root);
            rc = 0;
            break;
        }
    }
    free(line);
    fclose(f);
    return rc;
}

/* The cgroup's limit: the process's memory cgroup (v2 first, else v1), its
 * limit file read at every level from the process's cgroup up to the
 * mount point; the tightest limit and the least free room win. */
static void read_cgroup(const char *root, struct kvt_hostmem *h)
{
    char file[PATH_MAX];
    at(root, "/proc/self/cgroup", file, sizeof(file));
    FILE *f = fopen(file, "re");
    if (!f)
        return;
    char line[PATH_MAX + 64], v2path[PATH_MAX] = "", v1path[PATH_MAX] = "";
    bool have_v2 = false, have_v1 = false;
    while (fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\n")] = 0;
        char *c1 = strchr(line, ':');
        char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2)
            continue;
        *c1 = *c2 = 0;
        const char *ctrl = c1 + 1, *path = c2 + 1;
        if (!strcmp(line, "0") && !ctrl[0]) {
            snprintf(v2path, sizeof(v2path), "%s", path);
            have_v2 = true;
        } else {
            char tmp[256];
            snprintf(tmp, sizeof(tmp), "%s", ctrl);
            for (char *sp, *tok = strtok_r(tmp, ",", &sp); tok; tok = strtok_r(NULL, ",", &sp))
                if (!strcmp(tok, "memory")) {
                    snprintf(v1path, sizeof(v1path), "%s", path);
                    have_v1 = true;
                }
        }
    }
    fclose(f);
    char mountinfo[PATH_MAX];
    at(root, "/proc/self/mountinfo", mountinfo, sizeof(mountinfo));
    for (int pass = 0; pass < 2; pass++) {
        bool v2 = pass == 0;
        if (v2 ? !have_v2 : !have_v1)
            continue;
        const char *path = v2 ? v2path : v1path;
        const char *limit_name = v2 ? "memory.max" : "memory.limit_in_bytes";
        const char *usage_name = v2 ? "memory.current" : "memory.usage_in_bytes";
        char mnt[PATH_MAX], mroot[PATH_MAX];
        if (cg_mount(mountinfo, v2, mnt, sizeof(mnt), mroot, sizeof(mroot)))
            continue;
        /* the path in /proc/self/cgroup is from the hierarchy's root; the
         * mount may show a subtree of it */
        size_t rl = strlen(mroot);
        if (strcmp(mroot, "/") && !strncmp(path, mroot, rl) && (!path[rl] || path[rl] == '/'))
            path += rl;
        char dir[PATH_MAX], base[PATH_MAX];
        at(root, mnt, base, sizeof(base));
        int dl = snprintf(dir, sizeof(dir), "%s%s", base, !strcmp(path, "/") ? "" : path);
        if (dl < 0 || (size_t)dl >= sizeof(dir))
            continue; /* a path longer than PATH_MAX names no file */
        bool found = false;
        for (;;) {
            char lf[PATH_MAX + 32], uf[PATH_MAX + 32];
            snprintf(lf, sizeof(lf), "%s/%s", dir, limit_name);
            snprintf(uf, sizeof(uf), "%s/%s", dir, usage_name);
            uint64_t lim, use = 0;
            if (cg_value(lf, &lim) == 0) {
                found = true;
                if (lim != KVT_HOSTMEM_NONE) {
                    if (cg_value(uf, &use) || use == KVT_HOSTMEM_NONE)
                        use = 0;
                    uint64_t room = lim > use ? lim - use : 0;
                    if (lim < h->cg_limit) {
                        h->cg_limit = lim;
                        const char *shown = lf + (root ? strlen(root) : 0);
                        size_t n = KVT_MIN(strlen(shown), sizeof(h->cg_file) - 1);
                        memcpy(h->cg_file, shown, n);
                        h->cg_file[n] = 0;
                    }
                    h->cg_avail = KVT_MIN(h->cg_avail, room);
                }
            }
            if (strlen(dir) <= strlen(base))
                break;
            char *slash = strrchr(dir, '/');
            if (!slash || (size_t)(slash - dir) < strlen(base))
                break;
            *slash = 0;
        }
        if (found)
            return; /* the memory controller is on this hierarchy */
    }
}

void kvt_hostmem_read(const char *root, struct kvt_hostmem *h)
{
    memset(h, 0, sizeof(*h));
    h->cg_limit = h->cg_avail = h->as_limit = KVT_HOSTMEM_NONE;
    char file[PATH_MAX];
    at(root, "/proc/meminfo", file, sizeof(file));
    h->mem_total = proc_kb(file, "MemTotal");
    h->mem_available = proc_kb(file, "MemAvailable");
    h->hp_size = proc_kb(file, "Hugepagesize");
    h->hp_free = proc_kb(file, "HugePages_Free") * h->hp_size;
    at(root, "/dev/shm", file, sizeof(file));
    struct statvfs sv;
    if (statvfs(file, &sv) == 0) {
        h->shm_size = (uint64_t)sv.f_blocks * sv.f_frsize;
        h->shm_free = (uint64_t)sv.f_bavail * sv.f_frsize;
    }
    read_cgroup(root, h);
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
        h->as_limit = (uint64_t)rl.rlim_cur;
    at(root, "/proc/self/status", file, sizeof(file));
    h->as_used = proc_kb(file, "VmSize");
}

/* ---------------------------------------------------------------- verdict */

static void gib(char *out, size_t cap, uint64_t b)
{
    double g = (double)b / KVT_GIB;
    snprintf(out, cap, g < 0.1 && g > 0 ? "%.3f GiB" : g < 10 ? "%.2f GiB" : "%.1f GiB", g);
}

/* "give --l1-size-gb X or less": X rounded down, never shown as 0 */
static void at_most(char *out, size_t cap, uint64_t b)
{
    double g = (double)b / KVT_GIB;
    if (g >= 10)
        snprintf(out, cap, "%.1f", floor(g * 10) / 10);
    else if (g >= 0.1)
        snprintf(out, cap, "%.2f", floor(g * 100) / 100);
    else
        snprintf(out, cap, "%.3f", floor(g * 1000) / 1000);
}

__attribute__((format(printf, 3, 4))) static void add(char *buf, size_t cap, const char *fmt, ...)
{
    size_t l = strlen(buf);
    if (l >= cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + l, cap - l, fmt, ap);
    va_end(ap);
}

void kvt_l1_fit(const struct kvt_hostmem *h, uint64_t size, bool lazy, bool hugepages, bool named,
                struct kvt_l1_fit *out)
{
    memset(out, 0, sizeof(*out));
    out->now = out->ever = KVT_HOSTMEM_NONE;
    if (hugepages)
        lazy = false; /* huge pages are allocated at start (l1.c) */
    char a[32], b[32], s[32];
    char *fg = out->figures;
    size_t fc = sizeof(out->figures);
    /* now: what a preallocation can take; ever: what a lazy pool can reach */
    if (h->mem_available)
        out->now = h->mem_available;
    if (h->mem_total)
        out->ever = h->mem_total;
    gib(a, sizeof(a), h->mem_available);
    gib(b, sizeof(b), h->mem_total);
    add(fg, fc, "MemAvailable %s of MemTotal %s", h->mem_available ? a : "?",
        h->mem_total ? b : "?");
    if (h->cg_limit != KVT_HOSTMEM_NONE) {
        out->now = KVT_MIN(out->now, h->cg_avail);
        out->ever = KVT_MIN(out->ever, h->cg_limit);
        gib(a, sizeof(a), h->cg_limit);
        gib(b, sizeof(b), h->cg_avail);
        add(fg, fc, "; cgroup limit %s (%s), %s of it free", a, h->cg_file, b);
    } else {
        add(fg, fc, "; no cgroup memory limit");
    }
    if (named && h->shm_size) {
        out->now = KVT_MIN(out->now, h->shm_free);
        out->ever = KVT_MIN(out->ever, h->shm_size);
        gib(a, sizeof(a), h->shm_free);
        gib(b, sizeof(b), h->shm_size);
        add(fg, fc, "; /dev/shm %s free of %s", a, b);
    }
    if (hugepages) {
        out->now = h->hp_free;
        gib(a, sizeof(a), h->hp_free);
        add(fg, fc, "; free huge pages %s (HugePages_Free x Hugepagesize %" PRIu64 " KiB)", a,
            h->hp_size / 1024);
    }
    uint64_t as_room = KVT_HOSTMEM_NONE;
    if (h->as_limit != KVT_HOSTMEM_NONE) {
        as_room = h->as_limit > h->as_used ? h->as_limit - h->as_used : 0;
        gib(a, sizeof(a), h->as_limit);
        gib(b, sizeof(b), h->as_used);
        add(fg, fc, "; RLIMIT_AS %s, %s mapped already", a, b);
    } else {
        add(fg, fc, "; RLIMIT_AS unlimited");
    }
    gib(s, sizeof(s), size);
    if (!lazy && out->now != KVT_HOSTMEM_NONE && size > out->now) {
        out->verdict = KVT_L1_FIT_REFUSE;
        at_most(a, sizeof(a), out->now);
        gib(b, sizeof(b), out->now);
        char less[64] = "";
        if (out->now >= KVT_GIB / 1000)
            snprintf(less, sizeof(less), " or give --l1-size-gb %s or less", a);
        if (hugepages)
            snprintf(out->msg, sizeof(out->msg),
                     "--l1-size-gb: %s in huge pages (--l1-use-hugepages, allocated at "
                     "start) is more than the free huge pages: %s (%s): reserve more (sysctl "
                     "vm.nr_hugepages)%s",
                     s, b, fg, less);
        else
            snprintf(out->msg, sizeof(out->msg),
                     "--l1-size-gb: %s preallocated (--no-l1-use-lazy) is more than this host "
                     "can allocate now: %s (%s): give --l1-size-gb %s or less, or leave the "
                     "pool lazy (it then grows as it fills)",
                     s, b, fg, a);
        return;
    }
    if (size > as_room) {
        out->verdict = KVT_L1_FIT_REFUSE;
        at_most(a, sizeof(a), as_room);
        snprintf(out->msg, sizeof(out->msg),
                 "--l1-size-gb: the pool is mapped whole at start (%s), more than the "
                 "address space RLIMIT_AS leaves (%s): raise the limit (ulimit -v) or give "
                 "--l1-size-gb %s or less",
                 s, fg, a);
        return;
    }
    if (lazy && out->ever != KVT_HOSTMEM_NONE && size > out->ever) {
        out->verdict = KVT_L1_FIT_WARN;
        at_most(a, sizeof(a), out->ever);
        gib(b, sizeof(b), out->ever);
        snprintf(out->msg, sizeof(out->msg),
                 "--l1-size-gb: %s (lazy) is more than this host could ever back: %s (%s): "
                 "the pool grows as clients fill it, and would run %s out of memory "
                 "(the kernel's OOM killer) before its eviction starts; give --l1-size-gb "
                 "%s or less",
                 s, b, fg, out->ever == h->cg_limit ? "the cgroup" : "the host", a);
    }
}

json_t *kvt_l1_fit_json(const struct kvt_l1_fit *f)
{
    static const char *const names[] = {"fits", "warning", "refused"};
    json_t *o = json_object();
    json_object_set_new(o, "verdict", json_string(names[f->verdict]));
    json_object_set_new(o, "available_bytes",
                        f->now == KVT_HOSTMEM_NONE ? json_null()
                                                   : json_integer((json_int_t)f->now));
    json_object_set_new(o, "backable_bytes",
                        f->ever == KVT_HOSTMEM_NONE ? json_null()
                                                    : json_integer((json_int_t)f->ever));
    json_object_set_new(o, "figures", json_string(f->figures));
    json_object_set_new(o, "warning",
                        f->verdict == KVT_L1_FIT_WARN ? json_string(f->msg) : json_null());
    return o;
}
