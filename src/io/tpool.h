/*
 * A fixed pool of worker threads running intrusive jobs in FIFO order.
 * Used by file engines (one job = one whole object operation: open, write,
 * rename) and by the server's handler pool.
 *
 * Thread rules: kvt_tpool_push may be called from any thread, including a
 * worker. kvt_tpool_destroy runs every queued job, then joins the workers.
 */
#ifndef KVT_TPOOL_H
#define KVT_TPOOL_H

#include <stdint.h>

struct kvt_job {
    struct kvt_job *next;
    void (*fn)(struct kvt_job *job, void *worker_ctx);
};

struct kvt_tpool;

/* ctx_new(i) is called once in each worker thread (may be NULL); its result
 * is passed to every job that worker runs and to ctx_free at exit. */
int kvt_tpool_create(struct kvt_tpool **out, const char *name, int nthreads,
                     void *(*ctx_new)(int i, void *arg), void (*ctx_free)(void *ctx), void *arg);
void kvt_tpool_push(struct kvt_tpool *p, struct kvt_job *job);
/* Jobs queued and not yet started. */
uint64_t kvt_tpool_queued(struct kvt_tpool *p);
int kvt_tpool_threads(struct kvt_tpool *p);
void kvt_tpool_destroy(struct kvt_tpool *p);

#endif
