/*
 * The shared budget record of servers sharing one bucket and key prefix
 * (s3 with "shared_budget": true; l2/budget.h has the rules): the object
 * "<key_prefix>.kvtier-budget" holding l2/kit/brec.h's 4096-byte record.
 *
 * One step = GET the record (its ETag), apply the step to it, PUT it back
 * with If-Match: <that ETag> (If-None-Match: * when there was none); a 412
 * means another server stepped in between: read again and retry, after a
 * short random wait. S3's conditional writes (AWS since 2024, versitygw,
 * MinIO) make the read-modify-write atomic without a lock, and a server
 * that dies mid-step leaves the record as it was.
 *
 * A PUT whose answer is lost may have landed: retrying it would apply the
 * step twice (a refund or a removal twice is an under-count). So every step
 * carries a tag, written into this server's entry with the step's result
 * (granted, removed): after a lost answer the next GET shows whether the
 * entry holds the tag (the step landed: its result is read back) or not
 * (it did not, and can no longer: its If-Match named a record that is
 * gone). Exactly once, either way.
 *
 * Dead servers: a server's entry is a lease, renewed by each of its steps
 * (the eviction cycle steps at least every --eviction-interval-ms, at most
 * 10 s with a shared budget); an entry not renewed for 30 s by the S3
 * server's clock (the answers' Date header: one clock for every server) is
 * folded by the next periodic step of another server.
 *
 * A record that is missing or torn is made again full (total = cap) until a
 * recount: the start-up listing of a server (begin before its first page,
 * end after its last), or, for a record that vanished under a running
 * server, a listing that server starts then.
 *
 * Deadline: a step gives up (the store it charges is refused; an unsure
 * step stays unknown, an over-count) once S3 has not answered any of its
 * requests for request_timeout, or the breaker is open: retries never
 * make a caller wait longer than one request would.
 *
 * Threads: steps run on store threads, the eviction thread and the I/O
 * thread (the listing's recount, parked stores resuming), so they never
 * wait for the I/O thread: their requests go through their own easy handle
 * (kvt_s3_perform), one step at a time under s->lock, a leaf.
 */
#include "common/log.h"
#include "common/util.h"
#include "kvtier/error.h"
#include "l2/adapters.h"
#include "l2/budget.h"
#include "l2/kit/brec.h"
#include "l2/kit/dirlock.h"
#include "l2/s3/s3_int.h"
#include "l2/s3/sigv4.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#define LEASE_MS KVT_L2_BUDGET_LEASE_MS
#define MAX_TRIES 64 /* conflicts before a step gives up (the store fails: safe) */

/* the entry's step word: a tag (30 bits) and the step's result */
#define W_GRANTED 1u
#define W_REMOVED 2u

struct s3rec {
    pthread_mutex_t lock; /* one step at a time (a leaf) */
    struct s3_engine *e;
    struct s3_sync sync;
    char path[S3_PATH_MAX]; /* canonical path of the record object */
    char where[1100];
    uint64_t cap;
    uint64_t id; /* random, per open */
    uint32_t pid;
    char host[KVT_BREC_HOST];
    uint32_t tag;  /* the last step's tag (guarded by lock) */
    uint32_t live; /* live entries at the last census */
    bool warned_torn, made;
};

static uint64_t local_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void describe(const struct s3_req *r, const char *what, char *err, size_t errcap)
{
    if (r->status)
        snprintf(err, errcap, "%s: %s (HTTP %ld %s) %s", what, kvt_s3_outcome_name(r->outcome),
                 r->status, r->err_code, r->err_msg);
    else
        snprintf(err, errcap, "%s: %s %s", what, kvt_s3_outcome_name(r->outcome), r->err_msg);
}

/* Whether q got an HTTP answer (a refusal included), not a transport
 * error, a stall or the breaker. */
static bool answered(const struct s3_req *q)
{
    return q->outcome != S3_CONN && q->outcome != S3_UNAVAILABLE;
}

/* GET the record into r (0: read, with etag; 1: there is none), or -EIO;
 * *heard: S3 answered. */
