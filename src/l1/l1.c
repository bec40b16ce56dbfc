/* L1 memory tier: pool, object table, references, leases, eviction. */
#include "l1/l1.h"
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
 * that writer has not published yet, else it is dropped (publish_locked) */
enum { F_TEMP = 1, F_TRACKED = 2, F_QUARANTINE = 4, F_UNMAPPED = 8 };

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
};

static uint64_t used_pages_locked(struct kvt_l1 *l1);

/* ------------------------------------------------------------ pool */

static int pool_resize_locked(struct kvt_l1 *l1, uint64_t bytes)
{
    if (bytes > l1->map_size)
        bytes = l1->map_size;
    if (bytes <= l1->cur_size)
        return 0;
    /* a named pool has its full size from the start (openers map it all) */
    if (!l1->shm_name && ftruncate(l1->fd, (off_t)bytes) < 0)
        return -errno;
    l1->cur_size = bytes;
    kvt_palloc_grow(&l1->pa, bytes / l1->align);
    return 0;
}

/* Double the backed size of a lazy pool (up to the configured size). */
static bool pool_grow_locked(struct kvt_l1 *l1)
{
    if (!l1->lazy || l1->cur_size >= l1->map_size)
        return false;
    uint64_t next = KVT_MAX(l1->cur_size * 2, l1->cur_size + 64ull * 1024 * 1024);
    next = KVT_ALIGN_UP(next, l1->huge ? 2ull * 1024 * 1024 : l1->align);
    int rc = pool_resize_locked(l1, next);
    if (rc) {
        kvt_warn("L1: cannot grow the pool to %llu bytes: %s", (unsigned long long)next,
                 kvt_strerror(rc));
        return false;
    }
    kvt_debug("L1: pool grown to %llu bytes", (unsigned long long)l1->cur_size);
    return true;
}

uint64_t kvt_l1_max_bytes(uint32_t align)
{
    return ((uint64_t)(UINT32_MAX - 1) * align) & ~(2ull * 1024 * 1024 - 1);
}

