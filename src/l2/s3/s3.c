/*
 * s3 adapter: objects in an S3 bucket (AWS S3, MinIO, Ceph RGW, any
 * S3-compatible server), over libcurl with our SigV4 signing.
 *
 * Object = object header (objfmt.h, 512 bytes) + payload, under
 *          "<key_prefix>/<obj name>" (or the bare obj name), obj name =
 *          KVT_CODEC_OBJ ("model@0x%08x@group@hash[@salt]"): the salt is part
 *          of the name, so tenants never share an object. Each PUT also
 *          carries "x-amz-meta-kvt: 1 <logical length> <payload length>" so a
 *          HEAD can answer a lookup.
 *
 *   Store:  reserve capacity -> PUT (header + payload streamed from L1).
 *   Lookup: the index is the size cache: a key whose length is known is a
 *           hit without a request; otherwise HEAD, whose Content-Length and
 *           x-amz-meta-kvt must agree.
 *   Load:   GET; the header is checked as it arrives (identity, lengths, fits
 *           the destination: never an overrun), the payload goes straight to
 *           the destination and its checksum is verified. Torn, foreign or
 *           corrupt objects are misses, counted, and deleted.
 *   Delete: DELETE, a batch's requests all in flight at once (synchronous
 *           for the caller: eviction, purge or the delete request).
 *   Start-up: ListObjectsV2 over key_prefix, page by page on the I/O thread,
 *           restores accounting and LRU order (LastModified) while serving;
 *           with max_capacity_gb > 0 stores wait for it.
 *
 * Failure: see s3_http.c (circuit breaker). While the breaker is open,
 * lookups miss, stores fail (counted), loads fail. A 4xx refusal (bad
 * credentials, no such bucket) makes the adapter unhealthy with S3's error
 * code and message until a request succeeds again.
 *
 * Threads: the I/O thread (s3_http.c) runs every transfer and every
 * completion in this file. Locks: l2->lock (base) for index updates, never
 * across I/O; e->lock for the breaker fields; e->park.lock (a leaf, taken
 * under e->lock) for the parked stores.
 */
#include "common/log.h"
#include "common/util.h"
#include "kvtier/error.h"
#include "l2/adapters.h"
#include "l2/budget.h"
#include "common/cfg.h"
#include "l2/engine.h"
#include "l2/life.h"
#include "l2/kit/dirlock.h"
#include "l2/kit/objfmt.h"
#include "l2/s3/s3_int.h"
#include "l2/s3/s3_nixl.h"
#include "l2/s3/sigv4.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

/* ------------------------------------------------------------ names */

/* Canonical path of a key's object: base + "/" + encoded "<prefix><name>". */
static int obj_path(const struct s3_engine *e, const kvt_key *k, char *out, size_t cap)
{
    char name[KVT_NAME_MAX + 1], full[KVT_NAME_MAX + 256];
    int n = kvt_key_encode(KVT_CODEC_OBJ, k, name);
    if (n < 0)
        return n;
    int fl = snprintf(full, sizeof(full), "%s%s", e->prefix, name);
    int bl = snprintf(out, cap, "%s/", e->base);
    int el = kvt_sigv4_uri_encode(full, (size_t)fl, false, out + bl, cap - (size_t)bl);
    return el < 0 ? KVT_E_BADKEY : bl + el;
}

/* ----------------------------------------------------------- batches */

struct s3_batch {
    kvt_l2 *l2;
    kvt_l2_task *t;
    _Atomic uint32_t left;          /* requests outstanding + 1 while submitting */
    uint8_t *hdrs;                  /* S3_HDR bytes per key */
    struct s3_req *reqs;            /* one per key (unused entries stay zero) */
    struct s3_req *q_head, *q_tail; /* prepared, submitted at once by batch_flush */
};

static void batch_put(struct s3_batch *b)
{
    if (atomic_fetch_sub_explicit(&b->left, 1, memory_order_acq_rel) != 1)
        return;
    for (uint32_t i = 0; i < b->t->n; i++)
        kvt_s3_req_clear(&b->reqs[i]);
    kvt_l2_task_finish(b->l2, b->t);
    free(b->hdrs);
    free(b->reqs);
    free(b);
}

static struct s3_batch *batch_new(kvt_l2 *l2, kvt_l2_task *t, bool hdrs)
{
    struct s3_batch *b = kvt_xcalloc(1, sizeof(*b));
    b->l2 = l2;
    b->t = t;
    b->reqs = kvt_xcalloc(t->n, sizeof(struct s3_req));
    if (hdrs)
        b->hdrs = kvt_xmalloc((size_t)t->n * S3_HDR);
    atomic_store(&b->left, 1);
    return b;
}

/* Count reqs[i] as outstanding, completing through done. */
static struct s3_req *batch_prep(struct s3_batch *b, uint32_t i, s3_done_fn done)
{
    struct s3_req *r = &b->reqs[i];
    r->done = done;
    r->ctx = b;
    r->i = i;
    atomic_fetch_add(&b->left, 1);
    return r;
}

static void batch_send(struct s3_batch *b, uint32_t i, s3_done_fn done)
{
    struct s3_req *r = batch_prep(b, i, done);
    r->next = NULL;
    if (b->q_tail)
        b->q_tail->next = r;
    else
        b->q_head = r;
    b->q_tail = r;
}

/* Submit what batch_send prepared: one lock and one wakeup per batch. */
static void batch_flush(struct s3_engine *e, struct s3_batch *b)
{
    if (b->q_head)
        kvt_s3_submit_reqs(e, b->q_head);
    b->q_head = b->q_tail = NULL;
}

static int outcome_err(const struct s3_req *r)
{
    switch (r->outcome) {
    case S3_OK:
        return 0;
    case S3_NOTFOUND:
        return KVT_E_NOTFOUND;
    case S3_BADDATA:
        return KVT_E_CORRUPT;
    case S3_UNAVAILABLE:
    case S3_CONN:
        return KVT_E_UNHEALTHY;
    default:
        return -EIO;
    }
}

/* -------------------------------------------------------------- store */

static void store_done(struct s3_engine *e, struct s3_req *r)
{
    (void)e;
    struct s3_batch *b = r->ctx;
    kvt_l2 *l2 = b->l2;
    kvt_l2_task *t = b->t;
    kvt_key ck;
    kvt_l2_canon(l2, &t->keys[r->i], &ck);
    if (r->outcome == S3_OK) {
        kvt_l2_publish(l2, &ck);
        atomic_fetch_add(&l2->counters.store_ok, 1);
        kvt_l2_task_ok(t, r->i, S3_HDR + r->plen);
    } else if (r->outcome == S3_PRECOND) {
        /* If-None-Match: the key is there already (another server's object,
         * or a removal's marker): ours never went in, its bytes go back.
         * Not adopted: a lookup finds out what it is */
        kvt_l2_unreserve(l2, &ck);
        atomic_fetch_add(&l2->counters.store_skipped, 1);
        kvt_l2_task_ok(t, r->i, 0);
    } else {
        /* no answer, a 5xx or a cut transfer: the object may have landed,
         * so a shared budget keeps the charge (settled, not refunded) */
        if (r->outcome == S3_CONN || r->outcome == S3_SERVER || r->outcome == S3_BADDATA)
            kvt_l2_unreserve_unsure(l2, &ck);
        else
            kvt_l2_unreserve(l2, &ck);
        atomic_fetch_add(&l2->counters.store_failed, 1);
        kvt_l2_task_fail(t, r->i, outcome_err(r));
    }
    batch_put(b);
}

static void submit_store(kvt_l2 *l2, struct s3_engine *e, kvt_l2_task *t)
{
    struct s3_batch *b = batch_new(l2, t, true);
    for (uint32_t i = 0; i < t->n; i++) {
        const kvt_buf *src = &t->bufs[i];
        kvt_key ck;
        kvt_l2_canon(l2, &t->keys[i], &ck);
        struct s3_req *r = &b->reqs[i];
        uint32_t logical = t->meta[i].len ? t->meta[i].len : (uint32_t)src->len;
        int rc = src->len > KVT_MAX_OBJECT ? KVT_E_TOOBIG
                                           : obj_path(e, &t->keys[i], r->path, sizeof(r->path));
        if (rc >= 0)
            rc = kvt_l2_reserve(l2, &ck, (uint32_t)(S3_HDR + src->len), logical, S3_HDR,
                                S3_F_LEN_KNOWN);
        if (rc == -EEXIST) {
            atomic_fetch_add(&l2->counters.store_skipped, 1);
            kvt_l2_task_ok(t, i, 0);
            continue;
        }
        if (rc < 0) {
            atomic_fetch_add(&l2->counters.store_failed, 1);
            kvt_l2_task_fail(t, i, rc);
            continue;
        }
        t->meta[i].len = logical;
        uint8_t *hdr = b->hdrs + (size_t)i * S3_HDR;
        kvt_objhdr_encode(hdr, S3_HDR, &t->keys[i], &t->meta[i], t->meta[i].serde, src->len,
                          kvt_payload_hash(src->ptr, src->len));
        r->op = S3_PUT;
        r->put_hdr = hdr;
        r->payload = src->ptr;
        r->plen = src->len;
        snprintf(r->meta, sizeof(r->meta), "1 %u %llu", logical, (unsigned long long)src->len);
        if (e->shared_budget) /* like SET ... NX: another server's object is never rewritten */
            snprintf(r->cond, sizeof(r->cond), "If-None-Match: *");
        if (S3_HDR + src->len > e->mpu_threshold)
            kvt_s3_put_multipart(e, batch_prep(b, i, store_done));
        else
            batch_send(b, i, store_done);
    }
    batch_flush(e, b);
    batch_put(b);
}

/* ------------------------------------------------------------- lookup */

static void marker_gone(struct s3_engine *e, struct s3_req *r)
{
    (void)e;
    kvt_s3_req_clear(r);
    free(r);
}

/*
 * A lookup or load found an empty object under ck: the marker a removal
 * claimed (see "remove" below) and has not deleted yet, or left behind
 * when its server died. It is a miss (the index forgets ck); it is deleted
 * if it is still that marker (If-Match on its ETag: never another server's
 * object stored since), so that the key can be stored again. Anyone may
 * delete a marker: the claiming server subtracted the object's bytes when
 * its claim landed.
 */
