/*
 * Private to the s3 adapter:
 *   s3.c           the adapter: batches of stores, lookups and loads,
 *                  status, open and close
 *   s3_remove.c    DELETE batches (claimed first with a shared budget)
 *   s3_list.c      the start-up listing; XML helpers
 *   s3_cfg.c       the s3 type's keys and nixl_store OBJ's
 *   s3_creds.c     AWS credentials and their check
 *   s3_azure.c     Azure Blob's dialect (nixl_store AZURE_BLOB)
 *   s3_multipart.c multipart uploads and the stale-upload sweep
 *   s3_budget.c    the shared budget record in the bucket
 *   s3_http.c      one I/O thread driving libcurl's multi interface
 *   s3_request.c   a request's handle: headers, SigV4 signing, deadline
 *   s3_breaker.c   request outcomes and the circuit breaker
 * s3_nixl.h is what the nixl family may use of all this.
 */
#ifndef KVT_S3_INT_H
#define KVT_S3_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <curl/curl.h>

#include "l2/engine.h"
#include "l2/kit/objfmt.h"

struct kvt_cfg;
struct kvt_l2_spec;

#define S3_AZURE_VERSION "2021-08-06" /* x-ms-version of Azure Blob requests */
#define S3_HDR KVT_OBJHDR_MIN         /* header bytes in front of every object */
#define S3_F_LEN_KNOWN 0x80           /* index flags: logical length known */
#define S3_PATH_MAX 1024
#define S3_BODY_MAX (8u << 20) /* largest listing/error body kept */
/* Defaults of connection_timeout and request_timeout, in seconds (docs/remote-tiers.md,
 * "Failures"): a request to a hung endpoint fails within 2 s, well inside
 * a 5 s client timeout, while a transfer that moves is never cut. */
#define KVT_S3_CONNECT_TIMEOUT_S 2.0
#define KVT_S3_REQUEST_TIMEOUT_S 2.0
#define S3_PROBE_MIN_NS 500000000ull  /* breaker: first probe after 0.5 s */
#define S3_PROBE_MAX_NS 5000000000ull /* breaker: probes at most 5 s apart */

/* S3_MPU_*: the steps of a multipart upload (s3_multipart.c): POST ?uploads,
 * PUT ?partNumber&uploadId per part, POST ?uploadId with the part list,
 * DELETE ?uploadId when a part failed. */
enum s3_op {
    S3_PUT,
    S3_GET,
    S3_HEAD,
    S3_DELETE,
    S3_LIST,
    S3_PROBE,
    S3_MPU_CREATE,
    S3_MPU_PART,
    S3_MPU_COMPLETE,
    S3_MPU_ABORT,
    S3_MPU_LIST, /* ListMultipartUploads, for the start-up sweep of stale uploads */
    S3_NOPS
};

/* What became of a request. */
enum s3_outcome {
    S3_OK = 0,      /* 2xx */
    S3_NOTFOUND,    /* 404 */
    S3_CONN,        /* transport error (counts for the breaker) */
    S3_UNAVAILABLE, /* failed fast: breaker open */
    S3_REJECTED,    /* 4xx other than 404: credentials, permissions, bucket */
    S3_SERVER,      /* 5xx */
    S3_BADDATA,     /* the body did not fit or did not verify (transfer cut) */
    S3_PRECOND,     /* 412 (or 409 ConditionalRequestConflict): a conditional
                     * request's If-Match / If-None-Match did not hold */
};

struct s3_engine;
struct s3_req;

/* A signing key cache for SigV4 (one per thread that signs). */
struct s3_sigkey {
    char date8[9];
    uint8_t key[32];
};

typedef void (*s3_done_fn)(struct s3_engine *e, struct s3_req *r);
/* GET: called once the first S3_HDR bytes arrived; returns the payload
 * bytes expected after them, or -1 to cut the transfer. */
typedef int64_t (*s3_hdr_fn)(struct s3_req *r);

struct s3_req {
    struct s3_req *next; /* queue link, guarded by e->lock */
    enum s3_op op;
    char path[S3_PATH_MAX]; /* canonical (percent-encoded) path */
    char *query;            /* canonical query string (malloc'd) or NULL */

    /* PUT: header + payload streamed from the caller's buffers; a part
     * (S3_MPU_PART) sends the slice [boff, boff + blen_tx) of that stream */
    const uint8_t *put_hdr;
    const uint8_t *payload;
    uint64_t plen, sent;
    uint64_t boff, blen_tx;
    char meta[96];   /* x-amz-meta-kvt (PUT, S3_MPU_CREATE); "" sends none */
    const char *mem; /* S3_MPU_COMPLETE, or a PUT from memory: the request body */
    size_t mlen;
    char cond[160]; /* a conditional header line ("If-None-Match: *"), or "" */

