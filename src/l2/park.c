/* L2 base: stores parked while a start-up scan runs, and draining. */
#include "l2/base_int.h"
#include "l2/evict.h"
#include "l2/adapters.h"
#include "common/log.h"
#include "common/util.h"
#include "policy/policy.h"
#include "io/tpool.h"
#include "kvtier/error.h"
#include "l2/stage.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <unistd.h>

/* ------------------------------------------------- parking and draining */

void kvt_l2_park_init(struct kvt_l2_park *p)
{
    memset(p, 0, sizeof(*p));
    pthread_mutex_init(&p->lock, NULL);
}

void kvt_l2_park_destroy(struct kvt_l2_park *p)
{
    pthread_mutex_destroy(&p->lock);
}

bool kvt_l2_park(struct kvt_l2_park *p, struct kvt_job *job)
{
    pthread_mutex_lock(&p->lock);
    bool parked = p->parking;
    if (parked) {
        job->next = p->head;
        p->head = job;
        p->n++;
    }
    pthread_mutex_unlock(&p->lock);
    return parked;
}

void kvt_l2_park_release(struct kvt_l2_park *p, struct kvt_tpool *pool)
{
    pthread_mutex_lock(&p->lock);
    p->parking = false;
    struct kvt_job *j = p->head;
    p->head = NULL;
    for (struct kvt_job *q = j; q; q = q->next)
        p->n--;
    pthread_mutex_unlock(&p->lock);
    struct kvt_job *rev = NULL; /* parked LIFO: reverse to keep submission order */
    while (j) {
        struct kvt_job *nx = j->next;
        j->next = rev;
        rev = j;
        j = nx;
    }
    while (rev) {
        struct kvt_job *nx = rev->next; /* the push reuses next */
        kvt_tpool_push(pool, rev);
        rev = nx;
    }
}

bool kvt_l2_park_task(struct kvt_l2_park *p, kvt_l2_task *t)
{
    pthread_mutex_lock(&p->lock);
    bool parked = p->parking;
    if (parked) {
        t->next = NULL;
        if (p->tasks_tail)
            p->tasks_tail->next = t;
        else
            p->tasks = t;
        p->tasks_tail = t;
        p->n++;
    }
    pthread_mutex_unlock(&p->lock);
    return parked;
}

kvt_l2_task *kvt_l2_park_take(struct kvt_l2_park *p, bool stop_parking)
{
    pthread_mutex_lock(&p->lock);
    if (stop_parking)
        p->parking = false;
    kvt_l2_task *t = p->tasks;
    p->tasks = p->tasks_tail = NULL;
    for (kvt_l2_task *q = t; q; q = q->next)
        p->n--;
    pthread_mutex_unlock(&p->lock);
    return t;
}

uint64_t kvt_l2_parked(struct kvt_l2_park *p)
{
    pthread_mutex_lock(&p->lock);
    uint64_t n = p->n;
    pthread_mutex_unlock(&p->lock);
    return n;
}

void kvt_l2_drain_init(struct kvt_l2_drain *d)
{
    memset(d, 0, sizeof(*d));
    pthread_mutex_init(&d->lock, NULL);
    pthread_cond_init(&d->cond, NULL);
}

void kvt_l2_drain_destroy(struct kvt_l2_drain *d)
{
    pthread_mutex_destroy(&d->lock);
    pthread_cond_destroy(&d->cond);
}

void kvt_l2_drain_enter(struct kvt_l2_drain *d)
{
    pthread_mutex_lock(&d->lock);
    d->live++;
    pthread_mutex_unlock(&d->lock);
}

void kvt_l2_drain_leave(struct kvt_l2_drain *d)
{
    pthread_mutex_lock(&d->lock);
    if (--d->live == 0)
        pthread_cond_broadcast(&d->cond);
    pthread_mutex_unlock(&d->lock);
}

void kvt_l2_drain_wait(struct kvt_l2_drain *d)
{
    pthread_mutex_lock(&d->lock);
    while (d->live)
        pthread_cond_wait(&d->cond, &d->lock);
    pthread_mutex_unlock(&d->lock);
}
