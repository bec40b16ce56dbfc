/*
 * s3 adapter: the I/O thread. One thread drives libcurl's multi interface
 * with up to s3_num_io_threads transfers at once (HTTP/2 multiplexing or a
 * pool of keep-alive connections); requests come from any thread through a
 * queue and a curl_multi_wakeup, completions run on this thread. It sleeps
 * in curl_multi_poll: no busy polling.
 *
 * Signing: every request is signed with our SigV4 (sigv4.c) over host,
 * x-amz-date, x-amz-content-sha256 (UNSIGNED-PAYLOAD for PUT bodies: the
 * objfmt checksum guards the bytes end to end) and the x-amz-meta / token
 * headers.
 *
 * Deadline: a transfer that moves no byte (up or down, connecting
 * included) for request_timeout fails (xfer_cb; connection_timeout can
 * only shorten the connect). The clock restarts with every byte, so a large
 * object on a slow link is never cut while it moves; a retry (DELETE on a
 * 5xx) keeps its first attempt's clock, so retries never extend the wait.
 * The loop wakes at least every request_timeout / 8 while transfers run,
 * which bounds how late a stall is seen.
 *
 * Circuit breaker, one per endpoint, under e->lock:
 *
 *            threshold consecutive failures,
 *            or one transfer that timed out      next_probe_ns reached:
 *   CLOSED ------------------------------> OPEN ----------------------> PROBING
 *      ^       (opens++, "circuit open"     ^   the I/O thread starts   |  |
 *      |        logged, parked stores fail) |   the probe (HEAD bucket) |  |
 *      |                                    +---------------------------+  |
 *      |        probe failed (transport error, stall, 5xx): back-off       |
 *      |        doubles (0.5 s .. 5 s), next_probe_ns = now + back-off     |
 *      +-------------------------------------------------------------------+
 *               probe answered (2xx-4xx): "circuit closed" logged
 *
 *   - A failure is a transport error, a stall or a 5xx; a request refused
 *     with 4xx is an answer (it resets the count; see "rejected").
 *   - In OPEN and PROBING every new request fails at once (S3_UNAVAILABLE)
 *     without touching the network. Transfers that started before the
 *     breaker opened still end (each within request_timeout); their
 *     results change nothing: only the probe's own result moves PROBING.
 *   - The probe is e->probe, one per engine: it is started only on the
 *     OPEN -> PROBING edge and finishes only on the PROBING -> edge, so it
 *     is in flight exactly while the state is PROBING and never restarted
 *     while curl holds it (asserted at both ends).
 *   - One log line per state change (opened, closed); probes and requests
 *     log nothing. conn_err holds the last failure with its time, cleared
 *     when S3 answers again (the breaker closes, or a success ends a run
 *     of failures below the threshold).
 *
 * Locks: e->lock guards the queue, the breaker and the error fields; it is
 * never held while curl runs or a completion callback runs.
 */
#include "common/log.h"
#include "common/util.h"
#include "kvtier/error.h"
#include "l2/s3/s3_int.h"
#include "l2/s3/sigv4.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

static const char *const op_names[] = {"PUT",
                                       "GET",
                                       "HEAD",
                                       "DELETE",
                                       "LIST",
                                       "PROBE",
                                       "CreateMultipartUpload",
                                       "UploadPart",
                                       "CompleteMultipartUpload",
                                       "AbortMultipartUpload",
                                       "ListMultipartUploads"};
_Static_assert(KVT_ARRAY_LEN(op_names) == S3_NOPS, "one name per S3 op");

const char *kvt_s3_outcome_name(enum s3_outcome o)
{
    static const char *const n[] = {"ok",          "not found",          "connection error",
                                    "unavailable", "rejected",           "server error",
                                    "bad data",    "precondition failed"};
    return (unsigned)o < KVT_ARRAY_LEN(n) ? n[o] : "?";
}

/* ------------------------------------------------------- callbacks */

uint64_t kvt_s3_body_len(const struct s3_req *r)
{
    if (r->op == S3_MPU_COMPLETE || (r->op == S3_PUT && r->mem))
        return r->mlen;
    return r->op == S3_MPU_PART ? r->blen_tx : S3_HDR + r->plen;
}

/* PUT bodies: the slice [boff, boff + body length) of header + payload. */
static size_t read_cb(char *buf, size_t size, size_t nitems, void *arg)
{
    struct s3_req *r = arg;
    size_t room = size * nitems, n = 0;
    uint64_t total = kvt_s3_body_len(r);
    if (r->mem) { /* a PUT from memory */
        n = (size_t)KVT_MIN((uint64_t)room, total - r->sent);
        memcpy(buf, r->mem + r->sent, n);
        r->sent += n;
        return n;
    }
    while (n < room && r->sent < total) {
        uint64_t pos = r->boff + r->sent;
        size_t take;
        if (pos < S3_HDR) {
            take = (size_t)KVT_MIN((uint64_t)(room - n), KVT_MIN(S3_HDR - pos, total - r->sent));
            memcpy(buf + n, r->put_hdr + pos, take);
        } else {
            uint64_t off = pos - S3_HDR;
            take = (size_t)KVT_MIN((uint64_t)(room - n), total - r->sent);
            memcpy(buf + n, r->payload + off, take);
        }
        n += take;
        r->sent += take;
    }
    return n;
}

