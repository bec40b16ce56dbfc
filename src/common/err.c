/*
 * kvt_strerror / kvt_errname: one table for project codes, libc for errno.
 * Every component turns an error code into text here; the few errno values
 * libzmq adds beyond libc's (it reports them through errno like the rest)
 * are in the table too, with libzmq's wording, so a -errno from a ZeroMQ
 * call needs no second function (tests/unit/test_auth.c checks them against
 * zmq_strerror) and common/ need not include zmq.h.
 */
#include "kvtier/error.h"

#include <errno.h>
#include <string.h>

#define ZMQ_ERRNO_BASE 156384712 /* zmq.h's ZMQ_HAUSNUMERO */

struct code_text {
    int code;
    const char *name;
    const char *text;
};

static const struct code_text codes[] = {
    {KVT_E_BADKEY, "E_BADKEY", "invalid key"},
    {KVT_E_BADREQ, "E_BADREQ", "malformed request"},
    {KVT_E_BADOP, "E_BADOP", "unknown operation"},
    {KVT_E_PROTO, "E_PROTO", "protocol version mismatch"},
    {KVT_E_TOOBIG, "E_TOOBIG", "object too large"},
    {KVT_E_FULL, "E_FULL", "no space left in tier"},
    {KVT_E_CORRUPT, "E_CORRUPT", "stored object failed verification"},
    {KVT_E_NOTFOUND, "E_NOTFOUND", "key not found"},
    {KVT_E_EXPIRED, "E_EXPIRED", "lease or reservation expired"},
    {KVT_E_CONFIG, "E_CONFIG", "invalid configuration"},
    {KVT_E_UNSUPPORTED, "E_UNSUPPORTED", "not supported by this build"},
    {KVT_E_TIMEOUT, "E_TIMEOUT", "timed out"},
    {KVT_E_CLOSED, "E_CLOSED", "shutting down"},
    {KVT_E_LIMIT, "E_LIMIT", "limit reached"},
    {KVT_E_FATAL, "E_FATAL", "component in fatal state"},
    {KVT_E_UNHEALTHY, "E_UNHEALTHY", "backend unhealthy"},
    {KVT_E_DENIED, "E_DENIED", "permission denied for this client's key"},
    /* libzmq's own errno values (zmq.h: ZMQ_HAUSNUMERO + 51..54) */
    {-(ZMQ_ERRNO_BASE + 51), "EFSM", "Operation cannot be accomplished in current state"},
    {-(ZMQ_ERRNO_BASE + 52), "ENOCOMPATPROTO",
     "The protocol is not compatible with the socket type"},
    {-(ZMQ_ERRNO_BASE + 53), "ETERM", "Context was terminated"},
    {-(ZMQ_ERRNO_BASE + 54), "EMTHREAD", "No thread available"},
};

static const struct code_text *find(int err)
{
    for (size_t i = 0; i < sizeof(codes) / sizeof(codes[0]); i++)
        if (codes[i].code == err)
            return &codes[i];
    return NULL;
}

const char *kvt_strerror(int err)
{
    if (err == 0)
        return "success";
    const struct code_text *c = find(err);
    if (c)
        return c->text;
    if (err < 0 && err > -4096)
        return strerror(-err);
    return "unknown error";
}

const char *kvt_errname(int err)
{
    if (err == 0)
        return "OK";
    const struct code_text *c = find(err);
    if (c)
        return c->name;
    if (err < 0 && err > -4096) {
        const char *n = strerrorname_np(-err);
        if (n)
            return n;
    }
    return "EUNKNOWN";
}
