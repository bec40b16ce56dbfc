/*
 * resp adapter: Redis Cluster mode (see resp.c and docs/remote-tiers.md).
 *
 * The slot map: CRC16 (XMODEM) of a key, or of its {hash tag}, mod 16384
 * names a slot; CLUSTER SLOTS on any node says which master owns each slot.
 * Nodes live in an append-only table (e->nodes, at most CL_MAX_NODES): a
 * node index stays valid for good, so workers keep one connection per index
 * and a map refresh only rewrites slots[]. The first entries are the
 * configured seeds.
 *
 * Redirects: MOVED updates the one slot at once and asks the monitor for a
 * full refresh; ASK sends ASKING + the command to the named node once and
 * leaves the map alone. CLUSTERDOWN, TRYAGAIN and the like fail the key
 * (a miss, a failed store) and ask for a refresh.
 *
 * Node health: a node whose request or probe failed (refused, reset, or
 * no answer before the request's deadline: stalled) is marked down at
 * once; its keys fail without I/O until the monitor's probe gets an answer
 * (kvt_resp_cl_mark_up in resp_mon.c). Refreshes that see a replica of the
 * last map own its master's slots count a failover.
 *
 * Locks: e->maplock (a leaf) guards the node table, the map and the nodes'
 * health; the control connections per node are guarded by e->ctl_lock.
 */
#include "common/log.h"
#include "common/util.h"
#include "kvtier/error.h"
#include "l2/resp/resp_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------- slots */

/* CRC16-CCITT (XMODEM: poly 0x1021, init 0), as the Redis Cluster spec. */
static uint16_t crc16(const char *buf, size_t len)
{
    uint16_t crc = 0;
    for (size_t i = 0; i < len; i++) {
        crc ^= (uint16_t)((uint8_t)buf[i] << 8);
        for (int b = 0; b < 8; b++)
            crc = crc & 0x8000 ? (uint16_t)((crc << 1) ^ 0x1021) : (uint16_t)(crc << 1);
    }
    return crc;
}

/* The key's slot: only the part between the first '{' and the next '}'
 * is hashed when that part is not empty (hash tags). */
unsigned kvt_resp_cl_slot(const char *key, size_t len)
{
    const char *o = memchr(key, '{', len);
    if (o) {
        size_t rest = len - (size_t)(o + 1 - key);
        const char *c = memchr(o + 1, '}', rest);
        if (c && c > o + 1)
            return crc16(o + 1, (size_t)(c - o - 1)) & (CL_SLOTS - 1);
    }
    return crc16(key, len) & (CL_SLOTS - 1);
}

/* ------------------------------------------------------------- nodes */

static int node_add_locked(struct resp_engine *e, const char *host, int port)
{
    for (int i = 0; i < e->nnodes; i++)
        if (e->nodes[i].port == port && strcmp(e->nodes[i].host, host) == 0)
            return i;
    if (e->nnodes == CL_MAX_NODES)
        return -1;
    struct cl_node *n = &e->nodes[e->nnodes];
    snprintf(n->host, sizeof(n->host), "%s", host);
    n->port = port;
    return e->nnodes++;
}

/* Index of host:port in the node table, appended when new; -1: full. */
int kvt_resp_cl_node_add(struct resp_engine *e, const char *host, int port)
{
    pthread_mutex_lock(&e->maplock);
    int i = node_add_locked(e, host, port);
    pthread_mutex_unlock(&e->maplock);
    return i;
}

int kvt_resp_cl_master_of(struct resp_engine *e, int node)
{
    pthread_mutex_lock(&e->maplock);
    int m = node >= 0 && node < CL_MAX_NODES && e->master_of[node] != CL_NO_NODE
                ? e->master_of[node]
                : -1;
    pthread_mutex_unlock(&e->maplock);
    return m;
}

int kvt_resp_cl_node_of(struct resp_engine *e, const char *key, size_t len, bool read)
{
    unsigned s = kvt_resp_cl_slot(key, len);
    pthread_mutex_lock(&e->maplock);
    int n = e->slots[s] == CL_NO_NODE ? -1 : e->slots[s];
    if (n >= 0 && read && e->read_replicas) {
        uint16_t r = e->replica_of[n];
        if (r != CL_NO_NODE && !e->nh[r].down_ns)
            n = r;
    }
    pthread_mutex_unlock(&e->maplock);
    return n;
}

