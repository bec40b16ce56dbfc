/*
 * Private to src/serde: the vtable one serde implements (Valkey dictType
 * style), the per-object context handed along the chain, and the worker
 * scratch. One .c per serde defines one `const struct kvt_sd_ops`.
 */
#ifndef KVT_SERDE_INT_H
#define KVT_SERDE_INT_H

#include "kvtier/error.h"
#include "serde/serde.h"

#include <errno.h>
#include <stdatomic.h>

/* Identity bytes of an object: bound into checksums (seed) and GCM tags
 * (associated data). Layout in chain.c (sd_identity). */
#define KVT_SD_ID_MAX 400

/* What one encode/decode call knows about the object. */
struct kvt_sd_obj {
    const kvt_key *ck; /* canonical key */
    const kvt_objmeta *meta;
    const uint8_t *id; /* identity bytes */
    size_t idlen;
    uint64_t seed;            /* XXH3-64 of the identity */
    uint16_t dtype;           /* encode: element type of the stream entering this serde;
                                 a serde updates it for the next one */
    enum kvt_serde_fail fail; /* decode: why it failed */
    struct kvt_serde_stats *stats;
};

struct kvt_sd;

struct kvt_sd_ops {
    const char *type;
    /* Read this serde's fields from c (its own object, prefix "serde[i].");
     * fill sd->priv. Return c->rc. */
    int (*parse)(struct kvt_cfg *c, struct kvt_sd *sd);
    /* Largest output of encode for n input bytes. */
    uint64_t (*bound)(const struct kvt_sd *sd, uint64_t n);
    /* Encode n bytes into out (cap >= bound(n)); *outn = bytes written. */
    int (*encode)(const struct kvt_sd *sd, struct kvt_serde_wctx *w, struct kvt_sd_obj *o,
                  const uint8_t *in, size_t n, uint8_t *out, size_t cap, size_t *outn);
    /* Decode n bytes into out (at most cap bytes); KVT_E_CORRUPT with
     * o->fail set for bad input, never writing past cap. */
    int (*decode)(const struct kvt_sd *sd, struct kvt_serde_wctx *w, struct kvt_sd_obj *o,
                  const uint8_t *in, size_t n, uint8_t *out, size_t cap, size_t *outn);
    /* Format-relevant description for the chain id (may be NULL). */
    void (*describe)(const struct kvt_sd *sd, char *buf, size_t cap);
    void (*free)(struct kvt_sd *sd);
};

struct kvt_sd {
    const struct kvt_sd_ops *ops;
    void *priv;
    int max_workers;
};

/* Per-thread scratch. Grown on demand, kept for the thread's life. */
struct kvt_serde_wctx {
    uint8_t *buf[3]; /* [0], [1]: chain ping-pong; [2]: a serde's own (byte split) */
    size_t cap[3];
    void *zc, *zd;             /* ZSTD_CCtx, ZSTD_DCtx */
    void *lz4;                 /* LZ4 compression state */
    void *evp;                 /* EVP_CIPHER_CTX */
    uint16_t *fp8_lut[2][256]; /* [fp16|bf16][scale exponent + 128] -> 256 outputs */
};

/* Scratch buffer `slot` of at least n bytes (contents not kept), or NULL. */
uint8_t *kvt_sd_scratch(struct kvt_serde_wctx *w, int slot, size_t n);

/* Byte split of elements of `width` bytes: out gets all byte 0s, then all
 * byte 1s, ...; a tail shorter than one element is copied as is. */
void kvt_sd_split(const uint8_t *in, size_t n, unsigned width, uint8_t *out);
void kvt_sd_unsplit(const uint8_t *in, size_t n, unsigned width, uint8_t *out);
/* Element width a compressor splits by for a stream dtype (1 = no split). */
unsigned kvt_sd_split_width(uint16_t dtype);

/*
 * The frame shared by the compressors (cframe.c):
 *   [mode u8: 0 stored, 1 compressed][split width u8][6 zero bytes]
 *   [original length le64][data]
 * Input that does not shrink is stored as is (mode 0), so compression
 * never grows an object by more than the 16-byte frame.
 */
#define KVT_SD_CFRAME_HDR 16
/* Compress n bytes into out[cap]; return the compressed size, 0 on failure
 * or when it does not fit. */
typedef size_t (*kvt_sd_compress_fn)(const struct kvt_sd *sd, struct kvt_serde_wctx *w,
                                     const uint8_t *in, size_t n, uint8_t *out, size_t cap);
/* Decompress n bytes into out[cap]; return the size produced, or
 * SIZE_MAX for corrupt input. */
typedef size_t (*kvt_sd_decompress_fn)(struct kvt_serde_wctx *w, const uint8_t *in, size_t n,
                                       uint8_t *out, size_t cap);
int kvt_sd_cframe_encode(const struct kvt_sd *sd, bool split, kvt_sd_compress_fn fn,
                         struct kvt_serde_wctx *w, struct kvt_sd_obj *o, const uint8_t *in,
                         size_t n, uint8_t *out, size_t cap, size_t *outn);
int kvt_sd_cframe_decode(kvt_sd_decompress_fn fn, struct kvt_serde_wctx *w, struct kvt_sd_obj *o,
                         const uint8_t *in, size_t n, uint8_t *out, size_t cap, size_t *outn);

/* Little-endian helpers for frames. */
static inline void kvt_sd_put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint64_t kvt_sd_get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}
static inline void kvt_sd_put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint32_t kvt_sd_get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Mark a decode failure: counts nothing (the chain counts once). */
static inline int kvt_sd_bad(struct kvt_sd_obj *o, enum kvt_serde_fail f)
{
    o->fail = f;
    return f == KVT_SERDE_NOMEM ? -ENOMEM : KVT_E_CORRUPT;
}

extern const struct kvt_sd_ops kvt_sd_checksum_ops;
extern const struct kvt_sd_ops kvt_sd_encrypt_ops;
extern const struct kvt_sd_ops kvt_sd_fp8_ops;
extern const struct kvt_sd_ops kvt_sd_lz4_ops;
extern const struct kvt_sd_ops kvt_sd_zstd_ops;

/* Worker-context cleanup hooks of the serdes that keep state there. */
void kvt_sd_zstd_wctx_free(struct kvt_serde_wctx *w);
void kvt_sd_lz4_wctx_free(struct kvt_serde_wctx *w);
void kvt_sd_encrypt_wctx_free(struct kvt_serde_wctx *w);

#endif
