/*
 * raw_block adapter: fixed-size slots on a block device or a pre-sized
 * file, with a checkpointed and journaled index (formats in raw_block.h).
 *
 * Store:  reserve (usage counts whole slots) -> take a free slot and a new
 *         generation -> one write of [object header + trailer | payload]
 *         into the slot on the I/O engine -> append a PUT record to the
 *         journal -> acknowledge once the journal block holding it is on
 *         the device. A store acknowledged before a SIGKILL is therefore
 *         found after restart (LMCache loses everything after the last
 *         checkpoint).
 * Delete: append a DEL record; the slot is free for reuse only once the
 *         record is durable, so recovery can never pair an old index entry
 *         with new bytes.
 * Lookup: memory index (inline). Load: one read of header + payload,
 *         verified against the index (identity, generation, instance,
 *         length, checksum): any mismatch is a miss.
 * Journal: records are packed into blocks; one block write is in flight at
 *         a time and records arriving meanwhile share the next block (group
 *         commit). The ring is reclaimed by checkpoints.
 * Checkpoint: the slot table as PUT records in the older of two copies
 *         (payload, fdatasync, header); taken when the journal is half
 *         full, periodically when idle (meta_checkpoint_interval_sec after
 *         meta_idle_quiet_ms without changes), and at close. One that does
 *         not fit its copy is an error in status (is_healthy false); when
 *         the journal is then 3/4 full, new stores are refused (deletes and
 *         evictions still go through) until a checkpoint fits again.
 * Start-up: open refuses a device in use and reads what the device holds
 *         (raw_block_probe.c, the same checks as --dry-run): kvtier's own
 *         index is recovered (another layout, format or version is a clear
 *         error), an empty device is formatted, anything else is refused
 *         unless "format": "force". A slot is header_bytes + slot_bytes.
 *         Payload, journal replay and slot-header verification run in the
 *         background while stores wait.
 * O_DIRECT: header, offsets and lengths are block aligned; the payload is
 *         written from the caller's buffer when aligned (enable_zero_copy),
 *         its last partial block and misaligned buffers go through an
 *         aligned bounce buffer (counted), never an EINVAL.
 *
 * Threads: store workers ("rbs<i>"), load workers ("rbl<i>"), the I/O
 * engine, a checkpoint thread, a one-shot recovery thread.
 * Locks: e->jlock guards the slot table, the free list, generations, the
 * journal and checkpoint state. l2->lock (base) is never held with it.
 * Neither is held across I/O except that block writes are *submitted*
 * under jlock (submission never blocks).
 */
#include "common/log.h"
#include "common/util.h"
#include "io/engine.h"
#include "io/tpool.h"
#include "kvtier/error.h"
#include "l2/adapters.h"
#include "l2/engine.h"
#include "l2/life.h"
#include "l2/kit/objfmt.h"
#include "l2/raw_block/raw_block.h"
#include "l2/raw_block/raw_block_int.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------ delete */

struct del_wait {
    struct rb_jw jw;
    struct rb_engine *e;
    uint32_t slot;
    int refs;  /* guarded by jlock: the journal, and the waiting remover */
    bool done; /* guarded by jlock */
};

/* The DEL record is durable: only now may the slot be reused, so that no
 * recovery can pair the old index entry with new bytes. */
static void del_journaled(struct rb_jw *w, int rc)
{
    struct del_wait *dw = (struct del_wait *)w;
    struct rb_engine *e = dw->e;
    pthread_mutex_lock(&e->jlock);
    if (rc == 0)
        e->freev[e->nfree++] = dw->slot;
    else if (e->jrecover) /* free once the recovery checkpoint holds the DEL */
        e->lost[e->nlost++] = dw->slot;
    /* else: the slot stays out of use until a restart */
    dw->done = true;
    pthread_cond_broadcast(&e->jcond);
    bool last = --dw->refs == 0;
    pthread_mutex_unlock(&e->jlock);
    if (last)
        free(dw);
}

/*
 * Delete or evict: append a DEL record (applied to the slot table at once,
 * so the next checkpoint no longer carries the object) and wait, up to two
 * seconds, until it is durable; the slot is freed then. While checkpoints
 * fail a delete does not wait at all: deletes must always be able to
 * shrink an index whose checkpoint does not fit. A delete whose record was
 * not yet written when the process died leaves the object (intact) after
 * restart.
 */
