/*
 * One request to a kvtier server from an operator command (status, purge):
 * a ZeroMQ DEALER, frames [request id][op][msgpack body], reply [request
 * id][status][body] (docs/protocol.md). Bodies travel as JSON objects here.
 */
#ifndef KVT_OPS_RPC_H
#define KVT_OPS_RPC_H

#include <stddef.h>

#include <jansson.h>

/* Send op with body (NULL: {}) and wait up to timeout_ms. Returns 0 and the
 * reply body in *reply (caller decrefs); KVT_E_TIMEOUT when nobody answers;
 * the server's error code (with its message in err); or -errno. */
int kvt_ops_call(const char *url, const char *op, const json_t *body, int timeout_ms,
                 json_t **reply, char *err, size_t errcap);

#endif
