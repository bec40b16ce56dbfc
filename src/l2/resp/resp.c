/*
 * resp / valkey adapter: objects as values in a Redis or Valkey server.
 *
 * Value  = object header (objfmt.h, 512 bytes) + payload, under the key
 *          "<key_prefix>@<obj name>" (or the bare obj name when key_prefix
 *          is empty); obj name = KVT_CODEC_OBJ ("model@0x%08x@group@hash[@salt]").
 *
 * Each batch is pipelined on one connection: all commands are written, then
 * all replies read, so a batch costs one round trip, not one per key.
 * Batches above RESP_SPLIT_BYTES (4 MiB) are spread over up to num_workers
 * connections, each pipelined.
 *   Store:  reserve capacity -> SET key <hdr+payload> per key -> publish.
 *   Lookup: every lookup asks the server, in one pipelined pass: STRLEN
 *           for keys the index knows (the size must still match), GETRANGE
 *           key 0 511 + STRLEN for others (the header is decoded and checked:
 *           identity, lengths) before a key counts as a hit.
 *   Load:   GET key per key; the header is read into a small buffer and
 *           checked first, the payload is copied into the destination as it
 *           arrives (only if it fits: never an overrun), then the checksum is
 *           verified. Torn, foreign or corrupt values are misses, counted and
 *           removed.
 * Data commands bypass hiredis' buffers (hiredis 0.14 copies a value three
 * times: command formatting, reader buffer, reply object): SETs are gathered
 * through one 1 MiB output buffer per connection, GET replies are parsed
 * here and copied out of one 1 MiB reply buffer into the destination (one
 * copy each way; on the test VM this beat socket I/O straight to and from
 * the object's pages by 1.5-3x, see docs/remote-tiers.md). hiredis does the
 * rest: connect, AUTH, SELECT, INFO, SCAN, UNLINK.
 *
 * Start-up: a background SCAN over the prefix (STRLEN + header per key)
 * restores accounting while serving; with max_capacity_gb > 0 stores wait
 * for it, as fs does, so the cap holds across a kvtier restart.
 *
 * Deadline: a job has request_timeout from the moment a worker takes it;
 * connecting, every write and read of its passes (non-blocking, poll up to
 * the deadline), the retry of a connection that broke while idle, redirects
 * and a replica's fallback all end by then. A timeout is never retried.
 *
 * Failure: a transport error (refused, reset on a fresh connection, no
 * answer before the deadline) marks the adapter down: /healthz and status
 * say so, lookups miss at once, stores fail (counted), loads fail, without
 * I/O. The monitor thread probes with exponential backoff (0.1 s .. 2 s). If
 * the server's run_id changed (Redis restarted), the index is reconciled
 * with a new SCAN: objects the server lost are dropped from the accounting.
 *
 * Cluster mode ("cluster": true, resp_cluster.c): a batch is first split by
 * the master that owns each key's slot, each group pipelined on that
 * master's connection (a worker keeps one per node); MOVED/ASK replies send
 * the key again to the named node (run_cluster); a node that fails is
 * marked down and fails only its keys (at once, until the monitor's probe
 * of that node gets an answer) while the monitor re-reads the slot map; a
 * master that comes back with another run_id has its keys reconciled.
 *
 * Threads: num_workers I/O threads (tpool "resp", one connection each), one
 * monitor thread (its own connection: probe, scan). Locks: l2->lock (base,
 * never across I/O); e->hlock guards the health fields; e->park.lock (a
 * leaf, base's kvt_l2_park) the parked stores; e->ctl_lock the control
 * connection used by remove. Lock order: hlock is never held together with
 * l2->lock.
 */
#include "common/log.h"
#include "common/util.h"
#include "io/tpool.h"
#include "kvtier/error.h"
#include "l2/adapters.h"
#include "common/cfg.h"
#include "l2/engine.h"
#include "l2/life.h"
#include "l2/kit/objfmt.h"
#include "l2/resp/resp_int.h"
#include "l2/budget.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

/* ------------------------------------------------------------ names */

int kvt_resp_wire_key(const struct resp_engine *e, const kvt_key *k, char *out)
{
    char name[KVT_NAME_MAX + 1];
    int n = kvt_key_encode(KVT_CODEC_OBJ, k, name);
    if (n < 0)
        return n;
    if (!e->prefix_len) {
        memcpy(out, name, (size_t)n + 1);
        return n;
    }
    return snprintf(out, KEY_MAX, "%s@%s", e->prefix, name);
}

/* --------------------------------------------------------- batches */

struct resp_batch;

