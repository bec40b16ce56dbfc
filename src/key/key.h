/*
 * Object keys, namespaces, validation, file-name codecs and token hashing.
 *
 * An object key identifies one chunk of KV cache:
 *   (chunk hash, model name, kv_rank, object group, cache salt)
 * The two strings are interned once into a namespace id (kvt_ns), so that a
 * key is a fixed 48-byte value that can be hashed and compared with memcmp
 * and stored compactly in indexes.
 *
 * Validation (LMCache rules, plus path safety). Limits are in bytes (UTF-8
 * is not interpreted):
 *   model: 1..128 bytes, no '@', no NUL or control characters, and no
 *          '/'-separated component equal to "." or ".." (so "/../" is refused);
 *   salt:  0..128 bytes, none of '@' '/' '\\' NUL or control characters;
 *   hash:  1..32 bytes;
 *   together: the longest object name the (model, salt) can get,
 *          kvt_name_bytes(), at most KVT_NAME_MAX (240) bytes.
 * File names built by the codecs below replace every '/', always contain at
 * least one '@' or '_' separated field and a suffix, so no encoded name can be
 * "." or "..", contain a '/', or escape its directory: by construction.
 *
 * Thread rules: the namespace table is safe to use from any thread. Ids are
 * never reused; lookups by id take no lock.
 */
#ifndef KVT_KEY_H
#define KVT_KEY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVT_HASH_MAX 32
#define KVT_MODEL_MAX 128
#define KVT_SALT_MAX 128
#define KVT_NS_MAX (1u << 20)
/* Longest file name any codec produces (fits NAME_MAX with room for ".tmp.<id>"). */
#define KVT_NAME_MAX 240

typedef struct kvt_key {
    uint8_t hash[KVT_HASH_MAX]; /* chunk hash, zero padded after hash_len */
    uint32_t kv_rank;
    uint32_t group;   /* object_group_id */
    uint32_t ns;      /* interned (model, salt); 0 is never a valid id */
    uint8_t hash_len; /* 1..32 */
    uint8_t pad[3];   /* always zero, so memcmp/hash over the struct works */
} kvt_key;

_Static_assert(sizeof(kvt_key) == 48, "kvt_key layout");

/* --- namespaces ------------------------------------------------------- */

/* Validate model and salt (rules above). 0 or KVT_E_BADKEY; *why gets a
 * static message naming the problem. */
int kvt_validate_model(const char *model, size_t len, const char **why);
int kvt_validate_salt(const char *salt, size_t len, const char **why);

/* Intern (model, salt); validates both. Returns 0 and *ns, KVT_E_BADKEY, or
 * KVT_E_LIMIT when KVT_NS_MAX namespaces exist. */
int kvt_ns_intern(const char *model, size_t model_len, const char *salt, size_t salt_len,
                  uint32_t *ns, const char **why);
const char *kvt_ns_model(uint32_t ns);
const char *kvt_ns_salt(uint32_t ns);
/* Namespace name, used on disk, in status, quotas and purge: the model as
 * the nixl codec writes it (every '/' as "--", '%' and a '-' before '-' or
 * '/' escaped; see the codecs below), i.e. the nixl_store_dynamic file-name
 * prefix. Distinct models have distinct names. */
const char *kvt_ns_name(uint32_t ns);
/* The namespace name of a model into out (NUL-terminated); its length, or
 * -1 if it does not fit in cap. */
int kvt_ns_name_of(const char *model, size_t ml, char *out, size_t cap);
/* The model a namespace name stands for, into model (cap >= len + 1):
 * its length, or -1 when name is not the namespace name of a valid model. */
int kvt_ns_name_model(const char *name, size_t len, char *model, size_t cap);
/* Longest object name any codec gives keys of (model, salt of sl bytes)
 * (a 32-byte hash and an 8-digit group). kvt_ns_intern refuses more than
 * KVT_NAME_MAX. */
size_t kvt_name_bytes(const char *model, size_t ml, size_t sl);
uint32_t kvt_ns_count(void);