int kvt_l1_create(const struct kvt_l1_opts *o, struct kvt_l1 **out, char *err, size_t errcap)
{
    if (o->align == 0 || (o->align & (o->align - 1)) || o->align < 512) {
        snprintf(err, errcap, "--l1-align-bytes must be a power of two >= 512 (got %u)", o->align);
        return KVT_E_CONFIG;
    }
    uint64_t gran = o->hugepages ? 2ull * 1024 * 1024 : o->align;
    gran = KVT_MAX(gran, o->align);
    uint64_t size = KVT_ALIGN_UP(o->size_bytes, gran);
    if (size == 0 || size > kvt_l1_max_bytes(o->align)) {
        snprintf(err, errcap, "--l1-size-gb out of range");
        return KVT_E_CONFIG;
    }
    struct kvt_l1 *l1 = kvt_xcalloc(1, sizeof(*l1));
    pthread_mutex_init(&l1->lock, NULL);
    l1->fd = -1;
    l1->align = o->align;
    l1->lazy = o->lazy;
    l1->huge = o->hugepages;
    l1->map_size = size;
    l1->size_bytes = size;
    l1->watermark = o->watermark;
    l1->ratio = o->ratio;
    l1->ttl_ns[KVT_LEASE_READ] = o->read_ttl_ns;
    l1->ttl_ns[KVT_LEASE_WRITE] = o->write_ttl_ns;
    l1->free_obj = NIL;
    l1->free_lease = NIL;
    for (int k = 0; k < 2; k++)
        l1->fifo_head[k] = l1->fifo_tail[k] = NIL;
    kvt_palloc_init(&l1->pa);
    kvt_kindex_init(&l1->map, sizeof(struct l1_obj), offsetof(struct l1_obj, key));
    int rc = 0;
    if (o->shm_name) {
        char path[256];
        if (o->hugepages || snprintf(path, sizeof(path), "/%s", o->shm_name) >= (int)sizeof(path) ||
            strchr(o->shm_name, '/') || !o->shm_name[0]) {
            snprintf(err, errcap, "L1 shared-memory name \"%s\" is invalid%s", o->shm_name,
                     o->hugepages ? " with huge pages" : "");
            rc = KVT_E_CONFIG;
            goto fail;
        }
        l1->fd = shm_open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (l1->fd < 0) {
            rc = -errno;
            snprintf(err, errcap, "cannot create the L1 shared memory /dev/shm/%s: %s%s",
                     o->shm_name, kvt_strerror(-errno),
                     errno == EEXIST ? " (another server uses that name, or a crashed one left "
                                       "it: remove it or choose another --lmcache-shm-name)"
                                     : "");
            goto fail;
        }
        l1->shm_name = kvt_xstrdup(o->shm_name);
        if (ftruncate(l1->fd, (off_t)size) < 0) {
            rc = -errno;
            snprintf(err, errcap, "cannot size the L1 shared memory /dev/shm/%s: %s", o->shm_name,
                     kvt_strerror(-errno));
            goto fail;
        }
    } else {
        l1->fd = memfd_create("kvtier-l1", MFD_CLOEXEC | (o->hugepages ? MFD_HUGETLB : 0));
    }
    if (l1->fd < 0) {
        rc = -errno;
        snprintf(err, errcap, "cannot create the L1 shared memory%s: %s",
                 o->hugepages ? " with huge pages (is vm.nr_hugepages set?)" : "",
                 kvt_strerror(-errno));
        goto fail;
    }
    fchmod(l1->fd, 0600);
    /* Huge pages are allocated up front: a hugetlb page that is not there at
     * fault time is a SIGBUS, not an allocation failure, so a pool that grows
     * lazily (or is mapped without its reservation) could crash later. */
    if (o->hugepages)
        l1->lazy = false;
    l1->base = mmap(NULL, size, PROT_READ | PROT_WRITE,
                    MAP_SHARED | (o->hugepages ? 0 : MAP_NORESERVE), l1->fd, 0);
    if (l1->base == MAP_FAILED) {
        rc = -errno;
        l1->base = NULL;
        snprintf(err, errcap, "cannot map %llu bytes of L1%s: %s", (unsigned long long)size,
                 o->hugepages ? " in huge pages (reserve them: sysctl vm.nr_hugepages)" : "",
                 kvt_strerror(-errno));
        goto fail;
    }
    uint64_t init =
        l1->lazy ? KVT_MIN(KVT_ALIGN_UP(KVT_MAX(o->init_bytes, gran), gran), size) : size;
    rc = pool_resize_locked(l1, init);
    if (!rc && !l1->lazy && fallocate(l1->fd, 0, 0, (off_t)size) < 0)
        rc = -errno;
    if (rc) {
        snprintf(err, errcap, "cannot allocate %llu bytes of L1 memory%s: %s",
                 (unsigned long long)init,
                 o->hugepages ? " in huge pages (reserve them: sysctl vm.nr_hugepages)" : "",
                 kvt_strerror(rc));
        goto fail;
    }
    struct stat st;
    fstat(l1->fd, &st);
    l1->dev = st.st_dev;
    l1->ino = st.st_ino;
    /* a random identity for this pool, and a random start for lease ids, so
     * nothing a client kept from an earlier server instance can be mistaken
     * for something of this one */
    if (getrandom(&l1->pool_id, sizeof(l1->pool_id), 0) != sizeof(l1->pool_id))
        l1->pool_id = kvt_now_ns() ^ ((uint64_t)getpid() << 32);
    l1->pool_id |= 1; /* never 0 */
    l1->policy = kvt_policy_create(o->policy ? o->policy : "LRU", o->watermark, o->ratio);
    if (!l1->policy) {
        snprintf(err, errcap, "--eviction-policy: unknown policy \"%s\" (known: %s)", o->policy,
                 kvt_policy_names());
        rc = KVT_E_CONFIG;
        goto fail;
    }
    *out = l1;
    return 0;
fail:
    kvt_l1_destroy(l1);
    return rc ? rc : KVT_E_CONFIG;
}

void kvt_l1_destroy(struct kvt_l1 *l1)
{
    if (!l1)
        return;
    if (l1->base)
        munmap(l1->base, l1->map_size);
    if (l1->fd >= 0)
        close(l1->fd);
    if (l1->shm_name) {
        char path[256];
        snprintf(path, sizeof(path), "/%s", l1->shm_name);
        shm_unlink(path);
        free(l1->shm_name);
    }
    for (uint32_t i = 0; i < l1->nleases_used; i++) {
        free(l1->leases[i].hs);
        free(l1->leases[i].owner);
    }
    free(l1->leases);
    free(l1->lbucket);
    free(l1->objs);
    free(l1->q);
    kvt_kindex_free(&l1->map);
    kvt_palloc_destroy(&l1->pa);
    kvt_policy_destroy(l1->policy);
    pthread_mutex_destroy(&l1->lock);
    free(l1);
}

