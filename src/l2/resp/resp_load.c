/*
 * resp lookups and loads: STRLEN (+ GETRANGE of the header for keys the
 * index does not know) per key in one pipelined pass; GET per key with the
 * header checked first and the payload copied into the destination as it
 * arrives, then verified. Torn, foreign or corrupt values are misses.
 */
#include "common/log.h"
#include "common/util.h"
#include "io/tpool.h"
#include "kvtier/error.h"
#include "l2/adapters.h"
#include "common/cfg.h"
#include "l2/engine.h"
#include "l2/life.h"
#include "l2/kit/objfmt.h"
#include "l2/resp/resp_int.h"
#include "l2/budget.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

struct lookup_ctx {
    const uint32_t *known; /* stored size of indexed keys, 0 = unknown */
    uint32_t *hlen;        /* bytes of the header read by GETRANGE */
    int64_t *slen;         /* STRLEN */
};

/* LOOKUP pass: "STRLEN key" for every pending key, preceded by
 * "GETRANGE key 0 511" when the key's header is not known yet. */
static int lookup_pass(kvt_l2 *l2, struct resp_engine *e, struct worker *w, kvt_l2_task *t,
                       const uint32_t *idx, uint32_t n, uint8_t *st, void *ctx, char *msg,
                       size_t cap)
{
    (void)l2;
    struct lookup_ctx *lc = ctx;
    w->wb.len = 0;
    char key[KEY_MAX];
    uint32_t live = 0;
    for (uint32_t j = 0; j < n; j++) {
        if (st[j] != K_PENDING)
            continue;
        int kl = kvt_resp_wire_key(e, &t->keys[idx[j]], key);
        if (!lc->known[j]) {
            kvt_resp_put_asking(w);
            kvt_resp_wb_fmt(&w->wb, "*4\r\n$8\r\nGETRANGE\r\n");
            kvt_resp_wb_arg(&w->wb, key, (size_t)kl);
            kvt_resp_wb_fmt(&w->wb, "$1\r\n0\r\n$3\r\n%u\r\n", HDR - 1);
        }
        kvt_resp_put_asking(w);
        kvt_resp_wb_fmt(&w->wb, "*2\r\n$6\r\nSTRLEN\r\n");
        kvt_resp_wb_arg(&w->wb, key, (size_t)kl);
        live++;
    }
    if (!live)
        return 0;
    struct iovec iov = {w->wb.p, w->wb.len};
    int rc = kvt_resp_wr_all(w->cur, &iov, 1);
    atomic_fetch_add(&e->round_trips, 1);
    for (uint32_t j = 0; j < n && !rc; j++) {
        if (st[j] != K_PENDING)
            continue;
        int ty = R_NIL, cs;
        long long num = 0;
        char err[256];
        lc->hlen[j] = 0;
        if (!lc->known[j]) {
            if (!(rc = kvt_resp_skip_asking(w)))
                rc = kvt_resp_rd_reply(w->cur, &ty, &num, err, sizeof(err));
            if (!rc && ty == R_BULK) {
                if (num > HDR)
                    rc = -EPROTO;
                else if (!(rc = kvt_resp_rd_bytes(w->cur, w->hdrs + (size_t)j * HDR, (size_t)num)))
                    rc = kvt_resp_rd_crlf(w->cur);
                lc->hlen[j] = (uint32_t)num;
            }
        }
        bool bad = !rc && ty != R_BULK && ty != R_NIL;
        if (!rc && !(rc = kvt_resp_skip_asking(w)))
            rc = kvt_resp_rd_reply(w->cur, &ty, &num, err, sizeof(err));
        if (rc)
            break;
        if (ty == R_ERROR && (cs = kvt_resp_cl_err_state(e, w, j, err))) {
            st[j] = (uint8_t)cs; /* MOVED/ASK answer GETRANGE and STRLEN alike */
            continue;
        }
        if (bad || ty != R_INT) { /* e.g. WRONGTYPE: the key holds no string */
            st[j] = K_MISS;
            atomic_fetch_add(&e->foreign, 1);
            continue;
        }
        lc->slen[j] = num;
        st[j] = K_OK;
    }
    if (rc)
        snprintf(msg, cap, "lookup pipeline: %s", kvt_strerror(rc));
    return rc;
}

/* Decode and check a value's header against the key and the value size. */
int kvt_resp_check_header(const uint8_t *buf, uint32_t got, uint64_t vlen, const kvt_key *want,
                          struct kvt_objhdr *h, const char **why)
{
    if (got < HDR) {
        *why = "value shorter than a header";
        return KVT_E_CORRUPT;
    }
    int rc = kvt_objhdr_decode(buf, got, h, why);
    if (rc)
        return rc;
    if (!kvt_objhdr_matches(h, KVT_CODEC_OBJ, want)) {
        *why = "header names another key";
        return KVT_E_CORRUPT;
    }
    if (h->hdr_len != HDR || h->payload_len + HDR != vlen) {
        *why = "value size does not match the header (truncated or extended)";
        return KVT_E_CORRUPT;
    }
    return 0;
}

