/*
 * resp adapter: the shared budget's record (l2/budget.h) as one hash on the
 * Redis server, "kvtier:budget:<key_prefix>" (outside the data keys' SCAN
 * pattern), changed only by the Lua scripts below: each runs atomically on
 * the server (in a cluster, on the master owning the key's slot), so
 * several kvtier servers take, refund and subtract without a lock.
 *
 * Fields: total, adds, epoch, recounts, cap, created_ms, recount_ms,
 * recount_walked, recount_before, recount_after; per server <id> (16 hex
 * digits, random per start): p:<id> (part), q:<id> (pending), t:<id> (the
 * server's TIME in ms at its last step: its lease), h:<id> ("host pid").
 * A server whose t: is older than LEASE_MS is dead: a census folds its
 * fields away (the total keeps its bytes). Servers step at least once per
 * eviction cycle (--eviction-interval-ms, 1 s; a server refuses to start
 * with one over a third of the lease) from their evict-l2 thread.
 *
 * The scripts mirror l2/kit/brec.c, the arithmetic the file record uses
 * (tests/unit/test_budget.c checks that one; the integration tests run
 * these against redis-server).
 *
 * Locks: a step runs on the control connection under e->ctl_lock
 * (kvt_resp_ctl_key); an apply step also under rb->lock, taken first (it
 * numbers the steps in the order the server sees them).
 */
#include "common/log.h"
#include "common/util.h"
#include "kvtier/error.h"
#include "l2/adapters.h"
#include "l2/budget.h"
#include "l2/resp/resp_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#define LEASE_MS KVT_L2_BUDGET_LEASE_MS /* longer than the eviction interval: config.c */

/* ARGV[1] id, ARGV[2] lease ms, ARGV[3] cap, ARGV[4] "host pid", ARGV[5]
 * 1 when this server has seen the record before. The record is created
 * when missing as full (total = cap): created = 1 the first time this
 * server looks, 2 when it was there before and is gone (evicted by a
 * maxmemory policy, FLUSHALL, a restart without persistence). Values may
 * remain under the prefix either way (every server stopped, the record
 * lost): charging against 0 would let the running servers go over the cap
 * until the recount the server then runs (its SCAN) sets the truth.
 * entry(back): our (part, pending, rejoined), a new entry (first use,
 * folded while we lived, a record made again) starting with part and
 * pending back: what we may hold that a recount since the fold left out
 * (l2/kit/brec.c: kvt_brec_rejoin), which the caller adds to the total and
 * adds; census(): fold the dead (their bytes stay in the total), count
 * the live. */
#define LUA_HEAD                                                                                   \
    "local k = KEYS[1]\n"                                                                          \
    "local id, lease, cap = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])\n"                       \
    "local tm = redis.call('TIME')\n"                                                              \
    "local now = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)\n"                    \
    "local function num(f) return tonumber(redis.call('HGET', k, f) or '0') end\n"                 \
    "local created = 0\n"                                                                          \
    "if redis.call('EXISTS', k) == 0 then\n"                                                       \
    "  redis.call('HSET', k, 'total', cap, 'adds', 0, 'epoch', now, 'recounts', 0, 'cap', cap,\n"  \
    "             'created_ms', now)\n"                                                            \
    "  created = 1\n"                                                                              \
    "  if ARGV[5] == '1' then created = 2 end\n"                                                   \
    "end\n"                                                                                        \
    "local function entry(back)\n"                                                                 \
    "  if redis.call('HEXISTS', k, 't:' .. id) == 1 then\n"                                        \
    "    return num('p:' .. id), num('q:' .. id), 0\n"                                             \
    "  end\n"                                                                                      \
    "  redis.call('HSET', k, 'h:' .. id, ARGV[4])\n"                                               \
    "  return back, back, 1\n"                                                                     \
    "end\n"                                                                                        \
    "local function census()\n"                                                                    \
    "  local live, folded = 0, 0\n"                                                                \
    "  local all = redis.call('HGETALL', k)\n"                                                     \
    "  for i = 1, #all, 2 do\n"                                                                    \
    "    local f = all[i]\n"                                                                       \
    "    if string.sub(f, 1, 2) == 't:' then\n"                                                    \
    "      local n = string.sub(f, 3)\n"                                                           \
    "      if n ~= id and now - tonumber(all[i + 1]) > lease then\n"                               \
    "        redis.call('HDEL', k, 't:' .. n, 'p:' .. n, 'q:' .. n, 'h:' .. n, 's:' .. n,\n"       \
    "                   'r:' .. n)\n"                                                              \
    "        folded = folded + 1\n"                                                                \
    "      else\n"                                                                                 \
    "        live = live + 1\n"                                                                    \
    "      end\n"                                                                                  \
    "    end\n"                                                                                    \
    "  end\n"                                                                                      \
    "  return live, folded\n"                                                                      \
    "end\n"