struct resp_job {
    struct kvt_job job;
    struct resp_batch *b;
    uint32_t lo, hi; /* range of b->idx */
    int node;        /* cluster mode: the node the keys' slots map to */
};

struct resp_batch {
    kvt_l2 *l2;
    kvt_l2_task *t;
    _Atomic uint32_t left;
    uint32_t *idx;   /* task key indices handled by jobs */
    uint32_t *known; /* LOOKUP: stored size of an indexed key, 0 = unknown */
    struct resp_job jobs[];
};

/* ------------------------------------------------------------ submit */

static void batch_job_done(struct resp_batch *b)
{
    if (atomic_fetch_sub_explicit(&b->left, 1, memory_order_acq_rel) == 1) {
        kvt_l2_task_finish(b->l2, b->t);
        free(b->idx);
        free(b->known);
        free(b);
    }
}

static void job_fn(struct kvt_job *job, void *ctx)
{
    struct resp_job *j = (struct resp_job *)job;
    struct resp_batch *b = j->b;
    kvt_l2 *l2 = b->l2;
    struct resp_engine *e = l2->engine;
    struct worker *w = ctx;
    const uint32_t *idx = b->idx + j->lo;
    uint32_t n = j->hi - j->lo;
    /* every pass of the job (retries, redirects, a replica's fallback to
     * its master) ends by then */
    w->deadline = kvt_now_ns() + e->req_ns;
    switch (n ? (int)b->t->kind : -1) {
    case KVT_L2_STORE:
        kvt_resp_do_store(l2, e, w, b->t, idx, n, j->node);
        break;
    case KVT_L2_LOOKUP:
        kvt_resp_do_lookup(l2, e, w, b->t, idx, b->known + j->lo, n, j->node);
        break;
    case KVT_L2_LOAD:
        kvt_resp_do_load(l2, e, w, b->t, idx, n, j->node);
        break;
    default:
        break; /* an empty share of a split batch */
    }
    batch_job_done(b);
}

/* Finish a task at once without I/O: the server is down. */
static void finish_down(kvt_l2 *l2, kvt_l2_task *t)
{
    for (uint32_t i = 0; i < t->n; i++)
        if (!kvt_bm_test(t->ok, i))
            kvt_l2_task_fail(t, i, KVT_E_UNHEALTHY);
    if (t->kind == KVT_L2_STORE)
        atomic_fetch_add(&l2->counters.store_failed, t->n);
    kvt_l2_task_finish(l2, t);
}

void kvt_resp_fail_parked(kvt_l2 *l2, struct resp_engine *e, bool stop_parking)
{
    kvt_l2_task *p = kvt_l2_park_take(&e->park, stop_parking);
    while (p) {
        kvt_l2_task *nx = p->next;
        p->next = NULL;
        finish_down(l2, p);
        p = nx;
    }
}

/* How many jobs one node's keys idx[0..n) get: one (one connection, one
 * round trip) unless they move more than RESP_SPLIT_BYTES, then up to
 * num_workers of about equal bytes. */
static uint32_t jobs_for(const struct resp_engine *e, const kvt_l2_task *t, const uint32_t *idx,
                         uint32_t n, uint64_t *bytes)
{
    *bytes = 0;
    if (t->kind != KVT_L2_LOOKUP)
        for (uint32_t j = 0; j < n; j++)
            *bytes += t->bufs[idx[j]].len;
    if (*bytes <= RESP_SPLIT_BYTES || n == 0)
        return 1;
    uint64_t want = (*bytes + RESP_SPLIT_BYTES - 1) / RESP_SPLIT_BYTES;
    return (uint32_t)KVT_MIN(KVT_MIN(want, (uint64_t)e->nworkers), (uint64_t)n);
}

/* Fill jobs[0..nj) with the ranges of b->idx[base..base+n). */
static void fill_jobs(struct resp_batch *b, struct resp_job *jobs, uint32_t nj, uint32_t base,
                      uint32_t n, uint64_t bytes, int node)
{
    const uint32_t *idx = b->idx + base;
    uint64_t per = (bytes + nj - 1) / nj, acc = 0;
    uint32_t lo = 0, k = 0;
    for (uint32_t j = 0; j < n && k + 1 < nj; j++) {
        acc += b->t->bufs[idx[j]].len;
        if (acc >= per * (k + 1)) {
            jobs[k].lo = base + lo;
            jobs[k].hi = base + j + 1;
            lo = j + 1;
            k++;
        }
    }
    for (; k < nj; k++) { /* the rest (and empty tails if keys ran out) */
        jobs[k].lo = base + lo;
        jobs[k].hi = k + 1 == nj ? base + n : base + lo;
    }
    for (uint32_t q = 0; q < nj; q++) {
        jobs[q].b = b;
        jobs[q].node = node;
        jobs[q].job.fn = job_fn;
    }
}