void kvt_resp_do_lookup(kvt_l2 *l2, struct resp_engine *e, struct worker *w, kvt_l2_task *t,
                        const uint32_t *idx, const uint32_t *known, uint32_t n, int node)
{
    uint8_t *st = kvt_xcalloc(n, 1);
    struct lookup_ctx lc = {known, kvt_xcalloc(n, sizeof(uint32_t)),
                            kvt_xcalloc(n, sizeof(int64_t))};
    kvt_key *gone = kvt_xcalloc(n, sizeof(kvt_key));
    uint32_t ngone = 0;
    kvt_resp_worker_hdrs(w, n);
    int rc = kvt_resp_run_pass(l2, e, w, lookup_pass, t, idx, n, st, &lc, node);
    for (uint32_t j = 0; j < n && !rc; j++) {
        if (st[j] != K_OK)
            continue;
        uint32_t i = idx[j];
        kvt_key ck;
        kvt_l2_canon(l2, &t->keys[i], &ck);
        if (known[j]) {
            struct kvt_l2_obj o;
            if (lc.slen[j] == 0)
                gone[ngone++] = ck;
            else if ((uint64_t)lc.slen[j] != known[j])
                atomic_fetch_add(&e->foreign, 1); /* replaced by something else */
            else if (kvt_l2_pin(l2, &ck, &o)) {
                t->meta[i].len = o.len;
                kvt_l2_task_ok(t, i, 0);
            }
            continue;
        }
        if (lc.slen[j] == 0)
            continue; /* absent */
        struct kvt_objhdr h;
        const char *why = NULL;
        if (kvt_resp_check_header(w->hdrs + (size_t)j * HDR, lc.hlen[j], (uint64_t)lc.slen[j],
                                  &t->keys[i], &h, &why)) {
            char ks[400];
            atomic_fetch_add(&e->foreign, 1);
            kvt_debug("%s: lookup %s: %s: a miss", l2->name,
                      kvt_key_str(&t->keys[i], ks, sizeof(ks)), why);
            continue;
        }
        if (kvt_l2_pin_found(l2, &ck, (uint32_t)lc.slen[j], (uint32_t)h.logical_len, HDR,
                             F_LEN_KNOWN)) {
            t->meta[i] = h.meta;
            kvt_l2_task_ok(t, i, 0);
        }
    }
    kvt_l2_drop_gone(l2, gone, ngone); /* gone from the server: no UNLINK */
    free(gone);
    free(lc.hlen);
    free(lc.slen);
    free(st);
}

struct load_ctx {
    const char **why; /* reason of a K_CORRUPT */
};

/*
 * LOAD pass: "GET key" for every pending key. Each reply's header goes to
 * the worker's header buffer and is checked first; the payload is copied
 * into the destination only when the header names this key and the payload
 * fits the destination's capacity. Anything else is drained.
 */
static int load_pass(kvt_l2 *l2, struct resp_engine *e, struct worker *w, kvt_l2_task *t,
                     const uint32_t *idx, uint32_t n, uint8_t *st, void *ctx, char *msg, size_t cap)
{
    (void)l2;
    struct load_ctx *lc = ctx;
    w->wb.len = 0;
    char key[KEY_MAX];
    uint32_t live = 0;
    for (uint32_t j = 0; j < n; j++) {
        if (st[j] != K_PENDING)
            continue;
        int kl = kvt_resp_wire_key(e, &t->keys[idx[j]], key);
        kvt_resp_put_asking(w);
        kvt_resp_wb_fmt(&w->wb, "*2\r\n$3\r\nGET\r\n");
        kvt_resp_wb_arg(&w->wb, key, (size_t)kl);
        live++;
    }
    if (!live)
        return 0;
    struct iovec iov = {w->wb.p, w->wb.len};
    int rc = kvt_resp_wr_all(w->cur, &iov, 1);
    atomic_fetch_add(&e->round_trips, 1);
    for (uint32_t j = 0; j < n && !rc; j++) {
        if (st[j] != K_PENDING)
            continue;
        uint32_t i = idx[j];
        int ty, cs;
        long long num = 0;
        char err[256];
        if (!(rc = kvt_resp_skip_asking(w)))
            rc = kvt_resp_rd_reply(w->cur, &ty, &num, err, sizeof(err));
        if (rc)
            break;
        if (ty == R_NIL) {
            st[j] = K_MISS;
            continue;
        }
        if (ty == R_ERROR && (cs = kvt_resp_cl_err_state(e, w, j, err))) {
            st[j] = (uint8_t)cs;
            continue;
        }
        if (ty != R_BULK) {
            st[j] = K_FAIL;
            atomic_fetch_add(&e->foreign, 1);
            continue;
        }
        uint64_t vlen = (uint64_t)num;
        uint8_t *hb = w->hdrs + (size_t)j * HDR;
        uint32_t hl = (uint32_t)KVT_MIN(vlen, HDR);
        if ((rc = kvt_resp_rd_bytes(w->cur, hb, hl)))
            break;
        struct kvt_objhdr h;
        const char *why = NULL;
        if (kvt_resp_check_header(hb, hl, vlen, &t->keys[i], &h, &why)) {
            st[j] = K_CORRUPT;
            lc->why[j] = why;
        } else if (h.payload_len > t->bufs[i].len) {
            st[j] = K_FAIL; /* does not fit the destination: never an overrun */
        }
        if (st[j] != K_PENDING) {
            if (!(rc = kvt_resp_rd_bytes(w->cur, NULL, vlen - hl)))
                rc = kvt_resp_rd_crlf(w->cur);
            continue;
        }
        if (!(rc = kvt_resp_rd_bytes(w->cur, t->bufs[i].ptr, h.payload_len)))
            rc = kvt_resp_rd_crlf(w->cur);
        if (!rc)
            st[j] = K_OK;
    }
    if (rc)
        snprintf(msg, cap, "load pipeline: %s", kvt_strerror(rc));
    return rc;
}

