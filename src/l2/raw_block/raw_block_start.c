/*
 * raw_block start-up: open the device or file (refusing one in use),
 * plan the layout against what it holds (recover kvtier's own index,
 * format an empty one, refuse anything else unless "format": "force"),
 * and the background recovery: checkpoint, journal replay, slot-header
 * verification, while stores wait.
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
#include "key/blocktag.h"
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

/* Read each used slot's header area and drop entries that do not match. */
static void verify_slots(kvt_l2 *l2, struct rb_engine *e)
{
    uint8_t *buf = kvt_xmemalign(e->g.block, e->g.header_bytes);
    for (uint32_t s = 0; s < e->g.nslots && !atomic_load(&e->stop); s++) {
        struct rb_slot *sl = &e->slots[s];
        if (!sl->used)
            continue;
        const char *why = NULL;
        struct kvt_objhdr h;
        struct rb_trailer tr;
        bool ok = kvt_pread_all(e->fd, buf, e->g.header_bytes, rb_slot_off(&e->g, s), NULL) == 0 &&
                  kvt_objhdr_decode(buf, KVT_OBJHDR_MIN, &h, &why) == 0 &&
                  kvt_objhdr_matches(&h, KVT_CODEC_OBJ, &sl->key) &&
                  rb_trailer_decode(buf + e->g.header_bytes - RB_TRAILER, &tr) == 0 &&
                  tr.slot == s && tr.gen == sl->gen && tr.plen == sl->plen && tr.xxh3 == sl->xxh3 &&
                  tr.instance == e->instance;
        if (!ok) {
            sl->used = 0;
            atomic_fetch_add(&e->verify_dropped, 1);
        }
    }
    free(buf);
    if (atomic_load(&e->verify_dropped))
        kvt_warn("%s: %llu index entries did not match their slot headers: dropped", l2->name,
                 (unsigned long long)atomic_load(&e->verify_dropped));
}

/* With KV events on: the engine block hashes slot s's header holds (a new
 * reference), or NULL (none, or a header that does not verify as the
 * slot's object: its load finds that out). buf: header_bytes, aligned. */
static struct kvt_blocktag *slot_tag(struct rb_engine *e, uint32_t s, uint8_t *buf)
{
    const struct rb_slot *sl = &e->slots[s];
    struct kvt_objhdr h;
    const char *why = NULL;
    if (kvt_pread_all(e->fd, buf, e->g.header_bytes, rb_slot_off(&e->g, s), NULL) ||
        kvt_objhdr_decode(buf, KVT_OBJHDR_MIN, &h, &why) ||
        !kvt_objhdr_matches(&h, KVT_CODEC_OBJ, &sl->key) || h.payload_len != sl->plen ||
        h.payload_xxh3 != sl->xxh3)
        return NULL;
    return kvt_objhdr_tag(buf, &h);
}

/*
 * Background start-up: checkpoint payload, journal replay, slot-header
 * verification, then the free list and the base index (oldest generation
 * coldest). The slot table is not shared yet: no store runs before the
 * parked stores are released, loads find nothing in the base index until
 * adoption.
 */