/* Cluster mode: reorder idx (and known with it) so that each node's keys
 * are contiguous; cnt[node] gets their count. A slot the map does not know
 * goes to the first seed, whose MOVED corrects it. */
static void group_by_node(struct resp_engine *e, kvt_l2_task *t, uint32_t *idx, uint32_t *known,
                          uint32_t n, uint32_t *cnt)
{
    uint16_t *nd = kvt_xmalloc(n * sizeof(uint16_t));
    char key[KEY_MAX];
    for (uint32_t j = 0; j < n; j++) {
        int kl = kvt_resp_wire_key(e, &t->keys[idx[j]], key);
        int o = kl > 0 ? kvt_resp_cl_node_of(e, key, (size_t)kl, t->kind == KVT_L2_LOAD) : -1;
        nd[j] = (uint16_t)(o < 0 ? 0 : o);
        cnt[nd[j]]++;
    }
    uint32_t pos[CL_MAX_NODES], at = 0;
    for (int q = 0; q < CL_MAX_NODES; q++) {
        pos[q] = at;
        at += cnt[q];
    }
    uint32_t *i2 = kvt_xmalloc(n * sizeof(uint32_t)), *k2 = NULL;
    if (known)
        k2 = kvt_xmalloc(n * sizeof(uint32_t));
    for (uint32_t j = 0; j < n; j++) {
        uint32_t p = pos[nd[j]]++;
        i2[p] = idx[j];
        if (known)
            k2[p] = known[j];
    }
    memcpy(idx, i2, n * sizeof(uint32_t));
    if (known)
        memcpy(known, k2, n * sizeof(uint32_t));
    free(i2);
    free(k2);
    free(nd);
}

/*
 * Split the keys idx[0..n) into jobs (jobs_for); in cluster mode first by
 * node: each node's keys are pipelined on that node's connection, the
 * nodes in parallel.
 */
static void dispatch(kvt_l2 *l2, struct resp_engine *e, kvt_l2_task *t, uint32_t *idx,
                     uint32_t *known, uint32_t n)
{
    uint32_t cnt[CL_MAX_NODES] = {0};
    uint64_t bytes[CL_MAX_NODES] = {0};
    uint32_t njs[CL_MAX_NODES] = {0};
    int ngroups = 1;
    if (e->cluster) {
        group_by_node(e, t, idx, known, n, cnt);
        ngroups = CL_MAX_NODES;
    } else {
        cnt[0] = n;
    }
    uint32_t nj = 0, base = 0;
    for (int g = 0; g < ngroups; g++) {
        if (cnt[g] || (g == 0 && n == 0))
            njs[g] = jobs_for(e, t, idx + base, cnt[g], &bytes[g]);
        nj += njs[g];
        base += cnt[g];
    }
    struct resp_batch *b = kvt_xcalloc(1, sizeof(*b) + nj * sizeof(struct resp_job));
    b->l2 = l2;
    b->t = t;
    b->idx = idx;
    b->known = known;
    atomic_store(&b->left, nj);
    uint32_t q = 0;
    base = 0;
    for (int g = 0; g < ngroups; g++) {
        if (njs[g])
            fill_jobs(b, b->jobs + q, njs[g], base, cnt[g], bytes[g], g);
        q += njs[g];
        base += cnt[g];
    }
    for (q = 0; q < nj; q++)
        kvt_tpool_push(e->pool, &b->jobs[q].job);
}

