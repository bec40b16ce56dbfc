/*
 * raw_block device checks: what a device or file is, before anything is
 * written to it. The start (rb_open) and --dry-run (kvt_raw_block_check)
 * run the same functions, so a dry run refuses what the start would.
 *
 * In use (never overridden): a block device that is mounted, swap, held by
 *   device-mapper or RAID (its holders), one of whose partitions is, or that
 *   any other program claimed exclusively (an O_EXCL open fails with EBUSY:
 *   the kernel's own answer, which also covers another kvtier server); a
 *   regular file that backs a loop device, is swap, or is locked by another
 *   kvtier server (flock).
 * Content: kvtier's own format (this meta_magic in a checkpoint copy) is
 *   opened as such (rb_plan decides between recovery, an error, and
 *   starting empty). Anything else must be empty: no signature libblkid
 *   knows (file systems, partition tables, RAID, LVM, swap, ...), and zeros
 *   in its first and last MiB, in 1024 blocks spread over it and, for a
 *   regular file, in the first block of each data extent. That is a
 *   sample, not a proof: it catches what people point a cache at by
 *   mistake. Foreign content is refused unless "format": "force", which
 *   wipes the signatures (as wipefs does) before formatting, so that no
 *   tool later takes the device for what it was.
 */
#include "common/util.h"
#include "kvtier/error.h"
#include "l2/adapters.h"
#include "l2/raw_block/raw_block.h"

#include <blkid.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#define PROBE_EDGE (1u << 20) /* first and last bytes read in full */
#define PROBE_SAMPLES 1024u   /* blocks spread over the device */
#define PROBE_EXTENTS 4096u   /* data extents of a regular file looked at */

/* ------------------------------------------------------------- in use */

/* Is the block device dev mounted (its number, or a mount source naming
 * it)? where: the mount point. */
static bool mounted(dev_t dev, char *where, size_t cap)
{
    FILE *f = fopen("/proc/self/mountinfo", "re");
    if (!f)
        return false;
    char line[8192];
    bool hit = false;
    while (!hit && fgets(line, sizeof(line), f)) {
        unsigned ma = 0, mi = 0;
        char mp[4096], src[4096] = "";
        if (sscanf(line, "%*s %*s %u:%u %*s %4095s", &ma, &mi, mp) != 3)
            continue;
        const char *sep = strstr(line, " - ");
        if (sep)
            sscanf(sep + 3, "%*s %4095s", src);
        struct stat st;
        hit = makedev(ma, mi) == dev ||
              (src[0] == '/' && stat(src, &st) == 0 && S_ISBLK(st.st_mode) && st.st_rdev == dev);
        if (hit)
            snprintf(where, cap, "%s", mp);
    }
    fclose(f);
    return hit;
}

/* Is dev (block device) or dev/ino (regular file) active swap? */
static bool swap_on(const struct stat *want)
{
    FILE *f = fopen("/proc/swaps", "re");
    if (!f)
        return false;
    char line[4096], name[4096];
    bool hit = false;
    while (!hit && fgets(line, sizeof(line), f)) {
        struct stat st;
        if (sscanf(line, "%4095s", name) != 1 || name[0] != '/' || stat(name, &st) < 0)
            continue;
        hit = S_ISBLK(want->st_mode) ? S_ISBLK(st.st_mode) && st.st_rdev == want->st_rdev
                                     : st.st_dev == want->st_dev && st.st_ino == want->st_ino;
    }
    fclose(f);
    return hit;
}

/* The first holder of a block device (a device-mapper or md device built
 * on it), from /sys/dev/block/M:m/holders. */
static bool held(dev_t dev, char *who, size_t cap)
{
    char p[128];
    snprintf(p, sizeof(p), "/sys/dev/block/%u:%u/holders", major(dev), minor(dev));
    DIR *d = opendir(p);
    if (!d)
        return false;
    struct dirent *de;
    bool hit = false;
    while (!hit && (de = readdir(d)))
        if (de->d_name[0] != '.') {
            snprintf(who, cap, "%s", de->d_name);
            hit = true;
        }
    closedir(d);
    return hit;
}

/* A block device in use by the system: mounted, swap or held. name: how
 * to call it in the message. */