static void marker_found(struct s3_engine *e, const struct s3_req *r, const kvt_key *ck)
{
    kvt_l2_drop_gone(e->l2, ck, 1);
    atomic_fetch_add(&e->markers, 1);
    if (!r->etag[0])
        return;
    struct s3_req *d = kvt_xcalloc(1, sizeof(*d));
    d->op = S3_DELETE;
    memcpy(d->path, r->path, sizeof(d->path));
    snprintf(d->cond, sizeof(d->cond), "If-Match: %s", r->etag);
    d->done = marker_gone;
    kvt_s3_submit_req(e, d);
}

static void head_done(struct s3_engine *e, struct s3_req *r)
{
    struct s3_batch *b = r->ctx;
    kvt_l2 *l2 = b->l2;
    kvt_l2_task *t = b->t;
    kvt_key ck;
    kvt_l2_canon(l2, &t->keys[r->i], &ck);
    if (r->outcome == S3_OK && r->clen == 0 && e->shared_budget) {
        marker_found(e, r, &ck); /* a removal's marker: a miss */
    } else if (r->outcome == S3_OK) {
        unsigned v = 0;
        unsigned long long logical = 0, plen = 0;
        if (sscanf(r->rmeta, "%u %llu %llu", &v, &logical, &plen) == 3 && v == 1 &&
            r->clen == (int64_t)(S3_HDR + plen) && logical <= KVT_MAX_OBJECT &&
            plen <= 2ull * KVT_MAX_OBJECT) {
            if (kvt_l2_pin_found(l2, &ck, (uint32_t)r->clen, (uint32_t)logical, S3_HDR,
                                 S3_F_LEN_KNOWN)) {
                t->meta[r->i].len = (uint32_t)logical;
                kvt_l2_task_ok(t, r->i, 0);
            }
        } else {
            atomic_fetch_add(&e->foreign, 1); /* not written by kvtier, or torn */
        }
    } else if (r->outcome == S3_NOTFOUND) {
        kvt_l2_drop_gone(l2, &ck, 1);
    }
    batch_put(b);
}

static void submit_lookup(kvt_l2 *l2, struct s3_engine *e, kvt_l2_task *t)
{
    if (!kvt_s3_available(e)) { /* breaker open: every key is a miss */
        kvt_l2_task_finish(l2, t);
        return;
    }
    struct s3_batch *b = batch_new(l2, t, false);
    uint8_t *need = kvt_xcalloc(t->n, 1);
    pthread_mutex_lock(&l2->lock);
    for (uint32_t i = 0; i < t->n; i++) {
        kvt_key ck;
        kvt_l2_canon(l2, &t->keys[i], &ck);
        struct kvt_l2_obj *o = kvt_l2_find_locked(l2, &ck);
        if (!o) {
            need[i] = 1;
        } else if (kvt_l2_obj_state(o) == KVT_OBJ_READY) {
            if ((o->flags & S3_F_LEN_KNOWN) && o->pins < UINT16_MAX) {
                kvt_l2_obj_pin_locked(l2, o); /* the size cache answers: no request */
                t->meta[i].len = o->len;
                kvt_bm_set(t->ok, i);
            } else {
                need[i] = 1; /* listed at start-up: HEAD tells the length */
            }
        }
    }
    pthread_mutex_unlock(&l2->lock);
    for (uint32_t i = 0; i < t->n; i++) {
        if (!need[i])
            continue;
        struct s3_req *r = &b->reqs[i];
        if (obj_path(e, &t->keys[i], r->path, sizeof(r->path)) < 0)
            continue;
        r->op = S3_HEAD;
        batch_send(b, i, head_done);
    }
    free(need);
    batch_flush(e, b);
    batch_put(b);
}

/* --------------------------------------------------------------- load */

/* The first S3_HDR bytes of a GET arrived: check them before any payload
 * byte is written to the destination. */
static int64_t load_hdr(struct s3_req *r)
{
    struct s3_batch *b = r->ctx;
    struct kvt_objhdr h;
    const char *why = NULL;
    if (kvt_objhdr_decode(r->hbuf, S3_HDR, &h, &why) == 0) {
        if (!kvt_objhdr_matches(&h, KVT_CODEC_OBJ, &b->t->keys[r->i]))
            why = "header names another key";
        else if (h.hdr_len != S3_HDR)
            why = "unexpected header size";
        else if (r->clen >= 0 && (uint64_t)r->clen != S3_HDR + h.payload_len)
            why = "object size does not match the header (truncated or extended)";
        else if (h.payload_len > r->cap) {
            snprintf(r->err_code, sizeof(r->err_code), "TooBig");
            return -1; /* larger than the destination: a miss, not corruption */
        } else
            return (int64_t)h.payload_len;
    }
    snprintf(r->err_code, sizeof(r->err_code), "Corrupt");
    snprintf(r->err_msg, sizeof(r->err_msg), "%s", why ? why : "bad header");
    return -1;
}

/* The DELETE of a corrupt object a load found is done: only now is the load
 * answered (a miss), so that a lookup that follows cannot find the object
 * again, adopt it and count the same corruption twice. */
static void corrupt_deleted(struct s3_engine *e, struct s3_req *r)
{
    (void)e;
    struct s3_batch *b = r->ctx;
    kvt_key ck;
    kvt_l2_canon(b->l2, &b->t->keys[r->i], &ck);
    kvt_l2_drop_gone(b->l2, &ck, 1);
    kvt_l2_task_fail(b->t, r->i, KVT_E_CORRUPT);
    batch_put(b);
}

static void get_done(struct s3_engine *e, struct s3_req *r)
{
    struct s3_batch *b = r->ctx;
    kvt_l2 *l2 = b->l2;
    kvt_l2_task *t = b->t;
    kvt_key ck;
    kvt_l2_canon(l2, &t->keys[r->i], &ck);
    const char *why = NULL;
    if (r->outcome == S3_OK) {
        struct kvt_objhdr h;
        if (r->want < 0 && r->got == 0 && r->clen == 0 && e->shared_budget) {
            marker_found(e, r, &ck); /* a removal's marker: a miss, not corruption */
            kvt_l2_task_fail(t, r->i, KVT_E_NOTFOUND);
            batch_put(b);
            return;
        }
        if (r->want < 0)
            why = "object shorter than a header";
        else if ((uint64_t)r->want != r->got)
            why = "object shorter than its header says";
        else if (kvt_objhdr_decode(r->hbuf, S3_HDR, &h, &why) == 0 &&
                 kvt_payload_hash(r->dst, r->got) != h.payload_xxh3)
            why = "payload checksum mismatch";
        if (!why) {
            t->meta[r->i] = h.meta;
            t->bufs[r->i].len = r->got;
            kvt_l2_task_ok(t, r->i, S3_HDR + r->got);
            batch_put(b);
            return;
        }
    } else if (r->outcome == S3_BADDATA && strcmp(r->err_code, "Corrupt") == 0) {
        why = r->err_msg;
    }
    if (why) {
        char ks[400];
        atomic_fetch_add(&l2->counters.corrupt, 1);
        kvt_warn("%s: corrupt or foreign object for %s (%s): deleted, treated as a miss", l2->name,
                 kvt_key_str(&t->keys[r->i], ks, sizeof(ks)), why);
        kvt_s3_req_clear(r);
        r->op = S3_DELETE;
        r->done = corrupt_deleted; /* ctx and i stay: the batch still waits */
        kvt_s3_submit_req(e, r);
        return;
    } else {
        if (r->outcome == S3_NOTFOUND)
            kvt_l2_drop_gone(l2, &ck, 1);
        kvt_l2_task_fail(t, r->i, outcome_err(r));
    }
    batch_put(b);
}

static void submit_load(kvt_l2 *l2, struct s3_engine *e, kvt_l2_task *t)
{
    struct s3_batch *b = batch_new(l2, t, true);
    for (uint32_t i = 0; i < t->n; i++) {
        struct s3_req *r = &b->reqs[i];
        if (obj_path(e, &t->keys[i], r->path, sizeof(r->path)) < 0) {
            kvt_l2_task_fail(t, i, KVT_E_BADKEY);
            continue;
        }
        r->op = S3_GET;
        r->hbuf = b->hdrs + (size_t)i * S3_HDR;
        r->dst = t->bufs[i].ptr;
        r->cap = t->bufs[i].len;
        r->on_hdr = load_hdr;
        batch_send(b, i, get_done);
    }
    batch_flush(e, b);
    batch_put(b);
}

/* ------------------------------------------------------------- submit */

static void fail_task(kvt_l2 *l2, kvt_l2_task *t)
{
    for (uint32_t i = 0; i < t->n; i++)
        kvt_l2_task_fail(t, i, KVT_E_UNHEALTHY);
    if (t->kind == KVT_L2_STORE)
        atomic_fetch_add(&l2->counters.store_failed, t->n);
    kvt_l2_task_finish(l2, t);
}

static void s3_submit(kvt_l2 *l2, kvt_l2_task *t)
{
    struct s3_engine *e = l2->engine;
    switch (t->kind) {
    case KVT_L2_STORE:
        /* the start-up listing is still counting what the bucket holds;
         * brk is read under lock so that a breaker opening fails t */
        pthread_mutex_lock(&e->lock);
        bool parked = e->brk == BRK_CLOSED && kvt_l2_park_task(&e->park, t);
        pthread_mutex_unlock(&e->lock);
        if (parked)
            return;
        if (!kvt_s3_available(e)) {
            fail_task(l2, t);
            return;
        }
        submit_store(l2, e, t);
        break;
    case KVT_L2_LOOKUP:
        submit_lookup(l2, e, t);
        break;
    case KVT_L2_LOAD:
        if (!kvt_s3_available(e)) {
            fail_task(l2, t);
            return;
        }
        submit_load(l2, e, t);
        break;
    }
}

void kvt_s3_on_breaker_open(kvt_l2 *l2)
{
    struct s3_engine *e = l2->engine;
    for (kvt_l2_task *p = kvt_l2_park_take(&e->park, false), *nx; p; p = nx) {
        nx = p->next;
        p->next = NULL;
        fail_task(l2, p);
    }
}

/* ------------------------------------------------------------- remove */

struct removal {
    pthread_mutex_t m;
    pthread_cond_t c;
    uint32_t left;
};

