/* kvtier C client: one DEALER socket, request/reply with ids, shm mapping. */
#include "client/client_int.h"
#include "kvtier/error.h"
#include "common/util.h"
#include "common/url.h"
#include "common/le.h"
#include "common/secret.h"
#include "key/key.h"
#include "proto/wire.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <stddef.h>
#include <sys/stat.h>
#include <unistd.h>
#include <stdatomic.h>
#include <zmq.h>

void kvt_c_rep_free(struct rep *r)
{
    msgpack_unpacked_destroy(&r->up);
    zmq_msg_close(&r->body);
    for (uint32_t i = 0; i < r->nframes; i++)
        zmq_msg_close(&r->frames[i]);
    free(r->frames);
    r->frames = NULL;
    r->nframes = 0;
}

/* An empty reply, ready to receive into (rep_free undoes it). */
void kvt_c_rep_init(struct rep *r)
{
    memset(r, 0, sizeof(*r));
    msgpack_unpacked_init(&r->up);
    zmq_msg_init(&r->body);
}

int kvt_c_seterr(kvt_client *c, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof(c->err), fmt, ap);
    va_end(ap);
    return rc;
}

const char *kvt_client_last_error(const kvt_client *c)
{
    return c->err;
}

bool kvt_client_shm_active(const kvt_client *c)
{
    return c->shm != NULL;
}

bool kvt_client_pool(const kvt_client *c, void **base, size_t *size)
{
    *base = c->shm;
    *size = c->shm ? (size_t)c->shm_size : 0;
    return c->shm != NULL;
}

bool kvt_client_local_active(const kvt_client *c)
{
    return c->lfd >= 0;
}

int kvt_client_chunk_size(const kvt_client *c)
{
    return c->chunk_size;
}

/* One ZeroMQ context (and so one I/O thread) per process, shared by every
 * client, as ZeroMQ recommends; terminated when the last client closes. */
static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER;
static void *shared_ctx; /* guarded by ctx_lock */
static int ctx_users;    /* guarded by ctx_lock */

static void *ctx_get(void)
{
    pthread_mutex_lock(&ctx_lock);
    if (!shared_ctx) {
        shared_ctx = zmq_ctx_new();
        const char *e = getenv("KVTIER_IO_THREADS"); /* client.h */
        long n = e ? strtol(e, NULL, 10) : 0;
        if (shared_ctx && n > 1 && n <= 64)
            zmq_ctx_set(shared_ctx, ZMQ_IO_THREADS, (int)n);
    }
    void *c = shared_ctx;
    if (c)
        ctx_users++;
    pthread_mutex_unlock(&ctx_lock);
    return c;
}

static void ctx_put(void)
{
    pthread_mutex_lock(&ctx_lock);
    void *term = NULL;
    if (--ctx_users == 0) {
        term = shared_ctx;
        shared_ctx = NULL;
    }
    pthread_mutex_unlock(&ctx_lock);
    if (term)
        zmq_ctx_term(term);
}

static int new_socket(kvt_client *c)
{
    if (c->mon)
        zmq_close(c->mon);
    c->mon = NULL;
    if (c->sock)
        zmq_close(c->sock);
    c->sock = zmq_socket(c->ctx, ZMQ_DEALER);
    if (!c->sock)
        return -errno;
    int linger = 0, zero = 0;
    zmq_setsockopt(c->sock, ZMQ_LINGER, &linger, sizeof(linger));
    zmq_setsockopt(c->sock, ZMQ_SNDHWM, &zero, sizeof(zero));
    int rc = kvt_curve_keys_apply(c->sock, &c->curve);
    if (rc)
        return kvt_c_seterr(c, rc, "cannot set up CURVE: %s", kvt_strerror(rc));
    if (c->curve.on) { /* the server's ZAP refusal arrives as a monitor event */
        static _Atomic unsigned seq;
        char ep[96];
        snprintf(ep, sizeof(ep), "inproc://kvtier-client-mon-%p-%u", (void *)c,
                 atomic_fetch_add(&seq, 1));
        if (zmq_socket_monitor(c->sock, ep, ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) == 0) {
            c->mon = zmq_socket(c->ctx, ZMQ_PAIR);
            if (c->mon && zmq_connect(c->mon, ep) < 0) {
                zmq_close(c->mon);
                c->mon = NULL;
            }
        }
    }
    if (zmq_connect(c->sock, c->url) < 0)
        return kvt_c_seterr(c, -errno, "cannot connect to %s: %s", c->url, kvt_strerror(-errno));
    return 0;
}

