/*
 * The same-host transport: an abstract Unix socket served by the rpc thread.
 *
 * ZeroMQ moves every message through an I/O thread on each side, so a
 * request costs four thread wake-ups; on a VM where a context switch is
 * expensive that halves small-operation throughput. Clients on the same host
 * (told the socket's name in "hello", like the shared-memory pool) send the
 * same frames over this socket instead, read and answered directly by the rpc
 * thread: two wake-ups per request.
 *
 * Framing (both directions): u32 nframes, then per frame u32 length + bytes,
 * little-endian. A request is [request id][op][body][data...], a reply
 * [request id][status][body][data...], exactly as over ZeroMQ. Inside the
 * server a local connection is known by a 9-byte routing id (0x00 + u64
 * connection id); ZeroMQ's own routing ids are 5 bytes and peers cannot set
 * ids starting with 0x00, so the two never mix.
 *
 * Only the owner's uid may connect (SO_PEERCRED). With authentication on,
 * that is not enough: a connection is nobody's until its first request, a
 * hello carrying a ticket that a hello over CURVE handed out to a key
 * (single use, TICKET_TTL_S, at most NTICKETS outstanding: the oldest goes);
 * every later request of the connection is that key's, checked against its
 * line as over CURVE. A same-uid process without a key has no ticket.
 * A message of 0 frames or
 * of more than MAX_FRAMES frames is read whole and answered E_BADREQ, as
 * over ZeroMQ; a frame over the size limit (which ZeroMQ answers by
 * dropping the connection) disconnects the peer.
 *
 * Thread: everything here runs on the rpc thread.
 */
#include "common/log.h"
#include "common/secret.h"
#include "common/util.h"
#include "common/le.h"
#include "kvtier/error.h"
#include "server/auth.h"
#include "server/internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#define MAX_FRAMES (KVT_MAX_BATCH + 8)
#define RBUF 65536
#define NTICKETS 256
#define TICKET_TTL_S 30

struct out {
    struct out *next;
    struct iovec *iov; /* remaining pieces; in this allocation, they point into it */
    int niov;
    uint8_t *lens; /* the length prefixes (in this allocation) */
    uint8_t *rid;  /* the request id (in this allocation) */
    uint8_t status[4];
    void *body;              /* owned */
    struct kvt_l1_ref *refs; /* data frames from L1, one reference each */
    uint32_t nrefs;
};

struct lconn {
    uint64_t id;
    int fd;
    /* input */
    uint8_t rbuf[RBUF];
    size_t rlen, rpos;
    int state; /* 0: frame count, 1: frame length, 2: frame bytes, 3: bytes of a frame beyond
                  MAX_FRAMES */
    uint32_t nframes, got, seen; /* frames announced, kept, read */
    uint32_t cur_len, cur_done;
    zmq_msg_t *frames; /* the message being read; frames[-1] is kept for the identity */
    /* output */
    struct out *oq_head, *oq_tail;
    bool want_out;
    bool dead;                   /* a write failed: closed by kvt_local_poll, never mid-request */
    struct kvt_auth_client *who; /* authentication on: the key its ticket bound, else NULL */
    struct lconn *hnext;         /* id hash chain */
};

struct ticket {
    uint8_t t[KVT_LOCAL_TICKET_BYTES];
    struct kvt_auth_client *who; /* NULL: free or used */
    uint64_t expires_ns;
};

#define HBUCKETS 1024

struct kvt_local {
    int lfd, ep;
    char name[108];
    uint64_t next_id;
    struct lconn *byid[HBUCKETS];
    _Atomic uint32_t nconns; /* read by status from other threads */
    uint64_t max_frame;
    struct ticket tickets[NTICKETS]; /* a ring: the next one overwrites the oldest */
    uint32_t tnext;
};

static struct kvt_l1 *l1_of(struct kvt_server *s)
{
    return kvt_core_l1(s->core);
}

static struct lconn *find(struct kvt_local *L, uint64_t id)
{
    for (struct lconn *c = L->byid[id % HBUCKETS]; c; c = c->hnext)
        if (c->id == id)
            return c;
    return NULL;
}