void kvt_resp_submit(kvt_l2 *l2, kvt_l2_task *t)
{
    struct resp_engine *e = l2->engine;
    if (!atomic_load(&e->up)) {
        finish_down(l2, t);
        return;
    }
    uint32_t *idx = kvt_xmalloc(t->n * sizeof(uint32_t)), *known = NULL;
    uint32_t n = 0;
    if (t->kind == KVT_L2_LOOKUP) {
        /* every lookup asks the server (one pipelined pass): another kvtier
         * may have removed a key, and a dead server must show up as misses
         * here rather than as failed loads later. Indexed keys need only
         * STRLEN; unknown ones also their header. */
        known = kvt_xcalloc(t->n, sizeof(uint32_t));
        pthread_mutex_lock(&l2->lock);
        for (uint32_t i = 0; i < t->n; i++) {
            kvt_key ck;
            kvt_l2_canon(l2, &t->keys[i], &ck);
            struct kvt_l2_obj *o = kvt_l2_find_locked(l2, &ck);
            if (o && kvt_l2_obj_state(o) != KVT_OBJ_READY)
                continue; /* being written or removed: a miss */
            known[n] = o && (o->flags & F_LEN_KNOWN) ? o->stored : 0;
            idx[n++] = i;
        }
        pthread_mutex_unlock(&l2->lock);
        if (n == 0) {
            free(idx);
            free(known);
            kvt_l2_task_finish(l2, t);
            return;
        }
    } else {
        if (t->kind == KVT_L2_STORE) {
            /* the start-up scan waits for a master that is down: the store
             * would wait for it too (unbounded); it fails at once instead */
            if (atomic_load(&e->scan_blocked)) {
                free(idx);
                finish_down(l2, t);
                return;
            }
            /* the start-up scan is still counting what the server holds */
            if (atomic_load(&e->up) && kvt_l2_park_task(&e->park, t)) {
                free(idx);
                /* the server went down meanwhile: its mark_down may have
                 * taken the parked list before t joined it */
                if (!atomic_load(&e->up))
                    kvt_resp_fail_parked(l2, e, false);
                return;
            }
        }
        for (uint32_t i = 0; i < t->n; i++)
            idx[n++] = i;
    }
    dispatch(l2, e, t, idx, known, n);
}

/* ------------------------------------------------------------ remove */

/* Run a control command on the ctl connection within request_timeout,
 * opening it again once when it broke while idle (in the same deadline). */
static redisReply *ctl_command(kvt_l2 *l2, struct resp_engine *e, int argc, const char **argv,
                               const size_t *argvlen)
{
    char msg[256];
    if (!atomic_load(&e->up))
        return NULL;
    e->ctl.deadline_ns = kvt_now_ns() + e->req_ns;
    for (int attempt = 0; attempt < 2; attempt++) {
        bool reused = e->ctl.c && !e->ctl.c->err && e->ctl.epoch == atomic_load(&e->epoch);
        if (kvt_resp_conn_ensure(e, &e->ctl, msg, sizeof(msg))) {
            kvt_resp_mark_down(l2, e, msg);
            return NULL;
        }
        redisReply *r = NULL;
        if (kvt_resp_conn_arm(e, &e->ctl) == 0)
            r = redisCommandArgv(e->ctl.c, argc, argv, argvlen);
        if (r)
            return r;
        bool late = kvt_resp_past_deadline(&e->ctl);
        snprintf(msg, sizeof(msg), "%s: %s", argv[0],
                 late ? "no answer within request_timeout" : e->ctl.c->errstr);
        kvt_resp_conn_close(&e->ctl);
        if (!reused || late) {
            kvt_resp_mark_down(l2, e, msg);
            return NULL;
        }
    }
    return NULL;
}

redisReply *kvt_resp_ctl_key(kvt_l2 *l2, struct resp_engine *e, const char *key, size_t kl,
                             int argc, const char **argv, const size_t *lens)
{
    pthread_mutex_lock(&e->ctl_lock);
    redisReply *r = e->cluster ? kvt_resp_cl_command(l2, e, key, kl, argc, argv, lens)
                               : ctl_command(l2, e, argc, argv, lens);
    pthread_mutex_unlock(&e->ctl_lock);
    return r;
}

static int resp_remove(kvt_l2 *l2, const struct kvt_l2_obj *o)
{
    struct resp_engine *e = l2->engine;
    if (!atomic_load(&e->up))
        return KVT_E_UNHEALTHY;
    char key[KEY_MAX];
    int kl = kvt_resp_wire_key(e, &o->key, key);
    if (kl < 0)
        return kl;
    const char *argv[2] = {"UNLINK", key};
    size_t lens[2] = {6, (size_t)kl};
    pthread_mutex_lock(&e->ctl_lock);
    redisReply *r = e->cluster ? kvt_resp_cl_command(l2, e, key, (size_t)kl, 2, argv, lens)
                               : ctl_command(l2, e, 2, argv, lens);
    pthread_mutex_unlock(&e->ctl_lock);
    if (!r)
        return -EIO;
    int rc = r->type == REDIS_REPLY_INTEGER ? (r->integer ? 0 : -ENOENT) : -EIO;
    freeReplyObject(r);
    return rc;
}

/* ------------------------------------------------------- status/close */

