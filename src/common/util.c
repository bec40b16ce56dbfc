#include "common/util.h"
#include "common/log.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

void *kvt_xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        kvt_error("out of memory allocating %zu bytes", n);
        abort();
    }
    return p;
}

void *kvt_xcalloc(size_t n, size_t sz)
{
    void *p = calloc(n ? n : 1, sz ? sz : 1);
    if (!p) {
        kvt_error("out of memory allocating %zu x %zu bytes", n, sz);
        abort();
    }
    return p;
}

void *kvt_xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q) {
        kvt_error("out of memory reallocating %zu bytes", n);
        abort();
    }
    return q;
}

void *kvt_xmemalign(size_t align, size_t len)
{
    size_t n = len ? len : align;
    void *p = NULL;
    if (posix_memalign(&p, align, n)) {
        kvt_error("out of memory allocating %zu bytes aligned to %zu", n, align);
        abort();
    }
    memset(p, 0, n);
    return p;
}

char *kvt_xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = kvt_xmalloc(n);
    memcpy(d, s, n);
    return d;
}

size_t kvt_bm_count(const uint64_t *bm, size_t n)
{
    size_t c = 0;
    for (size_t w = 0; w < n / 64; w++)
        c += (size_t)__builtin_popcountll(bm[w]);
    for (size_t i = n / 64 * 64; i < n; i++)
        c += kvt_bm_test(bm, i);
    return c;
}

size_t kvt_bm_prefix(const uint64_t *bm, size_t n)
{
    size_t i = 0;
    while (i + 64 <= n && bm[i / 64] == ~0ull)
        i += 64;
    while (i < n && kvt_bm_test(bm, i))
        i++;
    return i;
}

void kvt_hex(const uint8_t *in, size_t n, char *out)
{
    static const char d[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = d[in[i] >> 4];
        out[2 * i + 1] = d[in[i] & 15];
    }
    out[2 * n] = 0;
}

int kvt_hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

int kvt_unhex(const char *in, size_t hexlen, uint8_t *out)
{
    if (hexlen % 2)
        return -EINVAL;
    for (size_t i = 0; i < hexlen / 2; i++) {
        int hi = kvt_hexval(in[2 * i]), lo = kvt_hexval(in[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return -EINVAL;
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return 0;
}

void kvt_path_cut_parent(char *path, size_t cap)
{
    char *sl = strrchr(path, '/');
    if (!sl)
        snprintf(path, cap, ".");
    else if (sl == path)
        path[1] = 0;
    else
        *sl = 0;
}

int kvt_parse_size(const char *s, uint64_t *out)
{
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || !isfinite(v) || v < 0)
        return -EINVAL;
    while (*end == ' ')
        end++;
    double mul = 1;
    if (*end) {
        static const struct {
            const char *sfx;
            double mul;
        } sfx[] = {{"b", 1},
                   {"k", 1024},
                   {"kb", 1e3},
                   {"kib", 1024},
                   {"m", 1048576.0},
                   {"mb", 1e6},
                   {"mib", 1048576.0},
                   {"g", KVT_GIB},
                   {"gb", 1e9},
                   {"gib", KVT_GIB},
                   {"t", KVT_GIB * 1024},
                   {"tb", 1e12},
                   {"tib", KVT_GIB * 1024}};
        size_t i;
        for (i = 0; i < KVT_ARRAY_LEN(sfx); i++)
            if (strcasecmp(end, sfx[i].sfx) == 0)
                break;
        if (i == KVT_ARRAY_LEN(sfx))
            return -EINVAL;
        mul = sfx[i].mul;
    }
    double r = v * mul;
    if (r > 1.8e19)
        return -EINVAL;
    *out = (uint64_t)r;
    return 0;
}

int kvt_proc_stat(pid_t pid, char *state, uint64_t *start)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT || errno == ESRCH ? -ENOENT : -errno;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    int e = errno;
    close(fd);
    if (n < 0)
        return e == ESRCH ? -ENOENT : -e; /* the process exited between open and read */
    if (n == 0)
        return -ENOENT;
    buf[n] = 0;
    /* "pid (comm) S ppid ...": comm may hold spaces and ')', so parse from
     * the last ')'; state is the first field after it, starttime the 20th */
    char *p = strrchr(buf, ')');
    if (!p || p[1] != ' ' || !p[2])
        return -EIO;
    *state = p[2];
    p += 2;
    for (int field = 0; field < 19; field++) {
        p = strchr(p, ' ');
        if (!p)
            return -EIO;
        p++;
    }
    char *end;
    unsigned long long v = strtoull(p, &end, 10);
    if (end == p)
        return -EIO;
    *start = v;
    return 0;
}

uint64_t kvt_proc_starttime(int pid)
{
    char st;
    uint64_t start;
    return kvt_proc_stat((pid_t)pid, &st, &start) == 0 ? start : 0;
}

int kvt_pwrite_all(int fd, const void *buf, size_t len, uint64_t off)
{
    const char *p = buf;
    while (len) {
        ssize_t w = pwrite(fd, p, len, (off_t)off);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (w == 0)
            return -EIO;
        p += w;
        len -= (size_t)w;
        off += (uint64_t)w;
    }
    return 0;
}

int kvt_pread_all(int fd, void *buf, size_t len, uint64_t off, size_t *got)
{
    char *p = buf;
    size_t done = 0;
    while (done < len) {
        ssize_t r = pread(fd, p + done, len - done, (off_t)(off + done));
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (r == 0)
            break;
        done += (size_t)r;
    }
    if (got)
        *got = done;
    return done == len ? 0 : -EIO;
}
