/*
 * dax adapter: fixed-size slots in one shared mapping of a Device-DAX path
 * (/dev/daxX.Y: persistent memory, CXL memory) or of a file for tests.
 *
 * Layout of the mapping (max_dax_size_gb GiB):
 *   [geometry record: 4096][header table: nslots x 1024 bytes, page
 *   rounded][slot 0][slot 1]...
 * The geometry record (magic, mapped bytes, slot_bytes, slots, offsets,
 * checksum) says which layout the headers were written for: a mapping
 * written with another slot_bytes or size (or without the record: an older
 * kvtier) is reformatted at open, with a warning, never reinterpreted.
 * A slot holds exactly slot_bytes of payload (the seed's meaning: one whole
 * chunk fits); its 1024-byte header lives in the table: the object header
 * (objfmt.h: identity, lengths, checksum) and a trailer (slot, generation,
 * payload length and checksum; CRC) in the last 64 bytes.
 *
 * Store: take a free slot (its header is already invalid), copy the payload,
 *        write the object header, then - after a release fence - the trailer:
 *        the trailer is the commit record, so a slot with a valid trailer
 *        always holds its complete payload (for a process crash; with
 *        "durable": true the ranges are also msync'ed before the
 *        acknowledgement, for power loss on fsdax/file mappings).
 * Delete: invalidate the trailer, then free the slot; a slot still being
 *        read is freed by its last reader (pins normally prevent this).
 * Load:  copy out, then verify header, trailer and checksum: any mismatch is
 *        a miss.
 * Restart: better than the seed's volatile index: a background scan of the
 *        header table (memory reads, no payload I/O) restores the index,
 *        usage and LRU order (by generation); stores wait for it. With
 *        persist_enabled false the headers are wiped at close instead.
 * Usage is slot based (objects x slot_bytes); eviction frees slots.
 *
 * Threads: store workers ("daxs<i>"), load workers ("daxl<i>"), one scan
 * thread at start-up. Locks: e->lock guards the free list, readers and
 * generations; never held with l2->lock, never across a copy.
 */
#include "common/le.h"
#include "common/log.h"
#include "common/util.h"
#include "io/tpool.h"
#include "kvtier/error.h"
#include "l2/adapters.h"
#include "l2/engine.h"
#include "l2/life.h"
#include "l2/kit/objfmt.h"
#include "key/blocktag.h"
#include "l2/kit/slot.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#define DAX_HDR 1024u
#define DAX_GEOM 4096u /* the geometry record at offset 0 */
#define DAX_GEOM_MAGIC "KVTDAXG1"
#define COPY_CHUNK (64u << 10)
#define DAX_TRAILER_OFF (DAX_HDR - RB_TRAILER)

struct dax_engine {
    char *path;
    int fd;
    bool chardev, durable;
    bool created; /* this start created the file: removed if it fails */
    uint8_t *map;
    uint64_t map_bytes;
    uint8_t *table; /* nslots x DAX_HDR */
    uint8_t *data;  /* nslots x slot_bytes */
    uint64_t slot_bytes;
    uint32_t nslots;
    struct kvt_tpool *spool, *lpool;
    int nstore, nlookup, nload;

    pthread_mutex_t lock; /* guards the fields below */
    uint32_t *freev, nfree;
    uint16_t *readers;
    uint8_t *zombie; /* removed while being read: freed by the last reader */
    uint64_t next_gen;

    pthread_t scan_thr;
    bool scan_started;
    _Atomic bool stop;
    struct kvt_l2_park park;   /* stores waiting for the scan */
    struct kvt_l2_drain drain; /* live batches */
    _Atomic uint64_t invalid_headers;
    char reformatted[200];   /* why the headers were discarded at open; "" = kept */
    _Atomic uint64_t msyncs; /* durable: ranges msync'ed (status "msyncs") */
};

struct dax_batch;

struct dax_op {
    struct kvt_job job;
    struct dax_batch *b;
    uint32_t i;
    bool store;
};

struct dax_batch {
    kvt_l2 *l2;
    kvt_l2_task *t;
    _Atomic uint32_t left;
    struct dax_op ops[];
};

static uint8_t *slot_hdr(struct dax_engine *e, uint32_t s)
{
    return e->table + (uint64_t)s * DAX_HDR;
}