static size_t body_put(struct s3_req *r, const char *p, size_t n)
{
    if (r->blen + n + 1 > r->bcap) {
        if (r->blen + n + 1 > S3_BODY_MAX)
            return 0;
        size_t nc = r->bcap ? r->bcap * 2 : 16384;
        while (nc < r->blen + n + 1)
            nc *= 2;
        char *nb = realloc(r->body, nc);
        if (!nb)
            return 0;
        r->body = nb;
        r->bcap = nc;
    }
    memcpy(r->body + r->blen, p, n);
    r->blen += n;
    r->body[r->blen] = 0;
    return n;
}

/*
 * GET bodies: the first S3_HDR bytes go to hbuf; then on_hdr decides how
 * many payload bytes may follow (they must fit the destination); the
 * payload goes straight to dst. More bytes than announced cut the transfer:
 * the destination is never overrun. Error answers (non-2xx) are kept as a
 * body to read the S3 error code from.
 */
static size_t write_cb(char *p, size_t size, size_t nmemb, void *arg)
{
    struct s3_req *r = arg;
    size_t n = size * nmemb;
    if (!r->status) /* once per transfer: body bytes follow the final status */
        curl_easy_getinfo(r->h, CURLINFO_RESPONSE_CODE, &r->status);
    if (r->op != S3_GET || r->status / 100 != 2 || !r->on_hdr)
        return body_put(r, p, n) == n ? n : 0;
    size_t used = 0;
    while (used < n) {
        if (r->want < 0) {
            size_t take = KVT_MIN(n - used, (size_t)(S3_HDR - r->got));
            memcpy(r->hbuf + r->got, p + used, take);
            r->got += take;
            used += take;
            if (r->got == S3_HDR) {
                r->want = r->on_hdr(r);
                if (r->want < 0) {
                    r->cut = true;
                    return 0;
                }
                r->got = 0;
            }
            continue;
        }
        size_t take = n - used;
        if (r->got + take > (uint64_t)r->want) {
            r->cut = true; /* longer than its header says */
            return 0;
        }
        memcpy(r->dst + r->got, p + used, take);
        r->got += take;
        used += take;
    }
    return n;
}

static size_t header_cb(char *p, size_t size, size_t nitems, void *arg)
{
    struct s3_req *r = arg;
    size_t n = size * nitems;
    if (n >= 5 && strncmp(p, "HTTP/", 5) == 0) { /* a new response (after 100) */
        r->clen = -1;
        r->rmeta[0] = r->etag[0] = 0;
        r->date_ms = 0;
        return n;
    }
    const char *colon = memchr(p, ':', n);
    if (!colon)
        return n;
    size_t kl = (size_t)(colon - p);
    const char *v = colon + 1;
    size_t vl = n - kl - 1;
    while (vl && (*v == ' ' || *v == '\t')) {
        v++;
        vl--;
    }
    while (vl && (v[vl - 1] == '\r' || v[vl - 1] == '\n' || v[vl - 1] == ' '))
        vl--;
    if (kl == 14 && strncasecmp(p, "content-length", 14) == 0) {
        char tmp[32];
        snprintf(tmp, sizeof(tmp), "%.*s", (int)KVT_MIN(vl, 31), v);
        r->clen = strtoll(tmp, NULL, 10);
    } else if ((kl == 14 && strncasecmp(p, "x-amz-meta-kvt", 14) == 0) ||
               (kl == 13 && strncasecmp(p, "x-ms-meta-kvt", 13) == 0)) {
        snprintf(r->rmeta, sizeof(r->rmeta), "%.*s", (int)KVT_MIN(vl, sizeof(r->rmeta) - 1), v);
    } else if (kl == 4 && strncasecmp(p, "etag", 4) == 0) {
        snprintf(r->etag, sizeof(r->etag), "%.*s", (int)KVT_MIN(vl, sizeof(r->etag) - 1), v);
    } else if (kl == 4 && strncasecmp(p, "date", 4) == 0) {
        char tmp[64];
        snprintf(tmp, sizeof(tmp), "%.*s", (int)KVT_MIN(vl, sizeof(tmp) - 1), v);
        r->date_ms = kvt_s3_http_date_ms(tmp);
    }
    return n;
}

/* Progress of a transfer: fails it (CURLE_ABORTED_BY_CALLBACK, stalled)
 * when no byte moved for r->stall_ns. curl calls it on every pass over
 * the transfer, connecting included: at least as often as the loop wakes. */
static int xfer_cb(void *arg, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                   curl_off_t ulnow)
{
    (void)dltotal;
    (void)ultotal;
    struct s3_req *r = arg;
    uint64_t moved = (uint64_t)dlnow + (uint64_t)ulnow, now = kvt_now_ns();
    if (moved != r->moved) {
        r->moved = moved;
        r->t_progress = now;
        return 0;
    }
    if (now - r->t_progress < r->stall_ns)
        return 0;
    r->stalled = true;
    return 1;
}

/* ------------------------------------------------------------ setup */

