/*
 * resp workers and passes: a worker thread's connections (one to the
 * server, or one per cluster node) and the runners that send a pipelined
 * pass of one job on them within the job's deadline: one retry on a fresh
 * connection when an idle one broke, redirects followed in cluster mode,
 * a failing server or node marked down.
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

void *kvt_resp_worker_new(int i, void *arg)
{
    (void)i;
    (void)arg;
    struct worker *w = kvt_xcalloc(1, sizeof(*w));
    w->cn.rbuf = kvt_xmalloc(RBUF_CAP);
    w->cn.obuf = kvt_xmalloc(OBUF_CAP);
    w->cur = &w->cn;
    return w;
}

void kvt_resp_worker_free(void *p)
{
    struct worker *w = p;
    if (!w)
        return;
    kvt_resp_conn_close(&w->cn);
    free(w->cn.rbuf);
    free(w->cn.obuf);
    for (int i = 0; i < CL_MAX_NODES; i++) {
        kvt_resp_conn_close(&w->ncn[i]);
        free(w->ncn[i].rbuf);
        free(w->ncn[i].obuf);
    }
    free(w->wb.p);
    free(w->hdrs);
    free(w);
}

uint8_t *kvt_resp_worker_hdrs(struct worker *w, uint32_t n)
{
    size_t need = (size_t)n * HDR;
    if (need > w->hdrs_cap) {
        free(w->hdrs);
        w->hdrs = kvt_xmalloc(need);
        w->hdrs_cap = need;
    }
    return w->hdrs;
}

/* Cluster mode: the state for an error reply to key j's command: K_REDIR
 * (w->tgt/askf say where next), K_DOWN (a transient cluster error), or 0
 * (not a cluster error: the caller's usual handling). */
int kvt_resp_cl_err_state(struct resp_engine *e, struct worker *w, uint32_t j, const char *err)
{
    if (!e->cluster)
        return 0;
    int node = 0;
    bool ask = false;
    switch (kvt_resp_cl_error(e, err, &node, &ask)) {
    case 1:
        w->tgt[j] = (uint16_t)node;
        w->askf[j] = ask;
        return K_REDIR;
    case 2:
        return K_DOWN;
    default:
        return 0;
    }
}

/* ASKING in front of a command when the pass follows an ASK redirect. */
void kvt_resp_put_asking(struct worker *w)
{
    if (w->asking)
        kvt_resp_wb_fmt(&w->wb, "*1\r\n$6\r\nASKING\r\n");
}

/* Read (and drop) ASKING's +OK. */
int kvt_resp_skip_asking(struct worker *w)
{
    if (!w->asking)
        return 0;
    int ty;
    long long num;
    char err[128];
    return kvt_resp_rd_reply(w->cur, &ty, &num, err, sizeof(err));
}

void kvt_resp_report_corrupt(kvt_l2 *l2, const kvt_key *k, const char *why)
{
    char ks[400];
    atomic_fetch_add(&l2->counters.corrupt, 1);
    kvt_warn("%s: corrupt or foreign value for %s (%s): removed, treated as a miss", l2->name,
             kvt_key_str(k, ks, sizeof(ks)), why);
}

/* UNLINK keys on cn (a cleanup after corrupt values); errors are ignored. */
void kvt_resp_unlink_keys(struct resp_engine *e, struct worker *w, const kvt_key *keys,
                          const uint32_t *which, uint32_t n)
{
    if (!n)
        return;
    w->wb.len = 0;
    char key[KEY_MAX];
    for (uint32_t j = 0; j < n; j++) {
        int kl = kvt_resp_wire_key(e, &keys[which[j]], key);
        kvt_resp_wb_fmt(&w->wb, "*2\r\n$6\r\nUNLINK\r\n");
        kvt_resp_wb_arg(&w->wb, key, (size_t)kl);
    }
    struct iovec iov = {w->wb.p, w->wb.len};
    if (kvt_resp_wr_all(&w->cn, &iov, 1))
        return;
    for (uint32_t j = 0; j < n; j++) {
        int ty;
        long long num;
        char err[128];
        if (kvt_resp_rd_reply(&w->cn, &ty, &num, err, sizeof(err)))
            return;
    }
}

