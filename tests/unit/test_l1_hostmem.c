/*
 * Description: what the host can give an L1 pool (l1/hostmem.h): the
 * kernel's figures read from a fake root (meminfo, cgroup v2, cgroup v1
 * beside an empty v2 hierarchy, a mount of a cgroup subtree), and the
 * verdicts on pools against given figures: fits, a lazy pool above what
 * could ever be backed (warning), a preallocated one above what is free,
 * a mapping beyond RLIMIT_AS, huge pages, a named pool bound by /dev/shm.
 */
#include "l1/hostmem.h"
#include "test.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define GIB (1024ull * 1024 * 1024)

static char root[PATH_MAX];

static void put(const char *rel, const char *text)
{
    char p[PATH_MAX * 2];
    snprintf(p, sizeof(p), "%s%s", root, rel);
    /* mkdir -p of the parent */
    for (char *s = p + strlen(root) + 1; (s = strchr(s, '/')); s++) {
        *s = 0;
        mkdir(p, 0755);
        *s = '/';
    }
    FILE *f = fopen(p, "w");
    TEST_ASSERT(f);
    fputs(text, f);
    fclose(f);
}

static void remove_root(void)
{
    char cmd[PATH_MAX + 16];
    if (!root[0])
        return;
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
    (void)!system(cmd);
    root[0] = 0;
}

static void fresh_root(void)
{
    remove_root();
    snprintf(root, sizeof(root), "/tmp/kvt-hostmem-XXXXXX");
    TEST_ASSERT(mkdtemp(root));
    put("/proc/meminfo", "MemTotal:       16384000 kB\nMemFree:         1000 kB\n"
                         "MemAvailable:    8192000 kB\nHugePages_Free:       3\n"
                         "Hugepagesize:       2048 kB\n");
    put("/proc/self/status", "Name:\tkvtier\nVmSize:\t  102400 kB\n");
    put("/dev/shm/.keep", "");
}

static void test_cgroup_v2_tightest_ancestor(void)
{
    fresh_root();
    put("/proc/self/cgroup", "0::/a/b\n");
    put("/proc/self/mountinfo",
        "22 1 0:21 / / rw - ext4 /dev/sda1 rw\n"
        "30 22 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate\n");
    put("/sys/fs/cgroup/a/b/memory.max", "max\n");
    put("/sys/fs/cgroup/a/b/memory.current", "104857600\n");
    put("/sys/fs/cgroup/a/memory.max", "1073741824\n");
    put("/sys/fs/cgroup/a/memory.current", "536870912\n");
    struct kvt_hostmem h;
    kvt_hostmem_read(root, &h);
    TEST_ASSERT(h.mem_total == 16384000ull * 1024);
    TEST_ASSERT(h.mem_available == 8192000ull * 1024);
    TEST_ASSERT(h.hp_size == 2 * 1024 * 1024 && h.hp_free == 3 * h.hp_size);
    TEST_ASSERT(h.as_used == 102400ull * 1024);
    TEST_ASSERT(h.cg_limit == GIB);
    TEST_ASSERT(h.cg_avail == GIB / 2);
    TEST_ASSERT(!strcmp(h.cg_file, "/sys/fs/cgroup/a/memory.max"));
}

