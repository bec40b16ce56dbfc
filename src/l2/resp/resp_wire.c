/*
 * resp adapter: connections and the raw RESP wire (see resp.c).
 * A struct conn belongs to one thread at a time: no locks here.
 */
#include "common/log.h"
#include "common/util.h"
#include "kvtier/error.h"
#include "l2/resp/resp_int.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* ------------------------------------------------------- connections */

void kvt_resp_conn_close(struct conn *cn)
{
    if (cn->c)
        redisFree(cn->c);
    cn->c = NULL;
    cn->rpos = cn->rlen = 0;
    cn->used = false;
}

/* Reply of a control command: 0, -EIO (no reply: connection lost) or
 * KVT_E_UNHEALTHY (an error reply, e.g. WRONGPASS), with the text in msg. */
static int check_reply(redisContext *c, redisReply *r, const char *what, char *msg, size_t cap)
{
    if (!r) {
        snprintf(msg, cap, "%s: %s", what, c->errstr[0] ? c->errstr : "connection lost");
        return -EIO;
    }
    if (r->type == REDIS_REPLY_ERROR) {
        snprintf(msg, cap, "%s: %s", what, r->str);
        freeReplyObject(r);
        return KVT_E_UNHEALTHY;
    }
    freeReplyObject(r);
    return 0;
}

static struct timeval tv_ns(uint64_t ns)
{
    if (ns < 1000)
        ns = 1000; /* a zero timeval means "no timeout" to the kernel */
    return (struct timeval){.tv_sec = (time_t)(ns / 1000000000ull),
                            .tv_usec = (suseconds_t)(ns % 1000000000ull / 1000)};
}

/* Nanoseconds left before cn's deadline (cap when it has none); 0: past it. */
static uint64_t left_ns(const struct conn *cn, uint64_t cap)
{
    if (!cn->deadline_ns)
        return cap;
    uint64_t now = kvt_now_ns();
    return now >= cn->deadline_ns ? 0 : KVT_MIN(cn->deadline_ns - now, cap);
}

bool kvt_resp_past_deadline(const struct conn *cn)
{
    return cn->deadline_ns && kvt_now_ns() >= cn->deadline_ns;
}

int kvt_resp_conn_arm(struct resp_engine *e, struct conn *cn)
{
    uint64_t left = left_ns(cn, e->req_ns);
    if (!left || !cn->c)
        return -ETIMEDOUT;
    redisSetTimeout(cn->c, tv_ns(left));
    return 0;
}

/*
 * Open a connection within cn->deadline_ns (when set): connect with
 * connection_timeout or what is left of the deadline, whichever is less,
 * then AUTH, SELECT, READONLY with what is left. The socket's own timeouts
 * (SO_RCVTIMEO/SO_SNDTIMEO) are request_timeout afterwards; a caller that
 * has a deadline arms them again before each command (kvt_resp_conn_arm).
 * msg gets the reason on error.
 */
int kvt_resp_conn_open(struct resp_engine *e, struct conn *cn, char *msg, size_t cap)
{
    kvt_resp_conn_close(cn);
    unsigned epoch = atomic_load(&e->epoch);
    char host[256];
    int port = e->port;
    snprintf(host, sizeof(host), "%s", e->host);
    if (e->cluster) /* the node this connection is for (nodes[0]: the first seed) */
        kvt_resp_cl_addr(e, cn->node, host, sizeof(host), &port);
    uint64_t left = left_ns(cn, e->conn_ns);
    if (!left) {
        snprintf(msg, cap, "connect %s:%d: no time left before the request's deadline", host, port);
        return -ETIMEDOUT;
    }
    redisContext *c = e->unix_sock ? redisConnectUnixWithTimeout(host, tv_ns(left))
                                   : redisConnectWithTimeout(host, port, tv_ns(left));
    if (!c) {
        snprintf(msg, cap, "connect: out of memory");
        return -ENOMEM;
    }
    if (c->err) {
        if (e->cluster)
            snprintf(msg, cap, "connect %s:%d: %s", host, port, c->errstr);
        else
            snprintf(msg, cap, "connect: %s", c->errstr);
        redisFree(c);
        return -ECONNREFUSED;
    }
    if (!e->unix_sock)
        redisEnableKeepAlive(c);
    int rc = 0;
    left = left_ns(cn, e->req_ns);
    redisSetTimeout(c, tv_ns(left));
    if (!left && (e->pass[0] || e->db || e->read_replicas)) {
        snprintf(msg, cap, "AUTH: no time left before the request's deadline");
        rc = -ETIMEDOUT;
    }
    if (!rc && e->pass[0]) {
        redisReply *r = e->user[0] ? redisCommand(c, "AUTH %s %s", e->user, e->pass)
                                   : redisCommand(c, "AUTH %s", e->pass);
        rc = check_reply(c, r, "AUTH", msg, cap);
    }
    if (!rc && e->db) {
        redisReply *r = redisCommand(c, "SELECT %d", e->db);
        rc = check_reply(c, r, "SELECT", msg, cap);
    }
    if (!rc && e->read_replicas) { /* a replica serves reads of its master's slots */
        redisReply *r = redisCommand(c, "READONLY");
        rc = check_reply(c, r, "READONLY", msg, cap);
    }
    if (rc) {
        redisFree(c);
        return rc;
    }
    redisSetTimeout(c, e->req_tv);
    cn->c = c;
    cn->epoch = epoch;
    return 0;
}