/* Cluster mode: UNLINK keys one by one on their nodes' control connections
 * (corrupt values are rare); errors are ignored. */
void kvt_resp_cl_unlink_keys(kvt_l2 *l2, struct resp_engine *e, const kvt_key *keys,
                             const uint32_t *which, uint32_t n)
{
    char key[KEY_MAX];
    pthread_mutex_lock(&e->ctl_lock);
    for (uint32_t j = 0; j < n; j++) {
        int kl = kvt_resp_wire_key(e, &keys[which[j]], key);
        const char *argv[2] = {"UNLINK", key};
        size_t lens[2] = {6, (size_t)kl};
        redisReply *r = kvt_resp_cl_command(l2, e, key, (size_t)kl, 2, argv, lens);
        if (r)
            freeReplyObject(r);
    }
    pthread_mutex_unlock(&e->ctl_lock);
}

/* msg += what a timeout means, for logs and last_error. */
static void note_timeout(struct resp_engine *e, int rc, char *msg, size_t cap)
{
    size_t l = strlen(msg);
    if (rc == -ETIMEDOUT && l < cap)
        snprintf(msg + l, cap - l, " (no answer within request_timeout %.2f s)",
                 (double)e->req_ns / 1e9);
}

static int run_standalone(kvt_l2 *l2, struct resp_engine *e, struct worker *w, pass_fn fn,
                          kvt_l2_task *t, const uint32_t *idx, uint32_t n, uint8_t *st, void *ctx)
{
    char msg[256];
    w->cur = &w->cn;
    w->cn.deadline_ns = w->deadline;
    for (int attempt = 0; attempt < 2; attempt++) {
        if (!atomic_load(&e->up))
            return KVT_E_UNHEALTHY;
        bool fresh = !(w->cn.c && !w->cn.c->err && w->cn.epoch == atomic_load(&e->epoch));
        int rc = kvt_resp_conn_ensure(e, &w->cn, msg, sizeof(msg));
        if (rc) {
            kvt_resp_mark_down(l2, e, msg);
            return rc;
        }
        bool was_used = w->cn.used && !fresh;
        rc = fn(l2, e, w, t, idx, n, st, ctx, msg, sizeof(msg));
        if (rc == 0) {
            w->cn.used = true;
            return 0;
        }
        kvt_resp_conn_close(&w->cn);
        if (!kvt_resp_is_transport(rc))
            return rc;
        if (!was_used || rc == -ETIMEDOUT || kvt_resp_past_deadline(&w->cn)) {
            note_timeout(e, rc, msg, sizeof(msg));
            kvt_resp_mark_down(l2, e, msg);
            return rc;
        }
        kvt_debug("%s: %s; retrying on a new connection", l2->name, msg);
    }
    return -EIO;
}

/*
 * Cluster mode: one pass over the keys selected in sub (K_PENDING) on the
 * connection to node, with the standalone runner's retry of a stale
 * connection, within the job's deadline. A node that fails does not take
 * the adapter down (the others serve): it is marked down, its keys fail
 * (here and, without I/O, in every later request until a probe of the
 * monitor gets an answer) and the monitor refreshes the slot map.
 */
