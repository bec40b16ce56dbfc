/*
 * io_uring engine (liburing): one ring of `depth` entries, owned by one
 * thread ("<name>-ring").
 *
 * Submitters append requests to a mutex-guarded list and ring a doorbell
 * (an eventfd). The ring thread keeps one READ of the doorbell armed inside
 * the ring, so a single io_uring_submit_and_wait() sleeps until either an
 * I/O completes or new work arrives: no polling, no timers.
 *
 * The ring thread moves queued requests into SQEs while fewer than `depth`
 * are in flight, reaps completions, retries short transfers and -EAGAIN /
 * -EINTR in place (same request, advanced iovecs), and runs callbacks.
 *
 * Locks: u->lock guards head/tail/stop only; it is never held across
 * io_uring calls or callbacks. Everything else is owned by the ring thread.
 */
#include "common/log.h"
#include "common/util.h"
#include "kvtier/error.h"
#include "io/engine_int.h"

#include <errno.h>
#include <liburing.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define BELL_TAG ((uint64_t)1) /* user_data of the doorbell read; requests are pointers */

struct uring_eng {
    struct kvt_ioeng base;
    struct io_uring ring;
    pthread_t thr;
    int bell;          /* eventfd */
    uint64_t bell_val; /* doorbell read target (ring thread) */

    pthread_mutex_t lock;
    struct kvt_io *head, *tail; /* submitted, not yet taken: guarded by lock */
    bool stop;                  /* guarded by lock */

    /* ring thread only */
    struct kvt_io *lhead, *ltail; /* taken or to be retried, in order */
    unsigned inflight;
    bool bell_armed;
};

static void local_push_front(struct uring_eng *u, struct kvt_io *io)
{
    io->next = u->lhead;
    u->lhead = io;
    if (!u->ltail)
        u->ltail = io;
}

static void prep_sqe(struct io_uring_sqe *sqe, struct kvt_io *io)
{
    switch (io->op) {
    case KVT_IO_READ:
        if (io->iovcnt == 1)
            io_uring_prep_read(sqe, io->fd, io->iov[0].iov_base, (unsigned)io->iov[0].iov_len,
                               io->off);
        else
            io_uring_prep_readv(sqe, io->fd, io->iov, io->iovcnt, io->off);
        break;
    case KVT_IO_WRITE:
        if (io->iovcnt == 1)
            io_uring_prep_write(sqe, io->fd, io->iov[0].iov_base, (unsigned)io->iov[0].iov_len,
                                io->off);
        else
            io_uring_prep_writev(sqe, io->fd, io->iov, io->iovcnt, io->off);
        break;
    default:
        io_uring_prep_fsync(sqe, io->fd, IORING_FSYNC_DATASYNC);
        break;
    }
    io_uring_sqe_set_data(sqe, io);
}

/* Handle one completion: finish the request, or queue its retry first. */
static void on_cqe(struct uring_eng *u, struct kvt_io *io, int res)
{
    struct kvt_ioeng *e = &u->base;
    if (io->op == KVT_IO_FSYNC) {
        kvt_ioeng_complete(e, io, res < 0 ? res : 0);
        return;
    }
    if (res == -EINTR || res == -EAGAIN) {
        atomic_fetch_add_explicit(&e->retries, 1, memory_order_relaxed);
        local_push_front(u, io);
        return;
    }
    if (res < 0) {
        kvt_ioeng_complete(e, io, res);
        return;
    }
    if (res == 0) { /* EOF on read; no progress on write */
        kvt_ioeng_complete(e, io, io->op == KVT_IO_WRITE ? -EIO : (int)io->done);
        return;
    }
    uint64_t left = io->len - io->done;
    res = (int)kvt_ioeng_fault_short(e, io, (uint64_t)res);
    if ((uint64_t)res < left) {
        atomic_fetch_add_explicit(&e->retries, 1, memory_order_relaxed);
        kvt_io_advance(io, (uint64_t)res);
        local_push_front(u, io);
        return;
    }
    kvt_io_advance(io, (uint64_t)res);
    kvt_ioeng_complete(e, io, (int)KVT_MIN(io->done, (uint64_t)INT32_MAX));
}

