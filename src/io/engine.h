/*
 * I/O engines: asynchronous positional reads and writes with completion
 * callbacks, behind one small API, so that an adapter chooses between
 *
 *   posix     a pool of `depth` threads doing preadv/pwritev. The queue depth
 *             is the number of threads. Callbacks run on the I/O thread and
 *             may block (close, rename, checksum).
 *   io_uring  one ring of `depth` entries owned by one thread (liburing).
 *             Callbacks run on the ring thread and must be short: an adapter
 *             hands heavy work (checksums, metadata syscalls) to its own
 *             pool; kvt_ioeng_cb_may_block() tells which case applies.
 *
 * A request (struct kvt_io) is owned by the caller: it lives, unmoved, from
 * submit until its callback ran. The engine transfers all io->len bytes,
 * retrying short transfers and EINTR/EAGAIN, and then calls io->cb exactly
 * once with io->res set:
 *   >= 0  bytes transferred: io->len, or fewer for a READ that hit EOF;
 *   < 0   -errno of the first failure (a WRITE that made no progress: -EIO).
 * The callback may free or resubmit io.
 *
 * O_DIRECT rules (alignment of buffers, offsets and lengths) are the
 * caller's: the engine passes the iovecs through unchanged.
 *
 * Thread rules: kvt_ioeng_submit may be called from any thread, including
 * from a callback. kvt_ioeng_run must not be called from a callback of the
 * same engine. kvt_ioeng_destroy completes everything submitted before it.
 */
#ifndef KVT_IO_ENGINE_H
#define KVT_IO_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include <jansson.h>

#include "io/tpool.h"

enum kvt_io_op { KVT_IO_READ = 0, KVT_IO_WRITE = 1, KVT_IO_FSYNC = 2 };
enum kvt_ioeng_kind { KVT_IOENG_POSIX = 0, KVT_IOENG_URING = 1 };

#define KVT_IO_MAXIOV 4

struct kvt_io {
    struct kvt_job job;    /* engine-private: posix queue link */
    struct kvt_io *next;   /* engine-private: io_uring queue link */
    struct kvt_ioeng *eng; /* engine-private: set at submit */
    int fd;
    uint8_t op;     /* enum kvt_io_op */
    uint8_t iovcnt; /* 1..KVT_IO_MAXIOV (0 for FSYNC) */
    uint64_t off;
    struct iovec iov[KVT_IO_MAXIOV];
    uint64_t len;  /* total bytes asked (sum of iov lengths) */
    uint64_t done; /* engine-owned progress */
    int res;       /* result, see above */
    void (*cb)(struct kvt_io *io);
    void *udata;
};

/* Start describing a request; add buffers with kvt_io_add. */
static inline void kvt_io_prep(struct kvt_io *io, enum kvt_io_op op, int fd, uint64_t off,
                               void (*cb)(struct kvt_io *), void *udata)
{
    io->next = NULL;
    io->fd = fd;
    io->op = (uint8_t)op;
    io->iovcnt = 0;
    io->off = off;
    io->len = 0;
    io->done = 0;
    io->res = 0;
    io->cb = cb;
    io->udata = udata;
}

/* Append a buffer; zero-length buffers are skipped. Returns -E2BIG when the
 * request already has KVT_IO_MAXIOV buffers. */
static inline int kvt_io_add(struct kvt_io *io, void *p, size_t n)
{
    if (n == 0)
        return 0;
    if (io->iovcnt == KVT_IO_MAXIOV)
        return -7; /* -E2BIG without pulling errno.h into every user */
    io->iov[io->iovcnt].iov_base = p;
    io->iov[io->iovcnt].iov_len = n;
    io->iovcnt++;
    io->len += n;
    return 0;
}

struct kvt_ioeng;

struct kvt_ioeng_stats {
    uint64_t submitted, completed, errors, retries;
    uint64_t bytes_read, bytes_written;
    /* submitted and not completed yet: queued in the engine or in the
     * kernel / on a thread (at most depth of them); and its high mark */
    uint32_t inflight, inflight_max;
};

/* Create an engine of `depth` (1..4096) concurrent requests. On failure
 * returns -errno and writes a message to err (io_uring unavailable, ...). */
int kvt_ioeng_create(struct kvt_ioeng **out, enum kvt_ioeng_kind kind, const char *name, int depth,
                     char *err, size_t errcap);
void kvt_ioeng_submit(struct kvt_ioeng *e, struct kvt_io *io);
/* Submit n requests at once (one wake-up of the engine). */
void kvt_ioeng_submitv(struct kvt_ioeng *e, struct kvt_io **ios, size_t n);
/* Submit and wait; returns io->res. Not from a callback of this engine. */
int kvt_ioeng_run(struct kvt_ioeng *e, struct kvt_io *io);
/* Whether callbacks run on a thread that may block (posix). */
bool kvt_ioeng_cb_may_block(const struct kvt_ioeng *e);
enum kvt_ioeng_kind kvt_ioeng_kind_of(const struct kvt_ioeng *e);
int kvt_ioeng_depth(const struct kvt_ioeng *e);
void kvt_ioeng_get_stats(struct kvt_ioeng *e, struct kvt_ioeng_stats *s);
/* {"engine": "io_uring", "depth": 64, "inflight": .., counters ..} */
json_t *kvt_ioeng_status(struct kvt_ioeng *e);
/* Complete everything submitted, stop the threads, free. NULL is a no-op. */
void kvt_ioeng_destroy(struct kvt_ioeng *e);

const char *kvt_ioeng_kind_name(enum kvt_ioeng_kind k);
/* "posix" | "io_uring" (also "uring", "iouring"); -1 when unknown. */
int kvt_ioeng_kind_parse(const char *s);

#endif