static void test_cgroup_v1_memory_beside_empty_v2(void)
{
    fresh_root();
    put("/proc/self/cgroup", "9:name=systemd:/\n4:memory:/x/y\n0::/\n");
    put("/proc/self/mountinfo",
        "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
        "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n");
    put("/sys/fs/cgroup/unified/cgroup.procs", "");
    put("/sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
    put("/sys/fs/cgroup/memory/x/memory.limit_in_bytes", "9223372036854771712\n");
    put("/sys/fs/cgroup/memory/x/y/memory.limit_in_bytes", "2147483648\n");
    put("/sys/fs/cgroup/memory/x/y/memory.usage_in_bytes", "1073741824\n");
    struct kvt_hostmem h;
    kvt_hostmem_read(root, &h);
    TEST_ASSERT(h.cg_limit == 2 * GIB && h.cg_avail == GIB);
    TEST_ASSERT(!strcmp(h.cg_file, "/sys/fs/cgroup/memory/x/y/memory.limit_in_bytes"));
}

static void test_cgroup_subtree_mount_and_no_limit(void)
{
    /* a container's view: the mount shows the subtree /docker/abc, which
     * /proc/self/cgroup names in full */
    fresh_root();
    put("/proc/self/cgroup", "0::/docker/abc\n");
    put("/proc/self/mountinfo",
        "30 22 0:26 /docker/abc /sys/fs/cgroup ro,nosuid - cgroup2 cgroup2 rw\n");
    put("/sys/fs/cgroup/memory.max", "4294967296\n");
    put("/sys/fs/cgroup/memory.current", "0\n");
    struct kvt_hostmem h;
    kvt_hostmem_read(root, &h);
    TEST_ASSERT(h.cg_limit == 4 * GIB && h.cg_avail == 4 * GIB);
    /* "max" all the way: no limit */
    put("/sys/fs/cgroup/memory.max", "max\n");
    kvt_hostmem_read(root, &h);
    TEST_ASSERT(h.cg_limit == KVT_HOSTMEM_NONE && h.cg_file[0] == 0);
    /* nothing readable: unknown figures, no limits */
    kvt_hostmem_read("/nonexistent-kvt-root", &h);
    TEST_ASSERT(h.mem_total == 0 && h.cg_limit == KVT_HOSTMEM_NONE);
}

static struct kvt_hostmem host(void)
{
    struct kvt_hostmem h = {
        .mem_total = 32 * GIB,
        .mem_available = 20 * GIB,
        .shm_size = 16 * GIB,
        .shm_free = 10 * GIB,
        .cg_limit = KVT_HOSTMEM_NONE,
        .cg_avail = KVT_HOSTMEM_NONE,
        .as_limit = KVT_HOSTMEM_NONE,
        .hp_size = 2 * 1024 * 1024,
        .hp_free = 0,
    };
    return h;
}

static void test_verdicts(void)
{
    struct kvt_hostmem h = host();
    struct kvt_l1_fit f;
    kvt_l1_fit(&h, GIB, true, false, false, &f);
    TEST_ASSERT(f.verdict == KVT_L1_FITS && f.now == 20 * GIB && f.ever == 32 * GIB);
    kvt_l1_fit(&h, 20 * GIB, false, false, false, &f);
    TEST_ASSERT(f.verdict == KVT_L1_FITS);
    /* preallocated above MemAvailable: refused, naming the numbers */
    kvt_l1_fit(&h, 21 * GIB, false, false, false, &f);
    TEST_ASSERT(f.verdict == KVT_L1_FIT_REFUSE);
    TEST_ASSERT(strstr(f.msg, "21.0 GiB preallocated (--no-l1-use-lazy)"));
    TEST_ASSERT(strstr(f.msg, "MemAvailable 20.0 GiB of MemTotal 32.0 GiB"));
    TEST_ASSERT(strstr(f.msg, "give --l1-size-gb 20.0 or less"));
    /* lazy: above MemTotal warns, between MemAvailable and MemTotal is fine */
    kvt_l1_fit(&h, 30 * GIB, true, false, false, &f);
    TEST_ASSERT(f.verdict == KVT_L1_FITS);
    kvt_l1_fit(&h, 1000 * GIB, true, false, false, &f);
    TEST_ASSERT(f.verdict == KVT_L1_FIT_WARN && strstr(f.msg, "1000.0 GiB (lazy)"));
    TEST_ASSERT(strstr(f.msg, "could ever back: 32.0 GiB") && strstr(f.msg, "the host"));
    /* the cgroup's limit binds both */
    h.cg_limit = 8 * GIB;
    h.cg_avail = 6 * GIB;
    snprintf(h.cg_file, sizeof(h.cg_file), "/sys/fs/cgroup/k/memory.max");
    kvt_l1_fit(&h, 7 * GIB, false, false, false, &f);
    TEST_ASSERT(f.verdict == KVT_L1_FIT_REFUSE && f.now == 6 * GIB);
    TEST_ASSERT(strstr(f.msg, "cgroup limit 8.00 GiB (/sys/fs/cgroup/k/memory.max)"));
    kvt_l1_fit(&h, 9 * GIB, true, false, false, &f);
    TEST_ASSERT(f.verdict == KVT_L1_FIT_WARN && strstr(f.msg, "the cgroup out of memory"));
    h = host();
    /* a named pool (/dev/shm) is bound by that file system too */
    kvt_l1_fit(&h, 12 * GIB, false, false, true, &f);
    TEST_ASSERT(f.verdict == KVT_L1_FIT_REFUSE && strstr(f.msg, "/dev/shm 10.0 GiB free"));
    kvt_l1_fit(&h, 12 * GIB, false, false, false, &f);
    TEST_ASSERT(f.verdict == KVT_L1_FITS);
    kvt_l1_fit(&h, 17 * GIB, true, false, true, &f);
    TEST_ASSERT(f.verdict == KVT_L1_FIT_WARN);
    /* huge pages: allocated at start, from the free huge pages only */
    kvt_l1_fit(&h, GIB, true, true, false, &f);
    TEST_ASSERT(f.verdict == KVT_L1_FIT_REFUSE && strstr(f.msg, "vm.nr_hugepages"));
    TEST_ASSERT(!strstr(f.msg, "or less")); /* none free: nothing smaller helps */
    h.hp_free = 4 * GIB;
    kvt_l1_fit(&h, GIB, true, true, false, &f);
    TEST_ASSERT(f.verdict == KVT_L1_FITS);
    /* the mapping needs the address space, lazy or not */
    h = host();
    h.as_limit = 4 * GIB;
    h.as_used = GIB;
    kvt_l1_fit(&h, 3 * GIB, true, false, false, &f);
    TEST_ASSERT(f.verdict == KVT_L1_FITS);
    kvt_l1_fit(&h, 3 * GIB + 4096, true, false, false, &f);
    TEST_ASSERT(f.verdict == KVT_L1_FIT_REFUSE && strstr(f.msg, "RLIMIT_AS 4.00 GiB"));
    TEST_ASSERT(strstr(f.msg, "ulimit -v"));
    /* unknown figures judge nothing */
    struct kvt_hostmem none = {
        .cg_limit = KVT_HOSTMEM_NONE, .cg_avail = KVT_HOSTMEM_NONE, .as_limit = KVT_HOSTMEM_NONE};
    kvt_l1_fit(&none, 1000 * GIB, false, false, false, &f);
    TEST_ASSERT(f.verdict == KVT_L1_FITS && f.now == KVT_HOSTMEM_NONE);
    json_t *j = kvt_l1_fit_json(&f);
    TEST_ASSERT(json_is_null(json_object_get(j, "available_bytes")));
    json_decref(j);
}

int main(void)
{
    RUN(test_cgroup_v2_tightest_ancestor);
    RUN(test_cgroup_v1_memory_beside_empty_v2);
    RUN(test_cgroup_subtree_mount_and_no_limit);
    RUN(test_verdicts);
    remove_root();
    return TEST_RESULT();
}