static void add_hdr(struct s3_req *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add_hdr(struct s3_req *r, const char *fmt, ...)
{
    char line[2300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    struct curl_slist *nl = curl_slist_append(r->hl, line);
    if (nl)
        r->hl = nl;
}

/* Percent-decode [a, a + n) into out (cap bytes incl. NUL). */
static void pct_decode(const char *a, size_t n, char *out, size_t cap)
{
    size_t o = 0;
    for (size_t i = 0; i < n && o + 1 < cap; i++) {
        if (a[i] == '%' && i + 2 < n && isxdigit((unsigned char)a[i + 1]) &&
            isxdigit((unsigned char)a[i + 2])) {
            char hx[3] = {a[i + 1], a[i + 2], 0};
            out[o++] = (char)strtol(hx, NULL, 16);
            i += 2;
        } else {
            out[o++] = a[i];
        }
    }
    out[o] = 0;
}

/*
 * Azure Blob headers and Shared Key signature (Authorize with Shared Key,
 * version 2009-09-19 and later):
 *   VERB \n Content-Encoding \n Content-Language \n Content-Length (empty for
 *   0) \n Content-MD5 \n Content-Type \n Date \n If-Modified-Since \n If-Match
 *   \n If-None-Match \n If-Unmodified-Since \n Range \n
 *   x-ms-* headers "name:value\n", sorted
 *   "/" account path, then "\nname:value" per query parameter, sorted, decoded
 * signed with HMAC-SHA256 under the decoded account key. With a SAS token
 * instead, the token in the URL is the authorization.
 */
static int azure_headers(struct s3_engine *e, struct s3_req *r, const char *method)
{
    char date[40];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(date, sizeof(date), "%a, %d %b %Y %H:%M:%S GMT", &tm);
    bool put = r->op == S3_PUT;
    uint64_t clen = put ? kvt_s3_body_len(r) : 0;
    /* sorted by name */
    if (put)
        add_hdr(r, "x-ms-blob-type: BlockBlob");
    add_hdr(r, "x-ms-date: %s", date);
    if (put)
        add_hdr(r, "x-ms-meta-kvt: %s", r->meta);
    add_hdr(r, "x-ms-version: " S3_AZURE_VERSION);
    add_hdr(r, "Expect:");
    if (put)
        add_hdr(r, "Content-Type: application/octet-stream");
    if (e->az.key_len) {
        char sts[4096], cl[24] = "";
        if (clen)
            snprintf(cl, sizeof(cl), "%llu", (unsigned long long)clen);
        int n =
            snprintf(sts, sizeof(sts),
                     "%s\n\n\n%s\n\n%s\n\n\n\n\n\n\n%sx-ms-date:%s\n%s%s%sx-ms-version:%s\n/%s%s",
                     method, cl, put ? "application/octet-stream" : "",
                     put ? "x-ms-blob-type:BlockBlob\n" : "", date, put ? "x-ms-meta-kvt:" : "",
                     put ? r->meta : "", put ? "\n" : "", S3_AZURE_VERSION, e->az.account, r->path);
        /* the query's parameters (names already sorted and lower case) */
        for (const char *q = r->query; q && *q && n > 0 && (size_t)n < sizeof(sts);) {
            const char *amp = strchr(q, '&');
            size_t len = amp ? (size_t)(amp - q) : strlen(q);
            const char *eq = memchr(q, '=', len);
            char name[64], val[1200];
            size_t nl = eq ? (size_t)(eq - q) : len;
            snprintf(name, sizeof(name), "%.*s", (int)KVT_MIN(nl, sizeof(name) - 1), q);
            if (eq)
                pct_decode(eq + 1, len - nl - 1, val, sizeof(val));
            else
                val[0] = 0;
            n += snprintf(sts + n, sizeof(sts) - (size_t)n, "\n%s:%s", name, val);
            q = amp ? amp + 1 : q + len;
        }
        if (n < 0 || (size_t)n >= sizeof(sts))
            return -EINVAL;
        uint8_t mac[32];
        kvt_hmac_sha256(e->az.key, e->az.key_len, sts, (size_t)n, mac);
        char b64[64];
        kvt_base64_encode(mac, sizeof(mac), b64, sizeof(b64));
        add_hdr(r, "Authorization: SharedKey %s:%s", e->az.account, b64);
    }
    if (!r->hl)
        return -ENOMEM;
    curl_easy_setopt(r->h, CURLOPT_HTTPHEADER, r->hl);
    return 0;
}

int64_t kvt_s3_http_date_ms(const char *s)
{
    struct tm tm;
    memset(&tm, 0, sizeof(tm));
    const char *end = strptime(s, "%a, %d %b %Y %H:%M:%S", &tm);
    return end ? (int64_t)timegm(&tm) * 1000 : 0;
}

/*
 * Build the easy handle: URL, method, body source/sink, the no-progress
 * deadline and the signed headers. sync: run by curl_easy_perform, whose
 * loop wakes only once a second, so the whole request also gets
 * request_timeout (its bodies are a few KiB: the budget record). Returns 0
 * or -ENOMEM / -EINVAL.
 */
static int setup(struct s3_engine *e, struct s3_req *r, struct s3_sigkey *sk, bool sync)
{
    CURL *h = r->h;
    r->status = 0; /* write_cb reads it once per transfer */
    r->stall_ns = (uint64_t)e->request_timeout_ms * 1000000ull;
    r->t_progress = r->since_ns ? r->since_ns : kvt_now_ns();
    r->moved = 0;
    r->stalled = false;
    char url[S3_PATH_MAX + 512 + 2400 + 1024];
    bool q = r->query && r->query[0];
    bool sas = e->azure && e->az.sas[0];
    snprintf(url, sizeof(url), "%s://%s%s%s%s%s%s", e->scheme, e->host, r->path,
             q || sas ? "?" : "", q ? r->query : "", q && sas ? "&" : "", sas ? e->az.sas : "");
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_PRIVATE, r);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, r->errbuf);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS,
                     KVT_MIN(e->connect_timeout_ms, e->request_timeout_ms));
    /* request_timeout: a transfer that moves nothing for that long fails
     * (a total timeout would punish large objects on a busy link) */
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, xfer_cb);
    curl_easy_setopt(h, CURLOPT_XFERINFODATA, r);
    if (sync)
        curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, e->request_timeout_ms);
    curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(h, CURLOPT_HTTP_VERSION,
                     e->http2 ? (long)CURL_HTTP_VERSION_2TLS : (long)CURL_HTTP_VERSION_1_1);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, header_cb);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, r);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, write_cb);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, r);
    /* bigger receive chunks: fewer callbacks and reads per object (the curl
     * tool itself uses 100 KiB) */
    curl_easy_setopt(h, CURLOPT_BUFFERSIZE, 256L * 1024);
    const char *method = "GET";
    bool put = r->op == S3_PUT || r->op == S3_MPU_PART;
    switch (r->op) {
    case S3_PUT:
    case S3_MPU_PART:
        method = "PUT";
        curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
        curl_easy_setopt(h, CURLOPT_READFUNCTION, read_cb);
        curl_easy_setopt(h, CURLOPT_READDATA, r);
        curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)kvt_s3_body_len(r));
        curl_easy_setopt(h, CURLOPT_UPLOAD_BUFFERSIZE, 256L * 1024);
        break;
    case S3_HEAD:
    case S3_PROBE:
        method = "HEAD";
        curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
        break;
    case S3_DELETE:
    case S3_MPU_ABORT:
        method = "DELETE";
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, "DELETE");
        break;
    case S3_MPU_CREATE:
    case S3_MPU_COMPLETE:
        method = "POST";
        curl_easy_setopt(h, CURLOPT_POST, 1L);
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, r->op == S3_MPU_COMPLETE ? r->mem : "");
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE,
                         (curl_off_t)(r->op == S3_MPU_COMPLETE ? r->mlen : 0));
        break;
    default:
        break;
    }
    if (e->azure)
        return azure_headers(e, r, method);
    char date[17];
    kvt_sigv4_amz_date(time(NULL), date);
    /* bodies streamed from L1 go unsigned (the objfmt checksum guards
     * them); COMPLETE's small XML is hashed */
    char xml_hash[65];
    const char *phash = put ? "UNSIGNED-PAYLOAD" : KVT_SHA256_EMPTY;
    if (r->op == S3_MPU_COMPLETE) {
        kvt_sha256_hex(r->mem, r->mlen, xml_hash);
        phash = xml_hash;
    }
    bool meta = (r->op == S3_PUT || r->op == S3_MPU_CREATE) && r->meta[0];
    struct kvt_sigv4_pair hs[6];
    size_t nh = 0;
    hs[nh++] = (struct kvt_sigv4_pair){"host", e->host};
    hs[nh++] = (struct kvt_sigv4_pair){"x-amz-content-sha256", phash};
    hs[nh++] = (struct kvt_sigv4_pair){"x-amz-date", date};
    if (meta)
        hs[nh++] = (struct kvt_sigv4_pair){"x-amz-meta-kvt", r->meta};
    if (e->creds.token[0])
        hs[nh++] = (struct kvt_sigv4_pair){"x-amz-security-token", e->creds.token};
    if (memcmp(sk->date8, date, 8) != 0) { /* a new day: derive the key once */
        memcpy(sk->date8, date, 8);
        sk->date8[8] = 0;
        kvt_sigv4_signing_key(e->creds.secret, sk->date8, e->region, "s3", sk->key);
    }
    struct kvt_sigv4_req sr = {
        method, r->path,         r->query ? r->query : "", hs,     nh, phash, date, e->region,
        "s3",   e->creds.key_id, e->creds.secret,          sk->key};
    struct kvt_sigv4_out so;
    memset(&so, 0, sizeof(so));
    int rc = kvt_sigv4_sign(&sr, &so);
    if (rc)
        return rc;
    for (size_t i = 0; i < nh; i++)
        add_hdr(r, "%s: %s", hs[i].name, hs[i].value);
    add_hdr(r, "Authorization: %s", so.authorization);
    add_hdr(r, "Expect:"); /* no 100-continue round trip before a PUT body */
    if (r->cond[0])        /* not signed: SigV4 needs only host and the x-amz-* ones */
        add_hdr(r, "%s", r->cond);
    if (r->op == S3_PUT || r->op == S3_MPU_CREATE)
        add_hdr(r, "Content-Type: application/octet-stream");
    else if (r->op == S3_MPU_COMPLETE)
        add_hdr(r, "Content-Type: application/xml");
    if (!r->hl)
        return -ENOMEM;
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, r->hl);
    return 0;
}

