/*
 * L1 leases: read and write leases over referenced objects, with random
 * ids, an owner (the connection that took it), a TTL per kind (expiry in
 * FIFO order) and an id hash.
 */
#include "l1/l1.h"
#include "l1/l1_int.h"
#include "common/log.h"
#include "common/util.h"
#include "policy/policy.h"
#include "key/kindex.h"
#include "kvtier/error.h"
#include "l1/palloc.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/memfd.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

static void fifo_unlink_locked(struct kvt_l1 *l1, uint32_t s)
{
    struct lease *L = &l1->leases[s];
    int k = L->kind;
    if (L->prev != NIL)
        l1->leases[L->prev].next = L->next;
    else
        l1->fifo_head[k] = L->next;
    if (L->next != NIL)
        l1->leases[L->next].prev = L->prev;
    else
        l1->fifo_tail[k] = L->prev;
}

static uint32_t lbucket_of(const struct kvt_l1 *l1, uint64_t id)
{
    return (uint32_t)(id ^ (id >> 32)) & (l1->nlbuckets - 1);
}

static struct lease *lease_lookup_locked(struct kvt_l1 *l1, uint64_t id)
{
    if (id == 0 || !l1->nlbuckets)
        return NULL;
    for (uint32_t s = l1->lbucket[lbucket_of(l1, id)]; s != NIL; s = l1->leases[s].hnext)
        if (l1->leases[s].id == id)
            return &l1->leases[s];
    return NULL;
}

/* One bucket per lease slot at least: chains stay short. */
static void lhash_grow_locked(struct kvt_l1 *l1)
{
    if (l1->nlbuckets >= l1->cap_leases)
        return;
    uint32_t nb = l1->nlbuckets ? l1->nlbuckets : 64;
    while (nb < l1->cap_leases)
        nb *= 2;
    free(l1->lbucket);
    l1->lbucket = kvt_xmalloc(nb * sizeof(uint32_t));
    l1->nlbuckets = nb;
    for (uint32_t b = 0; b < nb; b++)
        l1->lbucket[b] = NIL;
    for (uint32_t s = 0; s < l1->nleases_used; s++) {
        struct lease *L = &l1->leases[s];
        if (!L->id)
            continue;
        uint32_t b = lbucket_of(l1, L->id);
        L->hnext = l1->lbucket[b];
        l1->lbucket[b] = s;
    }
}

static void lhash_del_locked(struct kvt_l1 *l1, uint32_t s)
{
    uint32_t *pp = &l1->lbucket[lbucket_of(l1, l1->leases[s].id)];
    while (*pp != s)
        pp = &l1->leases[*pp].hnext;
    *pp = l1->leases[s].hnext;
}

/* A fresh lease id: 64 random bits (getrandom, fetched 64 ids at a time so a
 * lease costs no system call), not 0 and not a live lease's. */
static uint64_t lease_id_new_locked(struct kvt_l1 *l1)
{
    for (;;) {
        if (l1->nrnd == 0) {
            size_t got = 0;
            while (got < sizeof(l1->rnd)) {
                ssize_t r = getrandom((char *)l1->rnd + got, sizeof(l1->rnd) - got, 0);
                if (r < 0 && errno == EINTR)
                    continue;
                KVT_ASSERT(r > 0); /* the kernel's CSPRNG does not fail once seeded */
                got += (size_t)r;
            }
            l1->nrnd = KVT_ARRAY_LEN(l1->rnd);
        }
        uint64_t id = l1->rnd[--l1->nrnd];
        if (id != 0 && !lease_lookup_locked(l1, id))
            return id;
    }
}

static bool owner_eq(const struct lease *L, const struct kvt_l1_owner *o)
{
    uint32_t len = o ? o->len : 0;
    return L->owner_len == len && (len == 0 || memcmp(L->owner, o->id, len) == 0);
}

