/*
 * LMCache MP protocol decoder (see lmc_wire.h). Every function validates its
 * input fully and never trusts lengths or types from the wire.
 */
#include "proto/lmc_wire.h"
#include "kvtier/error.h"
#include "proto/wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Operation table of lmcache 0.5.6: names and argument counts from
 * lmcache/v1/multiprocess/transport/base.py (RequestClient), legacy ids from
 * transport/zmq_impl/wire.py (LEGACY_OPERATION_IDS; 11 is retired). */
const struct lmc_opinfo lmc_ops[LMC_OP_COUNT] = {
    [LMC_OP_UNKNOWN] = {"unknown", 0, 0},
    [LMC_REGISTER_KV_CACHE] = {"register_kv_cache", 1, 7},
    [LMC_UNREGISTER_KV_CACHE] = {"unregister_kv_cache", 2, 1},
    [LMC_REGISTER_Q_CACHE] = {"register_q_cache", 3, 7},
    [LMC_UNREGISTER_Q_CACHE] = {"unregister_q_cache", 4, 1},
    [LMC_STORE_Q] = {"store_q", 5, 4},
    [LMC_STORE] = {"store", 6, 4},
    [LMC_RETRIEVE] = {"retrieve", 7, 5},
    [LMC_LOOKUP] = {"lookup", 8, 2},
    [LMC_QUERY_PREFETCH_STATUS] = {"query_prefetch_status", 9, 1},
    [LMC_WAIT_PREFETCH_STATUS] = {"wait_prefetch_status", 10, 2},
    [LMC_FREE_LOOKUP_LOCKS] = {"free_lookup_locks", 12, 2},
    [LMC_END_SESSION] = {"end_session", 13, 1},
    [LMC_REGISTER_ED_CONTEXT] = {"register_kv_cache_engine_driven_context", 14, 1},
    [LMC_UNREGISTER_ED_CONTEXT] = {"unregister_kv_cache_engine_driven_context", 15, 1},
    [LMC_PREPARE_STORE] = {"prepare_store", 16, 2},
    [LMC_COMMIT_STORE] = {"commit_store", 17, 3},
    [LMC_PREPARE_RETRIEVE] = {"prepare_retrieve", 18, 2},
    [LMC_COMMIT_RETRIEVE] = {"commit_retrieve", 19, 2},
    [LMC_CLEAR] = {"clear", 20, 1},
    [LMC_GET_CHUNK_SIZE] = {"get_chunk_size", 21, 0},
    [LMC_PING] = {"ping", 22, 1},
    [LMC_REPORT_BLOCK_ALLOCATION] = {"report_block_allocation", 23, 3},
    [LMC_NOOP] = {"noop", 24, 0},
    [LMC_CB_REGISTER_ROPE] = {"cb_register_rope", 25, 8},
    [LMC_CB_UNREGISTER_ROPE] = {"cb_unregister_rope", 26, 1},
    [LMC_CB_RETRIEVE_PRE_COMPUTED] = {"cb_retrieve_pre_computed", 27, 5},
    [LMC_CB_UNIFIED_LOOKUP] = {"cb_unified_lookup", 28, 2},
    [LMC_P2P_LOOKUP_AND_LOCK] = {"p2p_lookup_and_lock", 29, 2},
    [LMC_P2P_QUERY_LOOKUP_RESULTS] = {"p2p_query_lookup_results", 30, 1},
    [LMC_P2P_UNLOCK_OBJECTS] = {"p2p_unlock_objects", 31, 1},
    [LMC_GET_EXPERIMENTAL] = {"get_experimental", 32, 0},
    [LMC_CB_PROTOCOL_HANDSHAKE] = {"cb_protocol_handshake", 33, 1},
    [LMC_CB_REORDER_PLAN] = {"cb_reorder_plan", 0, 3},
    [LMC_SUBSCRIBE_KV_EVENTS] = {"subscribe_kv_events", 0, 4},
    [LMC_SERVER_MODULE_CALL] = {"server_module_call", 0, 1},
};

int lmc_unpack(const void *p, size_t n, msgpack_unpacked *up)
{
    size_t off = 0;
    if (!p || n == 0 || n > LMC_MAX_PAYLOAD)
        return KVT_E_BADREQ;
    /* msgpack-c allocates from declared lengths: bound them by the bytes first */
    if (kvt_wire_precheck(p, n))
        return KVT_E_BADREQ;
    if (msgpack_unpack_next(up, p, n, &off) != MSGPACK_UNPACK_SUCCESS || off != n)
        return KVT_E_BADREQ;
    return 0;
}

int lmc_get_int(const msgpack_object *o, int64_t *v)
{
    switch (o->type) {
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        if (o->via.u64 > INT64_MAX)
            return KVT_E_BADREQ;
        *v = (int64_t)o->via.u64;
        return 0;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        *v = o->via.i64;
        return 0;
    case MSGPACK_OBJECT_BOOLEAN:
        *v = o->via.boolean;
        return 0;
    default:
        return KVT_E_BADREQ;
    }
}