void kvt_l1_shm(struct kvt_l1 *l1, struct kvt_l1_shm *s)
{
    pthread_mutex_lock(&l1->lock);
    s->fd = l1->fd;
    s->base = l1->base;
    s->map_size = l1->map_size;
    s->cur_size = l1->cur_size;
    s->dev = l1->dev;
    s->ino = l1->ino;
    s->pool_id = l1->pool_id;
    s->align = l1->align;
    pthread_mutex_unlock(&l1->lock);
}

uint64_t kvt_l1_pool_id(const struct kvt_l1 *l1)
{
    return l1->pool_id;
}

/* --------------------------------------------------------- objects */

static struct l1_obj *obj(struct kvt_l1 *l1, uint32_t h)
{
    return &l1->objs[h];
}

/* o leaves one of the states in from (FROM bits) for to. */
static void obj_set_state(struct l1_obj *o, unsigned from, uint8_t to)
{
    KVT_ASSERT(from & FROM(o->state));
    o->state = to;
}

static uint32_t obj_new_locked(struct kvt_l1 *l1)
{
    uint32_t h;
    if (l1->free_obj != NIL) {
        h = l1->free_obj;
        l1->free_obj = l1->objs[h].next_free;
    } else {
        if (l1->hwm == l1->cap_objs) {
            l1->cap_objs = l1->cap_objs ? l1->cap_objs * 2 : 1024;
            l1->objs = kvt_xrealloc(l1->objs, (size_t)l1->cap_objs * sizeof(struct l1_obj));
            l1->map.base = (const char *)l1->objs;
            kvt_policy_reserve(l1->policy, l1->cap_objs);
        }
        h = l1->hwm++;
    }
    memset(&l1->objs[h], 0, sizeof(struct l1_obj));
    return h;
}

static void quarantine_push_locked(struct kvt_l1 *l1, uint32_t page, uint32_t npages)
{
    if (l1->q_tail - l1->q_head == l1->q_cap) {
        uint32_t ncap = l1->q_cap ? l1->q_cap * 2 : 64;
        struct quarantined *nq = kvt_xmalloc(ncap * sizeof(*nq));
        for (uint32_t i = l1->q_head; i != l1->q_tail; i++)
            nq[i - l1->q_head] = l1->q[i % l1->q_cap];
        free(l1->q);
        l1->q = nq;
        l1->q_tail -= l1->q_head;
        l1->q_head = 0;
        l1->q_cap = ncap;
    }
    uint64_t ttl = KVT_MAX(l1->ttl_ns[0], l1->ttl_ns[1]);
    l1->q[l1->q_tail++ % l1->q_cap] = (struct quarantined){page, npages, kvt_now_ns() + ttl};
    l1->q_pages += npages;
    l1->c.quarantined_bytes += (uint64_t)npages * l1->align;
}

static void quarantine_release_locked(struct kvt_l1 *l1, uint64_t now)
{
    while (l1->q_head != l1->q_tail) {
        struct quarantined *q = &l1->q[l1->q_head % l1->q_cap];
        if (q->until_ns > now)
            break;
        kvt_palloc_free(&l1->pa, q->page, q->npages);
        l1->q_pages -= q->npages;
        l1->q_head++;
    }
}

/* Return an unreferenced object's memory and slot. */
static void obj_free_locked(struct kvt_l1 *l1, uint32_t h)
{
    struct l1_obj *o = obj(l1, h);
    KVT_ASSERT(o->refs == 0);
    uint32_t page = (uint32_t)(o->off / l1->align);
    if (o->flags & F_QUARANTINE)
        quarantine_push_locked(l1, page, o->npages);
    else
        kvt_palloc_free(&l1->pa, page, o->npages);
    obj_set_state(o, FROM(ST_DEAD), ST_FREE);
    o->next_free = l1->free_obj;
    l1->free_obj = h;
}

