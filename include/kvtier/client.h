/*
 * kvtier C client library.
 *
 * A client talks to one kvtier server over ZeroMQ (tcp:// or ipc://). When
 * the server runs on the same host and offers its shared-memory pool, the
 * client maps the pool and moves bulk bytes through it (zero copy on the
 * wire); otherwise bytes travel inline in ZeroMQ frames. The choice is
 * automatic (kvt_client_shm_active tells which); set KVTIER_NO_SHM=1 or
 * opts.no_shm to force the inline path. Requests themselves go over a
 * same-host Unix socket when the server offers one (fewer thread hops than
 * ZeroMQ; kvt_client_local_active); KVTIER_NO_LOCAL=1 or opts.no_local keeps
 * them on ZeroMQ. The clients of one process share one ZeroMQ context;
 * KVTIER_IO_THREADS=N (1..64, default 1) gives it N I/O threads, which is
 * worth it only for several CURVE connections in one process (each
 * connection's encryption runs on one I/O thread).
 *
 * Errors: every function returns 0 or a negative code (include
 * kvtier/error.h): -errno, or KVT_E_* for protocol and server errors. After
 * an error reply, kvt_client_last_error() returns the server's message.
 *
 * Thread rules: a kvt_client is not thread-safe; use one per thread.
 * Pointers returned in views stay valid until the view is ended.
 *
 * Keys: a batch of chunk hashes sharing (model, kv_rank, group, salt).
 * kvt_chunk_hashes() computes LMCache-style prefix-chained hashes from
 * tokens; see docs/protocol.md for the definition and test vectors.
 */
#ifndef KVTIER_CLIENT_H
#define KVTIER_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvtier/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvt_client kvt_client;

typedef struct kvt_keys {
    const char *model;     /* required; no '@', no "." or ".." path components */
    uint32_t kv_rank;      /* (world<<24)|(rank<<16)|(local_world<<8)|local_rank */
    uint32_t group;        /* object group id */
    const char *salt;      /* cache salt (tenant), may be NULL */
    const uint8_t *hashes; /* n * hash_len bytes */
    size_t hash_len;       /* 1..32 */
    size_t n;
} kvt_keys;

/* Optional element type and shape, stored with each object. */
typedef struct kvt_meta {
    const char *dtype; /* "float16", "bfloat16", "float32", "float8_e4m3", "uint8", "raw" */
    uint8_t ndim;
    uint32_t shape[6];
} kvt_meta;

typedef struct kvt_client_opts {
    int timeout_ms;         /* per request; 0 = 30000 */
    bool no_shm;            /* never use the shared-memory path */
    bool no_local;          /* never use the same-host socket (always ZeroMQ) */
    int connect_timeout_ms; /* kvt_client_open's connect and hello (at most timeout_ms); 0 = 2000 */
    /* CURVE authentication (docs/security.md): both or neither. NULL or ""
     * takes the environment variable named; with neither, no CURVE. */
    const char *server_key; /* file: the server's public key (its NAME.pub); $KVTIER_SERVER_KEY */
    const char *client_key; /* file: this client's secret key (NAME.key, mode 0600 or stricter);
                               $KVTIER_CLIENT_KEY */
} kvt_client_opts;

/* Connect and exchange "hello". opts may be NULL. url: tcp://host:port or
 * ipc:///path (ipc://@name: abstract); anything else is -EINVAL at once.
 * Nobody listening at url (refused, no socket file) fails within about
 * 50 ms with -ECONNREFUSED / -ENOENT; a host that does not answer the
 * connection attempt, or a listener that does not answer hello, fails with
 * KVT_E_TIMEOUT after opts->connect_timeout_ms. With CURVE: KVT_E_DENIED
 * when the server refused this client's key at the handshake; a wrong
 * server key, or no key for a server that needs one, is KVT_E_TIMEOUT (the
 * server cannot answer those). A key file that is missing,
 * malformed or readable by group or others: -EINVAL / -errno at once, before
 * connecting. After a failure,
 * kvt_client_open_error() says why; the library itself prints nothing. */
int kvt_client_open(const char *url, const kvt_client_opts *opts, kvt_client **out);
/* The message of this thread's last failed kvt_client_open ("" if none). */
const char *kvt_client_open_error(void);
void kvt_client_close(kvt_client *c);
const char *kvt_client_last_error(const kvt_client *c);
bool kvt_client_shm_active(const kvt_client *c);
/* The mapping of the server's L1 pool (false, NULL, 0 without shared memory):
 * for registering it with a device runtime (cudaHostRegister) so copies to
 * and from pool slots are DMA. It changes when the client re-maps after a
 * server restart. */