static void removal_done(struct s3_engine *e, struct s3_req *r)
{
    (void)e;
    struct removal *w = r->ctx;
    pthread_mutex_lock(&w->m);
    if (--w->left == 0)
        pthread_cond_signal(&w->c);
    pthread_mutex_unlock(&w->m);
}

/* Up to this many DELETEs in flight per call (their requests are ~2 KiB each);
 * the I/O thread runs at most s3_num_io_threads of them at once. */
#define REMOVE_CHUNK 1024u
/* A DELETE that S3 answered with a 5xx (InternalError, SlowDown) is sent
 * again, at most this many times, after 50 ms, then 200 ms (DELETE is
 * idempotent; AWS's SDKs retry the same way). */
#define REMOVE_RETRIES 2

/* Send the requests of reqs[0..m) whose rcs[r->i] is 1 (pending), all at
 * once, and wait for them; their outcomes are the caller's to read. */
static void send_round(struct s3_engine *e, struct s3_req *reqs, uint32_t m, const int *rcs)
{
    struct removal w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
    struct s3_req *head = NULL, **tail = &head;
    for (uint32_t i = 0; i < m; i++) {
        struct s3_req *r = &reqs[i];
        if (rcs[r->i] != 1)
            continue;
        kvt_s3_req_clear(r);
        r->next = NULL;
        r->ctx = &w;
        *tail = r;
        tail = &r->next;
        w.left++;
    }
    if (!w.left)
        return;
    kvt_s3_submit_reqs(e, head);
    pthread_mutex_lock(&w.m);
    while (w.left)
        pthread_cond_wait(&w.c, &w.m);
    pthread_mutex_unlock(&w.m);
}

/* What became of one request of a round: sets *rc (1 leaves it pending:
 * sent again after a pause, REMOVE_RETRIES times at most). */
typedef void (*judge_fn)(const struct s3_req *r, int *rc);

/* Send the pending requests of reqs[0..m) (rcs[r->i] == 1) at once, judge
 * their answers, and send the still pending ones again after 50 ms, then
 * 200 ms (5xx answers: InternalError, SlowDown; AWS's SDKs retry the same
 * way), while request_timeout has not passed since the first send: a retry
 * keeps the first attempt's no-progress clock (since_ns), so the whole
 * round never waits longer than one request would. Still pending after
 * that: giveup. */
static void rounds(struct s3_engine *e, struct s3_req *reqs, uint32_t m, int *rcs, judge_fn judge,
                   int giveup)
{
    uint64_t t0 = kvt_now_ns(), limit = (uint64_t)e->request_timeout_ms * 1000000ull;
    for (int attempt = 0; attempt <= REMOVE_RETRIES; attempt++) {
        bool again = false;
        for (uint32_t i = 0; i < m && !again; i++)
            again = rcs[reqs[i].i] == 1;
        if (!again)
            return;
        if (attempt) {
            long pause = attempt == 1 ? 50000000L : 200000000L;
            if (kvt_now_ns() + (uint64_t)pause >= t0 + limit)
                break; /* no time left for another attempt */
            struct timespec ts = {0, pause};
            nanosleep(&ts, NULL);
        }
        for (uint32_t i = 0; i < m; i++)
            reqs[i].since_ns = attempt ? t0 : 0;
        send_round(e, reqs, m, rcs);
        for (uint32_t i = 0; i < m; i++)
            if (rcs[reqs[i].i] == 1)
                judge(&reqs[i], &rcs[reqs[i].i]);
    }
    for (uint32_t i = 0; i < m; i++)
        if (rcs[reqs[i].i] == 1)
            rcs[reqs[i].i] = giveup;
}

static void judge_delete(const struct s3_req *r, int *rc)
{
    if (r->outcome == S3_OK)
        *rc = 0;
    else if (r->outcome == S3_NOTFOUND)
        *rc = -ENOENT;
    else if (r->outcome != S3_SERVER)
        *rc = -EIO;
}

/* claim states between the rounds (besides 1, pending, and the results) */
#define CL_FOUND 2   /* HEAD: an object with content: claim it */
#define CL_CLAIMED 3 /* our marker replaced it: delete the marker */

static void judge_head(const struct s3_req *r, int *rc)
{
    if (r->outcome == S3_OK)
        *rc = r->clen > 0 && r->etag[0] ? CL_FOUND : -ENOENT; /* empty: another's marker */
    else if (r->outcome == S3_NOTFOUND)
        *rc = -ENOENT;
    else if (r->outcome != S3_SERVER)
        *rc = -EIO;
}

static void judge_claim(const struct s3_req *r, int *rc)
{
    if (r->outcome == S3_OK && r->etag[0])
        *rc = CL_CLAIMED;
    else if (r->outcome == S3_PRECOND || r->outcome == S3_NOTFOUND)
        *rc = -ENOENT; /* another server's claim (or removal) came first */
    else
        *rc = -EIO; /* unknown (it may have landed): not subtracted, an over-count */
}

static void judge_marker(const struct s3_req *r, int *rc)
{
    *rc = r->outcome == S3_SERVER ? 1 : 0; /* ours either way: a marker left is a miss */
}

/* Prepare the requests of keys[base..base+m) with op; 1 (pending) where
 * the key has a path. */
static void prep_keys(struct s3_engine *e, struct s3_req *reqs, const kvt_key *keys, uint32_t base,
                      uint32_t m, int *rcs, enum s3_op op)
{
    for (uint32_t i = 0; i < m; i++) {
        struct s3_req *r = &reqs[i];
        kvt_s3_req_clear(r);
        memset(r, 0, sizeof(*r));
        r->i = base + i;
        int rc = obj_path(e, &keys[base + i], r->path, sizeof(r->path));
        rcs[base + i] = rc < 0 ? rc : 1; /* 1: pending */
        r->op = op;
        r->done = removal_done;
    }
}

/* The requests in state `from` go on as op (pending), the others stay out
 * of the next round; cond: a conditional header on each request's ETag. */
static void next_phase(struct s3_req *reqs, uint32_t m, int *rcs, int from, enum s3_op op,
                       const char *cond)
{
    for (uint32_t i = 0; i < m; i++) {
        struct s3_req *r = &reqs[i];
        if (rcs[r->i] != from)
            continue;
        snprintf(r->cond, sizeof(r->cond), "%s%s", cond, r->etag);
        r->op = op;
        r->meta[0] = 0; /* a marker carries no x-amz-meta-kvt: HEAD reads it as none */
        r->mem = "";
        r->mlen = 0;
        rcs[r->i] = 1;
    }
}

/*
 * Removal with a shared budget. S3's DELETE answers 204 whether it removed
 * the object or not, so it cannot tell which of two servers evicting one
 * object removed it, and the budget must subtract an object's bytes exactly
 * once (docs/remote-tiers.md, "The removal claim"). So a removal is claimed
 * first, each round sent for the whole batch at once:
 *   1. HEAD: 404, or an empty object (another server's marker): someone
 *      else removed it (-ENOENT). Otherwise its ETag.
 *   2. PUT If-Match: <that ETag>, an empty body: the object's bytes leave the
 *      tier at once, replaced by an empty marker. Only one server's PUT can
 *      match (the first changes the ETag): that server subtracts (0); a 412
 *      or 404 means another got there first (-ENOENT); no answer: unknown,
 *      not subtracted (-EIO: an over-count, never an under-count).
 *   3. DELETE If-Match: <the marker's ETag>: best effort; a marker left
 *      behind is a miss to lookups and loads, which delete it.
 * Stores are If-None-Match: *, so an object is never replaced in place:
 * between a HEAD and its claim the key can only lose its object, never get
 * a different one with the same size counted twice.
 */
static void claim_keys(struct s3_engine *e, const kvt_key *keys, uint32_t n, int *rcs)
{
    struct s3_req *reqs = kvt_xcalloc(KVT_MIN(n, REMOVE_CHUNK) + 1, sizeof(*reqs));
    for (uint32_t base = 0; base < n; base += REMOVE_CHUNK) {
        uint32_t m = KVT_MIN(n - base, REMOVE_CHUNK);
        prep_keys(e, reqs, keys, base, m, rcs, S3_HEAD);
        rounds(e, reqs, m, rcs, judge_head, -EIO);
        next_phase(reqs, m, rcs, CL_FOUND, S3_PUT, "If-Match: ");
        rounds(e, reqs, m, rcs, judge_claim, -EIO);
        for (uint32_t i = 0; i < m; i++) {
            int rc = rcs[reqs[i].i];
            if (rc == CL_CLAIMED)
                atomic_fetch_add(&e->claims, 1);
            else if (rc == -ENOENT)
                atomic_fetch_add(&e->claims_lost, 1);
        }
        next_phase(reqs, m, rcs, CL_CLAIMED, S3_DELETE, "If-Match: ");
        rounds(e, reqs, m, rcs, judge_marker, 0);
        for (uint32_t i = 0; i < m; i++)
            kvt_s3_req_clear(&reqs[i]);
    }
    free(reqs);
}

/* DELETE n objects concurrently (one lock, one wakeup per round), not one
 * round trip after another: evicting 256 objects takes about one round trip
 * per s3_num_io_threads objects. With a shared budget, each removal is
 * claimed first (claim_keys). */
static void remove_keys(struct s3_engine *e, const kvt_key *keys, uint32_t n, int *rcs)
{
    if (e->shared_budget) {
        claim_keys(e, keys, n, rcs);
        return;
    }
    struct s3_req *reqs = kvt_xcalloc(KVT_MIN(n, REMOVE_CHUNK) + 1, sizeof(*reqs));
    for (uint32_t base = 0; base < n; base += REMOVE_CHUNK) {
        uint32_t m = KVT_MIN(n - base, REMOVE_CHUNK);
        prep_keys(e, reqs, keys, base, m, rcs, S3_DELETE);
        rounds(e, reqs, m, rcs, judge_delete, -EIO);
        for (uint32_t i = 0; i < m; i++)
            kvt_s3_req_clear(&reqs[i]);
    }
    free(reqs);
}

static void s3_remove_batch(kvt_l2 *l2, const struct kvt_l2_obj *objs, uint32_t n, int *rcs)
{
    struct s3_engine *e = l2->engine;
    if (!kvt_s3_available(e)) {
        for (uint32_t i = 0; i < n; i++)
            rcs[i] = KVT_E_UNHEALTHY;
        return;
    }
    kvt_key *keys = kvt_xmalloc((n ? n : 1) * sizeof(*keys));
    for (uint32_t i = 0; i < n; i++)
        keys[i] = objs[i].key;
    remove_keys(e, keys, n, rcs);
    free(keys);
}