static void *ring_main(void *arg)
{
    struct uring_eng *u = arg;
    char tname[16];
    snprintf(tname, sizeof(tname), "%.10s-ring", u->base.name);
    pthread_setname_np(pthread_self(), tname);
    for (;;) {
        pthread_mutex_lock(&u->lock);
        if (u->head) {
            if (u->ltail)
                u->ltail->next = u->head;
            else
                u->lhead = u->head;
            u->ltail = u->tail;
            u->head = u->tail = NULL;
        }
        bool stopping = u->stop;
        pthread_mutex_unlock(&u->lock);

        while (u->lhead && u->inflight < (unsigned)u->base.depth) {
            struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);
            if (!sqe)
                break; /* SQ full: submit below, then continue */
            struct kvt_io *io = u->lhead;
            u->lhead = io->next;
            if (!u->lhead)
                u->ltail = NULL;
            io->next = NULL;
            prep_sqe(sqe, io);
            u->inflight++;
        }
        if (stopping && !u->lhead && u->inflight == 0)
            break;
        if (!u->bell_armed) {
            struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);
            if (sqe) {
                io_uring_prep_read(sqe, u->bell, &u->bell_val, sizeof(u->bell_val), 0);
                io_uring_sqe_set_data64(sqe, BELL_TAG);
                u->bell_armed = true;
            }
        }
        int rc = io_uring_submit_and_wait(&u->ring, 1);
        if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
            /* the ring refused the submission: fail what is queued so that
             * nobody waits forever; requests already in the kernel complete
             * through the CQ as usual */
            kvt_error("%s: io_uring_submit_and_wait: %s", u->base.name, kvt_strerror(rc));
            while (u->lhead) {
                struct kvt_io *io = u->lhead;
                u->lhead = io->next;
                kvt_ioeng_complete(&u->base, io, rc);
            }
            u->ltail = NULL;
        }
        struct io_uring_cqe *cqe;
        unsigned head, seen = 0;
        io_uring_for_each_cqe(&u->ring, head, cqe)
        {
            seen++;
            uint64_t ud = io_uring_cqe_get_data64(cqe);
            if (ud == BELL_TAG) {
                u->bell_armed = false;
                continue;
            }
            struct kvt_io *io = (struct kvt_io *)(uintptr_t)ud;
            u->inflight--;
            on_cqe(u, io, cqe->res);
        }
        io_uring_cq_advance(&u->ring, seen);
    }
    return NULL;
}

static void ring_bell(struct uring_eng *u)
{
    uint64_t one = 1;
    ssize_t w = write(u->bell, &one, sizeof(one));
    (void)w; /* EAGAIN only when the counter is saturated: already ringing */
}

static void uring_submitv(struct kvt_ioeng *e, struct kvt_io **ios, size_t n)
{
    struct uring_eng *u = (struct uring_eng *)e;
    pthread_mutex_lock(&u->lock);
    /* a list that is not empty has rung already, and the ring thread takes
     * all of it at once: only the submitter that makes it non-empty rings */
    bool was_empty = u->head == NULL;
    for (size_t i = 0; i < n; i++) {
        ios[i]->next = NULL;
        if (u->tail)
            u->tail->next = ios[i];
        else
            u->head = ios[i];
        u->tail = ios[i];
    }
    pthread_mutex_unlock(&u->lock);
    if (was_empty && n)
        ring_bell(u);
}

static void uring_destroy(struct kvt_ioeng *e)
{
    struct uring_eng *u = (struct uring_eng *)e;
    pthread_mutex_lock(&u->lock);
    u->stop = true;
    pthread_mutex_unlock(&u->lock);
    ring_bell(u);
    pthread_join(u->thr, NULL);
    io_uring_queue_exit(&u->ring); /* cancels the armed doorbell read */
    close(u->bell);
    pthread_mutex_destroy(&u->lock);
    free(u);
}

static const struct kvt_ioeng_ops uring_ops = {
    .submitv = uring_submitv,
    .destroy = uring_destroy,
};

int kvt_ioeng_uring_create(struct kvt_ioeng **out, const char *name, int depth, char *err,
                           size_t errcap)
{
    struct uring_eng *u = kvt_xcalloc(1, sizeof(*u));
    kvt_ioeng_base_init(&u->base, &uring_ops, KVT_IOENG_URING, name, depth);
    pthread_mutex_init(&u->lock, NULL);
    u->bell = eventfd(0, EFD_CLOEXEC); /* blocking: the ring's read must wait, not -EAGAIN */
    if (u->bell < 0) {
        int rc = -errno;
        snprintf(err, errcap, "eventfd: %s", kvt_strerror(-errno));
        pthread_mutex_destroy(&u->lock);
        free(u);
        return rc;
    }
    /* depth requests plus the doorbell; liburing rounds up to a power of 2 */
    int rc = io_uring_queue_init((unsigned)depth + 1, &u->ring, 0);
    if (rc < 0) {
        snprintf(err, errcap,
                 "io_uring is not available (io_uring_queue_init: %s); use \"io_engine\": "
                 "\"posix\"",
                 kvt_strerror(rc));
        close(u->bell);
        pthread_mutex_destroy(&u->lock);
        free(u);
        return rc;
    }
    rc = pthread_create(&u->thr, NULL, ring_main, u);
    if (rc) {
        snprintf(err, errcap, "cannot start the io_uring thread: %s", kvt_strerror(-rc));
        io_uring_queue_exit(&u->ring);
        close(u->bell);
        pthread_mutex_destroy(&u->lock);
        free(u);
        return -rc;
    }
    *out = &u->base;
    return 0;
}
