#include "key/key.h"
#include "common/log.h"
#include "common/util.h"
#include "kvtier/error.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

/* ---------------------------------------------------------------------
 * Namespace table.
 *
 * ids index a two-level array of records: chunk = id >> 10, slot = id & 1023.
 * Chunks are allocated once and never moved, so readers index without a
 * lock. A writer fills the record, then publishes the chunk pointer and the
 * count with release stores; readers load them with acquire.
 * Interning looks names up in an open-addressing table of ids under ns_lock.
 * ------------------------------------------------------------------- */

struct ns_rec {
    char *model;
    char *salt;
    char *name;    /* namespace name: the model as the nixl codec writes it */
    uint64_t hash; /* of model + '\0' + salt */
};

#define NS_CHUNK 1024u
static _Atomic(struct ns_rec *) ns_chunks[KVT_NS_MAX / NS_CHUNK];
static _Atomic uint32_t ns_next = 1; /* 0 is reserved as "no namespace" */
static pthread_mutex_t ns_lock = PTHREAD_MUTEX_INITIALIZER;
static uint32_t *ns_table;  /* guarded by ns_lock: open addressing of ids */
static size_t ns_table_cap; /* guarded by ns_lock: power of two */

static struct ns_rec *ns_get(uint32_t id)
{
    if (id == 0 || id >= atomic_load_explicit(&ns_next, memory_order_acquire))
        return NULL;
    struct ns_rec *c = atomic_load_explicit(&ns_chunks[id / NS_CHUNK], memory_order_acquire);
    return c ? &c[id % NS_CHUNK] : NULL;
}

/* Record of an id already allocated (call with ns_lock held). */
static struct ns_rec *ns_get_any(uint32_t id)
{
    struct ns_rec *c = atomic_load_explicit(&ns_chunks[id / NS_CHUNK], memory_order_relaxed);
    return &c[id % NS_CHUNK];
}

static uint64_t ns_hash(const char *m, size_t ml, const char *s, size_t sl)
{
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    XXH3_64bits_update(&st, m, ml);
    XXH3_64bits_update(&st, "", 1);
    XXH3_64bits_update(&st, s, sl);
    return XXH3_64bits_digest(&st);
}

static int has_component(const char *m, size_t len, const char *comp)
{
    size_t cl = strlen(comp), start = 0;
    for (size_t i = 0; i <= len; i++) {
        if (i == len || m[i] == '/') {
            if (i - start == cl && memcmp(m + start, comp, cl) == 0)
                return 1;
            start = i + 1;
        }
    }
    return 0;
}

int kvt_validate_model(const char *model, size_t len, const char **why)
{
    const char *w = NULL;
    if (len == 0)
        w = "model name is empty";
    else if (len > KVT_MODEL_MAX)
        w = "model name longer than 128 bytes (max_model_bytes)";
    else if (memchr(model, '@', len))
        w = "model name contains '@'";
    else if (has_component(model, len, "..") || has_component(model, len, "."))
        w = "model name has a '.' or '..' path component";
    else
        for (size_t i = 0; i < len; i++)
            if ((unsigned char)model[i] < 0x20 || model[i] == 0x7f) {
                w = "model name contains a NUL or control character";
                break;
            }
    if (why)
        *why = w;
    return w ? KVT_E_BADKEY : 0;
}

int kvt_validate_salt(const char *salt, size_t len, const char **why)
{
    const char *w = NULL;
    if (len > KVT_SALT_MAX)
        w = "cache salt longer than 128 bytes (max_salt_bytes)";
    else
        for (size_t i = 0; i < len; i++) {
            unsigned char c = (unsigned char)salt[i];
            if (c == '@' || c == '/' || c == '\\') {
                w = "cache salt contains '@', '/' or '\\'";
                break;
            }
            if (c < 0x20 || c == 0x7f) {
                w = "cache salt contains a NUL or control character";
                break;
            }
        }
    if (why)
        *why = w;
    return w ? KVT_E_BADKEY : 0;
}

