/*
 * s3 adapter: what a finished request means (its outcome) and the circuit
 * breaker it feeds, with the health line and the last error.
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
 * Locks: e->lock guards the breaker and the error fields.
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
void kvt_s3_classify(struct s3_engine *e, struct s3_req *r, CURLcode rc)
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

void kvt_s3_probe_failed(struct s3_engine *e, const char *why)
{
    probe_done(e, false, why);
}