/* Take an object out of the table (it becomes DEAD or is freed now). */
static void obj_unlink_locked(struct kvt_l1 *l1, uint32_t h)
{
    struct l1_obj *o = obj(l1, h);
    if (o->state != ST_WRITING && o->state != ST_READY)
        return;
    if (o->state == ST_READY)
        l1->nready--;
    else
        l1->nwriting--;
    if (!(o->flags & F_UNMAPPED))
        kvt_kindex_del(&l1->map, h);
    if (o->flags & F_TRACKED) {
        kvt_policy_remove(l1->policy, h);
        o->flags &= (uint8_t)~F_TRACKED;
    }
    obj_set_state(o, FROM(ST_WRITING) | FROM(ST_READY), ST_DEAD);
    if (o->refs == 0)
        obj_free_locked(l1, h);
}

static void put_locked(struct kvt_l1 *l1, uint32_t h)
{
    struct l1_obj *o = obj(l1, h);
    KVT_ASSERT(o->refs > 0);
    if (--o->refs)
        return;
    if (o->state == ST_DEAD)
        obj_free_locked(l1, h);
    else if (o->state == ST_READY && (o->flags & F_TEMP))
        obj_unlink_locked(l1, h);
}

struct victims {
    struct kvt_l1 *l1;
    uint32_t hs[64];
    uint32_t n;
    uint64_t want, pages; /* pages wanted, pages the victims hold */
};

static bool pick_victim(uint32_t h, void *arg)
{
    struct victims *v = arg;
    struct l1_obj *o = obj(v->l1, h);
    if (o->state == ST_READY && o->refs == 0) {
        v->hs[v->n++] = h;
        v->pages += o->npages;
    }
    return v->n < KVT_ARRAY_LEN(v->hs) && v->pages < v->want; /* stop once enough */
}

/* Evict unreferenced objects in policy order until want_pages are freed (at
 * most 64 per call); returns pages freed. */
static uint64_t evict_batch_locked(struct kvt_l1 *l1, uint64_t want_pages)
{
    struct victims v = {.l1 = l1, .want = want_pages};
    l1->policy->ops->walk(l1->policy, pick_victim, &v);
    uint64_t freed = 0;
    for (uint32_t i = 0; i < v.n && freed < want_pages; i++) {
        struct l1_obj *o = obj(l1, v.hs[i]);
        freed += o->npages;
        l1->c.evictions++;
        l1->c.evicted_bytes += o->meta.len;
        obj_unlink_locked(l1, v.hs[i]);
    }
    return freed;
}

static int reserve(struct kvt_l1 *l1, const kvt_key *k, const kvt_objmeta *meta,
                   struct kvt_l1_ref *out, bool beside)
{
    uint64_t pages = KVT_MAX(1, KVT_ALIGN_UP((uint64_t)meta->len, l1->align) / l1->align);
    if ((uint64_t)meta->len > KVT_MAX_OBJECT || pages * l1->align > l1->map_size)
        return KVT_E_TOOBIG;
    pthread_mutex_lock(&l1->lock);
    uint32_t have = kvt_kindex_find(&l1->map, k);
    if (have != KVT_NOHANDLE && (obj(l1, have)->state == ST_READY || !beside)) {
        /* stored again: the engine is using this prefix, as good as a read */
        if (obj(l1, have)->flags & F_TRACKED)
            kvt_policy_access(l1->policy, have);
        pthread_mutex_unlock(&l1->lock);
        return -EEXIST;
    }
    /* being written by another (not yet published): this writer gets its
     * own object too, and the first to publish wins (publish_locked); told
     * "present" instead, it would count a key its first writer may still
     * give up */
    uint32_t page;
    int rc;
    for (;;) {
        rc = kvt_palloc_alloc(&l1->pa, (uint32_t)pages, &page);
        if (rc == 0)
            break;
        if (pool_grow_locked(l1))
            continue;
        quarantine_release_locked(l1, kvt_now_ns());
        if (kvt_palloc_alloc(&l1->pa, (uint32_t)pages, &page) == 0) {
            rc = 0;
            break;
        }
        /* only what this object needs (more when fragmentation leaves the
         * freed pages unusable: the loop comes back), not a whole batch */
        if (evict_batch_locked(l1, pages) == 0)
            break; /* nothing evictable left */
    }
    if (rc) {
        l1->c.store_full++;
        pthread_mutex_unlock(&l1->lock);
        return KVT_E_FULL;
    }
    uint32_t h = obj_new_locked(l1);
    struct l1_obj *o = obj(l1, h);
    o->key = *k;
    o->off = (uint64_t)page * l1->align;
    o->npages = (uint32_t)pages;
    o->meta = *meta;
    o->refs = 1;
    obj_set_state(o, FROM(ST_FREE), ST_WRITING);
    if (have == KVT_NOHANDLE)
        kvt_kindex_put(&l1->map, h);
    else
        o->flags |= F_UNMAPPED;
    l1->nwriting++;
    out->h = h;
    out->off = o->off;
    out->ptr = l1->base + o->off;
    out->meta = o->meta;
    bool pressure =
        (double)used_pages_locked(l1) * l1->align >= l1->watermark * (double)l1->size_bytes;
    pthread_mutex_unlock(&l1->lock);
    if (pressure && l1->pressure_fn)
        l1->pressure_fn(l1->pressure_arg);
    return 0;
}