int lmc_get_float(const msgpack_object *o, double *v)
{
    int64_t i;
    if (o->type == MSGPACK_OBJECT_FLOAT32 || o->type == MSGPACK_OBJECT_FLOAT64) {
        *v = o->via.f64;
        return 0;
    }
    if (lmc_get_int(o, &i) == 0) {
        *v = (double)i;
        return 0;
    }
    return KVT_E_BADREQ;
}

bool lmc_is_nil(const msgpack_object *o)
{
    return o->type == MSGPACK_OBJECT_NIL;
}

int lmc_get_str(const msgpack_object *o, const char **s, size_t *n)
{
    if (o->type != MSGPACK_OBJECT_STR)
        return KVT_E_BADREQ;
    *s = o->via.str.ptr;
    *n = o->via.str.size;
    return 0;
}

int lmc_decode_op(const void *p, size_t n, enum lmc_op *op, char *name, size_t cap)
{
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    int rc = KVT_E_BADREQ;
    *op = LMC_OP_UNKNOWN;
    if (cap)
        name[0] = 0;
    if (lmc_unpack(p, n, &up) == 0) {
        const msgpack_object *o = &up.data;
        int64_t id;
        const char *s;
        size_t sl;
        if (o->type != MSGPACK_OBJECT_BOOLEAN && lmc_get_int(o, &id) == 0) {
            rc = 0;
            for (int i = 1; i < LMC_OP_COUNT; i++)
                if (lmc_ops[i].legacy_id && lmc_ops[i].legacy_id == id)
                    *op = (enum lmc_op)i;
            if (*op == LMC_OP_UNKNOWN && cap)
                snprintf(name, cap, "legacy id %lld", (long long)id);
        } else if (lmc_get_str(o, &s, &sl) == 0) {
            rc = 0;
            for (int i = 1; i < LMC_OP_COUNT; i++)
                if (strlen(lmc_ops[i].name) == sl && memcmp(lmc_ops[i].name, s, sl) == 0)
                    *op = (enum lmc_op)i;
            if (*op == LMC_OP_UNKNOWN && cap) {
                size_t k = 0;
                for (size_t i = 0; i < sl && k + 1 < cap && k < 64; i++)
                    name[k++] = (s[i] >= 0x20 && s[i] < 0x7f) ? s[i] : '?';
                name[k] = 0;
            }
        }
    }
    msgpack_unpacked_destroy(&up);
    return rc;
}

#define WHY(...)                                                                                   \
    do {                                                                                           \
        snprintf(why, cap, __VA_ARGS__);                                                           \
        return KVT_E_BADREQ;                                                                       \
    } while (0)

static int req_uint(const msgpack_object *m, const char *key, uint64_t max, uint64_t *v, char *why,
                    size_t cap)
{
    const msgpack_object *f = kvt_mp_get(m, key);
    int64_t i;
    if (!f)
        WHY("missing field \"%s\"", key);
    if (lmc_get_int(f, &i) || i < 0 || (uint64_t)i > max)
        WHY("field \"%s\" must be an integer in [0, %llu]", key, (unsigned long long)max);
    *v = (uint64_t)i;
    return 0;
}

static int req_str(const msgpack_object *m, const char *key, bool required, const char **s,
                   size_t *n, char *why, size_t cap)
{
    const msgpack_object *f = kvt_mp_get(m, key);
    if (!f) {
        if (required)
            WHY("missing field \"%s\"", key);
        *s = "";
        *n = 0;
        return 0;
    }
    if (lmc_get_str(f, s, n))
        WHY("field \"%s\" must be a string", key);
    return 0;
}