static uint8_t *slot_data(struct dax_engine *e, uint32_t s)
{
    return e->data + (uint64_t)s * e->slot_bytes;
}

static void sync_range(struct dax_engine *e, void *p, uint64_t n)
{
    uintptr_t a = (uintptr_t)p & ~(uintptr_t)4095;
    uintptr_t end = (uintptr_t)p + n;
    msync((void *)a, end - a, MS_SYNC);
    atomic_fetch_add(&e->msyncs, 1);
}

/* Wipe a slot header, not synced: the trailer goes first (it is the commit). */
static void hdr_wipe(struct dax_engine *e, uint32_t s)
{
    uint8_t *h = slot_hdr(e, s);
    memset(h + DAX_TRAILER_OFF, 0, RB_TRAILER);
    atomic_thread_fence(memory_order_release); /* trailer gone before the rest */
    memset(h, 0, KVT_OBJHDR_MIN);
}

/* Invalidate a slot header; "durable": msync'ed at once. */
static void hdr_invalidate(struct dax_engine *e, uint32_t s)
{
    hdr_wipe(e, s);
    if (e->durable)
        sync_range(e, slot_hdr(e, s), DAX_HDR);
}

/*
 * Copy n bytes and return the XXH3-64 of what was written, in chunks that
 * stay in cache between the copy and the hash: one pass over memory instead
 * of two (the same value as kvt_payload_hash over dst).
 */
static uint64_t copy_hash(void *dst, const void *src, size_t n)
{
    XXH3_state_t st;
    XXH3_INITSTATE(&st);
    XXH3_64bits_reset(&st);
    for (size_t off = 0; off < n; off += COPY_CHUNK) {
        size_t c = KVT_MIN(COPY_CHUNK, n - off);
        memcpy((uint8_t *)dst + off, (const uint8_t *)src + off, c);
        XXH3_64bits_update(&st, (const uint8_t *)dst + off, c);
    }
    return XXH3_64bits_digest(&st);
}

static void batch_op_done(struct dax_batch *b)
{
    if (atomic_fetch_sub_explicit(&b->left, 1, memory_order_acq_rel) != 1)
        return;
    kvt_l2 *l2 = b->l2;
    struct dax_engine *e = l2->engine;
    kvt_l2_task_finish(l2, b->t);
    free(b);
    kvt_l2_drain_leave(&e->drain);
}

static void do_store(kvt_l2 *l2, struct dax_engine *e, kvt_l2_task *t, uint32_t i)
{
    const kvt_buf *src = &t->bufs[i];
    kvt_key ck;
    kvt_l2_canon(l2, &t->keys[i], &ck);
    if (src->len > e->slot_bytes || src->len > KVT_MAX_OBJECT) {
        kvt_l2_too_big(l2, t, i, src->len, KVT_MIN(e->slot_bytes, KVT_MAX_OBJECT),
                       "slot_bytes: raise it");
        return;
    }
    uint32_t logical = t->meta[i].len ? t->meta[i].len : (uint32_t)src->len;
    t->meta[i].len = logical;
    int rc = kvt_l2_reserve(l2, &ck, (uint32_t)KVT_MIN(e->slot_bytes, UINT32_MAX), logical,
                            UINT32_MAX, 0);
    if (rc == -EEXIST) {
        atomic_fetch_add(&l2->counters.store_skipped, 1);
        kvt_l2_task_ok(t, i, 0);
        return;
    }
    if (rc) {
        kvt_l2_task_fail(t, i, rc);
        atomic_fetch_add(&l2->counters.store_failed, 1);
        return;
    }
    uint32_t s = UINT32_MAX;
    uint64_t gen = 0;
    pthread_mutex_lock(&e->lock);
    if (e->nfree) {
        s = e->freev[--e->nfree];
        gen = e->next_gen++;
    }
    pthread_mutex_unlock(&e->lock);
    if (s == UINT32_MAX) { /* cannot happen: the cap counts slots */
        kvt_l2_unreserve(l2, &ck);
        kvt_l2_task_fail(t, i, KVT_E_FULL);
        atomic_fetch_add(&l2->counters.store_failed, 1);
        return;
    }
    uint8_t *d = slot_data(e, s), *h = slot_hdr(e, s);
    uint64_t sum = copy_hash(d, src->ptr, src->len);
    /* the engine block hashes (KV events) as far as the 512-byte object
     * header holds them (kvt_objhdr_encode), for the scan to read */
    struct kvt_blocktag *tag = kvt_l2_tag_of(l2, &ck);
    kvt_objhdr_encode(h, KVT_OBJHDR_MIN, &ck, &t->meta[i], tag, t->meta[i].serde, src->len, sum);
    kvt_blocktag_put(tag);
    struct rb_trailer tr = {.slot = s, .gen = gen, .plen = src->len, .xxh3 = sum};
    if (e->durable) {
        sync_range(e, d, src->len);
        sync_range(e, h, KVT_OBJHDR_MIN);
    }
    /* release: payload and object header are visible before the trailer
     * that commits them */
    atomic_thread_fence(memory_order_release);
    rb_trailer_encode(&tr, h + DAX_TRAILER_OFF);
    if (e->durable)
        sync_range(e, h + DAX_TRAILER_OFF, RB_TRAILER);
    kvt_l2_publish_aux(l2, &ck, s);
    atomic_fetch_add(&l2->counters.store_ok, 1);
    kvt_l2_task_ok(t, i, src->len);
}