void kvt_resp_cl_addr(struct resp_engine *e, int node, char *host, size_t cap, int *port)
{
    pthread_mutex_lock(&e->maplock);
    if (node >= 0 && node < e->nnodes) {
        snprintf(host, cap, "%s", e->nodes[node].host);
        *port = e->nodes[node].port;
    }
    pthread_mutex_unlock(&e->maplock);
}

/* The distinct slot owners (masters), at most max; returns their count. */
int kvt_resp_cl_masters(struct resp_engine *e, int *out, int max)
{
    bool seen[CL_MAX_NODES] = {false};
    int n = 0;
    pthread_mutex_lock(&e->maplock);
    for (unsigned s = 0; s < CL_SLOTS; s++) {
        uint16_t o = e->slots[s];
        if (o != CL_NO_NODE && !seen[o] && n < max) {
            seen[o] = true;
            out[n++] = o;
        }
    }
    pthread_mutex_unlock(&e->maplock);
    return n;
}

bool kvt_resp_cl_is_down(struct resp_engine *e, int node)
{
    pthread_mutex_lock(&e->maplock);
    bool down = e->nh[node].down_ns != 0;
    pthread_mutex_unlock(&e->maplock);
    return down;
}

const char *kvt_resp_role_name(int role)
{
    return role == ROLE_MASTER ? "master" : role == ROLE_REPLICA ? "replica" : "node";
}

double kvt_resp_wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int down_owners_locked(struct resp_engine *e)
{
    bool seen[CL_MAX_NODES] = {false};
    int n = 0;
    for (unsigned s = 0; s < CL_SLOTS; s++) {
        uint16_t o = e->slots[s];
        if (o != CL_NO_NODE && !seen[o]) {
            seen[o] = true;
            n += e->nh[o].down_ns != 0;
        }
    }
    return n;
}

/*
 * A request or probe to node failed: mark it down (its keys fail at once
 * from now on), remember why and when, and ask the monitor to read the
 * map again (a failover may be under way). One log line when it goes down,
 * none for the requests that fail while it is.
 */
void kvt_resp_cl_mark_down(kvt_l2 *l2, struct resp_engine *e, int node, const char *why)
{
    uint64_t now = kvt_now_ns();
    double wall = kvt_resp_wall_now();
    pthread_mutex_lock(&e->maplock);
    struct cl_health *h = &e->nh[node];
    bool was_up = h->down_ns == 0;
    if (was_up) {
        h->down_ns = now;
        h->downs++;
        h->backoff_ns = BACKOFF_MIN_NS;
        h->next_probe_ns = now + h->backoff_ns;
    }
    snprintf(h->err, sizeof(h->err), "%.*s", (int)sizeof(h->err) - 1, why);
    h->err_unix = wall;
    int role = h->role, down = down_owners_locked(e), nm = e->nmasters;
    char name[300];
    snprintf(name, sizeof(name), "%s:%d", e->nodes[node].host, e->nodes[node].port);
    pthread_mutex_unlock(&e->maplock);
    pthread_mutex_lock(&e->hlock);
    snprintf(e->last_err, sizeof(e->last_err), "node %.64s: %.180s", name, why);
    e->last_err_unix = wall;
    e->last_err_node = node;
    if (!e->refresh_needed)
        e->refresh_needed = true;
    pthread_cond_broadcast(&e->hcond); /* its first probe is due soon */
    pthread_mutex_unlock(&e->hlock);
    if (was_up)
        kvt_warn("%s: cluster node %s (%s) is down: %s; its keys fail at once until it answers "
                 "a probe (%d of %d masters down)",
                 l2->name, name, kvt_resp_role_name(role), why, down, nm);
}

int kvt_resp_cl_down_owners(struct resp_engine *e)
{
    pthread_mutex_lock(&e->maplock);
    int n = down_owners_locked(e);
    pthread_mutex_unlock(&e->maplock);
    return n;
}

void kvt_resp_cl_want_refresh(struct resp_engine *e)
{
    pthread_mutex_lock(&e->hlock);
    if (!e->refresh_needed) {
        e->refresh_needed = true;
        pthread_cond_broadcast(&e->hcond);
    }
    pthread_mutex_unlock(&e->hlock);
}

/* ---------------------------------------------------------- redirects */

