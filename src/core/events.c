/*
 * The tier-event queue (events.h): a ring of fixed-size records under one
 * leaf lock, and an eventfd written when a push finds the ring empty (the
 * consumer empties it on every wake, so one write per burst).
 */
#include "core/events.h"
#include "common/util.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

struct kvt_events {
    pthread_mutex_t lock; /* a leaf, taken under l1->lock or l2->lock; guards all below */
    struct kvt_event *ring;
    uint32_t cap;
    uint64_t head, tail; /* tail - head events are queued; positions modulo cap */
    uint64_t pushed, dropped, popped;
    int efd;
};

int kvt_events_new(uint32_t cap, struct kvt_events **out)
{
    *out = NULL;
    struct kvt_events *q = kvt_xcalloc(1, sizeof(*q));
    q->cap = cap ? cap : 1;
    q->ring = kvt_xmalloc((size_t)q->cap * sizeof(*q->ring));
    q->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (q->efd < 0) {
        int e = -errno;
        free(q->ring);
        free(q);
        return e;
    }
    pthread_mutex_init(&q->lock, NULL);
    *out = q;
    return 0;
}

void kvt_events_free(struct kvt_events *q)
{
    if (!q)
        return;
    close(q->efd);
    pthread_mutex_destroy(&q->lock);
    free(q->ring);
    free(q);
}

static void poke(int efd)
{
    uint64_t one = 1;
    ssize_t w = write(efd, &one, sizeof(one)); /* EAGAIN: the counter is already set */
    (void)w;
}

void kvt_events_hook(void *arg, int tier, enum kvt_tier_ev ev, const kvt_key *key)
{
    struct kvt_events *q = arg;
    pthread_mutex_lock(&q->lock);
    bool was_empty = q->tail == q->head;
    if (q->tail - q->head == q->cap) {
        q->dropped++;
        pthread_mutex_unlock(&q->lock);
        return;
    }
    struct kvt_event *e = &q->ring[q->tail++ % q->cap];
    e->key = *key;
    e->ev = (uint8_t)ev;
    e->tier = (uint8_t)tier;
    q->pushed++;
    pthread_mutex_unlock(&q->lock);
    if (was_empty)
        poke(q->efd);
}

uint32_t kvt_events_pop(struct kvt_events *q, struct kvt_event *out, uint32_t max)
{
    pthread_mutex_lock(&q->lock);
    uint32_t n = 0;
    while (n < max && q->head != q->tail)
        out[n++] = q->ring[q->head++ % q->cap];
    q->popped += n;
    pthread_mutex_unlock(&q->lock);
    return n;
}

int kvt_events_fd(const struct kvt_events *q)
{
    return q->efd;
}

void kvt_events_drain_fd(struct kvt_events *q)
{
    uint64_t v;
    ssize_t r = read(q->efd, &v, sizeof(v)); /* EAGAIN: nothing was written */
    (void)r;
}

void kvt_events_wake(struct kvt_events *q)
{
    poke(q->efd);
}

uint64_t kvt_events_dropped(struct kvt_events *q)
{
    pthread_mutex_lock(&q->lock);
    uint64_t d = q->dropped;
    pthread_mutex_unlock(&q->lock);
    return d;
}

void kvt_events_stats(struct kvt_events *q, struct kvt_events_stats *out)
{
    pthread_mutex_lock(&q->lock);
    out->pushed = q->pushed;
    out->dropped = q->dropped;
    out->popped = q->popped;
    out->depth = (uint32_t)(q->tail - q->head);
    out->cap = q->cap;
    pthread_mutex_unlock(&q->lock);
}