int lmc_key_decode(const msgpack_object *o, struct lmc_key *k, char *why, size_t cap)
{
    memset(k, 0, sizeof(*k));
    if (o->type != MSGPACK_OBJECT_MAP)
        WHY("IPCCacheServerKey must be a map");
    uint64_t v;
    if (req_str(o, "model_name", true, &k->model, &k->model_len, why, cap))
        return KVT_E_BADREQ;
    if (req_uint(o, "world_size", LMC_MAX_WORLD, &v, why, cap))
        return KVT_E_BADREQ;
    if (v == 0)
        WHY("world_size must be at least 1");
    k->world_size = (uint32_t)v;
    const msgpack_object *w = kvt_mp_get(o, "worker_id");
    if (!w)
        WHY("missing field \"worker_id\"");
    if (!lmc_is_nil(w)) {
        int64_t i;
        if (lmc_get_int(w, &i) || i < 0 || i >= (int64_t)k->world_size)
            WHY("worker_id must be None or in [0, world_size)");
        k->has_worker = true;
        k->worker_id = (uint32_t)i;
    }
    if (req_uint(o, "start", UINT32_MAX, &k->start, why, cap) ||
        req_uint(o, "end", UINT32_MAX, &k->end, why, cap))
        return KVT_E_BADREQ;
    if (req_str(o, "request_id", true, &k->rid, &k->rid_len, why, cap))
        return KVT_E_BADREQ;
    if (k->rid_len > LMC_MAX_RID)
        WHY("request_id longer than %u bytes", LMC_MAX_RID);
    if (req_str(o, "cache_salt", false, &k->salt, &k->salt_len, why, cap))
        return KVT_E_BADREQ;
    const msgpack_object *r = kvt_mp_get(o, "num_kv_readers");
    if (r) {
        int64_t i;
        if (lmc_get_int(r, &i) || i < 0 || i > 65535)
            WHY("num_kv_readers must be an integer in [0, 65535]");
        k->num_kv_readers = (uint32_t)i;
    }
    const msgpack_object *t = kvt_mp_get(o, "token_ids");
    if (!t)
        WHY("missing field \"token_ids\"");
    if (t->type != MSGPACK_OBJECT_ARRAY)
        WHY("token_ids must be an array of integers");
    if (t->via.array.size > LMC_MAX_TOKENS)
        WHY("more than %u token ids", LMC_MAX_TOKENS);
    k->ntokens = t->via.array.size;
    k->tokens = malloc((k->ntokens ? k->ntokens : 1) * sizeof(uint32_t));
    if (!k->tokens)
        WHY("out of memory");
    for (size_t i = 0; i < k->ntokens; i++) {
        const msgpack_object *e = &t->via.array.ptr[i];
        if (e->type != MSGPACK_OBJECT_POSITIVE_INTEGER || e->via.u64 > UINT32_MAX) {
            lmc_key_free(k);
            WHY("token id %zu is not an integer in [0, 2^32) (LMCache hashes big-endian uint32)",
                i);
        }
        k->tokens[i] = (uint32_t)e->via.u64;
    }
    return 0;
}

void lmc_key_free(struct lmc_key *k)
{
    free(k->tokens);
    k->tokens = NULL;
    k->ntokens = 0;
}

size_t lmc_dtype_size(const char *n)
{
    static const struct {
        const char *name;
        size_t size;
    } t[] = {
        {"float16", 2},       {"half", 2},        {"bfloat16", 2},        {"float32", 4},
        {"float", 4},         {"float64", 8},     {"double", 8},          {"uint8", 1},
        {"int8", 1},          {"int16", 2},       {"int32", 4},           {"int64", 8},
        {"float8_e4m3fn", 1}, {"float8_e5m2", 1}, {"float8_e4m3fnuz", 1}, {"float8_e5m2fnuz", 1},
    };
    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++)
        if (strcmp(t[i].name, n) == 0)
            return t[i].size;
    return 0;
}

int lmc_register_decode(const msgpack_object *o, struct lmc_register *r, char *why, size_t cap)
{
    memset(r, 0, sizeof(*r));
    if (o->type != MSGPACK_OBJECT_MAP)
        WHY("RegisterEngineDrivenContextPayload must be a map");
    const msgpack_object *f = kvt_mp_get(o, "instance_id");
    if (!f || lmc_get_int(f, &r->instance_id))
        WHY("field \"instance_id\" must be an integer");
    uint64_t v;
    if (req_str(o, "model_name", true, &r->model, &r->model_len, why, cap))
        return KVT_E_BADREQ;
    if (req_uint(o, "world_size", LMC_MAX_WORLD, &v, why, cap))
        return KVT_E_BADREQ;
    r->world_size = (uint32_t)v;
    if (req_uint(o, "block_size", 1u << 20, &v, why, cap))
        return KVT_E_BADREQ;
    r->block_size = (uint32_t)v;
    if (req_uint(o, "num_layers", 1u << 16, &v, why, cap))
        return KVT_E_BADREQ;
    r->num_layers = (uint32_t)v;
    if (req_uint(o, "hidden_dim_size", 1u << 24, &v, why, cap))
        return KVT_E_BADREQ;
    r->hidden_dim = (uint32_t)v;
    if (!r->world_size || !r->block_size || !r->num_layers || !r->hidden_dim)
        WHY("world_size, block_size, num_layers and hidden_dim_size must be positive");
    const char *d;
    size_t dl;
    if (req_str(o, "dtype_str", true, &d, &dl, why, cap))
        return KVT_E_BADREQ;
    if (dl >= sizeof(r->dtype) || memchr(d, 0, dl))
        WHY("invalid dtype_str");
    memcpy(r->dtype, d, dl);
    r->dtype[dl] = 0;
    if (!lmc_dtype_size(r->dtype))
        WHY("invalid dtype_str '%s': must be a torch dtype name (e.g. 'float16', 'bfloat16', "
            "'float32')",
            r->dtype);
    f = kvt_mp_get(o, "use_mla");
    if (!f || f->type != MSGPACK_OBJECT_BOOLEAN)
        WHY("field \"use_mla\" must be a bool");
    r->use_mla = f->via.boolean;
    f = kvt_mp_get(o, "num_physical_slots");
    if (f && !lmc_is_nil(f)) {
        int64_t i;
        if (lmc_get_int(f, &i) || i <= 0 || i > (1 << 24))
            WHY("num_physical_slots must be positive, got a bad value");
        r->num_physical_slots = (uint32_t)i;
    }
    return 0;
}
