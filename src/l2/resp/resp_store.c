/*
 * resp stores: SET <header + payload> per key in one pipelined pass (SET
 * ... NX with a shared budget), after the reservation, then publish what
 * the server acknowledged.
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

/* store_pass's ctx: per key, SENT_UNSURE (sent, no reply known to say it
 * did not land) and SENT_AGAIN (sent once more after that) */
enum { SENT_UNSURE = 1, SENT_AGAIN = 2 };

/*
 * STORE, one pipelined pass over keys idx[lo..hi) already reserved
 * (st[j] == K_PENDING). Writes "SET key <header+payload>" for each with one
 * writev per IOV_MAX pieces, then reads the replies. Returns 0 or a
 * transport error (then nothing is known about the pass: the caller may
 * retry it on a fresh connection). ctx: the keys' SENT_* flags (n).
 */
static int store_pass(kvt_l2 *l2, struct resp_engine *e, struct worker *w, kvt_l2_task *t,
                      const uint32_t *idx, uint32_t n, uint8_t *st, void *ctx, char *msg,
                      size_t cap)
{
    uint8_t *sent = ctx;
    uint32_t live = 0;
    for (uint32_t j = 0; j < n; j++)
        live += st[j] == K_PENDING;
    if (!live)
        return 0;
    struct iovec *iov = kvt_xmalloc((size_t)live * 4 * sizeof(*iov));
    size_t *pre_off = kvt_xmalloc((size_t)live * sizeof(size_t));
    w->wb.len = 0;
    char key[KEY_MAX];
    uint32_t k = 0;
    for (uint32_t j = 0; j < n; j++) {
        if (st[j] != K_PENDING)
            continue;
        uint32_t i = idx[j];
        int kl = kvt_resp_wire_key(e, &t->keys[i], key);
        pre_off[k++] = w->wb.len;
        /* a SET ... NX resent after an earlier attempt got no reply: that
         * one may have landed, and then answers nil to this one */
        if (sent[j] & SENT_UNSURE)
            sent[j] |= SENT_AGAIN;
        sent[j] |= SENT_UNSURE;
        kvt_resp_put_asking(w);
        /* with a shared budget, SET ... NX: a key another server stored is
         * not overwritten (and not charged twice) */
        kvt_resp_wb_fmt(&w->wb, e->nx ? "*4\r\n$3\r\nSET\r\n" : "*3\r\n$3\r\nSET\r\n");
        kvt_resp_wb_arg(&w->wb, key, (size_t)kl);
        kvt_resp_wb_fmt(&w->wb, "$%llu\r\n", (unsigned long long)(HDR + t->bufs[i].len));
    }
    /* wb.p may have moved while growing: build the iovecs afterwards */
    int cnt = 0;
    k = 0;
    for (uint32_t j = 0; j < n; j++) {
        if (st[j] != K_PENDING)
            continue;
        uint32_t i = idx[j];
        size_t end = k + 1 < live ? pre_off[k + 1] : w->wb.len;
        iov[cnt++] = (struct iovec){w->wb.p + pre_off[k], end - pre_off[k]};
        iov[cnt++] = (struct iovec){w->hdrs + (size_t)j * HDR, HDR};
        if (t->bufs[i].len)
            iov[cnt++] = (struct iovec){t->bufs[i].ptr, t->bufs[i].len};
        if (e->nx)
            iov[cnt++] = (struct iovec){(void *)"\r\n$2\r\nNX\r\n", 10};
        else
            iov[cnt++] = (struct iovec){(void *)"\r\n", 2};
        k++;
    }
    int rc = kvt_resp_wr_all(w->cur, iov, cnt);
    free(iov);
    free(pre_off);
    atomic_fetch_add(&e->round_trips, 1);
    for (uint32_t j = 0; j < n && !rc; j++) {
        if (st[j] != K_PENDING)
            continue;
        int ty, cs;
        long long num;
        char err[256];
        if (!(rc = kvt_resp_skip_asking(w)))
            rc = kvt_resp_rd_reply(w->cur, &ty, &num, err, sizeof(err));
        if (rc)
            break;
        if (ty == R_STATUS) {
            st[j] = K_OK;
        } else if (ty == R_NIL && e->nx) {
            st[j] = K_EXISTS;
        } else if (ty == R_ERROR && (cs = kvt_resp_cl_err_state(e, w, j, err))) {
            st[j] = (uint8_t)cs;
            if (cs == K_REDIR) /* not run there: only an unanswered send is unsure */
                sent[j] &= (uint8_t)~SENT_UNSURE;
        } else {
            st[j] = K_FAIL;
            atomic_fetch_add(&e->cmd_errors, 1);
            kvt_resp_set_err(e, "SET: %s", ty == R_ERROR ? err : "unexpected reply");
            kvt_warn("%s: SET refused by the server: %s", l2->name,
                     ty == R_ERROR ? err : "unexpected reply");
        }
    }
    if (rc)
        snprintf(msg, cap, "SET pipeline: %s", kvt_strerror(rc));
    return rc;
}