static void fill_ref(struct kvt_l1 *l1, uint32_t h, struct kvt_l1_ref *r);

/* WRITING h (position pos of a commit of n) becomes READY under its key.
 * The first publisher wins: an object reserved while another writer held
 * the key (F_UNMAPPED) takes it over if that writer has not published (the
 * other becomes unmapped in turn, and loses at its own publish), and is
 * dropped if it has. false: dropped (the key is held, by the other). */
static bool publish_locked(struct kvt_l1 *l1, uint32_t h, uint32_t pos, uint32_t n, bool temp)
{
    struct l1_obj *o = obj(l1, h);
    if (o->flags & F_UNMAPPED) {
        uint32_t m = kvt_kindex_find(&l1->map, &o->key);
        if (m != KVT_NOHANDLE && obj(l1, m)->state == ST_READY) {
            obj_unlink_locked(l1, h);
            l1->c.stores_raced++;
            return false;
        }
        if (m != KVT_NOHANDLE) {
            kvt_kindex_del(&l1->map, m);
            obj(l1, m)->flags |= F_UNMAPPED;
        }
        o->flags &= (uint8_t)~F_UNMAPPED;
        kvt_kindex_put(&l1->map, h);
    }
    obj_set_state(o, FROM(ST_WRITING), ST_READY);
    l1->nwriting--;
    l1->nready++;
    l1->c.stores++;
    if (temp) {
        o->flags |= F_TEMP;
    } else {
        struct kvt_policy_hint hint = {
            .prefix_pos = pos, .prefix_len = n, .bytes = o->meta.len, .fp = kvt_key_hash(&o->key)};
        kvt_policy_insert(l1->policy, h, false, &hint);
        o->flags |= F_TRACKED;
    }
    return true;
}

int kvt_l1_reserve(struct kvt_l1 *l1, const kvt_key *k, const kvt_objmeta *meta,
                   struct kvt_l1_ref *out)
{
    return reserve(l1, k, meta, out, true);
}

int kvt_l1_reserve_free(struct kvt_l1 *l1, const kvt_key *k, const kvt_objmeta *meta,
                        struct kvt_l1_ref *out)
{
    return reserve(l1, k, meta, out, false);
}

void kvt_l1_commit(struct kvt_l1 *l1, const uint32_t *hs, uint32_t n, unsigned flags)
{
    pthread_mutex_lock(&l1->lock);
    for (uint32_t i = n; i-- > 0;)
        if (obj(l1, hs[i])->state == ST_WRITING)
            publish_locked(l1, hs[i], i, n, (flags & KVT_L1_TEMP) != 0);
    pthread_mutex_unlock(&l1->lock);
}

bool kvt_l1_winner(struct kvt_l1 *l1, struct kvt_l1_ref *r)
{
    pthread_mutex_lock(&l1->lock);
    struct l1_obj *o = obj(l1, r->h);
    bool ok = o->state == ST_READY;
    if (!ok) { /* dropped at its publish: the key's READY object won */
        uint32_t m = kvt_kindex_find(&l1->map, &o->key);
        ok = m != KVT_NOHANDLE && obj(l1, m)->state == ST_READY;
        if (ok) {
            uint32_t old = r->h;
            obj(l1, m)->refs++;
            fill_ref(l1, m, r);
            put_locked(l1, old);
        }
    }
    pthread_mutex_unlock(&l1->lock);
    return ok;
}

void kvt_l1_set_meta(struct kvt_l1 *l1, uint32_t h, const kvt_objmeta *meta)
{
    pthread_mutex_lock(&l1->lock);
    struct l1_obj *o = obj(l1, h);
    if (o->state == ST_WRITING && meta->len == o->meta.len)
        o->meta = *meta;
    pthread_mutex_unlock(&l1->lock);
}

