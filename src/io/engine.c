/*
 * I/O engines: the common part and the posix engine (a pool of threads
 * doing preadv/pwritev). The io_uring engine is in engine_uring.c.
 */
#include "io/engine.h"
#include "common/util.h"
#include "kvtier/error.h"
#include "io/engine_int.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

const char *kvt_ioeng_kind_name(enum kvt_ioeng_kind k)
{
    return k == KVT_IOENG_URING ? "io_uring" : "posix";
}

int kvt_ioeng_kind_parse(const char *s)
{
    if (!s)
        return -1;
    if (strcasecmp(s, "posix") == 0 || strcasecmp(s, "pread") == 0 || strcasecmp(s, "threads") == 0)
        return KVT_IOENG_POSIX;
    if (strcasecmp(s, "io_uring") == 0 || strcasecmp(s, "iouring") == 0 ||
        strcasecmp(s, "uring") == 0)
        return KVT_IOENG_URING;
    return -1;
}

/*
 * Fault injection for the failure tests, at the engine so it covers both
 * engines (an LD_PRELOAD library cannot see io_uring):
 *   KVT_IO_FAULT="rate=0.1,seed=1,eio,enospc,short,torn"
 * Each completed read or write fails with probability `rate`, as one of the
 * enabled kinds: eio (the request fails with EIO), enospc (a write fails
 * with ENOSPC), short (a transfer moves fewer bytes and is retried), torn (a
 * write reports success but part of what it wrote is zeroed on the device:
 * only the object checksums can catch it), lost (a write fails with EIO and
 * what it wrote is zeroed again: as if it never reached a zeroed device).
 * Never set in production.
 * Narrower, for deterministic tests: min_off=/max_off= (only requests that
 * start in [min_off, max_off)) and max= (at most that many faults).
 */
static void fault_init(struct kvt_ioeng *e)
{
    const char *v = getenv("KVT_IO_FAULT");
    if (!v || !*v)
        return;
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", v);
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (!strncmp(t, "rate=", 5))
            e->fault_rate = atof(t + 5);
        else if (!strncmp(t, "seed=", 5))
            e->fault_seed = strtoull(t + 5, NULL, 10);
        else if (!strcmp(t, "eio"))
            e->f_eio = true;
        else if (!strcmp(t, "enospc"))
            e->f_enospc = true;
        else if (!strcmp(t, "short"))
            e->f_short = true;
        else if (!strcmp(t, "torn"))
            e->f_torn = true;
        else if (!strcmp(t, "lost"))
            e->f_lost = true;
        else if (!strncmp(t, "min_off=", 8))
            e->fault_min_off = strtoull(t + 8, NULL, 0);
        else if (!strncmp(t, "max_off=", 8))
            e->fault_max_off = strtoull(t + 8, NULL, 0);
        else if (!strncmp(t, "max=", 4))
            e->fault_max = strtoull(t + 4, NULL, 0);
    }
}

/* Inside the configured window? */
static bool fault_in_window(const struct kvt_ioeng *e, const struct kvt_io *io)
{
    uint64_t start = io->off - io->done;
    return start >= e->fault_min_off && (!e->fault_max_off || start < e->fault_max_off);
}

/* Count one injected fault; false (nothing counted) when the max= budget is
 * spent: concurrent completions cannot overshoot it. */
static bool fault_take(struct kvt_ioeng *e)
{
    uint64_t n = atomic_load_explicit(&e->faults, memory_order_relaxed);
    do {
        if (e->fault_max && n >= e->fault_max)
            return false;
    } while (!atomic_compare_exchange_weak_explicit(&e->faults, &n, n + 1, memory_order_relaxed,
                                                    memory_order_relaxed));
    return true;
}

/* Deterministic for a seed: a hash of a per-engine counter. */
static bool fault_pick(struct kvt_ioeng *e, uint64_t *r)
{
    if (e->fault_rate <= 0)
        return false;
    uint64_t x = e->fault_seed * 0x9e3779b97f4a7c15ull +
                 atomic_fetch_add_explicit(&e->fault_counter, 1, memory_order_relaxed);
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    *r = x >> 20;
    return (double)(x % 1000000) < e->fault_rate * 1000000.0;
}