static int rb_remove(kvt_l2 *l2, const struct kvt_l2_obj *o)
{
    struct rb_engine *e = l2->engine;
    uint32_t s = o->aux;
    pthread_mutex_lock(&e->jlock);
    if (e->fatal) {
        pthread_mutex_unlock(&e->jlock);
        return KVT_E_FATAL;
    }
    if (s >= e->g.nslots || !e->slots[s].used || !kvt_key_eq(&e->slots[s].key, &o->key)) {
        pthread_mutex_unlock(&e->jlock);
        return -ENOENT; /* not on the device: forget the entry */
    }
    struct del_wait *dw = kvt_xcalloc(1, sizeof(*dw));
    dw->jw.fn = del_journaled;
    dw->e = e;
    dw->slot = s;
    dw->refs = 2;
    struct rb_rec r = {.op = RB_DEL, .slot = s, .gen = e->slots[s].gen};
    rb_jappend_locked(e, &r, &dw->jw);
    if (e->ckpt_err[0]) { /* a smaller index may fit now */
        pthread_cond_signal(&e->ckpt_cond);
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_sec += 2;
        while (!dw->done && !e->fatal &&
               pthread_cond_timedwait(&e->jcond, &e->jlock, &ts) != ETIMEDOUT)
            ;
    }
    bool last = --dw->refs == 0;
    pthread_mutex_unlock(&e->jlock);
    if (last)
        free(dw);
    return 0;
}

/* ------------------------------------------------------- status/close */

static void rb_status(kvt_l2 *l2, json_t *out)
{
    struct rb_engine *e = l2->engine;
    json_object_set_new(out, "device_path", json_string(e->path));
    json_object_set_new(out, "device_bytes", json_integer((json_int_t)e->dev_size));
    json_object_set_new(out, "block_device", json_boolean(e->blockdev));
    /* a slot: header_bytes, then up to slot_bytes of payload */
    json_object_set_new(out, "slot_bytes",
                        json_integer((json_int_t)(e->g.slot_bytes - e->g.header_bytes)));
    json_object_set_new(out, "slot_stride_bytes", json_integer((json_int_t)e->g.slot_bytes));
    json_object_set_new(out, "header_bytes", json_integer(e->g.header_bytes));
    json_object_set_new(out, "block_align", json_integer(e->g.block));
    json_object_set_new(out, "slots", json_integer(e->g.nslots));
    json_object_set_new(out, "data_offset", json_integer((json_int_t)e->g.data_off));
    json_object_set_new(out, "odirect",
                        json_string(!e->odirect          ? "off"
                                    : e->odirect_refused ? "refused by file system (buffered)"
                                                         : "on"));
    json_object_set_new(out, "zero_copy", json_boolean(e->zero_copy));
    json_object_set_new(out, "bounced_transfers",
                        json_integer((json_int_t)atomic_load(&e->bounced)));
    json_object_set_new(out, "verify_failed",
                        json_integer((json_int_t)atomic_load(&e->verify_failed)));
    json_object_set_new(out, "io", kvt_ioeng_status(e->io));
    json_object_set_new(out, "num_store_workers", json_integer(e->nstore));
    json_object_set_new(out, "num_lookup_workers", json_integer(e->nlookup));
    json_object_set_new(out, "num_load_workers", json_integer(e->nload));
    json_t *m = json_object();
    pthread_mutex_lock(&e->jlock);
    json_object_set_new(out, "free_slots", json_integer(e->nfree));
    json_object_set_new(m, "checkpoint_seq", json_integer((json_int_t)e->ckpt_seq));
    json_object_set_new(m, "checkpoints_written", json_integer((json_int_t)e->ckpts));
    json_object_set_new(m, "checkpoint_bytes", json_integer((json_int_t)e->ckpt_bytes_last));
    json_object_set_new(m, "checkpoint_objects", json_integer(e->ckpt_nrec_last));
    json_object_set_new(m, "checkpoint_capacity_bytes",
                        json_integer((json_int_t)(e->g.ckpt_bytes - e->g.block)));
    json_object_set_new(m, "checkpoint_error",
                        e->ckpt_err[0] ? json_string(e->ckpt_err) : json_null());
    json_object_set_new(m, "journal_blocks", json_integer(e->g.jrnl_blocks));
    json_object_set_new(m, "journal_used_blocks", json_integer((json_int_t)(e->jnext - e->jtail)));
    json_object_set_new(m, "journal_writes", json_integer((json_int_t)e->jwrites));
    json_object_set_new(m, "journal_records", json_integer((json_int_t)e->jrecs));
    json_object_set_new(m, "records_since_checkpoint",
                        json_integer((json_int_t)e->recs_since_ckpt));
    json_object_set_new(m, "journal_blocked", json_boolean(e->jblocked));
    json_object_set_new(m, "recovered_from",
                        json_string(e->fresh ? "fresh device" : e->recovered_from));
    json_object_set_new(m, "verify_dropped",
                        json_integer((json_int_t)atomic_load(&e->verify_dropped)));
    json_object_set_new(m, "fatal", e->fatal ? json_string(e->fatal_msg) : json_null());
    json_object_set_new(m, "journal_recoveries", json_integer((json_int_t)e->jrecoveries));
    json_object_set_new(m, "journal_offset", json_integer((json_int_t)e->g.jrnl_off));
    json_object_set_new(m, "journal_next_block", json_integer((json_int_t)e->jnext));
    pthread_mutex_unlock(&e->jlock);
    json_object_set_new(out, "meta", m);
}