void kvt_l1_abort(struct kvt_l1 *l1, uint32_t h)
{
    pthread_mutex_lock(&l1->lock);
    if (obj(l1, h)->state == ST_WRITING)
        obj_unlink_locked(l1, h);
    pthread_mutex_unlock(&l1->lock);
}

static void fill_ref(struct kvt_l1 *l1, uint32_t h, struct kvt_l1_ref *r)
{
    struct l1_obj *o = obj(l1, h);
    r->h = h;
    r->off = o->off;
    r->ptr = l1->base + o->off;
    r->meta = o->meta;
}

int kvt_l1_get(struct kvt_l1 *l1, const kvt_key *k, struct kvt_l1_ref *out)
{
    pthread_mutex_lock(&l1->lock);
    uint32_t h = kvt_kindex_find(&l1->map, k);
    if (h == KVT_NOHANDLE || obj(l1, h)->state != ST_READY) {
        l1->c.misses++;
        pthread_mutex_unlock(&l1->lock);
        return -ENOENT;
    }
    l1->c.hits++;
    obj(l1, h)->refs++;
    fill_ref(l1, h, out);
    pthread_mutex_unlock(&l1->lock);
    return 0;
}

void kvt_l1_describe(struct kvt_l1 *l1, uint32_t h, struct kvt_l1_ref *r, kvt_key *key)
{
    pthread_mutex_lock(&l1->lock);
    fill_ref(l1, h, r);
    if (key)
        *key = obj(l1, h)->key;
    pthread_mutex_unlock(&l1->lock);
}

int kvt_l1_get_handle(struct kvt_l1 *l1, uint32_t h, const kvt_key *key, struct kvt_l1_ref *out)
{
    int rc = -ENOENT;
    pthread_mutex_lock(&l1->lock);
    if (h < l1->hwm && obj(l1, h)->state == ST_READY && kvt_key_eq(&obj(l1, h)->key, key)) {
        obj(l1, h)->refs++;
        fill_ref(l1, h, out);
        rc = 0;
    }
    pthread_mutex_unlock(&l1->lock);
    return rc;
}

void kvt_l1_ref(struct kvt_l1 *l1, uint32_t h)
{
    pthread_mutex_lock(&l1->lock);
    obj(l1, h)->refs++;
    pthread_mutex_unlock(&l1->lock);
}

void kvt_l1_put(struct kvt_l1 *l1, uint32_t h)
{
    pthread_mutex_lock(&l1->lock);
    put_locked(l1, h);
    pthread_mutex_unlock(&l1->lock);
}

uint32_t kvt_l1_get_prefix(struct kvt_l1 *l1, const kvt_key *keys, uint32_t n,
                           struct kvt_l1_ref *refs)
{
    pthread_mutex_lock(&l1->lock);
    uint32_t i;
    for (i = 0; i < n; i++) {
        uint32_t h = kvt_kindex_find(&l1->map, &keys[i]);
        if (h == KVT_NOHANDLE || obj(l1, h)->state != ST_READY)
            break;
        if (refs) {
            obj(l1, h)->refs++;
            fill_ref(l1, h, &refs[i]);
        }
    }
    l1->c.hits += i;
    l1->c.misses += n - i;
    pthread_mutex_unlock(&l1->lock);
    return i;
}

bool kvt_l1_contains(struct kvt_l1 *l1, const kvt_key *k)
{
    pthread_mutex_lock(&l1->lock);
    uint32_t h = kvt_kindex_find(&l1->map, k);
    bool r = h != KVT_NOHANDLE && obj(l1, h)->state == ST_READY;
    pthread_mutex_unlock(&l1->lock);
    return r;
}

void kvt_l1_note_request(struct kvt_l1 *l1, const kvt_key *keys, uint32_t n)
{
    if (!n || !l1->policy || !l1->policy->ops->request)
        return;
    uint64_t *fps = kvt_xmalloc(n * sizeof(uint64_t));
    for (uint32_t i = 0; i < n; i++)
        fps[i] = kvt_key_hash(&keys[i]);
    pthread_mutex_lock(&l1->lock);
    kvt_policy_request(l1->policy, fps, n);
    pthread_mutex_unlock(&l1->lock);
    free(fps);
}

