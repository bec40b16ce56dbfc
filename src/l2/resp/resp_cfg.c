/*
 * resp adapter: its JSON configuration (see docs/remote-tiers.md), read with
 * the kvt_cfg helpers so --dry-run shows every field and unknown ones fail.
 */
#include "common/cfg.h"
#include "common/util.h"
#include "l2/resp/resp_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void add_seed(struct kvt_resp_opts *o, const char *host, int port)
{
    for (int i = 0; i < o->nseeds; i++)
        if (o->seed_port[i] == port && strcmp(o->seed_host[i], host) == 0)
            return;
    if (o->nseeds == CL_MAX_SEEDS)
        return;
    snprintf(o->seed_host[o->nseeds], sizeof(o->seed_host[0]), "%.255s", host);
    o->seed_port[o->nseeds++] = port;
}

/* First "host:port" of a "h:p,h:p" list (every entry is also a cluster
 * seed); fails naming the bad entry under key. */
static int parse_nodes(struct kvt_cfg *c, const char *key, const char *list,
                       struct kvt_resp_opts *o)
{
    int count = 0;
    const char *p = list;
    while (*p) {
        size_t n = strcspn(p, ",");
        char ent[300];
        snprintf(ent, sizeof(ent), "%.*s", (int)KVT_MIN(n, sizeof(ent) - 1), p);
        char *a = ent, *z = ent + strlen(ent);
        while (*a == ' ')
            a++;
        while (z > a && z[-1] == ' ')
            *--z = 0;
        if (*a) {
            char *colon = strrchr(a, ':');
            char *end = NULL;
            long port = colon ? strtol(colon + 1, &end, 10) : 0;
            if (!colon || colon == a || !end || *end || end == colon + 1 || port < 1 ||
                port > 65535)
                return kvt_cfg_fail(c, key,
                                    "entries must be \"host:port\" with a port in 1..65535 "
                                    "(got \"%s\")",
                                    a);
            *colon = 0;
            if (a[0] == '[' && colon[-1] == ']') { /* [::1]:6379 */
                colon[-1] = 0;
                a++;
            }
            if (count++ == 0 && !o->host) {
                snprintf(o->node_host, sizeof(o->node_host), "%.255s", a);
                o->port = (int)port;
            }
            add_seed(o, a, (int)port);
        }
        p += n;
        if (*p == ',')
            p++;
    }
    if (count == 0)
        return kvt_cfg_fail(c, key, "must list at least one \"host:port\"");
    o->nnodes = count;
    return 0;
}

/* Cluster mode's "nodes": ["h:p", ...], more seeds after host/startup_nodes. */
static int parse_seed_list(struct kvt_cfg *c, const json_t *v, struct kvt_resp_opts *o)
{
    if (!json_is_array(v) || json_array_size(v) == 0)
        return kvt_cfg_fail(c, "nodes", "must be a non-empty list of \"host:port\" strings");
    size_t i;
    const json_t *it;
    json_array_foreach(v, i, it)
    {
        if (!json_is_string(it))
            return kvt_cfg_fail(c, "nodes", "must be a non-empty list of \"host:port\" strings");
        int keep = o->nnodes;
        if (parse_nodes(c, "nodes", json_string_value(it), o))
            return c->rc;
        o->nnodes = keep;
    }
    json_object_set(c->resolved, "nodes", (json_t *)v);
    return 0;
}

