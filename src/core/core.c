/*
 * The core (core.h): set-up and tear-down of the tiers and their threads,
 * and the calls the front ends share. The struct is private to this file:
 * front ends and the server hold a pointer.
 */
#include "core/core.h"
#include "common/log.h"
#include "common/util.h"
#include "evict/controller.h"
#include "kvtier/error.h"
#include "ops/cli.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct kvt_core {
    const struct kvt_core_opts *o;
    struct kvt_l1 *l1;
    kvt_l2 *l2s[KVT_MAX_ADAPTERS];
    int nl2;
    struct kvt_store_ctrl *sc;
    struct kvt_prefetch_ctrl *pc;
    struct kvt_evictor *ev_l1, *ev_l2[KVT_MAX_ADAPTERS];
    struct kvt_tpool *workers;
};

/* ------------------------------------------------- set-up, tear-down */

int kvt_core_open(const struct kvt_core_opts *o, struct kvt_core **out, char *err, size_t cap)
{
    struct kvt_core *c = kvt_xcalloc(1, sizeof(*c));
    c->o = o;
    *out = c;
    if (o->nadapters > KVT_MAX_ADAPTERS) {
        snprintf(err, cap, "at most %d L2 adapters", KVT_MAX_ADAPTERS);
        return KVT_E_CONFIG;
    }
    for (int i = 0; i < o->nadapters; i++) {
        int rc = kvt_l2_open(&o->adapters[i], &c->l2s[i], err, cap);
        if (rc)
            return rc;
        c->nl2 = i + 1;
        if (o->events) /* what its scan adopted already is announced here */
            kvt_l2_set_event_hook(c->l2s[i], &(struct kvt_tier_hook){
                                                 .fn = kvt_events_hook,
                                                 .arg = o->events,
                                                 .tier = 1 + i,
                                                 .tag_of = kvt_events_tag_of,
                                                 .tag = kvt_events_tag_hook,
                                             });
    }
    return 0;
}

static void kick_l1(void *ev)
{
    kvt_evictor_kick(ev);
}

int kvt_core_start(struct kvt_core *c, char *err, size_t cap)
{
    const struct kvt_core_opts *o = c->o;
    char l1err[1024];
    int rc = kvt_l1_create(&o->l1, &c->l1, l1err, sizeof(l1err));
    if (rc) {
        snprintf(err, cap, "L1: %s", l1err);
        return rc;
    }
    if (o->events)
        kvt_l1_set_event_hook(
            c->l1, &(struct kvt_tier_hook){.fn = kvt_events_hook, .arg = o->events, .tier = 0});
    rc = kvt_store_ctrl_start(&c->sc, c->l1, c->l2s, c->nl2, o->store_policy, o->on_store_progress,
                              o->progress_arg);
    if (!rc)
        rc = kvt_prefetch_ctrl_start(&c->pc, c->l1, c->l2s, c->nl2, o->prefetch_policy,
                                     o->prefetch_max_in_flight);
    if (!rc)
        rc = kvt_evictor_start_l1(&c->ev_l1, c->l1, o->eviction_interval_ms);
    if (!rc)
        kvt_l1_set_pressure_hook(c->l1, kick_l1, c->ev_l1);
    for (int i = 0; !rc && i < c->nl2; i++)
        rc = kvt_evictor_start_l2(&c->ev_l2[i], c->l2s[i], o->eviction_interval_ms);
    if (!rc)
        rc = kvt_tpool_create(&c->workers, "rpc-worker", o->max_workers, NULL, NULL, NULL);
    if (rc)
        snprintf(err, cap, "cannot start server threads: %s", kvt_strerror(rc));
    return rc;
}

void kvt_core_stop_fetching(struct kvt_core *c)
{
    if (c->workers) {
        kvt_tpool_destroy(c->workers); /* finishes queued jobs */
        c->workers = NULL;
    }
    if (c->pc) {
        kvt_prefetch_ctrl_stop(c->pc);
        c->pc = NULL;
    }
}