static void resp_status(kvt_l2 *l2, json_t *out)
{
    struct resp_engine *e = l2->engine;
    json_object_set_new(out, "endpoint", json_string(e->endpoint));
    json_object_set_new(out, "key_prefix", json_string(e->prefix));
    json_object_set_new(out, "database_id", json_integer(e->db));
    json_object_set_new(out, "num_workers", json_integer(e->nworkers));
    json_object_set_new(out, "request_timeout", json_real((double)e->req_ns / 1e9));
    json_object_set_new(out, "connection_timeout", json_real((double)e->conn_ns / 1e9));
    json_object_set_new(out, "connected", json_boolean(atomic_load(&e->up)));
    pthread_mutex_lock(&e->hlock);
    json_object_set_new(out, "server_version", json_string(e->version));
    json_object_set_new(out, "server_run_id", json_string(e->run_id));
    json_object_set_new(out, "last_error", e->last_err[0] ? json_string(e->last_err) : json_null());
    json_object_set_new(out, "last_error_unix",
                        e->last_err[0] ? json_real(e->last_err_unix) : json_null());
    uint64_t now = kvt_now_ns();
    json_object_set_new(out, "down_seconds",
                        json_real(e->down_since_ns ? (double)(now - e->down_since_ns) / 1e9 : 0));
    json_object_set_new(out, "next_retry_seconds",
                        json_real(!atomic_load(&e->up) && e->next_probe_ns > now
                                      ? (double)(e->next_probe_ns - now) / 1e9
                                      : 0));
    json_object_set_new(out, "scan_running", json_boolean(e->scan_running));
    pthread_mutex_unlock(&e->hlock);
    json_object_set_new(out, "parked_stores", json_integer((json_int_t)kvt_l2_parked(&e->park)));
    json_object_set_new(out, "queued_jobs", json_integer((json_int_t)kvt_tpool_queued(e->pool)));
    json_object_set_new(out, "round_trips", json_integer((json_int_t)atomic_load(&e->round_trips)));
    json_object_set_new(out, "disconnects", json_integer((json_int_t)atomic_load(&e->disconnects)));
    json_object_set_new(out, "reconnects", json_integer((json_int_t)atomic_load(&e->reconnects)));
    json_object_set_new(out, "foreign_values", json_integer((json_int_t)atomic_load(&e->foreign)));
    json_object_set_new(out, "swept_after_restart",
                        json_integer((json_int_t)atomic_load(&e->swept)));
    json_object_set_new(out, "command_errors",
                        json_integer((json_int_t)atomic_load(&e->cmd_errors)));
    json_object_set_new(out, "cluster", json_boolean(e->cluster));
    if (e->cluster) {
        pthread_mutex_lock(&e->maplock);
        int masters = e->nmasters, nodes = e->nnodes, replicas = 0, nodes_down = 0;
        for (int i = 0; i < e->nnodes; i++) {
            replicas += e->nh[i].role == ROLE_REPLICA;
            nodes_down += e->nh[i].role != ROLE_NONE && e->nh[i].down_ns != 0;
        }
        pthread_mutex_unlock(&e->maplock);
        json_object_set_new(out, "cluster_masters", json_integer(masters));
        json_object_set_new(out, "cluster_replicas", json_integer(replicas));
        json_object_set_new(out, "cluster_nodes_known", json_integer(nodes));
        json_object_set_new(out, "cluster_masters_down", json_integer(kvt_resp_cl_down_owners(e)));
        json_object_set_new(out, "cluster_nodes_down", json_integer(nodes_down));
        json_object_set_new(out, "cluster_failovers",
                            json_integer((json_int_t)atomic_load(&l2->counters.failovers)));
        json_object_set_new(out, "slot_map_refreshes",
                            json_integer((json_int_t)atomic_load(&e->refreshes)));
        json_object_set_new(out, "moved_redirects",
                            json_integer((json_int_t)atomic_load(&e->moved)));
        json_object_set_new(out, "ask_redirects", json_integer((json_int_t)atomic_load(&e->asked)));
        json_object_set_new(out, "cluster_errors",
                            json_integer((json_int_t)atomic_load(&e->cl_errors)));
        json_object_set_new(out, "read_from_replicas", json_boolean(e->read_replicas));
        if (e->read_replicas) {
            json_object_set_new(out, "replica_loads",
                                json_integer((json_int_t)atomic_load(&e->replica_loads)));
            json_object_set_new(out, "replica_fallbacks",
                                json_integer((json_int_t)atomic_load(&e->replica_fallbacks)));
        }
    }
}

/* Cluster mode: how many masters of the map are down, and the first one's
 * name; 0 when none is. */
static int masters_down(struct resp_engine *e, char *first, size_t cap)
{
    pthread_mutex_lock(&e->maplock);
    int down = 0;
    first[0] = 0;
    for (int i = 0; i < e->nnodes; i++) {
        if (e->nh[i].role != ROLE_MASTER || !e->nh[i].down_ns)
            continue;
        if (!down++)
            snprintf(first, cap, "%s:%d", e->nodes[i].host, e->nodes[i].port);
    }
    pthread_mutex_unlock(&e->maplock);
    return down;
}

