/*
 * LMCache multi-process (MP) wire protocol, pinned to lmcache 0.5.6: the
 * decoder used by the LMCache front end (src/front/lmcache/). No I/O here, so
 * the libFuzzer target (fuzz/fuzz_lmcache.c) runs it on arbitrary bytes.
 *
 * Request, as the client's DEALER sends it (the ROUTER prepends the peer id):
 *   [msgpack int: request uid][msgpack int (legacy id) or str: operation]
 *   [one msgpack document per argument, in the RequestClient signature order]
 * Reply: [uid frame][operation frame][msgpack result], the result frame left
 * out when the result is None. Payloads are msgspec msgpack: dataclasses and
 * Structs as maps keyed by field name. docs/lmcache-protocol.md has the table.
 */
#ifndef KVT_LMC_WIRE_H
#define KVT_LMC_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <msgpack.h>

enum lmc_op {
    LMC_OP_UNKNOWN = 0,
    LMC_REGISTER_KV_CACHE,
    LMC_UNREGISTER_KV_CACHE,
    LMC_REGISTER_Q_CACHE,
    LMC_UNREGISTER_Q_CACHE,
    LMC_STORE_Q,
    LMC_STORE,
    LMC_RETRIEVE,
    LMC_LOOKUP,
    LMC_QUERY_PREFETCH_STATUS,
    LMC_WAIT_PREFETCH_STATUS,
    LMC_FREE_LOOKUP_LOCKS,
    LMC_END_SESSION,
    LMC_REGISTER_ED_CONTEXT,
    LMC_UNREGISTER_ED_CONTEXT,
    LMC_PREPARE_STORE,
    LMC_COMMIT_STORE,
    LMC_PREPARE_RETRIEVE,
    LMC_COMMIT_RETRIEVE,
    LMC_CLEAR,
    LMC_GET_CHUNK_SIZE,
    LMC_PING,
    LMC_REPORT_BLOCK_ALLOCATION,
    LMC_NOOP,
    LMC_CB_REGISTER_ROPE,
    LMC_CB_UNREGISTER_ROPE,
    LMC_CB_RETRIEVE_PRE_COMPUTED,
    LMC_CB_UNIFIED_LOOKUP,
    LMC_P2P_LOOKUP_AND_LOCK,
    LMC_P2P_QUERY_LOOKUP_RESULTS,
    LMC_P2P_UNLOCK_OBJECTS,
    LMC_GET_EXPERIMENTAL,
    LMC_CB_PROTOCOL_HANDSHAKE,
    LMC_CB_REORDER_PLAN,
    LMC_SUBSCRIBE_KV_EVENTS,
    LMC_SERVER_MODULE_CALL,
    LMC_OP_COUNT
};

struct lmc_opinfo {
    const char *name; /* the RPC name (string form on the wire) */
    int legacy_id;    /* frozen integer id, or 0 when the op has none */
    int nargs;        /* payload frames the client sends */
};
extern const struct lmc_opinfo lmc_ops[LMC_OP_COUNT];

/* Decode the operation frame: a legacy integer id or a string name.
 * Returns 0 and *op (LMC_OP_UNKNOWN for a well-formed but unknown one, with
 * its text in name), or KVT_E_BADREQ when the frame is not a msgpack int or
 * str. Every decoder here returns 0 or KVT_E_BADREQ. */
int lmc_decode_op(const void *p, size_t n, enum lmc_op *op, char *name, size_t cap);

#define LMC_MAX_PAYLOAD (64u << 20)
/* One payload frame: exactly one msgpack document, nothing after it, no
 * declared length beyond the frame, at most LMC_MAX_PAYLOAD bytes. */
int lmc_unpack(const void *p, size_t n, msgpack_unpacked *up);

/* IPCCacheServerKey. Strings point into the unpacked payload. */
struct lmc_key {
    const char *model;
    size_t model_len;
    uint32_t world_size;
    bool has_worker;
    uint32_t worker_id;
    uint32_t *tokens; /* malloc'd */
    size_t ntokens;
    uint64_t start, end;
    const char *rid;
    size_t rid_len;
    const char *salt;
    size_t salt_len;
    uint32_t num_kv_readers; /* 0 = not sent */
};
#define LMC_MAX_TOKENS (1u << 22)
#define LMC_MAX_WORLD 255 /* kv_rank keeps the world size in 8 bits */
#define LMC_MAX_RID 256

/* 0, or KVT_E_BADREQ with why (a message for the client). */
int lmc_key_decode(const msgpack_object *o, struct lmc_key *k, char *why, size_t cap);
void lmc_key_free(struct lmc_key *k);

/* RegisterEngineDrivenContextPayload */
struct lmc_register {
    int64_t instance_id;
    const char *model;
    size_t model_len;
    uint32_t world_size, block_size, num_layers, hidden_dim;
    char dtype[32];
    bool use_mla;
    uint32_t num_physical_slots; /* 0 = None (legacy: one slot per token) */
};
int lmc_register_decode(const msgpack_object *o, struct lmc_register *r, char *why, size_t cap);

/* Scalars: int (msgspec int() coercion: bool is accepted as 0/1), float
 * (int or float), bool, str, bin, nil. */
int lmc_get_int(const msgpack_object *o, int64_t *v);
int lmc_get_float(const msgpack_object *o, double *v);
bool lmc_is_nil(const msgpack_object *o);
int lmc_get_str(const msgpack_object *o, const char **s, size_t *n);

/* torch dtype name -> element size (0 = unknown) */
size_t lmc_dtype_size(const char *name);

/* LMCache's kv_rank: ComputeKVRank(ws, w, ws, w). */
static inline uint32_t lmc_kv_rank(uint32_t ws, uint32_t w)
{
    return (ws << 24) | (w << 16) | (ws << 8) | w;
}

#endif