static int s3_remove(kvt_l2 *l2, const struct kvt_l2_obj *o)
{
    int rc;
    s3_remove_batch(l2, o, 1, &rc);
    return rc;
}

/* ------------------------------------------------ start-up listing */

struct list_state {
    struct s3_req req;
    char *token; /* continuation token of the next page */
    bool running;
    uint64_t t0, backoff_ns;
    struct kvt_l2_found_vec found;
    uint64_t pages;
    bool recount; /* a listing that only recounts the shared budget (the record was lost) */
};

/* Decode XML character references and the five entities, in place. */
static void xml_unescape(char *s)
{
    char *o = s;
    for (char *p = s; *p;) {
        if (*p != '&') {
            *o++ = *p++;
            continue;
        }
        static const struct {
            const char *e;
            char c;
        } ents[] = {
            {"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'}, {"&quot;", '"'}, {"&apos;", '\''}};
        bool done = false;
        for (size_t i = 0; i < KVT_ARRAY_LEN(ents) && !done; i++) {
            size_t l = strlen(ents[i].e);
            if (strncmp(p, ents[i].e, l) == 0) {
                *o++ = ents[i].c;
                p += l;
                done = true;
            }
        }
        if (!done && p[1] == '#') {
            char *end;
            unsigned long cp = p[2] == 'x' ? strtoul(p + 3, &end, 16) : strtoul(p + 2, &end, 10);
            if (*end == ';' && cp > 0 && cp < 0x110000) { /* as UTF-8 */
                if (cp < 0x80) {
                    *o++ = (char)cp;
                } else if (cp < 0x800) {
                    *o++ = (char)(0xc0 | (cp >> 6));
                    *o++ = (char)(0x80 | (cp & 0x3f));
                } else if (cp < 0x10000) {
                    *o++ = (char)(0xe0 | (cp >> 12));
                    *o++ = (char)(0x80 | ((cp >> 6) & 0x3f));
                    *o++ = (char)(0x80 | (cp & 0x3f));
                } else {
                    *o++ = (char)(0xf0 | (cp >> 18));
                    *o++ = (char)(0x80 | ((cp >> 12) & 0x3f));
                    *o++ = (char)(0x80 | ((cp >> 6) & 0x3f));
                    *o++ = (char)(0x80 | (cp & 0x3f));
                }
                p = end + 1;
                done = true;
            }
        }
        if (!done)
            *o++ = *p++;
    }
    *o = 0;
}

bool kvt_s3_xml_field(const char *a, const char *z, const char *tag, char *out, size_t cap)
{
    char open[48], close_[48];
    snprintf(open, sizeof(open), "<%s>", tag);
    snprintf(close_, sizeof(close_), "</%s>", tag);
    out[0] = 0;
    if (!a)
        return false;
    if (!z)
        z = a + strlen(a);
    const char *p = strstr(a, open);
    if (!p || p >= z)
        return false;
    p += strlen(open);
    const char *q = strstr(p, close_);
    if (!q || q > z)
        return false;
    size_t n = KVT_MIN((size_t)(q - p), cap - 1);
    memcpy(out, p, n);
    out[n] = 0;
    xml_unescape(out);
    return true;
}

int64_t kvt_s3_iso_ms(const char *s)
{
    struct tm tm;
    memset(&tm, 0, sizeof(tm));
    int ms = 0;
    if (sscanf(s, "%d-%d-%dT%d:%d:%d.%dZ", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
               &tm.tm_min, &tm.tm_sec, &ms) < 6)
        return 0;
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    return (int64_t)timegm(&tm) * 1000 + ms;
}

/* Parse one ListObjectsV2 page (Azure: List Blobs); returns whether more
 * pages follow. */
static bool list_parse(struct s3_engine *e, struct list_state *ls, const char *body)
{
    const char *p = body;
    char key[2048], num[32], date[64];
    const char *open = e->azure ? "<Blob>" : "<Contents>",
               *close = e->azure ? "</Blob>" : "</Contents>";
    while ((p = strstr(p, open))) {
        const char *z = strstr(p, close);
        if (!z)
            break;
        if (kvt_s3_xml_field(p, z, e->azure ? "Name" : "Key", key, sizeof(key)) &&
            kvt_s3_xml_field(p, z, e->azure ? "Content-Length" : "Size", num, sizeof(num))) {
            size_t kl = strlen(key);
            uint64_t size = strtoull(num, NULL, 10);
            kvt_key k;
            bool ours = kl > e->prefix_len && strncmp(key, e->prefix, e->prefix_len) == 0;
            if ((ours && strcmp(key + e->prefix_len, KVT_BUDGET_FILE_NAME) == 0) ||
                (size == 0 && e->shared_budget)) {
                /* the shared budget's record, a removal's marker: not objects */
            } else if (ours && size >= S3_HDR && size <= UINT32_MAX &&
                       kvt_key_decode(KVT_CODEC_OBJ, key + e->prefix_len, kl - e->prefix_len, &k) ==
                           0) {
                kvt_key ck;
                kvt_key_canon(KVT_CODEC_OBJ, &k, &ck);
                int64_t ms = 0;
                if (kvt_s3_xml_field(p, z, e->azure ? "Last-Modified" : "LastModified", date,
                                     sizeof(date)))
                    ms = e->azure ? kvt_s3_http_date_ms(date) : kvt_s3_iso_ms(date);
                kvt_l2_found_push(&ls->found, &ck, (uint32_t)size, 0, S3_HDR, 0, ms * 1000000);
            } else {
                atomic_fetch_add(&e->foreign, 1);
            }
        }
        p = z;
    }
    char trunc[16] = "", tok[1100] = "";
    free(ls->token);
    ls->token = NULL;
    if (e->azure) { /* a non-empty NextMarker continues */
        if (kvt_s3_xml_field(body, NULL, "NextMarker", tok, sizeof(tok)) && tok[0])
            ls->token = kvt_xstrdup(tok);
        return ls->token != NULL;
    }
    kvt_s3_xml_field(body, NULL, "IsTruncated", trunc, sizeof(trunc));
    if (strcmp(trunc, "true") == 0 &&
        kvt_s3_xml_field(body, NULL, "NextContinuationToken", tok, sizeof(tok)) && tok[0])
        ls->token = kvt_xstrdup(tok);
    return ls->token != NULL;
}

/* The listing ended (complete, or given up): adopt what was found, newest
 * first at the cold end so the oldest ends up coldest, then let the
 * parked stores go. */
static void list_finish(kvt_l2 *l2, struct s3_engine *e, struct list_state *ls, bool complete)
{
    if (ls->recount) { /* the objects are indexed already: only the record's total */
        uint64_t walked = 0;
        for (size_t i = 0; i < ls->found.n; i++)
            walked += ls->found.v[i].stored;
        ls->found.n = 0;
        ls->recount = false;
        kvt_l2_budget_recount_end(l2, walked, complete);
        return;
    }
    char where[1200];
    snprintf(where, sizeof(where), "%s://%s%s/%s (%llu pages%s)", e->scheme, e->host, e->base,
             e->prefix, (unsigned long long)ls->pages, complete ? "" : ", listing given up");
    if (!complete) /* the shared budget's recount: the walk may have missed objects */
        kvt_l2_budget_recount_end(l2, 0, false);
    kvt_l2_finish_recovery(l2, &ls->found, ls->t0, where);
    pthread_mutex_lock(&e->lock);
    e->list_done = true;
    pthread_mutex_unlock(&e->lock);
    if (complete)
        kvt_s3_sweep_uploads(e);
    for (kvt_l2_task *p = kvt_l2_park_take(&e->park, true), *nx; p; p = nx) {
        nx = p->next;
        p->next = NULL;
        s3_submit(l2, p);
    }
}

static void list_page(struct s3_engine *e, struct list_state *ls);

/* The listing (or its recount's snapshot) failed: start over after a pause
 * doubling from 1 s up to S3_PROBE_MAX_NS. */
static void list_retry_later(struct s3_engine *e, struct list_state *ls)
{
    ls->backoff_ns = ls->backoff_ns ? KVT_MIN(ls->backoff_ns * 2, S3_PROBE_MAX_NS) : 1000000000ull;
    pthread_mutex_lock(&e->lock);
    e->list_retry_ns = kvt_now_ns() + ls->backoff_ns;
    pthread_mutex_unlock(&e->lock);
}

static void list_done(struct s3_engine *e, struct s3_req *r)
{
    kvt_l2 *l2 = e->l2;
    struct list_state *ls = r->ctx;
    ls->pages++;
    pthread_mutex_lock(&e->lock);
    bool stop = e->stop;
    pthread_mutex_unlock(&e->lock);
    if (r->outcome == S3_OK) {
        bool more = list_parse(e, ls, r->body ? r->body : "");
        kvt_s3_req_clear(r);
        if (more && !stop) {
            list_page(e, ls);
            return;
        }
        ls->running = false;
        list_finish(l2, e, ls, !more);
        return;
    }
    ls->running = false;
    if (r->outcome == S3_REJECTED || r->outcome == S3_NOTFOUND) {
        kvt_warn("%s: cannot list %s://%s%s/%s (HTTP %ld %s: %s): usage starts from what this "
                 "server stores and finds by lookups",
                 l2->name, e->scheme, e->host, e->base, e->prefix, r->status, r->err_code,
                 r->err_msg);
        kvt_s3_req_clear(r);
        list_finish(l2, e, ls, false);
        return;
    }
    /* unreachable or a server error: try again later (stores fail meanwhile
     * if the breaker opened; otherwise they stay parked) */
    list_retry_later(e, ls);
    kvt_debug("%s: listing failed (%s), retrying in %.1f s", l2->name,
              kvt_s3_outcome_name(r->outcome), (double)ls->backoff_ns / 1e9);
    free(ls->token); /* start over: the page set may have changed */
    ls->token = NULL;
    ls->found.n = 0;
    kvt_s3_req_clear(r);
}

