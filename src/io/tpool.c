#include "io/tpool.h"
#include "common/util.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct kvt_tpool {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    struct kvt_job *head, *tail; /* guarded by lock */
    uint64_t queued;             /* guarded by lock */
    bool stop;                   /* guarded by lock */
    int n;
    pthread_t *threads;
    void *(*ctx_new)(int, void *);
    void (*ctx_free)(void *);
    void *arg;
    char name[16];
    int next_id; /* guarded by lock: worker index handed out at start */
};

static void *worker(void *arg)
{
    struct kvt_tpool *p = arg;
    pthread_mutex_lock(&p->lock);
    int id = p->next_id++;
    pthread_mutex_unlock(&p->lock);
    char tname[16];
    snprintf(tname, sizeof(tname), "%.11s-%d", p->name, id);
    pthread_setname_np(pthread_self(), tname);
    void *ctx = p->ctx_new ? p->ctx_new(id, p->arg) : NULL;
    pthread_mutex_lock(&p->lock);
    for (;;) {
        while (!p->head && !p->stop)
            pthread_cond_wait(&p->cond, &p->lock);
        struct kvt_job *j = p->head;
        if (!j)
            break; /* stop and drained */
        p->head = j->next;
        if (!p->head)
            p->tail = NULL;
        p->queued--;
        pthread_mutex_unlock(&p->lock);
        j->next = NULL;
        j->fn(j, ctx);
        pthread_mutex_lock(&p->lock);
    }
    pthread_mutex_unlock(&p->lock);
    if (p->ctx_free)
        p->ctx_free(ctx);
    return NULL;
}

int kvt_tpool_create(struct kvt_tpool **out, const char *name, int nthreads,
                     void *(*ctx_new)(int, void *), void (*ctx_free)(void *), void *arg)
{
    if (nthreads <= 0)
        return -EINVAL;
    struct kvt_tpool *p = kvt_xcalloc(1, sizeof(*p));
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->cond, NULL);
    p->ctx_new = ctx_new;
    p->ctx_free = ctx_free;
    p->arg = arg;
    snprintf(p->name, sizeof(p->name), "%s", name);
    p->threads = kvt_xcalloc((size_t)nthreads, sizeof(pthread_t));
    for (int i = 0; i < nthreads; i++) {
        int rc = pthread_create(&p->threads[i], NULL, worker, p);
        if (rc) {
            p->n = i;
            kvt_tpool_destroy(p);
            return -rc;
        }
    }
    p->n = nthreads;
    *out = p;
    return 0;
}

void kvt_tpool_push(struct kvt_tpool *p, struct kvt_job *job)
{
    job->next = NULL;
    pthread_mutex_lock(&p->lock);
    if (p->tail)
        p->tail->next = job;
    else
        p->head = job;
    p->tail = job;
    p->queued++;
    pthread_cond_signal(&p->cond);
    pthread_mutex_unlock(&p->lock);
}

uint64_t kvt_tpool_queued(struct kvt_tpool *p)
{
    pthread_mutex_lock(&p->lock);
    uint64_t q = p->queued;
    pthread_mutex_unlock(&p->lock);
    return q;
}

int kvt_tpool_threads(struct kvt_tpool *p)
{
    return p->n;
}

void kvt_tpool_destroy(struct kvt_tpool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->lock);
    p->stop = true;
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->lock);
    for (int i = 0; i < p->n; i++)
        pthread_join(p->threads[i], NULL);
    free(p->threads);
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->cond);
    free(p);
}
