/*
 * The tier-event queue: what the tiers announce (key/tierev.h), in the
 * order they announced it, for the events publisher (server/events.c).
 *
 * The core installs kvt_events_hook on L1 (tier 0) and on every L2
 * adapter (tier 1 + i) when the server hands it a queue
 * (kvt_core_opts.events). A tier calls the hook with its own lock held, so
 * a push never waits for anything but the queue's own lock, a leaf held
 * for a copy: when the queue is full the event is dropped and counted,
 * and the consumer learns of it through kvt_events_dropped. A store or a
 * lookup is never slowed by whoever reads the queue.
 *
 * Opaque types: struct kvt_events. Non-opaque: struct kvt_event, struct
 * kvt_events_stats.
 *
 * Threads: push from any thread (the tiers' threads); pop from one
 * consumer thread.
 */
#ifndef KVT_CORE_EVENTS_H
#define KVT_CORE_EVENTS_H

#include <stdint.h>

#include "key/blocktag.h"
#include "key/key.h"
#include "key/tierev.h"

struct kvt_events;

struct kvt_event {
    kvt_key key;
    struct kvt_blocktag *tag; /* the key's engine block hashes (a reference the
                               * consumer drops), or NULL: name it by key->hash */
    uint8_t ev;               /* enum kvt_tier_ev */
    uint8_t tier;             /* 0: L1; 1 + i: L2 adapter i */
};

struct kvt_events_stats {
    uint32_t tagged;  /* keys whose engine block hashes are kept now */
    uint32_t orphans; /* of them, tags no tier announced yet (capped) */
    uint64_t pushed;  /* events queued since start */
    uint64_t dropped; /* events lost: the queue was full */
    uint64_t popped;  /* events taken by the consumer */
    uint32_t depth;   /* events waiting now */
    uint32_t cap;
};

/* A queue of cap events (at least 1). 0 or -errno. */
int kvt_events_new(uint32_t cap, struct kvt_events **out);
void kvt_events_free(struct kvt_events *q);

/*
 * Engine block hashes (key/blocktag.h): from now on the events of key in a
 * tier that announces it name tag's hashes instead of the key's hash, and
 * keep doing so for that tier until it removes the key, so a subscriber
 * hears the same hashes stored and removed. Give the tag before the key is
 * published (the store): a tier that announced the key already keeps what
 * it announced, and a tag given while any tier holds the key under one is
 * ignored. The tag is kept while a tier holds the key; at most
 * KVT_EVENTS_MAX_ORPHANS tags no tier announced yet (writes never
 * committed) are kept, further ones are dropped. Takes the caller's
 * reference.
 */
#define KVT_EVENTS_MAX_ORPHANS 65536
void kvt_events_tag(struct kvt_events *q, const kvt_key *key, struct kvt_blocktag *tag);

/* The tag kept for key (a new reference), or NULL (struct
 * kvt_tier_hook.tag_of: a persistent tier writes it with the object). */
struct kvt_blocktag *kvt_events_tag_of(void *arg, const kvt_key *key);
/* kvt_events_tag for struct kvt_tier_hook.tag (arg = the queue): a tag a
 * persistent tier read back with the object, given before it announces it
 * (not counted against KVT_EVENTS_MAX_ORPHANS: the tier announces it
 * next). */
void kvt_events_tag_hook(void *arg, const kvt_key *key, struct kvt_blocktag *tag);

/* The hook's function (struct kvt_tier_hook.fn with arg = the queue). */
void kvt_events_hook(void *arg, int tier, enum kvt_tier_ev ev, const kvt_key *key);

/*
 * The L1 log: L1's events (tier 0) again, numbered from 1 in the order L1
 * announced them, the last cap kept, for readers that page through them
 * by cursor (the LMCache front end's subscribe_kv_events). Off until
 * opened; open it once, before the core starts. A read that finds nothing
 * after its cursor arms wake_fd: the next L1 event writes it (once).
 */
struct kvt_evrec {
    uint64_t seq;
    kvt_key key;
    struct kvt_blocktag *tag; /* as struct kvt_event's: a reference, or NULL */
    uint8_t ev;               /* enum kvt_tier_ev */
};
void kvt_events_log_open(struct kvt_events *q, uint32_t cap, int wake_fd);
/* Up to max records with seq > cursor, oldest first, into out (each
 * record's tag is the caller's reference); *first and *last: the first and
 * last sequence numbers the log holds (*last 0: nothing logged yet; *first
 * is *last + 1 when it holds none). Returns how many. */
uint32_t kvt_events_log_read(struct kvt_events *q, uint64_t cursor, struct kvt_evrec *out,
                             uint32_t max, uint64_t *first, uint64_t *last);

/* Take up to max events, oldest first; returns how many. Each event's tag
 * (if any) is the caller's reference: drop it with kvt_blocktag_put. */
uint32_t kvt_events_pop(struct kvt_events *q, struct kvt_event *out, uint32_t max);
/* Readable when events were queued into an empty queue (or after
 * kvt_events_wake): the consumer reads it (kvt_events_drain_fd), then
 * pops until the queue is empty. */
int kvt_events_fd(const struct kvt_events *q);
void kvt_events_drain_fd(struct kvt_events *q);
/* Make the fd readable (a consumer asked to stop). */
void kvt_events_wake(struct kvt_events *q);
/* Events dropped since start (the consumer compares it between batches). */
uint64_t kvt_events_dropped(struct kvt_events *q);
void kvt_events_stats(struct kvt_events *q, struct kvt_events_stats *out);

#endif