uint64_t kvt_l1_lease_new(struct kvt_l1 *l1, enum kvt_lease_kind kind, const uint32_t *hs,
                          uint32_t n, const struct kvt_l1_owner *owner)
{
    pthread_mutex_lock(&l1->lock);
    uint32_t s;
    if (l1->free_lease != NIL) {
        s = l1->free_lease;
        l1->free_lease = l1->leases[s].next;
    } else {
        if (l1->nleases_used == l1->cap_leases) {
            l1->cap_leases = l1->cap_leases ? l1->cap_leases * 2 : 64;
            l1->leases = kvt_xrealloc(l1->leases, l1->cap_leases * sizeof(struct lease));
        }
        s = l1->nleases_used++;
        l1->leases[s].hs = NULL;
        l1->leases[s].owner = NULL;
        l1->leases[s].id = 0;
        lhash_grow_locked(l1);
    }
    uint64_t id = lease_id_new_locked(l1);
    struct lease *L = &l1->leases[s];
    KVT_ASSERT(L->id == 0); /* a free slot: no live lease has it */
    L->id = id;
    uint32_t b = lbucket_of(l1, id);
    L->hnext = l1->lbucket[b];
    l1->lbucket[b] = s;
    L->kind = (uint8_t)kind;
    L->expire_ns = kvt_now_ns() + l1->ttl_ns[kind];
    L->n = n;
    L->hs = kvt_xrealloc(L->hs, (n ? n : 1) * sizeof(uint32_t));
    memcpy(L->hs, hs, n * sizeof(uint32_t));
    L->owner_len = owner ? owner->len : 0;
    L->owner = kvt_xrealloc(L->owner, L->owner_len ? L->owner_len : 1);
    if (L->owner_len)
        memcpy(L->owner, owner->id, L->owner_len);
    for (uint32_t i = 0; i < n; i++) {
        /* the lease holds the caller's reference to each object */
        KVT_ASSERT(obj(l1, hs[i])->refs > 0);
        if (kind == KVT_LEASE_READ)
            obj(l1, hs[i])->rleases++;
    }
    /* append to the kind's FIFO: constant TTL, so FIFO order = expiry order */
    L->next = NIL;
    L->prev = l1->fifo_tail[kind];
    if (L->prev != NIL)
        l1->leases[L->prev].next = s;
    else
        l1->fifo_head[kind] = s;
    l1->fifo_tail[kind] = s;
    l1->live_leases[kind]++;
    pthread_mutex_unlock(&l1->lock);
    return id;
}

/* The live lease id of kind usable by owner: *rc 0, or KVT_E_EXPIRED /
 * KVT_E_LEASE_OWNER with NULL. */
static struct lease *lease_find_locked(struct kvt_l1 *l1, uint64_t id, enum kvt_lease_kind kind,
                                       const struct kvt_l1_owner *owner, int *rc)
{
    struct lease *L = lease_lookup_locked(l1, id);
    if (!L || L->kind != kind) {
        *rc = KVT_E_EXPIRED;
        return NULL;
    }
    if (!owner_eq(L, owner)) {
        *rc = KVT_E_LEASE_OWNER;
        return NULL;
    }
    *rc = 0;
    return L;
}

/* A read lease stops locking its objects (before its references go). */
static void lease_unlock_locked(struct kvt_l1 *l1, struct lease *L)
{
    if (L->kind == KVT_LEASE_READ)
        for (uint32_t i = 0; i < L->n; i++) {
            KVT_ASSERT(obj(l1, L->hs[i])->rleases > 0);
            obj(l1, L->hs[i])->rleases--;
        }
}

/* Frees the slot; the caller dropped or moved the references first. */
static void lease_free_locked(struct kvt_l1 *l1, struct lease *L)
{
    uint32_t s = (uint32_t)(L - l1->leases);
    KVT_ASSERT(L->id != 0 && l1->live_leases[L->kind] > 0); /* live: ended once */
    fifo_unlink_locked(l1, s);
    lhash_del_locked(l1, s);
    l1->live_leases[L->kind]--;
    L->id = 0;
    L->next = l1->free_lease;
    l1->free_lease = s;
}

int kvt_l1_lease_handles(struct kvt_l1 *l1, uint64_t id, enum kvt_lease_kind kind,
                         const struct kvt_l1_owner *owner, uint32_t *hs, uint32_t cap)
{
    pthread_mutex_lock(&l1->lock);
    int rc;
    struct lease *L = lease_find_locked(l1, id, kind, owner, &rc);
    int n = L ? (int)L->n : rc;
    if (L && cap)
        memcpy(hs, L->hs, (size_t)KVT_MIN(L->n, cap) * sizeof(uint32_t));
    pthread_mutex_unlock(&l1->lock);
    return n;
}

int kvt_l1_lease_take(struct kvt_l1 *l1, uint64_t id, const struct kvt_l1_owner *owner,
                      const kvt_key *keys, uint32_t n, struct kvt_l1_ref *refs)
{
    pthread_mutex_lock(&l1->lock);
    int rc;
    struct lease *L = lease_find_locked(l1, id, KVT_LEASE_READ, owner, &rc);
    if (!L) {
        pthread_mutex_unlock(&l1->lock);
        return rc;
    }
    uint32_t lim = KVT_MIN(L->n, n);
    for (uint32_t i = 0; i < lim; i++) {
        struct l1_obj *o = obj(l1, L->hs[i]);
        /* the lease's reference keeps the object READY: only the key can differ */
        if (o->state != ST_READY || !kvt_key_eq(&o->key, &keys[i])) {
            pthread_mutex_unlock(&l1->lock);
            return KVT_E_LEASE_KEYS;
        }
    }
    lease_unlock_locked(l1, L);
    for (uint32_t i = 0; i < L->n; i++) {
        if (i < lim)
            kvt_l1_obj_fill_ref(l1, L->hs[i], &refs[i]); /* the lease's reference moves to refs */
        else
            kvt_l1_obj_put_locked(l1, L->hs[i]);
    }
    lease_free_locked(l1, L);
    pthread_mutex_unlock(&l1->lock);
    return (int)lim;
}