void *rb_recover_main(void *arg)
{
    kvt_l2 *l2 = arg;
    struct rb_engine *e = l2->engine;
    pthread_setname_np(pthread_self(), "rb-recover");
    uint64_t t0 = kvt_now_ns();
    if (!e->fresh) {
        struct rb_ckpt_hdr h;
        int copy = -1;
        int rc = rb_read_checkpoint(e->fd, &e->g, e->magic, e->version, e->slots, &h, &copy);
        uint64_t next_bseq = 0, nrecs = 0, maxgen = 0;
        if (rc == 0)
            rc = rb_replay_journal(e->fd, &e->g, h.instance, h.jstart, e->slots, &next_bseq, &nrecs,
                                   &maxgen);
        pthread_mutex_lock(&e->jlock);
        if (rc) {
            rb_set_fatal_locked(e,
                                "cannot read the metadata checkpoint (%s): set "
                                "\"load_checkpoint_on_init\": false to start empty",
                                rc);
            memset(e->slots, 0, (size_t)e->g.nslots * sizeof(*e->slots));
        } else {
            e->instance = h.instance;
            e->next_gen = KVT_MAX(h.next_gen, maxgen + 1);
            e->jtail = h.jstart;
            e->jnext = next_bseq;
            e->ckpt_seq = h.seq;
            snprintf(e->recovered_from, sizeof(e->recovered_from),
                     "checkpoint %llu (copy %d, %u objects) + %llu journal records",
                     (unsigned long long)h.seq, copy, h.nrec, (unsigned long long)nrecs);
        }
        pthread_mutex_unlock(&e->jlock);
        if (!rc && e->verify)
            verify_slots(l2, e);
    }
    /* free list (lowest slot first) and adoption */
    uint32_t nused = 0;
    for (uint32_t s = 0; s < e->g.nslots; s++)
        nused += e->slots[s].used;
    struct rb_gen_slot *v = kvt_xcalloc(nused ? nused : 1, sizeof(*v));
    uint32_t k = 0;
    pthread_mutex_lock(&e->jlock);
    e->nfree = 0;
    for (uint32_t s = e->g.nslots; s-- > 0;) {
        if (e->slots[s].used)
            v[k++] = (struct rb_gen_slot){e->slots[s].gen, s};
        else
            e->freev[e->nfree++] = s;
    }
    pthread_mutex_unlock(&e->jlock);
    rb_sort_newest_first(v, nused);
    uint64_t objs = 0, bytes = 0;
    /* with KV events on, one header read per object: the hashes name it */
    uint8_t *hbuf =
        l2->keep_tags && !e->fresh ? kvt_xmemalign(e->g.block, e->g.header_bytes) : NULL;
    for (uint32_t i = 0; i < nused; i++) {
        struct rb_slot *sl = &e->slots[v[i].slot];
        struct kvt_blocktag *tag =
            hbuf && !atomic_load(&e->stop) ? slot_tag(e, v[i].slot, hbuf) : NULL;
        if (kvt_l2_adopt_tag(l2, &sl->key, tag, (uint32_t)KVT_MIN(e->g.slot_bytes, UINT32_MAX),
                             sl->len, v[i].slot, 0, false, true)) {
            objs++;
            bytes += e->g.slot_bytes;
        } else { /* two slots for one key (cannot happen): keep the newer */
            pthread_mutex_lock(&e->jlock);
            sl->used = 0;
            e->freev[e->nfree++] = v[i].slot;
            pthread_mutex_unlock(&e->jlock);
        }
    }
    free(v);
    free(hbuf);
    double secs = kvt_l2_recovery_done(l2, objs, bytes, t0);
    kvt_info("%s: recovered %llu objects (%s) from %s in %.3f s", l2->name,
             (unsigned long long)objs, e->fresh ? "fresh device" : e->recovered_from, e->path,
             secs);
    kvt_l2_park_release(&e->park, e->spool);
    return NULL;
}

/* Open the device or file (a block device exclusively: no mount, RAID or
 * second server can claim it while we run); size it; lock it against a
 * second server. A missing file is created only with capacity_bytes, and
 * removed again by rb_open's failure path (e->created). */
