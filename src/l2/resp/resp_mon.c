/*
 * resp adapter: health, reconnects with backoff, start-up scan and the
 * reconcile after a server restart (see resp.c). One monitor thread.
 */
#include "common/log.h"
#include "common/util.h"
#include "kvtier/error.h"
#include "l2/resp/resp_int.h"
#include "l2/budget.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------------------ health */

void kvt_resp_set_err(struct resp_engine *e, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&e->hlock);
    vsnprintf(e->last_err, sizeof(e->last_err), fmt, ap);
    pthread_mutex_unlock(&e->hlock);
    va_end(ap);
}

/*
 * A transport error: the server is unreachable or the connection broke and
 * a fresh one failed too. Lookups miss and stores fail from now on, until
 * the monitor thread has reconnected.
 */
void kvt_resp_mark_down(kvt_l2 *l2, struct resp_engine *e, const char *why)
{
    bool was_up = atomic_exchange(&e->up, false);
    atomic_fetch_add(&e->epoch, 1);
    pthread_mutex_lock(&e->hlock);
    snprintf(e->last_err, sizeof(e->last_err), "%s", why);
    if (was_up) {
        uint64_t now = kvt_now_ns();
        e->down_since_ns = now;
        e->backoff_ns = BACKOFF_MIN_NS;
        e->next_probe_ns = now + e->backoff_ns;
        pthread_cond_broadcast(&e->hcond);
    }
    pthread_mutex_unlock(&e->hlock);
    if (was_up) {
        atomic_fetch_add(&e->disconnects, 1);
        kvt_warn("%s: lost %s: %s; lookups miss and stores fail until it is back "
                 "(reconnecting with backoff)",
                 l2->name, e->endpoint, why);
        kvt_resp_fail_parked(l2, e, false);
    }
}

/* ----------------------------------------------------- monitor thread */

/* Value of "field:" in an INFO reply, copied to out. */
static void info_field(const char *info, const char *field, char *out, size_t cap)
{
    out[0] = 0;
    size_t fl = strlen(field);
    for (const char *p = info; p && *p;) {
        if (strncmp(p, field, fl) == 0 && p[fl] == ':') {
            const char *v = p + fl + 1;
            size_t n = strcspn(v, "\r\n");
            snprintf(out, cap, "%.*s", (int)KVT_MIN(n, cap - 1), v);
            return;
        }
        p = strchr(p, '\n');
        if (p)
            p++;
    }
}

/*
 * Probe: connect, authenticate, INFO server. On success the adapter is up;
 * a changed run_id means the server restarted: reconcile with a new scan.
 * Cluster mode: the slot map from the first node that answers (a master
 * that restarts comes back as a replica of its successor, which kept the
 * data: no reconcile).
 */
int kvt_resp_probe(kvt_l2 *l2, struct resp_engine *e, struct conn *mon)
{
    char msg[256];
    int rc = e->cluster ? kvt_resp_cl_refresh(l2, e, mon, msg, sizeof(msg))
                        : kvt_resp_conn_open(e, mon, msg, sizeof(msg));
    redisReply *r = NULL;
    if (!rc) {
        r = redisCommand(mon->c, "INFO server");
        if (!r || r->type != REDIS_REPLY_STRING) {
            snprintf(msg, sizeof(msg), "INFO: %s",
                     r && r->type == REDIS_REPLY_ERROR ? r->str : mon->c->errstr);
            rc = -EIO;
        }
    }
    uint64_t now = kvt_now_ns();
    pthread_mutex_lock(&e->hlock);
    if (rc) {
        snprintf(e->last_err, sizeof(e->last_err), "%s", msg);
        e->backoff_ns = KVT_MIN(e->backoff_ns * 2, BACKOFF_MAX_NS);
        e->next_probe_ns = now + e->backoff_ns;
        pthread_mutex_unlock(&e->hlock);
        if (r)
            freeReplyObject(r);
        kvt_resp_conn_close(mon);
        return rc;
    }
    char run_id[48], ver[32];
    info_field(r->str, "run_id", run_id, sizeof(run_id));
    info_field(r->str, "valkey_version", ver, sizeof(ver));
    if (!ver[0])
        info_field(r->str, "redis_version", ver, sizeof(ver));
    freeReplyObject(r);
    bool restarted = !e->cluster && e->run_id[0] && strcmp(run_id, e->run_id) != 0;
    double down_s = e->down_since_ns ? (double)(now - e->down_since_ns) / 1e9 : 0;
    bool was_down = e->down_since_ns != 0;
    snprintf(e->run_id, sizeof(e->run_id), "%s", run_id);
    snprintf(e->version, sizeof(e->version), "%s", ver);
    if (restarted) {
        e->scan_needed = true;
        e->sweep_after_scan = true;
    }
    e->last_err[0] = 0;
    e->backoff_ns = BACKOFF_MIN_NS;
    e->down_since_ns = 0;
    atomic_store(&e->up, true);
    pthread_mutex_unlock(&e->hlock);
    if (was_down) {
        atomic_fetch_add(&e->reconnects, 1);
        kvt_info("%s: reconnected to %s after %.1f s%s", l2->name, e->endpoint, down_s,
                 restarted ? " (server restarted: reconciling the index)" : "");
    }
    return 0;
}