static void out_free(struct kvt_server *s, struct out *o)
{
    for (uint32_t i = 0; i < o->nrefs; i++)
        kvt_l1_put(l1_of(s), o->refs[i].h);
    free(o->refs);
    free(o->body);
    free(o);
}

static void conn_close(struct kvt_server *s, struct lconn *c)
{
    struct kvt_local *L = s->local;
    epoll_ctl(L->ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    struct lconn **pp = &L->byid[c->id % HBUCKETS];
    while (*pp != c)
        pp = &(*pp)->hnext;
    *pp = c->hnext;
    for (uint32_t i = 0; i < c->got; i++)
        zmq_msg_close(&c->frames[i]);
    if (c->state == 2)
        zmq_msg_close(&c->frames[c->got]);
    if (c->frames)
        free(c->frames - 1);
    struct out *o = c->oq_head;
    while (o) {
        struct out *nx = o->next;
        out_free(s, o);
        o = nx;
    }
    L->nconns--;
    free(c);
}

int kvt_local_start(struct kvt_server *s, char *err, size_t cap)
{
    struct kvt_local *L = kvt_xcalloc(1, sizeof(*L));
    L->lfd = L->ep = -1;
    /* as ZMQ_MAXMSGSIZE: a full batch's body fits whatever --max-object-mb is */
    L->max_frame = KVT_MAX(s->cfg->max_object_bytes, (uint64_t)KVT_MAX_BODY) + (1u << 20);
    struct kvt_l1_shm shm;
    kvt_core_shm(s->core, &shm);
    /* abstract namespace: nothing to clean up after a SIGKILL */
    snprintf(L->name, sizeof(L->name), "@kvtier-%d-%016llx", (int)getpid(),
             (unsigned long long)shm.pool_id);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    size_t nl = strlen(L->name);
    memcpy(sa.sun_path, L->name, nl);
    sa.sun_path[0] = 0;
    L->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    L->ep = epoll_create1(EPOLL_CLOEXEC);
    if (L->lfd < 0 || L->ep < 0 ||
        bind(L->lfd, (struct sockaddr *)&sa,
             (socklen_t)(offsetof(struct sockaddr_un, sun_path) + nl)) < 0 ||
        listen(L->lfd, 1024) < 0) {
        snprintf(err, cap, "local socket %s: %s", L->name, kvt_strerror(-errno));
        if (L->lfd >= 0)
            close(L->lfd);
        if (L->ep >= 0)
            close(L->ep);
        free(L);
        return -errno;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = 0};
    epoll_ctl(L->ep, EPOLL_CTL_ADD, L->lfd, &ev);
    s->local = L;
    return 0;
}

const char *kvt_local_name(struct kvt_server *s)
{
    return s->local ? s->local->name : NULL;
}

int kvt_local_fd(struct kvt_server *s)
{
    return s->local ? s->local->ep : -1;
}

void kvt_local_stop(struct kvt_server *s)
{
    struct kvt_local *L = s->local;
    if (!L)
        return;
    for (int b = 0; b < HBUCKETS; b++)
        while (L->byid[b])
            conn_close(s, L->byid[b]);
    close(L->lfd);
    close(L->ep);
    kvt_secret_wipe(L->tickets, sizeof(L->tickets));
    free(L);
    s->local = NULL;
}

static struct lconn *conn_of(struct kvt_server *s, const zmq_msg_t *ident)
{
    if (!s->local || !kvt_local_is_ident(ident))
        return NULL;
    uint64_t id;
    memcpy(&id, (const uint8_t *)zmq_msg_data((zmq_msg_t *)ident) + 1, 8);
    return find(s->local, id);
}

int kvt_local_ticket(struct kvt_server *s, struct kvt_auth_client *who,
                     uint8_t out[KVT_LOCAL_TICKET_BYTES])
{
    struct kvt_local *L = s->local;
    if (!L || !who)
        return -ENOENT;
    if (getrandom(out, KVT_LOCAL_TICKET_BYTES, 0) != KVT_LOCAL_TICKET_BYTES)
        return -EIO;
    struct ticket *t = &L->tickets[L->tnext++ % NTICKETS];
    memcpy(t->t, out, KVT_LOCAL_TICKET_BYTES);
    t->who = who;
    t->expires_ns = kvt_now_ns() + (uint64_t)TICKET_TTL_S * 1000000000ull;
    return 0;
}

struct kvt_auth_client *kvt_local_who(struct kvt_server *s, const zmq_msg_t *ident)
{
    struct lconn *c = conn_of(s, ident);
    if (!c)
        return NULL;
    c->who = kvt_auth_live(c->who); /* after a reload: its key's line now, NULL if removed */
    return c->who;
}

struct kvt_auth_client *kvt_local_redeem(struct kvt_server *s, const zmq_msg_t *ident,
                                         const void *ticket, size_t len)
{
    struct kvt_local *L = s->local;
    struct lconn *c = conn_of(s, ident);
    if (!c || len != KVT_LOCAL_TICKET_BYTES)
        return NULL;
    uint64_t now = kvt_now_ns();
    for (int i = 0; i < NTICKETS; i++) {
        struct ticket *t = &L->tickets[i];
        /* no early exit: a guess learns nothing from the timing */
        if (!kvt_secret_bytes_equal(t->t, ticket, KVT_LOCAL_TICKET_BYTES) || !t->who)
            continue;
        struct kvt_auth_client *who = now <= t->expires_ns ? kvt_auth_live(t->who) : NULL;
        kvt_secret_wipe(t, sizeof(*t)); /* single use, expired or not */
        if (who)
            c->who = who;
        return who;
    }
    return NULL;
}

static void accept_all(struct kvt_server *s)
{
    struct kvt_local *L = s->local;
    for (;;) {
        int fd = accept4(L->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            return;
        struct ucred cr;
        socklen_t cl = sizeof(cr);
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl) < 0 || cr.uid != getuid()) {
            close(fd); /* the pool and this socket are for the owner only */
            continue;
        }
        struct lconn *c = kvt_xcalloc(1, sizeof(*c));
        c->fd = fd;
        c->id = ++L->next_id;
        c->hnext = L->byid[c->id % HBUCKETS];
        L->byid[c->id % HBUCKETS] = c;
        L->nconns++;
        struct epoll_event ev = {.events = EPOLLIN, .data.u64 = c->id};
        epoll_ctl(L->ep, EPOLL_CTL_ADD, fd, &ev);
    }
}