uint64_t kvt_ioeng_fault_short(struct kvt_ioeng *e, struct kvt_io *io, uint64_t r)
{
    uint64_t x;
    if (!e->f_short || r < 2 || io->op == KVT_IO_FSYNC || !fault_in_window(e, io) ||
        !fault_pick(e, &x) || !fault_take(e))
        return r;
    return r / 2;
}

/* Maybe turn a successful completion into an injected failure. */
static int fault_complete(struct kvt_ioeng *e, struct kvt_io *io, int res)
{
    uint64_t x;
    if (res < 0 || io->op == KVT_IO_FSYNC || !(e->f_eio || e->f_enospc || e->f_torn || e->f_lost) ||
        !fault_in_window(e, io) || !fault_pick(e, &x))
        return res;
    int kinds[4], n = 0;
    if (e->f_eio)
        kinds[n++] = 1;
    if (e->f_enospc && io->op == KVT_IO_WRITE)
        kinds[n++] = 2;
    if (e->f_torn && io->op == KVT_IO_WRITE && io->len >= 2)
        kinds[n++] = 3;
    if (e->f_lost && io->op == KVT_IO_WRITE)
        kinds[n++] = 4;
    if (!n || !fault_take(e))
        return res;
    int kind = kinds[x % (uint64_t)n];
    switch (kind) {
    case 1:
        return -EIO;
    case 2:
        return -ENOSPC;
    default: {
        /* torn: zero the second half of what was written, then claim
         * success; lost: zero all of it and fail */
        uint64_t start = io->off - io->done + (kind == 3 ? io->len / 2 : 0);
        uint64_t len = kind == 3 ? io->len - io->len / 2 : io->len;
        static const char zeros[4096];
        while (len) {
            size_t k = (size_t)KVT_MIN(len, sizeof(zeros));
            if (pwrite(io->fd, zeros, k, (off_t)start) <= 0)
                break; /* O_DIRECT or a closed fd: leave it whole */
            start += k;
            len -= k;
        }
        return kind == 3 ? res : -EIO;
    }
    }
}

void kvt_ioeng_base_init(struct kvt_ioeng *e, const struct kvt_ioeng_ops *ops,
                         enum kvt_ioeng_kind kind, const char *name, int depth)
{
    e->ops = ops;
    e->kind = kind;
    e->depth = depth;
    snprintf(e->name, sizeof(e->name), "%s", name);
    fault_init(e);
}

void kvt_io_advance(struct kvt_io *io, uint64_t n)
{
    io->done += n;
    io->off += n;
    int k = 0;
    while (n && k < io->iovcnt) {
        size_t take = KVT_MIN(n, io->iov[k].iov_len);
        io->iov[k].iov_base = (char *)io->iov[k].iov_base + take;
        io->iov[k].iov_len -= take;
        n -= take;
        if (io->iov[k].iov_len == 0)
            k++;
    }
    /* drop the consumed iovecs so the next transfer starts at a live one */
    if (k) {
        memmove(io->iov, io->iov + k, (size_t)(io->iovcnt - k) * sizeof(io->iov[0]));
        io->iovcnt = (uint8_t)(io->iovcnt - k);
    }
}

void kvt_ioeng_complete(struct kvt_ioeng *e, struct kvt_io *io, int res)
{
    res = fault_complete(e, io, res);
    io->res = res;
    if (res < 0)
        atomic_fetch_add_explicit(&e->errors, 1, memory_order_relaxed);
    else if (io->op == KVT_IO_READ)
        atomic_fetch_add_explicit(&e->bytes_read, (uint64_t)res, memory_order_relaxed);
    else if (io->op == KVT_IO_WRITE)
        atomic_fetch_add_explicit(&e->bytes_written, (uint64_t)res, memory_order_relaxed);
    atomic_fetch_add_explicit(&e->completed, 1, memory_order_relaxed);
    atomic_fetch_sub_explicit(&e->inflight, 1, memory_order_relaxed);
    io->cb(io); /* may free io: nothing after this */
}

