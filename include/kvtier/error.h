/*
 * kvtier error codes.
 *
 * Every kvtier function that can fail returns 0 on success or a negative
 * number: either -errno (for example -ENOMEM, -EIO, -ENOSPC) or one of the
 * project codes below, which live in their own range [-1099, -1000] so they
 * never collide with errno values. kvt_strerror() names both kinds.
 *
 * The same numbers travel on the wire: a non-zero reply status is one of
 * these codes (see docs/protocol.md).
 */
#ifndef KVTIER_ERROR_H
#define KVTIER_ERROR_H

#ifdef __cplusplus
extern "C" {
#endif

enum kvt_error {
    KVT_E_FIRST = -1000,
    KVT_E_BADKEY = -1001,      /* key fails validation (model, salt, hash length) */
    KVT_E_BADREQ = -1002,      /* malformed request body or frames */
    KVT_E_BADOP = -1003,       /* unknown operation name */
    KVT_E_PROTO = -1004,       /* protocol version mismatch */
    KVT_E_TOOBIG = -1005,      /* object larger than the server accepts */
    KVT_E_FULL = -1006,        /* no space: capacity cap or memory exhausted */
    KVT_E_CORRUPT = -1007,     /* stored object failed verification */
    KVT_E_NOTFOUND = -1008,    /* key not present */
    KVT_E_EXPIRED = -1009,     /* lease or reservation expired before commit */
    KVT_E_CONFIG = -1010,      /* invalid configuration */
    KVT_E_UNSUPPORTED = -1011, /* feature not available in this build */
    KVT_E_TIMEOUT = -1012,     /* no reply within the client's timeout */
    KVT_E_CLOSED = -1013,      /* component is shutting down */
    KVT_E_LIMIT = -1014,       /* a configured limit was reached */
    KVT_E_FATAL = -1015,       /* component entered a fatal state earlier */
    KVT_E_UNHEALTHY = -1016,   /* backend unreachable (circuit open, connection down) */
    KVT_E_DENIED = -1017,      /* the client's key may not do this (tenant, read-only, admin) */
    KVT_E_LAST = -1099,
};

/* Human-readable text for a kvtier code or a negative errno (libzmq's own
 * errno values included, in zmq_strerror's words). The one function every
 * component uses to name an error. Never NULL. */
const char *kvt_strerror(int err);

/* Short symbolic name ("E_BADKEY", "ENOENT", ...). Never NULL. */
const char *kvt_errname(int err);

#ifdef __cplusplus
}
#endif
#endif