void kvt_resp_do_load(kvt_l2 *l2, struct resp_engine *e, struct worker *w, kvt_l2_task *t,
                      const uint32_t *idx, uint32_t n, int node)
{
    uint8_t *st = kvt_xcalloc(n, 1);
    struct load_ctx lc = {kvt_xcalloc(n, sizeof(char *))};
    kvt_resp_worker_hdrs(w, n);
    int rc = kvt_resp_run_pass(l2, e, w, load_pass, t, idx, n, st, &lc, node);
    int master = e->read_replicas ? kvt_resp_cl_master_of(e, node) : -1;
    if (master >= 0) {
        /* read from a replica: what it did not have (replication is
         * asynchronous: a value stored a moment ago) or could not serve
         * (down, failing over) is asked of its master */
        atomic_fetch_add(&e->replica_loads, n);
        uint32_t again = 0;
        for (uint32_t j = 0; j < n; j++)
            if (st[j] == K_MISS || st[j] == K_DOWN) {
                st[j] = K_PENDING;
                again++;
            }
        if (again) {
            atomic_fetch_add(&e->replica_fallbacks, again);
            /* only the K_PENDING keys are sent again */
            rc = kvt_resp_run_pass(l2, e, w, load_pass, t, idx, n, st, &lc, master);
        }
    }
    uint32_t *bad = kvt_xcalloc(n, sizeof(uint32_t));
    uint32_t nbad = 0;
    for (uint32_t j = 0; j < n; j++) {
        uint32_t i = idx[j];
        kvt_key ck;
        kvt_l2_canon(l2, &t->keys[i], &ck);
        if (st[j] == K_OK) {
            struct kvt_objhdr h;
            const char *why = NULL;
            kvt_objhdr_decode(w->hdrs + (size_t)j * HDR, HDR, &h, &why);
            if (kvt_payload_hash(t->bufs[i].ptr, h.payload_len) != h.payload_xxh3) {
                st[j] = K_CORRUPT;
                lc.why[j] = "payload checksum mismatch";
            } else {
                t->meta[i] = h.meta;
                t->bufs[i].len = h.payload_len;
                kvt_l2_task_ok(t, i, HDR + h.payload_len);
                continue;
            }
        }
        if (st[j] == K_CORRUPT) {
            kvt_resp_report_corrupt(l2, &t->keys[i], lc.why[j]);
            bad[nbad++] = i;
            kvt_l2_forget(l2, &ck);
        } else if (st[j] == K_MISS) {
            kvt_l2_forget(l2, &ck); /* gone from the server (deleted elsewhere, or lost) */
        }
        kvt_l2_task_fail(t, i,
                         rc                ? rc
                         : st[j] == K_MISS ? KVT_E_NOTFOUND
                         : st[j] == K_DOWN ? KVT_E_UNHEALTHY
                                           : KVT_E_CORRUPT);
    }
    if (nbad && e->cluster)
        kvt_resp_cl_unlink_keys(l2, e, t->keys, bad, nbad);
    else if (nbad && !rc && w->cn.c)
        kvt_resp_unlink_keys(e, w, t->keys, bad, nbad);
    free(bad);
    free(lc.why);
    free(st);
}