/* ---------------------------------------------------------- breaker */

static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* call with e->lock held */
static void set_error_locked(struct s3_engine *e, const char *why)
{
    snprintf(e->conn_err, sizeof(e->conn_err), "%s", why);
    e->conn_err_ms = wall_ms();
}

/* call with e->lock held */
static void clear_error_locked(struct s3_engine *e)
{
    e->conn_errors = 0;
    e->conn_err[0] = 0;
    e->conn_err_ms = 0;
}

/* A request other than the probe got an answer that is not a 5xx. */
static void breaker_ok(struct s3_engine *e)
{
    pthread_mutex_lock(&e->lock);
    if (e->brk == BRK_CLOSED && e->conn_errors) /* OPEN, PROBING: the probe decides */
        clear_error_locked(e);
    pthread_mutex_unlock(&e->lock);
}

/* A request other than the probe failed (transport error, 5xx; stall: no
 * progress for request_timeout, which opens the breaker at once). */
static void breaker_fail(struct s3_engine *e, const char *why, bool stall)
{
    bool opened = false;
    uint64_t now = kvt_now_ns();
    pthread_mutex_lock(&e->lock);
    if (e->brk == BRK_CLOSED) { /* OPEN, PROBING: a transfer older than the opening */
        set_error_locked(e, why);
        if (++e->conn_errors >= e->breaker_threshold || stall) {
            e->brk = BRK_OPEN;
            e->brk_opens++;
            e->open_since_ns = now;
            e->probe_backoff_ns = S3_PROBE_MIN_NS;
            e->next_probe_ns = now + e->probe_backoff_ns;
            opened = true;
        }
    }
    int errs = e->conn_errors;
    pthread_mutex_unlock(&e->lock);
    if (opened) {
        kvt_warn("%s: circuit open after %d consecutive error%s talking to %s (%s): lookups "
                 "miss and stores fail at once; probing with backoff",
                 e->l2->name, errs, errs == 1 ? "" : "s", e->host, why);
        kvt_s3_on_breaker_open(e->l2);
    }
}