static void list_page(struct s3_engine *e, struct list_state *ls)
{
    struct s3_req *r = &ls->req;
    kvt_s3_req_clear(r);
    memset(r, 0, sizeof(*r));
    r->op = S3_LIST;
    snprintf(r->path, sizeof(r->path), "%s%s", e->base, e->azure ? "" : "/");
    struct kvt_sigv4_pair q[5];
    size_t nq = 0;
    if (e->azure) { /* List Blobs */
        q[nq++] = (struct kvt_sigv4_pair){"comp", "list"};
        q[nq++] = (struct kvt_sigv4_pair){"maxresults", "1000"};
        q[nq++] = (struct kvt_sigv4_pair){"restype", "container"};
        if (ls->token)
            q[nq++] = (struct kvt_sigv4_pair){"marker", ls->token};
    } else {
        q[nq++] = (struct kvt_sigv4_pair){"list-type", "2"};
        q[nq++] = (struct kvt_sigv4_pair){"max-keys", "1000"};
        if (ls->token)
            q[nq++] = (struct kvt_sigv4_pair){"continuation-token", ls->token};
    }
    if (e->prefix_len)
        q[nq++] = (struct kvt_sigv4_pair){"prefix", e->prefix};
    size_t cap = 3 * (strlen(e->prefix) + (ls->token ? strlen(ls->token) : 0)) + 128;
    r->query = kvt_xmalloc(cap);
    kvt_sigv4_canonical_query(q, nq, r->query, cap);
    r->done = list_done;
    r->ctx = ls;
    ls->running = true;
    kvt_s3_submit_req(e, r);
}

/* Called by the I/O thread on every loop: start or retry the listing. */
void kvt_s3_io_tick(kvt_l2 *l2, uint64_t now)
{
    struct s3_engine *e = l2->engine;
    struct list_state *ls = e->list;
    if (e->shared_budget && !ls->running && atomic_exchange(&e->relist, false)) {
        pthread_mutex_lock(&e->lock);
        bool started = e->list_done; /* the start-up listing recounts anyway */
        pthread_mutex_unlock(&e->lock);
        if (started && !ls->recount) {
            ls->recount = true;
            free(ls->token);
            ls->token = NULL;
            ls->found.n = 0;
            ls->backoff_ns = 0;
        }
    }
    pthread_mutex_lock(&e->lock);
    bool go = (!e->list_done || ls->recount) && !e->stop && e->brk == BRK_CLOSED &&
              now >= e->list_retry_ns;
    pthread_mutex_unlock(&e->lock);
    if (!go || ls->running)
        return;
    if (!ls->t0)
        ls->t0 = kvt_now_ns();
    if (e->shared_budget && !ls->token) {
        /* the walk starts: the shared budget's recount takes its snapshot
         * (a step on the record); unanswered, the listing waits for it */
        char err[300];
        if (kvt_l2_budget_recount_begin(l2, err, sizeof(err))) {
            list_retry_later(e, ls);
            kvt_warn("%s: %s: the start-up listing waits %.1f s for it", l2->name, err,
                     (double)ls->backoff_ns / 1e9);
            return;
        }
    }
    list_page(e, ls);
}

/* ------------------------------------------------------ status/close */

static void s3_status(kvt_l2 *l2, json_t *out)
{
    struct s3_engine *e = l2->engine;
    char url[1024];
    snprintf(url, sizeof(url), "%s://%s%s/%s", e->scheme, e->host, e->base, e->prefix);
    json_object_set_new(out, "endpoint_url", json_string(url));
    json_object_set_new(out, "api", json_string(e->azure ? "azure_blob" : "s3"));
    json_object_set_new(out, "bucket", json_string(e->bucket));
    json_object_set_new(out, "addressing", json_string(e->path_style ? "path" : "virtual"));
    json_object_set_new(out, "region", json_string(e->region));
    json_object_set_new(out, "key_prefix", json_string(e->prefix));
    json_object_set_new(out, "credentials", json_string(e->creds.source));
    json_object_set_new(out, "max_transfers", json_integer(e->max_transfers));
    uint64_t now = kvt_now_ns();
    pthread_mutex_lock(&e->lock);
    json_object_set_new(out, "active_transfers", json_integer(e->active));
    json_object_set_new(out, "peak_transfers", json_integer(e->peak_active));
    json_object_set_new(out, "queued_requests", json_integer(e->queued));
    json_t *b = json_object();
    static const char *const st[] = {"closed", "open", "probing"};
    json_object_set_new(b, "state", json_string(st[e->brk]));
    json_object_set_new(b, "consecutive_errors", json_integer(e->conn_errors));
    json_object_set_new(b, "threshold", json_integer(e->breaker_threshold));
    json_object_set_new(b, "opens", json_integer((json_int_t)e->brk_opens));
    json_object_set_new(
        b, "open_seconds",
        json_real(e->brk != BRK_CLOSED ? (double)(now - e->open_since_ns) / 1e9 : 0));
    json_object_set_new(b, "next_probe_seconds",
                        json_real(e->brk == BRK_OPEN && e->next_probe_ns > now
                                      ? (double)(e->next_probe_ns - now) / 1e9
                                      : 0));
    json_object_set_new(b, "last_error", e->conn_err[0] ? json_string(e->conn_err) : json_null());
    json_object_set_new(b, "last_error_unix",
                        e->conn_err[0] ? json_real((double)e->conn_err_ms / 1e3) : json_null());
    json_object_set_new(out, "circuit_breaker", b);
    json_t *rej = json_null();
    if (e->rejected) {
        rej = json_object();
        json_object_set_new(rej, "http_status", json_integer(e->rej_status));
        json_object_set_new(rej, "code", json_string(e->rej_code));
        json_object_set_new(rej, "message", json_string(e->rej_msg));
    }
    json_object_set_new(out, "s3_error", rej);
    pthread_mutex_unlock(&e->lock);
    json_object_set_new(out, "parked_stores", json_integer((json_int_t)kvt_l2_parked(&e->park)));
    json_t *rq = json_object();
    static const char *const names[] = {"put",          "get",       "head",       "delete",
                                        "list",         "probe",     "mpu_create", "mpu_part",
                                        "mpu_complete", "mpu_abort", "mpu_list"};
    _Static_assert(KVT_ARRAY_LEN(names) == S3_NOPS, "one status name per S3 op");
    for (int i = 0; i < S3_NOPS; i++)
        json_object_set_new(rq, names[i], json_integer((json_int_t)atomic_load(&e->reqs[i])));
    json_object_set_new(out, "requests", rq);
    json_t *mp = json_object();
    json_object_set_new(mp, "threshold_bytes", json_integer((json_int_t)e->mpu_threshold));
    json_object_set_new(mp, "part_bytes", json_integer((json_int_t)e->mpu_part));
    json_object_set_new(mp, "completed", json_integer((json_int_t)atomic_load(&e->mpu_ok)));
    json_object_set_new(mp, "failed", json_integer((json_int_t)atomic_load(&e->mpu_failed)));
    json_object_set_new(mp, "stale_aborted", json_integer((json_int_t)atomic_load(&e->mpu_stale)));
    json_object_set_new(out, "multipart", mp);
    json_object_set_new(out, "failed_requests",
                        json_integer((json_int_t)atomic_load(&e->failures)));
    json_object_set_new(out, "foreign_objects", json_integer((json_int_t)atomic_load(&e->foreign)));
    if (e->shared_budget) { /* the removal claim (remove_keys) */
        json_t *cl = json_object();
        json_object_set_new(cl, "won", json_integer((json_int_t)atomic_load(&e->claims)));
        json_object_set_new(cl, "lost", json_integer((json_int_t)atomic_load(&e->claims_lost)));
        json_object_set_new(cl, "markers_found",
                            json_integer((json_int_t)atomic_load(&e->markers)));
        json_object_set_new(out, "removal_claims", cl);
    }
}

static bool s3_healthy(kvt_l2 *l2, char *msg, size_t cap)
{
    return kvt_s3_health(l2->engine, msg, cap);
}

/* One node: the endpoint, with its breaker. Down while the breaker is open
 * (probing: its probe is in flight); a refusal (4xx) is an answer, so the
 * endpoint is up, with the refusal as its last error. */
static int s3_nodes(kvt_l2 *l2, struct kvt_l2_node *out, int max)
{
    struct s3_engine *e = l2->engine;
    if (max < 1)
        return 1;
    struct kvt_l2_node *n = &out[0];
    memset(n, 0, sizeof(*n));
    snprintf(n->name, sizeof(n->name), "%.7s://%.200s%.100s", e->scheme, e->host, e->base);
    snprintf(n->role, sizeof(n->role), "endpoint");
    uint64_t now = kvt_now_ns();
    pthread_mutex_lock(&e->lock);
    static const enum kvt_l2_node_state st[] = {KVT_NODE_UP, KVT_NODE_DOWN, KVT_NODE_PROBING};
    static const enum kvt_l2_breaker_state bs[] = {KVT_BRK_CLOSED, KVT_BRK_OPEN, KVT_BRK_HALF_OPEN};
    n->state = st[e->brk];
    n->breaker = bs[e->brk];
    n->downs = e->brk_opens;
    n->down_seconds = e->brk != BRK_CLOSED ? (double)(now - e->open_since_ns) / 1e9 : 0;
    if (e->conn_err[0]) {
        snprintf(n->last_error, sizeof(n->last_error), "%.*s", (int)sizeof(n->last_error) - 1,
                 e->conn_err);
        n->last_error_unix = (double)e->conn_err_ms / 1e3;
    } else if (e->rejected) {
        snprintf(n->last_error, sizeof(n->last_error), "HTTP %ld %.60s: %.100s", e->rej_status,
                 e->rej_code, e->rej_msg);
        n->last_error_unix = (double)e->rej_ms / 1e3;
    }
    pthread_mutex_unlock(&e->lock);
    return 1;
}

/* persist_enabled false: DELETE every indexed object before stopping (the
 * keys are copied under the lock, the requests built outside it). */
static void delete_all_indexed(kvt_l2 *l2, struct s3_engine *e)
{
    if (!kvt_s3_available(e)) {
        kvt_warn("%s: persist_enabled is false but S3 is unreachable: objects stay", l2->name);
        return;
    }
    uint32_t n = 0;
    kvt_key *keys = kvt_l2_index_keys(l2, &n);
    int *rcs = kvt_xcalloc(n ? n : 1, sizeof(int));
    remove_keys(e, keys, n, rcs);
    uint64_t removed = 0;
    for (uint32_t i = 0; i < n; i++)
        removed += rcs[i] == 0;
    free(rcs);
    free(keys);
    kvt_info("%s: persist_enabled is false: deleted %llu objects", l2->name,
             (unsigned long long)removed);
}

