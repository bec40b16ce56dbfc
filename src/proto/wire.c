#include "proto/wire.h"
#include "common/util.h"
#include "kvtier/error.h"

#include <math.h>
#include <string.h>

const msgpack_object *kvt_mp_get(const msgpack_object *m, const char *key)
{
    if (!m || m->type != MSGPACK_OBJECT_MAP)
        return NULL;
    size_t kl = strlen(key);
    for (uint32_t i = 0; i < m->via.map.size; i++) {
        const msgpack_object *k = &m->via.map.ptr[i].key;
        if (k->type == MSGPACK_OBJECT_STR && k->via.str.size == kl &&
            memcmp(k->via.str.ptr, key, kl) == 0)
            return &m->via.map.ptr[i].val;
    }
    return NULL;
}

static int bad(const char **why, const char *w)
{
    if (why)
        *why = w;
    return KVT_E_BADREQ;
}

int kvt_mp_u64(const msgpack_object *m, const char *key, bool required, uint64_t *out,
               const char **why)
{
    const msgpack_object *v = kvt_mp_get(m, key);
    if (!v || v->type == MSGPACK_OBJECT_NIL)
        return required ? bad(why, "a required integer field is missing") : 0;
    if (v->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
        return bad(why, "an integer field has the wrong type or is negative");
    *out = v->via.u64;
    return 0;
}

int kvt_mp_str(const msgpack_object *m, const char *key, bool required, const char **s,
               size_t *len, const char **why)
{
    const msgpack_object *v = kvt_mp_get(m, key);
    if (!v || v->type == MSGPACK_OBJECT_NIL)
        return required ? bad(why, "a required string field is missing") : 0;
    if (v->type != MSGPACK_OBJECT_STR)
        return bad(why, "a string field has the wrong type");
    *s = v->via.str.ptr;
    *len = v->via.str.size;
    return 0;
}

int kvt_mp_bool(const msgpack_object *m, const char *key, bool *out, const char **why)
{
    const msgpack_object *v = kvt_mp_get(m, key);
    if (!v || v->type == MSGPACK_OBJECT_NIL)
        return 0;
    if (v->type != MSGPACK_OBJECT_BOOLEAN)
        return bad(why, "a boolean field has the wrong type");
    *out = v->via.boolean;
    return 0;
}

int kvt_wire_keys_decode(const msgpack_object *body, kvt_key **keys_out, uint32_t *n_out,
                         const char **why)
{
    const msgpack_object *k = kvt_mp_get(body, "keys");
    if (!k || k->type != MSGPACK_OBJECT_MAP)
        return bad(why, "\"keys\" must be a map {model, kv_rank, group, salt, hashes}");
    const char *model = NULL, *salt = "";
    size_t ml = 0, sl = 0;
    uint64_t rank = 0, group = 0;
    int rc;
    if ((rc = kvt_mp_str(k, "model", true, &model, &ml, why)) ||
        (rc = kvt_mp_str(k, "salt", false, &salt, &sl, why)) ||
        (rc = kvt_mp_u64(k, "kv_rank", false, &rank, why)) ||
        (rc = kvt_mp_u64(k, "group", false, &group, why)))
        return rc;
    if (rank > UINT32_MAX || group > UINT32_MAX)
        return bad(why, "kv_rank and group must fit in 32 bits");
    const msgpack_object *hs = kvt_mp_get(k, "hashes");
    if (!hs || hs->type != MSGPACK_OBJECT_ARRAY)
        return bad(why, "\"keys.hashes\" must be an array of bin");
    uint32_t n = hs->via.array.size;
    if (n > KVT_MAX_BATCH)
        return bad(why, "too many keys in one request (max 65536)");
    uint32_t ns;
    const char *w2 = NULL;
    rc = kvt_ns_intern(model, ml, salt, sl, &ns, &w2);
    if (rc) {
        if (why)
            *why = w2;
        return rc;
    }
    kvt_key *keys = kvt_xmalloc((n ? n : 1) * sizeof(kvt_key));
    for (uint32_t i = 0; i < n; i++) {
        const msgpack_object *h = &hs->via.array.ptr[i];
        if (h->type != MSGPACK_OBJECT_BIN && h->type != MSGPACK_OBJECT_STR) {
            free(keys);
            return bad(why, "each hash must be bin");
        }
        if (kvt_key_make(&keys[i], ns, (const uint8_t *)h->via.bin.ptr, h->via.bin.size,
                         (uint32_t)rank, (uint32_t)group)) {
            free(keys);
            if (why)
                *why = "each hash must be 1..32 bytes";
            return KVT_E_BADKEY;
        }
    }
    *keys_out = keys;
    *n_out = n;
    return 0;
}

void kvt_mp_str0(msgpack_packer *pk, const char *s)
{
    size_t l = strlen(s);
    msgpack_pack_str(pk, l);
    msgpack_pack_str_body(pk, s, l);
}

void kvt_wire_keys_encode(msgpack_packer *pk, const char *model, uint32_t kv_rank,
                          uint32_t group, const char *salt, const uint8_t *hashes,
                          size_t hash_len, uint32_t n)
{
    msgpack_pack_map(pk, 5);
    kvt_mp_str0(pk, "model");
    kvt_mp_str0(pk, model);
    kvt_mp_str0(pk, "kv_rank");
    msgpack_pack_uint32(pk, kv_rank);
    kvt_mp_str0(pk, "group");
    msgpack_pack_uint32(pk, group);
    kvt_mp_str0(pk, "salt");
    kvt_mp_str0(pk, salt ? salt : "");
    kvt_mp_str0(pk, "hashes");
    msgpack_pack_array(pk, n);
    for (uint32_t i = 0; i < n; i++) {
        msgpack_pack_bin(pk, hash_len);
        msgpack_pack_bin_body(pk, hashes + i * hash_len, hash_len);
    }
}

void kvt_mp_pack_json(msgpack_packer *pk, const json_t *j)
{
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        msgpack_pack_map(pk, json_object_size(j));
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)j, k, v)
        {
            kvt_mp_str0(pk, k);
            kvt_mp_pack_json(pk, v);
        }
        break;
    }
    case JSON_ARRAY: {
        msgpack_pack_array(pk, json_array_size(j));
        size_t i;
        json_t *v;
        json_array_foreach(j, i, v) kvt_mp_pack_json(pk, v);
        break;
    }
    case JSON_STRING:
        msgpack_pack_str(pk, json_string_length(j));
        msgpack_pack_str_body(pk, json_string_value(j), json_string_length(j));
        break;
    case JSON_INTEGER:
        msgpack_pack_int64(pk, json_integer_value(j));
        break;
    case JSON_REAL:
        msgpack_pack_double(pk, json_real_value(j));
        break;
    case JSON_TRUE:
        msgpack_pack_true(pk);
        break;
    case JSON_FALSE:
        msgpack_pack_false(pk);
        break;
    default:
        msgpack_pack_nil(pk);
    }
}

