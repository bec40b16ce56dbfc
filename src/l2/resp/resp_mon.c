/*
 * resp adapter: health, reconnects with backoff, start-up scan and the
 * reconcile after a server restart (see resp.c). One monitor thread, which
 * does all of it off the request path:
 *   - the server down (standalone), or no node answering CLUSTER SLOTS:
 *     probes with backoff (0.1 s doubling to BACKOFF_MAX_NS);
 *   - cluster mode: each node marked down is probed on its own (INFO
 *     server within a probe's deadline, the same backoff); an answer
 *     brings it back (kvt_resp_cl_mark_up);
 *   - every CHECK_EVERY_NS, one INFO server to every node that is up (and
 *     a slot map read in cluster mode): a node that stopped answering
 *     while idle is marked down, and a server or master whose run_id
 *     changed (it restarted, and may have lost its data) is reconciled;
 *   - the slot map when a request asked for it; the scans.
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
    double wall = kvt_resp_wall_now();
    pthread_mutex_lock(&e->hlock);
    vsnprintf(e->last_err, sizeof(e->last_err), fmt, ap);
    e->last_err_unix = wall;
    e->last_err_node = -1;
    pthread_mutex_unlock(&e->hlock);
    va_end(ap);
}

/*
 * A transport error: the server is unreachable, did not answer before the
 * request's deadline, or the connection broke and a fresh one failed too.
 * Lookups miss and stores fail from now on, until the monitor thread's
 * probe gets an answer. In cluster mode: no node answers CLUSTER SLOTS.
 */
void kvt_resp_mark_down(kvt_l2 *l2, struct resp_engine *e, const char *why)
{
    bool was_up = atomic_exchange(&e->up, false);
    atomic_fetch_add(&e->epoch, 1);
    double wall = kvt_resp_wall_now();
    pthread_mutex_lock(&e->hlock);
    snprintf(e->last_err, sizeof(e->last_err), "%s", why);
    e->last_err_unix = wall;
    e->last_err_node = -1;
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
                 "(probing with backoff)",
                 l2->name, e->endpoint, why);
        kvt_resp_fail_parked(l2, e, false);
    }
}

/* Clear the adapter's last_error when it was about node, which answers
 * again (or, node -1, about the adapter, which is back). */
static void clear_err_of(struct resp_engine *e, int node)
{
    pthread_mutex_lock(&e->hlock);
    if (e->last_err_node == node || node < 0) {
        e->last_err[0] = 0;
        e->last_err_node = -1;
    }
    pthread_mutex_unlock(&e->hlock);
}

/* Cluster mode: the adapter's last_error named a node that is neither
 * down nor in the map any more (a failed master whose replica took over):
 * clear it. */