void kvt_core_drain_stores(struct kvt_core *c)
{
    if (!c->sc)
        return;
    uint64_t pend = kvt_store_ctrl_last_seq(c->sc) - kvt_store_ctrl_done_seq(c->sc);
    if (pend)
        kvt_info("draining %llu pending L2 store batch(es)", (unsigned long long)pend);
    kvt_store_ctrl_quiesce(c->sc);
}

void kvt_core_stop(struct kvt_core *c)
{
    if (c->sc) {
        kvt_store_ctrl_stop(c->sc);
        c->sc = NULL;
    }
    if (c->l1)
        kvt_l1_set_pressure_hook(c->l1, NULL, NULL);
    if (c->ev_l1) {
        kvt_evictor_stop(c->ev_l1);
        c->ev_l1 = NULL;
    }
    for (int i = 0; i < c->nl2; i++)
        if (c->ev_l2[i]) {
            kvt_evictor_stop(c->ev_l2[i]);
            c->ev_l2[i] = NULL;
        }
}

void kvt_core_close(struct kvt_core *c)
{
    if (!c)
        return;
    for (int i = 0; i < c->nl2; i++)
        kvt_l2_close(c->l2s[i]), free(c->l2s[i]);
    kvt_l1_destroy(c->l1);
    free(c);
}

/* ------------------------------------------------------------ parts */

struct kvt_l1 *kvt_core_l1(struct kvt_core *c)
{
    return c->l1;
}

int kvt_core_nl2(const struct kvt_core *c)
{
    return c->nl2;
}

kvt_l2 *kvt_core_l2(struct kvt_core *c, int i)
{
    return i >= 0 && i < c->nl2 ? c->l2s[i] : NULL;
}

struct kvt_store_ctrl *kvt_core_store_ctrl(struct kvt_core *c)
{
    return c->sc;
}

struct kvt_prefetch_ctrl *kvt_core_prefetch_ctrl(struct kvt_core *c)
{
    return c->pc;
}

uint64_t kvt_core_workers_queued(struct kvt_core *c)
{
    return kvt_tpool_queued(c->workers);
}

/* ------------------------------------------------------- front ends */

void kvt_core_shm(struct kvt_core *c, struct kvt_l1_shm *shm)
{
    kvt_l1_shm(c->l1, shm);
}

uint64_t kvt_core_pool_id(const struct kvt_core *c)
{
    return kvt_l1_pool_id(c->l1);
}

const char *kvt_core_l2_name(struct kvt_core *c, int i)
{
    return i >= 0 && i < c->nl2 ? kvt_l2_name(c->l2s[i]) : "?";
}

void kvt_core_defer(struct kvt_core *c, struct kvt_job *job)
{
    kvt_tpool_push(c->workers, job);
}

bool kvt_core_fetch(struct kvt_core *c, const kvt_key *keys, uint32_t n, bool note,
                    struct kvt_l1_ref *refs, uint32_t *m, kvt_prefetch_cb done, void *arg)
{
    if (note)
        kvt_l1_note_request(c->l1, keys, n);
    uint32_t got = kvt_l1_get_prefix(c->l1, keys, n, refs);
    *m = got;
    if (got == n || c->nl2 == 0)
        return true;
    kvt_debug("Prefetch request submitted: %u total keys, %u L1 prefix hits, %u remaining for L2",
              n, got, n - got);
    kvt_prefetch_submit(c->pc, keys + got, n - got, done, arg);
    return false;
}

void kvt_core_tag(struct kvt_core *c, const kvt_key *key, struct kvt_blocktag *tag)
{
    if (c->o->events)
        kvt_events_tag(c->o->events, key, tag);
    else
        kvt_blocktag_put(tag);
}