/* Read the monitor's events; true if one says the server refused our key. */
static bool key_refused(kvt_client *c)
{
    bool refused = false;
    for (;;) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, c->mon, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            return refused;
        }
        if (zmq_msg_size(&m) >= 2) {
            uint16_t ev;
            memcpy(&ev, zmq_msg_data(&m), 2); /* host order, as libzmq writes it */
            refused |= ev == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;
        }
        bool more = zmq_msg_more(&m);
        zmq_msg_close(&m);
        while (more) { /* the endpoint frame */
            zmq_msg_init(&m);
            more = zmq_msg_recv(&m, c->mon, 0) >= 0 && zmq_msg_more(&m);
            zmq_msg_close(&m);
        }
    }
}

static void zc_free(void *data, void *hint)
{
    (void)data;
    kvt_client *c = hint;
    pthread_mutex_lock(&c->zc_lock);
    if (--c->zc_pending == 0)
        pthread_cond_broadcast(&c->zc_cond);
    pthread_mutex_unlock(&c->zc_lock);
}

/* Wait until ZeroMQ released every zero-copy buffer we handed it. */
static void zc_wait(kvt_client *c)
{
    pthread_mutex_lock(&c->zc_lock);
    while (c->zc_pending)
        pthread_cond_wait(&c->zc_cond, &c->zc_lock);
    pthread_mutex_unlock(&c->zc_lock);
}

/* Decode a received reply's msgpack body; a non-zero status becomes the
 * client's error (with the server's message). On failure out is freed. */
static int reply_decode(kvt_client *c, struct rep *out)
{
    size_t off = 0;
    if (msgpack_unpack_next(&out->up, zmq_msg_data(&out->body), zmq_msg_size(&out->body), &off) !=
        MSGPACK_UNPACK_SUCCESS) {
        kvt_c_rep_free(out);
        return kvt_c_seterr(c, KVT_E_PROTO, "malformed reply body");
    }
    if (out->status) {
        const char *msg = "";
        size_t ml = 0;
        kvt_mp_str(&out->up.data, "message", false, &msg, &ml, NULL);
        kvt_c_seterr(c, out->status, "%s: %.*s", kvt_errname(out->status), (int)ml, msg);
        int st = out->status;
        kvt_c_rep_free(out);
        return st;
    }
    return 0;
}

/* Send a request and wait for its reply. Data frames are sent zero-copy:
 * the caller's buffers must stay valid until this returns (it returns only
 * after ZeroMQ released them). */
