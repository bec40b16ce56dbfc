/* Description: s3 circuit breaker: only the probe moves a half-open
 * breaker; a probe answered 5xx fails and doubles the back-off; one stalled
 * request opens it at once; the last error is cleared when S3 answers. */
#include "test.h"

#include "l2/s3/s3_breaker.c" /* its statics: breaker_ok, breaker_fail, probe_done */

static struct s3_engine *mk(void)
{
    kvt_l2 *l2 = kvt_xcalloc(1, sizeof(*l2));
    snprintf(l2->name, sizeof(l2->name), "s3[0]");
    struct s3_engine *e = kvt_xcalloc(1, sizeof(*e));
    e->l2 = l2;
    l2->engine = e;
    pthread_mutex_init(&e->lock, NULL);
    kvt_l2_park_init(&e->park);
    snprintf(e->host, sizeof(e->host), "127.0.0.1:9");
    e->breaker_threshold = 3;
    return e;
}

static void rm(struct s3_engine *e)
{
    kvt_l2_park_destroy(&e->park);
    pthread_mutex_destroy(&e->lock);
    free(e->l2);
    free(e);
}

static enum s3_breaker state(struct s3_engine *e)
{
    pthread_mutex_lock(&e->lock);
    enum s3_breaker b = e->brk;
    pthread_mutex_unlock(&e->lock);
    return b;
}

/* What io_main does on the OPEN -> PROBING edge. */
static void start_probe(struct s3_engine *e)
{
    pthread_mutex_lock(&e->lock);
    TEST_ASSERT(e->brk == BRK_OPEN);
    e->brk = BRK_PROBING;
    pthread_mutex_unlock(&e->lock);
}

/* The crash's sequence: in PROBING, a transfer that started before the
 * opening fails (or succeeds): the state stays PROBING, so no second probe
 * can start while the first is in flight. */
static void test_only_the_probe_moves_probing(void)
{
    struct s3_engine *e = mk();
    for (int i = 0; i < 3; i++)
        breaker_fail(e, "GET Couldn't connect", false);
    TEST_ASSERT(state(e) == BRK_OPEN && e->brk_opens == 1);
    start_probe(e);
    breaker_fail(e, "GET: no progress for 2.0 s (request_timeout)", true);
    TEST_ASSERT(state(e) == BRK_PROBING);
    breaker_ok(e);
    TEST_ASSERT(state(e) == BRK_PROBING && e->brk_opens == 1);
    TEST_ASSERT(e->conn_err[0]); /* the probe decides when the error goes */
    probe_done(e, true, "");
    TEST_ASSERT(state(e) == BRK_CLOSED && !e->conn_err[0] && e->conn_err_ms == 0);
    TEST_ASSERT(e->conn_errors == 0 && e->brk_opens == 1);
    rm(e);
}

/* A probe answered 500 is a failure: the breaker stays open and the next
 * probe waits twice as long, up to S3_PROBE_MAX_NS; it never closes in
 * between (it used to close and reopen: flapping). */
static void test_failed_probe_doubles_the_backoff(void)
{
    struct s3_engine *e = mk();
    for (int i = 0; i < 3; i++)
        breaker_fail(e, "PUT: HTTP 500 InternalError", false);
    TEST_ASSERT(state(e) == BRK_OPEN && e->probe_backoff_ns == S3_PROBE_MIN_NS);
    uint64_t want = S3_PROBE_MIN_NS;
    for (int i = 0; i < 8; i++) {
        start_probe(e);
        uint64_t t0 = kvt_now_ns();
        probe_done(e, false, "PROBE: HTTP 500 InternalError");
        want = KVT_MIN(want * 2, S3_PROBE_MAX_NS);
        TEST_ASSERT(state(e) == BRK_OPEN && e->probe_backoff_ns == want);
        TEST_ASSERT(e->next_probe_ns >= t0 + want);
        TEST_ASSERT(strstr(e->conn_err, "HTTP 500") && e->conn_err_ms > 0);
    }
    TEST_ASSERT(want == S3_PROBE_MAX_NS && e->brk_opens == 1);
    start_probe(e);
    probe_done(e, true, "");
    TEST_ASSERT(state(e) == BRK_CLOSED && e->brk_opens == 1);
    rm(e);
}

/* Below the threshold: errors count and a success clears them and the last
 * error; one stall opens at once. */
static void test_threshold_stall_and_clearing(void)
{
    struct s3_engine *e = mk();
    breaker_fail(e, "GET Recv failure", false);
    breaker_fail(e, "GET Recv failure", false);
    TEST_ASSERT(state(e) == BRK_CLOSED && e->conn_errors == 2 && e->conn_err[0]);
    breaker_ok(e);
    TEST_ASSERT(e->conn_errors == 0 && !e->conn_err[0]);
    breaker_fail(e, "HEAD: no progress for 2.0 s (request_timeout)", true);
    TEST_ASSERT(state(e) == BRK_OPEN && e->brk_opens == 1 && e->conn_errors == 1);
    rm(e);
}

int main(void)
{
    RUN(test_only_the_probe_moves_probing);
    RUN(test_failed_probe_doubles_the_backoff);
    RUN(test_threshold_stall_and_clearing);
    return TEST_RESULT();
}