void kvt_l1_touch(struct kvt_l1 *l1, const uint32_t *hs, uint32_t n)
{
    pthread_mutex_lock(&l1->lock);
    for (uint32_t i = n; i-- > 0;)
        if (obj(l1, hs[i])->flags & F_TRACKED)
            kvt_policy_access(l1->policy, hs[i]);
    pthread_mutex_unlock(&l1->lock);
}

void kvt_l1_drop(struct kvt_l1 *l1, uint32_t h)
{
    pthread_mutex_lock(&l1->lock);
    obj_unlink_locked(l1, h);
    pthread_mutex_unlock(&l1->lock);
}

bool kvt_l1_delete(struct kvt_l1 *l1, const kvt_key *k)
{
    pthread_mutex_lock(&l1->lock);
    uint32_t h = kvt_kindex_find(&l1->map, k);
    bool found = h != KVT_NOHANDLE && obj(l1, h)->state == ST_READY;
    if (found)
        obj_unlink_locked(l1, h);
    pthread_mutex_unlock(&l1->lock);
    return found;
}

int kvt_l1_delete_unleased(struct kvt_l1 *l1, const kvt_key *k)
{
    pthread_mutex_lock(&l1->lock);
    uint32_t h = kvt_kindex_find(&l1->map, k);
    int rc = 0;
    if (h != KVT_NOHANDLE && obj(l1, h)->state == ST_READY) {
        if (obj(l1, h)->rleases) {
            rc = -EBUSY;
        } else {
            obj_unlink_locked(l1, h);
            rc = 1;
        }
    }
    pthread_mutex_unlock(&l1->lock);
    return rc;
}

void kvt_l1_set_pressure_hook(struct kvt_l1 *l1, void (*fn)(void *), void *arg)
{
    l1->pressure_fn = fn;
    l1->pressure_arg = arg;
}

/* ---------------------------------------------------------- leases */

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
            fill_ref(l1, L->hs[i], &refs[i]); /* the lease's reference moves to refs */
        else
            put_locked(l1, L->hs[i]);
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
                obj_unlink_locked(l1, h);
                continue;
            }
            if (!publish_locked(l1, h, i, L->n, false)) {
                /* another writer published the key first: the lease's
                 * reference moves to its object, which the caller keeps */
                uint32_t m = kvt_kindex_find(&l1->map, &o->key);
                obj(l1, m)->refs++;
                put_locked(l1, h);
                L->hs[i] = m;
            }
            committed++; /* held now: ours, or the first publisher's */
        }
        /* hand references to the caller in request order */
        uint32_t kept = 0;
        for (uint32_t i = 0; i < L->n; i++) {
            struct l1_obj *o = obj(l1, L->hs[i]);
            if (keep && kept < keep_cap && o->state == ST_READY &&
                (!written || kvt_bm_test(written, i))) {
                keep[kept++] = L->hs[i]; /* the lease's reference moves to the caller */
                continue;
            }
            put_locked(l1, L->hs[i]);
        }
    } else {
        lease_unlock_locked(l1, L);
        for (uint32_t i = 0; i < L->n; i++)
            put_locked(l1, L->hs[i]);
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
            obj_unlink_locked(l1, L->hs[i]);
        put_locked(l1, L->hs[i]);
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
    quarantine_release_locked(l1, now);
    pthread_mutex_unlock(&l1->lock);
    if (n)
        kvt_info("L1: %u lease(s) expired; their memory is quarantined for one TTL", n);
    return n;
}

/* -------------------------------------------------------- eviction */

/* Pages allocated to objects or quarantined (backed pages not free). */
static uint64_t used_pages_locked(struct kvt_l1 *l1)
{
    return l1->pa.total - l1->pa.free_pages;
}

uint64_t kvt_l1_evict_to(struct kvt_l1 *l1, uint64_t target)
{
    uint64_t freed = 0;
    pthread_mutex_lock(&l1->lock);
    for (;;) {
        uint64_t used = used_pages_locked(l1) * l1->align;
        if (used <= target)
            break;
        uint64_t want = KVT_ALIGN_UP(used - target, l1->align) / l1->align;
        uint64_t got = evict_batch_locked(l1, want);
        if (!got)
            break; /* the rest is referenced: retry next cycle */
        freed += got * l1->align;
    }
    pthread_mutex_unlock(&l1->lock);
    return freed;
}