bool kvt_client_pool(const kvt_client *c, void **base, size_t *size);
bool kvt_client_local_active(const kvt_client *c);
int kvt_client_chunk_size(const kvt_client *c);

/* Store n objects. *accepted: keys now held by the server (including keys
 * it already had). Per-key failures (e.g. L1 full) lower *accepted; the
 * call itself fails only for request errors. Through the shared pool a
 * store of more than about 32 MiB is sent as parts of about that size, one
 * request each, so that the server's L2 writes of one part run while the
 * next is copied; a request error in a later part returns that error with
 * the parts before it stored and counted in *accepted. */
int kvt_store(kvt_client *c, const kvt_keys *keys, const void *const *bufs, const size_t *lens,
              const kvt_meta *meta, size_t *accepted);

/* The engine's block hashes of a store's keys (docs/protocol.md, "blocks"):
 * the server's KV events name each stored chunk by them (docs/events.md).
 * per_key hashes for each key, in key order; the parent is the block before
 * the first key's first block (a later key's is the one before it). */
typedef struct kvt_blocks {
    uint32_t block_size;     /* tokens per block */
    uint32_t per_key;        /* blocks of each key, 1..64 */
    uint32_t hash_len;       /* bytes of each hash, 1..32; 0: 64-bit integers (ints) */
    const uint8_t *hashes;   /* n x per_key x hash_len bytes (hash_len > 0) */
    const uint64_t *ints;    /* n x per_key (hash_len == 0) */
    bool has_parent;         /* false: the first key's first block starts the prompt */
    const uint8_t *parent;   /* hash_len bytes (hash_len > 0) */
    uint64_t parent_int;     /* (hash_len == 0) */
    uint32_t tokens_per_key; /* token ids of each key's blocks; 0: none sent */
    const uint32_t *tokens;  /* n x tokens_per_key */
} kvt_blocks;

/* kvt_store with the keys' engine block hashes (NULL: as kvt_store). */
int kvt_store_ex(kvt_client *c, const kvt_keys *keys, const void *const *bufs, const size_t *lens,
                 const kvt_meta *meta, const kvt_blocks *blocks, size_t *accepted);
/* Return once every store this client sent before this call reached every
 * L2 adapter (or failed there); other clients' stores are not waited for.
 * Returns 0 also when some keys did not reach an adapter (L2 full, object
 * too large for a slot, I/O error, the tier unreachable): use kvt_flush_ex
 * to learn which. */
int kvt_flush(kvt_client *c);

/* One (key, adapter) pair that did not reach L2. */
typedef struct kvt_flush_failure {
    int adapter; /* index of the L2 adapter (--l2-adapter order) */
    int code;    /* why: KVT_E_FULL, KVT_E_TOOBIG, KVT_E_LIMIT, -errno, ... */
    uint32_t kv_rank, group;
    uint8_t hash[32];
    size_t hash_len;
    char model[256]; /* NUL-terminated (cut if longer) */
    char salt[256];
} kvt_flush_failure;

typedef struct kvt_flush_report {
    /* (key, adapter) pairs of this client's stores that did not reach L2
     * since its previous flush (each failure is reported by one flush) */
    uint64_t l2_failed;
    size_t n;                  /* entries in failed (the server lists up to 1024) */
    kvt_flush_failure *failed; /* free with kvt_flush_report_free */
    bool truncated;            /* l2_failed > n */
} kvt_flush_report;

/* kvt_flush, and which of this client's stores did not reach L2 (*out,
 * zeroed first; free with kvt_flush_report_free). A client is one
 * connection: stores and flush must go through the same kvt_client. */
int kvt_flush_ex(kvt_client *c, kvt_flush_report *out);
void kvt_flush_report_free(kvt_flush_report *r);
/* Number of leading keys available (L2 hits are pulled into L1). The server
 * holds read locks on them until the next retrieve of these keys or
 * kvt_free_locks (or the read TTL). */
int kvt_lookup(kvt_client *c, const kvt_keys *keys, size_t *hits);
int kvt_free_locks(kvt_client *c);

typedef struct kvt_blob {
    void *data;
    size_t len;
    char dtype[16];
    uint8_t ndim;
    uint32_t shape[6];
    void *priv_;
} kvt_blob;

/* Retrieve the longest available prefix of keys: *n blobs (owned by the
 * caller, free with kvt_blobs_free). Bytes are identical to what was stored.*/
