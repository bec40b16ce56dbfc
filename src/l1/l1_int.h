/*
 * Private to the L1 memory tier: the struct and the helpers its files share.
 *   l1.c        the pool, create/destroy, eviction to a target, usage, status
 *   l1_obj.c    the object table: reserve, publish, references, lookups,
 *               deletes, eviction batches, the quarantine
 *   l1_lease.c  read and write leases: ids, owners, TTL expiry
 * Every function here is called with l1->lock held.
 */
#ifndef KVT_L1_INT_H
#define KVT_L1_INT_H

#include "common/log.h"
#include "key/kindex.h"
#include "key/tierev.h"
#include "l1/l1.h"
#include "l1/palloc.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#define NIL UINT32_MAX

/*
 * An object's state, changed only by obj_set_state:
 *   FREE -> WRITING (reserved) -> READY (published)
 *   WRITING, READY -> DEAD (out of the table; referenced still) -> FREE
 *     (the last reference went; at once when there was none)
 */
enum { ST_FREE = 0, ST_WRITING, ST_READY, ST_DEAD };

#define FROM(s) (1u << (s))

/* F_UNMAPPED: a WRITING object reserved while another writer held its key
 * (the map has one handle per key): it takes the key at its publish if
 * that writer has not published yet, else it is dropped (kvt_l1_obj_publish_locked).
 * F_ANNOUNCED: its publish went to the tier-event hook, so its unlink does too. */
enum { F_TEMP = 1, F_TRACKED = 2, F_QUARANTINE = 4, F_UNMAPPED = 8, F_ANNOUNCED = 16 };

struct l1_obj {
    kvt_key key;
    uint64_t off;
    uint32_t npages;
    uint32_t refs;
    kvt_objmeta meta;
    uint8_t state;
    uint8_t flags;
    uint32_t next_free; /* free-list link when ST_FREE */
    uint32_t rleases;   /* read leases holding it: delete skips it while > 0 */
};

struct lease {
    uint64_t id; /* random, unique among live leases; 0 = free slot */
    uint8_t kind;
    uint64_t expire_ns;
    uint32_t n;
    uint32_t *hs;
    uint32_t prev, next; /* expiry FIFO of its kind, or free list (next) */
    uint32_t hnext;      /* id hash chain */
    uint32_t owner_len;
    uint8_t *owner; /* the taking connection's routing id (owned) */
};

struct quarantined {
    uint32_t page, npages;
    uint64_t until_ns;
};

struct kvt_l1 {
    pthread_mutex_t lock; /* guards everything below */
    /* pool */
    int fd;
    char *base;
    uint64_t map_size, cur_size, dev, ino;
    uint64_t pool_id;
    uint32_t align;
    bool lazy, huge;
    char *shm_name; /* named POSIX shm (unlinked at destroy), or NULL */
    struct kvt_palloc pa;
    /* objects */
    struct l1_obj *objs;
    uint32_t cap_objs, hwm, free_obj, nready, nwriting;
    struct kvt_kindex map;
    struct kvt_policy *policy;
    /* leases */
    struct lease *leases;
    uint32_t cap_leases, nleases_used, free_lease;
    uint32_t fifo_head[2], fifo_tail[2];
    uint64_t ttl_ns[2];
    uint32_t live_leases[2];
    uint32_t *lbucket; /* id hash: heads of hnext chains, nlbuckets (power of 2) */
    uint32_t nlbuckets;
    uint64_t rnd[64]; /* getrandom output not yet used for ids */
    uint32_t nrnd;
    /* quarantine (FIFO by time) */
    struct quarantined *q;
    uint32_t q_head, q_tail, q_cap; /* positions modulo q_cap */
    uint64_t q_pages;
    /* stats */
    struct kvt_l1_counters c;
    uint64_t size_bytes;
    double watermark, ratio;
    void (*pressure_fn)(void *); /* set once before use */
    void *pressure_arg;
    struct kvt_tier_hook ev; /* tier events (ev.fn NULL: none); set once before use */
};

static inline struct l1_obj *obj(struct kvt_l1 *l1, uint32_t h)
{
    return &l1->objs[h];
}

/* o leaves one of the states in from (FROM bits) for to. */
static inline void obj_set_state(struct l1_obj *o, unsigned from, uint8_t to)
{
    KVT_ASSERT(from & FROM(o->state));
    o->state = to;
}

/* l1.c */
/* Double the backed size of a lazy pool (up to the configured size). */
bool kvt_l1_pool_grow_locked(struct kvt_l1 *l1);
/* Pages allocated to objects or quarantined (backed pages not free). */
uint64_t kvt_l1_used_pages_locked(struct kvt_l1 *l1);

/* l1_obj.c */
/* Take an object out of the table (it becomes DEAD, or is freed now when
 * unreferenced). */
void kvt_l1_obj_unlink_locked(struct kvt_l1 *l1, uint32_t h);
/* Drop a reference: the last one frees a DEAD object, or unlinks a READY
 * temporary one. */
void kvt_l1_obj_put_locked(struct kvt_l1 *l1, uint32_t h);
/* WRITING h (position pos of a commit of n) becomes READY under its key;
 * false: dropped, another writer published the key first. */
bool kvt_l1_obj_publish_locked(struct kvt_l1 *l1, uint32_t h, uint32_t pos, uint32_t n, bool temp);
/* Tell the tier-event hook that READY h is stored, unless it is temporary
 * or was announced already. Publishers call it after their publishes, in
 * request order. */
void kvt_l1_obj_announce_locked(struct kvt_l1 *l1, uint32_t h);
void kvt_l1_obj_fill_ref(struct kvt_l1 *l1, uint32_t h, struct kvt_l1_ref *r);
/* Return quarantined pages whose time is up to the allocator. */
void kvt_l1_quarantine_release_locked(struct kvt_l1 *l1, uint64_t now);
/* Evict unreferenced objects in policy order until want_pages are freed
 * (at most 64 per call); returns pages freed. */
uint64_t kvt_l1_evict_batch_locked(struct kvt_l1 *l1, uint64_t want_pages);

#endif
