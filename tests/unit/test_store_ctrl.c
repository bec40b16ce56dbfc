/* Description: store controller: a client's flush waits for its own batches
 * only, never for another client's batch stuck on an adapter. */
#include "test.h"

#include "common/util.h"
#include "ctrl/store_ctrl.h"
#include "l1/l1.h"
#include "l2/adapters.h"
#include "l2/engine.h"

#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

/* An engine that holds every store task until the test finishes it: a
 * tier whose node hangs for some keys and not for others. */
struct held {
    pthread_mutex_t lock;
    kvt_l2_task *tasks[64];
    int n;
};

static struct held held = {PTHREAD_MUTEX_INITIALIZER, {0}, 0};

static void held_submit(kvt_l2 *l2, kvt_l2_task *t)
{
    (void)l2;
    pthread_mutex_lock(&held.lock);
    held.tasks[held.n++] = t;
    pthread_mutex_unlock(&held.lock);
}

static bool held_healthy(kvt_l2 *l2, char *msg, size_t cap)
{
    (void)l2;
    snprintf(msg, cap, "ok");
    return true;
}

static const struct kvt_l2_ops held_ops = {.submit = held_submit, .healthy = held_healthy};

/* The held task whose first key is k (waits for it to arrive). */
static kvt_l2_task *take_task(const kvt_key *k)
{
    for (int spin = 0; spin < 5000; spin++) {
        pthread_mutex_lock(&held.lock);
        for (int i = 0; i < held.n; i++) {
            kvt_l2_task *t = held.tasks[i];
            if (memcmp(&t->keys[0], k, sizeof(*k)) == 0) {
                held.tasks[i] = held.tasks[--held.n];
                pthread_mutex_unlock(&held.lock);
                return t;
            }
        }
        pthread_mutex_unlock(&held.lock);
        usleep(1000);
    }
    TEST_ASSERT(!"the store task never reached the adapter");
    return NULL;
}

static void finish_ok(kvt_l2 *l2, kvt_l2_task *t)
{
    for (uint32_t i = 0; i < t->n; i++)
        kvt_l2_task_ok(t, i, t->bufs[i].len);
    kvt_l2_task_finish(l2, t);
}

static struct kvt_l1 *mk_l1(void)
{
    struct kvt_l1_opts o = {.size_bytes = 1 << 20,
                            .init_bytes = 1 << 20,
                            .lazy = true,
                            .align = 4096,
                            .write_ttl_ns = 600e9,
                            .read_ttl_ns = 300e9,
                            .policy = "LRU",
                            .watermark = 0.8,
                            .ratio = 0.2};
    struct kvt_l1 *l1 = NULL;
    char err[256];
    TEST_ASSERT(kvt_l1_create(&o, &l1, err, sizeof(err)) == 0);
    return l1;
}

static kvt_key key(int i)
{
    uint32_t ns;
    TEST_ASSERT(kvt_ns_intern("m", 1, "", 0, &ns, NULL) == 0);
    uint8_t h[32] = {0};
    memcpy(h, &i, sizeof(i));
    kvt_key k;
    TEST_ASSERT(kvt_key_make(&k, ns, h, 32, 0, 0) == 0);
    return k;
}

/* Commit one object of key k to L1 and hand it to the controller for client. */
static void store_one(struct kvt_l1 *l1, struct kvt_store_ctrl *sc, const kvt_key *k,
                      uint64_t client)
{
    kvt_objmeta m = {.len = 4096};
    struct kvt_l1_ref r;
    TEST_ASSERT(kvt_l1_reserve(l1, k, &m, &r) == 0);
    memset(r.ptr, 0x5a, 4096);
    kvt_l1_commit(l1, &r.h, 1, 0);
    kvt_store_ctrl_submit_for(sc, &r, k, 1, client);
}

static _Atomic int progress_calls;
static int progress_fd = -1;

static void on_progress(void *arg)
{
    (void)arg;
    atomic_fetch_add(&progress_calls, 1);
    uint64_t one = 1;
    ssize_t w = write(progress_fd, &one, sizeof(one));
    (void)w;
}

