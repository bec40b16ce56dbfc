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

int kvt_mp_str(const msgpack_object *m, const char *key, bool required, const char **s, size_t *len,
               const char **why)
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
        if (h->type != MSGPACK_OBJECT_BIN) { /* a str is text, not a hash */
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

void kvt_wire_keys_encode(msgpack_packer *pk, const char *model, uint32_t kv_rank, uint32_t group,
                          const char *salt, const uint8_t *hashes, size_t hash_len, uint32_t n)
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
        return json_stringn_nocheck(o->via.str.size ? o->via.str.ptr : "", o->via.str.size);
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
            if (k->via.str.size) /* an empty str may carry a NULL pointer */
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

#define BAD_SHAPE "shape must be an array of at most 6 integers from 0 to 2^32-1"

int kvt_wire_meta_decode(const msgpack_object *body, kvt_objmeta *m, const char **why)
{
    memset(m, 0, sizeof(*m));
    const char *dt = NULL;
    size_t dl = 0;
    int rc = kvt_mp_str(body, "dtype", false, &dt, &dl, why);
    if (rc)
        return rc;
    if (dt) {
        char buf[32];
        if (dl >= sizeof(buf)) {
            *why = "unknown dtype";
            return KVT_E_BADREQ;
        }
        memcpy(buf, dt, dl);
        buf[dl] = 0;
        int d = kvt_dtype_parse(buf);
        if (d < 0) {
            *why = "unknown dtype (raw, float16, bfloat16, float32, float8_e4m3, uint8)";
            return KVT_E_BADREQ;
        }
        m->dtype = (uint16_t)d;
    }
    const msgpack_object *sh = kvt_mp_get(body, "shape");
    if (sh && sh->type != MSGPACK_OBJECT_NIL) {
        if (sh->type != MSGPACK_OBJECT_ARRAY || sh->via.array.size > KVT_MAX_DIMS) {
            *why = BAD_SHAPE;
            return KVT_E_BADREQ;
        }
        for (uint32_t d = 0; d < sh->via.array.size; d++) {
            const msgpack_object *v = &sh->via.array.ptr[d];
            if (v->type != MSGPACK_OBJECT_POSITIVE_INTEGER || v->via.u64 > UINT32_MAX) {
                *why = BAD_SHAPE;
                return KVT_E_BADREQ;
            }
            m->shape[d] = (uint32_t)v->via.u64;
        }
        m->ndim = (uint8_t)sh->via.array.size;
    }
    return 0;
}

/*
 * Walk msgpack bytes without decoding them and check that every declared
 * array/map/str/bin length fits in what is left, with nesting <= 32. msgpack-c
 * allocates arrays from their declared size before reading the elements, so a
 * 10-byte body declaring 2^32 elements would make it ask for ~100 GB: this
 * bounds every allocation by the body's own size first.
 */
static int mp_precheck(const uint8_t *p, size_t len)
{
    uint64_t need[33]; /* elements still expected at each depth */
    int depth = 0;
    need[0] = 1;
    size_t i = 0;
    while (depth >= 0) {
        if (need[depth] == 0) {
            depth--;
            continue;
        }
        need[depth]--;
        if (i >= len)
            return -1;
        uint8_t b = p[i++];
        uint64_t skip = 0, children = 0;
        size_t hdr = 0;
        if (b <= 0x7f || b >= 0xe0 || (b >= 0xc0 && b <= 0xc3)) {
        } else if (b >= 0x80 && b <= 0x8f) {
            children = 2u * (b & 0x0f);
        } else if (b >= 0x90 && b <= 0x9f) {
            children = b & 0x0f;
        } else if (b >= 0xa0 && b <= 0xbf) {
            skip = b & 0x1f;
        } else {
            switch (b) {
            case 0xcc:
            case 0xd0:
                skip = 1;
                break;
            case 0xcd:
            case 0xd1:
                skip = 2;
                break;
            case 0xca:
            case 0xce:
            case 0xd2:
                skip = 4;
                break;
            case 0xcb:
            case 0xcf:
            case 0xd3:
                skip = 8;
                break;
            case 0xd4:
                skip = 2;
                break;
            case 0xd5:
                skip = 3;
                break;
            case 0xd6:
                skip = 5;
                break;
            case 0xd7:
                skip = 9;
                break;
            case 0xd8:
                skip = 17;
                break;
            case 0xc4:
            case 0xd9:
                hdr = 1;
                break;
            case 0xc5:
            case 0xda:
            case 0xdc:
            case 0xde:
                hdr = 2;
                break;
            case 0xc6:
            case 0xdb:
            case 0xdd:
            case 0xdf:
                hdr = 4;
                break;
            case 0xc7:
                hdr = 1;
                break;
            case 0xc8:
                hdr = 2;
                break;
            case 0xc9:
                hdr = 4;
                break;
            default:
                return -1;
            }
            if (hdr) {
                if (len - i < hdr)
                    return -1;
                uint64_t n = 0;
                for (size_t k = 0; k < hdr; k++)
                    n = n << 8 | p[i + k];
                i += hdr;
                if (b == 0xdc || b == 0xdd)
                    children = n;
                else if (b == 0xde || b == 0xdf)
                    children = 2 * n;
                else if (b >= 0xc7 && b <= 0xc9)
                    skip = n + 1; /* ext: type byte + data */
                else
                    skip = n;
            }
        }
        if (skip > len - i)
            return -1;
        i += skip;
        if (children) {
            if (children > len - i || depth == 32)
                return -1; /* every element needs at least one byte */
            need[++depth] = children;
        }
    }
    return i == len ? 0 : -1;
}

int kvt_wire_body_decode(const void *data, size_t len, msgpack_unpacked *up, const char **why)
{
    if (len == 0) {
        msgpack_unpacked_destroy(up);
        msgpack_unpacked_init(up);
        up->data.type = MSGPACK_OBJECT_MAP;
        up->data.via.map.size = 0;
        up->data.via.map.ptr = NULL;
        return 0;
    }
    if (len > KVT_MAX_BODY)
        return bad(why, "body larger than 16 MiB");
    if (mp_precheck(data, len))
        return bad(why, "body is not valid msgpack (truncated, or a length beyond the body)");
    size_t off = 0;
    msgpack_unpack_return ur = msgpack_unpack_next(up, data, len, &off);
    if (ur != MSGPACK_UNPACK_SUCCESS || off != len)
        return bad(why, "body is not valid msgpack (truncated?)");
    if (up->data.type != MSGPACK_OBJECT_MAP)
        return bad(why, "body must be a msgpack map");
    return 0;
}

int kvt_wire_precheck(const void *data, size_t len)
{
    return mp_precheck(data, len);
}
