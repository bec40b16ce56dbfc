/* The status document (rpc "status", GET /status) and health (/healthz);
 * /metrics is metrics.c. */
#include "common/util.h"
#include "server/internal.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

bool kvt_server_health(struct kvt_server *s, char *why, size_t cap)
{
    bool ok = true;
    why[0] = 0;
    for (int i = 0; i < kvt_core_nl2(s->core); i++) {
        kvt_l2 *l2 = kvt_core_l2(s->core, i);
        char msg[256];
        if (!kvt_l2_healthy(l2, msg, sizeof(msg))) {
            size_t l = strlen(why);
            snprintf(why + l, cap - l, "%sl2 %s: %s", ok ? "" : "; ", kvt_l2_name(l2), msg);
            ok = false;
        }
    }
    if (ok)
        snprintf(why, cap, "ok");
    return ok;
}

json_t *kvt_server_status(struct kvt_server *s)
{
    json_t *o = json_object();
    json_object_set_new(o, "server", json_string("kvtier " KVT_VERSION));
    json_object_set_new(o, "pid", json_integer(getpid()));
    json_object_set_new(o, "listen", json_string(s->cfg->bind));
    json_object_set_new(o, "uptime_seconds", json_real((double)(kvt_now_ns() - s->start_ns) / 1e9));
    char why[1024];
    bool ok = kvt_server_health(s, why, sizeof(why));
    json_t *h = json_object();
    json_object_set_new(h, "is_healthy", json_boolean(ok));
    json_object_set_new(h, "detail", json_string(why));
    json_object_set_new(o, "health", h);
    struct kvt_core *core = s->core;
    json_t *l1 = kvt_l1_status(kvt_core_l1(core));
    /* the pool against this host's memory, as judged at start */
    json_object_set_new(l1, "host_memory",
                        s->cfg->l1_fit_checked ? kvt_l1_fit_json(&s->cfg->l1_fit) : json_null());
    json_object_set_new(o, "l1", l1);
    json_t *l2 = json_array();
    for (int i = 0; i < kvt_core_nl2(core); i++)
        json_array_append_new(l2, kvt_l2_status(kvt_core_l2(core, i)));
    json_object_set_new(o, "l2", l2);
    json_object_set_new(o, "store", kvt_store_ctrl_status(kvt_core_store_ctrl(core)));
    json_object_set_new(o, "prefetch", kvt_prefetch_ctrl_status(kvt_core_prefetch_ctrl(core)));
    kvt_fronts_status(s, o);
    json_object_set_new(o, "kv_events", kvt_evpub_status(s->evpub));
    if (s->admin) { /* pins, counters, the jobs and their progress */
        json_t *ad = kvt_admin_status(s->admin);
        json_object_set_new(ad, "denied", json_integer((json_int_t)atomic_load(&s->admin_denied)));
        json_object_set_new(ad, "bad_requests",
                            json_integer((json_int_t)atomic_load(&s->admin_bad)));
        json_object_set_new(o, "admin", ad);
    }
    const struct kvt_native *nv = s->native;
    json_t *rpc = json_object();
    json_t *ops = json_object();
    for (uint32_t i = 0; i < kvt_nops; i++) {
        uint64_t c = atomic_load(&nv->ops[i].count);
        if (!c)
            continue;
        json_t *op = json_object();
        json_object_set_new(op, "count", json_integer((json_int_t)c));
        json_object_set_new(op, "errors",
                            json_integer((json_int_t)atomic_load(&nv->ops[i].errors)));
        json_object_set_new(op, "mean_us",
                            json_real((double)atomic_load(&nv->ops[i].sum_ns) / (double)c / 1e3));
        json_object_set_new(ops, kvt_ops[i].name, op);
    }
    json_object_set_new(rpc, "ops", ops);
    json_object_set_new(rpc, "bad_requests",
                        json_integer((json_int_t)atomic_load(&nv->bad_requests)));
    json_object_set_new(rpc, "bytes_in", json_integer((json_int_t)atomic_load(&nv->bytes_in)));
    json_object_set_new(rpc, "bytes_out", json_integer((json_int_t)atomic_load(&s->bytes_out)));
    json_object_set_new(rpc, "local_connections", json_integer(kvt_local_conns(s)));
    json_object_set_new(rpc, "workers_queued",
                        json_integer((json_int_t)kvt_core_workers_queued(core)));
    json_object_set_new(o, "rpc", rpc);
    /* who may connect and what was refused; public keys only, never a secret */
    json_t *au = s->cfg->auth ? kvt_auth_status(s->cfg->auth, kvt_server_auth(s)) : json_object();
    json_object_set_new(au, "enabled", json_boolean(s->cfg->auth != NULL));
    json_object_set_new(au, "insecure_no_auth", json_boolean(s->cfg->insecure_no_auth));
    json_object_set_new(au, "http_token", json_boolean(s->cfg->http_token[0] != 0));
    if (s->cfg->auth) {
        /* the same-host socket under authentication: connections bound to a
         * key by a ticket, hellos refused without a valid one */
        json_t *sh = json_object();
        json_object_set_new(sh, "enabled", json_boolean(kvt_local_name(s) != NULL));
        json_object_set_new(sh, "bound", json_integer((json_int_t)atomic_load(&nv->local_bound)));
        json_object_set_new(sh, "denied", json_integer((json_int_t)atomic_load(&nv->local_denied)));
        json_object_set_new(au, "same_host", sh);
    }
    json_object_set_new(o, "auth", au);
    return o;
}
