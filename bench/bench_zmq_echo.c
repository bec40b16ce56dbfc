/*
 * The transport's own ceiling: a bare ZeroMQ ROUTER/DEALER echo with the
 * message sizes and concurrency of bench_client, and no kvtier logic.
 *
 *   bench_zmq_echo serve ENDPOINT [--size B]
 *       a ROUTER socket on one thread (as the server's rpc thread) and one
 *       ZeroMQ I/O thread (the server's default --io-threads): a "store"
 *       request (a 16-byte header and a payload frame) is answered with 16
 *       bytes, a "retrieve" request (16 bytes) with a 16-byte header and B
 *       bytes sent zero-copy from one buffer (as the server sends L1
 *       objects), a "ping" with 16 bytes.
 *   bench_zmq_echo run URL MODE [--size B] [--conc C] [--seconds S]
 *       C DEALER clients on threads sharing one context with one I/O thread
 *       (as the kvt_clients of one process do), one request in flight each;
 *       MODE store, retrieve or ping.
 *       Prints "RESULT echo_<mode>_rps <requests/s>".
 *
 * bench/run.sh l1 runs it beside kvtier's inline and small rows, so that
 * "inline 4 MiB", "ping" and "lookup" read as fractions of what ZeroMQ
 * itself carries on this machine, as well as against redis-benchmark.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

static size_t size = 4u << 20;
static int conc = 4;
static double seconds = 3;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void die(const char *what)
{
    fprintf(stderr, "bench_zmq_echo: %s: %s\n", what, zmq_strerror(zmq_errno()));
    exit(1);
}

enum { OP_STORE = 1, OP_RETRIEVE = 2, OP_PING = 3 };

static void nofree(void *data, void *hint)
{
    (void)data;
    (void)hint;
}

static _Noreturn void serve(const char *ep)
{
    void *ctx = zmq_ctx_new();
    zmq_ctx_set(ctx, ZMQ_IO_THREADS, 1);
    void *s = zmq_socket(ctx, ZMQ_ROUTER);
    int hwm = 0;
    zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof(hwm));
    zmq_setsockopt(s, ZMQ_RCVHWM, &hwm, sizeof(hwm));
    if (zmq_bind(s, ep))
        die("bind");
    char *blob = malloc(size);
    memset(blob, 0x5a, size);
    uint8_t hdr[16] = {0};
    for (;;) {
        zmq_msg_t id, h;
        zmq_msg_init(&id);
        zmq_msg_init(&h);
        if (zmq_msg_recv(&id, s, 0) < 0 || zmq_msg_recv(&h, s, 0) < 0)
            die("recv");
        int op = zmq_msg_size(&h) > 0 ? ((uint8_t *)zmq_msg_data(&h))[0] : 0;
        while (zmq_msg_more(&h)) { /* drop the payload frames */
            zmq_msg_close(&h);
            zmq_msg_init(&h);
            if (zmq_msg_recv(&h, s, 0) < 0)
                die("recv");
        }
        zmq_msg_close(&h);
        zmq_msg_send(&id, s, ZMQ_SNDMORE);
        if (op == OP_RETRIEVE) {
            zmq_send(s, hdr, sizeof(hdr), ZMQ_SNDMORE);
            zmq_msg_t b;
            zmq_msg_init_data(&b, blob, size, nofree, NULL);
            if (zmq_msg_send(&b, s, 0) < 0)
                die("send");
        } else if (zmq_send(s, hdr, sizeof(hdr), 0) < 0) {
            die("send");
        }
    }
}

static const char *url;
static int mode;
static _Atomic bool go, stop_flag;
static char *payload;
static void *cctx; /* the clients' context */

struct worker {
    pthread_t thr;
    uint64_t ops;
};

static void *work(void *arg)
{
    struct worker *w = arg;
    void *s = zmq_socket(cctx, ZMQ_DEALER);
    if (zmq_connect(s, url))
        die("connect");
    uint8_t hdr[16] = {(uint8_t)mode};
    zmq_msg_t r;
    while (!atomic_load(&go))
        ;
    while (!atomic_load(&stop_flag)) {
        if (mode == OP_STORE) {
            zmq_send(s, hdr, sizeof(hdr), ZMQ_SNDMORE);
            zmq_msg_t p;
            zmq_msg_init_data(&p, payload, size, nofree, NULL);
            if (zmq_msg_send(&p, s, 0) < 0)
                die("send");
        } else if (zmq_send(s, hdr, sizeof(hdr), 0) < 0) {
            die("send");
        }
        do { /* the whole reply */
            zmq_msg_init(&r);
            if (zmq_msg_recv(&r, s, 0) < 0)
                die("recv");
            bool more = zmq_msg_more(&r);
            zmq_msg_close(&r);
            if (!more)
                break;
        } while (1);
        w->ops++;
    }
    zmq_close(s);
    return NULL;
}

static int run(const char *m)
{
    mode = !strcmp(m, "store")      ? OP_STORE
           : !strcmp(m, "retrieve") ? OP_RETRIEVE
           : !strcmp(m, "ping")     ? OP_PING
                                    : 0;
    if (!mode) {
        fprintf(stderr, "bench_zmq_echo: unknown mode %s (store, retrieve, ping)\n", m);
        return 2;
    }
    payload = malloc(size);
    memset(payload, 0x33, size);
    cctx = zmq_ctx_new();
    zmq_ctx_set(cctx, ZMQ_IO_THREADS, 1);
    struct worker *ws = calloc((size_t)conc, sizeof(*ws));
    for (int i = 0; i < conc; i++)
        pthread_create(&ws[i].thr, NULL, work, &ws[i]);
    struct timespec ts = {0, 200000000};
    nanosleep(&ts, NULL); /* connect */
    double t0 = now();
    atomic_store(&go, true);
    while (now() - t0 < seconds) {
        ts.tv_sec = 0;
        ts.tv_nsec = 10000000;
        nanosleep(&ts, NULL);
    }
    atomic_store(&stop_flag, true);
    double dt = now() - t0;
    uint64_t ops = 0;
    for (int i = 0; i < conc; i++) {
        pthread_join(ws[i].thr, NULL);
        ops += ws[i].ops;
    }
    printf("RESULT echo_%s_rps %.1f\n", m, (double)ops / dt);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 3 || (strcmp(argv[1], "serve") && (strcmp(argv[1], "run") || argc < 4))) {
        fprintf(stderr, "usage: bench_zmq_echo serve ENDPOINT [--size B]\n"
                        "       bench_zmq_echo run URL store|retrieve|ping [--size B] [--conc C] "
                        "[--seconds S]\n");
        return 2;
    }
    int first = !strcmp(argv[1], "serve") ? 3 : 4;
    for (int i = first; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--size"))
            size = strtoull(argv[i + 1], NULL, 0);
        else if (!strcmp(argv[i], "--conc"))
            conc = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--seconds"))
            seconds = atof(argv[i + 1]);
    }
    if (!strcmp(argv[1], "serve"))
        serve(argv[2]);
    url = argv[2];
    return run(argv[3]);
}