/* Not kvt_l2_life_stop's order: parked tasks fail, and objects are deleted
 * (persist_enabled false) while the transfer threads still run, before
 * kvt_s3_io_stop ends them. */
static void s3_close(kvt_l2 *l2)
{
    struct s3_engine *e = l2->engine;
    pthread_mutex_lock(&e->lock);
    e->list_done = true; /* no new listing pages */
    pthread_mutex_unlock(&e->lock);
    for (kvt_l2_task *p = kvt_l2_park_take(&e->park, true), *nx; p; p = nx) {
        nx = p->next;
        p->next = NULL;
        fail_task(l2, p);
    }
    if (!l2->persist_enabled && e->io_started)
        delete_all_indexed(l2, e);
    kvt_s3_io_stop(e);
    kvt_l2_budget_detach(l2); /* after the last store and removal; it uses e */
    struct list_state *ls = e->list;
    kvt_s3_req_clear(&ls->req);
    free(ls->token);
    free(ls->found.v);
    free(ls);
    explicit_bzero(&e->creds, sizeof(e->creds));
    explicit_bzero(&e->sig, sizeof(e->sig));
    kvt_l2_park_destroy(&e->park);
    pthread_mutex_destroy(&e->lock);
    free(e);
    l2->engine = NULL;
}

static const struct kvt_l2_ops s3_ops = {
    .submit = s3_submit,
    .remove = s3_remove,
    .remove_batch = s3_remove_batch,
    .status = s3_status,
    .healthy = s3_healthy,
    .nodes = s3_nodes,
    .close = s3_close,
};

/* ---------------------------------------------------------- creation */

/* AWS wants 3..63 of a-z 0-9 . -; S3-compatible servers and legacy buckets
 * are laxer (the issue's own example is "kv"): accept what can appear in a
 * host name label or a path segment unescaped. */
static bool bucket_name_ok(const char *b)
{
    size_t n = strlen(b);
    if (n < 1 || n > 127)
        return false;
    for (const char *p = b; *p; p++)
        if (!(isalnum((unsigned char)*p) || *p == '-' || *p == '.' || *p == '_'))
            return false;
    return true;
}

/*
 * Where the bucket lives, from s3_endpoint (+ s3_bucket, s3_addressing):
 *   s3://bucket                   AWS: https://bucket.s3.<region>.amazonaws.com/<key>
 *   s3://bucket.host[:port], bucket.host[:port]
 *                                 virtual-hosted: the first label is the bucket
 *   host[:port] + s3_bucket       path style (default off AWS): host/bucket/<key>,
 *                                 or virtual with s3_addressing "virtual"
 *   http:// or https:// in front  choose the scheme (else disable_tls decides)
 */
static int resolve_endpoint(struct kvt_cfg *c, struct kvt_s3_opts *o, bool tls_explicit)
{
    const char *ep = o->endpoint;
    int kind = 0; /* 0 none, 1 s3://, 2 http://, 3 https:// */
    if (strncmp(ep, "s3://", 5) == 0)
        ep += 5, kind = 1;
    else if (strncmp(ep, "http://", 7) == 0)
        ep += 7, kind = 2;
    else if (strncmp(ep, "https://", 8) == 0)
        ep += 8, kind = 3;
    char rest[256];
    if (strlen(ep) >= sizeof(rest))
        return kvt_cfg_fail(c, "s3_endpoint", "is too long");
    snprintf(rest, sizeof(rest), "%s", ep);
    size_t rl = strlen(rest);
    while (rl && rest[rl - 1] == '/')
        rest[--rl] = 0;
    if (!rl || strchr(rest, '/') || strchr(rest, '@') || strchr(rest, ' '))
        return kvt_cfg_fail(c, "s3_endpoint",
                            "must be \"s3://<bucket>\", \"<bucket>.<host>[:port]\" or "
                            "\"[http[s]://]<host>[:port]\" with s3_bucket (got \"%s\")",
                            o->endpoint);
    bool tls = !o->disable_tls;
    if (kind == 2 || kind == 3) {
        tls = kind == 3;
        if (tls_explicit && tls == o->disable_tls)
            return kvt_cfg_fail(c, "disable_tls", "contradicts the scheme of s3_endpoint \"%s\"",
                                o->endpoint);
    }
    snprintf(o->scheme, sizeof(o->scheme), "%s", tls ? "https" : "http");
    const char *addr = o->addressing;
    if (o->bucket_opt) {
        if (!bucket_name_ok(o->bucket_opt))
            return kvt_cfg_fail(
                c, "s3_bucket",
                "must be a bucket name of letters, digits, '.', '-', '_' (got \"%s\")",
                o->bucket_opt);
        snprintf(o->bucket, sizeof(o->bucket), "%s", o->bucket_opt);
        bool aws = rl > 14 && strcmp(rest + rl - 14, ".amazonaws.com") == 0;
        o->path_style = addr ? strcmp(addr, "path") == 0 : !aws;
        if (o->path_style)
            snprintf(o->host, sizeof(o->host), "%s", rest);
        else
            snprintf(o->host, sizeof(o->host), "%.127s.%.255s", o->bucket, rest);
        return 0;
    }
    if (addr && strcmp(addr, "path") == 0)
        return kvt_cfg_fail(c, "s3_addressing",
                            "\"path\" needs \"s3_bucket\" (the endpoint is then the bare host)");
    o->path_style = false;
    if (kind == 1 && !strchr(rest, '.') && !strchr(rest, ':')) {
        if (!bucket_name_ok(rest))
            return kvt_cfg_fail(c, "s3_endpoint", "\"%s\" is not a valid bucket name", rest);
        snprintf(o->bucket, sizeof(o->bucket), "%.127s", rest);
        snprintf(o->host, sizeof(o->host), "%.127s.s3.%.63s.amazonaws.com", rest, o->region);
        return 0;
    }
    const char *dot = strchr(rest, '.');
    const char *colon = strchr(rest, ':');
    if (!dot || (colon && colon < dot))
        return kvt_cfg_fail(c, "s3_endpoint",
                            "\"%s\" does not name a bucket: add \"s3_bucket\" (and "
                            "\"s3_addressing\": \"path\" for servers such as MinIO)",
                            o->endpoint);
    snprintf(o->bucket, sizeof(o->bucket), "%.*s", (int)KVT_MIN((size_t)(dot - rest), 127), rest);
    snprintf(o->host, sizeof(o->host), "%s", rest);
    return 0;
}

static int check_prefix(struct kvt_cfg *c, const char *p)
{
    size_t n = strlen(p);
    if (n > 150)
        return kvt_cfg_fail(c, "key_prefix", "must be at most 150 bytes");
    if (p[0] == '/' || strstr(p, "//"))
        return kvt_cfg_fail(c, "key_prefix", "must not start with '/' or contain \"//\"");
    for (const char *s = p; *s; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7f || *s == '\\')
            return kvt_cfg_fail(c, "key_prefix", "must not contain control characters or '\\'");
    char tmp[160];
    snprintf(tmp, sizeof(tmp), "/%s/", p);
    if (strstr(tmp, "/./") || strstr(tmp, "/../"))
        return kvt_cfg_fail(c, "key_prefix", "must not contain \".\" or \"..\" components");
    return 0;
}

static int load_creds(const struct kvt_s3_opts *o, struct s3_creds *c, char *err, size_t cap);

static int s3_check_opts(struct kvt_cfg *c, struct kvt_s3_opts *o, bool tls_explicit);

static int s3_parse(struct kvt_cfg *c, void *opts)
{
    struct kvt_s3_opts *o = opts;
    memset(o, 0, sizeof(*o));
    static const char *const addrs[] = {"path", "virtual", NULL};
    int64_t nio = 64, thr = 3;
    /* request_timeout: no progress for this long fails a request (see
     * s3_http.c); 2 s is AWS's advice for retrying small GETs and PUTs and
     * leaves a client with a 5 s timeout (vLLM's connector) its answer */
    double cap = 0, ct = KVT_S3_CONNECT_TIMEOUT_S, rt = KVT_S3_REQUEST_TIMEOUT_S, mpu_thr = 64,
           mpu_part = 16, stale_h = 24;
    bool express = false;
    kvt_cfg_str(c, "s3_endpoint", true, NULL, &o->endpoint);
    kvt_cfg_str(c, "s3_region", true, NULL, &o->region);
    kvt_cfg_str(c, "s3_bucket", false, NULL, &o->bucket_opt);
    kvt_cfg_enum(c, "s3_addressing", false, NULL, addrs, true, &o->addressing);
    kvt_cfg_int(c, "s3_num_io_threads", false, 64, 1, 1024, &nio);
    kvt_cfg_bool(c, "s3_prefer_http2", true, &o->prefer_http2);
    kvt_cfg_bool(c, "s3_enable_s3express", false, &express);
    bool tls_explicit = kvt_cfg_has(c, "disable_tls");
    kvt_cfg_bool(c, "disable_tls", false, &o->disable_tls);
    kvt_cfg_str(c, "aws_access_key_id", false, NULL, &o->key_id);
    kvt_cfg_str(c, "aws_secret_access_key", false, NULL, &o->secret);
    kvt_cfg_str(c, "aws_session_token", false, NULL, &o->token);
    kvt_cfg_str(c, "key_prefix", false, "", &o->key_prefix);
    kvt_cfg_num(c, "connection_timeout", false, KVT_S3_CONNECT_TIMEOUT_S, 0.001, 3600, &ct);
    kvt_cfg_num(c, "request_timeout", false, KVT_S3_REQUEST_TIMEOUT_S, 0.1, 3600, &rt);
    kvt_cfg_int(c, "circuit_breaker_threshold", false, 3, 1, 1000, &thr);
    kvt_cfg_num(c, "max_capacity_gb", false, 0, 0, 1e9, &cap);
    /* S3's rules: parts of 5 MiB to 5 GiB (the last may be smaller), a
     * single PUT up to 5 GiB; an object is at most 1 GiB here */
    kvt_cfg_num(c, "s3_multipart_threshold_mb", false, 64, 5, 5120, &mpu_thr);
    kvt_cfg_num(c, "s3_multipart_part_mb", false, 16, 5, 5120, &mpu_part);
    kvt_cfg_num(c, "s3_stale_upload_hours", false, 24, 0, 87600, &stale_h);
    if (c->rc)
        return c->rc;
    o->mpu_threshold = (uint64_t)(mpu_thr * KVT_MIB);
    o->mpu_part = (uint64_t)(mpu_part * KVT_MIB);
    o->stale_upload_s = stale_h * 3600;
    /* the secrets are read but never echoed by --dry-run */
    if (o->secret)
        json_object_set_new(c->resolved, "aws_secret_access_key", json_string("<set>"));
    if (o->token)
        json_object_set_new(c->resolved, "aws_session_token", json_string("<set>"));
    o->num_io_threads = (int)nio;
    o->breaker_threshold = (int)thr;
    o->connection_timeout = ct;
    o->request_timeout = rt;
    o->max_capacity_bytes = (uint64_t)(cap * KVT_GIB);
    if (express)
        return kvt_cfg_unsupported(c, "s3_enable_s3express",
                                   "is not supported by this build: S3 Express One Zone needs "
                                   "CreateSession credentials, which kvtier does not implement "
                                   "(use a general-purpose bucket)");
    return s3_check_opts(c, o, tls_explicit);
}

