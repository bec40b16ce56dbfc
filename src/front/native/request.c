/*
 * Requests and replies of kvtier's protocol: a whole message decoded into
 * a request (request id, operation, body, data frames) and dispatched; a
 * reply built (status, body, zero-copy data frames from L1) for the
 * server's loop to send.
 */
#include "common/util.h"
#include "front/native/native_int.h"
#include "kvtier/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const double kvt_lat_bounds[KVT_LAT_BUCKETS] = {
    50e-6, 100e-6, 250e-6, 500e-6, 1e-3,   2.5e-3, 5e-3, 10e-3,
    25e-3, 50e-3,  100e-3, 250e-3, 500e-3, 1.0,    5.0,  1e300,
};

/* ------------------------------------------------------------ replies */

struct reply *kvt_reply_new(struct kvt_native *n, const zmq_msg_t *ident, const void *rid,
                            size_t rid_len, uint32_t op, uint64_t t0)
{
    struct reply *r = kvt_xcalloc(1, sizeof(*r));
    r->core = n->env->core;
    zmq_msg_init(&r->ident);
    if (ident)
        zmq_msg_copy(&r->ident, (zmq_msg_t *)ident);
    /* echoed as it came, also when it is too long (the client matches its
     * error reply by it) */
    r->rid = rid_len > sizeof(r->rid_buf) ? kvt_xmalloc(rid_len) : r->rid_buf;
    r->rid_len = rid_len;
    if (rid_len)
        memcpy(r->rid, rid, rid_len);
    msgpack_sbuffer_init(&r->body);
    msgpack_packer_init(&r->pk, &r->body, msgpack_sbuffer_write);
    r->op = op;
    r->t0 = t0;
    return r;
}

void kvt_reply_free(struct reply *r)
{
    if (!r)
        return;
    zmq_msg_close(&r->ident);
    if (r->rid != r->rid_buf)
        free(r->rid);
    msgpack_sbuffer_destroy(&r->body);
    for (uint32_t i = 0; i < r->nframes; i++)
        kvt_core_put(r->core, r->frames[i].h);
    free(r->frames);
    free(r);
}

/* Copy in to out as valid UTF-8: every byte that does not start a
 * well-formed sequence (RFC 3629: no overlong forms, no surrogates, at most
 * U+10FFFF) becomes the four characters \xNN. out holds 4 * strlen(in) + 1. */
static void utf8_escape(const char *in, char *out)
{
    const uint8_t *p = (const uint8_t *)in;
    char *o = out;
    while (*p) {
        uint8_t b = *p;
        int len = b < 0x80                 ? 1
                  : b >= 0xc2 && b <= 0xdf ? 2
                  : b >= 0xe0 && b <= 0xef ? 3
                  : b >= 0xf0 && b <= 0xf4 ? 4
                                           : 0;
        bool ok = len > 0;
        for (int i = 1; ok && i < len; i++)
            ok = (p[i] & 0xc0) == 0x80; /* also stops at the terminating NUL */
        if (ok && len == 3)
            ok = !(b == 0xe0 && p[1] < 0xa0) && !(b == 0xed && p[1] >= 0xa0);
        if (ok && len == 4)
            ok = !(b == 0xf0 && p[1] < 0x90) && !(b == 0xf4 && p[1] >= 0x90);
        if (!ok) {
            o += sprintf(o, "\\x%02x", b);
            p++;
            continue;
        }
        memcpy(o, p, (size_t)len);
        o += len;
        p += len;
    }
    *o = 0;
}

void kvt_reply_error(struct reply *r, int code, const char *fmt, ...)
{
    char raw[512], msg[4 * sizeof(raw)];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(raw, sizeof(raw), fmt, ap);
    va_end(ap);
    /* messages quote what the client sent (an op name, a namespace): msgpack
     * str must be UTF-8, and a cut at 511 bytes may split a character */
    utf8_escape(raw, msg);
    msgpack_sbuffer_clear(&r->body);
    for (uint32_t i = 0; i < r->nframes; i++)
        kvt_core_put(r->core, r->frames[i].h);
    r->nframes = 0;
    r->status = code ? code : KVT_E_BADREQ;
    msgpack_pack_map(&r->pk, 3);
    kvt_mp_str0(&r->pk, "code");
    msgpack_pack_int32(&r->pk, r->status);
    kvt_mp_str0(&r->pk, "error");
    kvt_mp_str0(&r->pk, kvt_errname(r->status));
    kvt_mp_str0(&r->pk, "message");
    kvt_mp_str0(&r->pk, msg);
}

uint64_t kvt_client_tag(const struct reply *r)
{
    /* FNV-1a of the routing id (ZeroMQ's, or the same-host socket's
     * connection id): the same connection always gets the same tag */
    const uint8_t *p = zmq_msg_data((zmq_msg_t *)&r->ident);
    size_t n = zmq_msg_size((zmq_msg_t *)&r->ident);
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h | 1;
}

