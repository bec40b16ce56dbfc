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
int kvt_s3_obj_path(const struct s3_engine *e, const kvt_key *k, char *out, size_t cap)
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
        int rc = src->len > KVT_MAX_OBJECT
                     ? KVT_E_TOOBIG
                     : kvt_s3_obj_path(e, &t->keys[i], r->path, sizeof(r->path));
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
        kvt_objhdr_encode(hdr, S3_HDR, &t->keys[i], &t->meta[i], NULL, t->meta[i].serde, src->len,
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
        if (kvt_s3_obj_path(e, &t->keys[i], r->path, sizeof(r->path)) < 0)
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
        if (kvt_s3_obj_path(e, &t->keys[i], r->path, sizeof(r->path)) < 0) {
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
    if (e->shared_budget) { /* the removal claim (kvt_s3_remove_keys) */
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
    kvt_s3_remove_keys(e, keys, n, rcs);
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
    kvt_s3_list_free(e->list);
    explicit_bzero(&e->creds, sizeof(e->creds));
    explicit_bzero(&e->sig, sizeof(e->sig));
    kvt_l2_park_destroy(&e->park);
    pthread_mutex_destroy(&e->lock);
    free(e);
    l2->engine = NULL;
}

static const struct kvt_l2_ops s3_ops = {
    .submit = s3_submit,
    .remove = kvt_s3_remove,
    .remove_batch = kvt_s3_remove_batch,
    .status = s3_status,
    .healthy = s3_healthy,
    .nodes = s3_nodes,
    .close = s3_close,
};

/* ---------------------------------------------------------- creation */

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
    rc = o->azure ? kvt_s3_azure_creds(o, e, err, errcap)
                  : kvt_s3_load_creds(o, &e->creds, err, errcap);
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
    e->list = kvt_s3_list_new();
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
    kvt_s3_list_free(e->list);
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

const struct kvt_l2_adapter_desc kvt_l2_s3_desc = {
    .name = "s3",
    .opts_size = sizeof(struct kvt_s3_opts),
    .parse = kvt_s3_parse,
    .open = s3_open,
    .check = kvt_s3_check,
    .shared_budget = kvt_s3_nixl_obj_shared_budget,
    .budget_max_interval_ms = KVT_L2_BUDGET_LEASE_MS / 3,
};