json_t *kvt_mp_to_json(const msgpack_object *o)
{
    switch (o->type) {
    case MSGPACK_OBJECT_NIL:
        return json_null();
    case MSGPACK_OBJECT_BOOLEAN:
        return json_boolean(o->via.boolean);
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        return json_integer((json_int_t)o->via.u64);
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        return json_integer((json_int_t)o->via.i64);
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        return isfinite(o->via.f64) ? json_real(o->via.f64) : json_null();
    case MSGPACK_OBJECT_STR:
        return json_stringn_nocheck(o->via.str.ptr, o->via.str.size);
    case MSGPACK_OBJECT_BIN: {
        char *hex = kvt_xmalloc(o->via.bin.size * 2 + 1);
        kvt_hex((const uint8_t *)o->via.bin.ptr, o->via.bin.size, hex);
        json_t *s = json_string(hex);
        free(hex);
        return s;
    }
    case MSGPACK_OBJECT_ARRAY: {
        json_t *a = json_array();
        for (uint32_t i = 0; i < o->via.array.size; i++)
            json_array_append_new(a, kvt_mp_to_json(&o->via.array.ptr[i]));
        return a;
    }
    case MSGPACK_OBJECT_MAP: {
        json_t *m = json_object();
        for (uint32_t i = 0; i < o->via.map.size; i++) {
            const msgpack_object *k = &o->via.map.ptr[i].key;
            if (k->type != MSGPACK_OBJECT_STR)
                continue;
            char *ks = kvt_xmalloc(k->via.str.size + 1);
            memcpy(ks, k->via.str.ptr, k->via.str.size);
            ks[k->via.str.size] = 0;
            json_object_set_new(m, ks, kvt_mp_to_json(&o->via.map.ptr[i].val));
            free(ks);
        }
        return m;
    }
    default:
        return json_null();
    }
}
