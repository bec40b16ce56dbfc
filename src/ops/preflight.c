/* Pre-flight of a cache root (see preflight.h). */
#include "ops/preflight.h"

#include "common/util.h"
#include "kvtier/error.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>

static void warn(struct kvt_preflight *pf, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void warn(struct kvt_preflight *pf, const char *fmt, ...)
{
    size_t n = strlen(pf->warning);
    if (n && n + 2 < sizeof(pf->warning)) {
        memcpy(pf->warning + n, "; ", 3);
        n += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pf->warning + n, sizeof(pf->warning) - n, fmt, ap);
    va_end(ap);
}

/* The nearest existing ancestor of path (the root may not exist yet). */
static void existing(const char *path, char *out, size_t cap)
{
    snprintf(out, cap, "%s", path);
    struct stat st;
    while (stat(out, &st) < 0) {
        char *s = strrchr(out, '/');
        if (!s || s == out) {
            snprintf(out, cap, "/");
            return;
        }
        *s = 0;
    }
}

/* Mount point of a block device (by major:minor in mountinfo). */
static bool mount_of(dev_t rdev, char *out, size_t cap)
{
    FILE *f = fopen("/proc/self/mountinfo", "r");
    if (!f)
        return false;
    char line[4096];
    bool found = false;
    while (fgets(line, sizeof(line), f)) {
        unsigned maj, min;
        char mnt[2048];
        /* id parent major:minor root mountpoint ... */
        if (sscanf(line, "%*u %*u %u:%u %*s %2047s", &maj, &min, mnt) == 3 &&
            makedev(maj, min) == rdev) {
            snprintf(out, cap, "%s", mnt);
            found = true;
            break;
        }
    }
    fclose(f);
    return found;
}

void kvt_preflight_run(const char *root, const char *device, uint64_t budget_bytes,
                       struct kvt_preflight *pf)
{
    memset(pf, 0, sizeof(*pf));
    pf->budget_bytes = budget_bytes;
    pf->root_on_device = true;
    snprintf(pf->device, sizeof(pf->device), "%s", device ? device : "");
    existing(root, pf->checked, sizeof(pf->checked));
    struct stat rst;
    bool have_root = stat(pf->checked, &rst) == 0;
    if (pf->device[0]) {
        struct stat dst;
        if (stat(pf->device, &dst) < 0) {
            warn(pf, "KVP_CACHE_DEVICE %s: %s", pf->device, kvt_strerror(-errno));
        } else if (S_ISBLK(dst.st_mode)) {
            if (!mount_of(dst.st_rdev, pf->mount, sizeof(pf->mount)))
                warn(pf, "KVP_CACHE_DEVICE %s is not mounted", pf->device);
            else if (have_root && rst.st_dev != dst.st_rdev)
                pf->root_on_device = false;
        } else if (S_ISDIR(dst.st_mode)) {
            snprintf(pf->mount, sizeof(pf->mount), "%s", pf->device);
            if (have_root && rst.st_dev != dst.st_dev)
                pf->root_on_device = false;
        } else {
            warn(pf, "KVP_CACHE_DEVICE %s is neither a block device nor a directory", pf->device);
        }
        if (!pf->root_on_device)
            warn(pf, "KVP_CACHE_ROOT %s is not on KVP_CACHE_DEVICE %s", root, pf->device);
    }
    struct statvfs sv;
    if (statvfs(pf->checked, &sv) < 0) {
        warn(pf, "cannot stat the file system of %s: %s", pf->checked, kvt_strerror(-errno));
        return;
    }
    pf->fs_total_bytes = (uint64_t)sv.f_blocks * sv.f_frsize;
    pf->fs_free_bytes = (uint64_t)sv.f_bavail * sv.f_frsize;
    pf->fs_can_hold_budget = pf->fs_total_bytes >= budget_bytes;
    if (!pf->fs_can_hold_budget)
        warn(pf,
             "the file system of %s (%.1f GiB in total, %.1f GiB free) cannot hold the budget "
             "of %.1f GiB: writes will fail with ENOSPC before the cap; lower "
             "KVP_CACHE_BUDGET_GB (cache.env.local) or use a larger device",
             pf->checked, (double)pf->fs_total_bytes / KVT_GIB, (double)pf->fs_free_bytes / KVT_GIB,
             (double)budget_bytes / KVT_GIB);
}

json_t *kvt_preflight_json(const struct kvt_preflight *pf)
{
    json_t *o = json_object();
    json_object_set_new(o, "checked_path", json_string(pf->checked));
    json_object_set_new(o, "device", json_string(pf->device));
    json_object_set_new(o, "mount", json_string(pf->mount));
    json_object_set_new(o, "budget_bytes", json_integer((json_int_t)pf->budget_bytes));
    json_object_set_new(o, "fs_total_bytes", json_integer((json_int_t)pf->fs_total_bytes));
    json_object_set_new(o, "fs_free_bytes", json_integer((json_int_t)pf->fs_free_bytes));
    json_object_set_new(o, "fs_can_hold_budget", json_boolean(pf->fs_can_hold_budget));
    json_object_set_new(o, "root_on_device", json_boolean(pf->root_on_device));
    json_object_set_new(o, "warning", pf->warning[0] ? json_string(pf->warning) : json_null());
    return o;
}