/* ------------------------------------------------------------------
 * Model escaping (key.h: "file-name codecs"). The fs/obj codecs write '/'
 * as "-SEP-", the nixl codec as "--"; '%' is the escape character. Tokens:
 *   '%'                      -> "%25"
 *   '/'                      -> the codec's separator
 *   '-' that would read as the start of a separator together with what
 *       follows it (fs/obj: '-' followed by "SEP-" or "SEP/";
 *       nixl: '-' followed by '-' or '/')       -> "%2D"
 *   any other byte           -> itself
 * A decoder reading left to right ("%XX", then the separator, else one
 * literal byte) meets a literal '-' only where the next output bytes cannot
 * complete a separator, so it recovers the tokens and the model exactly:
 * the encoding is injective, and names of models without '%' or those '-'
 * sequences are LMCache's names byte for byte.
 * ---------------------------------------------------------------- */

static bool dash_escaped(enum kvt_codec c, const char *m, size_t ml, size_t i)
{
    if (m[i] != '-')
        return false;
    if (c == KVT_CODEC_NIXL)
        return i + 1 < ml && (m[i + 1] == '-' || m[i + 1] == '/');
    return i + 4 < ml && memcmp(m + i + 1, "SEP", 3) == 0 && (m[i + 4] == '-' || m[i + 4] == '/');
}

/* Encode a model for codec c into out (NULL: only count); returns the length. */
static size_t enc_model(enum kvt_codec c, const char *m, size_t ml, char *out)
{
    const char *sep = c == KVT_CODEC_NIXL ? "--" : "-SEP-";
    size_t sl = strlen(sep), n = 0;
    for (size_t i = 0; i < ml; i++) {
        const char *t;
        size_t tl;
        char one = m[i];
        if (m[i] == '%')
            t = "%25", tl = 3;
        else if (m[i] == '/')
            t = sep, tl = sl;
        else if (dash_escaped(c, m, ml, i))
            t = "%2D", tl = 3;
        else
            t = &one, tl = 1;
        if (out)
            memcpy(out + n, t, tl);
        n += tl;
    }
    return n;
}