    /* GET: header into hbuf, payload into dst (capacity cap); without
     * on_hdr the body goes to body (a small object: the budget record) */
    uint8_t *hbuf;
    uint8_t *dst;
    uint64_t cap, got;
    int64_t want; /* payload bytes expected, -1 until the header is in */
    s3_hdr_fn on_hdr;
    bool cut; /* the write callback stopped the transfer */

    /* LIST and error bodies */
    char *body;
    size_t blen, bcap;

    /* no progress for request_timeout fails the transfer (xfer_cb): the
     * clock starts at since_ns (an earlier attempt's start: a retry does
     * not restart it) or when the transfer starts, and restarts whenever a
     * byte moves */
    uint64_t since_ns;   /* set by the submitter of a retry, else 0 */
    uint64_t t_progress; /* last progress (I/O thread, or the sync caller) */
    uint64_t moved;      /* bytes up + down at t_progress */
    uint64_t stall_ns;   /* request_timeout */
    bool stalled;        /* xfer_cb ended it: no progress for stall_ns */

    /* response */
    long status;
    int curl_rc;
    int64_t clen;    /* Content-Length of HEAD/GET, -1 unknown */
    char rmeta[96];  /* x-amz-meta-kvt of HEAD */
    char etag[128];  /* ETag of a PUT, part, HEAD or GET, quotes included */
    int64_t date_ms; /* the answer's Date header (the server's clock), 0 if none */
    char errbuf[CURL_ERROR_SIZE];
    enum s3_outcome outcome;
    char err_code[64]; /* S3 error code of a rejected request */
    char err_msg[256];

    /* completion, on the I/O thread */
    s3_done_fn done;
    void *ctx;
    uint32_t i;

    CURL *h;
    struct curl_slist *hl;
};

struct s3_creds {
    char key_id[128];
    char secret[128];
    char token[2048];
    char source[700]; /* "config", "environment", "file ~/.aws/credentials [default]" */
};

/* The circuit breaker's states (s3_http.c has the state machine). */
enum s3_breaker { BRK_CLOSED, BRK_OPEN, BRK_PROBING };

struct list_state; /* s3.c: the start-up listing (I/O thread only) */

/* Azure Blob (nixl_store "backend": "AZURE_BLOB"): the same engine with
 * Azure's REST dialect (x-ms-* headers, Shared Key or SAS, List Blobs). */
struct s3_azure {
    char account[64];
    uint8_t key[96]; /* the decoded account key (Shared Key: 64 bytes), key_len 0: SAS */
    size_t key_len;
    char sas[1024]; /* SAS token without '?' (appended to every request) */
};

struct s3_engine {
    kvt_l2 *l2;
    /* configuration (immutable after open) */
    bool azure; /* Azure Blob dialect; az holds its account and credentials */
    struct s3_azure az;
    char scheme[8]; /* "http" or "https" */
    char host[400]; /* Host header and URL authority */
    char bucket[128];
    bool path_style; /* path: /bucket/key, virtual: bucket in host */
    char base[200];  /* "/bucket" (path style), "/[account/]container" (Azure) or "" */
    char region[64];
    char prefix[200]; /* object key prefix with trailing '/', or "" */
    size_t prefix_len;
    int max_transfers;
    bool http2;
    long connect_timeout_ms, request_timeout_ms;
    int breaker_threshold;
    uint64_t mpu_threshold; /* objects (header + payload) above this go multipart */
    uint64_t mpu_part;      /* part size of a multipart upload */
    double stale_upload_s;  /* abort uploads older than this at start-up; 0: never */
    struct s3_creds creds;

    /* the I/O thread */
    CURLM *multi;
    pthread_t io;
    bool io_started;

    pthread_mutex_t lock;           /* guards the fields down to 'counters' */
    struct s3_req *q_head, *q_tail; /* submitted, not yet started */
    uint32_t queued;
    bool stop;
    enum s3_breaker brk;
    int conn_errors; /* consecutive, while closed */
    uint64_t brk_opens;
    uint64_t probe_backoff_ns, next_probe_ns, open_since_ns;
    char conn_err[256];  /* last transport error or 5xx; "" once S3 answers again */
    int64_t conn_err_ms; /* its wall-clock time (ms since the epoch) */
    bool rejected;       /* last answer was a 4xx refusal (credentials, ...) */
    long rej_status;
    char rej_code[64], rej_msg[256];
    int64_t rej_ms;       /* wall-clock time of the refusal (ms since the epoch) */
    uint64_t rej_logged;  /* hash of the last logged refusal */
    uint32_t active;      /* transfers in curl */
    uint32_t peak_active; /* most transfers in curl at once */
    struct s3_req probe;  /* the breaker's probe (I/O thread only): in flight
                           * exactly while brk is BRK_PROBING */
    /* SigV4 signing key of the I/O thread (it signs every request it
     * runs); region, service and secret are fixed for the engine's life */
    struct s3_sigkey sig;