static bool rb_healthy(kvt_l2 *l2, char *msg, size_t cap)
{
    struct rb_engine *e = l2->engine;
    bool ok = true;
    pthread_mutex_lock(&e->jlock);
    if (e->fatal) {
        snprintf(msg, cap, "%s", e->fatal_msg);
        ok = false;
    } else if (e->ckpt_err[0]) {
        snprintf(msg, cap, "%s", e->ckpt_err);
        ok = false;
    } else if (e->odirect && e->odirect_refused) {
        snprintf(msg, cap, "ok (O_DIRECT refused by the file system: buffered I/O)");
    } else {
        snprintf(msg, cap, "ok");
    }
    pthread_mutex_unlock(&e->jlock);
    return ok;
}

static void engine_free(struct rb_engine *e)
{
    if (e->fd >= 0)
        close(e->fd);
    free(e->path);
    free(e->slots);
    free(e->freev);
    free(e->lost);
    if (e->cur)
        rb_jblock_free(e->cur);
    pthread_mutex_destroy(&e->jlock);
    pthread_cond_destroy(&e->ckpt_cond);
    pthread_cond_destroy(&e->jcond);
    kvt_l2_park_destroy(&e->park);
    kvt_l2_drain_destroy(&e->drain);
    free(e);
}

static void rb_close(kvt_l2 *l2)
{
    struct rb_engine *e = l2->engine;
    kvt_l2_life_stop(l2, &(struct kvt_l2_life){.stop_flag = &e->stop,
                                               .thread = &e->rec_thr,
                                               .thread_started = &e->rec_started,
                                               .park = &e->park,
                                               .park_pool = e->spool,
                                               .drain = &e->drain,
                                               .pools = {e->spool, e->lpool}});
    /* then raw_block's own: the journal, the final checkpoint, the device */
    rb_journal_drain(e);
    if (e->ckpt_started) { /* takes the final checkpoint */
        pthread_mutex_lock(&e->jlock);
        e->ckpt_stop = true;
        pthread_cond_signal(&e->ckpt_cond);
        pthread_mutex_unlock(&e->jlock);
        pthread_join(e->ckpt_thr, NULL);
    }
    kvt_ioeng_destroy(e->io);
    engine_free(e);
    l2->engine = NULL;
}

static const struct kvt_l2_ops rb_ops = {
    .submit = rb_submit,
    .remove = rb_remove,
    .status = rb_status,
    .healthy = rb_healthy,
    .close = rb_close,
};

/* A new engine with the options' settings; nothing opened yet. */
static struct rb_engine *engine_new(const struct kvt_raw_block_opts *o)
{
    struct rb_engine *e = kvt_xcalloc(1, sizeof(*e));
    e->fd = -1;
    pthread_mutex_init(&e->jlock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&e->ckpt_cond, &ca);
    pthread_cond_init(&e->jcond, &ca);
    pthread_condattr_destroy(&ca);
    kvt_l2_park_init(&e->park);
    kvt_l2_drain_init(&e->drain);
    e->path = kvt_xstrdup(o->device_path);
    e->odirect = o->use_odirect;
    e->zero_copy = o->zero_copy;
    e->verify = o->verify_on_load;
    e->periodic = o->periodic;
    e->durable = o->durable;
    e->interval_s = o->ckpt_interval_s;
    e->quiet_ms = o->idle_quiet_ms;
    memcpy(e->magic, o->meta_magic, 8);
    e->version = o->meta_version;
    e->max_xfer = o->max_xfer;
    e->nstore = o->num_store_workers;
    e->nlookup = o->num_lookup_workers;
    e->nload = o->num_load_workers;
    return e;
}