/* A whole message arrived: hand it to the same path as ZeroMQ messages. */
static void deliver(struct kvt_server *s, struct lconn *c)
{
    uint32_t n = c->got;
    bool truncated = c->got < c->nframes;
    zmq_msg_t *parts = c->frames - 1; /* the slot in front is for the identity */
    uint8_t ident[9] = {0};
    memcpy(ident + 1, &c->id, 8);
    zmq_msg_init_size(&parts[0], sizeof(ident));
    memcpy(zmq_msg_data(&parts[0]), ident, sizeof(ident));
    c->frames = NULL;
    c->got = c->seen = 0;
    c->state = 0;
    kvt_dispatch_message(s, parts, n + 1, truncated); /* takes parts */
}

/* Parse what is buffered; false when the peer broke the framing. */
static bool consume(struct kvt_server *s, struct lconn *c)
{
    struct kvt_local *L = s->local;
    for (;;) {
        size_t avail = c->rlen - c->rpos;
        if (c->state == 0 || c->state == 1) {
            if (avail < 4)
                break;
            uint32_t v = kvt_get32(c->rbuf + c->rpos);
            c->rpos += 4;
            if (c->state == 0) {
                c->nframes = v;
                c->got = c->seen = 0;
                /* one slot in front: deliver() puts the identity there;
                 * frames beyond MAX_FRAMES are read and dropped */
                c->frames =
                    (zmq_msg_t *)kvt_xmalloc((KVT_MIN(v, MAX_FRAMES) + 1) * sizeof(zmq_msg_t)) + 1;
                c->state = 1;
                if (v == 0) { /* no frames: answered E_BADREQ like ZeroMQ's */
                    deliver(s, c);
                    if (c->dead)
                        return false;
                    continue;
                }
            } else {
                if (v > L->max_frame)
                    return false;
                c->cur_len = v;
                c->cur_done = 0;
                if (c->got < MAX_FRAMES) {
                    zmq_msg_init_size(&c->frames[c->got], v);
                    c->state = 2;
                } else {
                    c->state = 3;
                }
            }
        }
        if (c->state == 2 || c->state == 3) {
            size_t take = KVT_MIN(c->rlen - c->rpos, (size_t)(c->cur_len - c->cur_done));
            if (take) {
                if (c->state == 2)
                    memcpy((uint8_t *)zmq_msg_data(&c->frames[c->got]) + c->cur_done,
                           c->rbuf + c->rpos, take);
                c->rpos += take;
                c->cur_done += (uint32_t)take;
            }
            if (c->cur_done < c->cur_len)
                break;
            if (c->state == 2)
                c->got++;
            c->seen++;
            c->state = 1;
            if (c->seen == c->nframes) {
                deliver(s, c); /* resets state to 0; may answer at once */
                if (c->dead)
                    return false;
            }
            continue;
        }
    }
    /* keep the unparsed tail at the front */
    if (c->rpos == c->rlen) {
        c->rpos = c->rlen = 0;
    } else if (c->rpos > RBUF / 2) {
        memmove(c->rbuf, c->rbuf + c->rpos, c->rlen - c->rpos);
        c->rlen -= c->rpos;
        c->rpos = 0;
    }
    return true;
}