static void reader_put(struct dax_engine *e, uint32_t s)
{
    pthread_mutex_lock(&e->lock);
    if (--e->readers[s] == 0 && e->zombie[s]) {
        e->zombie[s] = 0;
        e->freev[e->nfree++] = s;
    }
    pthread_mutex_unlock(&e->lock);
}

static void do_load(kvt_l2 *l2, struct dax_engine *e, kvt_l2_task *t, uint32_t i)
{
    kvt_buf *dst = &t->bufs[i];
    kvt_key ck;
    kvt_l2_canon(l2, &t->keys[i], &ck);
    uint32_t s = UINT32_MAX;
    pthread_mutex_lock(&l2->lock);
    struct kvt_l2_obj *o = kvt_l2_find_locked(l2, &ck);
    if (o && kvt_l2_obj_state(o) == KVT_OBJ_READY)
        s = o->aux;
    pthread_mutex_unlock(&l2->lock);
    if (s >= e->nslots) {
        kvt_l2_task_fail(t, i, KVT_E_NOTFOUND);
        return;
    }
    pthread_mutex_lock(&e->lock);
    bool gone = e->zombie[s];
    if (!gone)
        e->readers[s]++;
    pthread_mutex_unlock(&e->lock);
    if (gone) {
        kvt_l2_task_fail(t, i, KVT_E_NOTFOUND);
        return;
    }
    const uint8_t *h = slot_hdr(e, s);
    struct rb_trailer tr;
    struct kvt_objhdr oh;
    const char *why = NULL;
    int rc = rb_trailer_decode(h + DAX_TRAILER_OFF, &tr);
    /* acquire: read the header and payload only after a valid trailer */
    atomic_thread_fence(memory_order_acquire);
    if (rc || tr.slot != s)
        why = "slot trailer invalid";
    else if (kvt_objhdr_decode(h, KVT_OBJHDR_MIN, &oh, &why))
        ;
    else if (!kvt_objhdr_matches(&oh, KVT_CODEC_OBJ, &ck))
        why = "slot holds another key";
    else if (tr.plen > e->slot_bytes || oh.payload_len != tr.plen)
        why = "slot payload length inconsistent";
    /* a valid object larger than the destination: not corrupt (as raw_block
     * and nixl_store), the key fails with KVT_E_TOOBIG, never an overrun */
    bool toobig = !why && tr.plen > dst->len;
    if (!why && !toobig) {
        if (copy_hash(dst->ptr, slot_data(e, s), tr.plen) != tr.xxh3)
            why = "payload checksum mismatch";
    }
    reader_put(e, s);
    if (toobig) {
        kvt_l2_task_fail(t, i, KVT_E_TOOBIG);
        return;
    }
    if (why) {
        kvt_l2_slot_corrupt(l2, &t->keys[i], s, why);
        kvt_l2_task_fail(t, i, KVT_E_CORRUPT);
        return;
    }
    t->meta[i] = oh.meta;
    dst->len = tr.plen;
    kvt_l2_task_ok(t, i, tr.plen);
}

