/*
 * s3 start-up listing: ListObjectsV2 (Azure: List Blobs) over key_prefix,
 * page by page on the I/O thread, restores accounting and LRU order
 * (LastModified) while the adapter serves; parked stores go once it ends.
 * With a shared budget it also recounts the record's total when the
 * record was lost. The XML helpers the other files use are here too.
 */
#include "common/log.h"
#include "common/util.h"
#include "kvtier/error.h"
#include "l2/budget.h"
#include "l2/engine.h"
#include "l2/kit/dirlock.h"
#include "l2/s3/s3_int.h"
#include "l2/s3/sigv4.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct list_state {
    struct s3_req req;
    char *token; /* continuation token of the next page */
    bool running;
    uint64_t t0, backoff_ns;
    struct kvt_l2_found_vec found;
    uint64_t pages;
    bool recount; /* a listing that only recounts the shared budget (the record was lost) */
};

/* Decode XML character references and the five entities, in place. */
static void xml_unescape(char *s)
{
    char *o = s;
    for (char *p = s; *p;) {
        if (*p != '&') {
            *o++ = *p++;
            continue;
        }
        static const struct {
            const char *e;
            char c;
        } ents[] = {
            {"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'}, {"&quot;", '"'}, {"&apos;", '\''}};
        bool done = false;
        for (size_t i = 0; i < KVT_ARRAY_LEN(ents) && !done; i++) {
            size_t l = strlen(ents[i].e);
            if (strncmp(p, ents[i].e, l) == 0) {
                *o++ = ents[i].c;
                p += l;
                done = true;
            }
        }
        if (!done && p[1] == '#') {
            char *end;
            unsigned long cp = p[2] == 'x' ? strtoul(p + 3, &end, 16) : strtoul(p + 2, &end, 10);
            if (*end == ';' && cp > 0 && cp < 0x110000) { /* as UTF-8 */
                if (cp < 0x80) {
                    *o++ = (char)cp;
                } else if (cp < 0x800) {
                    *o++ = (char)(0xc0 | (cp >> 6));
                    *o++ = (char)(0x80 | (cp & 0x3f));
                } else if (cp < 0x10000) {
                    *o++ = (char)(0xe0 | (cp >> 12));
                    *o++ = (char)(0x80 | ((cp >> 6) & 0x3f));
                    *o++ = (char)(0x80 | (cp & 0x3f));
                } else {
                    *o++ = (char)(0xf0 | (cp >> 18));
                    *o++ = (char)(0x80 | ((cp >> 12) & 0x3f));
                    *o++ = (char)(0x80 | ((cp >> 6) & 0x3f));
                    *o++ = (char)(0x80 | (cp & 0x3f));
                }
                p = end + 1;
                done = true;
            }
        }
        if (!done)
            *o++ = *p++;
    }
    *o = 0;
}

bool kvt_s3_xml_field(const char *a, const char *z, const char *tag, char *out, size_t cap)
{
    char open[48], close_[48];
    snprintf(open, sizeof(open), "<%s>", tag);
    snprintf(close_, sizeof(close_), "</%s>", tag);
    out[0] = 0;
    if (!a)
        return false;
    if (!z)
        z = a + strlen(a);
    const char *p = strstr(a, open);
    if (!p || p >= z)
        return false;
    p += strlen(open);
    const char *q = strstr(p, close_);
    if (!q || q > z)
        return false;
    size_t n = KVT_MIN((size_t)(q - p), cap - 1);
    memcpy(out, p, n);
    out[n] = 0;
    xml_unescape(out);
    return true;
}

int64_t kvt_s3_iso_ms(const char *s)
{
    struct tm tm;
    memset(&tm, 0, sizeof(tm));
    int ms = 0;
    if (sscanf(s, "%d-%d-%dT%d:%d:%d.%dZ", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
               &tm.tm_min, &tm.tm_sec, &ms) < 6)
        return 0;
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    return (int64_t)timegm(&tm) * 1000 + ms;
}

/* Parse one ListObjectsV2 page (Azure: List Blobs); returns whether more
 * pages follow. */