/* The probe finished: answered (any status below 500) closes the breaker;
 * otherwise it stays open and the next probe waits twice as long. */
static void probe_done(struct s3_engine *e, bool answered, const char *why)
{
    uint64_t now = kvt_now_ns();
    pthread_mutex_lock(&e->lock);
    KVT_ASSERT(e->brk == BRK_PROBING);
    double was_open = (double)(now - e->open_since_ns) / 1e9;
    if (answered) {
        e->brk = BRK_CLOSED;
        clear_error_locked(e);
    } else {
        e->brk = BRK_OPEN;
        set_error_locked(e, why);
        e->probe_backoff_ns = KVT_MIN(e->probe_backoff_ns * 2, S3_PROBE_MAX_NS);
        e->next_probe_ns = now + e->probe_backoff_ns;
    }
    uint64_t backoff = e->probe_backoff_ns;
    pthread_mutex_unlock(&e->lock);
    if (answered)
        kvt_info("%s: S3 at %s answers again: circuit closed after %.1f s", e->l2->name, e->host,
                 was_open);
    else
        kvt_debug("%s: probe failed (%s): next in %.1f s", e->l2->name, why, (double)backoff / 1e9);
}

bool kvt_s3_available(struct s3_engine *e)
{
    pthread_mutex_lock(&e->lock);
    bool ok = e->brk == BRK_CLOSED;
    pthread_mutex_unlock(&e->lock);
    return ok;
}

bool kvt_s3_health(struct s3_engine *e, char *msg, size_t cap)
{
    uint64_t now = kvt_now_ns();
    pthread_mutex_lock(&e->lock);
    bool ok = false;
    if (e->brk != BRK_CLOSED) {
        double next = e->next_probe_ns > now ? (double)(e->next_probe_ns - now) / 1e9 : 0;
        snprintf(msg, cap, "circuit open for %.1f s: %s (next probe in %.1f s)",
                 (double)(now - e->open_since_ns) / 1e9, e->conn_err, next);
    } else if (e->rejected) {
        snprintf(msg, cap, "S3 refuses our requests: HTTP %ld %s: %s", e->rej_status, e->rej_code,
                 e->rej_msg);
    } else {
        snprintf(msg, cap, "ok (%s://%s%s)", e->scheme, e->host, e->base);
        ok = true;
    }
    pthread_mutex_unlock(&e->lock);
    return ok;
}

/* ------------------------------------------------------- completion */

static bool is_transport(int rc)
{
    switch (rc) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_PARTIAL_FILE:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_WEIRD_SERVER_REPLY:
        return true;
    default:
        return false;
    }
}

/* Classify a finished transfer and feed the breaker (the probe's result
 * only through probe_done) and the error state. */