/* the view, as struct kvt_budget_view's fields in this order */
#define LUA_VIEW_STMT                                                                              \
    "return {num('total'), part, pend, num('adds'), num('epoch'), num('recounts'), num('cap'),\n"  \
    "        live, folded, granted, removed_ok, rejoined, created}\n"
#define LUA_VIEW LUA_VIEW_STMT

/* ARGV[6] take, [7] refund, [8] removed, [9] removed's epoch, [10]
 * settled, [11] in flight (take included), [12] census 0/1, [13] this
 * server's step number (l2/kit/brec.c: apply). A step whose number is not
 * above the last one applied is a resend (the control connection reopened
 * after the reply was lost): it answers the first one's outcome and
 * changes nothing, so a refund or a removal is never subtracted twice. */
static const char apply_lua[] = LUA_HEAD
    "local take, refund, removed, rep = tonumber(ARGV[6]), tonumber(ARGV[7]),\n"
    "  tonumber(ARGV[8]), tonumber(ARGV[9])\n"
    "local settled, inflight = tonumber(ARGV[10]), tonumber(ARGV[11])\n"
    "local part, pend, rejoined = entry(math.max(inflight - take, 0) + refund + settled)\n"
    "local seq = tonumber(ARGV[13])\n"
    "if seq <= num('s:' .. id) then\n"
    "  local f = num('r:' .. id)\n"
    "  local granted, removed_ok, live, folded = math.floor(f / 2), f % 2, -1, 0\n"
    "  " LUA_VIEW_STMT "end\n"
    "local total = num('total')\n"
    "if rejoined == 1 then\n"
    "  total = total + part\n"
    "  redis.call('HINCRBY', k, 'adds', part)\n"
    "end\n"
    "total = total - refund\n"
    "part = part - refund\n"
    "pend = math.max(pend - refund - settled, 0)\n"
    "local removed_ok, granted = 0, 0\n"
    "if removed > 0 and rep == num('epoch') then\n"
    "  total = total - removed\n"
    "  part = part - removed\n"
    "  removed_ok = 1\n"
    "end\n"
    "if take > 0 and (cap == 0 or math.max(total, 0) + take <= cap) then\n"
    "  total = total + take\n"
    "  part = part + take\n"
    "  pend = pend + take\n"
    "  granted = 1\n"
    "  redis.call('HINCRBY', k, 'adds', take)\n"
    "end\n"
    "redis.call('HSET', k, 'total', total, 'p:' .. id, part, 'q:' .. id, pend, 't:' .. id, now,\n"
    "           's:' .. id, seq, 'r:' .. id, granted * 2 + removed_ok)\n"
    "local live, folded = -1, 0\n"
    "if ARGV[12] == '1' or rejoined == 1 then live, folded = census() end\n" LUA_VIEW;

/* begin: ARGV[6] in flight; returns {adds, pending of the live, epoch,
 * created_ms} */