int rb_open_device(struct rb_engine *e, const struct kvt_raw_block_opts *o, char *err,
                   size_t errcap)
{
    struct stat st;
    if (stat(e->path, &st) < 0) {
        if (errno != ENOENT || !o->capacity_bytes) {
            snprintf(err, errcap,
                     "device_path %s: %s (give a block device or a pre-sized file: fallocate "
                     "-l SIZE %s, or set capacity_bytes to create one)",
                     e->path, kvt_strerror(-errno), e->path);
            return -errno;
        }
        int fd = open(e->path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd >= 0)
            e->created = true;
        int frc = fd < 0 ? -errno : -posix_fallocate(fd, 0, (off_t)o->capacity_bytes);
        if (fd >= 0)
            close(fd);
        if (frc) {
            snprintf(err, errcap, "cannot create %s with %llu bytes: %s", e->path,
                     (unsigned long long)o->capacity_bytes, kvt_strerror(frc));
            return frc;
        }
        stat(e->path, &st);
    } else {
        /* mounted, swap, held, a loop's backing file, another server */
        int rc = rb_in_use(e->path, err, errcap);
        if (rc)
            return rc;
    }
    if (!S_ISBLK(st.st_mode) && !S_ISREG(st.st_mode)) {
        snprintf(err, errcap, "device_path %s is neither a block device nor a regular file",
                 e->path);
        return -EINVAL;
    }
    e->blockdev = S_ISBLK(st.st_mode);
    int flags = O_RDWR | O_CLOEXEC | (e->blockdev ? O_EXCL : 0);
    e->fd = open(e->path, flags | (e->odirect ? O_DIRECT : 0));
    if (e->fd < 0 && e->odirect && errno == EINVAL) {
        e->odirect_refused = true;
        kvt_warn("raw_block %s: O_DIRECT refused by the file system: buffered I/O", e->path);
        e->fd = open(e->path, flags);
    }
    if (e->fd < 0 && errno == EBUSY) {
        snprintf(err, errcap,
                 "%s is in use by another process that holds it exclusively (a mount, swap, "
                 "RAID or LVM, or another kvtier server)",
                 e->path);
        return -EBUSY;
    }
    if (e->fd < 0) {
        snprintf(err, errcap, "cannot open device_path %s: %s", e->path, kvt_strerror(-errno));
        return -errno;
    }
    if (flock(e->fd, LOCK_EX | LOCK_NB) < 0) {
        snprintf(err, errcap, "device_path %s is in use by another process", e->path);
        return -EBUSY;
    }
    int rc = rb_dev_size(e->fd, &st, o, &e->dev_size, err, errcap);
    if (rc)
        return rc;
    e->usable = o->capacity_bytes ? KVT_MIN(o->capacity_bytes, e->dev_size) : e->dev_size;
    return 0;
}

/* What the device holds decides what opening does (rb_plan): read through
 * a buffered descriptor of its own (e->fd may be O_DIRECT). Foreign
 * content under "format": "force" loses its signatures here. */
int rb_plan_device(struct rb_engine *e, const struct kvt_raw_block_opts *o, char *err,
                   size_t errcap)
{
    int fd = open(e->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int rc = -errno;
        snprintf(err, errcap, "cannot open device_path %s: %s", e->path, kvt_strerror(rc));
        return rc;
    }
    struct rb_plan p;
    int rc = rb_plan(o, fd, e->dev_size, e->usable, !e->blockdev, &p, err, errcap);
    close(fd);
    if (rc)
        return rc;
    if (p.wipe) {
        kvt_warn("raw_block %s held %s: \"format\": \"force\" overwrites it", e->path, p.forced);
        rc = rb_wipe_signatures(e->path, err, errcap);
        if (rc)
            return rc;
    }
    if (p.compat)
        kvt_warn("raw_block %s was formatted with slots of slot_bytes %llu, header included: "
                 "kept as it is (objects up to %llu bytes); to get slot_bytes per object, set "
                 "\"load_checkpoint_on_init\": false once (it starts empty)",
                 e->path, (unsigned long long)p.g.slot_bytes,
                 (unsigned long long)(p.g.slot_bytes - p.g.header_bytes));
    e->g = p.g;
    e->fresh = p.fresh;
    return 0;
}

/* A device with no checkpoint of our magic: a new instance and two empty
 * checkpoint copies (both, so an older format's copy can never win). */
int rb_format_fresh(struct rb_engine *e)
{
    if (getrandom(&e->instance, sizeof(e->instance), 0) != sizeof(e->instance))
        e->instance = kvt_now_ns() ^ ((uint64_t)getpid() << 32);
    e->next_gen = 1;
    e->jnext = e->jtail = 0;
    struct rb_ckpt_hdr h = {.version = e->version,
                            .instance = e->instance,
                            .next_gen = 1,
                            .block = e->g.block,
                            .header_bytes = e->g.header_bytes,
                            .slot_bytes = e->g.slot_bytes,
                            .meta_total = e->g.meta_total,
                            .data_off = e->g.data_off,
                            .nslots = e->g.nslots};
    memcpy(h.magic, e->magic, 8);
    for (uint64_t seq = 1; seq <= 2; seq++) {
        h.seq = seq;
        int rc = rb_write_checkpoint(e->fd, &e->g, &h, NULL, 0, (int)(seq % 2));
        if (rc)
            return rc;
    }
    e->ckpt_seq = 2;
    return 0;
}
