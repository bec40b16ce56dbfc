/*
 * Tier events: the hook through which a tier (L1, or one L2 adapter) says
 * that an object became available in it or left it. The tiers call it; the
 * core installs it (core/events.h) and turns the calls into the events the
 * server publishes. It lives here, beside the key, so that L1 and L2 share
 * one type without including each other.
 *
 * A tier calls fn with its own lock held: fn must be short, must not block
 * and must not call into any tier (the core's queue takes a leaf lock and
 * drops what does not fit).
 */
#ifndef KVT_KEY_TIEREV_H
#define KVT_KEY_TIEREV_H

#include "key/key.h"

enum kvt_tier_ev {
    KVT_TIER_STORED = 0,  /* the object is available in the tier from now on */
    KVT_TIER_REMOVED = 1, /* an object the tier announced is gone from it */
};

struct kvt_blocktag;

struct kvt_tier_hook {
    void (*fn)(void *arg, int tier, enum kvt_tier_ev ev, const kvt_key *key);
    void *arg;
    int tier; /* passed back to fn: 0 is L1, 1 + i is L2 adapter i */
    /* the engine block hashes kept for a key (key/blocktag.h), so that a
     * persistent tier writes them with the object and gives back what its
     * start-up scan read (each may be NULL; same rules as fn):
     * tag_of: the tag kept for key (a new reference), or NULL;
     * tag: key's tag, read back, given before the tier announces key
     *   (takes the caller's reference) */
    struct kvt_blocktag *(*tag_of)(void *arg, const kvt_key *key);
    void (*tag)(void *arg, const kvt_key *key, struct kvt_blocktag *tag);
};

#endif