    /* start-up listing */
    struct list_state *list;
    bool list_done;
    struct kvt_l2_park park; /* stores waiting for the listing; its lock is a
                              * leaf, taken under lock */
    uint64_t list_retry_ns;

    /* "shared_budget" (s3_budget.c): stores are PUT If-None-Match: * and a
     * removal is claimed first (HEAD, then PUT If-Match of an empty marker) */
    bool shared_budget;
    _Atomic bool relist; /* the record was found gone: list the bucket to recount */
    _Atomic uint64_t claims, claims_lost, markers;

    _Atomic uint64_t reqs[S3_NOPS], failures, foreign;
    _Atomic uint64_t mpu_ok, mpu_failed; /* multipart uploads completed / aborted */
    _Atomic uint64_t mpu_stale;          /* stale uploads aborted by the start-up sweep */
};

/* The parsed configuration (s3.c; s3_azure.c for nixl's AZURE_BLOB). */
struct kvt_s3_opts {
    const char *endpoint, *region, *bucket_opt, *addressing, *key_prefix;
    const char *key_id, *secret, *token; /* NULL: environment or credentials file */
    int num_io_threads;                  /* concurrent transfers */
    bool prefer_http2, disable_tls;
    double connection_timeout, request_timeout; /* seconds */
    int breaker_threshold;
    uint64_t max_capacity_bytes;
    uint64_t mpu_threshold, mpu_part; /* bytes */
    double stale_upload_s;            /* s3_stale_upload_hours, in seconds */
    char ep_buf[320];                 /* nixl OBJ: the endpoint built from its keys */
    /* nixl AZURE_BLOB (s3_azure.c): Azure's dialect, path "/[account/]container" */
    bool azure;
    char az_base[200], az_account[64];
    const char *az_key, *az_sas; /* from the config, else the environment at open */
    /* resolved from the above */
    char scheme[8], host[400], bucket[128];
    bool path_style;
};

/* s3_azure.c: the account key or SAS token for e (config, else
 * $AZURE_STORAGE_KEY / $AZURE_STORAGE_SAS_TOKEN); 0 or KVT_E_CONFIG. */
int kvt_s3_azure_creds(const struct kvt_s3_opts *o, struct s3_engine *e, char *err, size_t cap);
/* Can a server started now authenticate to Azure (an account key or SAS in
 * the config or the environment)? explicit_creds: the config has them.
 * 0, or KVT_E_CONFIG with the message open would give. */
int kvt_s3_azure_creds_check(bool explicit_creds, char *err, size_t errcap);

/* A synchronous requester for threads other than the I/O thread (the
 * budget record's steps run on store, eviction and I/O threads alike):
 * its own easy handle and signing key; one request at a time. */
struct s3_sync {
    CURL *h;
    struct s3_sigkey sk;
};

/* s3_http.c */
/* Run r now on the calling thread through s (a request of e: its endpoint,
 * credentials, breaker and counters); fills r's outcome and answer as the
 * I/O thread would. The breaker open: S3_UNAVAILABLE without a request. */
enum s3_outcome kvt_s3_perform(struct s3_engine *e, struct s3_sync *s, struct s3_req *r);
void kvt_s3_sync_free(struct s3_sync *s);
/* "Wed, 02 Dec 2026 11:29:07 GMT" in ms since the epoch; 0 if malformed. */
int64_t kvt_s3_http_date_ms(const char *s);
int kvt_s3_io_start(struct s3_engine *e, char *err, size_t errcap);
/* Stop after every submitted request completed. */
void kvt_s3_io_stop(struct s3_engine *e);
/* Queue a request (any thread); r->done runs on the I/O thread. */
void kvt_s3_submit_req(struct s3_engine *e, struct s3_req *r);
/* Queue a NULL-ended chain of requests (linked through next) with one lock
 * and one wakeup. */
void kvt_s3_submit_reqs(struct s3_engine *e, struct s3_req *head);
/* Reset a request for reuse; frees its body and query. */
void kvt_s3_req_clear(struct s3_req *r);

/* s3_request.c: build r's easy handle (URL, method, body, deadline, signed
 * headers) with signing key sk; sync: for curl_easy_perform (the whole
 * request gets request_timeout). 0 or -ENOMEM / -EINVAL. */