uint32_t kvt_core_store(struct kvt_core *c, const kvt_key *keys, uint32_t n,
                        const struct iovec *data, const kvt_objmeta *meta, uint64_t client,
                        struct kvt_blocktag *const *tags, int32_t *codes)
{
    struct kvt_l1_ref *refs = kvt_xmalloc((n ? n : 1) * sizeof(*refs));
    kvt_key *kept = kvt_xmalloc((n ? n : 1) * sizeof(kvt_key));
    uint32_t *hs = kvt_xmalloc((n ? n : 1) * sizeof(uint32_t));
    uint32_t k = 0, accepted = 0;
    for (uint32_t i = 0; i < n; i++) {
        kvt_objmeta m = *meta;
        m.len = (uint32_t)data[i].iov_len;
        int rc = kvt_l1_reserve(c->l1, &keys[i], &m, &refs[k]);
        if (rc == -EEXIST) {
            accepted++; /* already stored (content-addressed): nothing to do */
            continue;
        }
        if (rc) {
            codes[i] = rc;
            continue;
        }
        memcpy(refs[k].ptr, data[i].iov_base, m.len);
        if (tags && tags[i]) { /* before the publish below announces it */
            kvt_blocktag_ref(tags[i]);
            kvt_core_tag(c, &keys[i], tags[i]);
        }
        kept[k] = keys[i];
        hs[k] = refs[k].h;
        k++;
        accepted++;
    }
    kvt_l1_commit(c->l1, hs, k, 0);
    if (k) /* references move to the controller */
        kvt_store_ctrl_submit_for(c->sc, refs, kept, k, client);
    free(refs);
    free(kept);
    free(hs);
    return accepted;
}

int kvt_core_reserve(struct kvt_core *c, const kvt_key *key, const kvt_objmeta *meta,
                     struct kvt_l1_ref *ref)
{
    return kvt_l1_reserve(c->l1, key, meta, ref);
}

int kvt_core_commit(struct kvt_core *c, uint64_t lease, const struct kvt_l1_owner *owner,
                    const uint64_t *written, uint32_t nslots, uint64_t client)
{
    uint32_t *keep = kvt_xmalloc((nslots ? nslots : 1) * sizeof(uint32_t));
    int committed = kvt_l1_lease_end(c->l1, lease, KVT_LEASE_WRITE, owner, written, keep, nslots);
    if (committed > 0) {
        struct kvt_l1_ref *refs = kvt_xmalloc((size_t)committed * sizeof(*refs));
        kvt_key *keys = kvt_xmalloc((size_t)committed * sizeof(kvt_key));
        for (int i = 0; i < committed; i++)
            kvt_l1_describe(c->l1, keep[i], &refs[i], &keys[i]);
        /* references move to the controller */
        kvt_store_ctrl_submit_for(c->sc, refs, keys, (uint32_t)committed, client);
        free(refs);
        free(keys);
    }
    free(keep);
    return committed;
}

int kvt_core_get(struct kvt_core *c, const kvt_key *key, struct kvt_l1_ref *ref)
{
    return kvt_l1_get(c->l1, key, ref);
}

void kvt_core_put(struct kvt_core *c, uint32_t h)
{
    kvt_l1_put(c->l1, h);
}

void kvt_core_touch(struct kvt_core *c, const uint32_t *hs, uint32_t n)
{
    kvt_l1_touch(c->l1, hs, n);
}

uint64_t kvt_core_lease_new(struct kvt_core *c, enum kvt_lease_kind kind, const uint32_t *hs,
                            uint32_t n, const struct kvt_l1_owner *owner)
{
    return kvt_l1_lease_new(c->l1, kind, hs, n, owner);
}

int kvt_core_lease_handles(struct kvt_core *c, uint64_t id, enum kvt_lease_kind kind,
                           const struct kvt_l1_owner *owner, uint32_t *hs, uint32_t cap)
{
    return kvt_l1_lease_handles(c->l1, id, kind, owner, hs, cap);
}

int kvt_core_lease_end_read(struct kvt_core *c, uint64_t id, const struct kvt_l1_owner *owner)
{
    return kvt_l1_lease_end(c->l1, id, KVT_LEASE_READ, owner, NULL, NULL, 0);
}

int kvt_core_lease_drop(struct kvt_core *c, uint64_t id, const struct kvt_l1_owner *owner)
{
    return kvt_l1_lease_drop(c->l1, id, owner);
}