static void job_fn(struct kvt_job *job, void *ctx)
{
    (void)ctx;
    struct dax_op *op = (struct dax_op *)job;
    kvt_l2 *l2 = op->b->l2;
    struct dax_engine *e = l2->engine;
    if (op->store) {
        if (kvt_l2_park(&e->park, job))
            return;
        do_store(l2, e, op->b->t, op->i);
    } else {
        do_load(l2, e, op->b->t, op->i);
    }
    batch_op_done(op->b);
}

static void dax_submit(kvt_l2 *l2, kvt_l2_task *t)
{
    struct dax_engine *e = l2->engine;
    if (t->kind == KVT_L2_LOOKUP) {
        kvt_l2_lookup_index(l2, t);
        return;
    }
    struct dax_batch *b = kvt_xcalloc(1, sizeof(*b) + t->n * sizeof(struct dax_op));
    b->l2 = l2;
    b->t = t;
    atomic_store(&b->left, t->n);
    kvt_l2_drain_enter(&e->drain);
    bool store = t->kind == KVT_L2_STORE;
    uint32_t n = t->n;
    for (uint32_t i = 0; i < n; i++) {
        b->ops[i].b = b;
        b->ops[i].i = i;
        b->ops[i].store = store;
        b->ops[i].job.fn = job_fn;
    }
    /* b and t may be freed once the last op is queued: read nothing after */
    struct dax_op *ops = b->ops;
    struct kvt_tpool *pool = store ? e->spool : e->lpool;
    for (uint32_t i = 0; i < n; i++)
        kvt_tpool_push(pool, &ops[i].job);
}

static int dax_remove(kvt_l2 *l2, const struct kvt_l2_obj *o)
{
    struct dax_engine *e = l2->engine;
    uint32_t s = o->aux;
    if (s >= e->nslots)
        return -ENOENT;
    hdr_invalidate(e, s);
    pthread_mutex_lock(&e->lock);
    if (e->readers[s])
        e->zombie[s] = 1; /* the last reader frees it */
    else
        e->freev[e->nfree++] = s;
    pthread_mutex_unlock(&e->lock);
    return 0;
}

/* ----------------------------------------------------------- geometry */

static void geom_encode(const struct dax_engine *e, uint8_t *g)
{
    memset(g, 0, 64);
    memcpy(g, DAX_GEOM_MAGIC, 8);
    kvt_put32(g + 8, 1); /* version */
    kvt_put32(g + 12, DAX_HDR);
    kvt_put64(g + 16, e->map_bytes);
    kvt_put64(g + 24, e->slot_bytes);
    kvt_put32(g + 32, e->nslots);
    kvt_put64(g + 40, (uint64_t)(e->table - e->map));
    kvt_put64(g + 48, (uint64_t)(e->data - e->map));
    kvt_put64(g + 56, XXH3_64bits(g, 56));
}

/*
 * Keep the slot headers only when the geometry record says they were
 * written for exactly this layout; otherwise wipe the header table (synced)
 * and then write the record (synced): a crash in between leaves no record
 * or the old one, and the next open reformats again. Never reinterprets a
 * header of another layout (its slot would point at other bytes).
 */
static void geom_check(kvt_l2 *l2, struct dax_engine *e)
{
    uint8_t want[64], *have = e->map;
    geom_encode(e, want);
    if (memcmp(have, want, 64) == 0)
        return;
    bool ours =
        memcmp(have, DAX_GEOM_MAGIC, 8) == 0 && kvt_get64(have + 56) == XXH3_64bits(have, 56);
    uint64_t table_bytes = (uint64_t)(e->data - e->table);
    bool blank = true;
    for (uint64_t k = 0; k < DAX_GEOM + table_bytes && blank; k++)
        blank = e->map[k] == 0;
    if (ours)
        snprintf(e->reformatted, sizeof(e->reformatted),
                 "written for another layout (slot_bytes %llu, %u slots, %llu bytes mapped)",
                 (unsigned long long)kvt_get64(have + 24), kvt_get32(have + 32),
                 (unsigned long long)kvt_get64(have + 16));
    else if (!blank)
        snprintf(e->reformatted, sizeof(e->reformatted),
                 "no kvtier dax geometry record (an older kvtier's layout, or other data)");
    if (e->reformatted[0])
        kvt_warn("%s: %s: %s; now slot_bytes %llu, %u slots: its slot headers are discarded "
                 "(reformatted), objects stored there are gone",
                 l2->name, e->path, e->reformatted, (unsigned long long)e->slot_bytes, e->nslots);
    memset(e->map, 0, DAX_GEOM + table_bytes);
    msync(e->map, DAX_GEOM + table_bytes, MS_SYNC);
    memcpy(e->map, want, 64);
    msync(e->map, 4096, MS_SYNC);
}