/* Mark an indexed entry as seen by the current scan. */
static bool mark_seen(kvt_l2 *l2, const kvt_key *ck, unsigned gen, uint32_t logical)
{
    bool found = false;
    pthread_mutex_lock(&l2->lock);
    struct kvt_l2_obj *o = kvt_l2_find_locked(l2, ck);
    if (o) {
        o->flags = (uint8_t)(F_LEN_KNOWN | gen);
        if (kvt_l2_obj_state(o) == KVT_OBJ_READY)
            kvt_l2_obj_set_len_locked(l2, o, logical);
        found = true;
    }
    pthread_mutex_unlock(&l2->lock);
    return found;
}

/* One SCAN page's keys: STRLEN + header of each, pipelined; adopt the valid
 * ones at the cold end. Returns 0 or -EIO (connection lost). */
static int scan_page(kvt_l2 *l2, struct resp_engine *e, struct conn *mon, redisReply *keys,
                     unsigned gen, uint64_t *objs, uint64_t *bytes, uint64_t *walked)
{
    redisContext *c = mon->c;
    size_t n = keys->elements;
    kvt_key *k = kvt_xcalloc(n ? n : 1, sizeof(kvt_key));
    bool *ok = kvt_xcalloc(n ? n : 1, sizeof(bool));
    for (size_t i = 0; i < n; i++) {
        redisReply *kr = keys->element[i];
        if (kr->type != REDIS_REPLY_STRING || kr->len <= e->prefix_len + (e->prefix_len ? 1 : 0))
            continue;
        size_t skip = e->prefix_len ? e->prefix_len + 1 : 0;
        if (kvt_key_decode(KVT_CODEC_OBJ, kr->str + skip, kr->len - skip, &k[i]))
            continue;
        redisAppendCommand(c, "STRLEN %b", kr->str, kr->len);
        redisAppendCommand(c, "GETRANGE %b 0 %d", kr->str, kr->len, HDR - 1);
        ok[i] = true;
    }
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        if (!ok[i])
            continue;
        redisReply *a = NULL, *b = NULL;
        if (redisGetReply(c, (void **)&a) != REDIS_OK ||
            redisGetReply(c, (void **)&b) != REDIS_OK) {
            rc = -EIO;
        } else if (a->type == REDIS_REPLY_INTEGER && b->type == REDIS_REPLY_STRING) {
            struct kvt_objhdr h;
            const char *why;
            kvt_key ck;
            kvt_key_canon(KVT_CODEC_OBJ, &k[i], &ck);
            if (kvt_resp_check_header((const uint8_t *)b->str, (uint32_t)b->len,
                                      (uint64_t)a->integer, &k[i], &h, &why) == 0) {
                *walked += (uint64_t)a->integer; /* every value found, indexed or not */
                if (!mark_seen(l2, &ck, gen, (uint32_t)h.logical_len) &&
                    kvt_l2_adopt(l2, &ck, (uint32_t)a->integer, (uint32_t)h.logical_len, HDR,
                                 (uint8_t)(F_LEN_KNOWN | gen), false, true)) {
                    (*objs)++;
                    *bytes += (uint64_t)a->integer;
                }
            } else if (a->integer > 0) {
                atomic_fetch_add(&e->foreign, 1);
            }
        }
        if (a)
            freeReplyObject(a);
        if (b)
            freeReplyObject(b);
    }
    free(k);
    free(ok);
    return rc;
}

/* Drop READY, unpinned entries the last scan did not see (gen differs). */
static uint64_t sweep_unseen(kvt_l2 *l2, unsigned gen)
{
    uint64_t total = 0;
    for (;;) {
        kvt_key keys[512];
        uint32_t n = 0;
        pthread_mutex_lock(&l2->lock);
        for (uint32_t h = 0; h < l2->idx.hwm && n < KVT_ARRAY_LEN(keys); h++) {
            struct kvt_l2_obj *o = &l2->idx.objs[h];
            if (kvt_l2_obj_state(o) == KVT_OBJ_READY && o->pins == 0 && (o->flags & F_GEN) != gen)
                keys[n++] = o->key;
        }
        pthread_mutex_unlock(&l2->lock);
        if (n == 0)
            break;
        uint32_t d = kvt_l2_drop_gone(l2, keys, n);
        total += d;
        if (d == 0)
            break;
    }
    return total;
}