int kvt_resp_cl_error(struct resp_engine *e, const char *err, int *node, bool *ask)
{
    bool moved = strncmp(err, "MOVED ", 6) == 0;
    *ask = strncmp(err, "ASK ", 4) == 0;
    if (moved || *ask) {
        /* "MOVED <slot> <host>:<port>" (an empty host: the node asked; we
         * take the first seed's, all nodes of a test cluster share it) */
        const char *p = err + (moved ? 6 : 4);
        char *end;
        long slot = strtol(p, &end, 10);
        const char *addr = end + (*end == ' ');
        const char *colon = strrchr(addr, ':');
        long port = colon ? strtol(colon + 1, NULL, 10) : 0;
        if (slot < 0 || slot >= CL_SLOTS || !colon || port < 1 || port > 65535)
            return 0;
        char host[256];
        if (colon == addr)
            snprintf(host, sizeof(host), "%s", e->nodes[0].host); /* seeds never change */
        else
            snprintf(host, sizeof(host), "%.*s", (int)KVT_MIN((size_t)(colon - addr), 255), addr);
        pthread_mutex_lock(&e->maplock);
        int n = node_add_locked(e, host, (int)port);
        if (n >= 0 && moved)
            e->slots[slot] = (uint16_t)n;
        pthread_mutex_unlock(&e->maplock);
        if (n < 0)
            return 2;
        *node = n;
        if (moved) {
            atomic_fetch_add(&e->moved, 1);
            kvt_resp_cl_want_refresh(e);
        } else {
            atomic_fetch_add(&e->asked, 1);
        }
        return 1;
    }
    if (strncmp(err, "CLUSTERDOWN", 11) == 0 || strncmp(err, "TRYAGAIN", 8) == 0 ||
        strncmp(err, "LOADING", 7) == 0 || strncmp(err, "MASTERDOWN", 10) == 0 ||
        strncmp(err, "READONLY", 8) == 0) {
        atomic_fetch_add(&e->cl_errors, 1);
        kvt_resp_cl_want_refresh(e);
        return 2;
    }
    return 0;
}

/* ------------------------------------------------------------ refresh */

/* The node of one [host, port, ...] element of a CLUSTER SLOTS entry,
 * added to the table (an empty host: the node asked); -1: malformed or the
 * table is full. call with maplock held */
static int slots_node_locked(struct resp_engine *e, const redisReply *x, const char *asked_host)
{
    if (x->type != REDIS_REPLY_ARRAY || x->elements < 2 ||
        x->element[0]->type != REDIS_REPLY_STRING || x->element[1]->type != REDIS_REPLY_INTEGER)
        return -1;
    return node_add_locked(e, x->element[0]->len ? x->element[0]->str : asked_host,
                           (int)x->element[1]->integer);
}

/* Parse a CLUSTER SLOTS reply into slots (node indices); the owners' and
 * their replicas' addresses are added to the node table. An empty host:
 * the node asked. role gets each node's part (ROLE_*), replica_of each
 * master's first replica (an entry's fourth element on) and master_of its
 * inverse; *lacking: with "read_from_replicas", a master has none. */
static int parse_slots(struct resp_engine *e, const redisReply *r, int asked, uint16_t *slots,
                       uint16_t *replica_of, uint16_t *master_of, uint8_t *role, int *nmasters,
                       bool *lacking)
{
    if (r->type != REDIS_REPLY_ARRAY)
        return -EPROTO;
    for (unsigned s = 0; s < CL_SLOTS; s++)
        slots[s] = CL_NO_NODE;
    for (int i = 0; i < CL_MAX_NODES; i++) {
        replica_of[i] = master_of[i] = CL_NO_NODE;
        role[i] = ROLE_NONE;
    }
    bool seen[CL_MAX_NODES] = {false};
    int masters = 0;
    pthread_mutex_lock(&e->maplock);
    char asked_host[256];
    snprintf(asked_host, sizeof(asked_host), "%s", e->nodes[asked].host);
    for (size_t i = 0; i < r->elements; i++) {
        const redisReply *ent = r->element[i];
        if (ent->type != REDIS_REPLY_ARRAY || ent->elements < 3 ||
            ent->element[0]->type != REDIS_REPLY_INTEGER ||
            ent->element[1]->type != REDIS_REPLY_INTEGER)
            continue;
        long long lo = ent->element[0]->integer, hi = ent->element[1]->integer;
        int n = slots_node_locked(e, ent->element[2], asked_host);
        if (n < 0 || lo < 0 || hi >= CL_SLOTS || lo > hi)
            continue;
        if (!seen[n]) {
            seen[n] = true;
            masters++;
        }
        role[n] = ROLE_MASTER;
        for (size_t k = 3; k < ent->elements; k++) {
            int rep = slots_node_locked(e, ent->element[k], asked_host);
            if (rep < 0 || rep == n)
                continue;
            if (role[rep] == ROLE_NONE)
                role[rep] = ROLE_REPLICA;
            if (replica_of[n] == CL_NO_NODE) {
                replica_of[n] = (uint16_t)rep;
                master_of[rep] = (uint16_t)n;
            }
        }
        for (long long s = lo; s <= hi; s++)
            slots[s] = (uint16_t)n;
    }
    pthread_mutex_unlock(&e->maplock);
    *lacking = false;
    for (int i = 0; e->read_replicas && i < CL_MAX_NODES; i++)
        *lacking = *lacking || (seen[i] && replica_of[i] == CL_NO_NODE);
    *nmasters = masters;
    return masters ? 0 : -ENOENT;
}