/* ------------------------------------------------------------ restart */

/* Scan the header table: valid, committed headers become index entries
 * (oldest generation coldest); everything else is a free slot. */
static void *scan_main(void *arg)
{
    kvt_l2 *l2 = arg;
    struct dax_engine *e = l2->engine;
    pthread_setname_np(pthread_self(), "dax-scan");
    uint64_t t0 = kvt_now_ns();
    struct rb_gen_slot *v = kvt_xcalloc(e->nslots, sizeof(*v));
    kvt_key *keys = kvt_xcalloc(e->nslots, sizeof(kvt_key));
    uint32_t *lens = kvt_xcalloc(e->nslots, sizeof(uint32_t));
    uint32_t n = 0;
    uint64_t maxgen = 0;
    bool *used = kvt_xcalloc(e->nslots, sizeof(bool));
    /* with KV events on: the engine block hashes each header holds */
    struct kvt_blocktag **tags = l2->keep_tags ? kvt_xcalloc(e->nslots, sizeof(*tags)) : NULL;
    for (uint32_t s = 0; s < e->nslots && !atomic_load(&e->stop); s++) {
        const uint8_t *h = slot_hdr(e, s);
        struct rb_trailer tr;
        struct kvt_objhdr oh;
        const char *why;
        if (rb_trailer_decode(h + DAX_TRAILER_OFF, &tr)) {
            if (memcmp(h + DAX_TRAILER_OFF, RB_TRAILER_MAGIC, 8) == 0)
                atomic_fetch_add(&e->invalid_headers, 1);
            continue;
        }
        if (tr.slot != s || tr.plen > e->slot_bytes ||
            kvt_objhdr_decode(h, KVT_OBJHDR_MIN, &oh, &why) || oh.payload_len != tr.plen ||
            oh.payload_xxh3 != tr.xxh3) {
            atomic_fetch_add(&e->invalid_headers, 1);
            continue;
        }
        kvt_key_canon(KVT_CODEC_OBJ, &oh.key, &keys[s]);
        lens[s] = (uint32_t)oh.logical_len;
        if (tags)
            tags[s] = kvt_objhdr_tag(h, &oh);
        v[n++] = (struct rb_gen_slot){tr.gen, s};
        used[s] = true;
        if (tr.gen > maxgen)
            maxgen = tr.gen;
    }
    rb_sort_newest_first(v, n);
    uint64_t objs = 0, bytes = 0;
    for (uint32_t k = 0; k < n; k++) {
        uint32_t s = v[k].slot;
        struct kvt_blocktag *tag = tags ? tags[s] : NULL; /* named by it when announced */
        if (kvt_l2_adopt_tag(l2, &keys[s], tag, (uint32_t)KVT_MIN(e->slot_bytes, UINT32_MAX),
                             lens[s], s, 0, false, true)) {
            objs++;
            bytes += e->slot_bytes;
        } else { /* the same key twice: the newer (adopted first) wins */
            hdr_invalidate(e, s);
            used[s] = false;
        }
    }
    pthread_mutex_lock(&e->lock);
    e->next_gen = maxgen + 1;
    e->nfree = 0;
    for (uint32_t s = e->nslots; s-- > 0;)
        if (!used[s])
            e->freev[e->nfree++] = s;
    pthread_mutex_unlock(&e->lock);
    free(v);
    free(keys);
    free(lens);
    free(used);
    free(tags); /* each given to kvt_l2_adopt_tag */
    double secs = kvt_l2_recovery_done(l2, objs, bytes, t0);
    kvt_info("%s: recovered %llu objects from the slot headers of %s in %.3f s", l2->name,
             (unsigned long long)objs, e->path, secs);
    kvt_l2_park_release(&e->park, e->spool);
    return NULL;
}

/* ------------------------------------------------------- status/close */