static int hexdig_upper(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* Decode an encoded model into out (room for n bytes); returns its length,
 * or -1 on a malformed escape. Whether the input is the canonical encoding
 * is for the caller to check (encode again and compare). */
static long dec_model(enum kvt_codec c, const char *s, size_t n, char *out)
{
    const char *sep = c == KVT_CODEC_NIXL ? "--" : "-SEP-";
    size_t sl = strlen(sep), o = 0;
    for (size_t i = 0; i < n;) {
        if (s[i] == '%') {
            int hi = i + 2 < n ? hexdig_upper(s[i + 1]) : -1;
            int lo = hi >= 0 ? hexdig_upper(s[i + 2]) : -1;
            if (lo < 0)
                return -1;
            out[o++] = (char)(hi << 4 | lo);
            i += 3;
        } else if (i + sl <= n && memcmp(s + i, sep, sl) == 0) {
            out[o++] = '/';
            i += sl;
        } else {
            out[o++] = s[i++];
        }
    }
    return (long)o;
}

/* Fixed part of the longest name of each codec (32-byte hash, 8-digit
 * group): fs "@0x%08x@%8x@<64 hex>" + ".data", nixl "_%08x_%8x_<64 hex>" +
 * ".bin". The obj codec is the fs name without ".data". */
#define FS_FIXED (1 + 10 + 1 + 8 + 1 + 2 * KVT_HASH_MAX + 5)
#define NIXL_FIXED (1 + 8 + 1 + 8 + 1 + 2 * KVT_HASH_MAX + 4)

size_t kvt_name_bytes(const char *model, size_t ml, size_t sl)
{
    size_t s = sl ? 1 + sl : 0;
    size_t fs = enc_model(KVT_CODEC_FS, model, ml, NULL) + FS_FIXED + s;
    size_t nx = enc_model(KVT_CODEC_NIXL, model, ml, NULL) + NIXL_FIXED + s;
    return fs > nx ? fs : nx;
}

int kvt_ns_name_of(const char *model, size_t ml, char *out, size_t cap)
{
    size_t n = enc_model(KVT_CODEC_NIXL, model, ml, NULL);
    if (n >= cap)
        return -1;
    enc_model(KVT_CODEC_NIXL, model, ml, out);
    out[n] = 0;
    return (int)n;
}

int kvt_ns_name_model(const char *name, size_t len, char *model, size_t cap)
{
    if (len == 0 || len > KVT_NAME_MAX || cap < len + 1)
        return -1;
    long ml = dec_model(KVT_CODEC_NIXL, name, len, model);
    if (ml <= 0 || kvt_validate_model(model, (size_t)ml, NULL))
        return -1;
    char again[KVT_NAME_MAX + 1];
    if (enc_model(KVT_CODEC_NIXL, model, (size_t)ml, NULL) != len)
        return -1;
    enc_model(KVT_CODEC_NIXL, model, (size_t)ml, again);
    if (memcmp(again, name, len) != 0)
        return -1;
    model[ml] = 0;
    return (int)ml;
}

static char *dup_n(const char *s, size_t n)
{
    char *d = kvt_xmalloc(n + 1);
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

static void table_insert_locked(uint32_t id, uint64_t h)
{
    size_t mask = ns_table_cap - 1, i = h & mask;
    while (ns_table[i])
        i = (i + 1) & mask;
    ns_table[i] = id;
}

/* call with ns_lock held */
static void table_grow_locked(void)
{
    size_t ncap = ns_table_cap ? ns_table_cap * 2 : 1024;
    uint32_t *old = ns_table;
    size_t ocap = ns_table_cap;
    ns_table = kvt_xcalloc(ncap, sizeof(uint32_t));
    ns_table_cap = ncap;
    for (size_t i = 0; i < ocap; i++)
        if (old[i])
            table_insert_locked(old[i], ns_get_any(old[i])->hash);
    free(old);
}

int kvt_ns_intern(const char *model, size_t ml, const char *salt, size_t sl, uint32_t *ns,
                  const char **why)
{
    /* empty strings decoded from the wire may come with NULL pointers */
    if (!model)
        model = "", ml = 0;
    if (!salt)
        salt = "", sl = 0;
    int rc = kvt_validate_model(model, ml, why);
    if (rc == 0)
        rc = kvt_validate_salt(salt, sl, why);
    if (rc)
        return rc;
    size_t nb = kvt_name_bytes(model, ml, sl);
    if (nb > KVT_NAME_MAX) {
        /* thread-local: the caller copies it into its reply before interning again */
        static _Thread_local char msg[160];
        snprintf(msg, sizeof(msg),
                 "model and cache salt too long together: their object name would be %zu "
                 "bytes, more than %d (max_name_bytes)",
                 nb, KVT_NAME_MAX);
        if (why)
            *why = msg;
        return KVT_E_BADKEY;
    }
    uint64_t h = ns_hash(model, ml, salt, sl);
    pthread_mutex_lock(&ns_lock);
    if (ns_table_cap) {
        size_t mask = ns_table_cap - 1;
        for (size_t i = h & mask; ns_table[i]; i = (i + 1) & mask) {
            struct ns_rec *r = ns_get(ns_table[i]);
            if (r->hash == h && strlen(r->model) == ml && memcmp(r->model, model, ml) == 0 &&
                strlen(r->salt) == sl && memcmp(r->salt, salt, sl) == 0) {
                *ns = ns_table[i];
                pthread_mutex_unlock(&ns_lock);
                return 0;
            }
        }
    }
    uint32_t id = atomic_load_explicit(&ns_next, memory_order_relaxed);
    if (id >= KVT_NS_MAX) {
        pthread_mutex_unlock(&ns_lock);
        if (why)
            *why = "too many distinct (model, salt) namespaces";
        return KVT_E_LIMIT;
    }
    struct ns_rec *chunk = atomic_load_explicit(&ns_chunks[id / NS_CHUNK], memory_order_relaxed);
    if (!chunk) {
        chunk = kvt_xcalloc(NS_CHUNK, sizeof(struct ns_rec));
        /* release: the zeroed chunk is visible before any id in it */
        atomic_store_explicit(&ns_chunks[id / NS_CHUNK], chunk, memory_order_release);
    }
    struct ns_rec *r = &chunk[id % NS_CHUNK];
    r->model = dup_n(model, ml);
    r->salt = dup_n(salt, sl);
    r->name = kvt_xmalloc(enc_model(KVT_CODEC_NIXL, model, ml, NULL) + 1);
    r->name[enc_model(KVT_CODEC_NIXL, model, ml, r->name)] = 0;
    r->hash = h;
    /* release: the record's fields are written before the id becomes valid */
    atomic_store_explicit(&ns_next, id + 1, memory_order_release);
    if ((id + 1) * 2 > ns_table_cap)
        table_grow_locked(); /* rehashes ids below id */
    table_insert_locked(id, h);
    pthread_mutex_unlock(&ns_lock);
    *ns = id;
    return 0;
}

const char *kvt_ns_model(uint32_t ns)
{
    struct ns_rec *r = ns_get(ns);
    return r ? r->model : "";
}

const char *kvt_ns_salt(uint32_t ns)
{
    struct ns_rec *r = ns_get(ns);
    return r ? r->salt : "";
}

const char *kvt_ns_name(uint32_t ns)
{
    struct ns_rec *r = ns_get(ns);
    return r ? r->name : "";
}

uint32_t kvt_ns_count(void)
{
    return atomic_load_explicit(&ns_next, memory_order_acquire) - 1;
}

/* ---------------------------------------------------------------- keys */

int kvt_key_make(kvt_key *k, uint32_t ns, const uint8_t *hash, size_t hash_len, uint32_t kv_rank,
                 uint32_t group)
{
    if (hash_len == 0 || hash_len > KVT_HASH_MAX || !ns_get(ns))
        return KVT_E_BADKEY;
    memset(k, 0, sizeof(*k));
    memcpy(k->hash, hash, hash_len);
    k->hash_len = (uint8_t)hash_len;
    k->kv_rank = kv_rank;
    k->group = group;
    k->ns = ns;
    return 0;
}

uint64_t kvt_key_hash(const kvt_key *k)
{
    return XXH3_64bits(k, sizeof(*k));
}

char *kvt_key_str(const kvt_key *k, char *out, size_t cap)
{
    char hex[2 * KVT_HASH_MAX + 1];
    kvt_hex(k->hash, k->hash_len, hex);
    const char *salt = kvt_ns_salt(k->ns);
    snprintf(out, cap, "%s@0x%08x@%x@%s%s%s", kvt_ns_model(k->ns), k->kv_rank, k->group, hex,
             *salt ? "@" : "", salt);
    return out;
}

/* -------------------------------------------------------------- codecs */

int kvt_key_encode(enum kvt_codec codec, const kvt_key *k, char *out)
{
    char buf[1024];
    char hex[2 * KVT_HASH_MAX + 1];
    const char *model = kvt_ns_model(k->ns), *salt = kvt_ns_salt(k->ns);
    size_t ml = strlen(model);
    if (ml * 5 + strlen(salt) + 200 > sizeof(buf))
        return KVT_E_BADKEY;
    kvt_hex(k->hash, k->hash_len, hex);
    size_t n = enc_model(codec, model, ml, buf);
    int m;
    if (codec == KVT_CODEC_NIXL)
        m = snprintf(buf + n, sizeof(buf) - n, "_%08x_%x_%s%s%s.bin", k->kv_rank, k->group, hex,
                     *salt ? "@" : "", salt);
    else
        m = snprintf(buf + n, sizeof(buf) - n, "@0x%08x@%x@%s%s%s%s", k->kv_rank, k->group, hex,
                     *salt ? "@" : "", salt, codec == KVT_CODEC_FS ? ".data" : "");
    n += (size_t)m;
    if (n > KVT_NAME_MAX)
        return KVT_E_BADKEY;
    memcpy(out, buf, n + 1);
    return (int)n;
}

static int parse_hex_u32(const char *s, size_t n, uint32_t *out)
{
    if (n == 0 || n > 8)
        return -EINVAL;
    uint32_t v = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        int d = (c >= '0' && c <= '9')   ? c - '0'
                : (c >= 'a' && c <= 'f') ? c - 'a' + 10
                : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                                         : -1;
        if (d < 0)
            return -EINVAL;
        v = v << 4 | (uint32_t)d;
    }
    *out = v;
    return 0;
}

int kvt_key_decode(enum kvt_codec codec, const char *name, size_t len, kvt_key *k)
{
    const char *sfx = codec == KVT_CODEC_FS ? ".data" : codec == KVT_CODEC_NIXL ? ".bin" : "";
    size_t sl = strlen(sfx);
    if (len <= sl || len > KVT_NAME_MAX || memcmp(name + len - sl, sfx, sl) != 0)
        return -EINVAL;
    if (memchr(name, '/', len) || memchr(name, 0, len))
        return -EINVAL; /* an encoded name never contains these */
    size_t stem = len - sl;
    const char *salt = "";
    size_t salt_len = 0;
    /* salt: after the last '@' when the separator is '_' (nixl), or the 5th
     * '@' field (fs/obj). Fields are found from the right so models may
     * contain the nixl separator '_'. */
    const char *f[5];
    size_t fl[5];
    int nf = 0;
    if (codec == KVT_CODEC_NIXL) {
        const char *at = memchr(name, '@', stem);
        size_t body = stem;
        if (at) {
            salt = at + 1;
            salt_len = stem - (size_t)(at - name) - 1;
            body = (size_t)(at - name);
        }
        /* model _ rank _ group _ hash : split the last three '_' */
        size_t end = body;
        const char *parts[3];
        size_t plen[3];
        for (int i = 2; i >= 0; i--) {
            size_t j = end;
            while (j > 0 && name[j - 1] != '_')
                j--;
            if (j == 0)
                return -EINVAL;
            parts[i] = name + j;
            plen[i] = end - j;
            end = j - 1;
        }
        f[0] = name;
        fl[0] = end;
        for (int i = 0; i < 3; i++) {
            f[i + 1] = parts[i];
            fl[i + 1] = plen[i];
        }
        nf = 4;
        if (fl[1] != 8)
            return -EINVAL;
    } else {
        size_t start = 0;
        for (size_t i = 0; i <= stem; i++) {
            if (i == stem || name[i] == '@') {
                if (nf == 5)
                    return -EINVAL;
                f[nf] = name + start;
                fl[nf] = i - start;
                nf++;
                start = i + 1;
            }
        }
        if (nf < 4)
            return -EINVAL;
        if (nf == 5) {
            salt = f[4];
            salt_len = fl[4];
            if (salt_len == 0)
                return -EINVAL;
        }
        if (fl[1] != 10 || f[1][0] != '0' || f[1][1] != 'x')
            return -EINVAL;
        f[1] += 2;
        fl[1] -= 2;
    }
    uint32_t rank, group;
    uint8_t hash[KVT_HASH_MAX];
    size_t hl = fl[3] / 2;
    if (fl[0] == 0 || parse_hex_u32(f[1], fl[1], &rank) || parse_hex_u32(f[2], fl[2], &group) ||
        hl == 0 || hl > KVT_HASH_MAX || kvt_unhex(f[3], fl[3], hash))
        return -EINVAL;
    char model[KVT_NAME_MAX + 1];
    long ml = dec_model(codec, f[0], fl[0], model);
    uint32_t ns;
    if (ml <= 0 || kvt_ns_intern(model, (size_t)ml, salt, salt_len, &ns, NULL) ||
        kvt_key_make(k, ns, hash, hl, rank, group))
        return -EINVAL;
    /* only the canonical name of a key decodes to it (hex case, leading
     * zeros, needless escapes are other names): decoding is injective too */
    char again[KVT_NAME_MAX + 1];
    if (kvt_key_encode(codec, k, again) != (int)len || memcmp(again, name, len) != 0)
        return -EINVAL;
    return 0;
}

/* ------------------------------------------------------------- hashing */

size_t kvt_chunk_hashes(const uint32_t *tokens, size_t n_tokens, size_t chunk_size, uint8_t *out)
{
    if (chunk_size == 0)
        return 0;
    size_t n = n_tokens / chunk_size;
    uint8_t prev[32] = {0};
    uint8_t *be = kvt_xmalloc(chunk_size * 4);
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    KVT_ASSERT(ctx);
    for (size_t c = 0; c < n; c++) {
        const uint32_t *t = tokens + c * chunk_size;
        for (size_t i = 0; i < chunk_size; i++) {
            uint32_t v = t[i];
            be[4 * i] = (uint8_t)(v >> 24);
            be[4 * i + 1] = (uint8_t)(v >> 16);
            be[4 * i + 2] = (uint8_t)(v >> 8);
            be[4 * i + 3] = (uint8_t)v;
        }
        unsigned int len = 32;
        KVT_ASSERT(EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) == 1);
        EVP_DigestUpdate(ctx, prev, 32);
        EVP_DigestUpdate(ctx, be, chunk_size * 4);
        EVP_DigestFinal_ex(ctx, out + 32 * c, &len);
        memcpy(prev, out + 32 * c, 32);
    }
    EVP_MD_CTX_free(ctx);
    free(be);
    return n;
}