static int resp_parse(struct kvt_cfg *c, struct kvt_resp_opts *o, bool valkey)
{
    memset(o, 0, sizeof(*o));
    const char *nodes = NULL;
    int64_t port = 0, nw = 8, db = 0;
    double ct = 10.0, rt = 5.0, cap = 0;
    bool cluster = false, cluster_mode = false, tls = false, replicas = false;
    kvt_cfg_str(c, "host", false, NULL, &o->host);
    kvt_cfg_int(c, "port", false, 6379, 1, 65535, &port);
    kvt_cfg_str(c, "startup_nodes", false, NULL, &nodes);
    kvt_cfg_str(c, "username", false, "", &o->username);
    kvt_cfg_str(c, "password", false, "", &o->password);
    if (o->password && o->password[0]) /* read, never echoed by --dry-run or status */
        json_object_set_new(c->resolved, "password", json_string("<set>"));
    kvt_cfg_str(c, "key_prefix", false, "", &o->key_prefix);
    kvt_cfg_int(c, "num_workers", false, 8, 1, 256, &nw);
    kvt_cfg_num(c, "connection_timeout", false, 1.0, 0.001, 3600, &ct);
    kvt_cfg_num(c, "request_timeout", false, 1.0, 0.001, 3600, &rt);
    kvt_cfg_int(c, "database_id", false, 0, 0, 1 << 20, &db);
    kvt_cfg_bool(c, "cluster", false, &cluster);
    kvt_cfg_bool(c, "cluster_mode", false, &cluster_mode); /* LMCache's name for it */
    kvt_cfg_bool(c, "read_from_replicas", false, &replicas);
    const json_t *seeds = kvt_cfg_raw(c, "nodes");
    kvt_cfg_bool(c, "tls_enable", false, &tls);
    kvt_cfg_num(c, "max_capacity_gb", false, 0, 0, 1e9, &cap);
    if (c->rc)
        return c->rc;
    o->num_workers = (int)nw;
    o->database_id = (int)db;
    o->connection_timeout = ct;
    o->request_timeout = rt;
    o->max_capacity_bytes = (uint64_t)(cap * KVT_GIB);
    o->cluster = cluster || cluster_mode;
    if (o->cluster && db != 0)
        return kvt_cfg_fail(c, "database_id",
                            "must be 0 in cluster mode (Redis Cluster has database 0 only; "
                            "got %lld)",
                            (long long)db);
    if (replicas && !o->cluster)
        return kvt_cfg_fail(c, "read_from_replicas",
                            "is for cluster mode only (set \"cluster\": true)");
    o->read_replicas = replicas;
    if (seeds && !o->cluster)
        return kvt_cfg_fail(c, "nodes", "is for cluster mode only (set \"cluster\": true)");
    if (tls)
        return kvt_cfg_unsupported(c, "tls_enable",
                                   "is not supported by this build: Debian's hiredis 0.14 has "
                                   "no TLS (use a TLS tunnel such as stunnel, or a trusted "
                                   "network)");
    if (nodes && o->host)
        return kvt_cfg_fail(c, "startup_nodes",
                            "and \"host\" both given: use one of them (startup_nodes "
                            "\"h:p,h:p\" or host + port)");
    if (!nodes && !o->host)
        return kvt_cfg_missing(c, valkey ? "startup_nodes" : "host",
                               "is required (a Redis/Valkey address: \"host\" + \"port\", or "
                               "\"startup_nodes\": \"host:port[,host:port...]\")");
    if (nodes) {
        if (parse_nodes(c, "startup_nodes", nodes, o))
            return c->rc;
        o->host = o->node_host;
    } else {
        if (!o->host[0])
            return kvt_cfg_fail(c, "host", "must not be empty");
        o->port = (int)port;
        o->nnodes = 1;
        add_seed(o, o->host, o->port);
    }
    if (o->cluster && (strncmp(o->host, "unix://", 7) == 0 || o->host[0] == '/'))
        return kvt_cfg_fail(c, "host", "must be a TCP address in cluster mode (got \"%s\")",
                            o->host);
    if (seeds && parse_seed_list(c, seeds, o))
        return c->rc;
    if (strchr(o->key_prefix, '@'))
        return kvt_cfg_fail(c, "key_prefix", "must not contain '@' (got \"%s\")", o->key_prefix);
    if (strlen(o->key_prefix) > 128)
        return kvt_cfg_fail(c, "key_prefix", "must be at most 128 bytes");
    if (strlen(o->username) >= 128 || strlen(o->password) >= 256)
        return kvt_cfg_fail(c, strlen(o->username) >= 128 ? "username" : "password", "is too long");
    for (const char *p = o->key_prefix; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            return kvt_cfg_fail(c, "key_prefix", "must not contain control characters");
    return 0;
}

int kvt_resp_parse_resp(struct kvt_cfg *c, void *o)
{
    return resp_parse(c, o, false);
}

int kvt_resp_parse_valkey(struct kvt_cfg *c, void *o)
{
    return resp_parse(c, o, true);
}