static void clear_err_if_gone(struct resp_engine *e)
{
    pthread_mutex_lock(&e->hlock);
    int node = e->last_err_node;
    pthread_mutex_unlock(&e->hlock);
    if (node < 0)
        return;
    pthread_mutex_lock(&e->maplock);
    bool settled = !e->nh[node].down_ns || e->nh[node].role == ROLE_NONE;
    pthread_mutex_unlock(&e->maplock);
    if (settled)
        clear_err_of(e, node);
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

/* INFO server on cn within its deadline: run_id and version. 0, or -EIO
 * with the reason in msg. */
static int info_server(struct resp_engine *e, struct conn *cn, char *run_id, size_t rcap, char *ver,
                       size_t vcap, char *msg, size_t cap)
{
    redisReply *r = NULL;
    if (kvt_resp_conn_arm(e, cn) == 0)
        r = redisCommand(cn->c, "INFO server");
    if (!r || r->type != REDIS_REPLY_STRING) {
        snprintf(msg, cap, "INFO: %s",
                 r && r->type == REDIS_REPLY_ERROR ? r->str
                 : kvt_resp_past_deadline(cn)      ? "no answer before the probe's deadline"
                                                   : cn->c->errstr);
        if (r)
            freeReplyObject(r);
        return -EIO;
    }
    info_field(r->str, "run_id", run_id, rcap);
    if (ver) {
        info_field(r->str, "valkey_version", ver, vcap);
        if (!ver[0])
            info_field(r->str, "redis_version", ver, vcap);
    }
    freeReplyObject(r);
    return 0;
}

/* Ask the next scan to reconcile: every key (node -1, standalone) or the
 * keys of one master (cluster mode). */
static void want_reconcile(struct resp_engine *e, int node)
{
    pthread_mutex_lock(&e->hlock);
    if (node >= 0)
        e->recon[node] = true;
    e->scan_needed = true;
    e->sweep_after_scan = true;
    pthread_cond_broadcast(&e->hcond);
    pthread_mutex_unlock(&e->hlock);
}

/*
 * Probe: connect, authenticate, INFO server, within a probe's deadline
 * (min(request_timeout, PROBE_MAX_NS): a stalled server costs the monitor
 * that long, never a request). On success the adapter is up; a changed
 * run_id means the server restarted: reconcile with a new scan. Cluster
 * mode: the slot map from the first node that answers; each node's own
 * restart is found by its own probe (kvt_resp_cl_mark_up).
 */
int kvt_resp_probe(kvt_l2 *l2, struct resp_engine *e, struct conn *mon)
{
    char msg[256];
    pthread_mutex_lock(&e->hlock);
    e->probing = true;
    pthread_mutex_unlock(&e->hlock);
    mon->deadline_ns = kvt_now_ns() + e->probe_ns;
    int rc = e->cluster ? kvt_resp_cl_refresh(l2, e, mon, msg, sizeof(msg))
                        : kvt_resp_conn_open(e, mon, msg, sizeof(msg));
    char run_id[48] = "", ver[32] = "";
    if (!rc) {
        mon->deadline_ns = kvt_now_ns() + e->probe_ns;
        rc = info_server(e, mon, run_id, sizeof(run_id), ver, sizeof(ver), msg, sizeof(msg));
    }
    uint64_t now = kvt_now_ns();
    pthread_mutex_lock(&e->hlock);
    e->probing = false;
    if (rc) {
        snprintf(e->last_err, sizeof(e->last_err), "%s", msg);
        e->last_err_unix = kvt_resp_wall_now();
        e->last_err_node = -1;
        e->backoff_ns = KVT_MIN(e->backoff_ns * 2, BACKOFF_MAX_NS);
        e->next_probe_ns = now + e->backoff_ns;
        pthread_mutex_unlock(&e->hlock);
        kvt_resp_conn_close(mon);
        return rc;
    }
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
    e->last_err_node = -1;
    e->backoff_ns = BACKOFF_MIN_NS;
    e->down_since_ns = 0;
    e->next_check_ns = now + CHECK_EVERY_NS;
    atomic_store(&e->up, true);
    pthread_mutex_unlock(&e->hlock);
    if (was_down) {
        atomic_fetch_add(&e->reconnects, 1);
        kvt_info("%s: reconnected to %s after %.1f s%s", l2->name, e->endpoint, down_s,
                 restarted ? " (server restarted: reconciling the index)" : "");
    }
    return 0;
}

/* ------------------------------------------------------ cluster nodes */

/*
 * Cluster mode: node answered a probe with run_id. Mark it up (its keys
 * are served again), clear its error and the adapter's when it named the
 * node, and when it is a master whose run_id changed (it restarted and may
 * have lost its data) reconcile its keys. A first run_id seen is only
 * remembered.
 */
static void cl_mark_up(kvt_l2 *l2, struct resp_engine *e, int node, const char *run_id)
{
    uint64_t now = kvt_now_ns();
    pthread_mutex_lock(&e->maplock);
    struct cl_health *h = &e->nh[node];
    bool was_down = h->down_ns != 0;
    double down_s = was_down ? (double)(now - h->down_ns) / 1e9 : 0;
    bool restarted = h->run_id[0] && strcmp(h->run_id, run_id) != 0;
    bool master = h->role == ROLE_MASTER;
    snprintf(h->run_id, sizeof(h->run_id), "%s", run_id);
    h->down_ns = 0;
    h->probing = false;
    h->backoff_ns = BACKOFF_MIN_NS;
    h->err[0] = 0;
    h->err_unix = 0;
    char name[300];
    snprintf(name, sizeof(name), "%s:%d", e->nodes[node].host, e->nodes[node].port);
    int role = h->role;
    pthread_mutex_unlock(&e->maplock);
    if (was_down) {
        clear_err_of(e, node);
        kvt_resp_cl_want_refresh(e); /* the map may have changed meanwhile */
        kvt_info("%s: cluster node %s (%s) answers again after %.1f s%s", l2->name, name,
                 kvt_resp_role_name(role), down_s,
                 restarted && master ? " (restarted: reconciling its keys)" : "");
    } else if (restarted && master) {
        kvt_info("%s: cluster node %s (master) restarted: reconciling its keys", l2->name, name);
    }
    if (restarted && master)
        want_reconcile(e, node);
}

/* Cluster mode: probe node (marked down) with INFO server on its own
 * monitor connection, within a probe's deadline. */
static void cl_probe_node(kvt_l2 *l2, struct resp_engine *e, struct conn *cn, int node)
{
    char msg[256], run_id[48] = "";
    cn->node = node;
    cn->deadline_ns = kvt_now_ns() + e->probe_ns;
    int rc = kvt_resp_conn_ensure(e, cn, msg, sizeof(msg));
    if (!rc)
        rc = info_server(e, cn, run_id, sizeof(run_id), NULL, 0, msg, sizeof(msg));
    if (!rc) {
        cl_mark_up(l2, e, node, run_id);
        return;
    }
    kvt_resp_conn_close(cn);
    uint64_t now = kvt_now_ns();
    pthread_mutex_lock(&e->maplock);
    struct cl_health *h = &e->nh[node];
    h->probing = false;
    h->backoff_ns = KVT_MIN(KVT_MAX(h->backoff_ns, BACKOFF_MIN_NS) * 2, BACKOFF_MAX_NS);
    h->next_probe_ns = now + h->backoff_ns;
    if (h->down_ns) {
        snprintf(h->err, sizeof(h->err), "%.*s", (int)sizeof(h->err) - 1, msg);
        h->err_unix = kvt_resp_wall_now();
    }
    pthread_mutex_unlock(&e->maplock);
}

/* Cluster mode: the node in the map whose probe is due first (-1: none is
 * down); *next gets when. Marks the due one probing. call with hlock held
 * (maplock, a leaf, is taken inside) */
static int due_node_locked(struct resp_engine *e, uint64_t now, uint64_t *next)
{
    int due = -1;
    *next = UINT64_MAX;
    pthread_mutex_lock(&e->maplock);
    for (int i = 0; i < e->nnodes; i++) {
        struct cl_health *h = &e->nh[i];
        if (!h->down_ns || h->role == ROLE_NONE)
            continue;
        if (h->next_probe_ns <= now && due < 0) {
            due = i;
            h->probing = true;
        }
        *next = KVT_MIN(*next, h->next_probe_ns);
    }
    pthread_mutex_unlock(&e->maplock);
    return due;
}

/* Cluster mode: is a master the next scan must walk down? call with hlock
 * held (maplock inside) */
static bool scan_targets_down_locked(struct resp_engine *e)
{
    bool any_mask = false, down = false;
    for (int i = 0; i < CL_MAX_NODES; i++)
        any_mask |= e->recon[i];
    pthread_mutex_lock(&e->maplock);
    for (int i = 0; i < e->nnodes; i++)
        if (e->nh[i].role == ROLE_MASTER && e->nh[i].down_ns && (!any_mask || e->recon[i]))
            down = true;
    pthread_mutex_unlock(&e->maplock);
    return down;
}

/*
 * The monitor's round over the nodes that are up, every CHECK_EVERY_NS:
 * one INFO server each within a probe's deadline (cluster mode: after a
 * read of the slot map). A node that stalled while no request went to it
 * is found here; a run_id that changed is a restart to reconcile.
 */
static void check_round(kvt_l2 *l2, struct resp_engine *e, struct conn *mon, struct conn *nconn)
{
    char msg[256], run_id[48] = "", ver[32] = "";
    pthread_mutex_lock(&e->hlock);
    e->next_check_ns = kvt_now_ns() + CHECK_EVERY_NS;
    pthread_mutex_unlock(&e->hlock);
    if (!e->cluster) {
        mon->deadline_ns = kvt_now_ns() + e->probe_ns;
        int rc = kvt_resp_conn_ensure(e, mon, msg, sizeof(msg));
        if (!rc)
            rc = info_server(e, mon, run_id, sizeof(run_id), ver, sizeof(ver), msg, sizeof(msg));
        if (rc) {
            kvt_resp_conn_close(mon);
            kvt_resp_mark_down(l2, e, msg);
            return;
        }
        pthread_mutex_lock(&e->hlock);
        bool restarted = e->run_id[0] && strcmp(run_id, e->run_id) != 0;
        snprintf(e->run_id, sizeof(e->run_id), "%s", run_id);
        snprintf(e->version, sizeof(e->version), "%s", ver);
        pthread_mutex_unlock(&e->hlock);
        if (restarted) {
            kvt_info("%s: %s restarted (a new run_id): reconciling the index", l2->name,
                     e->endpoint);
            want_reconcile(e, -1);
        }
        return;
    }
    if (kvt_resp_cl_refresh(l2, e, mon, msg, sizeof(msg))) {
        kvt_resp_mark_down(l2, e, msg);
        return;
    }
    clear_err_if_gone(e);
    for (int i = 0; i < CL_MAX_NODES; i++) {
        pthread_mutex_lock(&e->maplock);
        bool ask = i < e->nnodes && e->nh[i].role != ROLE_NONE && !e->nh[i].down_ns;
        pthread_mutex_unlock(&e->maplock);
        if (!ask)
            continue;
        struct conn *cn = &nconn[i];
        cn->node = i;
        cn->deadline_ns = kvt_now_ns() + e->probe_ns;
        int rc = kvt_resp_conn_ensure(e, cn, msg, sizeof(msg));
        if (!rc)
            rc = info_server(e, cn, run_id, sizeof(run_id), NULL, 0, msg, sizeof(msg));
        if (rc) {
            kvt_resp_conn_close(cn);
            kvt_resp_cl_mark_down(l2, e, i, msg);
            continue;
        }
        cl_mark_up(l2, e, i, run_id);
    }
}

/* ------------------------------------------------------------- nodes */

int kvt_resp_nodes(kvt_l2 *l2, struct kvt_l2_node *out, int max)
{
    struct resp_engine *e = l2->engine;
    uint64_t now = kvt_now_ns();
    if (!e->cluster) {
        if (max < 1)
            return 1;
        struct kvt_l2_node *d = &out[0];
        memset(d, 0, sizeof(*d));
        snprintf(d->name, sizeof(d->name), "%.*s", (int)sizeof(d->name) - 1, e->endpoint);
        snprintf(d->role, sizeof(d->role), "server");
        bool up = atomic_load(&e->up);
        pthread_mutex_lock(&e->hlock);
        d->state = up ? KVT_NODE_UP : e->probing ? KVT_NODE_PROBING : KVT_NODE_DOWN;
        d->down_seconds = !up && e->down_since_ns ? (double)(now - e->down_since_ns) / 1e9 : 0;
        snprintf(d->last_error, sizeof(d->last_error), "%.*s", (int)sizeof(d->last_error) - 1,
                 e->last_err);
        d->last_error_unix = e->last_err[0] ? e->last_err_unix : 0;
        pthread_mutex_unlock(&e->hlock);
        d->downs = atomic_load(&e->disconnects);
        return 1;
    }
    /* masters first, then replicas, each in the node table's order */
    int n = 0;
    pthread_mutex_lock(&e->maplock);
    for (int role = ROLE_MASTER; role <= ROLE_REPLICA; role++) {
        for (int i = 0; i < e->nnodes; i++) {
            const struct cl_health *h = &e->nh[i];
            if (h->role != role)
                continue;
            if (n < max) {
                struct kvt_l2_node *d = &out[n];
                memset(d, 0, sizeof(*d));
                snprintf(d->name, sizeof(d->name), "%.256s:%d", e->nodes[i].host, e->nodes[i].port);
                snprintf(d->role, sizeof(d->role), "%s", kvt_resp_role_name(role));
                d->state = !h->down_ns  ? KVT_NODE_UP
                           : h->probing ? KVT_NODE_PROBING
                                        : KVT_NODE_DOWN;
                d->downs = h->downs;
                d->down_seconds = h->down_ns ? (double)(now - h->down_ns) / 1e9 : 0;
                snprintf(d->last_error, sizeof(d->last_error), "%s", h->err);
                d->last_error_unix = h->err[0] ? h->err_unix : 0;
            }
            n++;
        }
    }
    pthread_mutex_unlock(&e->maplock);
    return n;
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

/* Cluster mode: keep only the keys whose slot a node in mask owns. */
static uint32_t keep_masked(struct resp_engine *e, kvt_key *keys, uint32_t n, const bool *mask)
{
    uint32_t k = 0;
    char wk[KEY_MAX];
    for (uint32_t i = 0; i < n; i++) {
        int kl = kvt_resp_wire_key(e, &keys[i], wk);
        int node = kl > 0 ? kvt_resp_cl_node_of(e, wk, (size_t)kl, false) : -1;
        if (node >= 0 && mask[node])
            keys[k++] = keys[i];
    }
    return k;
}

struct unseen {
    unsigned gen;
    uint32_t n;
    kvt_key keys[512];
};

/* Collect a READY, unpinned entry the last scan did not see; false once
 * the batch is full. */
static bool unseen_visit(const struct kvt_l2_obj *o, void *arg)
{
    struct unseen *u = arg;
    if (kvt_l2_obj_state(o) == KVT_OBJ_READY && o->pins == 0 && (o->flags & F_GEN) != u->gen)
        u->keys[u->n++] = o->key;
    return u->n < KVT_ARRAY_LEN(u->keys);
}

/* Drop READY, unpinned entries the last scan did not see (gen differs);
 * with mask (cluster mode), only those whose slot a node in mask owns. */
static uint64_t sweep_unseen(kvt_l2 *l2, struct resp_engine *e, unsigned gen, const bool *mask)
{
    uint64_t total = 0;
    uint32_t cursor = 0;
    struct unseen u = {.gen = gen};
    for (;;) {
        u.n = 0;
        bool end = kvt_l2_index_scan(l2, &cursor, unseen_visit, &u);
        uint32_t n = u.n;
        if (mask)
            n = keep_masked(e, u.keys, n, mask);
        if (n)
            total += kvt_l2_drop_gone(l2, u.keys, n);
        if (end)
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
        /* each page is one request: request_timeout */
        mon->deadline_ns = kvt_now_ns() + e->req_ns;
        redisReply *r =
            kvt_resp_conn_arm(e, mon)
                ? NULL
                : redisCommand(mon->c, "SCAN %s MATCH %b COUNT 1000", cursor, pattern, pl);
        if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
            r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_ARRAY) {
            snprintf(msg, cap, "SCAN: %s",
                     r && r->type == REDIS_REPLY_ERROR ? r->str
                     : kvt_resp_past_deadline(mon)     ? "no answer before the deadline"
                                                       : mon->c->errstr);
            if (r)
                freeReplyObject(r);
            rc = -EIO;
            break;
        }
        snprintf(cursor, sizeof(cursor), "%s", r->element[0]->str);
        mon->deadline_ns = kvt_now_ns() + e->req_ns;
        if (kvt_resp_conn_arm(e, mon) == 0)
            rc = scan_page(l2, e, mon, r->element[1], gen, objs, bytes, walked);
        else
            rc = -EIO;
        if (rc)
            snprintf(msg, cap, "SCAN: %s", mon->c->errstr[0] ? mon->c->errstr : "connection lost");
        freeReplyObject(r);
    } while (!rc && strcmp(cursor, "0") != 0);
    return rc;
}

/* Cluster mode: remember master's run_id before its SCAN when none is
 * known yet, or when the scan reconciles it (the scan sees what this run
 * of the node holds). Another node's restart is left to its own probe. */
static void scan_baseline(struct resp_engine *e, struct conn *mon, int node, bool reconciling)
{
    char run_id[48] = "", msg[256];
    mon->deadline_ns = kvt_now_ns() + e->probe_ns;
    if (info_server(e, mon, run_id, sizeof(run_id), NULL, 0, msg, sizeof(msg)) || !run_id[0])
        return;
    pthread_mutex_lock(&e->maplock);
    if (reconciling || !e->nh[node].run_id[0])
        snprintf(e->nh[node].run_id, sizeof(e->nh[node].run_id), "%s", run_id);
    pthread_mutex_unlock(&e->maplock);
}

/*
 * SCAN the prefix: restore accounting (first scan) or reconcile it (after a
 * server restart: sweep drops what the scan did not find). Cluster mode:
 * every master in turn, or with mask only the masters in it (the ones that
 * restarted), and the sweep then drops only keys of their slots. Runs on
 * the monitor thread with its own connection, while the workers serve.
 */
static int scan_all(kvt_l2 *l2, struct resp_engine *e, struct conn *mon, bool sweep,
                    const bool *mask, char *msg, size_t cap)
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
    /* a scan of the whole prefix is the shared budget's recount (a reshard
     * meanwhile may move keys past it: then no recount) */
    if (!mask)
        kvt_l2_budget_recount_begin(l2, NULL, 0);
    uint64_t topo = atomic_load(&e->moved) + atomic_load(&e->asked) + atomic_load(&e->refreshes);
    int rc = 0, failed = -1;
    if (!e->cluster) {
        rc = scan_conn(l2, e, mon, pattern, pl, gen, &objs, &bytes, &walked, msg, cap);
    } else {
        /* every master holds its slots' keys: SCAN each one in turn */
        int masters[CL_MAX_NODES];
        int nm = kvt_resp_cl_masters(e, masters, CL_MAX_NODES);
        for (int m = 0; m < nm && !rc; m++) {
            if (mask && !mask[masters[m]])
                continue;
            mon->node = masters[m];
            mon->deadline_ns = kvt_now_ns() + e->req_ns;
            rc = kvt_resp_conn_open(e, mon, msg, cap) ? -EIO : 0;
            if (!rc) {
                scan_baseline(e, mon, masters[m], mask != NULL);
                rc = scan_conn(l2, e, mon, pattern, pl, gen, &objs, &bytes, &walked, msg, cap);
            }
            if (rc == -EIO)
                failed = masters[m];
        }
    }
    bool same_topo =
        topo == atomic_load(&e->moved) + atomic_load(&e->asked) + atomic_load(&e->refreshes);
    if (!mask)
        kvt_l2_budget_recount_end(l2, walked, rc == 0 && same_topo);
    if (rc) {
        kvt_resp_conn_close(mon);
        if (failed >= 0) /* that master, not the adapter: the others serve */
            kvt_resp_cl_mark_down(l2, e, failed, msg);
        return failed >= 0 ? -EAGAIN : rc;
    }
    if (sweep && e->cluster && !same_topo) {
        /* keys moved between masters while they were walked: one may have
         * been missed; walk again rather than drop it */
        snprintf(msg, cap, "the slot map changed during the scan");
        return -EAGAIN;
    }
    uint64_t swept = sweep ? sweep_unseen(l2, e, gen, mask) : 0;
    atomic_fetch_add(&e->swept, swept);
    double secs = (double)(kvt_now_ns() - t0) / 1e9;
    pthread_mutex_lock(&l2->lock);
    l2->recovered_objs += objs;
    l2->recovered_bytes += bytes;
    l2->recovery_seconds = secs;
    l2->recovering = false;
    pthread_mutex_unlock(&l2->lock);
    if (sweep)
        kvt_info("%s: reconciled with the restarted %s in %.3f s: %llu objects found, "
                 "%llu no longer there dropped",
                 l2->name, mask ? "master(s)" : "server", secs, (unsigned long long)objs,
                 (unsigned long long)swept);
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

/* What the monitor does next (one at a time, in this order of priority). */
enum mon_act {
    A_STOP,
    A_PROBE,   /* the adapter is down: probe it */
    A_NODE,    /* cluster: a node marked down is due for its probe */
    A_REFRESH, /* cluster: read the slot map again (asked for) */
    A_BLOCKED, /* the start-up scan waits for a master that is down */
    A_SCAN,
    A_CHECK, /* the round over the nodes that are up */
};

/* Timed wait on hcond until the monotonic time until (UINT64_MAX: no
 * limit). call with hlock held */
static void wait_until_locked(struct resp_engine *e, uint64_t now, uint64_t until)
{
    if (until == UINT64_MAX) {
        pthread_cond_wait(&e->hcond, &e->hlock);
        return;
    }
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t d = until > now ? until - now : 0;
    ts.tv_sec += (time_t)(d / 1000000000ull);
    ts.tv_nsec += (long)(d % 1000000000ull);
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&e->hcond, &e->hlock, &ts);
}