static int cl_pass_on(kvt_l2 *l2, struct resp_engine *e, struct worker *w, pass_fn fn,
                      kvt_l2_task *t, const uint32_t *idx, uint32_t n, uint8_t *sub, void *ctx,
                      int node, bool ask)
{
    if (kvt_resp_cl_is_down(e, node))
        return KVT_E_UNHEALTHY;
    struct conn *cn = &w->ncn[node];
    if (!cn->rbuf) {
        cn->rbuf = kvt_xmalloc(RBUF_CAP);
        cn->obuf = kvt_xmalloc(OBUF_CAP);
    }
    cn->node = node;
    cn->deadline_ns = w->deadline;
    /* a pass that starts late in the job (a redirect, a replica's fallback
     * to its master after the replica used the time up) fails its keys
     * when the deadline comes, but marks the node down for it only when it
     * had half a request_timeout at least: a slow first node is not the
     * second one's fault. Refused and broken connections always count. */
    uint64_t now = kvt_now_ns();
    if (now >= w->deadline)
        return -ETIMEDOUT;
    bool blame = w->deadline - now >= e->req_ns / 2;
    char msg[256];
    for (int attempt = 0; attempt < 2; attempt++) {
        bool fresh = !(cn->c && !cn->c->err && cn->epoch == atomic_load(&e->epoch));
        int rc = kvt_resp_conn_ensure(e, cn, msg, sizeof(msg));
        if (rc) {
            if (rc != -ETIMEDOUT || blame)
                kvt_resp_cl_mark_down(l2, e, node, msg);
            return rc;
        }
        bool was_used = cn->used && !fresh;
        w->cur = cn;
        w->asking = ask;
        rc = fn(l2, e, w, t, idx, n, sub, ctx, msg, sizeof(msg));
        w->asking = false;
        if (rc == 0) {
            cn->used = true;
            return 0;
        }
        kvt_resp_conn_close(cn);
        if (!kvt_resp_is_transport(rc)) {
            kvt_resp_set_err(e, "%s", msg);
            kvt_resp_cl_want_refresh(e);
            return rc;
        }
        bool late = rc == -ETIMEDOUT || kvt_resp_past_deadline(cn);
        if (!was_used || late) {
            note_timeout(e, rc, msg, sizeof(msg));
            if (!late || blame)
                kvt_resp_cl_mark_down(l2, e, node, msg);
            return rc;
        }
        kvt_debug("%s: %s; retrying on a new connection", l2->name, msg);
    }
    return -EIO;
}

/*
 * Cluster mode: run fn for the job's keys, all first sent to node (their
 * slots' owner when the batch was split). Keys answered with MOVED or ASK
 * are sent again, grouped by where they were sent, in further pipelined
 * passes (at most CL_MAX_REDIRECTS hops per key). A key whose node fails
 * ends as K_DOWN: a miss or a failed store, never a wrong byte. Returns 0:
 * the outcome is per key.
 */
static int run_cluster(kvt_l2 *l2, struct resp_engine *e, struct worker *w, pass_fn fn,
                       kvt_l2_task *t, const uint32_t *idx, uint32_t n, uint8_t *st, void *ctx,
                       int node)
{
    uint8_t *sub = kvt_xmalloc(n), *hops = kvt_xcalloc(n, 1);
    w->tgt = kvt_xmalloc(n * sizeof(uint16_t));
    w->askf = kvt_xcalloc(n, 1);
    for (uint32_t j = 0; j < n; j++)
        w->tgt[j] = (uint16_t)node;
    for (;;) {
        uint32_t j0 = 0;
        while (j0 < n && st[j0] != K_PENDING)
            j0++;
        if (j0 == n)
            break;
        uint16_t to = w->tgt[j0];
        bool ask = w->askf[j0];
        for (uint32_t j = 0; j < n; j++)
            sub[j] =
                st[j] == K_PENDING && w->tgt[j] == to && w->askf[j] == ask ? K_PENDING : K_NOTSEL;
        int rc = cl_pass_on(l2, e, w, fn, t, idx, n, sub, ctx, to, ask);
        for (uint32_t j = 0; j < n; j++) {
            if (sub[j] == K_NOTSEL)
                continue;
            if (rc || sub[j] == K_PENDING) {
                st[j] = K_DOWN;
            } else if (sub[j] == K_REDIR) {
                st[j] = ++hops[j] > CL_MAX_REDIRECTS ? K_DOWN : K_PENDING;
            } else {
                st[j] = sub[j];
            }
        }
    }
    free(sub);
    free(hops);
    free(w->tgt);
    free(w->askf);
    w->tgt = NULL;
    w->askf = NULL;
    return 0;
}

int kvt_resp_run_pass(kvt_l2 *l2, struct resp_engine *e, struct worker *w, pass_fn fn,
                      kvt_l2_task *t, const uint32_t *idx, uint32_t n, uint8_t *st, void *ctx,
                      int node)
{
    if (e->cluster)
        return run_cluster(l2, e, w, fn, t, idx, n, st, ctx, node);
    return run_standalone(l2, e, w, fn, t, idx, n, st, ctx);
}