static void dax_status(kvt_l2 *l2, json_t *out)
{
    struct dax_engine *e = l2->engine;
    json_object_set_new(out, "device_path", json_string(e->path));
    json_object_set_new(out, "device_dax", json_boolean(e->chardev));
    json_object_set_new(out, "mapped_bytes", json_integer((json_int_t)e->map_bytes));
    json_object_set_new(out, "slot_bytes", json_integer((json_int_t)e->slot_bytes));
    json_object_set_new(out, "slots", json_integer(e->nslots));
    json_object_set_new(out, "durable", json_boolean(e->durable));
    json_object_set_new(out, "num_store_workers", json_integer(e->nstore));
    json_object_set_new(out, "num_lookup_workers", json_integer(e->nlookup));
    json_object_set_new(out, "num_load_workers", json_integer(e->nload));
    json_object_set_new(out, "invalid_headers_at_start",
                        json_integer((json_int_t)atomic_load(&e->invalid_headers)));
    json_object_set_new(out, "reformatted_at_start",
                        e->reformatted[0] ? json_string(e->reformatted) : json_null());
    json_object_set_new(out, "msyncs", json_integer((json_int_t)atomic_load(&e->msyncs)));
    pthread_mutex_lock(&e->lock);
    json_object_set_new(out, "free_slots", json_integer(e->nfree));
    pthread_mutex_unlock(&e->lock);
}

static void engine_free(struct dax_engine *e)
{
    if (e->map && e->map != MAP_FAILED)
        munmap(e->map, e->map_bytes);
    if (e->fd >= 0)
        close(e->fd);
    free(e->path);
    free(e->freev);
    free(e->readers);
    free(e->zombie);
    pthread_mutex_destroy(&e->lock);
    kvt_l2_park_destroy(&e->park);
    kvt_l2_drain_destroy(&e->drain);
    free(e);
}

static void dax_close(kvt_l2 *l2)
{
    struct dax_engine *e = l2->engine;
    kvt_l2_life_stop(l2, &(struct kvt_l2_life){.stop_flag = &e->stop,
                                               .thread = &e->scan_thr,
                                               .thread_started = &e->scan_started,
                                               .park = &e->park,
                                               .park_pool = e->spool,
                                               .drain = &e->drain,
                                               .pools = {e->spool, e->lpool}});
    if (!l2->persist_enabled) {
        for (uint32_t s = 0; s < e->nslots; s++)
            hdr_wipe(e, s); /* synced below, once */
        kvt_info("%s: persist_enabled is false: slot headers wiped", l2->name);
    }
    msync(e->map, e->map_bytes, MS_SYNC);
    engine_free(e);
    l2->engine = NULL;
}

static const struct kvt_l2_ops dax_ops = {
    .submit = dax_submit,
    .remove = dax_remove,
    .status = dax_status,
    .close = dax_close,
};

/* ------------------------------------------------------ configuration */

struct kvt_dax_opts {
    const char *device_path;
    uint64_t size_bytes, slot_bytes;
    int num_store_workers, num_lookup_workers, num_load_workers;
    bool durable;
};

static int dax_parse(struct kvt_cfg *c, void *opts)
{
    struct kvt_dax_opts *o = opts;
    memset(o, 0, sizeof(*o));
    kvt_cfg_str(c, "device_path", true, NULL, &o->device_path);
    if (!c->rc && !o->device_path[0])
        return kvt_cfg_fail(c, "device_path", "must not be empty");
    double gb = 0;
    kvt_cfg_num(c, "max_dax_size_gb", true, 0, 0, 1e6, &gb);
    if (!c->rc && gb <= 0)
        return kvt_cfg_fail(c, "max_dax_size_gb", "must be a positive number (got %g)", gb);
    o->size_bytes = (uint64_t)(gb * KVT_GIB);
    int64_t v = 0;
    kvt_cfg_int(c, "slot_bytes", true, 0, 1, UINT32_MAX, &v); /* usage counts it in 32 bits */
    o->slot_bytes = (uint64_t)v;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int64_t ns = 1, nl = 1, nd = KVT_MIN(4, ncpu > 0 ? ncpu : 1);
    kvt_cfg_int(c, "num_store_workers", false, 1, 1, 1024, &ns);
    kvt_cfg_int(c, "num_lookup_workers", false, 1, 1, 1024, &nl);
    kvt_cfg_int(c, "num_load_workers", false, nd, 1, 1024, &nd);
    o->num_store_workers = (int)ns;
    o->num_lookup_workers = (int)nl;
    o->num_load_workers = (int)nd;
    kvt_cfg_bool(c, "durable", false, &o->durable);
    if (c->rc)
        return c->rc;
    if (o->size_bytes <= DAX_GEOM || (o->size_bytes - DAX_GEOM) / (o->slot_bytes + DAX_HDR) == 0)
        return kvt_cfg_fail(c, "slot_bytes",
                            "is larger than the configured DAX arena (max_dax_size_gb %g = %llu "
                            "bytes): not even one slot fits",
                            gb, (unsigned long long)o->size_bytes);
    return 0;
}

