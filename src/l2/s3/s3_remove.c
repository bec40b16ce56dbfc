/*
 * s3 removal: DELETEs of a batch of objects, all in flight at once on the
 * I/O thread, synchronous for the caller (eviction, purge, the delete
 * request, close with persist_enabled false). With a shared budget, each
 * object is claimed first (a conditional marker), so that two servers
 * removing the same object count its bytes once.
 */
#include "common/log.h"
#include "common/util.h"
#include "kvtier/error.h"
#include "l2/budget.h"
#include "l2/engine.h"
#include "l2/s3/s3_int.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

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
#define CL_FOUND 2 /* HEAD: an object with content: claim it */

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
        int rc = kvt_s3_obj_path(e, &keys[base + i], r->path, sizeof(r->path));
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
void kvt_s3_remove_keys(struct s3_engine *e, const kvt_key *keys, uint32_t n, int *rcs)
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

void kvt_s3_remove_batch(kvt_l2 *l2, const struct kvt_l2_obj *objs, uint32_t n, int *rcs)
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
    kvt_s3_remove_keys(e, keys, n, rcs);
    free(keys);
}

int kvt_s3_remove(kvt_l2 *l2, const struct kvt_l2_obj *o)
{
    int rc;
    kvt_s3_remove_batch(l2, o, 1, &rc);
    return rc;
}