/*
 * Healthy while the server answers (standalone) or, in cluster mode, while
 * the slot map is known and one master at least is up: the keys of the
 * masters that are down fail, the others are served (the message names
 * the down ones). Every master down (a stalled or stopped cluster) is
 * unhealthy, as one server down is.
 */
static bool resp_healthy(kvt_l2 *l2, char *msg, size_t cap)
{
    struct resp_engine *e = l2->engine;
    if (atomic_load(&e->up) && e->cluster) {
        char first[300];
        int down = masters_down(e, first, sizeof(first));
        pthread_mutex_lock(&e->maplock);
        int nm = e->nmasters;
        pthread_mutex_unlock(&e->maplock);
        if (down && down >= nm) {
            pthread_mutex_lock(&e->hlock);
            snprintf(msg, cap, "every master of %s is down: %s", e->endpoint,
                     e->last_err[0] ? e->last_err : "unknown error");
            pthread_mutex_unlock(&e->hlock);
            return false;
        }
        if (down)
            snprintf(msg, cap, "ok (%s): %d of %d masters down (%s%s): their keys fail",
                     e->endpoint, down, nm, first, down > 1 ? ", ..." : "");
        else
            snprintf(msg, cap, "ok (%s)", e->endpoint);
        return true;
    }
    if (atomic_load(&e->up)) {
        snprintf(msg, cap, "ok (%s)", e->endpoint);
        return true;
    }
    pthread_mutex_lock(&e->hlock);
    uint64_t now = kvt_now_ns();
    double down = e->down_since_ns ? (double)(now - e->down_since_ns) / 1e9 : 0;
    double next = e->next_probe_ns > now ? (double)(e->next_probe_ns - now) / 1e9 : 0;
    snprintf(msg, cap, "not connected to %s for %.1f s: %s (next retry in %.1f s)", e->endpoint,
             down, e->last_err[0] ? e->last_err : "unknown error", next);
    pthread_mutex_unlock(&e->hlock);
    return false;
}

/* Cluster mode: UNLINK every indexed key on its node, one at a time. */
static void cl_delete_all_indexed(kvt_l2 *l2, struct resp_engine *e)
{
    uint64_t removed = 0;
    uint32_t n = 0;
    kvt_key *keys = kvt_l2_index_keys(l2, &n);
    pthread_mutex_lock(&e->ctl_lock);
    for (uint32_t i = 0; i < n; i++) {
        char key[KEY_MAX];
        int kl = kvt_resp_wire_key(e, &keys[i], key);
        const char *argv[2] = {"UNLINK", key};
        size_t lens[2] = {6, (size_t)kl};
        redisReply *r = kl > 0 ? kvt_resp_cl_command(l2, e, key, (size_t)kl, 2, argv, lens) : NULL;
        if (r && r->type == REDIS_REPLY_INTEGER)
            removed += (uint64_t)r->integer;
        if (r)
            freeReplyObject(r);
    }
    pthread_mutex_unlock(&e->ctl_lock);
    free(keys);
    kvt_info("%s: persist_enabled is false: removed %llu keys from the cluster", l2->name,
             (unsigned long long)removed);
}

struct unlink_all {
    struct resp_engine *e;
    uint64_t sent;
};

/* Pipeline an UNLINK of o's key on the control connection. */
static bool unlink_visit(const struct kvt_l2_obj *o, void *arg)
{
    struct unlink_all *u = arg;
    char key[KEY_MAX];
    int kl = kvt_resp_wire_key(u->e, &o->key, key);
    if (kl > 0 && redisAppendCommand(u->e->ctl.c, "UNLINK %b", key, (size_t)kl) == REDIS_OK)
        u->sent++;
    return true;
}

/* persist_enabled false: remove every indexed key from the server. */
static void delete_all_indexed(kvt_l2 *l2, struct resp_engine *e)
{
    char msg[256];
    if (e->cluster) {
        cl_delete_all_indexed(l2, e);
        return;
    }
    e->ctl.deadline_ns = 0; /* one pipeline of every key: the socket timeouts apply */
    if (!atomic_load(&e->up) || kvt_resp_conn_ensure(e, &e->ctl, msg, sizeof(msg))) {
        kvt_warn("%s: persist_enabled is false but the server is unreachable: keys stay", l2->name);
        return;
    }
    struct unlink_all u = {e, 0};
    uint32_t cursor = 0;
    kvt_l2_index_scan(l2, &cursor, unlink_visit, &u); /* one lock hold: the whole index */
    uint64_t sent = u.sent, removed = 0;
    for (uint64_t i = 0; i < sent; i++) {
        redisReply *r = NULL;
        if (redisGetReply(e->ctl.c, (void **)&r) != REDIS_OK)
            break;
        if (r->type == REDIS_REPLY_INTEGER)
            removed += (uint64_t)r->integer;
        freeReplyObject(r);
    }
    kvt_info("%s: persist_enabled is false: removed %llu keys", l2->name,
             (unsigned long long)removed);
}