static int dax_open(kvt_l2 *l2, const struct kvt_l2_spec *spec, const void *opts, char *err,
                    size_t errcap)
{
    const struct kvt_dax_opts *o = opts;
    struct dax_engine *e = kvt_xcalloc(1, sizeof(*e));
    e->fd = -1;
    pthread_mutex_init(&e->lock, NULL);
    kvt_l2_park_init(&e->park);
    kvt_l2_drain_init(&e->drain);
    e->path = kvt_xstrdup(o->device_path);
    e->durable = o->durable;
    e->slot_bytes = o->slot_bytes;
    e->nstore = o->num_store_workers;
    e->nlookup = o->num_lookup_workers;
    e->nload = o->num_load_workers;
    int rc = 0;
    struct stat st;
    bool exists = stat(e->path, &st) == 0;
    e->chardev = exists && S_ISCHR(st.st_mode);
    if (exists && !e->chardev && !S_ISREG(st.st_mode)) {
        snprintf(err, errcap, "device_path %s is neither a DAX character device nor a file",
                 e->path);
        rc = -EINVAL;
        goto fail;
    }
    e->fd = open(e->path, O_RDWR | O_CLOEXEC | (exists ? 0 : O_CREAT | O_EXCL), 0644);
    e->created = !exists && e->fd >= 0;
    if (e->fd < 0) {
        rc = -errno;
        snprintf(err, errcap, "cannot open device_path %s: %s", e->path, kvt_strerror(-errno));
        goto fail;
    }
    if (flock(e->fd, LOCK_EX | LOCK_NB) < 0) {
        rc = -EBUSY;
        snprintf(err, errcap, "device_path %s is in use by another process", e->path);
        goto fail;
    }
    e->map_bytes = o->size_bytes;
    if (e->chardev) {
        /* Device-DAX maps in units of its alignment (2 MiB by default) */
        e->map_bytes = e->map_bytes / (2u << 20) * (2u << 20);
    } else {
        fstat(e->fd, &st);
        if ((uint64_t)st.st_size < e->map_bytes) {
            int r = posix_fallocate(e->fd, 0, (off_t)e->map_bytes);
            if (r) {
                rc = -r;
                snprintf(err, errcap, "cannot size %s to %llu bytes: %s", e->path,
                         (unsigned long long)e->map_bytes, kvt_strerror(-r));
                goto fail;
            }
        }
    }
    e->map = mmap(NULL, e->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, e->fd, 0);
    if (e->map == MAP_FAILED) {
        rc = -errno;
        snprintf(err, errcap, "cannot map %llu bytes of %s: %s%s", (unsigned long long)e->map_bytes,
                 e->path, kvt_strerror(-errno),
                 e->chardev ? " (is max_dax_size_gb within the device size?)" : "");
        e->map = NULL;
        goto fail;
    }
    uint64_t n =
        e->map_bytes > DAX_GEOM ? (e->map_bytes - DAX_GEOM) / (e->slot_bytes + DAX_HDR) : 0;
    uint64_t table = KVT_ALIGN_UP(n * DAX_HDR, 4096);
    while (n && DAX_GEOM + table + n * e->slot_bytes > e->map_bytes) {
        n--;
        table = KVT_ALIGN_UP(n * DAX_HDR, 4096);
    }
    if (n == 0 || n > UINT32_MAX - 1) {
        snprintf(err, errcap, "the mapping of %llu bytes holds no slot of %llu bytes",
                 (unsigned long long)e->map_bytes, (unsigned long long)e->slot_bytes);
        rc = KVT_E_CONFIG;
        goto fail;
    }
    e->nslots = (uint32_t)n;
    e->table = e->map + DAX_GEOM;
    e->data = e->table + table;
    e->freev = kvt_xcalloc(e->nslots, sizeof(uint32_t));
    e->readers = kvt_xcalloc(e->nslots, sizeof(uint16_t));
    e->zombie = kvt_xcalloc(e->nslots, 1);
    rc = kvt_l2_life_init(l2, &dax_ops, spec, KVT_CODEC_OBJ, (uint64_t)e->nslots * e->slot_bytes,
                          err, errcap);
    if (rc)
        goto fail;
    l2->engine = e;
    geom_check(l2, e); /* before the scan reads a header */
    char nm[16];
    snprintf(nm, sizeof(nm), "daxs%d", spec->index);
    rc = kvt_tpool_create(&e->spool, nm, e->nstore, NULL, NULL, NULL);
    snprintf(nm, sizeof(nm), "daxl%d", spec->index);
    if (!rc)
        rc = kvt_tpool_create(&e->lpool, nm, e->nload, NULL, NULL, NULL);
    if (rc) {
        snprintf(err, errcap, "cannot start worker threads: %s", kvt_strerror(rc));
        goto fail_base;
    }
    rc = kvt_l2_life_start_scan(l2, &e->park, &e->scan_thr, &e->scan_started, scan_main,
                                "the scan thread", err, errcap);
    if (rc)
        goto fail_base;
    kvt_info("%s: %s mapped %llu bytes: %u slots of %llu bytes", l2->name, e->path,
             (unsigned long long)e->map_bytes, e->nslots, (unsigned long long)e->slot_bytes);
    return 0;
fail_base:
    kvt_tpool_destroy(e->spool);
    kvt_tpool_destroy(e->lpool);
    l2->engine = NULL;
    kvt_l2_base_destroy(l2);
fail:
    if (e->created) /* nothing this start created stays behind */
        unlink(e->path);
    engine_free(e);
    return rc ? rc : KVT_E_CONFIG;
}