/* ------------------------------------------------------------ requests */

/* The row of kvt_ops whose name the op frame is; the last row ("unknown")
 * when none. */
static uint32_t op_of(const zmq_msg_t *m)
{
    size_t len = zmq_msg_size((zmq_msg_t *)m);
    const char *p = zmq_msg_data((zmq_msg_t *)m);
    for (uint32_t i = 0; i + 1 < kvt_nops; i++)
        if (strlen(kvt_ops[i].name) == len && memcmp(kvt_ops[i].name, p, len) == 0)
            return i;
    return kvt_nops - 1;
}

static void close_parts(zmq_msg_t *parts, uint32_t from, uint32_t np)
{
    for (uint32_t i = from; i < np; i++)
        zmq_msg_close(&parts[i]);
}

void kvt_native_handle(struct kvt_native *n, zmq_msg_t *parts, uint32_t np, bool truncated)
{
    uint64_t t0 = kvt_now_ns();
    /* parts[0] = routing id (ROUTER), [1] = request id, [2] = op, [3] = body */
    const void *rid = np > 1 ? zmq_msg_data(&parts[1]) : NULL;
    size_t rid_len = np > 1 ? zmq_msg_size(&parts[1]) : 0;
    uint32_t op = np > 2 ? op_of(&parts[2]) : kvt_nops - 1;
    struct reply *r = kvt_reply_new(n, &parts[0], rid, rid_len, op, t0);
    if (n->env->auth && np > 1) {
        /* the ZAP handler's user id: the table's generation and the key's
         * index; after a reload, the key's entry now (NULL: removed) */
        const char *uid = zmq_msg_gets(&parts[1], "User-Id");
        if (uid)
            r->who = kvt_auth_by_uid(kvt_front_auth(n->env), uid);
        else if (kvt_local_is_ident(&parts[0]))
            r->who = kvt_local_who(n->host, &parts[0]); /* bound by its ticket, or NULL */
    }
    /* np counts the routing id: a request is at least [id][op][body] */
    if (np < 4 || rid_len == 0 || rid_len > KVT_MAX_RID) {
        atomic_fetch_add(&n->bad_requests, 1);
        kvt_reply_error(r, KVT_E_BADREQ, "%s",
                        np < 4 ? "a request needs frames [request id][op][body]"
                               : "the request id must be 1..32 bytes");
        kvt_reply_send(n->host, r);
        close_parts(parts, 0, np);
        return;
    }
    if (truncated) {
        atomic_fetch_add(&n->bad_requests, 1);
        kvt_reply_error(r, KVT_E_BADREQ, "too many frames (max %u)", KVT_NATIVE_MAX_PARTS - 1);
        kvt_reply_send(n->host, r);
        close_parts(parts, 0, np);
        return;
    }
    if (!kvt_ops[op].proc) {
        atomic_fetch_add(&n->bad_requests, 1);
        size_t l = zmq_msg_size(&parts[2]);
        char name[65]; /* printed up to its first NUL; kvt_reply_error escapes non-UTF-8 */
        memcpy(name, zmq_msg_data(&parts[2]), KVT_MIN(l, 64));
        name[KVT_MIN(l, 64)] = 0;
        kvt_reply_error(r, KVT_E_BADOP, "unknown operation '%s'%s", name, l > 64 ? "..." : "");
        kvt_reply_send(n->host, r);
        close_parts(parts, 0, np);
        return;
    }
    struct request q = {.r = r};
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    const char *why = NULL;
    if (kvt_wire_body_decode(np > 3 ? zmq_msg_data(&parts[3]) : NULL,
                             np > 3 ? zmq_msg_size(&parts[3]) : 0, &up, &why)) {
        atomic_fetch_add(&n->bad_requests, 1);
        kvt_reply_error(r, KVT_E_BADREQ, "%s", why);
        kvt_reply_send(n->host, r);
        msgpack_unpacked_destroy(&up);
        close_parts(parts, 0, np);
        return;
    }
    q.body = up.data;
    q.frames = np > 4 ? &parts[4] : NULL;
    q.nframes = np > 4 ? np - 4 : 0;
    for (uint32_t i = 0; i < q.nframes; i++)
        atomic_fetch_add_explicit(&n->bytes_in, zmq_msg_size(&q.frames[i]), memory_order_relaxed);
    kvt_native_dispatch(n, op, &q);
    /* handlers that keep data frames move them out and zero q.nframes */
    msgpack_unpacked_destroy(&up);
    close_parts(parts, 0, KVT_MIN(np, 4));
    if (q.frames)
        close_parts(q.frames, 0, q.nframes);
}