uint64_t kvt_l1_evict_cycle(struct kvt_l1 *l1)
{
    struct kvt_l1_usage u;
    kvt_l1_usage(l1, &u);
    if (l1->watermark >= 1.0 || u.fraction < l1->watermark || u.used_bytes == 0)
        return 0;
    return kvt_l1_evict_to(l1, (uint64_t)((double)u.used_bytes * (1.0 - l1->ratio)));
}

void kvt_l1_usage(struct kvt_l1 *l1, struct kvt_l1_usage *u)
{
    pthread_mutex_lock(&l1->lock);
    u->used_bytes = used_pages_locked(l1) * l1->align;
    u->cap_bytes = l1->size_bytes;
    u->backed_bytes = l1->cur_size;
    u->objects = l1->nready;
    u->objects_writing = l1->nwriting;
    u->fragmentation = kvt_palloc_fragmentation(&l1->pa);
    pthread_mutex_unlock(&l1->lock);
    u->fraction = u->cap_bytes ? (double)u->used_bytes / (double)u->cap_bytes : 0;
}

void kvt_l1_counters(struct kvt_l1 *l1, struct kvt_l1_counters *c)
{
    pthread_mutex_lock(&l1->lock);
    *c = l1->c;
    pthread_mutex_unlock(&l1->lock);
}

json_t *kvt_l1_status(struct kvt_l1 *l1)
{
    struct kvt_l1_usage u;
    struct kvt_l1_counters c;
    kvt_l1_usage(l1, &u);
    kvt_l1_counters(l1, &c);
    pthread_mutex_lock(&l1->lock);
    uint32_t lr = l1->live_leases[0], lw = l1->live_leases[1];
    uint64_t qb = l1->q_pages * l1->align;
    uint64_t largest = kvt_palloc_largest(&l1->pa) * l1->align;
    uint32_t runs = l1->pa.live_runs;
    const char *pol = l1->policy->ops->name, *follow = kvt_policy_following(l1->policy);
    pthread_mutex_unlock(&l1->lock);
    json_t *o = json_object();
    json_object_set_new(o, "used_bytes", json_integer((json_int_t)u.used_bytes));
    json_object_set_new(o, "capacity_bytes", json_integer((json_int_t)u.cap_bytes));
    json_object_set_new(o, "backed_bytes", json_integer((json_int_t)u.backed_bytes));
    json_object_set_new(o, "usage_fraction", json_real(u.fraction));
    json_object_set_new(o, "objects", json_integer((json_int_t)u.objects));
    json_object_set_new(o, "objects_writing", json_integer((json_int_t)u.objects_writing));
    json_object_set_new(o, "fragmentation", json_real(u.fragmentation));
    json_object_set_new(o, "largest_free_bytes", json_integer((json_int_t)largest));
    json_object_set_new(o, "free_runs", json_integer(runs));
    json_object_set_new(o, "quarantined_bytes", json_integer((json_int_t)qb));
    json_object_set_new(o, "align_bytes", json_integer(l1->align));
    json_object_set_new(o, "lazy", json_boolean(l1->lazy));
    json_object_set_new(o, "hugepages", json_boolean(l1->huge));
    json_object_set_new(o, "eviction_policy", json_string(pol));
    json_object_set_new(o, "eviction_following", follow ? json_string(follow) : json_null());
    json_object_set_new(o, "trigger_watermark", json_real(l1->watermark));
    json_object_set_new(o, "eviction_ratio", json_real(l1->ratio));
    json_object_set_new(o, "read_leases", json_integer(lr));
    json_object_set_new(o, "write_leases", json_integer(lw));
    json_t *cn = json_object();
    json_object_set_new(cn, "hits", json_integer((json_int_t)c.hits));
    json_object_set_new(cn, "misses", json_integer((json_int_t)c.misses));
    json_object_set_new(cn, "stores", json_integer((json_int_t)c.stores));
    json_object_set_new(cn, "store_full", json_integer((json_int_t)c.store_full));
    json_object_set_new(cn, "stores_raced", json_integer((json_int_t)c.stores_raced));
    json_object_set_new(cn, "evictions", json_integer((json_int_t)c.evictions));
    json_object_set_new(cn, "evicted_bytes", json_integer((json_int_t)c.evicted_bytes));
    json_object_set_new(cn, "leases_expired_read", json_integer((json_int_t)c.leases_expired_read));
    json_object_set_new(cn, "leases_expired_write",
                        json_integer((json_int_t)c.leases_expired_write));
    json_object_set_new(o, "counters", cn);
    return o;
}