/* Count and log the failovers between the map in e (the last one) and the
 * new one: a node that was a replica in the last map owns slots of its
 * old master now. call with maplock held; the log lines go to lines. */
static int failovers_locked(struct resp_engine *e, const uint16_t *slots, char *lines, size_t cap)
{
    uint16_t from[CL_MAX_NODES];
    for (int i = 0; i < CL_MAX_NODES; i++)
        from[i] = CL_NO_NODE;
    int n = 0;
    size_t at = 0;
    lines[0] = 0;
    for (unsigned s = 0; s < CL_SLOTS; s++) {
        uint16_t o = e->slots[s], nw = slots[s];
        if (o == CL_NO_NODE || nw == CL_NO_NODE || o == nw || e->nh[nw].role != ROLE_REPLICA ||
            from[nw] != CL_NO_NODE)
            continue;
        from[nw] = o;
        n++;
        if (at < cap)
            at += (size_t)snprintf(lines + at, cap - at, "%s%s:%d took over from %s:%d",
                                   at ? "; " : "", e->nodes[nw].host, e->nodes[nw].port,
                                   e->nodes[o].host, e->nodes[o].port);
    }
    return n;
}

/* The order refresh asks the nodes in: those that are up first (seeds,
 * then the others in the order they were seen), the ones marked down last
 * (a stalled node would cost a whole probe deadline). Returns the count. */
static int refresh_order(struct resp_engine *e, int *order)
{
    int n = 0;
    pthread_mutex_lock(&e->maplock);
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < e->nnodes; i++)
            if ((e->nh[i].down_ns != 0) == (pass == 1))
                order[n++] = i;
    pthread_mutex_unlock(&e->maplock);
    return n;
}

/*
 * Read the slot map with CLUSTER SLOTS from the first node that answers
 * within a probe's deadline (the nodes that are up first, refresh_order).
 * A node in the map that does not answer is marked down. On success mon
 * stays connected to that node. Runs on the monitor thread (and at open).
 */
int kvt_resp_cl_refresh(kvt_l2 *l2, struct resp_engine *e, struct conn *mon, char *msg, size_t cap)
{
    uint16_t *slots = kvt_xmalloc(CL_SLOTS * sizeof(uint16_t));
    uint16_t replica_of[CL_MAX_NODES], master_of[CL_MAX_NODES];
    uint8_t role[CL_MAX_NODES];
    bool lacking = false; /* a master without a replica to read from */
    int order[CL_MAX_NODES];
    int count = refresh_order(e, order);
    int rc = -ENOENT;
    snprintf(msg, cap, "no cluster node answered");
    for (int k = 0; k < count; k++) {
        int i = order[k];
        mon->node = i;
        mon->deadline_ns = kvt_now_ns() + e->probe_ns;
        char why[256];
        rc = kvt_resp_conn_open(e, mon, why, sizeof(why));
        redisReply *r = NULL;
        int nm = 0;
        if (rc) {
            snprintf(msg, cap, "%s", why);
        } else if (kvt_resp_conn_arm(e, mon) || !(r = redisCommand(mon->c, "CLUSTER SLOTS"))) {
            snprintf(msg, cap, "CLUSTER SLOTS: %s",
                     kvt_resp_past_deadline(mon) ? "no answer before the deadline"
                                                 : mon->c->errstr);
            rc = -EIO;
        } else if (r->type == REDIS_REPLY_ERROR) {
            snprintf(msg, cap, "CLUSTER SLOTS: %s", r->str); /* e.g. not a cluster node */
            rc = KVT_E_UNHEALTHY;
        } else if ((rc = parse_slots(e, r, i, slots, replica_of, master_of, role, &nm, &lacking))) {
            snprintf(msg, cap, "CLUSTER SLOTS: no slot is served");
        }
        if (r)
            freeReplyObject(r);
        if (rc) {
            if (kvt_resp_is_transport(rc) || rc == -ETIMEDOUT) {
                pthread_mutex_lock(&e->maplock);
                bool mapped = e->nh[i].role != ROLE_NONE;
                pthread_mutex_unlock(&e->maplock);
                if (mapped)
                    kvt_resp_cl_mark_down(l2, e, i, msg);
            }
            kvt_resp_conn_close(mon);
            continue;
        }
        char fo[512];
        pthread_mutex_lock(&e->maplock);
        int failovers = e->nmasters ? failovers_locked(e, slots, fo, sizeof(fo)) : 0;
        memcpy(e->slots, slots, CL_SLOTS * sizeof(uint16_t));
        memcpy(e->replica_of, replica_of, sizeof(replica_of));
        memcpy(e->master_of, master_of, sizeof(master_of));
        for (int q = 0; q < CL_MAX_NODES; q++)
            e->nh[q].role = role[q];
        bool changed = e->nmasters != nm;
        e->nmasters = nm;
        if (e->nh[i].down_ns)
            e->nh[i].next_probe_ns = kvt_now_ns(); /* it answered: probe it now */
        int down = down_owners_locked(e);
        pthread_mutex_unlock(&e->maplock);
        /* a master that failed still owns slots: its replica has not taken
         * over yet; read the map again shortly until one has */
        if (down || lacking)
            kvt_resp_cl_want_refresh(e);
        pthread_mutex_lock(&e->hlock);
        e->replica_poll = lacking && !down;
        pthread_cond_broadcast(&e->hcond);
        pthread_mutex_unlock(&e->hlock);
        atomic_fetch_add(&e->refreshes, 1);
        if (failovers) {
            atomic_fetch_add(&l2->counters.failovers, (uint64_t)failovers);
            kvt_warn("%s: cluster failover: %s", l2->name, fo);
        }
        if (changed)
            kvt_info("%s: cluster slot map: %d masters", l2->name, nm);
        break;
    }
    free(slots);
    return rc;
}

