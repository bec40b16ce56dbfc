/*
 * L1 memory tier: the pool (one shared-memory mapping, grown on demand when
 * lazy), create and destroy, eviction to a target, usage and status. The
 * object table and references are in l1_obj.c, leases in l1_lease.c.
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
bool kvt_l1_pool_grow_locked(struct kvt_l1 *l1)
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

/* -------------------------------------------------------- eviction */

/* Pages allocated to objects or quarantined (backed pages not free). */
uint64_t kvt_l1_used_pages_locked(struct kvt_l1 *l1)
{
    return l1->pa.total - l1->pa.free_pages;
}

uint64_t kvt_l1_evict_to(struct kvt_l1 *l1, uint64_t target)
{
    uint64_t freed = 0;
    pthread_mutex_lock(&l1->lock);
    for (;;) {
        uint64_t used = kvt_l1_used_pages_locked(l1) * l1->align;
        if (used <= target)
            break;
        uint64_t want = KVT_ALIGN_UP(used - target, l1->align) / l1->align;
        uint64_t got = kvt_l1_evict_batch_locked(l1, want);
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
    u->used_bytes = kvt_l1_used_pages_locked(l1) * l1->align;
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