static const char begin_lua[] =
    LUA_HEAD "local part, pend, rejoined = entry(tonumber(ARGV[6]))\n"
             "if rejoined == 1 then\n"
             "  redis.call('HINCRBY', k, 'total', part)\n"
             "  redis.call('HINCRBY', k, 'adds', part)\n"
             "end\n"
             "redis.call('HSET', k, 'p:' .. id, part, 'q:' .. id, pend, 't:' .. id, now)\n"
             "census()\n"
             "local sum = 0\n"
             "local all = redis.call('HGETALL', k)\n"
             "for i = 1, #all, 2 do\n"
             "  if string.sub(all[i], 1, 2) == 'q:' then sum = sum + tonumber(all[i + 1]) end\n"
             "end\n"
             "return {num('adds'), sum, num('epoch'), num('created_ms')}\n";

/* end: ARGV[6] snapshot adds, [7] snapshot pending, [8] walked, [9] in
 * flight, [10] the snapshot's created_ms (another: the record was made
 * again since, and all of its adds are since the snapshot) */
static const char end_lua[] = LUA_HEAD
    "local sadds, spend, walked = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])\n"
    "local part, pend, rejoined = entry(tonumber(ARGV[9]))\n"
    "if rejoined == 1 then redis.call('HINCRBY', k, 'adds', part) end\n"
    "local adds = num('adds')\n"
    "local since = adds - sadds\n"
    "if since < 0 or num('created_ms') ~= tonumber(ARGV[10]) then since = adds end\n"
    "local before = num('total')\n"
    "local total = walked + since + spend\n"
    "redis.call('HSET', k, 'total', total, 'recount_ms', now, 'recount_walked', walked,\n"
    "           'recount_before', before, 'recount_after', total,\n"
    "           'p:' .. id, part, 'q:' .. id, pend, 't:' .. id, now)\n"
    "redis.call('HINCRBY', k, 'epoch', 1)\n"
    "redis.call('HINCRBY', k, 'recounts', 1)\n"
    "local live, folded = census()\n"
    "local granted, removed_ok = 0, 0\n" LUA_VIEW;

static const char leave_lua[] = "redis.call('HDEL', KEYS[1], 't:' .. ARGV[1], 'p:' .. ARGV[1],\n"
                                "           'q:' .. ARGV[1], 'h:' .. ARGV[1], 's:' .. ARGV[1],\n"
                                "           'r:' .. ARGV[1])\n"
                                "return 0\n";

struct rbud {
    kvt_l2 *l2;
    struct resp_engine *e;
    char key[160];
    size_t kl;
    char id[24];
    char who[300];
    uint64_t cap;
    _Atomic uint32_t live; /* at the last census */
    _Atomic bool seen;     /* a script has answered: the record existed */
    /* numbers this server's apply steps in the order they reach the
     * server: held across the EVAL (a leaf above e->ctl_lock) */
    pthread_mutex_t lock;
    uint64_t seq; /* guarded by lock */
};

/* EVAL script with our key and ARGV[1..5] + extra (n of them). */
static int eval(struct rbud *rb, const char *script, const char *const *extra, int n,
                redisReply **out, char *err, size_t errcap)
{
    struct resp_engine *e = rb->e;
    if (!atomic_load(&e->up)) {
        snprintf(err, errcap, "not connected to %s", e->endpoint);
        return KVT_E_UNHEALTHY;
    }
    char lease[24], cap[24];
    snprintf(lease, sizeof(lease), "%d", LEASE_MS);
    snprintf(cap, sizeof(cap), "%llu", (unsigned long long)rb->cap);
    const char *argv[24] = {"EVAL",  script,  "1",
                            rb->key, rb->id,  lease,
                            cap,     rb->who, atomic_load(&rb->seen) ? "1" : "0"};
    int argc = 9;
    KVT_ASSERT(argc + n <= 24);
    for (int i = 0; i < n; i++)
        argv[argc++] = extra[i];
    size_t lens[24];
    for (int i = 0; i < argc; i++)
        lens[i] = i == 3 ? rb->kl : strlen(argv[i]);
    redisReply *r = kvt_resp_ctl_key(rb->l2, e, rb->key, rb->kl, argc, argv, lens);
    if (!r) {
        snprintf(err, errcap, "EVAL on %s: no reply", e->endpoint);
        return -EIO;
    }
    if (r->type == REDIS_REPLY_ERROR) {
        snprintf(err, errcap, "EVAL on %s: %s", e->endpoint, r->str);
        freeReplyObject(r);
        return -EIO;
    }
    if (r->type != REDIS_REPLY_ARRAY) {
        snprintf(err, errcap, "EVAL on %s: unexpected reply", e->endpoint);
        freeReplyObject(r);
        return -EPROTO;
    }
    for (size_t i = 0; i < r->elements; i++)
        if (r->element[i]->type != REDIS_REPLY_INTEGER) {
            snprintf(err, errcap, "EVAL on %s: unexpected reply element", e->endpoint);
            freeReplyObject(r);
            return -EPROTO;
        }
    *out = r;
    atomic_store(&rb->seen, true);
    return 0;
}