/* The flushes handed back within ms milliseconds (0: what is there now). */
static size_t wait_flushed(struct kvt_store_ctrl *sc, void **out, size_t max, int ms)
{
    size_t n = kvt_store_ctrl_take_flushed(sc, out, max);
    if (n || !ms)
        return n;
    struct pollfd p = {.fd = progress_fd, .events = POLLIN};
    if (poll(&p, 1, ms) == 1) {
        uint64_t v;
        ssize_t r = read(progress_fd, &v, sizeof(v));
        (void)r;
    }
    return kvt_store_ctrl_take_flushed(sc, out, max);
}

/*
 * Client A's batch hangs on the adapter; client B stores after it. B's
 * flush is answered as soon as B's own batch finished, while A's is still
 * in flight (a flush used to wait for the store controller's global done
 * sequence, so B waited for A). A's flush is handed back only when A's
 * batch finished; a client with nothing in flight is answered at once.
 */
static void test_flush_waits_for_own_batches_only(void)
{
    struct kvt_l2_spec spec;
    char err[256];
    TEST_ASSERT(
        kvt_l2_spec_parse("{\"type\": \"mock\", \"max_size_gb\": 1, \"mock_bandwidth_gb\": 1}", 0,
                          &spec, err, sizeof(err)) == 0);
    kvt_l2 *l2 = kvt_xcalloc(1, sizeof(*l2));
    TEST_ASSERT(kvt_l2_base_init(l2, &held_ops, &spec, KVT_CODEC_OBJ, 0) == 0);
    kvt_l2_spec_free(&spec);
    kvt_l2 *l2s[1] = {l2};
    struct kvt_l1 *l1 = mk_l1();
    progress_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    TEST_ASSERT(progress_fd >= 0);
    struct kvt_store_ctrl *sc;
    TEST_ASSERT(kvt_store_ctrl_start(&sc, l1, l2s, 1, KVT_STORE_DEFAULT, on_progress, NULL) == 0);
    const uint64_t A = 0x1001, B = 0x2001, C = 0x3001;
    int cookie_a, cookie_b;
    void *got[4];

    TEST_ASSERT(kvt_store_ctrl_flush_wait(sc, C, &cookie_a)); /* nothing in flight */

    kvt_key ka = key(1), kb = key(2);
    store_one(l1, sc, &ka, A);
    store_one(l1, sc, &kb, B); /* a later sequence number than A's */
    kvt_l2_task *ta = take_task(&ka), *tb = take_task(&kb);

    TEST_ASSERT(!kvt_store_ctrl_flush_wait(sc, A, &cookie_a));
    TEST_ASSERT(!kvt_store_ctrl_flush_wait(sc, B, &cookie_b));
    TEST_ASSERT(wait_flushed(sc, got, 4, 0) == 0);

    finish_ok(l2, tb); /* B's store lands; A's still hangs */
    TEST_ASSERT(wait_flushed(sc, got, 4, 5000) == 1);
    TEST_ASSERT(got[0] == &cookie_b);
    TEST_ASSERT(kvt_store_ctrl_done_seq(sc) == 0); /* A's batch, older, still holds it */
    TEST_ASSERT(wait_flushed(sc, got, 4, 100) == 0);
    TEST_ASSERT(kvt_store_ctrl_flush_wait(sc, B, &cookie_b)); /* B again: nothing in flight */

    finish_ok(l2, ta);
    TEST_ASSERT(wait_flushed(sc, got, 4, 5000) == 1);
    TEST_ASSERT(got[0] == &cookie_a);
    TEST_ASSERT(atomic_load(&progress_calls) == 2); /* one wake per flush made ready */
    kvt_store_ctrl_quiesce(sc);
    TEST_ASSERT(kvt_store_ctrl_done_seq(sc) == kvt_store_ctrl_last_seq(sc));

    kvt_store_ctrl_stop(sc);
    kvt_l2_close(l2);
    free(l2);
    kvt_l1_destroy(l1);
    close(progress_fd);
}

int main(void)
{
    RUN(test_flush_waits_for_own_batches_only);
    return TEST_RESULT();
}