int kvt_s3_req_setup(struct s3_engine *e, struct s3_req *r, struct s3_sigkey *sk, bool sync);

/* s3_breaker.c */
const char *kvt_s3_outcome_name(enum s3_outcome o);
/* Classify a finished transfer (r's outcome, status and error fields) and
 * feed the breaker and the error state. */
void kvt_s3_classify(struct s3_engine *e, struct s3_req *r, CURLcode rc);
/* The probe could not even be started: it failed (back-off doubles). */
void kvt_s3_probe_failed(struct s3_engine *e, const char *why);
/* Is the breaker closed (requests go to the network)? */
bool kvt_s3_available(struct s3_engine *e);
/* Health line: false when the breaker is open or S3 refuses us. */
bool kvt_s3_health(struct s3_engine *e, char *msg, size_t cap);

/* s3_multipart.c: send the S3_PUT r (not yet submitted) as a multipart
 * upload of e->mpu_part bytes a part. r->done runs on the I/O thread once
 * the upload completed or failed (then it was aborted), with r->outcome,
 * status and error fields as for a single PUT. */
void kvt_s3_put_multipart(struct s3_engine *e, struct s3_req *r);
/* Bytes of the request body: a part's slice, COMPLETE's XML, or header +
 * payload of a PUT. */
uint64_t kvt_s3_body_len(const struct s3_req *r);
/* After the start-up listing (I/O thread): list the multipart uploads under
 * the prefix and abort those initiated more than e->stale_upload_s ago
 * (left by a server killed mid-upload). No-op for 0 or Azure. */
void kvt_s3_sweep_uploads(struct s3_engine *e);
/* "2026-12-01T22:00:00.000Z" in ms since the epoch; 0 if malformed. */
int64_t kvt_s3_iso_ms(const char *s);

/* s3_budget.c: attach the bucket's shared budget record
 * ("<prefix>.kvtier-budget") to e->l2 ("shared_budget": true). No I/O:
 * the listing takes the recount's snapshot before its first page. */
int kvt_s3_budget_attach(struct s3_engine *e, char *err, size_t errcap);

/* s3.c, called on the I/O thread */
/* The breaker just opened: fail the parked stores. */
void kvt_s3_on_breaker_open(kvt_l2 *l2);
/* s3.c: the path of key k's object: base + "/" + encoded "<prefix><name>";
 * its length, or an error (< 0). */
int kvt_s3_obj_path(const struct s3_engine *e, const kvt_key *k, char *out, size_t cap);

/* s3_list.c: the start-up listing, started and retried by the I/O
 * thread on every loop */
void kvt_s3_io_tick(kvt_l2 *l2, uint64_t now);
struct list_state *kvt_s3_list_new(void);
void kvt_s3_list_free(struct list_state *ls);
/* Copy the (unescaped) text of the first <tag>...</tag> in [a, z) to out
 * (z NULL: to the end of a); false, with out "", if absent or a is NULL.
 * a must be NUL-terminated. */
bool kvt_s3_xml_field(const char *a, const char *z, const char *tag, char *out, size_t cap);

/* s3_remove.c: kvt_l2_ops.remove and .remove_batch, and the removal of n
 * keys (rcs[i]: 0, -ENOENT or the error; a claim first with a shared
 * budget) */
int kvt_s3_remove(kvt_l2 *l2, const struct kvt_l2_obj *o);
void kvt_s3_remove_batch(kvt_l2 *l2, const struct kvt_l2_obj *objs, uint32_t n, int *rcs);
void kvt_s3_remove_keys(struct s3_engine *e, const kvt_key *keys, uint32_t n, int *rcs);

/* s3_cfg.c: kvt_l2_adapter_desc.parse of the s3 type */
int kvt_s3_parse(struct kvt_cfg *c, void *opts);
/* nixl_store's top-level keys for the s3 engine (pool_size: transfers in
 * flight, max_capacity_gb, key_prefix) and the engine's settings NIXL's
 * plugins have no key for (the s3 type's defaults), for OBJ and
 * AZURE_BLOB alike. Returns c->rc. */
int kvt_s3_nixl_common(struct kvt_cfg *c, struct kvt_s3_opts *o);
/* s3_creds.c: the credentials for o (config, environment, credentials
 * file; Azure: s3_azure.c), 0 or KVT_E_CONFIG with the message; and the
 * type's host check (kvt_l2_adapter_desc.check): can a server started now
 * sign requests? */
int kvt_s3_load_creds(const struct kvt_s3_opts *o, struct s3_creds *c, char *err, size_t cap);
int kvt_s3_check(const struct kvt_l2_spec *spec, const void *opts, const char **field, char *msg,
                 size_t cap);

#endif