static int call_zmq(kvt_client *c, const char *op, const msgpack_sbuffer *body,
                    const void *const *bufs, const size_t *lens, size_t nbufs, struct rep *out)
{
    kvt_c_rep_init(out);
    uint64_t rid = ++c->next_rid;
    c->err[0] = 0;
    bool more = true;
    if (zmq_send(c->sock, &rid, sizeof(rid), ZMQ_SNDMORE) < 0 ||
        zmq_send(c->sock, op, strlen(op), ZMQ_SNDMORE) < 0 ||
        zmq_send(c->sock, body ? body->data : "\x80", body ? body->size : 1,
                 nbufs ? ZMQ_SNDMORE : 0) < 0)
        return kvt_c_seterr(c, -errno, "send failed: %s", kvt_strerror(-errno));
    for (size_t i = 0; i < nbufs; i++) {
        zmq_msg_t m;
        pthread_mutex_lock(&c->zc_lock);
        c->zc_pending++;
        pthread_mutex_unlock(&c->zc_lock);
        zmq_msg_init_data(&m, (void *)bufs[i], lens[i], zc_free, c);
        if (zmq_msg_send(&m, c->sock, i + 1 < nbufs ? ZMQ_SNDMORE : 0) < 0) {
            zmq_msg_close(&m);
            zc_wait(c);
            return kvt_c_seterr(c, -errno, "send failed: %s", kvt_strerror(-errno));
        }
    }
    /* kvt_client_open's hello has a short timeout of its own, and when no
     * reply came within 50 ms, a probe tells "nobody listens there" (ZeroMQ
     * would keep reconnecting silently) from "a server that is slow" */
    int tmo = c->opening ? KVT_MIN(c->connect_timeout_ms, c->timeout_ms) : c->timeout_ms;
    uint64_t start = kvt_now_ns(), deadline = start + (uint64_t)tmo * 1000000ull;
    uint64_t probe_at = c->opening ? start + (uint64_t)KVT_MIN(50, tmo) * 1000000ull : UINT64_MAX;
    for (;;) {
        uint64_t now = kvt_now_ns();
        if (now >= probe_at && now < deadline) {
            probe_at = UINT64_MAX;
            char why[256];
            int pr =
                kvt_url_probe(c->url, (int)((deadline - now) / 1000000ull) + 1, why, sizeof(why));
            if (pr) {
                new_socket(c);
                zc_wait(c);
                return kvt_c_seterr(c, pr, "no server at %s: %s", c->url, why);
            }
            continue;
        }
        if (now >= deadline) {
            /* drop the connection: a late reply must not be taken for the
             * next request's, and queued frames must be released */
            new_socket(c);
            zc_wait(c);
            if (c->opening)
                return kvt_c_seterr(c, KVT_E_TIMEOUT,
                                    "no connection to %s, or no answer to hello, within %d ms "
                                    "(the connect timeout: is a kvtier server listening there?%s)",
                                    c->url, tmo,
                                    c->curve.on
                                        ? " With CURVE: does it admit this client's key, and "
                                          "is the server key its public key?"
                                        : " If it requires authentication, give a key pair: "
                                          "KVTIER_SERVER_KEY and KVTIER_CLIENT_KEY");
            return kvt_c_seterr(c, KVT_E_TIMEOUT, "no reply to %s within %d ms from %s", op,
                                c->timeout_ms, c->url);
        }
        zmq_pollitem_t it[2] = {{.socket = c->sock, .events = ZMQ_POLLIN},
                                {.socket = c->mon, .events = ZMQ_POLLIN}};
        uint64_t until = KVT_MIN(deadline, probe_at);
        int pr = zmq_poll(it, c->mon ? 2 : 1, (long)((until - now) / 1000000ull) + 1);
        if (pr < 0 && errno != EINTR)
            return kvt_c_seterr(c, -errno, "poll failed: %s", kvt_strerror(-errno));
        if (pr > 0 && c->mon && (it[1].revents & ZMQ_POLLIN) && key_refused(c)) {
            new_socket(c);
            zc_wait(c);
            return kvt_c_seterr(c, KVT_E_DENIED,
                                "%s refused this client's key at the CURVE handshake: it is not in "
                                "the server's authorized-clients file (docs/security.md)",
                                c->url);
        }
        if (pr <= 0 || !(it[0].revents & ZMQ_POLLIN))
            continue;
        /* read one whole reply */
        zmq_msg_t parts[3];
        uint32_t np = 0;
        zmq_msg_t *frames = NULL;
        uint32_t nf = 0, capf = 0;
        more = true;
        while (more) {
            zmq_msg_t m;
            zmq_msg_init(&m);
            if (zmq_msg_recv(&m, c->sock, 0) < 0) {
                zmq_msg_close(&m);
                break;
            }
            more = zmq_msg_more(&m);
            if (np < 3) {
                memcpy(&parts[np++], &m, sizeof(m));
            } else {
                if (nf == capf) {
                    capf = capf ? capf * 2 : 8;
                    frames = kvt_xrealloc(frames, capf * sizeof(zmq_msg_t));
                }
                memcpy(&frames[nf++], &m, sizeof(m));
            }
        }
        bool mine = np == 3 && zmq_msg_size(&parts[0]) == sizeof(rid) &&
                    memcmp(zmq_msg_data(&parts[0]), &rid, sizeof(rid)) == 0 &&
                    zmq_msg_size(&parts[1]) == 4;
        if (!mine) { /* a stale reply (e.g. to a fire-and-forget free_locks) */
            for (uint32_t i = 0; i < np; i++)
                zmq_msg_close(&parts[i]);
            for (uint32_t i = 0; i < nf; i++)
                zmq_msg_close(&frames[i]);
            free(frames);
            continue;
        }
        out->status = kvt_wire_get_status(zmq_msg_data(&parts[1]));
        zmq_msg_close(&parts[0]);
        zmq_msg_close(&parts[1]);
        zmq_msg_close(&out->body);
        /* move first, parse after: small messages keep their bytes inside the
         * zmq_msg_t, and the decoded objects point into them */
        memcpy(&out->body, &parts[2], sizeof(zmq_msg_t));
        out->frames = frames;
        out->nframes = nf;
        zc_wait(c);
        return reply_decode(c, out);
    }
}