/* Make cn usable: reopen when it is closed, broken or from an old epoch. */
int kvt_resp_conn_ensure(struct resp_engine *e, struct conn *cn, char *msg, size_t cap)
{
    if (cn->c && !cn->c->err && cn->epoch == atomic_load(&e->epoch))
        return 0;
    return kvt_resp_conn_open(e, cn, msg, cap);
}

/* ---------------------------------------------- raw protocol writing */

/* Wait until cn's socket is ready for ev, at most until its deadline:
 * 0 or -ETIMEDOUT. */
static int wait_ready(struct conn *cn, short ev)
{
    for (;;) {
        uint64_t left = left_ns(cn, UINT64_MAX);
        if (!left)
            return -ETIMEDOUT;
        struct pollfd p = {.fd = cn->c->fd, .events = ev};
        int ms = (int)KVT_MIN((left + 999999) / 1000000, (uint64_t)INT_MAX);
        int r = poll(&p, 1, ms);
        if (r > 0)
            return 0; /* ready, or an error the next read or write reports */
        if (r < 0 && errno != EINTR)
            return -errno;
    }
}

/* One send or recv without blocking past the deadline: with a deadline
 * the socket is used non-blocking (MSG_DONTWAIT) and poll waits for it;
 * without one the socket's own timeouts apply (EAGAIN: -ETIMEDOUT). */
static ssize_t io_once(struct conn *cn, bool out, void *buf, size_t n)
{
    int fl = cn->deadline_ns ? MSG_DONTWAIT : 0;
    for (;;) {
        ssize_t r = out ? send(cn->c->fd, buf, n, fl | MSG_NOSIGNAL) : recv(cn->c->fd, buf, n, fl);
        if (r >= 0)
            return r;
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return -errno;
        if (!cn->deadline_ns)
            return -ETIMEDOUT;
        int rc = wait_ready(cn, out ? POLLOUT : POLLIN);
        if (rc)
            return rc;
    }
}

/*
 * Write every byte of iov[0..cnt), gathered through the connection's
 * output buffer (OBUF_CAP at a time), retrying short writes, before the
 * connection's deadline. Copying into one warm buffer and writing from it
 * beat writev straight from the caller's pages by 1.5-2x on our test VM
 * (bench/remote.sh, docs).
 */
int kvt_resp_wr_all(struct conn *cn, struct iovec *iov, int cnt)
{
    size_t fill = 0;
    for (int k = 0; k <= cnt; k++) {
        const char *p = k < cnt ? iov[k].iov_base : NULL;
        size_t left = k < cnt ? iov[k].iov_len : 0;
        while (left || (k == cnt && fill)) {
            size_t take = KVT_MIN(left, OBUF_CAP - fill);
            if (take) {
                memcpy(cn->obuf + fill, p, take);
                fill += take;
                p += take;
                left -= take;
            }
            if (fill < OBUF_CAP && k < cnt)
                break; /* room left: gather the next piece first */
            for (size_t done = 0; done < fill;) {
                ssize_t w = io_once(cn, true, cn->obuf + done, fill - done);
                if (w < 0)
                    return (int)w;
                done += (size_t)w;
            }
            fill = 0;
        }
    }
    return 0;
}

/* Small commands are assembled in a wbuf: "*<argc>\r\n" then
 * "$<len>\r\n<arg>\r\n" per argument. */