int kvt_retrieve(kvt_client *c, const kvt_keys *keys, kvt_blob **out, size_t *n);
void kvt_blobs_free(kvt_blob *b, size_t n);

/* ---- zero-copy views (shared-memory path only: KVT_E_UNSUPPORTED else) ---- */

typedef struct kvt_wview {
    size_t n;
    void **ptrs; /* where to write object i; NULL when the server already has it */
    size_t *sizes;
    uint64_t lease_;
} kvt_wview;

/* Reserve n slots in the pool; write into ptrs[i], then commit. */
int kvt_store_begin(kvt_client *c, const kvt_keys *keys, const size_t *sizes, const kvt_meta *meta,
                    kvt_wview **out);
/* kvt_store_begin with the keys' engine block hashes (NULL: as kvt_store_begin). */
int kvt_store_begin_ex(kvt_client *c, const kvt_keys *keys, const size_t *sizes,
                       const kvt_meta *meta, const kvt_blocks *blocks, kvt_wview **out);
/* Publish what was written (written: one flag per key, NULL = all). */
int kvt_store_commit(kvt_client *c, kvt_wview *v, const bool *written, size_t *accepted);
/* Give the slots back without publishing. */
void kvt_store_abort(kvt_client *c, kvt_wview *v);

typedef struct kvt_rview {
    size_t n;
    const void **ptrs;
    size_t *lens;
    kvt_blob *meta; /* dtype/shape per object (data fields unused) */
    uint64_t lease_;
} kvt_rview;

/* Reference the longest available prefix in the pool for reading. */
int kvt_retrieve_begin(kvt_client *c, const kvt_keys *keys, kvt_rview **out);
/* Release the view. KVT_E_EXPIRED: the read lease ran out while reading and
 * the bytes may have changed: discard them. */
int kvt_retrieve_end(kvt_client *c, kvt_rview *v);

/* ---- administration ---- */

/* Server status as a JSON document (free with free()). */
int kvt_status_json(kvt_client *c, char **json);
int kvt_ping(kvt_client *c);
/* Delete keys from every tier; *removed = objects removed from L2 (sum). */
int kvt_delete(kvt_client *c, const kvt_keys *keys, size_t *removed);

/* ---- paged KV-cache block copies (engine connectors) ----
 *
 * One layer of an engine's paged KV cache in host memory, as a kvtier
 * object carries it (docs/vllm.md): `lead` leading slices (2 for K and V of a
 * [2, num_blocks, ...] tensor, 1 when blocks lead), each holding num_blocks
 * blocks of seg_bytes contiguous bytes, block_stride apart, the slices
 * lead_stride apart. In the object the layer starts at obj_off and holds, for
 * each slice in turn, the chunk's blocks in chunk order. */
typedef struct kvt_copy_layer {
    uint64_t base; /* address of the layer's first byte */
    uint64_t obj_off;
    uint64_t seg_bytes;
    uint64_t block_stride;
    uint64_t lead_stride;
    uint64_t num_blocks;
    uint32_t lead;
} kvt_copy_layer;

/* Copy the nblocks blocks named by blocks[] (chunk order; an id < 0 is
 * skipped) of every layer into the object (to_object) or out of it into the
 * cache. KVT_E_BADREQ, copying nothing, when a block id is out of range or a
 * layer does not fit in object_len bytes. */
int kvt_copy_blocks(bool to_object, const kvt_copy_layer *layers, uint32_t nlayers, void *object,
                    size_t object_len, const int64_t *blocks, uint32_t nblocks);

/* kvt_copy_blocks for nchunks objects at once (objects[c], each object_len
 * bytes, its block ids at blocks[c * nblocks]), split over nthreads threads
 * (the caller's and nthreads - 1 started here; 0 or 1: the caller only).
 * Everything is checked before anything is copied. One call per batch: a
 * Python caller releases its GIL once, not once a chunk (each reacquisition
 * can wait a whole switch interval, 5 ms, behind a busy engine thread). */
int kvt_copy_chunks(bool to_object, const kvt_copy_layer *layers, uint32_t nlayers,
                    void *const *objects, size_t object_len, const int64_t *blocks,
                    uint32_t nblocks, uint32_t nchunks, uint32_t nthreads);

/* Prefix-chained SHA-256 chunk hashes of tokens (32 bytes each, full chunks
 * only); returns the number of hashes written to out. */
size_t kvt_chunk_hashes(const uint32_t *tokens, size_t n_tokens, size_t chunk_size, uint8_t *out);

#ifdef __cplusplus
}
#endif
#endif
