/*
 * Serde: per-adapter transforms of object bytes on their way to and from an
 * L2 tier (LMCache's "serde", as a chain).
 *
 *   {"type": "fs", "base_path": "/cache",
 *    "serde": [{"type": "fp8"}, {"type": "zstd", "level": 3, "byte_split": true},
 *              {"type": "encrypt", "master_key_path": "/etc/kvtier/key"}]}
 *
 * A chain is applied in order on store and in reverse on load. Serdes:
 *   checksum  xxh3 frame bound to the key identity; a mismatch is a miss
 *   encrypt   AES-GCM (128/256), per-cache_salt key from HKDF-SHA256 of a
 *             master key, the key identity as associated data
 *   fp8       fp16/bf16 -> float8 e4m3 with a power-of-two scale per block
 *   lz4, zstd compression, optional byte-split of 16-bit elements
 * docs/serde.md has the formats, config keys, defaults and measurements.
 *
 * Two parts:
 *  1. The chain (chain.c and one .c per serde): pure functions from bytes to
 *     bytes, configured once, immutable and shared by every thread after
 *     creation. Per-thread scratch lives in a kvt_serde_wctx.
 *  2. The stage (src/l2/stage.c, part of the L2 base: a filter on the task
 *     path) runs a chain so that any engine that follows the "engine
 *     convention for lengths" (l2/engine.h) carries it without knowing it.
 *     It owns a bounded worker pool (max_workers threads); no serde work
 *     runs on the submitting thread.
 *
 * Errors: 0 or -errno / KVT_E_* (kvtier/error.h). Decoding a damaged,
 * foreign or tampered object returns KVT_E_CORRUPT and names the reason in
 * *fail; it never writes past the destination's capacity.
 *
 * Thread rules: a kvt_serde may be used by any number of threads at once;
 * a kvt_serde_wctx by one thread at a time.
 */
#ifndef KVT_SERDE_H
#define KVT_SERDE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "key/key.h"
#include "common/cfg.h"
#include "key/objmeta.h"

#define KVT_SERDE_MAX_STAGES 8

struct kvt_serde;      /* one configured chain (refcounted) */
struct kvt_serde_wctx; /* one worker's scratch buffers and codec contexts */

/* Why a decode failed (for counters and logs). */
enum kvt_serde_fail {
    KVT_SERDE_OK = 0,
    KVT_SERDE_FORMAT,   /* malformed frame: truncated, bad mode, sizes out of range */
    KVT_SERDE_CHECKSUM, /* checksum serde: hash mismatch (corrupt or moved object) */
    KVT_SERDE_DECRYPT,  /* encrypt serde: GCM tag did not verify (tampered, moved, wrong key) */
    KVT_SERDE_LENGTH,   /* decoded length differs from the expected logical length */
    KVT_SERDE_NOMEM,    /* scratch allocation failed */
};

/* Counters of one chain; every field is updated atomically. */
struct kvt_serde_stats {
    _Atomic uint64_t encoded, encode_failed, decoded, decode_failed;
    _Atomic uint64_t format_errors, checksum_mismatches, decrypt_failures, length_mismatches;
    _Atomic uint64_t chain_mismatches;       /* object written by another chain (or raw) */
    _Atomic uint64_t fp8_passthrough;        /* fp8 left an object as is (dtype, length, inf/nan) */
    _Atomic uint64_t logical_in, stored_out; /* bytes before and after encode */
    _Atomic uint64_t encode_ns, decode_ns;
};

/*
 * Parse an adapter's "serde" value (one object or an array of objects) with
 * the adapter's config reader c (errors name the adapter and the field, e.g.
 * "serde[2].master_key_path"), and build the chain. The encrypt serde reads
 * and checks its key file here, so a missing, malformed or world-readable
 * key file fails the config (exit 2) before anything starts. The resolved
 * config (defaults filled in, no secrets) is stored under "serde" in
 * c->resolved. Returns c->rc; *out is set only on success.
 */
int kvt_serde_parse(struct kvt_cfg *c, const json_t *v, struct kvt_serde **out);

struct kvt_serde *kvt_serde_ref(struct kvt_serde *s);
void kvt_serde_unref(struct kvt_serde *s);

/* Non-zero 32-bit id of the chain's stored format: the serde types in order
 * plus what changes the bytes' meaning (AES key size, a key check value
 * derived from the master key). Stored in the object header (flags), so a
 * load detects objects written by another chain or key. Parameters that the
 * frames record themselves (levels, byte-split, fp8 block) are not part of
 * it: changing them keeps old objects readable. */
uint32_t kvt_serde_id(const struct kvt_serde *s);
/* Worker threads the chain asks for (max over its serdes' max_workers). */
int kvt_serde_max_workers(const struct kvt_serde *s);
/* Number of serdes and the type of the i-th ("fp8", ...). */
int kvt_serde_count(const struct kvt_serde *s);
const char *kvt_serde_type(const struct kvt_serde *s, int i);
struct kvt_serde_stats *kvt_serde_stats(struct kvt_serde *s);
/* Upper bound of the encoded size of an object of logical bytes. */
uint64_t kvt_serde_bound(const struct kvt_serde *s, uint64_t logical);

struct kvt_serde_wctx *kvt_serde_wctx_new(void);
void kvt_serde_wctx_free(struct kvt_serde_wctx *w);

/*
 * Encode len bytes at src for the object ck (canonical key, kvt_l2_canon)
 * with metadata m (m->dtype selects fp8 and byte-split behaviour; m->len
 * must equal len). On success *out is a new buffer (free with free()) of
 * *outlen bytes. Errors: -ENOMEM, KVT_E_TOOBIG, -EIO (a codec refused).
 */
int kvt_serde_encode(struct kvt_serde *s, struct kvt_serde_wctx *w, const kvt_key *ck,
                     const kvt_objmeta *m, const void *src, size_t len, void **out, size_t *outlen);

/*
 * Decode len stored bytes at src into dst, which must receive exactly cap
 * bytes (the object's logical length; m->len must equal cap). Returns 0,
 * or KVT_E_CORRUPT / -ENOMEM with *fail set. dst may hold partial output
 * after a failure; the caller must not use it.
 */
int kvt_serde_decode(struct kvt_serde *s, struct kvt_serde_wctx *w, const kvt_key *ck,
                     const kvt_objmeta *m, const void *src, size_t len, void *dst, size_t cap,
                     enum kvt_serde_fail *fail);

/* Short names of the fail reasons, for logs. */
const char *kvt_serde_fail_str(enum kvt_serde_fail f);

#endif