static bool list_parse(struct s3_engine *e, struct list_state *ls, const char *body)
{
    const char *p = body;
    char key[2048], num[32], date[64];
    const char *open = e->azure ? "<Blob>" : "<Contents>",
               *close = e->azure ? "</Blob>" : "</Contents>";
    while ((p = strstr(p, open))) {
        const char *z = strstr(p, close);
        if (!z)
            break;
        if (kvt_s3_xml_field(p, z, e->azure ? "Name" : "Key", key, sizeof(key)) &&
            kvt_s3_xml_field(p, z, e->azure ? "Content-Length" : "Size", num, sizeof(num))) {
            size_t kl = strlen(key);
            uint64_t size = strtoull(num, NULL, 10);
            kvt_key k;
            bool ours = kl > e->prefix_len && strncmp(key, e->prefix, e->prefix_len) == 0;
            if ((ours && strcmp(key + e->prefix_len, KVT_BUDGET_FILE_NAME) == 0) ||
                (size == 0 && e->shared_budget)) {
                /* the shared budget's record, a removal's marker: not objects */
            } else if (ours && size >= S3_HDR && size <= UINT32_MAX &&
                       kvt_key_decode(KVT_CODEC_OBJ, key + e->prefix_len, kl - e->prefix_len, &k) ==
                           0) {
                kvt_key ck;
                kvt_key_canon(KVT_CODEC_OBJ, &k, &ck);
                int64_t ms = 0;
                if (kvt_s3_xml_field(p, z, e->azure ? "Last-Modified" : "LastModified", date,
                                     sizeof(date)))
                    ms = e->azure ? kvt_s3_http_date_ms(date) : kvt_s3_iso_ms(date);
                kvt_l2_found_push(&ls->found, &ck, (uint32_t)size, 0, S3_HDR, 0, ms * 1000000);
            } else {
                atomic_fetch_add(&e->foreign, 1);
            }
        }
        p = z;
    }
    char trunc[16] = "", tok[1100] = "";
    free(ls->token);
    ls->token = NULL;
    if (e->azure) { /* a non-empty NextMarker continues */
        if (kvt_s3_xml_field(body, NULL, "NextMarker", tok, sizeof(tok)) && tok[0])
            ls->token = kvt_xstrdup(tok);
        return ls->token != NULL;
    }
    kvt_s3_xml_field(body, NULL, "IsTruncated", trunc, sizeof(trunc));
    if (strcmp(trunc, "true") == 0 &&
        kvt_s3_xml_field(body, NULL, "NextContinuationToken", tok, sizeof(tok)) && tok[0])
        ls->token = kvt_xstrdup(tok);
    return ls->token != NULL;
}

/* The listing ended (complete, or given up): adopt what was found, newest
 * first at the cold end so the oldest ends up coldest, then let the
 * parked stores go. */
static void list_finish(kvt_l2 *l2, struct s3_engine *e, struct list_state *ls, bool complete)
{
    if (ls->recount) { /* the objects are indexed already: only the record's total */
        uint64_t walked = 0;
        for (size_t i = 0; i < ls->found.n; i++)
            walked += ls->found.v[i].stored;
        ls->found.n = 0;
        ls->recount = false;
        kvt_l2_budget_recount_end(l2, walked, complete);
        return;
    }
    char where[1200];
    snprintf(where, sizeof(where), "%s://%s%s/%s (%llu pages%s)", e->scheme, e->host, e->base,
             e->prefix, (unsigned long long)ls->pages, complete ? "" : ", listing given up");
    if (!complete) /* the shared budget's recount: the walk may have missed objects */
        kvt_l2_budget_recount_end(l2, 0, false);
    kvt_l2_finish_recovery(l2, &ls->found, ls->t0, where);
    pthread_mutex_lock(&e->lock);
    e->list_done = true;
    pthread_mutex_unlock(&e->lock);
    if (complete)
        kvt_s3_sweep_uploads(e);
    for (kvt_l2_task *p = kvt_l2_park_take(&e->park, true), *nx; p; p = nx) {
        nx = p->next;
        p->next = NULL;
        l2->ops->submit(l2, p); /* the engine's own submit */
    }
}

static void list_page(struct s3_engine *e, struct list_state *ls);

/* The listing (or its recount's snapshot) failed: start over after a pause
 * doubling from 1 s up to S3_PROBE_MAX_NS. */
static void list_retry_later(struct s3_engine *e, struct list_state *ls)
{
    ls->backoff_ns = ls->backoff_ns ? KVT_MIN(ls->backoff_ns * 2, S3_PROBE_MAX_NS) : 1000000000ull;
    pthread_mutex_lock(&e->lock);
    e->list_retry_ns = kvt_now_ns() + ls->backoff_ns;
    pthread_mutex_unlock(&e->lock);
}