/* SCAN one connection's server for pattern, adopting what it holds. */
static int scan_conn(kvt_l2 *l2, struct resp_engine *e, struct conn *mon, const char *pattern,
                     size_t pl, unsigned gen, uint64_t *objs, uint64_t *bytes, uint64_t *walked,
                     char *msg, size_t cap)
{
    char cursor[32] = "0";
    int rc = 0;
    do {
        pthread_mutex_lock(&e->hlock);
        bool stop = e->stop;
        pthread_mutex_unlock(&e->hlock);
        if (stop || !atomic_load(&e->up)) {
            rc = -ECANCELED;
            break;
        }
        redisReply *r = redisCommand(mon->c, "SCAN %s MATCH %b COUNT 1000", cursor, pattern, pl);
        if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
            r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_ARRAY) {
            snprintf(msg, cap, "SCAN: %s",
                     r && r->type == REDIS_REPLY_ERROR ? r->str : mon->c->errstr);
            if (r)
                freeReplyObject(r);
            rc = -EIO;
            break;
        }
        snprintf(cursor, sizeof(cursor), "%s", r->element[0]->str);
        rc = scan_page(l2, e, mon, r->element[1], gen, objs, bytes, walked);
        if (rc)
            snprintf(msg, cap, "SCAN: %s", mon->c->errstr[0] ? mon->c->errstr : "connection lost");
        freeReplyObject(r);
    } while (!rc && strcmp(cursor, "0") != 0);
    return rc;
}

/*
 * SCAN the prefix: restore accounting (first scan) or reconcile it (after a
 * server restart). Runs on the monitor thread with its own connection,
 * while the workers serve.
 */
static int scan_all(kvt_l2 *l2, struct resp_engine *e, struct conn *mon, bool sweep, char *msg,
                    size_t cap)
{
    char pattern[2 * sizeof(e->prefix) + 8];
    size_t pl = 0;
    if (e->prefix_len) {
        for (size_t i = 0; i < e->prefix_len; i++) {
            char ch = e->prefix[i];
            if (strchr("*?[]\\", ch))
                pattern[pl++] = '\\';
            pattern[pl++] = ch;
        }
        pl += (size_t)snprintf(pattern + pl, sizeof(pattern) - pl, "@*");
    } else {
        pl = (size_t)snprintf(pattern, sizeof(pattern), "*@0x*");
    }
    unsigned gen = atomic_load(&e->gen) % F_GEN + 1;
    atomic_store(&e->gen, gen);
    uint64_t t0 = kvt_now_ns(), objs = 0, bytes = 0, walked = 0;
    /* the scan walks the whole prefix: the shared budget's recount (a
     * reshard meanwhile may move keys past it: then no recount) */
    kvt_l2_budget_recount_begin(l2, NULL, 0);
    uint64_t topo = atomic_load(&e->moved) + atomic_load(&e->asked) + atomic_load(&e->refreshes);
    int rc = 0;
    if (!e->cluster) {
        rc = scan_conn(l2, e, mon, pattern, pl, gen, &objs, &bytes, &walked, msg, cap);
    } else {
        /* every master holds its slots' keys: SCAN each one in turn */
        int masters[CL_MAX_NODES];
        int nm = kvt_resp_cl_masters(e, masters, CL_MAX_NODES);
        for (int m = 0; m < nm && !rc; m++) {
            mon->node = masters[m];
            rc = kvt_resp_conn_open(e, mon, msg, cap) ? -EIO : 0;
            if (!rc)
                rc = scan_conn(l2, e, mon, pattern, pl, gen, &objs, &bytes, &walked, msg, cap);
        }
        if (rc == -EIO)
            kvt_resp_cl_want_refresh(e);
    }
    bool same_topo =
        topo == atomic_load(&e->moved) + atomic_load(&e->asked) + atomic_load(&e->refreshes);
    kvt_l2_budget_recount_end(l2, walked, rc == 0 && same_topo);
    if (rc) {
        kvt_resp_conn_close(mon);
        return rc;
    }
    uint64_t swept = sweep ? sweep_unseen(l2, gen) : 0;
    atomic_fetch_add(&e->swept, swept);
    double secs = (double)(kvt_now_ns() - t0) / 1e9;
    pthread_mutex_lock(&l2->lock);
    l2->recovered_objs += objs;
    l2->recovered_bytes += bytes;
    l2->recovery_seconds = secs;
    l2->recovering = false;
    pthread_mutex_unlock(&l2->lock);
    if (sweep)
        kvt_info("%s: reconciled with the restarted server in %.3f s: %llu objects found, "
                 "%llu no longer there dropped",
                 l2->name, secs, (unsigned long long)objs, (unsigned long long)swept);
    else
        kvt_info("%s: recovered %llu objects, %llu bytes from %s in %.3f s", l2->name,
                 (unsigned long long)objs, (unsigned long long)bytes, e->endpoint, secs);
    return 0;
}

