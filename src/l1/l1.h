/*
 * L1: the shared-memory tier.
 *
 * One memfd-backed pool (owner-only; clients on the same host map it through
 * /proc/<server pid>/fd/<fd>), divided into --l1-align-bytes pages by palloc.
 * Every object is a run of pages, so every object starts aligned.
 *
 * Object states:
 *   WRITING  reserved, being filled; in the table (a second writer gets
 *            -EEXIST) but invisible to readers.
 *   READY    visible; evictable when no reference is held.
 *   DEAD     removed from the table while still referenced; its memory
 *            returns to the allocator when the last reference goes.
 *
 * References: kvt_l1_get/kvt_l1_put count holders (the store controller while
 * an object travels to L2, an inline reply while ZeroMQ sends from the pool,
 * a client lease). Memory is never freed while a reference is held.
 *
 * Leases are references that a client holds across requests (lookup ->
 * retrieve, prepare -> commit). They expire: read leases after
 * --l1-read-ttl-seconds, write leases after --l1-write-ttl-seconds. An
 * expired lease drops its references; memory that becomes free that way is
 * quarantined for one more TTL before reuse, because a slow client may still
 * be reading or writing it. The client learns of the expiry at commit
 * (KVT_E_EXPIRED) and discards what it read; a write that expired is never
 * made visible.
 *
 * Temporary objects (prefetched for one reader) are freed when their last
 * reference goes.
 *
 * Thread rules: every function takes l1->lock internally; the lock is never
 * held across I/O or a bulk copy. Pointers returned stay valid while the
 * caller holds the reference.
 */
#ifndef KVT_L1_H
#define KVT_L1_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "key/key.h"
#include "key/tierev.h"
#include "kvtier/error.h"
#include "key/objmeta.h"

struct kvt_l1;

struct kvt_l1_opts {
    uint64_t size_bytes;
    uint64_t init_bytes; /* lazy: initial pool size */
    bool lazy;
    bool hugepages;
    uint32_t align;
    uint64_t write_ttl_ns, read_ttl_ns;
    const char *policy; /* "LRU" or "noop" */
    double watermark, ratio;
    /* NULL: an anonymous memfd. Otherwise the pool is the POSIX shared-memory
     * object of that name (created exclusively, sized to the whole pool at
     * once, sparse; unlinked by kvt_l1_destroy), so that processes which open
     * shared memory by name (LMCache's engine-driven workers) can map it. */
    const char *shm_name;
};

/* The largest pool L1 can address with pages of `align` bytes (page numbers
 * are 32 bits), rounded down to 2 MiB (the huge-page size). */
uint64_t kvt_l1_max_bytes(uint32_t align);

struct kvt_l1_shm {
    int fd;
    void *base;
    uint64_t map_size; /* bytes to map (the full configured size) */
    uint64_t cur_size; /* bytes backed now (lazy growth) */
    uint64_t dev, ino;
    uint64_t pool_id; /* random per pool: a client checks every offset's pool */
    uint32_t align;
};

/* A referenced object. */
struct kvt_l1_ref {
    uint32_t h;
    uint64_t off; /* byte offset in the pool */
    void *ptr;
    kvt_objmeta meta; /* meta.len = payload bytes */
};

int kvt_l1_create(const struct kvt_l1_opts *o, struct kvt_l1 **out, char *err, size_t errcap);
void kvt_l1_destroy(struct kvt_l1 *l1);
void kvt_l1_shm(struct kvt_l1 *l1, struct kvt_l1_shm *s);
/* The pool's id (fixed at creation; no lock): what offsets are valid in. */
uint64_t kvt_l1_pool_id(const struct kvt_l1 *l1);

/* ---- writing ---- */

/* Reserve a WRITING object for key with meta->len bytes. Evicts unreferenced
 * objects (policy order) and grows a lazy pool when needed. Returns 0 and a
 * reference in *out; -EEXIST if the key is present (READY); KVT_E_TOOBIG
 * if it can never fit; KVT_E_FULL if no memory now. A key another writer
 * holds WRITING gets an object of its own too: the first of them to
 * publish (commit, lease end) wins, the others are dropped at theirs. */
int kvt_l1_reserve(struct kvt_l1 *l1, const kvt_key *k, const kvt_objmeta *meta,
                   struct kvt_l1_ref *out);
/* The same, but -EEXIST also while another writer holds the key WRITING:
 * for a writer that must not lose the race (the prefetch hands what it
 * loads to a lookup's lease, which needs the READY object). */
int kvt_l1_reserve_free(struct kvt_l1 *l1, const kvt_key *k, const kvt_objmeta *meta,
                        struct kvt_l1_ref *out);

