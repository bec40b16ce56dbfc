/*
 * s3 adapter: the I/O thread. One thread drives libcurl's multi interface
 * with up to s3_num_io_threads transfers at once (HTTP/2 multiplexing or a
 * pool of keep-alive connections); requests come from any thread through a
 * queue and a curl_multi_wakeup, completions run on this thread. It sleeps
 * in curl_multi_poll: no busy polling.
 *
 * Requests are built in s3_request.c (headers, signing, callbacks, the
 * no-progress deadline); their outcomes feed the circuit breaker in
 * s3_breaker.c.
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

/* ------------------------------------------------------- completion */

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
    int rc = r->h ? kvt_s3_req_setup(e, r, &s->sk, true) : -ENOMEM;
    if (rc) {
        r->outcome = S3_CONN;
        snprintf(r->err_msg, sizeof(r->err_msg), "cannot start the request: %s", kvt_strerror(rc));
    } else {
        kvt_s3_classify(e, r, curl_easy_perform(r->h));
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
            int rc = r->h ? kvt_s3_req_setup(e, r, &e->sig, false) : -ENOMEM;
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
                kvt_s3_probe_failed(e, r->err_msg);
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
            kvt_s3_classify(e, r, res);
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