static int blk_busy(dev_t dev, const char *name, char *msg, size_t cap)
{
    char w[4096];
    struct stat st = {.st_mode = S_IFBLK, .st_rdev = dev};
    if (mounted(dev, w, sizeof(w))) {
        snprintf(msg, cap, "%s is mounted at %s: unmount it, or choose another device", name, w);
        return -EBUSY;
    }
    if (swap_on(&st)) {
        snprintf(msg, cap, "%s is active swap: swapoff it, or choose another device", name);
        return -EBUSY;
    }
    if (held(dev, w, sizeof(w))) {
        snprintf(msg, cap,
                 "%s is held by /dev/%s (device-mapper, LVM or RAID): remove that first, or "
                 "choose another device",
                 name, w);
        return -EBUSY;
    }
    return 0;
}

/* The partitions of a whole disk, each checked like the disk. */
static int parts_busy(dev_t dev, const char *path, char *msg, size_t cap)
{
    char dir[128];
    snprintf(dir, sizeof(dir), "/sys/dev/block/%u:%u", major(dev), minor(dev));
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int rc = 0;
    struct dirent *de;
    while (!rc && (de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        char p[512], buf[64];
        snprintf(p, sizeof(p), "%s/%s/partition", dir, de->d_name);
        if (access(p, F_OK) < 0)
            continue;
        snprintf(p, sizeof(p), "%s/%s/dev", dir, de->d_name);
        FILE *f = fopen(p, "re");
        unsigned ma, mi;
        bool ok = f && fgets(buf, sizeof(buf), f) && sscanf(buf, "%u:%u", &ma, &mi) == 2;
        if (f)
            fclose(f);
        if (!ok)
            continue;
        char name[400];
        snprintf(name, sizeof(name), "%s's partition %s", path, de->d_name);
        rc = blk_busy(makedev(ma, mi), name, msg, cap);
    }
    closedir(d);
    return rc;
}

/* The loop device a regular file backs, if any. */
static bool loop_backed(const struct stat *want, char *loop, size_t cap)
{
    DIR *d = opendir("/sys/block");
    if (!d)
        return false;
    struct dirent *de;
    bool hit = false;
    while (!hit && (de = readdir(d))) {
        if (strncmp(de->d_name, "loop", 4) != 0)
            continue;
        char p[512], bf[4096];
        snprintf(p, sizeof(p), "/sys/block/%s/loop/backing_file", de->d_name);
        FILE *f = fopen(p, "re");
        if (!f)
            continue;
        bool got = fgets(bf, sizeof(bf), f) != NULL;
        fclose(f);
        if (!got)
            continue;
        bf[strcspn(bf, "\n")] = 0;
        struct stat st;
        if (stat(bf, &st) == 0 && st.st_dev == want->st_dev && st.st_ino == want->st_ino) {
            snprintf(loop, cap, "/dev/%s", de->d_name);
            hit = true;
        }
    }
    closedir(d);
    return hit;
}

int rb_in_use(const char *path, char *msg, size_t cap)
{
    struct stat st;
    if (stat(path, &st) < 0)
        return 0; /* nothing there: nothing in use */
    const char *never = " (kvtier never writes to a device in use, whatever \"format\" says)";
    if (S_ISBLK(st.st_mode)) {
        int rc = blk_busy(st.st_rdev, path, msg, cap);
        if (!rc)
            rc = parts_busy(st.st_rdev, path, msg, cap);
        if (!rc) {
            /* the kernel's answer for every claim: mounts, swap, md, dm,
             * another O_EXCL opener such as a kvtier server */
            int fd = open(path, O_RDONLY | O_EXCL | O_CLOEXEC);
            if (fd >= 0)
                close(fd);
            else if (errno == EBUSY) {
                snprintf(msg, cap,
                         "%s is in use by another process that holds it exclusively (a "
                         "mount, swap, RAID or LVM, or another kvtier server); stop that use, "
                         "or choose another device",
                         path);
                rc = -EBUSY;
            }
        }
        if (rc)
            snprintf(msg + strlen(msg), cap - strlen(msg), "%s", never);
        return rc;
    }
    if (!S_ISREG(st.st_mode))
        return 0;
    char loop[300];
    if (loop_backed(&st, loop, sizeof(loop))) {
        snprintf(msg, cap,
                 "%s backs the loop device %s: detach it (losetup -d %s), or give %s itself as "
                 "device_path%s",
                 path, loop, loop, loop, never);
        return -EBUSY;
    }
    if (swap_on(&st)) {
        snprintf(msg, cap, "%s is active swap: swapoff it, or choose another file%s", path, never);
        return -EBUSY;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        int rc = flock(fd, LOCK_SH | LOCK_NB) < 0 && errno == EWOULDBLOCK ? -EBUSY : 0;
        close(fd);
        if (rc) {
            snprintf(msg, cap, "%s is in use by another process (a kvtier server?)%s", path, never);
            return rc;
        }
    }
    return 0;
}

/* ------------------------------------------------------------ content */

/* The signatures libblkid finds, as "an ext4 file system, a dos partition
 * table"; wipe: erase each (fd open read-write). Returns how many, or
 * -errno. */
static int signatures(int fd, bool wipe, char *what, size_t cap)
{
    blkid_probe pr = blkid_new_probe();
    if (!pr)
        return -ENOMEM;
    if (blkid_probe_set_device(pr, fd, 0, 0) < 0) {
        blkid_free_probe(pr);
        return -EIO;
    }
    blkid_probe_enable_superblocks(pr, 1);
    blkid_probe_set_superblocks_flags(pr, BLKID_SUBLKS_TYPE | BLKID_SUBLKS_USAGE |
                                              BLKID_SUBLKS_MAGIC | BLKID_SUBLKS_BADCSUM);
    blkid_probe_enable_partitions(pr, 1);
    blkid_probe_set_partitions_flags(pr, BLKID_PARTS_MAGIC | BLKID_PARTS_FORCE_GPT);
    int n = 0, rc = 0;
    if (what && cap)
        what[0] = 0;
    /* each call returns the next signature (wipefs' loop); a wipe steps
     * the prober back so that the same place is probed again */
    while (blkid_do_probe(pr) == 0) {
        const char *t = NULL, *u = NULL;
        char one[128];
        if (blkid_probe_lookup_value(pr, "TYPE", &t, NULL) == 0) {
            if (blkid_probe_lookup_value(pr, "USAGE", &u, NULL) < 0)
                u = "";
            snprintf(one, sizeof(one), "%s%s", t,
                     !strcmp(u, "filesystem") ? " file system"
                     : !strcmp(u, "raid")     ? " (RAID or LVM member)"
                     : !strcmp(u, "crypto")   ? " (encrypted volume)"
                     : !strcmp(u, "other")    ? " signature"
                                              : "");
        } else if (blkid_probe_lookup_value(pr, "PTTYPE", &t, NULL) == 0) {
            snprintf(one, sizeof(one), "%s partition table", t);
        } else {
            snprintf(one, sizeof(one), "signature");
        }
        if (what && cap && !strstr(what, one)) {
            size_t l = strlen(what);
            const char *art = strchr("aeiouAEIOU", one[0]) ? "an " : "a ";
            if (l + 8 < cap)
                snprintf(what + l, cap - l, "%s%s%s", l ? ", " : "", art, one);
        }
        n++;
        if (wipe && blkid_do_wipe(pr, 0) < 0) {
            rc = errno ? -errno : -EIO;
            break;
        }
        if (n > 64) /* a wipe that does not take would loop */
            break;
    }
    blkid_free_probe(pr);
    return rc ? rc : n;
}

static bool all_zero(const uint8_t *p, size_t n, size_t *at)
{
    for (size_t i = 0; i < n; i++)
        if (p[i]) {
            *at = i;
            return false;
        }
    return true;
}

/* Read [off, off+len) (clipped to size) and look for a non-zero byte.
 * Returns 1 (found: *bad), 0, or -errno. */
static int nonzero_at(int fd, uint64_t size, uint64_t off, uint64_t len, uint8_t *buf,
                      uint64_t *bad)
{
    if (off >= size)
        return 0;
    len = KVT_MIN(len, size - off);
    uint64_t done = 0;
    while (done < len) {
        ssize_t r = pread(fd, buf, (size_t)(len - done), (off_t)(off + done));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -errno;
        if (r == 0)
            return 0;
        size_t at;
        if (!all_zero(buf, (size_t)r, &at)) {
            *bad = off + done + at;
            return 1;
        }
        done += (uint64_t)r;
    }
    return 0;
}

/* Zeros where we look (see the top comment)? 1 with *bad, 0, -errno. */
static int sample_data(int fd, uint64_t size, bool regular, uint64_t *bad)
{
    uint8_t *buf = kvt_xmalloc(PROBE_EDGE);
    int rc = nonzero_at(fd, size, 0, PROBE_EDGE, buf, bad);
    if (!rc && size > PROBE_EDGE)
        rc = nonzero_at(fd, size, (size - PROBE_EDGE) & ~4095ull, PROBE_EDGE, buf, bad);
    uint64_t step = size / PROBE_SAMPLES & ~4095ull;
    for (uint32_t i = 1; !rc && step && i < PROBE_SAMPLES; i++)
        rc = nonzero_at(fd, size, i * step, 4096, buf, bad);
    /* a sparse file: look where its data is */
    uint64_t off = 0;
    for (uint32_t i = 0; !rc && regular && i < PROBE_EXTENTS && off < size; i++) {
        off_t d = lseek(fd, (off_t)off, SEEK_DATA);
        if (d < 0)
            break;
        rc = nonzero_at(fd, size, (uint64_t)d & ~4095ull, 4096, buf, bad);
        off_t h = lseek(fd, d, SEEK_HOLE);
        if (h <= d)
            break;
        off = (uint64_t)h;
    }
    free(buf);
    return rc;
}

int rb_content(int fd, uint64_t size, bool regular, const char *magic, uint64_t copy1_off,
               char *what, size_t cap)
{
    uint8_t blk[4096];
    const uint64_t offs[2] = {0, copy1_off};
    for (int c = 0; c < 2; c++) {
        if (offs[c] + 16 > size)
            continue;
        ssize_t r = pread(fd, blk, sizeof(blk), (off_t)offs[c]);
        if (r < 0)
            return -errno;
        if (r >= 16 && memcmp(blk, magic, 8) == 0)
            return RB_CONTENT_OURS;
        if (c == 0 && r >= 16 && memcmp(blk + 8, RB_CKPT_FORMAT, 8) == 0) {
            char m[9];
            for (int i = 0; i < 8; i++)
                m[i] = blk[i] >= 0x20 && blk[i] < 0x7f && blk[i] != '"' ? (char)blk[i] : '?';
            m[8] = 0;
            snprintf(what, cap,
                     "a kvtier raw_block index with meta_magic \"%s\" (set \"meta_magic\": "
                     "\"%s\" to use it)",
                     m, m);
            return RB_CONTENT_FOREIGN;
        }
    }
    int n = signatures(fd, false, what, cap);
    if (n < 0)
        return n;
    if (n > 0)
        return RB_CONTENT_FOREIGN;
    uint64_t bad = 0;
    int rc = sample_data(fd, size, regular, &bad);
    if (rc < 0)
        return rc;
    if (rc) {
        snprintf(what, cap, "data (a non-zero byte at offset %llu)", (unsigned long long)bad);
        return RB_CONTENT_FOREIGN;
    }
    return RB_CONTENT_EMPTY;
}

int rb_wipe_signatures(const char *path, char *err, size_t cap)
{
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        int rc = -errno;
        snprintf(err, cap, "cannot open %s to wipe its signatures: %s", path, kvt_strerror(rc));
        return rc;
    }
    char what[256];
    int rc = signatures(fd, true, what, sizeof(what));
    if (rc >= 0 && fsync(fd) < 0)
        rc = -errno;
    close(fd);
    if (rc < 0)
        snprintf(err, cap, "cannot wipe the signatures on %s: %s", path, kvt_strerror(rc));
    return rc < 0 ? rc : 0;
}