enum { KVT_L1_TEMP = 1 }; /* commit flag: free when the last reference goes */

/* WRITING -> READY for n objects; the caller keeps its references. The
 * policy learns them in reverse order (the head of a prefix is the most
 * recent). */
void kvt_l1_commit(struct kvt_l1 *l1, const uint32_t *hs, uint32_t n, unsigned flags);
/* r's object was committed: if it lost to another writer that published
 * the key first (it was dropped), r's reference moves to the READY object
 * that won. true: r is a READY object of its key; false (the winner was
 * evicted or deleted since): r still refers to the dropped one. */
bool kvt_l1_winner(struct kvt_l1 *l1, struct kvt_l1_ref *r);
/* Replace the metadata of a WRITING object (length must not change). */
void kvt_l1_set_meta(struct kvt_l1 *l1, uint32_t h, const kvt_objmeta *meta);
/* Drop a WRITING object (its memory is freed when unreferenced). */
void kvt_l1_abort(struct kvt_l1 *l1, uint32_t h);

/* ---- reading ---- */

/* Reference a READY object. Returns 0, or -ENOENT. Counts a hit or miss. */
int kvt_l1_get(struct kvt_l1 *l1, const kvt_key *k, struct kvt_l1_ref *out);
/* Describe an object the caller holds a reference on. */
void kvt_l1_describe(struct kvt_l1 *l1, uint32_t h, struct kvt_l1_ref *r, kvt_key *key);
/* Reference handle h if it is READY and holds key (a lease's handle checked
 * against the request); 0 or -ENOENT. */
int kvt_l1_get_handle(struct kvt_l1 *l1, uint32_t h, const kvt_key *key, struct kvt_l1_ref *out);
/* Take another reference on an object already referenced. */
void kvt_l1_ref(struct kvt_l1 *l1, uint32_t h);
void kvt_l1_put(struct kvt_l1 *l1, uint32_t h);
/* Reference the longest prefix of keys that is READY; returns its length.
 * hs/refs (optional) receive the references; counts hits and misses. */
uint32_t kvt_l1_get_prefix(struct kvt_l1 *l1, const kvt_key *keys, uint32_t n,
                           struct kvt_l1_ref *refs);
/* Is the key READY (no reference taken)? */
bool kvt_l1_contains(struct kvt_l1 *l1, const kvt_key *k);
/* Tell the policy a request looked up these keys (all of them, head
 * first, before kvt_l1_touch of its hits): "adaptive" and "value" judge
 * their experts by it (policy.h's request). Cheap for other policies. */
void kvt_l1_note_request(struct kvt_l1 *l1, const kvt_key *keys, uint32_t n);
/* Tell the policy the objects were read (reverse order). */
void kvt_l1_touch(struct kvt_l1 *l1, const uint32_t *hs, uint32_t n);
/* Remove from the table (skip_l1, delete); memory goes when unreferenced. */
void kvt_l1_drop(struct kvt_l1 *l1, uint32_t h);
/* Remove a key if present; returns true if it was. */
bool kvt_l1_delete(struct kvt_l1 *l1, const kvt_key *k);
/* delete's rule: remove a READY key unless a read lease locks it.
 * Returns 1 (removed), 0 (not in L1) or -EBUSY (locked: left in place). */
int kvt_l1_delete_unleased(struct kvt_l1 *l1, const kvt_key *k);

/* ---- leases ---- */

enum kvt_lease_kind { KVT_LEASE_READ = 0, KVT_LEASE_WRITE = 1 };

/* A lease named by another connection than the one that took it (the
 * protocol answers -EPERM), or by a retrieve of other keys (E_BADREQ). */
#define KVT_E_LEASE_OWNER (-EPERM)
#define KVT_E_LEASE_KEYS KVT_E_BADREQ

/* Who may use a lease: the bytes of the connection's routing id (the server
 * passes the request's identity frame). A lease is used only with the same
 * bytes it was taken with; NULL is the empty owner. */
struct kvt_l1_owner {
    const void *id;
    uint32_t len;
};

/* Lease ids are random 64-bit values (getrandom), unique among live leases
 * and never 0: another connection cannot guess one, and an id kept from an
 * earlier server instance names nothing in this one. */

/* Move n references (already held by the caller) into a new lease owned by
 * owner. A read lease locks its objects against kvt_l1_delete_unleased. */
uint64_t kvt_l1_lease_new(struct kvt_l1 *l1, enum kvt_lease_kind kind, const uint32_t *hs,
                          uint32_t n, const struct kvt_l1_owner *owner);
/* Size of a live lease, copying up to cap handles into hs (hs may be NULL
 * when cap is 0). Returns the lease's size, KVT_E_EXPIRED (unknown or
 * expired) or KVT_E_LEASE_OWNER (another connection's lease: untouched). */