/* What both config forms share once their keys are read: region, credentials
 * and prefix checks, the endpoint resolved, --dry-run's derived fields. */
static int s3_check_opts(struct kvt_cfg *c, struct kvt_s3_opts *o, bool tls_explicit)
{
    if (!o->region[0])
        return kvt_cfg_fail(c, "s3_region", "must not be empty");
    for (const char *p = o->region; *p; p++)
        if (!(islower((unsigned char)*p) || isdigit((unsigned char)*p) || *p == '-'))
            return kvt_cfg_fail(c, "s3_region", "must look like \"us-east-1\" (got \"%s\")",
                                o->region);
    if (!o->key_id != !o->secret)
        return kvt_cfg_fail(c, o->key_id ? "aws_secret_access_key" : "aws_access_key_id",
                            "is required with %s (give both, or neither to use the "
                            "environment or ~/.aws/credentials)",
                            o->key_id ? "aws_access_key_id" : "aws_secret_access_key");
    if ((o->key_id && (strlen(o->key_id) >= 128 || strlen(o->secret) >= 128)) ||
        (o->token && strlen(o->token) >= 2048))
        return kvt_cfg_fail(c, "aws_access_key_id", "or its secret/token is too long");
    if (check_prefix(c, o->key_prefix))
        return c->rc;
    if (resolve_endpoint(c, o, tls_explicit))
        return c->rc;
    json_object_set_new(c->resolved, "s3_bucket", json_string(o->bucket));
    json_object_set_new(c->resolved, "s3_addressing",
                        json_string(o->path_style ? "path" : "virtual"));
    char url[600];
    snprintf(url, sizeof(url), "%s://%s%s%s/", o->scheme, o->host, o->path_style ? "/" : "",
             o->path_style ? o->bucket : "");
    json_object_set_new(c->resolved, "endpoint_url", json_string(url));
    return 0;
}

/*
 * nixl_store {"backend": "OBJ"}: NIXL's object plugin is S3 (aws-sdk-cpp),
 * so the s3 engine serves it, with NIXL's keys in backend_params and NIXL's
 * fallbacks (its src/plugins/obj/README.md):
 *   bucket             else $AWS_DEFAULT_BUCKET (required)
 *   endpoint_override  "[http[s]://]host[:port]", else $AWS_ENDPOINT_URL_S3 or
 *                      $AWS_ENDPOINT_URL (the SDK's names), else AWS
 *   scheme             http | https (https); a scheme in the endpoint wins
 *   region             else $AWS_REGION, $AWS_DEFAULT_REGION, else us-east-1
 *   use_virtual_addressing  "true"/"false" (false, NIXL's default: path style;
 *                      on AWS without an endpoint: virtual)
 *   access_key, secret_key, session_token  else the environment / credentials file
 *   req_checksum       required | supported: accepted; the object header's
 *                      checksum guards every byte anyway
 *   create_bucket      "true" is refused: create the bucket first
 * pool_size (NIXL's descriptors in flight) becomes s3_num_io_threads.
 */
static int nixl_obj_parse(struct kvt_cfg *c, struct kvt_s3_opts *o)
{
    static const char *const schemes[] = {"http", "https", NULL};
    static const char *const cks[] = {"required", "supported", NULL};
    struct kvt_cfg bp;
    if (kvt_cfg_sub(c, "backend_params", false, &bp)) {
        kvt_cfg_free(&bp);
        return c->rc;
    }
    const char *scheme = NULL, *ep = NULL, *ck = NULL;
    bool virt = false, create = false;
    kvt_cfg_str(&bp, "access_key", false, NULL, &o->key_id);
    kvt_cfg_str(&bp, "secret_key", false, NULL, &o->secret);
    kvt_cfg_str(&bp, "session_token", false, NULL, &o->token);
    kvt_cfg_str(&bp, "bucket", false, NULL, &o->bucket_opt);
    kvt_cfg_str(&bp, "endpoint_override", false, NULL, &ep);
    kvt_cfg_enum(&bp, "scheme", false, "https", schemes, false, &scheme);
    kvt_cfg_str(&bp, "region", false, NULL, &o->region);
    bool virt_given = kvt_cfg_has(&bp, "use_virtual_addressing");
    kvt_cfg_bool(&bp, "use_virtual_addressing", false, &virt);
    kvt_cfg_enum(&bp, "req_checksum", false, NULL, cks, false, &ck);
    kvt_cfg_bool(&bp, "create_bucket", false, &create);
    if (!bp.rc && o->secret)
        json_object_set_new(bp.resolved, "secret_key", json_string("<set>"));
    if (!bp.rc && o->token)
        json_object_set_new(bp.resolved, "session_token", json_string("<set>"));
    if (!bp.rc && create)
        kvt_cfg_unsupported(&bp, "create_bucket",
                            "\"true\" is not supported: create the bucket first (kvtier "
                            "never creates or deletes buckets)");
    if (!bp.rc && !o->key_id != !o->secret)
        kvt_cfg_fail(&bp, o->key_id ? "secret_key" : "access_key",
                     "is required with %s (give both, or neither to use the environment or "
                     "~/.aws/credentials)",
                     o->key_id ? "access_key" : "secret_key");
    if (!bp.rc && !o->bucket_opt) {
        o->bucket_opt = getenv("AWS_DEFAULT_BUCKET");
        if (!o->bucket_opt || !o->bucket_opt[0])
            kvt_cfg_missing(&bp, "bucket",
                            "is required (or AWS_DEFAULT_BUCKET in the environment)");
    }
    if (!bp.rc && !bucket_name_ok(o->bucket_opt))
        kvt_cfg_fail(&bp, "bucket",
                     "must be a bucket name of letters, digits, '.', '-', '_' (got \"%s\")",
                     o->bucket_opt);
    if (!bp.rc && !ep) {
        ep = getenv("AWS_ENDPOINT_URL_S3");
        if (!ep || !ep[0])
            ep = getenv("AWS_ENDPOINT_URL");
        if (ep && !ep[0])
            ep = NULL;
    }
    if (!bp.rc && ep) {
        const char *h = strstr(ep, "://");
        h = h ? h + 3 : ep;
        size_t hl = strlen(h);
        while (hl && h[hl - 1] == '/')
            hl--;
        bool scheme_ok = strstr(ep, "://") == NULL || strncmp(ep, "http://", 7) == 0 ||
                         strncmp(ep, "https://", 8) == 0;
        if (!scheme_ok || !hl || memchr(h, '/', hl) || memchr(h, '@', hl) || hl > 250)
            kvt_cfg_fail(&bp, "endpoint_override",
                         "must be \"[http[s]://]<host>[:port]\" (got \"%s\")", ep);
    }
    if (!bp.rc) {
        if (!o->region) {
            o->region = getenv("AWS_REGION");
            if (!o->region || !o->region[0])
                o->region = getenv("AWS_DEFAULT_REGION");
            if (!o->region || !o->region[0])
                o->region = "us-east-1";
        }
        json_object_set_new(bp.resolved, "region", json_string(o->region));
        json_object_set_new(bp.resolved, "bucket", json_string(o->bucket_opt));
        kvt_cfg_finish(&bp);
    }
    kvt_cfg_sub_done(c, "backend_params", &bp);
    int64_t ps = 0;
    double cap = 0;
    kvt_cfg_int(c, "pool_size", true, 0, 1, 1 << 24, &ps);
    kvt_cfg_num(c, "max_capacity_gb", false, 0, 0, 1e9, &cap);
    kvt_cfg_str(c, "key_prefix", false, "", &o->key_prefix);
    if (c->rc)
        return c->rc;
    o->num_io_threads = (int)KVT_MIN(ps, 1024);
    o->max_capacity_bytes = (uint64_t)(cap * KVT_GIB);
    o->prefer_http2 = true;
    o->connection_timeout = KVT_S3_CONNECT_TIMEOUT_S;
    o->request_timeout = KVT_S3_REQUEST_TIMEOUT_S;
    o->breaker_threshold = 3;
    o->mpu_threshold = 64ull << 20;
    o->mpu_part = 16ull << 20;
    o->stale_upload_s = 24 * 3600;
    o->addressing = virt ? "virtual" : "path";
    if (ep) {
        /* a scheme in the endpoint decides; else NIXL's "scheme" key */
        bool has_scheme = strstr(ep, "://") != NULL;
        snprintf(o->ep_buf, sizeof(o->ep_buf), "%s%s", has_scheme ? "" : scheme,
                 has_scheme ? ep : "://");
        if (!has_scheme)
            snprintf(o->ep_buf + strlen(o->ep_buf), sizeof(o->ep_buf) - strlen(o->ep_buf), "%s",
                     ep);
    } else {
        /* AWS itself: https://<bucket>.s3.<region>.amazonaws.com, unless
         * use_virtual_addressing is "false" */
        snprintf(o->ep_buf, sizeof(o->ep_buf), "https://s3.%s.amazonaws.com", o->region);
        if (!virt_given)
            o->addressing = "virtual";
    }
    o->endpoint = o->ep_buf;
    json_object_set_new(c->resolved, "served_by", json_string("s3"));
    return s3_check_opts(c, o, false);
}