/*
 * --dry-run and the start's config check: a file (not a DAX character
 * device) is created or grown to max_dax_size_gb at open, so its file
 * system must have the space; a file another server holds is in use.
 */
static int dax_check(const struct kvt_l2_spec *spec, const void *opts, const char **field,
                     char *msg, size_t cap)
{
    (void)spec;
    const struct kvt_dax_opts *o = opts;
    *field = "device_path";
    int rc = kvt_l2_check_device(o->device_path, S_IFCHR, "DAX character device", msg, cap);
    if (rc)
        return rc;
    struct stat st;
    uint64_t have = 0;
    char where[4096];
    snprintf(where, sizeof(where), "%s", o->device_path);
    if (stat(o->device_path, &st) == 0) {
        if (!S_ISREG(st.st_mode))
            return 0; /* a device: its size is the device's */
        int fd = open(o->device_path, O_RDONLY | O_CLOEXEC);
        bool busy = fd >= 0 && flock(fd, LOCK_SH | LOCK_NB) < 0 && errno == EWOULDBLOCK;
        if (fd >= 0)
            close(fd);
        if (busy) {
            snprintf(msg, cap, "%s is in use by another process", o->device_path);
            return KVT_E_CONFIG;
        }
        if ((uint64_t)st.st_size >= o->size_bytes)
            return 0;
        have = (uint64_t)st.st_blocks * 512;
    } else {
        kvt_path_cut_parent(where, sizeof(where));
    }
    struct statvfs sv;
    uint64_t need = o->size_bytes > have ? o->size_bytes - have : 0;
    if (statvfs(where, &sv) == 0 && (uint64_t)sv.f_bavail * sv.f_frsize < need) {
        *field = "max_dax_size_gb";
        snprintf(msg, cap,
                 "%s would be sized to %.2f GiB but its file system has %.2f GiB free: lower "
                 "max_dax_size_gb, or give a DAX device",
                 o->device_path, (double)o->size_bytes / KVT_GIB,
                 (double)sv.f_bavail * (double)sv.f_frsize / KVT_GIB);
        return KVT_E_CONFIG;
    }
    return 0;
}

static const char *dax_storage(const void *opts, const char **field, bool *is_dir)
{
    const struct kvt_dax_opts *o = opts;
    *field = "device_path";
    *is_dir = false;
    return o->device_path;
}

const struct kvt_l2_adapter_desc kvt_l2_dax_desc = {
    .name = "dax",
    .opts_size = sizeof(struct kvt_dax_opts),
    .parse = dax_parse,
    .open = dax_open,
    .check = dax_check,
    .storage = dax_storage,
};