static int fetch(struct s3rec *s, struct kvt_brec *r, char *etag, size_t etcap, uint64_t *now,
                 bool *heard, char *err, size_t errcap)
{
    struct s3_req q;
    memset(&q, 0, sizeof(q));
    q.op = S3_GET;
    snprintf(q.path, sizeof(q.path), "%s", s->path);
    enum s3_outcome o = kvt_s3_perform(s->e, &s->sync, &q);
    *heard = answered(&q);
    *now = q.date_ms > 0 ? (uint64_t)q.date_ms : local_ms();
    int rc = 0;
    if (o == S3_OK) {
        snprintf(etag, etcap, "%s", q.etag);
        int d = kvt_brec_decode((const uint8_t *)q.body, q.blen, r);
        if (d) {
            if (!s->warned_torn)
                kvt_warn("shared budget %s: the record is torn or of another format (%zu "
                         "bytes): rebuilt as full (total = the cap) until a recount (the next "
                         "server start) lists the bucket",
                         s->where, q.blen);
            s->warned_torn = true;
            kvt_brec_init(r, s->cap, local_ms());
            r->total = (int64_t)s->cap;
        }
        if (!etag[0]) {
            describe(&q, "the record's GET had no ETag", err, errcap);
            rc = -EIO;
        }
    } else if (o == S3_NOTFOUND) {
        /* the first server, or a record removed: full until a recount */
        if (s->made) {
            kvt_warn("shared budget %s: the record is gone (removed while servers use it): "
                     "made again as full, and the bucket is listed again to recount it",
                     s->where);
            atomic_store(&s->e->relist, true); /* the I/O thread lists (kvt_s3_io_tick) */
        }
        kvt_brec_init(r, s->cap, local_ms());
        r->total = (int64_t)s->cap;
        etag[0] = 0;
        rc = 1;
    } else {
        describe(&q, "cannot read the record", err, errcap);
        rc = -EIO;
    }
    kvt_s3_req_clear(&q);
    return rc;
}

/* PUT the record conditionally: 0 written, 1 lost to another server (412),
 * 2 the answer was lost (it may have landed), -EIO refused; *heard: S3
 * answered. */
static int store(struct s3rec *s, const struct kvt_brec *r, const char *etag, bool *heard,
                 char *err, size_t errcap)
{
    uint8_t buf[KVT_BREC_BYTES];
    kvt_brec_encode(r, buf);
    struct s3_req q;
    memset(&q, 0, sizeof(q));
    q.op = S3_PUT;
    snprintf(q.path, sizeof(q.path), "%s", s->path);
    q.mem = (const char *)buf;
    q.mlen = sizeof(buf);
    if (etag[0])
        snprintf(q.cond, sizeof(q.cond), "If-Match: %s", etag);
    else
        snprintf(q.cond, sizeof(q.cond), "If-None-Match: *");
    enum s3_outcome o = kvt_s3_perform(s->e, &s->sync, &q);
    *heard = answered(&q);
    int rc;
    if (o == S3_OK)
        rc = 0;
    else if (o == S3_PRECOND || (o == S3_NOTFOUND && etag[0]))
        rc = 1; /* changed, or removed, since our GET */
    else if (o == S3_CONN || o == S3_SERVER)
        rc = 2;
    else {
        describe(&q, "cannot write the record", err, errcap);
        rc = -EIO;
    }
    if (rc == 2)
        describe(&q, "the record's PUT got no answer", err, errcap);
    kvt_s3_req_clear(&q);
    return rc;
}

/* Fold the entries not renewed within the lease (by the S3 server's clock);
 * count the live ones (a kvt_brec_census_fn). */
static uint32_t census(void *ctx, struct kvt_brec *r, uint64_t now)
{
    struct s3rec *s = ctx;
    uint32_t folded = 0, live = 0;
    for (int i = 0; i < KVT_BREC_NODES; i++) {
        const struct kvt_brec_node *n = &r->node[i];
        if (!n->id)
            continue;
        if (n->id == s->id || n->seen_ms + LEASE_MS > now) {
            live++;
            continue;
        }
        kvt_info("shared budget %s: the server %s pid %u has not stepped for %.0f s: its entry "
                 "(part %lld bytes, %llu pending) is folded into the total",
                 s->where, n->host, n->pid, (double)(now - n->seen_ms) / 1000.0, (long long)n->part,
                 (unsigned long long)n->pending);
        kvt_brec_fold(r, i);
        folded++;
    }
    s->live = live;
    return folded;
}