int kvt_core_lease_take(struct kvt_core *c, uint64_t id, const struct kvt_l1_owner *owner,
                        const kvt_key *keys, uint32_t n, struct kvt_l1_ref *refs)
{
    return kvt_l1_lease_take(c->l1, id, owner, keys, n, refs);
}

uint32_t kvt_core_delete(struct kvt_core *c, kvt_key *keys, uint32_t n, uint32_t *removed_l2,
                         uint32_t *skipped, uint32_t *nskip)
{
    uint32_t l1n = 0, k = 0;
    *nskip = 0;
    for (uint32_t i = 0; i < n; i++) {
        int rc = kvt_l1_delete_unleased(c->l1, &keys[i]);
        if (rc < 0) {
            skipped[(*nskip)++] = i;
            continue;
        }
        l1n += (uint32_t)rc;
        keys[k++] = keys[i];
    }
    for (int a = 0; a < c->nl2; a++)
        removed_l2[a] = kvt_l2_delete(c->l2s[a], keys, k, NULL);
    return l1n;
}

struct l1_drop {
    struct kvt_l1 *l1;
    uint64_t n;
};

/* Purged keys leave the memory tier too, so a lookup cannot hit them there. */
static void drop_from_l1(const kvt_key *keys, uint32_t n, void *arg)
{
    struct l1_drop *d = arg;
    for (uint32_t i = 0; i < n; i++)
        d->n += kvt_l1_delete(d->l1, &keys[i]);
}

int kvt_core_purge(struct kvt_core *c, const char *root, struct kvt_purge_req *q, json_t **out)
{
    bool sel[KVT_MAX_ADAPTERS] = {0};
    char dirs[KVT_MAX_ADAPTERS][4096]; /* asked once per request */
    int nsel = 0;
    bool all = !root || !root[0];
    *out = NULL;
    for (int a = 0; a < c->nl2; a++) {
        char *dir = dirs[a];
        kvt_l2_root(c->l2s[a], dir, sizeof(dirs[a]));
        sel[a] = all || (dir[0] && kvt_same_dir(dir, root));
        nsel += sel[a];
    }
    if (!nsel)
        return KVT_E_NOTFOUND;
    /* all or none: an adapter still scanning would refuse after others
     * were purged, and that work would go unreported */
    for (int a = 0; a < c->nl2; a++)
        if (sel[a] && kvt_l2_recovering(c->l2s[a]))
            return -EBUSY;
    json_t *arr = json_array();
    bool more = false;
    int err = 0;
    for (int a = 0; a < c->nl2 && !err; a++) {
        if (!sel[a])
            continue;
        struct kvt_purge_res res;
        struct l1_drop d = {.l1 = c->l1};
        q->on_keys = drop_from_l1;
        q->on_keys_arg = &d;
        err = kvt_purge_l2(c->l2s[a], dirs[a], q, &res);
        res.l1_removed = d.n;
        json_t *o = kvt_purge_res_json(&res);
        json_object_set_new(o, "adapter", json_string(kvt_l2_name(c->l2s[a])));
        json_array_append_new(arr, o);
        more |= res.more;
    }
    if (err) {
        json_decref(arr);
        return err;
    }
    *out = json_object();
    json_object_set_new(*out, "adapters", arr);
    json_object_set_new(*out, "more", json_boolean(more));
    return 0;
}

uint64_t kvt_core_clear_l1(struct kvt_core *c)
{
    return kvt_l1_evict_to(c->l1, 0);
}

bool kvt_core_flush_wait(struct kvt_core *c, uint64_t client, void *cookie)
{
    return kvt_store_ctrl_flush_wait(c->sc, client, cookie);
}

size_t kvt_core_take_flushed(struct kvt_core *c, void **out, size_t max)
{
    if (!c->sc) /* shutdown after a failed start */
        return 0;
    return kvt_store_ctrl_take_flushed(c->sc, out, max);
}

uint64_t kvt_core_take_failures(struct kvt_core *c, uint64_t client, uint32_t max,
                                struct kvt_store_failure **out, uint32_t *listed)
{
    return kvt_store_ctrl_take_failures(c->sc, client, max, out, listed);
}
