/*
 * The tier-event queue (events.h): a ring of fixed-size records under one
 * leaf lock, and an eventfd written when a push finds the ring empty (the
 * consumer empties it on every wake, so one write per burst). Beside it,
 * under the same lock, the table of engine block hashes: key -> tag and
 * the tiers that announced the key under it.
 */
#include "core/events.h"
#include "common/log.h"
#include "common/util.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

/* A key with engine block hashes. tiers: bit t set while tier t holds the
 * key announced under this tag; 0: an orphan (given, not yet announced). */
struct tagent {
    struct tagent *next;
    kvt_key key;
    struct kvt_blocktag *tag; /* the table's reference */
    uint64_t tiers;
};

struct kvt_events {
    pthread_mutex_t lock; /* a leaf, taken under l1->lock or l2->lock; guards all below */
    struct tagent **tb;   /* hash buckets (ntb, a power of two), chained */
    uint32_t ntb, ntags, norphans;
    struct kvt_event *ring;
    uint32_t cap;
    uint64_t head, tail; /* tail - head events are queued; positions modulo cap */
    uint64_t pushed, dropped, popped;
    int efd;
    /* the L1 log (kvt_events_log_open): records logseq - nlog + 1 .. logseq */
    struct kvt_evrec *log;
    uint32_t logcap, nlog;
    uint64_t logseq;
    int log_fd; /* written when armed and L1 logs an event */
    bool log_armed;
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
    for (uint32_t b = 0; b < q->ntb; b++)
        for (struct tagent *e = q->tb[b], *n; e; e = n) {
            n = e->next;
            kvt_blocktag_put(e->tag);
            free(e);
        }
    free(q->tb);
    for (uint64_t i = q->head; i != q->tail; i++)
        kvt_blocktag_put(q->ring[i % q->cap].tag);
    for (uint32_t i = 0; i < q->nlog; i++)
        kvt_blocktag_put(q->log[(q->logseq - i) % q->logcap].tag);
    free(q->log);
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

/* ---------------------------------------------------- the tag table */

static struct tagent **tag_slot_locked(struct kvt_events *q, const kvt_key *key)
{
    if (!q->ntb)
        return NULL;
    struct tagent **pe = &q->tb[kvt_key_hash(key) & (q->ntb - 1)];
    while (*pe && !kvt_key_eq(&(*pe)->key, key))
        pe = &(*pe)->next;
    return pe;
}

static void tag_grow_locked(struct kvt_events *q)
{
    uint32_t n = q->ntb ? q->ntb * 2 : 1024;
    struct tagent **tb = kvt_xcalloc(n, sizeof(*tb));
    for (uint32_t b = 0; b < q->ntb; b++)
        for (struct tagent *e = q->tb[b], *nx; e; e = nx) {
            nx = e->next;
            struct tagent **h = &tb[kvt_key_hash(&e->key) & (n - 1)];
            e->next = *h;
            *h = e;
        }
    free(q->tb);
    q->tb = tb;
    q->ntb = n;
}

/* capped: a client's tag (at most KVT_EVENTS_MAX_ORPHANS unannounced);
 * not: a tag a tier read back, announced right after */
static void tag_give(struct kvt_events *q, const kvt_key *key, struct kvt_blocktag *tag,
                     bool capped)
{
    pthread_mutex_lock(&q->lock);
    struct tagent **pe = tag_slot_locked(q, key);
    struct tagent *e = pe ? *pe : NULL;
    if (e && !e->tiers) { /* an orphan: the newer write's hashes */
        kvt_blocktag_put(e->tag);
        e->tag = tag;
    } else if (e || (capped && q->norphans >= KVT_EVENTS_MAX_ORPHANS)) {
        kvt_blocktag_put(tag); /* held under its tag already, or too many orphans */
    } else {
        if (q->ntags >= q->ntb)
            tag_grow_locked(q);
        e = kvt_xcalloc(1, sizeof(*e));
        e->key = *key;
        e->tag = tag;
        pe = tag_slot_locked(q, key);
        e->next = *pe;
        *pe = e;
        q->ntags++;
        q->norphans++;
    }
    pthread_mutex_unlock(&q->lock);
}

void kvt_events_tag(struct kvt_events *q, const kvt_key *key, struct kvt_blocktag *tag)
{
    tag_give(q, key, tag, true);
}

struct kvt_blocktag *kvt_events_tag_of(void *arg, const kvt_key *key)
{
    struct kvt_events *q = arg;
    pthread_mutex_lock(&q->lock);
    struct tagent **pe = tag_slot_locked(q, key);
    struct kvt_blocktag *t = pe && *pe ? (*pe)->tag : NULL;
    if (t)
        kvt_blocktag_ref(t);
    pthread_mutex_unlock(&q->lock);
    return t;
}

void kvt_events_tag_hook(void *arg, const kvt_key *key, struct kvt_blocktag *tag)
{
    /* not capped: a scan of more objects than the cap may give its tags
     * before any is announced (kvt_l2_set_event_hook) */
    tag_give(arg, key, tag, false);
}

/* The tag an event of tier t names (a new reference, or NULL), with the
 * table brought up to date: a store marks the tier, a removal of a tier
 * that announced the tag unmarks it and the last one frees the entry. */
static struct kvt_blocktag *tag_for_locked(struct kvt_events *q, int tier, enum kvt_tier_ev ev,
                                           const kvt_key *key)
{
    struct tagent **pe = tag_slot_locked(q, key);
    struct tagent *e = pe ? *pe : NULL;
    uint64_t bit = 1ull << tier;
    if (!e)
        return NULL;
    if (ev == KVT_TIER_STORED) {
        if (!e->tiers)
            q->norphans--;
        e->tiers |= bit;
    } else if (!(e->tiers & bit)) {
        return NULL; /* announced before the tag came: named by its key */
    }
    struct kvt_blocktag *t = e->tag;
    kvt_blocktag_ref(t);
    if (ev == KVT_TIER_REMOVED && !(e->tiers &= ~bit)) {
        *pe = e->next;
        kvt_blocktag_put(e->tag);
        free(e);
        q->ntags--;
    }
    return t;
}

/* ------------------------------------------------------------ the L1 log */

void kvt_events_log_open(struct kvt_events *q, uint32_t cap, int wake_fd)
{
    pthread_mutex_lock(&q->lock);
    KVT_ASSERT(!q->log && cap > 0);
    q->log = kvt_xcalloc(cap, sizeof(*q->log));
    q->logcap = cap;
    q->log_fd = wake_fd;
    pthread_mutex_unlock(&q->lock);
}

/* Returns whether the reader waits to be woken. */
static bool log_append_locked(struct kvt_events *q, enum kvt_tier_ev ev, const kvt_key *key,
                              struct kvt_blocktag *tag)
{
    struct kvt_evrec *r = &q->log[++q->logseq % q->logcap];
    if (q->nlog == q->logcap)
        kvt_blocktag_put(r->tag); /* the oldest goes */
    else
        q->nlog++;
    r->seq = q->logseq;
    r->key = *key;
    r->ev = (uint8_t)ev;
    r->tag = tag;
    if (tag)
        kvt_blocktag_ref(tag);
    bool wake = q->log_armed;
    q->log_armed = false;
    return wake;
}

uint32_t kvt_events_log_read(struct kvt_events *q, uint64_t cursor, struct kvt_evrec *out,
                             uint32_t max, uint64_t *first, uint64_t *last)
{
    pthread_mutex_lock(&q->lock);
    uint64_t lo = q->logseq - q->nlog + 1, n = 0;
    *first = lo;
    *last = q->logseq;
    for (uint64_t s = KVT_MAX(cursor + 1, lo); s <= q->logseq && n < max; s++) {
        out[n] = q->log[s % q->logcap];
        if (out[n].tag)
            kvt_blocktag_ref(out[n].tag);
        n++;
    }
    if (!n)
        q->log_armed = true;
    pthread_mutex_unlock(&q->lock);
    return (uint32_t)n;
}

/* ------------------------------------------------------------ the queue */

void kvt_events_hook(void *arg, int tier, enum kvt_tier_ev ev, const kvt_key *key)
{
    struct kvt_events *q = arg;
    pthread_mutex_lock(&q->lock);
    /* the table follows every tier, queued or dropped */
    struct kvt_blocktag *tag = q->ntags ? tag_for_locked(q, tier, ev, key) : NULL;
    bool wake_log = tier == 0 && q->log && log_append_locked(q, ev, key, tag);
    bool was_empty = q->tail == q->head;
    if (q->tail - q->head == q->cap) {
        q->dropped++;
        pthread_mutex_unlock(&q->lock);
        kvt_blocktag_put(tag);
        if (wake_log)
            poke(q->log_fd);
        return;
    }
    struct kvt_event *e = &q->ring[q->tail++ % q->cap];
    e->key = *key;
    e->tag = tag;
    e->ev = (uint8_t)ev;
    e->tier = (uint8_t)tier;
    q->pushed++;
    pthread_mutex_unlock(&q->lock);
    if (was_empty)
        poke(q->efd);
    if (wake_log)
        poke(q->log_fd);
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
    out->tagged = q->ntags;
    out->orphans = q->norphans;
    out->cap = q->cap;
    pthread_mutex_unlock(&q->lock);
}