static bool on_readable(struct kvt_server *s, struct lconn *c)
{
    for (int rounds = 0; rounds < 64; rounds++) {
        /* a large frame body goes straight into its message, not the buffer */
        if (c->state == 2 && c->rpos == c->rlen && c->cur_len - c->cur_done > RBUF) {
            ssize_t r = read(c->fd, (uint8_t *)zmq_msg_data(&c->frames[c->got]) + c->cur_done,
                             c->cur_len - c->cur_done);
            if (r == 0)
                return false;
            if (r < 0)
                return errno == EAGAIN || errno == EINTR;
            c->cur_done += (uint32_t)r;
            if (!consume(s, c))
                return false;
            continue;
        }
        ssize_t r = read(c->fd, c->rbuf + c->rlen, RBUF - c->rlen);
        if (r == 0)
            return false;
        if (r < 0)
            return errno == EAGAIN || errno == EINTR;
        c->rlen += (size_t)r;
        if (!consume(s, c))
            return false;
    }
    return true;
}

/* Write queued output; false on a broken connection. */
static bool flush_out(struct kvt_server *s, struct lconn *c)
{
    struct kvt_local *L = s->local;
    while (c->oq_head) {
        struct out *o = c->oq_head;
        while (o->niov) {
            ssize_t w = writev(c->fd, o->iov, KVT_MIN(o->niov, 1024));
            if (w < 0) {
                if (errno == EINTR)
                    continue;
                if (errno != EAGAIN)
                    return false;
                if (!c->want_out) {
                    struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.u64 = c->id};
                    epoll_ctl(L->ep, EPOLL_CTL_MOD, c->fd, &ev);
                    c->want_out = true;
                }
                return true;
            }
            size_t adv = (size_t)w;
            int k = 0;
            while (k < o->niov && adv >= o->iov[k].iov_len)
                adv -= o->iov[k++].iov_len;
            if (k < o->niov) {
                o->iov[k].iov_base = (char *)o->iov[k].iov_base + adv;
                o->iov[k].iov_len -= adv;
            }
            memmove(o->iov, o->iov + k, (size_t)(o->niov - k) * sizeof(struct iovec));
            o->niov -= k;
        }
        c->oq_head = o->next;
        if (!c->oq_head)
            c->oq_tail = NULL;
        out_free(s, o);
    }
    if (c->want_out) {
        struct epoll_event ev = {.events = EPOLLIN, .data.u64 = c->id};
        epoll_ctl(L->ep, EPOLL_CTL_MOD, c->fd, &ev);
        c->want_out = false;
    }
    return true;
}