/* ------------------------------------------------------- control path */

/*
 * One command about key on its node's control connection, before a
 * deadline of request_timeout (a reopen of a connection that broke while
 * idle included); a node marked down fails at once, one that does not
 * answer in time is marked down. Follows redirects.
 */
redisReply *kvt_resp_cl_command(kvt_l2 *l2, struct resp_engine *e, const char *key, size_t kl,
                                int argc, const char **argv, const size_t *lens)
{
    int node = kvt_resp_cl_node_of(e, key, kl, false);
    bool ask = false;
    if (node < 0)
        node = 0;
    uint64_t deadline = kvt_now_ns() + e->req_ns;
    for (int hop = 0; hop <= CL_MAX_REDIRECTS; hop++) {
        struct conn *cn = &e->ctl_nodes[node];
        char msg[256];
        if (kvt_resp_cl_is_down(e, node))
            return NULL;
        if (cn->node != node)
            kvt_resp_conn_close(cn);
        cn->node = node;
        cn->deadline_ns = deadline;
        redisReply *r = NULL;
        for (int attempt = 0; attempt < 2 && !r; attempt++) {
            bool reused = cn->c && !cn->c->err && cn->epoch == atomic_load(&e->epoch);
            if (kvt_resp_conn_ensure(e, cn, msg, sizeof(msg))) {
                kvt_resp_cl_mark_down(l2, e, node, msg);
                return NULL;
            }
            if (kvt_resp_conn_arm(e, cn) == 0) {
                if (ask) {
                    redisReply *a = redisCommand(cn->c, "ASKING");
                    if (a)
                        freeReplyObject(a);
                }
                r = redisCommandArgv(cn->c, argc, argv, lens);
            }
            if (r)
                break;
            snprintf(msg, sizeof(msg), "%s: %s", argv[0],
                     kvt_resp_past_deadline(cn) || !cn->c ? "no answer before the deadline"
                                                          : cn->c->errstr);
            kvt_resp_conn_close(cn);
            /* a connection that broke while idle is opened again, within
             * the same deadline; no answer in time is not asked again */
            if (!reused || kvt_resp_past_deadline(cn)) {
                kvt_resp_cl_mark_down(l2, e, node, msg);
                return NULL;
            }
        }
        if (!r)
            return NULL;
        int to;
        if (r->type != REDIS_REPLY_ERROR || kvt_resp_cl_error(e, r->str, &to, &ask) != 1)
            return r;
        freeReplyObject(r);
        node = to;
    }
    return NULL;
}

void kvt_resp_cl_close(struct resp_engine *e)
{
    for (int i = 0; i < CL_MAX_NODES; i++)
        kvt_resp_conn_close(&e->ctl_nodes[i]);
}