/* ----------------------------------------------- the same-host socket */

#define LBUF 65536

static void local_close(kvt_client *c)
{
    if (c->lfd >= 0)
        close(c->lfd);
    c->lfd = -1;
    c->lpos = c->llen = 0;
}

/* Write a whole message: [n][len][rid][len][op][len][body][len][data]... */
static int local_write(kvt_client *c, uint64_t rid, const char *op, const msgpack_sbuffer *body,
                       const void *const *bufs, const size_t *lens, size_t nbufs)
{
    size_t nf = 3 + nbufs;
    enum { NF_STACK = 3 + 32 }; /* requests up to 32 data frames need no allocation */
    uint8_t pre_st[4 * (NF_STACK + 1)];
    struct iovec iov_st[2 * NF_STACK + 1];
    bool heap = nf > NF_STACK;
    uint8_t *pre = heap ? kvt_xmalloc(4 * (nf + 1)) : pre_st;
    struct iovec *iov = heap ? kvt_xmalloc((2 * nf + 1) * sizeof(struct iovec)) : iov_st;
    int ni = 0;
    kvt_put32(pre, (uint32_t)nf);
    iov[ni++] = (struct iovec){pre, 4};
    for (size_t i = 0; i < nf; i++) {
        const void *p;
        size_t l;
        if (i == 0)
            p = &rid, l = sizeof(rid);
        else if (i == 1)
            p = op, l = strlen(op);
        else if (i == 2)
            p = body ? body->data : "\x80", l = body ? body->size : 1;
        else
            p = bufs[i - 3], l = lens[i - 3];
        kvt_put32(pre + 4 * (i + 1), (uint32_t)l);
        iov[ni++] = (struct iovec){pre + 4 * (i + 1), 4};
        if (l)
            iov[ni++] = (struct iovec){(void *)p, l};
    }
    int rc = 0, k = 0;
    while (k < ni) {
        /* MSG_NOSIGNAL: a server gone away is EPIPE here, not a SIGPIPE
         * that kills the application */
        struct msghdr mh = {.msg_iov = iov + k, .msg_iovlen = (size_t)KVT_MIN(ni - k, 1024)};
        ssize_t w = sendmsg(c->lfd, &mh, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            rc = -errno; /* EAGAIN here means the send timeout passed */
            break;
        }
        size_t adv = (size_t)w;
        while (k < ni && adv >= iov[k].iov_len)
            adv -= iov[k++].iov_len;
        if (k < ni) {
            iov[k].iov_base = (char *)iov[k].iov_base + adv;
            iov[k].iov_len -= adv;
        }
    }
    if (heap) {
        free(pre);
        free(iov);
    }
    return rc;
}