static long long at(const redisReply *r, size_t i)
{
    return i < r->elements ? r->element[i]->integer : 0;
}

/* LUA_VIEW's array into out */
static int view_of(struct rbud *rb, redisReply *r, struct kvt_budget_view *out, char *err,
                   size_t errcap)
{
    if (r->elements < 13) {
        snprintf(err, errcap, "EVAL: short reply");
        return -EPROTO;
    }
    memset(out, 0, sizeof(*out));
    out->total = at(r, 0);
    out->part = at(r, 1);
    out->pending = (uint64_t)at(r, 2);
    out->adds = (uint64_t)at(r, 3);
    out->epoch = (uint64_t)at(r, 4);
    out->recounts = (uint64_t)at(r, 5);
    out->cap = (uint64_t)at(r, 6);
    if (at(r, 7) >= 0)
        atomic_store(&rb->live, (uint32_t)at(r, 7));
    out->nodes = atomic_load(&rb->live);
    out->folded = (uint32_t)at(r, 8);
    out->granted = at(r, 9) != 0;
    out->removed_ok = at(r, 10) != 0;
    out->rejoined = at(r, 11) != 0;
    if (at(r, 12) == 1)
        kvt_info("%s: created the shared budget record %s, as full until a SCAN of the prefix "
                 "recounts the tier",
                 rb->l2->name, rb->key);
    else if (at(r, 12))
        kvt_warn("%s: the shared budget record %s was gone (evicted? use maxmemory-policy "
                 "noeviction): made again as full until a SCAN of the prefix recounts the tier",
                 rb->l2->name, rb->key);
    if (at(r, 12)) { /* made as full: a SCAN recounts it */
        pthread_mutex_lock(&rb->e->hlock);
        rb->e->scan_needed = true;
        pthread_cond_broadcast(&rb->e->hcond);
        pthread_mutex_unlock(&rb->e->hlock);
    }
    return 0;
}

static int rb_apply(void *rec, const struct kvt_budget_req *rq, struct kvt_budget_view *out,
                    char *err, size_t errcap)
{
    struct rbud *rb = rec;
    char a[7][24];
    snprintf(a[0], 24, "%llu", (unsigned long long)rq->take);
    snprintf(a[1], 24, "%llu", (unsigned long long)rq->refund);
    snprintf(a[2], 24, "%llu", (unsigned long long)rq->removed);
    snprintf(a[3], 24, "%llu", (unsigned long long)rq->removed_epoch);
    snprintf(a[4], 24, "%llu", (unsigned long long)rq->settled);
    snprintf(a[5], 24, "%llu", (unsigned long long)rq->inflight);
    bool refresh = !rq->take && !rq->refund && !rq->removed;
    snprintf(a[6], 24, "%d", refresh ? 1 : 0);
    char seq[24];
    const char *extra[8] = {a[0], a[1], a[2], a[3], a[4], a[5], a[6], seq};
    redisReply *r = NULL;
    pthread_mutex_lock(&rb->lock);
    snprintf(seq, sizeof(seq), "%llu", (unsigned long long)++rb->seq);
    int rc = eval(rb, apply_lua, extra, 8, &r, err, errcap);
    pthread_mutex_unlock(&rb->lock);
    if (rc)
        return rc;
    rc = view_of(rb, r, out, err, errcap);
    freeReplyObject(r);
    return rc;
}

