/* Small helpers shared by every module: time, allocation, bitmaps, hex. */
#ifndef KVT_UTIL_H
#define KVT_UTIL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#define KVT_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define KVT_MIN(a, b) ((a) < (b) ? (a) : (b))
#define KVT_MAX(a, b) ((a) > (b) ? (a) : (b))
#define KVT_ALIGN_UP(x, a) (((x) + ((a)-1)) / (a) * (a))
#define KVT_GIB (1024.0 * 1024.0 * 1024.0)
#define KVT_MIB (1024.0 * 1024.0)

static inline uint64_t kvt_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline double kvt_now_s(void)
{
    return (double)kvt_now_ns() / 1e9;
}

/* Allocation for small metadata: aborts on OOM (like Valkey's zmalloc).
 * Bulk buffers use checked allocation and return -ENOMEM instead. */
void *kvt_xmalloc(size_t n);
void *kvt_xcalloc(size_t n, size_t sz);
void *kvt_xrealloc(void *p, size_t n);
char *kvt_xstrdup(const char *s);
/* posix_memalign(align, len) zero-filled (len 0: one align block), for
 * small I/O buffers (headers, journal blocks); aborts on OOM like
 * kvt_xmalloc. align: a power of two, a multiple of sizeof(void *). */
void *kvt_xmemalign(size_t align, size_t len);

/* Bitmaps of n bits, stored in uint64_t words. */
static inline size_t kvt_bm_words(size_t n)
{
    return (n + 63) / 64;
}
static inline bool kvt_bm_test(const uint64_t *bm, size_t i)
{
    return (bm[i / 64] >> (i % 64)) & 1u;
}
static inline void kvt_bm_set(uint64_t *bm, size_t i)
{
    bm[i / 64] |= 1ull << (i % 64);
}
/* Set a bit from several threads at once. Relaxed: the task completion that
 * publishes the bitmap (kvt_l2_task_finish) is a release, readers acquire. */
static inline void kvt_bm_set_atomic(uint64_t *bm, size_t i)
{
    atomic_fetch_or_explicit((_Atomic uint64_t *)&bm[i / 64], 1ull << (i % 64),
                             memory_order_relaxed);
}
size_t kvt_bm_count(const uint64_t *bm, size_t n);
/* Number of leading set bits. */
size_t kvt_bm_prefix(const uint64_t *bm, size_t n);

/* Lower-case hex of n bytes into out (2n+1 bytes incl. NUL). */
void kvt_hex(const uint8_t *in, size_t n, char *out);
/* Parse exactly 2n hex chars; returns 0 or -EINVAL. */
int kvt_unhex(const char *in, size_t hexlen, uint8_t *out);
/* The value of one hex digit (either case), or -1. */
int kvt_hexval(int c);

/* Cut path (a buffer of cap bytes) to its parent directory: the part
 * before the last '/', "/" for a name in the root, "." for a name without
 * one. A trailing '/' counts as the last one ("a/b/" -> "a/b"). */
void kvt_path_cut_parent(char *path, size_t cap);

/* Parse a size like "4096", "4k", "1.5GiB", "10GB" into bytes; -EINVAL if bad. */
int kvt_parse_size(const char *s, uint64_t *out);

/* State (field 3) and start time (field 22, clock ticks since boot) of a
 * process from /proc/<pid>/stat: 0, -ENOENT (no such process, or it exited
 * while being read), -EACCES, or -EIO for an unparsable line. */
int kvt_proc_stat(pid_t pid, char *state, uint64_t *start);
/* Start time of a pid (kvt_proc_stat); 0 if gone or unreadable. */
uint64_t kvt_proc_starttime(int pid);

/* Write all bytes / read all bytes at an offset, retrying short transfers and
 * EINTR. Return 0, -errno, or -EIO for an unexpected EOF (read). */
int kvt_pwrite_all(int fd, const void *buf, size_t len, uint64_t off);
int kvt_pread_all(int fd, void *buf, size_t len, uint64_t off, size_t *got);

#endif