/* Our entry, joining when we have none. */
static int join(struct s3rec *s, struct kvt_brec *r, uint64_t now, bool *rejoined, uint32_t *folded)
{
    int slot = kvt_brec_find(r, s->id);
    if (slot >= 0)
        return slot;
    *rejoined = true;
    *folded += census(s, r, now);
    slot = kvt_brec_free_slot(r);
    if (slot < 0)
        return -ENOSPC;
    kvt_brec_join(r, slot, s->id, s->pid, s->host, now);
    s->live++;
    return slot;
}

static int step(struct s3rec *s, const struct kvt_brec_op *op, struct kvt_budget_view *out,
                char *err, size_t errcap)
{
    pthread_mutex_lock(&s->lock);
    s->tag = (s->tag + 1) & 0x3fffffffu;
    if (!s->tag)
        s->tag = 1;
    uint32_t tag = s->tag;
    bool unsure = false; /* an attempt's answer was lost: it may have landed */
    int rc = -EIO;
    uint64_t t_heard = kvt_now_ns(), limit = (uint64_t)s->e->request_timeout_ms * 1000000ull;
    for (int attempt = 0; attempt < MAX_TRIES; attempt++) {
        if (attempt && (!kvt_s3_available(s->e) || kvt_now_ns() - t_heard >= limit)) {
            char why[300];
            snprintf(why, sizeof(why), "%s", err);
            snprintf(err, errcap, "%s: S3 %s (%.200s)", s->where,
                     kvt_s3_available(s->e) ? "did not answer within request_timeout"
                                            : "is unavailable (circuit open)",
                     why);
            break; /* rc stays the last attempt's: the step failed */
        }
        if (attempt) { /* a random wait, growing: servers colliding spread out */
            uint32_t rnd = 0;
            if (getrandom(&rnd, sizeof(rnd), GRND_NONBLOCK) != sizeof(rnd))
                rnd = (uint32_t)kvt_now_ns();
            long cap_us = 500L << KVT_MIN(attempt, 8);
            struct timespec ts = {0, (long)(rnd % (uint32_t)cap_us) * 1000L};
            nanosleep(&ts, NULL);
        }
        struct kvt_brec r;
        char etag[128];
        uint64_t now;
        bool heard = false;
        int f = fetch(s, &r, etag, sizeof(etag), &now, &heard, err, errcap);
        if (heard)
            t_heard = kvt_now_ns();
        if (f < 0) {
            rc = f;
            if (unsure)
                continue; /* read again: did it land? */
            break;
        }
        int mine = kvt_brec_find(&r, s->id);
        if (unsure && op->kind == KVT_BREC_APPLY && mine >= 0 && (r.node[mine].step >> 2) == tag) {
            /* the lost answer's PUT landed: its result is in our entry */
            uint32_t w = r.node[mine].step;
            kvt_info("shared budget %s: a step's PUT got no answer (%s); its answer was lost, "
                     "and it had landed: read back from the record, not applied again",
                     s->where, err);
            kvt_brec_view(&r, mine, out);
            out->granted = w & W_GRANTED;
            out->removed_ok = w & W_REMOVED;
            out->nodes = s->live;
            rc = 0;
            break;
        }
        bool rejoined = false;
        uint32_t folded = 0;
        int slot = join(s, &r, now, &rejoined, &folded);
        if (slot < 0) {
            snprintf(err, errcap,
                     "%s: every entry is taken by a live server (at most %d "
                     "servers)",
                     s->where, KVT_BREC_NODES);
            rc = slot;
            break;
        }
        folded += kvt_brec_step(&r, slot, op, rejoined, now, census, s, out);
        /* the result travels in the entry: a lost answer is read back */
        r.node[slot].step = tag << 2 | (out && out->granted ? W_GRANTED : 0) |
                            (out && out->removed_ok ? W_REMOVED : 0);
        if (out) {
            out->nodes = s->live;
            out->folded = folded;
        }
        int w = store(s, &r, etag, &heard, err, errcap);
        if (heard)
            t_heard = kvt_now_ns();
        if (w == 0) {
            s->made = true;
            rc = 0;
            break;
        }
        if (w < 0) {
            rc = w;
            if (!unsure)
                break;
            continue; /* an earlier attempt may have landed: look */
        }
        unsure = unsure || w == 2;
        snprintf(err, errcap, "%s: %d conflicting steps in a row", s->where, attempt + 1);
        rc = -EBUSY;
    }
    if (rc == 0)
        err[0] = 0;
    pthread_mutex_unlock(&s->lock);
    return rc;
}