/* The next action, waiting until one is due. *node: A_NODE's node; *sweep
 * and mask (*masked: any set): A_SCAN's. call with hlock held */
static enum mon_act next_act_locked(struct resp_engine *e, int *node, bool *sweep, bool *mask,
                                    bool *masked)
{
    while (!e->stop) {
        bool up = atomic_load(&e->up);
        uint64_t now = kvt_now_ns(), until = UINT64_MAX;
        if (!up) {
            if (now >= e->next_probe_ns)
                return A_PROBE;
            until = e->next_probe_ns;
        }
        if (e->cluster) {
            uint64_t next;
            *node = due_node_locked(e, now, &next);
            if (*node >= 0)
                return A_NODE;
            until = KVT_MIN(until, next);
        }
        if (up && e->cluster && e->refresh_needed) {
            if (now >= e->next_refresh_ns) {
                e->refresh_needed = false;
                return A_REFRESH;
            }
            until = KVT_MIN(until, e->next_refresh_ns);
        }
        bool blocked = up && e->scan_needed && e->cluster && scan_targets_down_locked(e);
        if (blocked && !e->recovered && !atomic_load(&e->scan_blocked))
            return A_BLOCKED;
        if (up && e->scan_needed && !blocked) {
            *sweep = e->sweep_after_scan;
            *masked = false;
            for (int i = 0; i < CL_MAX_NODES; i++) {
                mask[i] = e->recon[i];
                *masked |= mask[i];
                e->recon[i] = false;
            }
            /* cleared as the scan starts: a request made while it runs (the
             * budget record re-created mid-SCAN, a restart seen) asks for
             * another; a failed scan asks again */
            e->scan_needed = false;
            e->sweep_after_scan = false;
            e->scan_running = true;
            return A_SCAN;
        }
        if (up) {
            if (now >= e->next_check_ns)
                return A_CHECK;
            until = KVT_MIN(until, e->next_check_ns);
        }
        wait_until_locked(e, now, until);
    }
    return A_STOP;
}