static void classify(struct s3_engine *e, struct s3_req *r, CURLcode rc)
{
    r->curl_rc = rc;
    curl_easy_getinfo(r->h, CURLINFO_RESPONSE_CODE, &r->status);
    if (rc != CURLE_OK) {
        if (r->cut) {
            r->outcome = S3_BADDATA;
            if (r->op == S3_PROBE)
                probe_done(e, false, "PROBE: the answer was cut");
            return;
        }
        r->outcome = S3_CONN;
        char why[300];
        if (r->stalled)
            snprintf(why, sizeof(why), "%s: no progress for %.1f s (request_timeout)",
                     op_names[r->op], (double)r->stall_ns / 1e9);
        else
            snprintf(why, sizeof(why), "%s %s: %s", op_names[r->op], curl_easy_strerror(rc),
                     r->errbuf[0] ? r->errbuf : "");
        snprintf(r->err_msg, sizeof(r->err_msg), "%.*s", (int)sizeof(r->err_msg) - 1, why);
        if (r->op == S3_PROBE)
            probe_done(e, false, why);
        else if (r->stalled || is_transport(rc))
            breaker_fail(e, why, r->stalled || rc == CURLE_OPERATION_TIMEDOUT);
        else
            kvt_debug("%s: %s", e->l2->name, why);
        return;
    }
    long s = r->status;
    if (s / 100 == 2) {
        r->outcome = S3_OK;
    } else if (s == 412 || s == 409) {
        /* a condition that did not hold (409: AWS's ConditionalRequestConflict,
         * two conditional writes at once); any other 409 refuses us */
        kvt_s3_xml_field(r->body, NULL, "Code", r->err_code, sizeof(r->err_code));
        r->outcome = s == 412 || strcmp(r->err_code, "ConditionalRequestConflict") == 0
                         ? S3_PRECOND
                         : S3_REJECTED;
    } else if (s == 404) {
        /* a missing object (HEAD has no body); any other 404 refuses us:
         * NoSuchBucket, or an unknown access key as some servers answer it
         * (versitygw: XAdminUserNotFound) */
        kvt_s3_xml_field(r->body, NULL, "Code", r->err_code, sizeof(r->err_code));
        r->outcome = !r->err_code[0] || strcmp(r->err_code, "NoSuchKey") == 0 ||
                             strcmp(r->err_code, "NoSuchUpload") == 0 ||
                             strcmp(r->err_code, "BlobNotFound") == 0
                         ? S3_NOTFOUND
                         : S3_REJECTED;
    } else if (s / 100 == 5) {
        r->outcome = S3_SERVER;
    } else {
        r->outcome = S3_REJECTED;
    }
    if (r->outcome == S3_REJECTED || r->outcome == S3_SERVER) {
        if (!r->err_code[0])
            kvt_s3_xml_field(r->body, NULL, "Code", r->err_code, sizeof(r->err_code));
        kvt_s3_xml_field(r->body, NULL, "Message", r->err_msg, sizeof(r->err_msg));
        if (!r->err_code[0])
            snprintf(r->err_code, sizeof(r->err_code), "HTTP%ld", s);
        if (!r->err_msg[0])
            snprintf(r->err_msg, sizeof(r->err_msg), "%s answered %ld without an error body",
                     op_names[r->op], s);
    }
    /* the stale-upload sweep is best effort: a server without
     * ListMultipartUploads (or one refusing it) leaves health alone */
    if (r->op == S3_MPU_LIST)
        return;
    char why[400] = "";
    if (r->outcome == S3_SERVER)
        snprintf(why, sizeof(why), "%s: HTTP %ld %s", op_names[r->op], s, r->err_code);
    if (r->op == S3_PROBE) {
        probe_done(e, r->outcome != S3_SERVER, why); /* a 5xx is no recovery */
        return;
    }
    if (r->outcome == S3_SERVER)
        breaker_fail(e, why, false);
    else
        breaker_ok(e); /* the server answered */
    pthread_mutex_lock(&e->lock);
    bool log = false;
    if (r->outcome == S3_REJECTED) {
        uint64_t sig = kvt_payload_hash(r->err_code, strlen(r->err_code)) ^ (uint64_t)s;
        log = sig != e->rej_logged;
        e->rej_logged = sig;
        e->rejected = true;
        e->rej_ms = wall_ms();
        e->rej_status = s;
        snprintf(e->rej_code, sizeof(e->rej_code), "%s", r->err_code);
        snprintf(e->rej_msg, sizeof(e->rej_msg), "%s", r->err_msg);
    } else if (r->outcome == S3_OK && e->rejected) {
        e->rejected = false;
        e->rej_logged = 0;
    }
    pthread_mutex_unlock(&e->lock);
    if (log)
        kvt_error("%s: S3 refused a %s (HTTP %ld %s: %s)%s", e->l2->name, op_names[r->op], s,
                  r->err_code, r->err_msg,
                  s == 403 ? ": check aws_access_key_id / aws_secret_access_key, the region "
                             "and the bucket policy"
                           : "");
}

/* --------------------------------------------------------- the loop */

void kvt_s3_req_clear(struct s3_req *r)
{
    free(r->body);
    free(r->query);
    r->body = NULL;
    r->query = NULL;
    r->blen = r->bcap = 0;
}