/* --------------------------------------------------------------- plan */

/* A geometry for slots of `stride` bytes; 0 or -EINVAL with msg. */
static int geom(struct rb_geom *g, const struct kvt_raw_block_opts *o, uint64_t usable,
                uint64_t stride, char *msg, size_t cap)
{
    return rb_geom_init(g, usable, o->block_align, o->header_bytes, stride, o->meta_total_bytes,
                        msg, cap);
}

int rb_plan(const struct kvt_raw_block_opts *o, int fd, uint64_t dev_size, uint64_t usable,
            bool regular, struct rb_plan *p, char *msg, size_t cap)
{
    memset(p, 0, sizeof(*p));
    p->field = "device_path";
    const char *path = o->device_path;
    char gerr[400] = "";
    /* slots hold header_bytes in addition to slot_bytes of payload */
    int grc = geom(&p->g, o, usable, o->slot_bytes + o->header_bytes, gerr, sizeof(gerr));
    /* the checkpoint copies' places depend on the meta area only */
    struct rb_geom meta;
    if (geom(&meta, o, UINT64_MAX, o->block_align, msg, cap))
        return KVT_E_CONFIG;
    char what[400] = "";
    int content =
        rb_content(fd, dev_size, regular, o->meta_magic, meta.ckpt_bytes, what, sizeof(what));
    if (content < 0) {
        snprintf(msg, cap, "cannot read %s: %s", path, kvt_strerror(content));
        return content;
    }
    if (content == RB_CONTENT_FOREIGN) {
        if (!o->format_force) {
            snprintf(msg, cap,
                     "%s holds %s, which is neither zeros nor a kvtier raw_block device: "
                     "refusing to format it. Give an empty device (wipefs -a, or zeros), or, "
                     "to overwrite what it holds, add \"format\": \"force\" to the adapter's "
                     "JSON",
                     path, what);
            return KVT_E_CONFIG;
        }
        snprintf(p->forced, sizeof(p->forced), "%s", what);
        p->wipe = true;
    }
    if (content == RB_CONTENT_OURS) {
        uint8_t blk[4096];
        int found = 0, proto = 0, bad = 0;
        struct rb_ckpt_hdr h, hf;
        uint32_t bs = KVT_MIN(o->block_align, (uint32_t)sizeof(blk));
        for (int c = 0; c < 2; c++) {
            ssize_t r = pread(fd, blk, bs, (off_t)((uint64_t)c * meta.ckpt_bytes));
            if (r != (ssize_t)bs)
                continue; /* shorter than the meta area: not this copy */
            int d = rb_ckpt_hdr_decode(blk, bs, o->meta_magic, o->meta_version, &h);
            if (d == 0 && !found)
                hf = h;
            found += d == 0;
            proto += d == -EPROTO;
            bad += d == -EBADMSG;
        }
        bool start_empty = !o->load_checkpoint || o->format_force;
        if (found) {
            struct rb_geom old;
            char oerr[400];
            if (!grc && rb_ckpt_geom_matches(&hf, &p->g)) {
                p->fresh = !o->load_checkpoint;
                return 0;
            }
            /* a device formatted when a slot held its header within
             * slot_bytes: the same bytes, read as they were written */
            if (o->slot_bytes > o->header_bytes &&
                !geom(&old, o, usable, o->slot_bytes, oerr, sizeof(oerr)) &&
                rb_ckpt_geom_matches(&hf, &old) && o->load_checkpoint) {
                p->g = old;
                p->compat = true;
                return 0;
            }
            if (!start_empty) {
                snprintf(msg, cap,
                         "%s holds a raw_block index for another layout (slots of %llu bytes "
                         "with header_bytes %u, block_align %u, meta_total_bytes %llu, %u "
                         "slots): refusing to reinterpret it; use the same settings, or set "
                         "\"load_checkpoint_on_init\": false to start empty",
                         path, (unsigned long long)hf.slot_bytes, hf.header_bytes, hf.block,
                         (unsigned long long)hf.meta_total, hf.nslots);
                return KVT_E_CONFIG;
            }
        } else if (proto && !start_empty) {
            snprintf(msg, cap,
                     "%s carries meta_magic \"%s\" in another format or meta_version (not %u): "
                     "refusing to overwrite it; set \"load_checkpoint_on_init\": false to start "
                     "empty",
                     path, o->meta_magic, o->meta_version);
            return KVT_E_CONFIG;
        } else if (bad && !start_empty) {
            snprintf(msg, cap,
                     "both metadata checkpoint headers on %s are damaged; set "
                     "\"load_checkpoint_on_init\": false to start empty",
                     path);
            return KVT_E_CORRUPT;
        }
    }
    if (grc) {
        snprintf(msg, cap, "%s: %s (a slot is slot_bytes %llu + header_bytes %u)", path, gerr,
                 (unsigned long long)o->slot_bytes, o->header_bytes);
        return KVT_E_CONFIG;
    }
    p->fresh = true;
    return 0;
}