void kvt_resp_wb_put(struct wbuf *b, const void *s, size_t n)
{
    if (b->len + n > b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 4096;
        while (nc < b->len + n)
            nc *= 2;
        b->p = kvt_xrealloc(b->p, nc);
        b->cap = nc;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
}

void kvt_resp_wb_fmt(struct wbuf *b, const char *fmt, ...)
{
    char tmp[64];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    kvt_resp_wb_put(b, tmp, (size_t)n);
}

void kvt_resp_wb_arg(struct wbuf *b, const char *s, size_t n)
{
    kvt_resp_wb_fmt(b, "$%zu\r\n", n);
    kvt_resp_wb_put(b, s, n);
    kvt_resp_wb_put(b, "\r\n", 2);
}

/* ---------------------------------------------- raw protocol reading */

static int rd_fill(struct conn *cn)
{
    if (cn->rpos == cn->rlen) {
        cn->rpos = cn->rlen = 0;
    } else if (cn->rpos > RBUF_CAP / 2) {
        memmove(cn->rbuf, cn->rbuf + cn->rpos, cn->rlen - cn->rpos);
        cn->rlen -= cn->rpos;
        cn->rpos = 0;
    }
    if (cn->rlen == RBUF_CAP)
        return -EPROTO; /* a protocol line longer than the buffer */
    ssize_t r = io_once(cn, false, cn->rbuf + cn->rlen, RBUF_CAP - cn->rlen);
    if (r > 0) {
        cn->rlen += (size_t)r;
        return 0;
    }
    return r == 0 ? -ECONNRESET : (int)r;
}

/* One protocol line (without CRLF), valid until the next read. */
static int rd_line(struct conn *cn, char **line, size_t *len)
{
    size_t scanned = 0;
    for (;;) {
        char *s = cn->rbuf + cn->rpos;
        size_t avail = cn->rlen - cn->rpos;
        char *nl = avail > scanned ? memchr(s + scanned, '\n', avail - scanned) : NULL;
        if (nl) {
            size_t l = (size_t)(nl - s);
            if (l == 0 || s[l - 1] != '\r')
                return -EPROTO;
            s[l - 1] = 0;
            *line = s;
            *len = l - 1;
            cn->rpos += l + 1;
            return 0;
        }
        scanned = avail;
        int rc = rd_fill(cn);
        if (rc)
            return rc;
    }
}

/*
 * Copy n reply bytes to dst (NULL: discard) through the reply buffer. A
 * read() straight into a large destination was 3x slower than reading into
 * the warm RBUF_CAP buffer and copying out (measured on the test VM, where
 * kernel copies into many distinct user pages are expensive).
 */
int kvt_resp_rd_bytes(struct conn *cn, void *dst, size_t n)
{
    char *d = dst;
    for (;;) {
        size_t take = KVT_MIN(n, cn->rlen - cn->rpos);
        if (d) {
            memcpy(d, cn->rbuf + cn->rpos, take);
            d += take;
        }
        cn->rpos += take;
        n -= take;
        if (n == 0)
            return 0;
        int rc = rd_fill(cn);
        if (rc)
            return rc;
    }
}

/* Read one reply header. For R_BULK, *num is the length and the body
 * follows (rd_bytes + rd_crlf). err gets an error reply's text. */
int kvt_resp_rd_reply(struct conn *cn, int *type, long long *num, char *err, size_t errcap)
{
    char *l;
    size_t n;
    int rc = rd_line(cn, &l, &n);
    if (rc)
        return rc;
    char *end;
    switch (l[0]) {
    case '+':
        *type = R_STATUS;
        return 0;
    case '-':
        *type = R_ERROR;
        snprintf(err, errcap, "%s", l + 1);
        return 0;
    case ':':
    case '$':
        errno = 0;
        *num = strtoll(l + 1, &end, 10);
        if (errno || *end || end == l + 1)
            return -EPROTO;
        *type = l[0] == ':' ? R_INT : *num < 0 ? R_NIL : R_BULK;
        return 0;
    default:
        return -EPROTO; /* arrays never answer our data commands */
    }
}

int kvt_resp_rd_crlf(struct conn *cn)
{
    char two[2];
    int rc = kvt_resp_rd_bytes(cn, two, 2);
    if (rc)
        return rc;
    return two[0] == '\r' && two[1] == '\n' ? 0 : -EPROTO;
}

bool kvt_resp_is_transport(int rc)
{
    return rc == -ECONNRESET || rc == -ETIMEDOUT || rc == -EPIPE || rc == -EPROTO ||
           rc == -ECONNREFUSED || rc == -EIO || rc == -ENOTCONN || rc == -EBADF ||
           rc == -ECONNABORTED || rc == -EHOSTUNREACH || rc == -ENETUNREACH;
}