/* End L (found, owner checked): see kvt_l1_lease_end; none: a WRITE lease
 * publishes nothing, whatever written says. */
static int lease_end_locked(struct kvt_l1 *l1, struct lease *L, const uint64_t *written, bool none,
                            uint32_t *keep, uint32_t keep_cap)
{
    int committed = 0;
    if (L->kind == KVT_LEASE_WRITE) {
        for (uint32_t i = L->n; i-- > 0;) {
            uint32_t h = L->hs[i];
            struct l1_obj *o = obj(l1, h);
            if (o->state != ST_WRITING)
                continue;
            if (none || (written && !kvt_bm_test(written, i))) {
                kvt_l1_obj_unlink_locked(l1, h);
                continue;
            }
            if (!kvt_l1_obj_publish_locked(l1, h, i, L->n, false)) {
                /* another writer published the key first: the lease's
                 * reference moves to its object, which the caller keeps */
                uint32_t m = kvt_kindex_find(&l1->map, &o->key);
                obj(l1, m)->refs++;
                kvt_l1_obj_put_locked(l1, h);
                L->hs[i] = m;
            }
            committed++; /* held now: ours, or the first publisher's */
        }
        /* hand references to the caller in request order */
        uint32_t kept = 0;
        for (uint32_t i = 0; i < L->n; i++) {
            struct l1_obj *o = obj(l1, L->hs[i]);
            kvt_l1_obj_announce_locked(l1, L->hs[i]); /* in request order */
            if (keep && kept < keep_cap && o->state == ST_READY &&
                (!written || kvt_bm_test(written, i))) {
                keep[kept++] = L->hs[i]; /* the lease's reference moves to the caller */
                continue;
            }
            kvt_l1_obj_put_locked(l1, L->hs[i]);
        }
    } else {
        lease_unlock_locked(l1, L);
        for (uint32_t i = 0; i < L->n; i++)
            kvt_l1_obj_put_locked(l1, L->hs[i]);
    }
    lease_free_locked(l1, L);
    return committed;
}

int kvt_l1_lease_end(struct kvt_l1 *l1, uint64_t id, enum kvt_lease_kind kind,
                     const struct kvt_l1_owner *owner, const uint64_t *written, uint32_t *keep,
                     uint32_t keep_cap)
{
    pthread_mutex_lock(&l1->lock);
    int rc;
    struct lease *L = lease_find_locked(l1, id, kind, owner, &rc);
    if (L)
        rc = lease_end_locked(l1, L, written, false, keep, keep_cap);
    pthread_mutex_unlock(&l1->lock);
    return rc;
}

int kvt_l1_lease_drop(struct kvt_l1 *l1, uint64_t id, const struct kvt_l1_owner *owner)
{
    pthread_mutex_lock(&l1->lock);
    int rc;
    struct lease *K = lease_lookup_locked(l1, id);
    struct lease *L = lease_find_locked(l1, id, K ? K->kind : KVT_LEASE_READ, owner, &rc);
    if (L)
        lease_end_locked(l1, L, NULL, true, NULL, 0);
    pthread_mutex_unlock(&l1->lock);
    return rc;
}

/* A lease ends without its holder (expiry). */
static void lease_abandon_locked(struct kvt_l1 *l1, struct lease *L)
{
    int k = L->kind;
    lease_unlock_locked(l1, L);
    for (uint32_t i = 0; i < L->n; i++) {
        struct l1_obj *o = obj(l1, L->hs[i]);
        /* the holder may still touch this memory: quarantine it */
        o->flags |= F_QUARANTINE;
        if (k == KVT_LEASE_WRITE && o->state == ST_WRITING)
            kvt_l1_obj_unlink_locked(l1, L->hs[i]);
        kvt_l1_obj_put_locked(l1, L->hs[i]);
    }
    lease_free_locked(l1, L);
}

uint32_t kvt_l1_expire(struct kvt_l1 *l1)
{
    uint64_t now = kvt_now_ns();
    uint32_t n = 0;
    pthread_mutex_lock(&l1->lock);
    for (int k = 0; k < 2; k++) {
        while (l1->fifo_head[k] != NIL && l1->leases[l1->fifo_head[k]].expire_ns <= now) {
            if (k == KVT_LEASE_READ)
                l1->c.leases_expired_read++;
            else
                l1->c.leases_expired_write++;
            lease_abandon_locked(l1, &l1->leases[l1->fifo_head[k]]);
            n++;
        }
    }
    kvt_l1_quarantine_release_locked(l1, now);
    pthread_mutex_unlock(&l1->lock);
    if (n)
        kvt_info("L1: %u lease(s) expired; their memory is quarantined for one TTL", n);
    return n;
}