/* Read exactly n bytes (buffered for small reads, direct for large ones). */
static int local_read(kvt_client *c, void *dst, size_t n, uint64_t deadline)
{
    uint8_t *d = dst;
    while (n) {
        if (c->lpos < c->llen) {
            size_t take = KVT_MIN(n, c->llen - c->lpos);
            memcpy(d, c->lbuf + c->lpos, take);
            c->lpos += take;
            d += take;
            n -= take;
            continue;
        }
        uint64_t now = kvt_now_ns();
        if (now >= deadline)
            return KVT_E_TIMEOUT;
        struct pollfd p = {.fd = c->lfd, .events = POLLIN};
        int pr = poll(&p, 1, (int)((deadline - now) / 1000000ull) + 1);
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr <= 0)
            continue;
        ssize_t r;
        if (n >= LBUF) {
            r = read(c->lfd, d, n);
            if (r > 0) {
                d += r;
                n -= (size_t)r;
                continue;
            }
        } else {
            r = read(c->lfd, c->lbuf, LBUF);
            if (r > 0) {
                c->lpos = 0;
                c->llen = (size_t)r;
                continue;
            }
        }
        if (r == 0)
            return -ECONNRESET;
        if (errno != EINTR && errno != EAGAIN)
            return -errno;
    }
    return 0;
}

/* Read one reply message into out (frames as zmq messages, as call_zmq). */
static int local_read_reply(kvt_client *c, uint64_t *rid, struct rep *out, uint64_t deadline)
{
    uint8_t b4[4];
    int rc = local_read(c, b4, 4, deadline);
    if (rc)
        return rc;
    uint32_t nf = kvt_get32(b4);
    if (nf < 3 || nf > KVT_MAX_BATCH + 8)
        return KVT_E_PROTO;
    out->frames = nf > 3 ? kvt_xmalloc((nf - 3) * sizeof(zmq_msg_t)) : NULL;
    out->nframes = 0;
    uint8_t small[64];
    for (uint32_t i = 0; i < nf; i++) {
        rc = local_read(c, b4, 4, deadline);
        if (rc)
            return rc;
        uint32_t l = kvt_get32(b4);
        if (i < 2) {
            if (l > sizeof(small))
                return KVT_E_PROTO;
            rc = local_read(c, small, l, deadline);
            if (rc)
                return rc;
            if (i == 0) {
                if (l != sizeof(*rid))
                    return KVT_E_PROTO;
                memcpy(rid, small, sizeof(*rid));
            } else {
                if (l != 4)
                    return KVT_E_PROTO;
                out->status = kvt_wire_get_status(small);
            }
            continue;
        }
        zmq_msg_t *m = i == 2 ? &out->body : &out->frames[out->nframes];
        if (i == 2)
            zmq_msg_close(m);
        zmq_msg_init_size(m, l);
        if (i > 2)
            out->nframes++;
        rc = local_read(c, zmq_msg_data(m), l, deadline);
        if (rc)
            return rc;
    }
    return 0;
}

static int call_local(kvt_client *c, const char *op, const msgpack_sbuffer *body,
                      const void *const *bufs, const size_t *lens, size_t nbufs, struct rep *out)
{
    kvt_c_rep_init(out);
    uint64_t rid = ++c->next_rid;
    c->err[0] = 0;
    /* the server drops a connection whose frame is over its limit (it
     * cannot skip the bytes): refuse here, as ZeroMQ's path answers */
    for (size_t i = 0; i < nbufs; i++)
        if (lens[i] > UINT32_MAX || (c->max_object && lens[i] > c->max_object)) {
            uint64_t lim = c->max_object && c->max_object < UINT32_MAX ? c->max_object : UINT32_MAX;
            kvt_c_rep_free(out);
            return kvt_c_seterr(c, KVT_E_TOOBIG,
                                "a payload of %zu bytes is over the limit of %llu bytes", lens[i],
                                (unsigned long long)lim);
        }
    int rc = local_write(c, rid, op, body, bufs, lens, nbufs);
    uint64_t deadline = kvt_now_ns() + (uint64_t)c->timeout_ms * 1000000ull;
    while (!rc) {
        uint64_t got;
        rc = local_read_reply(c, &got, out, deadline);
        if (rc)
            break;
        if (got == rid)
            break;
        kvt_c_rep_free(out); /* the reply to an earlier fire-and-forget request */
        kvt_c_rep_init(out);
    }
    if (rc) {
        kvt_c_rep_free(out);
        local_close(c); /* the stream cannot be resynchronised */
        if (rc == KVT_E_TIMEOUT)
            return kvt_c_seterr(c, rc, "no reply to %s within %d ms", op, c->timeout_ms);
        return kvt_c_seterr(c, rc < 0 ? rc : KVT_E_PROTO,
                            "local connection to the server lost (%s)", kvt_strerror(rc));
    }
    return reply_decode(c, out);
}

