/*
 * mooncake_store adapter: the seam for Mooncake's distributed store.
 *
 * The seed's configuration is parsed as LMCache does: num_workers (4) and
 * per_op_workers ({lookup, retrieve, store, delete}: thread counts) are
 * kvtier's; every other key (local_hostname, metadata_server,
 * master_server_addr, protocol, rdma_devices, global_segment_size, ...) is
 * forwarded to Mooncake's setup. This build has no Mooncake client library
 * (it is not packaged for Debian), so a valid config is then refused with
 * exit 2 and a message saying so, never ignored. Building against
 * libmooncake_store means implementing kvt_mooncake_open with the usual
 * kvt_l2_ops (submit/remove/status/healthy/close) behind this parser.
 */
#include "kvtier/error.h"
#include "l2/adapters.h"
#include "common/cfg.h"

#include <stdio.h>
#include <string.h>

struct kvt_mooncake_opts {
    int num_workers;
    int per_op_workers[4]; /* lookup, retrieve, store, delete; 0 = shared pool */
};

static int mooncake_parse(struct kvt_cfg *c, void *opts)
{
    struct kvt_mooncake_opts *o = opts;
    memset(o, 0, sizeof(*o));
    int64_t nw = 4;
    kvt_cfg_int(c, "num_workers", false, 4, 1, 1024, &nw);
    o->num_workers = (int)nw;
    struct kvt_cfg sub;
    kvt_cfg_sub(c, "per_op_workers", false, &sub);
    static const char *const lanes[] = {"lookup", "retrieve", "store", "delete"};
    for (size_t i = 0; i < 4 && !sub.rc; i++) {
        int64_t v = 0;
        kvt_cfg_int(&sub, lanes[i], false, 0, 1, 1024, &v);
        o->per_op_workers[i] = (int)v;
    }
    if (!sub.rc)
        kvt_cfg_finish(&sub); /* an unknown lane is an error */
    kvt_cfg_sub_done(c, "per_op_workers", &sub);
    if (c->rc)
        return c->rc;
    /* everything else belongs to Mooncake's setup(): accepted as given */
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)c->obj, key, val)
    {
        if (strcmp(key, "num_workers") && strcmp(key, "per_op_workers")) {
            kvt_cfg_ignore(c, key);
            if (!json_object_get(c->resolved, key))
                json_object_set(c->resolved, key, val);
        }
    }
    return kvt_cfg_unsupported(c, NULL,
                               "this build has no Mooncake client library, so "
                               "\"mooncake_store\" cannot run (kvtier must be built against "
                               "Mooncake's store client); for a shared L2 use "
                               "\"resp\"/\"valkey\" or \"s3\"");
}

static int mooncake_open(kvt_l2 *l2, const struct kvt_l2_spec *spec, const void *o, char *err,
                         size_t errcap)
{
    (void)l2;
    (void)spec;
    (void)o;
    snprintf(err, errcap, "no Mooncake client library in this build");
    return KVT_E_UNSUPPORTED;
}

const struct kvt_l2_adapter_desc kvt_l2_mooncake_desc = {
    .name = "mooncake_store",
    .opts_size = sizeof(struct kvt_mooncake_opts),
    .parse = mooncake_parse,
    .open = mooncake_open,
};