static int rb_open(kvt_l2 *l2, const struct kvt_l2_spec *spec, const void *opts, char *err,
                   size_t errcap)
{
    const struct kvt_raw_block_opts *o = opts;
    struct rb_engine *e = engine_new(o);
    int rc = rb_open_device(e, o, err, errcap);
    if (rc)
        goto fail;
    rc = rb_plan_device(e, o, err, errcap);
    if (rc)
        goto fail;
    e->slots = kvt_xcalloc(e->g.nslots, sizeof(*e->slots));
    e->freev = kvt_xcalloc(e->g.nslots, sizeof(uint32_t));
    e->lost = kvt_xcalloc(e->g.nslots, sizeof(uint32_t));
    if (e->fresh) {
        rc = rb_format_fresh(e);
        if (rc) {
            snprintf(err, errcap, "cannot write the metadata area of %s: %s", e->path,
                     kvt_strerror(rc));
            goto fail;
        }
    }
    e->last_ckpt_ns = e->last_change_ns = kvt_now_ns();
    rc = kvt_l2_life_init(l2, &rb_ops, spec, KVT_CODEC_OBJ, (uint64_t)e->g.nslots * e->g.slot_bytes,
                          err, errcap);
    if (rc)
        goto fail;
    l2->engine = e;
    char nm[16];
    snprintf(nm, sizeof(nm), "rbio%d", spec->index);
    int depth = o->io_engine == KVT_IOENG_URING ? o->queue_depth
                                                : o->num_store_workers + o->num_load_workers;
    rc = kvt_ioeng_create(&e->io, (enum kvt_ioeng_kind)o->io_engine, nm, depth, err, errcap);
    if (rc)
        goto fail_base;
    snprintf(nm, sizeof(nm), "rbs%d", spec->index);
    rc = kvt_tpool_create(&e->spool, nm, o->num_store_workers, NULL, NULL, NULL);
    snprintf(nm, sizeof(nm), "rbl%d", spec->index);
    if (!rc)
        rc = kvt_tpool_create(&e->lpool, nm, o->num_load_workers, NULL, NULL, NULL);
    if (rc) {
        snprintf(err, errcap, "cannot start worker threads: %s", kvt_strerror(rc));
        goto fail_base;
    }
    rc = pthread_create(&e->ckpt_thr, NULL, rb_ckpt_main, e);
    if (rc) {
        snprintf(err, errcap, "cannot start the checkpoint thread: %s", kvt_strerror(-rc));
        rc = -rc;
        goto fail_base;
    }
    e->ckpt_started = true;
    rc = kvt_l2_life_start_scan(l2, &e->park, &e->rec_thr, &e->rec_started, rb_recover_main,
                                "the recovery thread", err, errcap);
    if (rc)
        goto fail_base;
    kvt_info("%s: %s: %u slots of %llu bytes (header_bytes %u + objects up to %llu bytes), "
             "meta %llu bytes (2 x %llu checkpoint, %u journal blocks), %s, %s engine",
             l2->name, e->path, e->g.nslots, (unsigned long long)e->g.slot_bytes, e->g.header_bytes,
             (unsigned long long)(e->g.slot_bytes - e->g.header_bytes),
             (unsigned long long)e->g.meta_total, (unsigned long long)e->g.ckpt_bytes,
             e->g.jrnl_blocks, e->odirect && !e->odirect_refused ? "O_DIRECT" : "buffered",
             kvt_ioeng_kind_name((enum kvt_ioeng_kind)o->io_engine));
    return 0;
fail_base:
    if (e->ckpt_started) {
        pthread_mutex_lock(&e->jlock);
        e->ckpt_stop = true;
        e->recs_since_ckpt = 0;
        pthread_cond_signal(&e->ckpt_cond);
        pthread_mutex_unlock(&e->jlock);
        pthread_join(e->ckpt_thr, NULL);
    }
    kvt_tpool_destroy(e->spool);
    kvt_tpool_destroy(e->lpool);
    kvt_ioeng_destroy(e->io);
    l2->engine = NULL;
    kvt_l2_base_destroy(l2);
    if (e->created) /* nothing this start created stays behind */
        unlink(e->path);
    engine_free(e);
    return rc;
fail:
    if (e->created)
        unlink(e->path);
    engine_free(e);
    return rc ? rc : KVT_E_CONFIG;
}

const struct kvt_l2_adapter_desc kvt_l2_raw_block_desc = {
    .name = "raw_block",
    .opts_size = sizeof(struct kvt_raw_block_opts),
    .parse = kvt_raw_block_parse,
    .open = rb_open,
    .check = kvt_raw_block_check,
    .storage = kvt_raw_block_storage,
};