static int hello(kvt_client *c);

/* One request, one reply: over the same-host socket when connected, else
 * ZeroMQ. A broken local connection (the server restarted) falls back to
 * ZeroMQ, says hello again (which may reconnect locally) and retries once. */
int kvt_c_call(kvt_client *c, const char *op, const msgpack_sbuffer *body, const void *const *bufs,
               const size_t *lens, size_t nbufs, struct rep *out)
{
    if (c->lfd < 0)
        return call_zmq(c, op, body, bufs, lens, nbufs, out);
    int rc = call_local(c, op, body, bufs, lens, nbufs, out);
    if (c->lfd >= 0 || rc == KVT_E_TIMEOUT || !strcmp(op, "hello"))
        return rc;
    /* the server died: its ZeroMQ connection may not know yet, and a hello
     * written into it would be lost (a wait of the whole timeout). Nothing of
     * ours is queued there (requests went over the local socket). */
    int sr = new_socket(c);
    if (sr)
        return sr;
    int hr = hello(c);
    if (hr)
        return hr;
    return c->lfd >= 0 ? call_local(c, op, body, bufs, lens, nbufs, out)
                       : call_zmq(c, op, body, bufs, lens, nbufs, out);
}

/* Fire and forget (its reply is discarded later by request id). */
void kvt_c_cast(kvt_client *c, const char *op, const msgpack_sbuffer *body)
{
    uint64_t rid = ++c->next_rid;
    if (c->lfd >= 0) {
        if (local_write(c, rid, op, body, NULL, NULL, 0))
            local_close(c);
        return;
    }
    zmq_send(c->sock, &rid, sizeof(rid), ZMQ_SNDMORE);
    zmq_send(c->sock, op, strlen(op), ZMQ_SNDMORE);
    zmq_send(c->sock, body->data, body->size, 0);
}

/* --------------------------------------------------------------- open */

static bool same_boot(const char *boot, size_t bl);

static void try_shm(kvt_client *c, const msgpack_object *hello)
{
    const msgpack_object *shm = kvt_mp_get(hello, "shm");
    if (!shm || shm->type != MSGPACK_OBJECT_MAP)
        return;
    uint64_t pid = 0, fd = 0, size = 0, dev = 0, ino = 0, pool = 0;
    const char *boot = NULL;
    size_t bl = 0;
    if (kvt_mp_u64(shm, "pool", true, &pool, NULL) || kvt_mp_u64(shm, "pid", true, &pid, NULL) ||
        kvt_mp_u64(shm, "fd", true, &fd, NULL) || kvt_mp_u64(shm, "size", true, &size, NULL) ||
        kvt_mp_u64(shm, "dev", true, &dev, NULL) || kvt_mp_u64(shm, "ino", true, &ino, NULL) ||
        kvt_mp_str(shm, "boot_id", true, &boot, &bl, NULL))
        return;
    if (!same_boot(boot, bl))
        return; /* another host */
    char path[64];
    snprintf(path, sizeof(path), "/proc/%llu/fd/%llu", (unsigned long long)pid,
             (unsigned long long)fd);
    int f = open(path, O_RDWR | O_CLOEXEC);
    if (f < 0)
        return; /* another pid namespace or user */
    struct stat st;
    if (fstat(f, &st) < 0 || (uint64_t)st.st_dev != dev || (uint64_t)st.st_ino != ino) {
        close(f); /* not the server's pool (pid reused) */
        return;
    }
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, f, 0);
    close(f);
    if (p == MAP_FAILED)
        return;
    c->shm = p;
    c->shm_size = size;
    c->pool_id = pool;
}

static bool same_boot(const char *boot, size_t bl)
{
    char mine[64] = "";
    int bfd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
    if (bfd < 0)
        return false;
    ssize_t n = read(bfd, mine, sizeof(mine) - 1);
    close(bfd);
    if (n <= 0)
        return false;
    mine[n] = 0;
    char *nl = strchr(mine, '\n');
    if (nl)
        *nl = 0;
    return bl == strlen(mine) && memcmp(mine, boot, bl) == 0;
}