/*
 * STORE a range of keys: reserve each (the cap is checked before a byte
 * moves), encode the headers, one pipelined pass, then publish what the
 * server acknowledged and drop the reservations of the rest.
 */
void kvt_resp_do_store(kvt_l2 *l2, struct resp_engine *e, struct worker *w, kvt_l2_task *t,
                       const uint32_t *idx, uint32_t n, int node)
{
    uint8_t *st = kvt_xcalloc(n, 1);
    uint8_t *hdrs = kvt_resp_worker_hdrs(w, n);
    unsigned gen = atomic_load(&e->gen);
    for (uint32_t j = 0; j < n; j++) {
        uint32_t i = idx[j];
        const kvt_buf *src = &t->bufs[i];
        kvt_key ck;
        kvt_l2_canon(l2, &t->keys[i], &ck);
        int rc = 0;
        uint32_t logical = t->meta[i].len ? t->meta[i].len : (uint32_t)src->len;
        if (src->len > KVT_MAX_OBJECT)
            rc = KVT_E_TOOBIG;
        else
            rc = kvt_l2_reserve(l2, &ck, (uint32_t)(HDR + src->len), logical, HDR,
                                (uint8_t)(F_LEN_KNOWN | gen));
        if (rc == -EEXIST) {
            st[j] = K_SKIP; /* already there: nothing to send */
            atomic_fetch_add(&l2->counters.store_skipped, 1);
            kvt_l2_task_ok(t, i, 0);
            continue;
        }
        if (rc) {
            st[j] = K_SKIP;
            kvt_l2_task_fail(t, i, rc);
            atomic_fetch_add(&l2->counters.store_failed, 1);
            continue;
        }
        t->meta[i].len = logical;
        uint64_t sum = kvt_payload_hash(src->ptr, src->len);
        kvt_objhdr_encode(hdrs + (size_t)j * HDR, HDR, &t->keys[i], &t->meta[i], NULL,
                          t->meta[i].serde, src->len, sum);
    }
    uint8_t *sent = kvt_xcalloc(n, 1);
    int rc = kvt_resp_run_pass(l2, e, w, store_pass, t, idx, n, st, sent, node);
    gen = atomic_load(&e->gen);
    for (uint32_t j = 0; j < n; j++) {
        uint32_t i = idx[j];
        if (st[j] == K_SKIP)
            continue;
        kvt_key ck;
        kvt_l2_canon(l2, &t->keys[i], &ck);
        if (st[j] == K_OK) {
            /* tagged with the generation current now: a reconcile scan that
             * started meanwhile must not sweep it */
            pthread_mutex_lock(&l2->lock);
            struct kvt_l2_obj *o = kvt_l2_find_locked(l2, &ck);
            if (o)
                o->flags = (uint8_t)(F_LEN_KNOWN | gen);
            pthread_mutex_unlock(&l2->lock);
            kvt_l2_publish(l2, &ck);
            atomic_fetch_add(&l2->counters.store_ok, 1);
            kvt_l2_task_ok(t, i, HDR + t->bufs[i].len);
        } else if (st[j] == K_EXISTS) {
            /* another server's value: ours never went in (its bytes go back
             * to the shared budget), theirs is adopted. Resent after an
             * unanswered attempt, the value found may be ours, landed then:
             * settled, not refunded (its eviction will subtract it) */
            if (sent[j] & SENT_AGAIN)
                kvt_l2_unreserve_unsure(l2, &ck);
            else
                kvt_l2_unreserve(l2, &ck);
            kvt_l2_adopt(l2, &ck, (uint32_t)(HDR + t->bufs[i].len), t->meta[i].len, HDR,
                         (uint8_t)(F_LEN_KNOWN | gen), false, false);
            atomic_fetch_add(&l2->counters.store_skipped, 1);
            kvt_l2_task_ok(t, i, 0);
        } else if (st[j] == K_FAIL) { /* refused by the server: nothing written */
            kvt_l2_unreserve(l2, &ck);
            kvt_l2_task_fail(t, i, rc ? rc : KVT_E_UNHEALTHY);
            atomic_fetch_add(&l2->counters.store_failed, 1);
        } else { /* K_PENDING (no reply), K_DOWN (its node failed): may have landed */
            kvt_l2_unreserve_unsure(l2, &ck);
            kvt_l2_task_fail(t, i, rc ? rc : KVT_E_UNHEALTHY);
            atomic_fetch_add(&l2->counters.store_failed, 1);
        }
    }
    free(sent);
    free(st);
}