/* Run a scan (start-up, or a reconcile) and settle what waited for it. */
static void run_scan(kvt_l2 *l2, struct resp_engine *e, struct conn *mon, bool sweep,
                     const bool *mask, bool masked)
{
    atomic_store(&e->scan_blocked, false);
    char msg[256] = "";
    int rc = 0;
    if (!e->cluster && (!mon->c || mon->c->err || mon->epoch != atomic_load(&e->epoch))) {
        mon->deadline_ns = kvt_now_ns() + e->req_ns;
        if (kvt_resp_conn_open(e, mon, msg, sizeof(msg)))
            rc = -EIO;
    }
    if (!rc)
        rc = scan_all(l2, e, mon, sweep, masked ? mask : NULL, msg, sizeof(msg));
    pthread_mutex_lock(&e->hlock);
    e->scan_running = false;
    if (rc) {
        e->scan_needed = true;
        e->sweep_after_scan |= sweep;
        for (int i = 0; masked && i < CL_MAX_NODES; i++)
            e->recon[i] |= mask[i];
    } else {
        e->recovered = true;
    }
    pthread_mutex_unlock(&e->hlock);
    if (rc == 0)
        release_parked(l2, e);
    else if (rc == -EIO || rc == -ECANCELED)
        kvt_resp_mark_down(l2, e, msg[0] ? msg : "scan failed");
}