static int sr_apply(void *rec, const struct kvt_budget_req *rq, struct kvt_budget_view *out,
                    char *err, size_t errcap)
{
    struct kvt_brec_op op = {.kind = KVT_BREC_APPLY, .rq = rq};
    return step(rec, &op, out, err, errcap);
}

static int sr_begin(void *rec, uint64_t inflight, struct kvt_budget_snap *snap, char *err,
                    size_t errcap)
{
    struct kvt_brec_op op = {.kind = KVT_BREC_BEGIN, .inflight = inflight, .snap = snap};
    return step(rec, &op, NULL, err, errcap);
}

static int sr_end(void *rec, uint64_t inflight, const struct kvt_budget_snap *snap, uint64_t walked,
                  struct kvt_budget_view *out, char *err, size_t errcap)
{
    struct kvt_budget_snap sn = *snap;
    struct kvt_brec_op op = {
        .kind = KVT_BREC_END, .inflight = inflight, .snap = &sn, .walked = walked};
    return step(rec, &op, out, err, errcap);
}

static void sr_where(void *rec, char *out, size_t cap)
{
    const struct s3rec *s = rec;
    snprintf(out, cap, "%s", s->where);
}

/* Leave: our entry folds into the total (the objects we stored stay). */
static void sr_leave(void *rec)
{
    struct s3rec *s = rec;
    pthread_mutex_lock(&s->lock);
    for (int attempt = 0; s->made && attempt < 8; attempt++) {
        struct kvt_brec r;
        char etag[128], err[256];
        uint64_t now;
        bool heard;
        if (fetch(s, &r, etag, sizeof(etag), &now, &heard, err, sizeof(err)) != 0)
            break;
        int slot = kvt_brec_find(&r, s->id);
        if (slot < 0)
            break;
        kvt_brec_fold(&r, slot);
        if (store(s, &r, etag, &heard, err, sizeof(err)) != 1)
            break; /* written, or failed: the lease folds it then */
    }
    pthread_mutex_unlock(&s->lock);
    kvt_s3_sync_free(&s->sync);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

static const struct kvt_budget_rec_ops s3rec_ops = {
    .kind = "s3",
    .apply = sr_apply,
    .begin = sr_begin,
    .end = sr_end,
    .where = sr_where,
    .leave = sr_leave,
};

int kvt_s3_budget_attach(struct s3_engine *e, char *err, size_t errcap)
{
    struct s3rec *s = kvt_xcalloc(1, sizeof(*s));
    pthread_mutex_init(&s->lock, NULL);
    s->e = e;
    s->cap = e->l2->cap_bytes;
    s->pid = (uint32_t)getpid();
    char host[256] = "";
    gethostname(host, sizeof(host));
    snprintf(s->host, sizeof(s->host), "%.*s", KVT_BREC_HOST - 1, host);
    while (s->id == 0)
        if (getrandom(&s->id, sizeof(s->id), 0) != sizeof(s->id))
            s->id = kvt_now_ns() ^ ((uint64_t)s->pid << 32);
    if (getrandom(&s->tag, sizeof(s->tag), 0) != sizeof(s->tag))
        s->tag = (uint32_t)kvt_now_ns();
    char name[300]; /* "kv/" -> "kv/.kvtier-budget"; "" -> ".kvtier-budget" */
    snprintf(name, sizeof(name), "%s%s", e->prefix, KVT_BUDGET_FILE_NAME);
    int bl = snprintf(s->path, sizeof(s->path), "%s/", e->base);
    if (kvt_sigv4_uri_encode(name, strlen(name), false, s->path + bl,
                             sizeof(s->path) - (size_t)bl) < 0) {
        snprintf(err, errcap, "the budget record's name %s is too long", name);
        pthread_mutex_destroy(&s->lock);
        free(s);
        return KVT_E_CONFIG;
    }
    snprintf(s->where, sizeof(s->where), "s3:%s://%s%s/%s", e->scheme, e->host, e->base, name);
    int rc = kvt_l2_budget_attach(e->l2, &s3rec_ops, s, err, errcap);
    if (rc)
        sr_leave(s);
    return rc;
}