int kvt_s3_parse_nixl_obj(struct kvt_cfg *c, void **opts)
{
    struct kvt_s3_opts *o = kvt_xcalloc(1, sizeof(*o));
    *opts = o;
    return nixl_obj_parse(c, o);
}

void kvt_s3_nixl_obj_free(void *opts)
{
    free(opts);
}

/* Can a server started now sign requests? explicit_keys: the config has
 * them; else the environment or the credentials file must (as at open).
 * 0, or KVT_E_CONFIG with the message open would give. */
static int creds_check(bool explicit_keys, char *err, size_t errcap)
{
    if (explicit_keys)
        return 0;
    struct kvt_s3_opts o;
    memset(&o, 0, sizeof(o));
    struct s3_creds cr;
    int rc = load_creds(&o, &cr, err, errcap);
    explicit_bzero(&cr, sizeof(cr));
    return rc;
}

/* "key = value" lines of [profile] in an AWS credentials file. */
static bool creds_from_file(struct s3_creds *cr)
{
    char path[600];
    const char *f = getenv("AWS_SHARED_CREDENTIALS_FILE"), *home = getenv("HOME");
    const char *prof = getenv("AWS_PROFILE");
    if (!prof || !*prof)
        prof = "default";
    if (f && *f)
        snprintf(path, sizeof(path), "%s", f);
    else if (home && *home)
        snprintf(path, sizeof(path), "%s/.aws/credentials", home);
    else
        return false;
    FILE *fp = fopen(path, "re");
    if (!fp)
        return false;
    char line[2600];
    bool in = false;
    struct s3_creds c = {0};
    while (fgets(line, sizeof(line), fp)) {
        char *s = line;
        while (isspace((unsigned char)*s))
            s++;
        char *e = s + strlen(s);
        while (e > s && isspace((unsigned char)e[-1]))
            *--e = 0;
        if (*s == '[') {
            char *z = strchr(s, ']');
            if (z)
                *z = 0;
            char *name = s + 1;
            while (isspace((unsigned char)*name))
                name++;
            in = strcmp(name, prof) == 0;
            continue;
        }
        char *eq = strchr(s, '=');
        if (!in || !eq || *s == '#' || *s == ';')
            continue;
        char *k = s, *v = eq + 1;
        *eq = 0;
        for (char *z = eq; z > k && isspace((unsigned char)z[-1]);)
            *--z = 0;
        while (isspace((unsigned char)*v))
            v++;
        if (strcmp(k, "aws_access_key_id") == 0)
            snprintf(c.key_id, sizeof(c.key_id), "%s", v);
        else if (strcmp(k, "aws_secret_access_key") == 0)
            snprintf(c.secret, sizeof(c.secret), "%s", v);
        else if (strcmp(k, "aws_session_token") == 0)
            snprintf(c.token, sizeof(c.token), "%s", v);
    }
    fclose(fp);
    if (!c.key_id[0] || !c.secret[0]) {
        explicit_bzero(&c, sizeof(c));
        return false;
    }
    snprintf(c.source, sizeof(c.source), "file %s [%s]", path, prof);
    *cr = c;
    explicit_bzero(&c, sizeof(c));
    return true;
}

/* Credentials: the config's keys, else AWS_ACCESS_KEY_ID /
 * AWS_SECRET_ACCESS_KEY (/ AWS_SESSION_TOKEN), else the shared credentials
 * file. No instance-metadata lookup: give keys explicitly on EC2. */
static int load_creds(const struct kvt_s3_opts *o, struct s3_creds *c, char *err, size_t cap)
{
    memset(c, 0, sizeof(*c));
    if (o->key_id) {
        snprintf(c->key_id, sizeof(c->key_id), "%s", o->key_id);
        snprintf(c->secret, sizeof(c->secret), "%s", o->secret);
        snprintf(c->token, sizeof(c->token), "%s", o->token ? o->token : "");
        snprintf(c->source, sizeof(c->source), "config");
        return 0;
    }
    const char *k = getenv("AWS_ACCESS_KEY_ID"), *s = getenv("AWS_SECRET_ACCESS_KEY");
    if (k && *k && s && *s) {
        const char *t = getenv("AWS_SESSION_TOKEN");
        snprintf(c->key_id, sizeof(c->key_id), "%s", k);
        snprintf(c->secret, sizeof(c->secret), "%s", s);
        snprintf(c->token, sizeof(c->token), "%s", t ? t : "");
        snprintf(c->source, sizeof(c->source), "environment");
        return 0;
    }
    if (creds_from_file(c))
        return 0;
    snprintf(err, cap,
             "no AWS credentials: set \"aws_access_key_id\" and \"aws_secret_access_key\", or "
             "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or a profile in ~/.aws/credentials "
             "(AWS_PROFILE, AWS_SHARED_CREDENTIALS_FILE)");
    return KVT_E_CONFIG;
}

static int s3_open(kvt_l2 *l2, const struct kvt_l2_spec *spec, const void *opts, char *err,
                   size_t errcap)
{
    const struct kvt_s3_opts *o = opts;
    int rc = kvt_l2_life_init(l2, &s3_ops, spec, KVT_CODEC_OBJ, o->max_capacity_bytes, err, errcap);
    if (rc)
        return rc;
    /* stores reserve on the submitting thread (store-ctrl, or the listing's
     * completion when parked tasks resume), where a batch of DELETEs must
     * not be waited for: over the cap is refused, the controller evicts */
    l2->no_sync_evict = true;
    struct s3_engine *e = kvt_xcalloc(1, sizeof(*e));
    e->l2 = l2;
    pthread_mutex_init(&e->lock, NULL);
    kvt_l2_park_init(&e->park);
    rc = o->azure ? kvt_s3_azure_creds(o, e, err, errcap) : load_creds(o, &e->creds, err, errcap);
    if (rc)
        goto fail;
    snprintf(e->scheme, sizeof(e->scheme), "%s", o->scheme);
    snprintf(e->host, sizeof(e->host), "%s", o->host);
    snprintf(e->bucket, sizeof(e->bucket), "%s", o->bucket);
    e->path_style = o->path_style;
    snprintf(e->base, sizeof(e->base), "%s%s", o->path_style ? "/" : "",
             o->path_style ? o->bucket : "");
    if (o->azure)
        snprintf(e->base, sizeof(e->base), "%s", o->az_base);
    snprintf(e->region, sizeof(e->region), "%s", o->region);
    size_t pl = strlen(o->key_prefix);
    snprintf(e->prefix, sizeof(e->prefix), "%s%s", o->key_prefix,
             pl && o->key_prefix[pl - 1] != '/' ? "/" : "");
    e->prefix_len = strlen(e->prefix);
    e->max_transfers = o->num_io_threads;
    e->http2 = o->prefer_http2;
    e->connect_timeout_ms = (long)(o->connection_timeout * 1000);
    e->request_timeout_ms = (long)(o->request_timeout * 1000);
    e->breaker_threshold = o->breaker_threshold;
    e->mpu_threshold = o->mpu_threshold;
    e->mpu_part = o->mpu_part;
    e->stale_upload_s = o->stale_upload_s;
    e->list = kvt_xcalloc(1, sizeof(struct list_state));
    e->park.parking = l2->cap_bytes > 0;
    l2->engine = e;
    l2->recovering = true;
    if (spec->shared_budget) { /* before the I/O thread starts the listing */
        e->shared_budget = true;
        rc = kvt_s3_budget_attach(e, err, errcap);
        if (rc)
            goto fail;
    }
    rc = kvt_s3_io_start(e, err, errcap);
    if (rc)
        goto fail;
    kvt_info("%s: %s://%s%s/%s (%s%s, credentials from %s, up to %d transfers)", l2->name,
             e->scheme, e->host, e->base, e->prefix, e->azure ? "Azure Blob" : "region ",
             e->azure ? "" : e->region, e->creds.source, e->max_transfers);
    return 0;
fail:
    kvt_l2_budget_detach(l2); /* it uses e */
    free(e->list);
    explicit_bzero(&e->creds, sizeof(e->creds));
    kvt_l2_park_destroy(&e->park);
    pthread_mutex_destroy(&e->lock);
    free(e);
    l2->engine = NULL;
    kvt_l2_base_destroy(l2);
    return rc;
}

int kvt_s3_open_nixl_obj(kvt_l2 *l2, const struct kvt_l2_spec *spec, const void *opts, char *err,
                         size_t errcap)
{
    return s3_open(l2, spec, opts, err, errcap);
}

/* --dry-run and the start's config check: the credentials. */
static int s3_check(const struct kvt_l2_spec *spec, const void *opts, const char **field, char *msg,
                    size_t cap)
{
    (void)spec;
    return kvt_s3_nixl_obj_check(opts, field, msg, cap);
}

int kvt_s3_nixl_obj_check(const void *opts, const char **field, char *msg, size_t cap)
{
    const struct kvt_s3_opts *o = opts;
    (void)field; /* a message about no one key */
    if (o->azure)
        return kvt_s3_azure_creds_check(o->az_key || o->az_sas, msg, cap);
    return creds_check(o->key_id != NULL, msg, cap);
}

/* "shared_budget": the record is an object in the bucket, written with
 * conditional PUTs (s3_budget.c); Azure Blob keeps none yet. */
int kvt_s3_nixl_obj_shared_budget(struct kvt_cfg *c, const void *opts)
{
    const struct kvt_s3_opts *o = opts;
    if (o->azure)
        return kvt_cfg_unsupported(
            c, "shared_budget",
            "is not available for Azure Blob yet (its record would need Azure's conditional "
            "headers, not written): share a budget through a bucket (s3), a directory (fs or "
            "nixl_store_dynamic with \"shared\": true) or Redis (resp, valkey), or give one "
            "server the container's cap");
    return 0;
}

const struct kvt_l2_adapter_desc kvt_l2_s3_desc = {
    .name = "s3",
    .opts_size = sizeof(struct kvt_s3_opts),
    .parse = s3_parse,
    .open = s3_open,
    .check = s3_check,
    .shared_budget = kvt_s3_nixl_obj_shared_budget,
    .budget_max_interval_ms = KVT_L2_BUDGET_LEASE_MS / 3,
};