static void req_reset(struct s3_engine *e, struct s3_req *r)
{
    r->status = 0;
    r->curl_rc = 0;
    r->clen = -1;
    r->rmeta[0] = r->etag[0] = r->errbuf[0] = r->err_code[0] = r->err_msg[0] = 0;
    r->got = r->sent = 0;
    r->want = -1;
    r->cut = false;
    r->blen = 0;
    r->outcome = S3_OK;
    atomic_fetch_add(&e->reqs[r->op], 1);
}

void kvt_s3_submit_reqs(struct s3_engine *e, struct s3_req *head)
{
    struct s3_req *tail = head;
    uint32_t n = 1;
    req_reset(e, head);
    for (; tail->next; tail = tail->next, n++)
        req_reset(e, tail->next);
    pthread_mutex_lock(&e->lock);
    if (e->q_tail)
        e->q_tail->next = head;
    else
        e->q_head = head;
    e->q_tail = tail;
    e->queued += n;
    pthread_mutex_unlock(&e->lock);
    curl_multi_wakeup(e->multi);
}

void kvt_s3_submit_req(struct s3_engine *e, struct s3_req *r)
{
    r->next = NULL;
    kvt_s3_submit_reqs(e, r);
}

/* failed_requests: not a missing object, a condition that did not hold, or
 * the best-effort sweep's listing */
static void count_failure(struct s3_engine *e, const struct s3_req *r)
{
    if (r->outcome != S3_OK && r->outcome != S3_NOTFOUND && r->outcome != S3_PRECOND &&
        r->op != S3_MPU_LIST)
        atomic_fetch_add(&e->failures, 1);
}

enum s3_outcome kvt_s3_perform(struct s3_engine *e, struct s3_sync *s, struct s3_req *r)
{
    req_reset(e, r);
    r->next = NULL;
    if (!kvt_s3_available(e)) {
        r->outcome = S3_UNAVAILABLE;
        snprintf(r->err_msg, sizeof(r->err_msg), "circuit open");
        return r->outcome;
    }
    if (s->h)
        curl_easy_reset(s->h);
    else
        s->h = curl_easy_init();
    r->h = s->h;
    int rc = r->h ? setup(e, r, &s->sk, true) : -ENOMEM;
    if (rc) {
        r->outcome = S3_CONN;
        snprintf(r->err_msg, sizeof(r->err_msg), "cannot start the request: %s", kvt_strerror(rc));
    } else {
        classify(e, r, curl_easy_perform(r->h));
    }
    curl_slist_free_all(r->hl);
    r->hl = NULL;
    r->h = NULL;
    count_failure(e, r);
    return r->outcome;
}

void kvt_s3_sync_free(struct s3_sync *s)
{
    if (s->h)
        curl_easy_cleanup(s->h);
    s->h = NULL;
    explicit_bzero(&s->sk, sizeof(s->sk));
}

struct pool {
    CURL **h;
    int n, cap;
};

static CURL *pool_get(struct pool *p)
{
    if (p->n)
        return p->h[--p->n];
    return curl_easy_init();
}

static void pool_put(struct pool *p, CURL *h)
{
    curl_easy_reset(h);
    if (p->n == p->cap) {
        p->cap = p->cap ? p->cap * 2 : 64;
        p->h = kvt_xrealloc(p->h, (size_t)p->cap * sizeof(CURL *));
    }
    p->h[p->n++] = h;
}

static void finish(struct s3_engine *e, struct pool *pool, struct s3_req *r)
{
    if (r->h) {
        pool_put(pool, r->h);
        r->h = NULL;
    }
    curl_slist_free_all(r->hl);
    r->hl = NULL;
    count_failure(e, r);
    if (r->done)
        r->done(e, r);
}