static void release_parked(kvt_l2 *l2, struct resp_engine *e)
{
    kvt_l2_task *p = kvt_l2_park_take(&e->park, true);
    while (p) {
        kvt_l2_task *nx = p->next;
        p->next = NULL;
        kvt_resp_submit(l2, p);
        p = nx;
    }
}

void *kvt_resp_monitor_main(void *arg)
{
    kvt_l2 *l2 = arg;
    struct resp_engine *e = l2->engine;
    pthread_setname_np(pthread_self(), "resp-mon");
    struct conn mon = {0};
    for (;;) {
        pthread_mutex_lock(&e->hlock);
        bool do_probe = false, do_scan = false, sweep = false, do_refresh = false;
        while (!e->stop) {
            bool up = atomic_load(&e->up);
            uint64_t now = kvt_now_ns();
            if (!up && now >= e->next_probe_ns) {
                do_probe = true;
                break;
            }
            bool want_refresh = up && e->cluster && e->refresh_needed;
            if (want_refresh && now >= e->next_refresh_ns) {
                do_refresh = true;
                e->refresh_needed = false;
                break;
            }
            if (up && e->scan_needed) {
                do_scan = true;
                sweep = e->sweep_after_scan;
                /* cleared as the scan starts: a request made while it runs
                 * (the budget record re-created mid-SCAN, a restart seen)
                 * asks for another; a failed scan asks again below */
                e->scan_needed = false;
                e->sweep_after_scan = false;
                e->scan_running = true;
                break;
            }
            if (!up || want_refresh) {
                uint64_t until = !up ? e->next_probe_ns : e->next_refresh_ns;
                struct timespec ts;
                clock_gettime(CLOCK_MONOTONIC, &ts);
                uint64_t d = until - now;
                ts.tv_sec += (time_t)(d / 1000000000ull);
                ts.tv_nsec += (long)(d % 1000000000ull);
                if (ts.tv_nsec >= 1000000000L) {
                    ts.tv_sec++;
                    ts.tv_nsec -= 1000000000L;
                }
                pthread_cond_timedwait(&e->hcond, &e->hlock, &ts);
            } else {
                pthread_cond_wait(&e->hcond, &e->hlock);
            }
        }
        bool stop = e->stop;
        pthread_mutex_unlock(&e->hlock);
        if (stop)
            break;
        if (do_probe) {
            kvt_resp_probe(l2, e, &mon);
            continue;
        }
        if (do_refresh) {
            /* a MOVED, a failed node or a cluster error: re-read the map;
             * no node answering at all takes the adapter down */
            char msg[256];
            int rc = kvt_resp_cl_refresh(l2, e, &mon, msg, sizeof(msg));
            pthread_mutex_lock(&e->hlock);
            e->next_refresh_ns =
                kvt_now_ns() + (e->replica_poll ? CL_REPLICA_POLL_NS : CL_REFRESH_GAP_NS);
            pthread_mutex_unlock(&e->hlock);
            if (rc)
                kvt_resp_mark_down(l2, e, msg);
            continue;
        }
        if (do_scan) {
            if (!mon.c || mon.c->err || mon.epoch != atomic_load(&e->epoch)) {
                char msg[256];
                if (kvt_resp_conn_open(e, &mon, msg, sizeof(msg))) {
                    kvt_resp_mark_down(l2, e, msg);
                    pthread_mutex_lock(&e->hlock);
                    e->scan_running = false;
                    e->scan_needed = true;
                    e->sweep_after_scan |= sweep;
                    pthread_mutex_unlock(&e->hlock);
                    continue;
                }
            }
            char msg[256] = "";
            int rc = scan_all(l2, e, &mon, sweep, msg, sizeof(msg));
            pthread_mutex_lock(&e->hlock);
            e->scan_running = false;
            if (rc) {
                e->scan_needed = true;
                e->sweep_after_scan |= sweep;
            }
            pthread_mutex_unlock(&e->hlock);
            if (rc == 0)
                release_parked(l2, e);
            else if (rc == -EIO)
                kvt_resp_mark_down(l2, e, msg);
        }
    }
    kvt_resp_conn_close(&mon);
    return NULL;
}