/* ---------------------------------------------------------- the check */

int rb_dev_size(int fd, const struct stat *st, const struct kvt_raw_block_opts *o, uint64_t *size,
                char *msg, size_t cap)
{
    if (!S_ISBLK(st->st_mode)) {
        *size = (uint64_t)st->st_size;
        return 0;
    }
    if (ioctl(fd, BLKGETSIZE64, size) < 0) {
        int rc = -errno;
        snprintf(msg, cap, "BLKGETSIZE64 on %s: %s", o->device_path, kvt_strerror(rc));
        return rc;
    }
    int lbs = 0;
    if (o->use_odirect && ioctl(fd, BLKSSZGET, &lbs) == 0 && (uint32_t)lbs > o->block_align) {
        snprintf(msg, cap,
                 "block_align %u is smaller than the logical block size %d of %s: O_DIRECT "
                 "would fail; set block_align to %d",
                 o->block_align, lbs, o->device_path, lbs);
        return -EINVAL;
    }
    return 0;
}

const char *kvt_raw_block_storage(const void *opts, const char **field, bool *is_dir)
{
    const struct kvt_raw_block_opts *o = opts;
    *field = "device_path";
    *is_dir = false;
    return o->device_path;
}

int kvt_raw_block_check(const struct kvt_l2_spec *spec, const void *opts, const char **field,
                        char *msg, size_t cap)
{
    (void)spec;
    const struct kvt_raw_block_opts *o = opts;
    const char *path = o->device_path;
    *field = "device_path";
    struct stat st;
    if (!o->capacity_bytes && stat(path, &st) < 0 && errno == ENOENT) {
        snprintf(msg, cap,
                 "%s does not exist (give a block device or a pre-sized file: fallocate -l "
                 "SIZE %s, or set capacity_bytes to create one)",
                 path, path);
        return KVT_E_CONFIG;
    }
    int rc = kvt_l2_check_device(path, S_IFBLK, "block device", msg, cap);
    if (rc)
        return rc;
    if (stat(path, &st) < 0) {
        if (errno != ENOENT || !o->capacity_bytes)
            return 0; /* kvt_l2_check_device said so already */
        /* open creates it: room for it in its directory? */
        char dir[4096];
        snprintf(dir, sizeof(dir), "%s", path);
        kvt_path_cut_parent(dir, sizeof(dir));
        struct statvfs sv;
        if (statvfs(dir, &sv) == 0 && (uint64_t)sv.f_bavail * sv.f_frsize < o->capacity_bytes) {
            *field = "capacity_bytes";
            snprintf(msg, cap,
                     "%s would be created with capacity_bytes %llu (%.1f MiB) but %s has %.1f "
                     "MiB free: lower capacity_bytes, or free space",
                     path, (unsigned long long)o->capacity_bytes,
                     (double)o->capacity_bytes / (1 << 20), dir,
                     (double)sv.f_bavail * (double)sv.f_frsize / (1 << 20));
            return KVT_E_CONFIG;
        }
        return 0;
    }
    rc = rb_in_use(path, msg, cap);
    if (rc)
        return KVT_E_CONFIG;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        rc = -errno;
        snprintf(msg, cap, "cannot open %s: %s", path, kvt_strerror(rc));
        return KVT_E_CONFIG;
    }
    uint64_t size = 0;
    rc = rb_dev_size(fd, &st, o, &size, msg, cap);
    if (!rc) {
        uint64_t usable = o->capacity_bytes ? KVT_MIN(o->capacity_bytes, size) : size;
        struct rb_plan p;
        rc = rb_plan(o, fd, size, usable, S_ISREG(st.st_mode), &p, msg, cap);
        *field = p.field;
    }
    close(fd);
    return rc ? (rc < 0 ? KVT_E_CONFIG : rc) : 0;
}