/* A hello's body into sb (initialised here): {version, client, ticket?}. */
static void hello_body(msgpack_sbuffer *sb, const uint8_t *ticket, uint32_t tl)
{
    msgpack_sbuffer_init(sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, ticket ? 3 : 2);
    kvt_mp_str0(&pk, "version");
    msgpack_pack_int(&pk, KVT_PROTO_VERSION);
    kvt_mp_str0(&pk, "client");
    kvt_mp_str0(&pk, "libkvtier_client");
    if (ticket) {
        kvt_mp_str0(&pk, "ticket");
        msgpack_pack_bin(&pk, tl);
        msgpack_pack_bin_body(&pk, ticket, tl);
    }
}

/* Connect the same-host socket named in hello (abstract namespace). */
static void try_local(kvt_client *c, const msgpack_object *hello)
{
    const char *name = NULL, *boot = NULL;
    size_t nl = 0, bl = 0;
    if (kvt_mp_str(hello, "local", true, &name, &nl, NULL) ||
        kvt_mp_str(hello, "boot_id", true, &boot, &bl, NULL) || nl < 2 || nl >= 108 ||
        !same_boot(boot, bl))
        return;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    memcpy(sa.sun_path, name, nl);
    sa.sun_path[0] = 0; /* "@name": abstract */
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return;
    struct timeval tv = {c->timeout_ms / 1000, (c->timeout_ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    if (connect(fd, (struct sockaddr *)&sa,
                (socklen_t)(offsetof(struct sockaddr_un, sun_path) + nl)) < 0) {
        close(fd); /* another network namespace, or an old server */
        return;
    }
    if (!c->lbuf)
        c->lbuf = kvt_xmalloc(LBUF);
    c->lfd = fd;
    c->lpos = c->llen = 0;
    /* With authentication the connection is nobody's until it presents the
     * single-use ticket that this hello over CURVE brought (docs/protocol.md
     * "Authentication"); without one (an older server) it stays unused. */
    if (!c->curve.on)
        return;
    const msgpack_object *t = kvt_mp_get(hello, "ticket");
    uint8_t ticket[64];
    if (!t || t->type != MSGPACK_OBJECT_BIN || t->via.bin.size > sizeof(ticket)) {
        local_close(c);
        return;
    }
    uint32_t tl = t->via.bin.size;
    memcpy(ticket, t->via.bin.ptr, tl); /* the reply may live in lbuf, reused below */
    msgpack_sbuffer sb;
    hello_body(&sb, ticket, tl);
    struct rep r;
    int rc = call_local(c, "hello", &sb, NULL, NULL, 0, &r);
    kvt_secret_wipe(sb.data, sb.size);
    kvt_secret_wipe(ticket, sizeof(ticket));
    msgpack_sbuffer_destroy(&sb);
    if (rc) {
        local_close(c); /* refused or broken: requests travel over CURVE */
        return;
    }
    kvt_c_rep_free(&r);
}

static void shm_detach(kvt_client *c)
{
    if (c->shm)
        munmap(c->shm, c->shm_size);
    c->shm = NULL;
    c->shm_size = 0;
    c->pool_id = 0;
}

/* Exchange "hello"; (re)maps the server's pool when wanted and possible. */
static int hello(kvt_client *c)
{
    msgpack_sbuffer sb;
    hello_body(&sb, NULL, 0);
    /* with authentication a hello over the bound same-host connection keeps
     * it: a new one would need a new ticket, which only CURVE hands out */
    bool keep_local = c->lfd >= 0 && c->curve.on;
    struct rep r;
    int rc = kvt_c_call(c, "hello", &sb, NULL, NULL, 0, &r);
    msgpack_sbuffer_destroy(&sb);
    if (rc)
        return rc;
    keep_local = keep_local && c->lfd >= 0;
    uint64_t cs = 0, mo = 0;
    kvt_mp_u64(&r.up.data, "chunk_size", false, &cs, NULL);
    kvt_mp_u64(&r.up.data, "max_object_bytes", false, &mo, NULL);
    c->chunk_size = (int)cs;
    c->max_object = mo;
    shm_detach(c);
    if (c->want_shm)
        try_shm(c, &r.up.data);
    if (!keep_local) {
        local_close(c);
        if (c->want_local)
            try_local(c, &r.up.data);
    }
    kvt_c_rep_free(&r);
    return 0;
}

/*
 * A reply's pool differs from the mapped one: the server restarted (or a
 * different server answers on this address). Offsets from it mean nothing in
 * our mapping, so writing or reading through it would move wrong bytes: drop
 * what we hold from the old instance and map the new pool.
 */
int kvt_c_shm_reattach(kvt_client *c)
{
    kvt_c_lease_forget(c);
    return hello(c);
}

/* Why this thread's last kvt_client_open failed (its client is gone). */
static _Thread_local char open_err[512];

const char *kvt_client_open_error(void)
{
    return open_err;
}

/* The CURVE keys named by opts or the environment, into c (secret.h). */
static int load_curve(kvt_client *c, const kvt_client_opts *opts)
{
    char why[1400];
    int rc = kvt_curve_keys_load(opts ? opts->server_key : NULL, opts ? opts->client_key : NULL,
                                 &c->curve, why, sizeof(why));
    return rc ? kvt_c_seterr(c, rc, "%s", why) : 0;
}

int kvt_client_open(const char *url, const kvt_client_opts *opts, kvt_client **out)
{
    open_err[0] = 0;
    int rc = kvt_url_check(url, open_err, sizeof(open_err));
    if (rc)
        return rc;
    kvt_client *c = kvt_xcalloc(1, sizeof(*c));
    c->lfd = -1; /* before any kvt_client_close: 0 is stdin */
    snprintf(c->url, sizeof(c->url), "%s", url);
    c->timeout_ms = opts && opts->timeout_ms > 0 ? opts->timeout_ms : 30000;
    c->connect_timeout_ms = opts && opts->connect_timeout_ms > 0 ? opts->connect_timeout_ms : 2000;
    pthread_mutex_init(&c->zc_lock, NULL);
    pthread_cond_init(&c->zc_cond, NULL);
    c->ctx = ctx_get();
    if (!c->ctx) {
        free(c);
        return -ENOMEM;
    }
    rc = load_curve(c, opts);
    if (!rc)
        rc = new_socket(c);
    if (rc) {
        snprintf(open_err, sizeof(open_err), "%s", c->err[0] ? c->err : kvt_strerror(rc));
        kvt_client_close(c);
        return rc;
    }
    const char *no = getenv("KVTIER_NO_SHM"), *nl = getenv("KVTIER_NO_LOCAL");
    c->want_shm = !(opts && opts->no_shm) && !(no && *no && strcmp(no, "0"));
    c->want_local = !(opts && opts->no_local) && !(nl && *nl && strcmp(nl, "0"));
    c->opening = true;
    rc = hello(c);
    c->opening = false;
    if (rc) {
        /* keep the message for the caller (kvt_client_open_error), since c
         * goes away; the library prints nothing: the caller reports it */
        snprintf(open_err, sizeof(open_err), "%s", c->err);
        kvt_client_close(c);
        return rc;
    }
    *out = c;
    return 0;
}

void kvt_c_lease_forget(kvt_client *c)
{
    c->lease = 0;
    free(c->lease_hashes);
    free(c->lease_model);
    free(c->lease_salt);
    c->lease_hashes = NULL;
    c->lease_model = c->lease_salt = NULL;
    c->lease_n = 0;
}

void kvt_client_close(kvt_client *c)
{
    if (!c)
        return;
    if (c->sock && c->lease)
        kvt_free_locks(c);
    kvt_c_lease_forget(c);
    local_close(c);
    free(c->lbuf);
    if (c->mon)
        zmq_close(c->mon);
    if (c->sock)
        zmq_close(c->sock);
    if (c->ctx)
        ctx_put();
    shm_detach(c);
    pthread_mutex_destroy(&c->zc_lock);
    pthread_cond_destroy(&c->zc_cond);
    kvt_secret_wipe(&c->curve, sizeof(c->curve));
    free(c);
}