static void *io_main(void *arg)
{
    struct s3_engine *e = arg;
    pthread_setname_np(pthread_self(), "s3-io");
    struct pool pool = {0};
    struct s3_req *fast = NULL; /* failed at once: breaker open */
    for (;;) {
        uint64_t now = kvt_now_ns();
        struct s3_req *start = NULL, **tail = &start;
        pthread_mutex_lock(&e->lock);
        if (e->stop && !e->q_head && e->active == 0) {
            pthread_mutex_unlock(&e->lock);
            break;
        }
        bool avail = e->brk == BRK_CLOSED;
        while (e->q_head && (!avail || e->active < (uint32_t)e->max_transfers)) {
            struct s3_req *r = e->q_head;
            e->q_head = r->next;
            if (!e->q_head)
                e->q_tail = NULL;
            e->queued--;
            r->next = NULL;
            if (!avail) {
                r->next = fast;
                fast = r;
            } else {
                *tail = r;
                tail = &r->next;
                if (++e->active > e->peak_active)
                    e->peak_active = e->active;
            }
        }
        bool probe = e->brk == BRK_OPEN && now >= e->next_probe_ns && !e->stop;
        if (probe) {
            e->brk = BRK_PROBING;
            e->active++;
        }
        uint64_t next_probe = e->brk == BRK_OPEN ? e->next_probe_ns : 0;
        pthread_mutex_unlock(&e->lock);
        if (probe) { /* HEAD on the bucket: an answer below 500 closes the breaker */
            struct s3_req *pr = &e->probe;
            KVT_ASSERT(pr->h == NULL); /* the last probe finished: not in curl */
            kvt_s3_req_clear(pr);
            memset(pr, 0, sizeof(*pr));
            pr->op = S3_PROBE;
            snprintf(pr->path, sizeof(pr->path), "%s%s", e->base, e->azure ? "" : "/");
            if (e->azure) /* Get Container Properties */
                pr->query = kvt_xstrdup("restype=container");
            pr->clen = -1;
            pr->want = -1;
            atomic_fetch_add(&e->reqs[S3_PROBE], 1);
            *tail = pr;
            tail = &pr->next;
        }
        while (fast) {
            struct s3_req *r = fast;
            fast = r->next;
            r->outcome = S3_UNAVAILABLE;
            snprintf(r->err_msg, sizeof(r->err_msg), "circuit open");
            finish(e, &pool, r);
        }
        while (start) {
            struct s3_req *r = start;
            start = r->next;
            r->next = NULL;
            r->h = pool_get(&pool);
            int rc = r->h ? setup(e, r, &e->sig, false) : -ENOMEM;
            if (rc == 0 && curl_multi_add_handle(e->multi, r->h) == CURLM_OK)
                continue;
            r->outcome = S3_CONN;
            snprintf(r->err_msg, sizeof(r->err_msg), "cannot start the request: %s",
                     kvt_strerror(rc ? rc : -ENOMEM));
            pthread_mutex_lock(&e->lock);
            e->active--;
            pthread_mutex_unlock(&e->lock);
            if (r == &e->probe) { /* a probe that never went out failed */
                if (r->h)
                    pool_put(&pool, r->h);
                r->h = NULL;
                curl_slist_free_all(r->hl);
                r->hl = NULL;
                probe_done(e, false, r->err_msg);
                continue;
            }
            finish(e, &pool, r);
        }
        int running = 0;
        curl_multi_perform(e->multi, &running);
        CURLMsg *m;
        int left;
        while ((m = curl_multi_info_read(e->multi, &left))) {
            if (m->msg != CURLMSG_DONE)
                continue;
            struct s3_req *r = NULL;
            curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&r);
            CURLcode res = m->data.result;
            curl_multi_remove_handle(e->multi, m->easy_handle);
            classify(e, r, res);
            pthread_mutex_lock(&e->lock);
            e->active--;
            pthread_mutex_unlock(&e->lock);
            if (r == &e->probe) { /* classify moved the breaker out of PROBING */
                KVT_ASSERT(r->h == m->easy_handle);
                pool_put(&pool, r->h);
                r->h = NULL;
                curl_slist_free_all(r->hl);
                r->hl = NULL;
                continue;
            }
            finish(e, &pool, r);
        }
        kvt_s3_io_tick(e->l2, kvt_now_ns());
        /* sleep until curl needs us, a submit wakes us, a probe is due, or
         * (transfers running) it is time to look for stalls again */
        int timeout = 1000;
        pthread_mutex_lock(&e->lock);
        bool running_any = e->active > 0;
        pthread_mutex_unlock(&e->lock);
        if (running_any)
            timeout = (int)KVT_MAX(20L, KVT_MIN(1000L, e->request_timeout_ms / 8));
        if (next_probe) {
            uint64_t n2 = kvt_now_ns();
            timeout = next_probe > n2
                          ? (int)KVT_MIN((next_probe - n2) / 1000000 + 1, (uint64_t)timeout)
                          : 0;
        }
        pthread_mutex_lock(&e->lock);
        bool pending =
            e->q_head && (e->brk != BRK_CLOSED || e->active < (uint32_t)e->max_transfers);
        pthread_mutex_unlock(&e->lock);
        if (!pending)
            curl_multi_poll(e->multi, NULL, 0, timeout, NULL);
    }
    kvt_s3_req_clear(&e->probe);
    for (int i = 0; i < pool.n; i++)
        curl_easy_cleanup(pool.h[i]);
    free(pool.h);
    return NULL;
}

static void global_init(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
}

int kvt_s3_io_start(struct s3_engine *e, char *err, size_t errcap)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, global_init);
    e->multi = curl_multi_init();
    if (!e->multi) {
        snprintf(err, errcap, "curl_multi_init failed");
        return -ENOMEM;
    }
    curl_multi_setopt(e->multi, CURLMOPT_MAX_TOTAL_CONNECTIONS, (long)e->max_transfers);
    curl_multi_setopt(e->multi, CURLMOPT_MAX_HOST_CONNECTIONS, (long)e->max_transfers);
    curl_multi_setopt(e->multi, CURLMOPT_PIPELINING, (long)CURLPIPE_MULTIPLEX);
    int rc = pthread_create(&e->io, NULL, io_main, e);
    if (rc) {
        snprintf(err, errcap, "cannot start the I/O thread: %s", kvt_strerror(-rc));
        curl_multi_cleanup(e->multi);
        e->multi = NULL;
        return -rc;
    }
    e->io_started = true;
    return 0;
}

void kvt_s3_io_stop(struct s3_engine *e)
{
    if (!e->io_started)
        return;
    pthread_mutex_lock(&e->lock);
    e->stop = true;
    pthread_mutex_unlock(&e->lock);
    curl_multi_wakeup(e->multi);
    pthread_join(e->io, NULL);
    curl_multi_cleanup(e->multi);
    e->multi = NULL;
    e->io_started = false;
}