void *kvt_resp_monitor_main(void *arg)
{
    kvt_l2 *l2 = arg;
    struct resp_engine *e = l2->engine;
    pthread_setname_np(pthread_self(), "resp-mon");
    struct conn mon = {0};
    /* cluster mode: one connection per node for its probes and checks */
    struct conn *nconn = e->cluster ? kvt_xcalloc(CL_MAX_NODES, sizeof(struct conn)) : NULL;
    bool mask[CL_MAX_NODES];
    for (;;) {
        int node = -1;
        bool sweep = false, masked = false;
        pthread_mutex_lock(&e->hlock);
        enum mon_act act = next_act_locked(e, &node, &sweep, mask, &masked);
        pthread_mutex_unlock(&e->hlock);
        switch (act) {
        case A_STOP:
            break;
        case A_PROBE:
            kvt_resp_probe(l2, e, &mon);
            continue;
        case A_NODE:
            cl_probe_node(l2, e, &nconn[node], node);
            continue;
        case A_REFRESH: {
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
            else
                clear_err_if_gone(e);
            continue;
        }
        case A_BLOCKED:
            /* stores would wait for the scan, and the scan for a master
             * that is down: they fail at once until it is back */
            atomic_store(&e->scan_blocked, true);
            kvt_resp_fail_parked(l2, e, false);
            continue;
        case A_SCAN:
            run_scan(l2, e, &mon, sweep, mask, masked);
            continue;
        case A_CHECK:
            check_round(l2, e, &mon, nconn);
            continue;
        }
        break;
    }
    kvt_resp_conn_close(&mon);
    for (int i = 0; nconn && i < CL_MAX_NODES; i++)
        kvt_resp_conn_close(&nconn[i]);
    free(nconn);
    return NULL;
}