bool kvt_local_is_ident(const zmq_msg_t *ident)
{
    return zmq_msg_size((zmq_msg_t *)ident) == 9 &&
           ((const uint8_t *)zmq_msg_data((zmq_msg_t *)ident))[0] == 0;
}

/* Send a reply to a local connection (rpc thread). Takes the reply's body
 * and frame references; the connection may be gone (then they are dropped). */
void kvt_local_send(struct kvt_server *s, struct reply *r, char *body, size_t blen)
{
    struct kvt_local *L = s->local;
    uint64_t id;
    memcpy(&id, (const uint8_t *)zmq_msg_data(&r->ident) + 1, 8);
    uint32_t nf = 3 + r->nframes;
    /* one allocation: the entry, its iovecs, its length prefixes */
    struct out *o = kvt_xcalloc(1, sizeof(*o) + (2 * nf + 1) * sizeof(struct iovec) + 4 * (nf + 1) +
                                       r->rid_len);
    o->iov = (struct iovec *)(o + 1);
    o->lens = (uint8_t *)(o->iov + 2 * nf + 1);
    o->rid = o->lens + 4 * (nf + 1);
    o->body = body;
    o->refs = r->frames; /* references travel with the entry until written */
    o->nrefs = r->nframes;
    r->frames = NULL;
    r->nframes = 0;
    memcpy(o->rid, r->rid, r->rid_len);
    kvt_wire_put_status(o->status, r->status);
    kvt_put32(o->lens, nf);
    o->iov[o->niov++] = (struct iovec){o->lens, 4};
    for (uint32_t i = 0; i < nf; i++) {
        const void *p;
        size_t l;
        if (i == 0)
            p = o->rid, l = r->rid_len;
        else if (i == 1)
            p = o->status, l = 4;
        else if (i == 2)
            p = body, l = blen;
        else {
            p = o->refs[i - 3].ptr;
            l = o->refs[i - 3].meta.len;
            atomic_fetch_add_explicit(&s->bytes_out, l, memory_order_relaxed);
        }
        kvt_put32(o->lens + 4 * (i + 1), (uint32_t)l);
        o->iov[o->niov++] = (struct iovec){o->lens + 4 * (i + 1), 4};
        if (l)
            o->iov[o->niov++] = (struct iovec){(void *)p, l};
    }
    struct lconn *c = L ? find(L, id) : NULL;
    if (!c) { /* the client went away: drop the reply */
        out_free(s, o);
        return;
    }
    if (c->oq_tail)
        c->oq_tail->next = o;
    else
        c->oq_head = o;
    c->oq_tail = o;
    /* this may run inside the connection's own read loop: a failed write
     * marks it dead; kvt_local_poll closes it once the loop is done */
    if (!c->dead && !flush_out(s, c))
        c->dead = true;
}

/* The epoll fd became readable (rpc thread). */
void kvt_local_poll(struct kvt_server *s)
{
    struct kvt_local *L = s->local;
    struct epoll_event evs[64];
    int n = epoll_wait(L->ep, evs, 64, 0);
    for (int i = 0; i < n; i++) {
        uint64_t id = evs[i].data.u64;
        if (id == 0) {
            accept_all(s);
            continue;
        }
        struct lconn *c = find(L, id);
        if (!c)
            continue;
        bool ok = !c->dead;
        if (evs[i].events & (EPOLLERR | EPOLLHUP))
            ok = false;
        if (ok && (evs[i].events & EPOLLOUT))
            ok = flush_out(s, c);
        if (ok && (evs[i].events & EPOLLIN))
            ok = on_readable(s, c) && !c->dead;
        if (!ok)
            conn_close(s, c);
    }
}

uint32_t kvt_local_conns(struct kvt_server *s)
{
    return s->local ? atomic_load_explicit(&s->local->nconns, memory_order_relaxed) : 0;
}