static void note_submit(struct kvt_ioeng *e, size_t n)
{
    atomic_fetch_add_explicit(&e->submitted, n, memory_order_relaxed);
    uint32_t now =
        atomic_fetch_add_explicit(&e->inflight, (uint32_t)n, memory_order_relaxed) + (uint32_t)n;
    uint32_t mx = atomic_load_explicit(&e->inflight_max, memory_order_relaxed);
    while (now > mx && !atomic_compare_exchange_weak_explicit(
                           &e->inflight_max, &mx, now, memory_order_relaxed, memory_order_relaxed))
        ;
}

void kvt_ioeng_submit(struct kvt_ioeng *e, struct kvt_io *io)
{
    kvt_ioeng_submitv(e, &io, 1);
}

void kvt_ioeng_submitv(struct kvt_ioeng *e, struct kvt_io **ios, size_t n)
{
    if (n == 0)
        return;
    for (size_t i = 0; i < n; i++) {
        ios[i]->done = 0;
        ios[i]->eng = e;
    }
    note_submit(e, n);
    e->ops->submitv(e, ios, n);
}

/* ------------------------------------------------------- synchronous */

struct waiter {
    pthread_mutex_t m;
    pthread_cond_t c;
    bool done;
    void (*orig_cb)(struct kvt_io *);
    void *orig_udata;
};

static void waiter_cb(struct kvt_io *io)
{
    struct waiter *w = io->udata;
    pthread_mutex_lock(&w->m);
    w->done = true;
    pthread_cond_signal(&w->c);
    pthread_mutex_unlock(&w->m);
}

int kvt_ioeng_run(struct kvt_ioeng *e, struct kvt_io *io)
{
    struct waiter w = {.done = false, .orig_cb = io->cb, .orig_udata = io->udata};
    pthread_mutex_init(&w.m, NULL);
    pthread_cond_init(&w.c, NULL);
    io->cb = waiter_cb;
    io->udata = &w;
    kvt_ioeng_submit(e, io);
    pthread_mutex_lock(&w.m);
    while (!w.done)
        pthread_cond_wait(&w.c, &w.m);
    pthread_mutex_unlock(&w.m);
    pthread_mutex_destroy(&w.m);
    pthread_cond_destroy(&w.c);
    io->cb = w.orig_cb;
    io->udata = w.orig_udata;
    return io->res;
}

bool kvt_ioeng_cb_may_block(const struct kvt_ioeng *e)
{
    return e->kind == KVT_IOENG_POSIX;
}

enum kvt_ioeng_kind kvt_ioeng_kind_of(const struct kvt_ioeng *e)
{
    return e->kind;
}

int kvt_ioeng_depth(const struct kvt_ioeng *e)
{
    return e->depth;
}

void kvt_ioeng_get_stats(struct kvt_ioeng *e, struct kvt_ioeng_stats *s)
{
    s->submitted = atomic_load(&e->submitted);
    s->completed = atomic_load(&e->completed);
    s->errors = atomic_load(&e->errors);
    s->retries = atomic_load(&e->retries);
    s->bytes_read = atomic_load(&e->bytes_read);
    s->bytes_written = atomic_load(&e->bytes_written);
    s->inflight = atomic_load(&e->inflight);
    s->inflight_max = atomic_load(&e->inflight_max);
}

json_t *kvt_ioeng_status(struct kvt_ioeng *e)
{
    struct kvt_ioeng_stats s;
    kvt_ioeng_get_stats(e, &s);
    json_t *o = json_object();
    json_object_set_new(o, "engine", json_string(kvt_ioeng_kind_name(e->kind)));
    json_object_set_new(o, "queue_depth", json_integer(e->depth));
    json_object_set_new(o, "inflight", json_integer(s.inflight));
    json_object_set_new(o, "inflight_max", json_integer(s.inflight_max));
    json_object_set_new(o, "submitted", json_integer((json_int_t)s.submitted));
    json_object_set_new(o, "completed", json_integer((json_int_t)s.completed));
    json_object_set_new(o, "errors", json_integer((json_int_t)s.errors));
    json_object_set_new(o, "short_retries", json_integer((json_int_t)s.retries));
    if (e->fault_rate > 0)
        json_object_set_new(o, "injected_faults",
                            json_integer((json_int_t)atomic_load(&e->faults)));
    return o;
}