static int rb_begin(void *rec, uint64_t inflight, struct kvt_budget_snap *snap, char *err,
                    size_t errcap)
{
    struct rbud *rb = rec;
    redisReply *r = NULL;
    char a[24];
    snprintf(a, sizeof(a), "%llu", (unsigned long long)inflight);
    const char *extra[1] = {a};
    int rc = eval(rb, begin_lua, extra, 1, &r, err, errcap);
    if (rc)
        return rc;
    if (r->elements < 4) {
        snprintf(err, errcap, "EVAL: short reply");
        freeReplyObject(r);
        return -EPROTO;
    }
    snap->adds = (uint64_t)at(r, 0);
    snap->pending = (uint64_t)at(r, 1);
    snap->epoch = (uint64_t)at(r, 2);
    snap->created = (uint64_t)at(r, 3);
    freeReplyObject(r);
    return 0;
}

static int rb_end(void *rec, uint64_t inflight, const struct kvt_budget_snap *snap, uint64_t walked,
                  struct kvt_budget_view *out, char *err, size_t errcap)
{
    struct rbud *rb = rec;
    char a[5][24];
    snprintf(a[0], 24, "%llu", (unsigned long long)snap->adds);
    snprintf(a[1], 24, "%llu", (unsigned long long)snap->pending);
    snprintf(a[2], 24, "%llu", (unsigned long long)walked);
    snprintf(a[3], 24, "%llu", (unsigned long long)inflight);
    snprintf(a[4], 24, "%llu", (unsigned long long)snap->created);
    const char *extra[5] = {a[0], a[1], a[2], a[3], a[4]};
    redisReply *r = NULL;
    int rc = eval(rb, end_lua, extra, 5, &r, err, errcap);
    if (rc)
        return rc;
    rc = view_of(rb, r, out, err, errcap);
    freeReplyObject(r);
    return rc;
}

static void rb_where(void *rec, char *out, size_t cap)
{
    const struct rbud *rb = rec;
    snprintf(out, cap, "redis:%s %s", rb->e->endpoint, rb->key);
}

/* Close: our fields go (the total keeps our bytes). The engine is closed
 * by now, its control connection still open. */
static void rb_leave(void *rec)
{
    struct rbud *rb = rec;
    struct resp_engine *e = rb->e;
    if (atomic_load(&e->up)) {
        const char *argv[5] = {"EVAL", leave_lua, "1", rb->key, rb->id};
        size_t lens[5] = {4, strlen(leave_lua), 1, rb->kl, strlen(rb->id)};
        redisReply *r = kvt_resp_ctl_key(rb->l2, e, rb->key, rb->kl, 5, argv, lens);
        if (r)
            freeReplyObject(r);
    }
    pthread_mutex_destroy(&rb->lock);
    free(rb);
}

static const struct kvt_budget_rec_ops rb_ops = {
    .kind = "redis",
    .apply = rb_apply,
    .begin = rb_begin,
    .end = rb_end,
    .where = rb_where,
    .leave = rb_leave,
};

int kvt_resp_budget_attach(kvt_l2 *l2, struct resp_engine *e, char *err, size_t errcap)
{
    struct rbud *rb = kvt_xcalloc(1, sizeof(*rb));
    rb->l2 = l2;
    rb->e = e;
    rb->cap = l2->cap_bytes;
    pthread_mutex_init(&rb->lock, NULL);
    rb->kl = (size_t)snprintf(rb->key, sizeof(rb->key), "kvtier:budget:%s", e->prefix);
    uint64_t id = 0;
    while (id == 0)
        if (getrandom(&id, sizeof(id), 0) != sizeof(id))
            id = kvt_now_ns() ^ ((uint64_t)getpid() << 32);
    snprintf(rb->id, sizeof(rb->id), "%016llx", (unsigned long long)id);
    char host[256] = "";
    gethostname(host, sizeof(host));
    snprintf(rb->who, sizeof(rb->who), "%.200s %d", host, (int)getpid());
    e->nx = true;
    return kvt_l2_budget_attach(l2, &rb_ops, rb, err, errcap);
}