/* the monitor waits on hcond: stop is set under its lock (not an atomic) */
static void resp_stop(kvt_l2 *l2)
{
    struct resp_engine *e = l2->engine;
    pthread_mutex_lock(&e->hlock);
    e->stop = true;
    pthread_cond_broadcast(&e->hcond);
    pthread_mutex_unlock(&e->hlock);
}

/* parked tasks fail (the server is down or closing), not resumed */
static void resp_release(kvt_l2 *l2)
{
    kvt_resp_fail_parked(l2, l2->engine, true);
}

static void resp_close(kvt_l2 *l2)
{
    struct resp_engine *e = l2->engine;
    /* the pool runs what is queued */
    kvt_l2_life_stop(l2, &(struct kvt_l2_life){.stop_fn = resp_stop,
                                               .thread = &e->mon,
                                               .thread_started = &e->mon_started,
                                               .release_fn = resp_release,
                                               .pools = {e->pool}});
    if (!l2->persist_enabled)
        delete_all_indexed(l2, e);
    kvt_l2_budget_detach(l2); /* its record steps use the control connection */
    kvt_resp_conn_close(&e->ctl);
    kvt_resp_cl_close(e);
    free(e->ctl.rbuf);
    free(e->ctl.obuf);
    pthread_mutex_destroy(&e->maplock);
    pthread_mutex_destroy(&e->hlock);
    pthread_cond_destroy(&e->hcond);
    kvt_l2_park_destroy(&e->park);
    pthread_mutex_destroy(&e->ctl_lock);
    free(e);
    l2->engine = NULL;
}

static const struct kvt_l2_ops resp_ops = {
    .submit = kvt_resp_submit,
    .remove = resp_remove,
    .status = resp_status,
    .healthy = resp_healthy,
    .nodes = kvt_resp_nodes,
    .close = resp_close,
};

/* ---------------------------------------------------------- creation */

static struct timeval tv_of(double s)
{
    struct timeval tv;
    tv.tv_sec = (time_t)s;
    tv.tv_usec = (suseconds_t)((s - (double)tv.tv_sec) * 1e6);
    return tv;
}