int kvt_l1_lease_handles(struct kvt_l1 *l1, uint64_t id, enum kvt_lease_kind kind,
                         const struct kvt_l1_owner *owner, uint32_t *hs, uint32_t cap);
/* End a lease. READ: drop its references. WRITE: commit objects whose bit is
 * set in written (may be NULL = all), abort the rest; references dropped.
 * keep (optional): for a WRITE lease, receives the committed handles with a
 * reference each, for the store controller. Returns the number committed
 * (WRITE) or 0 (READ), KVT_E_EXPIRED if the lease is unknown/expired, or
 * KVT_E_LEASE_OWNER (nothing done) if owner is not the lease's. */
int kvt_l1_lease_end(struct kvt_l1 *l1, uint64_t id, enum kvt_lease_kind kind,
                     const struct kvt_l1_owner *owner, const uint64_t *written, uint32_t *keep,
                     uint32_t keep_cap);
/* End a lease of either kind with nothing published: a READ lease drops
 * its references, a WRITE lease aborts every reservation. 0, KVT_E_EXPIRED
 * or KVT_E_LEASE_OWNER (nothing done). */
int kvt_l1_lease_drop(struct kvt_l1 *l1, uint64_t id, const struct kvt_l1_owner *owner);
/* Serve a read lease to a retrieve of keys[0..n): the first min(n, lease
 * size) keys must be the lease's, in order. Then the lease's references
 * move into refs (one each, in order), the lease ends and the count is
 * returned. Otherwise nothing changes and the result is KVT_E_EXPIRED,
 * KVT_E_LEASE_OWNER or KVT_E_LEASE_KEYS (the keys differ). */
int kvt_l1_lease_take(struct kvt_l1 *l1, uint64_t id, const struct kvt_l1_owner *owner,
                      const kvt_key *keys, uint32_t n, struct kvt_l1_ref *refs);
/* Expire leases whose TTL passed; returns how many. */
uint32_t kvt_l1_expire(struct kvt_l1 *l1);

/* ---- walks ---- */

/* A READY object as kvt_l1_scan shows it. */
struct kvt_l1_entry {
    kvt_key key;
    uint32_t len;  /* payload bytes */
    uint32_t refs; /* references held (leases, transfers, pins) */
    bool temp;     /* freed when its last reference goes */
};
/* Visit READY objects from handle *cursor on (0: the start), under the
 * lock: visit must be short and must not call into L1. It returns false
 * to stop; *cursor then names the next handle. Returns true when the end
 * of the table was reached. */
bool kvt_l1_scan(struct kvt_l1 *l1, uint32_t *cursor,
                 bool (*visit)(const struct kvt_l1_entry *e, void *arg), void *arg);

/* ---- eviction, usage, status ---- */

/* Called (without the lock) when a reservation leaves usage at or above the
 * watermark, so the eviction thread runs now instead of at its next tick. */
void kvt_l1_set_pressure_hook(struct kvt_l1 *l1, void (*fn)(void *), void *arg);

/* Tier events (key/tierev.h): from now on every object published for
 * keeps (not a temporary one) is announced KVT_TIER_STORED, and each of
 * those is announced KVT_TIER_REMOVED when it leaves the table (eviction,
 * delete, drop, purge). The hook runs with l1->lock held. Call once, on an
 * empty pool, before objects are stored. */
void kvt_l1_set_event_hook(struct kvt_l1 *l1, const struct kvt_tier_hook *hook);

/* Evict unreferenced READY objects in policy order until used <= target. */
uint64_t kvt_l1_evict_to(struct kvt_l1 *l1, uint64_t target);
/* Run one watermark cycle: if usage >= watermark, evict down to
 * used * (1 - ratio). Returns bytes freed. */
uint64_t kvt_l1_evict_cycle(struct kvt_l1 *l1);

struct kvt_l1_usage {
    uint64_t used_bytes, cap_bytes, backed_bytes;
    uint64_t objects, objects_writing;
    double fraction, fragmentation;
};
void kvt_l1_usage(struct kvt_l1 *l1, struct kvt_l1_usage *u);
json_t *kvt_l1_status(struct kvt_l1 *l1);

struct kvt_l1_counters {
    uint64_t hits, misses, stores, store_full, evictions, evicted_bytes;
    /* writes of a key another writer published while they were under way:
     * the first publisher's copy is kept, theirs dropped */
    uint64_t stores_raced;
    uint64_t leases_expired_read, leases_expired_write, quarantined_bytes;
};
void kvt_l1_counters(struct kvt_l1 *l1, struct kvt_l1_counters *c);

#endif
