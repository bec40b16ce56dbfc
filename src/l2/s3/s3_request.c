/*
 * s3 adapter: one request's easy handle: URL, method, body source and
 * sink, the signed headers (or Azure's), and the progress callback that
 * enforces the deadline.
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
int kvt_s3_req_setup(struct s3_engine *e, struct s3_req *r, struct s3_sigkey *sk, bool sync)
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