/* --- keys ---------------------------------------------------------------- */

/* Build a key; validates the hash length. ns must come from kvt_ns_intern. */
int kvt_key_make(kvt_key *k, uint32_t ns, const uint8_t *hash, size_t hash_len, uint32_t kv_rank,
                 uint32_t group);
uint64_t kvt_key_hash(const kvt_key *k);
static inline bool kvt_key_eq(const kvt_key *a, const kvt_key *b)
{
    return __builtin_memcmp(a, b, sizeof(*a)) == 0;
}
/* "model@0x00000000@0@hex[@salt]" for logs; returns out. */
char *kvt_key_str(const kvt_key *k, char *out, size_t cap);

/* --- file-name codecs ---------------------------------------------------- */

/*
 * Names (docs/protocol.md "Keys"), with M the escaped model:
 *   fs:   M@0x%08x(kv_rank)@%x(group)@hex(hash)[@salt].data   M: '/' -> "-SEP-"
 *   obj:  the fs name without ".data" (s3 keys, Redis keys)
 *   nixl: M_%08x(kv_rank)_%x(group)_hex(hash)[@salt].bin      M: '/' -> "--"
 * M escapes '%' as "%25" and a '-' that would begin a separator with what
 * follows it as "%2D" (fs/obj: '-' before "SEP-" or "SEP/"; nixl: '-' before
 * '-' or '/'). A model without '%' and without those sequences gets LMCache's
 * name byte for byte. Encoding is injective, and decoding accepts only the
 * exact name encode gives (lower-case hex, no leading zeros in the group,
 * no needless escapes): decode(encode(k)) == k, and distinct keys never
 * share a name.
 */
enum kvt_codec {
    KVT_CODEC_FS,   /* LMCache fs */
    KVT_CODEC_NIXL, /* nixl_store_dynamic */
    KVT_CODEC_OBJ,  /* object stores (s3, redis) */
};

/* Encode a key's name; returns its length or KVT_E_BADKEY if it would exceed
 * KVT_NAME_MAX. out must hold KVT_NAME_MAX + 1 bytes. */
int kvt_key_encode(enum kvt_codec codec, const kvt_key *k, char *out);
/* Decode a name produced by kvt_key_encode (interning its namespace).
 * Returns 0, or -EINVAL when the name is not a cache object name. */
int kvt_key_decode(enum kvt_codec codec, const char *name, size_t len, kvt_key *k);
/* The key an adapter indexes for k. Names are injective, so it is k itself
 * (kept so that indexes and header checks compare keys exactly, by one
 * rule, for every codec). */
static inline void kvt_key_canon(enum kvt_codec codec, const kvt_key *in, kvt_key *out)
{
    (void)codec;
    *out = *in;
}

/* --- element types ------------------------------------------------------ */

/* Element types a client may declare (protocol field "dtype"). */
enum kvt_dtype {
    KVT_DTYPE_RAW = 0,
    KVT_DTYPE_FP16 = 1,
    KVT_DTYPE_BF16 = 2,
    KVT_DTYPE_FP32 = 3,
    KVT_DTYPE_FP8_E4M3 = 4,
    KVT_DTYPE_U8 = 5,
    KVT_DTYPE_MAX = 5,
};
const char *kvt_dtype_name(unsigned dtype);
int kvt_dtype_parse(const char *s);

/* --- token chunk hashing ----------------------------------------------- */

/* Prefix-chained chunk hashes (SHA-256):
 *   h_0 = SHA256(32 zero bytes || tokens[0:C] as big-endian u32)
 *   h_i = SHA256(h_{i-1}      || tokens[iC:(i+1)C] as big-endian u32)
 * Only full chunks are hashed. Writes n_tokens / chunk_size hashes of 32
 * bytes into out and returns how many. */
size_t kvt_chunk_hashes(const uint32_t *tokens, size_t n_tokens, size_t chunk_size, uint8_t *out);

#endif