static int resp_open(kvt_l2 *l2, const struct kvt_l2_spec *spec, const void *opts, char *err,
                     size_t errcap)
{
    const struct kvt_resp_opts *o = opts;
    int rc =
        kvt_l2_life_init(l2, &resp_ops, spec, KVT_CODEC_OBJ, o->max_capacity_bytes, err, errcap);
    if (rc)
        return rc;
    struct resp_engine *e = kvt_xcalloc(1, sizeof(*e));
    pthread_mutex_init(&e->hlock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&e->hcond, &ca);
    pthread_condattr_destroy(&ca);
    kvt_l2_park_init(&e->park);
    pthread_mutex_init(&e->ctl_lock, NULL);
    pthread_mutex_init(&e->maplock, NULL);
    e->cluster = o->cluster;
    e->read_replicas = o->read_replicas;
    for (unsigned s = 0; s < CL_SLOTS; s++)
        e->slots[s] = CL_NO_NODE;
    for (int i = 0; i < CL_MAX_NODES; i++)
        e->replica_of[i] = e->master_of[i] = CL_NO_NODE;
    for (int i = 0; i < o->nseeds && e->cluster; i++)
        kvt_resp_cl_node_add(e, o->seed_host[i], o->seed_port[i]);
    e->nseeds = e->nnodes;
    for (int i = 0; i < CL_MAX_NODES; i++)
        e->ctl_nodes[i].node = i;
    const char *host = o->host;
    if (strncmp(host, "unix://", 7) == 0) {
        host += 7;
        e->unix_sock = true;
    } else if (host[0] == '/') {
        e->unix_sock = true;
    }
    snprintf(e->host, sizeof(e->host), "%s", host);
    e->port = o->port;
    if (e->unix_sock)
        snprintf(e->endpoint, sizeof(e->endpoint), "unix:%s", e->host);
    else if (e->cluster && e->nseeds > 1)
        snprintf(e->endpoint, sizeof(e->endpoint), "cluster %s:%d (+%d seeds)", e->host, e->port,
                 e->nseeds - 1);
    else if (e->cluster)
        snprintf(e->endpoint, sizeof(e->endpoint), "cluster %s:%d", e->host, e->port);
    else
        snprintf(e->endpoint, sizeof(e->endpoint), "%s:%d", e->host, e->port);
    /* LMCache's environment overrides for credentials (never in the config) */
    const char *eu = getenv("LMCACHE_RESP_USERNAME"), *ep = getenv("LMCACHE_RESP_PASSWORD");
    snprintf(e->user, sizeof(e->user), "%s", eu && *eu ? eu : o->username);
    snprintf(e->pass, sizeof(e->pass), "%s", ep && *ep ? ep : o->password);
    snprintf(e->prefix, sizeof(e->prefix), "%s", o->key_prefix);
    e->prefix_len = strlen(e->prefix);
    e->db = o->database_id;
    e->nworkers = o->num_workers;
    e->conn_tv = tv_of(o->connection_timeout);
    e->req_tv = tv_of(o->request_timeout);
    e->conn_ns = (uint64_t)(o->connection_timeout * 1e9);
    e->req_ns = (uint64_t)(o->request_timeout * 1e9);
    e->probe_ns = KVT_MIN(e->req_ns, PROBE_MAX_NS);
    e->last_err_node = -1;
    e->ctl.rbuf = kvt_xmalloc(RBUF_CAP);
    e->ctl.obuf = kvt_xmalloc(OBUF_CAP);
    atomic_store(&e->gen, 1);
    e->backoff_ns = BACKOFF_MIN_NS;
    e->scan_needed = true;
    e->park.parking = l2->cap_bytes > 0;
    l2->engine = e;
    l2->recovering = true;
    /* "shared_budget": a hash on the server; no I/O yet (the server may be
     * down): the start-up scan's recount is the first step */
    if (spec->shared_budget && (rc = kvt_resp_budget_attach(l2, e, err, errcap)))
        goto fail;
    if (o->nnodes > 1 && !e->cluster)
        kvt_warn("%s: startup_nodes lists %d servers; standalone mode uses the first (%s)",
                 l2->name, o->nnodes, e->endpoint);

    /* first connection now, so a reachable server is usable from the first
     * request; an unreachable one is retried in the background */
    struct conn probe_conn = {0};
    if (kvt_resp_probe(l2, e, &probe_conn) != 0) {
        e->down_since_ns = kvt_now_ns();
        e->next_probe_ns = e->down_since_ns + e->backoff_ns;
        kvt_warn("%s: %s is not reachable (%s): starting unhealthy, lookups miss and "
                 "stores fail until it is; retrying with backoff",
                 l2->name, e->endpoint, e->last_err);
    }
    kvt_resp_conn_close(&probe_conn);

    rc = kvt_tpool_create(&e->pool, "resp", e->nworkers, kvt_resp_worker_new, kvt_resp_worker_free,
                          e);
    if (rc) {
        snprintf(err, errcap, "cannot start I/O threads: %s", kvt_strerror(rc));
        goto fail;
    }
    rc = pthread_create(&e->mon, NULL, kvt_resp_monitor_main, l2);
    if (rc) {
        snprintf(err, errcap, "cannot start the monitor thread: %s", kvt_strerror(-rc));
        rc = -rc;
        goto fail;
    }
    e->mon_started = true;
    return 0;
fail:
    if (e->pool)
        kvt_tpool_destroy(e->pool);
    kvt_l2_budget_detach(l2);
    pthread_mutex_destroy(&e->maplock);
    free(e->ctl.rbuf);
    free(e->ctl.obuf);
    free(e);
    l2->engine = NULL;
    kvt_l2_base_destroy(l2);
    return rc;
}

/* "shared_budget": the record is a hash on the server (resp_budget.c) */
static int resp_shared_budget(struct kvt_cfg *c, const void *opts)
{
    (void)c, (void)opts;
    return 0;
}

const struct kvt_l2_adapter_desc kvt_l2_resp_desc = {
    .name = "resp",
    .opts_size = sizeof(struct kvt_resp_opts),
    .parse = kvt_resp_parse_resp,
    .open = resp_open,
    .shared_budget = resp_shared_budget,
    .budget_max_interval_ms = KVT_L2_BUDGET_LEASE_MS / 3,
};

/* valkey: resp with Valkey's defaults */
const struct kvt_l2_adapter_desc kvt_l2_valkey_desc = {
    .name = "valkey",
    .opts_size = sizeof(struct kvt_resp_opts),
    .parse = kvt_resp_parse_valkey,
    .open = resp_open,
    .shared_budget = resp_shared_budget,
    .budget_max_interval_ms = KVT_L2_BUDGET_LEASE_MS / 3,
};
