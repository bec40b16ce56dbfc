/* One request/reply with a kvtier server (see rpc.h). */
#include "ops/rpc.h"
#include "common/url.h"
#include "common/secret.h"
#include "kvtier/error.h"
#include "proto/wire.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <msgpack.h>
#include <zmq.h>

int kvt_ops_call(const char *url, const char *op, const json_t *body, int timeout_ms,
                 json_t **reply, char *err, size_t errcap)
{
    *reply = NULL;
    err[0] = 0;
    int rc = 0;
    void *ctx = zmq_ctx_new(), *sock = NULL;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    zmq_msg_t parts[3];
    int nparts = 0;
    if (!ctx) {
        rc = -errno;
        goto out;
    }
    sock = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(sock, ZMQ_RCVTIMEO, &timeout_ms, sizeof(timeout_ms));
    zmq_setsockopt(sock, ZMQ_SNDTIMEO, &timeout_ms, sizeof(timeout_ms));
    /* a server with --auth-key: the key pair from KVTIER_SERVER_KEY and
     * KVTIER_CLIENT_KEY (docs/security.md); status and purge need admin */
    struct kvt_curve_keys ck;
    rc = kvt_curve_keys_load(NULL, NULL, &ck, err, errcap);
    if (!rc)
        rc = kvt_curve_keys_apply(sock, &ck);
    kvt_secret_wipe(&ck, sizeof(ck));
    if (rc) {
        if (!err[0])
            snprintf(err, errcap, "cannot set up CURVE: %s", kvt_strerror(rc));
        goto out;
    }
    if (zmq_connect(sock, url) < 0) {
        rc = -errno;
        snprintf(err, errcap, "cannot connect to %s: %s", url, kvt_strerror(-errno));
        goto out;
    }
    /* ZeroMQ connects in the background and never says that nobody listens:
     * ask the socket layer first, so that a missing server is said at once */
    rc = kvt_url_probe(url, timeout_ms < 1000 ? timeout_ms : 1000, err, errcap);
    if (rc)
        goto out;
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    if (body)
        kvt_mp_pack_json(&pk, body);
    else
        msgpack_pack_map(&pk, 0);
    char rid[16];
    int rl = snprintf(rid, sizeof(rid), "ops%d", (int)getpid());
    if (zmq_send(sock, rid, (size_t)rl, ZMQ_SNDMORE) < 0 ||
        zmq_send(sock, op, strlen(op), ZMQ_SNDMORE) < 0 ||
        zmq_send(sock, sb.data, sb.size, 0) < 0) {
        rc = errno == EAGAIN ? KVT_E_TIMEOUT : -errno;
        snprintf(err, errcap, "cannot send to %s: %s", url, kvt_strerror(-errno));
        goto out;
    }
    for (;;) {
        if (nparts == 3) { /* more frames than a reply body: drop the rest */
            zmq_msg_t extra;
            zmq_msg_init(&extra);
            zmq_msg_recv(&extra, sock, 0);
            int more = zmq_msg_more(&extra);
            zmq_msg_close(&extra);
            if (!more)
                break;
            continue;
        }
        zmq_msg_init(&parts[nparts]);
        if (zmq_msg_recv(&parts[nparts], sock, 0) < 0) {
            rc = errno == EAGAIN ? KVT_E_TIMEOUT : -errno;
            snprintf(err, errcap, "no reply from %s within %d ms", url, timeout_ms);
            zmq_msg_close(&parts[nparts]);
            goto out;
        }
        int more = zmq_msg_more(&parts[nparts]);
        nparts++;
        if (!more)
            break;
    }
    if (nparts < 3 || zmq_msg_size(&parts[1]) != 4) {
        rc = KVT_E_PROTO;
        snprintf(err, errcap, "malformed reply from %s", url);
        goto out;
    }
    int32_t status = kvt_wire_get_status(zmq_msg_data(&parts[1]));
    const char *why = NULL;
    if (kvt_wire_body_decode(zmq_msg_data(&parts[2]), zmq_msg_size(&parts[2]), &up, &why)) {
        rc = KVT_E_PROTO;
        snprintf(err, errcap, "malformed reply body from %s: %s", url, why ? why : "?");
        goto out;
    }
    json_t *j = kvt_mp_to_json(&up.data);
    if (status) {
        rc = status;
        const char *m = json_string_value(json_object_get(j, "message"));
        snprintf(err, errcap, "%s", m ? m : kvt_strerror(status));
        json_decref(j);
        goto out;
    }
    *reply = j;
out:
    for (int i = 0; i < nparts; i++)
        zmq_msg_close(&parts[i]);
    msgpack_unpacked_destroy(&up);
    msgpack_sbuffer_destroy(&sb);
    if (sock)
        zmq_close(sock);
    if (ctx)
        zmq_ctx_term(ctx);
    return rc;
}