void kvt_ioeng_destroy(struct kvt_ioeng *e)
{
    if (e)
        e->ops->destroy(e);
}

/* ------------------------------------------------------ posix engine */

struct posix_eng {
    struct kvt_ioeng base;
    struct kvt_tpool *pool;
};

/* One whole request on an I/O thread: loop until every byte moved, EOF, or
 * an error. EINTR is retried; a zero-byte write is -EIO. */
static void posix_job(struct kvt_job *job, void *ctx)
{
    (void)ctx;
    struct kvt_io *io = (struct kvt_io *)((char *)job - offsetof(struct kvt_io, job));
    struct kvt_ioeng *e = io->eng;
    int res = 0;
    if (io->op == KVT_IO_FSYNC) {
        res = fdatasync(io->fd) < 0 ? -errno : 0;
        kvt_ioeng_complete(e, io, res);
        return;
    }
    uint64_t total = io->len;
    while (io->done < total) {
        ssize_t r = io->op == KVT_IO_READ ? preadv(io->fd, io->iov, io->iovcnt, (off_t)io->off)
                                          : pwritev(io->fd, io->iov, io->iovcnt, (off_t)io->off);
        if (r < 0) {
            if (errno == EINTR || errno == EAGAIN) {
                atomic_fetch_add_explicit(&e->retries, 1, memory_order_relaxed);
                continue;
            }
            res = -errno;
            break;
        }
        if (r == 0) {
            if (io->op == KVT_IO_WRITE)
                res = -EIO;
            break; /* READ: EOF */
        }
        r = (ssize_t)kvt_ioeng_fault_short(e, io, (uint64_t)r);
        if ((uint64_t)r < total - io->done)
            atomic_fetch_add_explicit(&e->retries, 1, memory_order_relaxed);
        kvt_io_advance(io, (uint64_t)r);
    }
    kvt_ioeng_complete(e, io, res < 0 ? res : (int)KVT_MIN(io->done, (uint64_t)INT32_MAX));
}

static void posix_submitv(struct kvt_ioeng *e, struct kvt_io **ios, size_t n)
{
    struct posix_eng *pe = (struct posix_eng *)e;
    for (size_t i = 0; i < n; i++) {
        ios[i]->job.fn = posix_job;
        kvt_tpool_push(pe->pool, &ios[i]->job);
    }
}

static void posix_destroy(struct kvt_ioeng *e)
{
    struct posix_eng *pe = (struct posix_eng *)e;
    kvt_tpool_destroy(pe->pool);
    free(pe);
}

static const struct kvt_ioeng_ops posix_ops = {
    .submitv = posix_submitv,
    .destroy = posix_destroy,
};

int kvt_ioeng_create(struct kvt_ioeng **out, enum kvt_ioeng_kind kind, const char *name, int depth,
                     char *err, size_t errcap)
{
    if (depth < 1 || depth > 4096) {
        snprintf(err, errcap, "queue depth %d out of range 1..4096", depth);
        return -EINVAL;
    }
    if (kind == KVT_IOENG_URING)
        return kvt_ioeng_uring_create(out, name, depth, err, errcap);
    struct posix_eng *pe = kvt_xcalloc(1, sizeof(*pe));
    kvt_ioeng_base_init(&pe->base, &posix_ops, KVT_IOENG_POSIX, name, depth);
    int rc = kvt_tpool_create(&pe->pool, name, depth, NULL, NULL, NULL);
    if (rc) {
        snprintf(err, errcap, "cannot start %d I/O threads: %s", depth, kvt_strerror(rc));
        free(pe);
        return rc;
    }
    *out = &pe->base;
    return 0;
}