static void list_done(struct s3_engine *e, struct s3_req *r)
{
    kvt_l2 *l2 = e->l2;
    struct list_state *ls = r->ctx;
    ls->pages++;
    pthread_mutex_lock(&e->lock);
    bool stop = e->stop;
    pthread_mutex_unlock(&e->lock);
    if (r->outcome == S3_OK) {
        bool more = list_parse(e, ls, r->body ? r->body : "");
        kvt_s3_req_clear(r);
        if (more && !stop) {
            list_page(e, ls);
            return;
        }
        ls->running = false;
        list_finish(l2, e, ls, !more);
        return;
    }
    ls->running = false;
    if (r->outcome == S3_REJECTED || r->outcome == S3_NOTFOUND) {
        kvt_warn("%s: cannot list %s://%s%s/%s (HTTP %ld %s: %s): usage starts from what this "
                 "server stores and finds by lookups",
                 l2->name, e->scheme, e->host, e->base, e->prefix, r->status, r->err_code,
                 r->err_msg);
        kvt_s3_req_clear(r);
        list_finish(l2, e, ls, false);
        return;
    }
    /* unreachable or a server error: try again later (stores fail meanwhile
     * if the breaker opened; otherwise they stay parked) */
    list_retry_later(e, ls);
    kvt_debug("%s: listing failed (%s), retrying in %.1f s", l2->name,
              kvt_s3_outcome_name(r->outcome), (double)ls->backoff_ns / 1e9);
    free(ls->token); /* start over: the page set may have changed */
    ls->token = NULL;
    ls->found.n = 0;
    kvt_s3_req_clear(r);
}

static void list_page(struct s3_engine *e, struct list_state *ls)
{
    struct s3_req *r = &ls->req;
    kvt_s3_req_clear(r);
    memset(r, 0, sizeof(*r));
    r->op = S3_LIST;
    snprintf(r->path, sizeof(r->path), "%s%s", e->base, e->azure ? "" : "/");
    struct kvt_sigv4_pair q[5];
    size_t nq = 0;
    if (e->azure) { /* List Blobs */
        q[nq++] = (struct kvt_sigv4_pair){"comp", "list"};
        q[nq++] = (struct kvt_sigv4_pair){"maxresults", "1000"};
        q[nq++] = (struct kvt_sigv4_pair){"restype", "container"};
        if (ls->token)
            q[nq++] = (struct kvt_sigv4_pair){"marker", ls->token};
    } else {
        q[nq++] = (struct kvt_sigv4_pair){"list-type", "2"};
        q[nq++] = (struct kvt_sigv4_pair){"max-keys", "1000"};
        if (ls->token)
            q[nq++] = (struct kvt_sigv4_pair){"continuation-token", ls->token};
    }
    if (e->prefix_len)
        q[nq++] = (struct kvt_sigv4_pair){"prefix", e->prefix};
    size_t cap = 3 * (strlen(e->prefix) + (ls->token ? strlen(ls->token) : 0)) + 128;
    r->query = kvt_xmalloc(cap);
    kvt_sigv4_canonical_query(q, nq, r->query, cap);
    r->done = list_done;
    r->ctx = ls;
    ls->running = true;
    kvt_s3_submit_req(e, r);
}

/* Called by the I/O thread on every loop: start or retry the listing. */
void kvt_s3_io_tick(kvt_l2 *l2, uint64_t now)
{
    struct s3_engine *e = l2->engine;
    struct list_state *ls = e->list;
    if (e->shared_budget && !ls->running && atomic_exchange(&e->relist, false)) {
        pthread_mutex_lock(&e->lock);
        bool started = e->list_done; /* the start-up listing recounts anyway */
        pthread_mutex_unlock(&e->lock);
        if (started && !ls->recount) {
            ls->recount = true;
            free(ls->token);
            ls->token = NULL;
            ls->found.n = 0;
            ls->backoff_ns = 0;
        }
    }
    pthread_mutex_lock(&e->lock);
    bool go = (!e->list_done || ls->recount) && !e->stop && e->brk == BRK_CLOSED &&
              now >= e->list_retry_ns;
    pthread_mutex_unlock(&e->lock);
    if (!go || ls->running)
        return;
    if (!ls->t0)
        ls->t0 = kvt_now_ns();
    if (e->shared_budget && !ls->token) {
        /* the walk starts: the shared budget's recount takes its snapshot
         * (a step on the record); unanswered, the listing waits for it */
        char err[300];
        if (kvt_l2_budget_recount_begin(l2, err, sizeof(err))) {
            list_retry_later(e, ls);
            kvt_warn("%s: %s: the start-up listing waits %.1f s for it", l2->name, err,
                     (double)ls->backoff_ns / 1e9);
            return;
        }
    }
    list_page(e, ls);
}

struct list_state *kvt_s3_list_new(void)
{
    return kvt_xcalloc(1, sizeof(struct list_state));
}

void kvt_s3_list_free(struct list_state *ls)
{
    if (!ls)
        return;
    kvt_s3_req_clear(&ls->req);
    free(ls->token);
    free(ls->found.v);
    free(ls);
}
