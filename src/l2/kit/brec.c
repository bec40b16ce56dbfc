/* The shared budget record's arithmetic and its encoding (brec.h). */
#include "l2/kit/brec.h"
#include "common/le.h"
#include "common/util.h"
#include "l2/kit/objfmt.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#define MAGIC "KVTBUDG1"
#define VERSION 1u

void kvt_brec_init(struct kvt_brec *r, uint64_t cap, uint64_t now_ms)
{
    memset(r, 0, sizeof(*r));
    r->epoch = now_ms ? now_ms : 1; /* monotonic across rebuilds (brec.h) */
    r->cap = cap;
    r->created_ms = now_ms;
}

int kvt_brec_find(const struct kvt_brec *r, uint64_t id)
{
    for (int i = 0; i < KVT_BREC_NODES; i++)
        if (id && r->node[i].id == id)
            return i;
    return -1;
}

int kvt_brec_free_slot(const struct kvt_brec *r)
{
    for (int i = 0; i < KVT_BREC_NODES; i++)
        if (r->node[i].id == 0)
            return i;
    return -1;
}

void kvt_brec_join(struct kvt_brec *r, int slot, uint64_t id, uint32_t pid, const char *host,
                   uint64_t now_ms)
{
    struct kvt_brec_node *n = &r->node[slot];
    memset(n, 0, sizeof(*n));
    n->id = id;
    n->pid = pid;
    n->seen_ms = now_ms;
    snprintf(n->host, sizeof(n->host), "%s", host ? host : "");
}

void kvt_brec_fold(struct kvt_brec *r, int slot)
{
    memset(&r->node[slot], 0, sizeof(r->node[slot]));
}

void kvt_brec_view(const struct kvt_brec *r, int slot, struct kvt_budget_view *out)
{
    memset(out, 0, sizeof(*out));
    out->total = r->total;
    out->adds = r->adds;
    out->epoch = r->epoch;
    out->recounts = r->recounts;
    out->cap = r->cap;
    if (slot >= 0) {
        out->part = r->node[slot].part;
        out->pending = r->node[slot].pending;
    }
}

/* pending never goes below 0: a report of more than it holds (a rejoined
 * entry restarted from an estimate) only lowers it to 0 */
static uint64_t sub_floor(uint64_t a, uint64_t b)
{
    return a > b ? a - b : 0;
}

void kvt_brec_rejoin(struct kvt_brec *r, int slot, uint64_t back)
{
    struct kvt_brec_node *n = &r->node[slot];
    r->total += (int64_t)back;
    r->adds += back; /* a recount running now counts it as charged during its walk */
    n->part += (int64_t)back;
    n->pending = back;
}

void kvt_brec_apply(struct kvt_brec *r, int slot, const struct kvt_budget_req *rq, bool rejoined,
                    uint64_t now_ms, struct kvt_budget_view *out)
{
    struct kvt_brec_node *n = &r->node[slot];
    bool removed_ok = false, granted = false;
    /* rejoined: the record may have lost what we hold. rq->inflight (the
     * take included) was read after settled and refunded bytes left it:
     * those are added back too, then subtracted below like any step's (a
     * refund of credit a recount left out must not lower the total) */
    if (rejoined)
        kvt_brec_rejoin(r, slot, sub_floor(rq->inflight, rq->take) + rq->refund + rq->settled);
    /* refunds, removals and settlements first: they free room for the take */
    r->total -= (int64_t)rq->refund;
    n->part -= (int64_t)rq->refund;
    n->pending = sub_floor(n->pending, rq->refund + rq->settled);
    if (rq->removed && rq->removed_epoch == r->epoch) {
        r->total -= (int64_t)rq->removed;
        n->part -= (int64_t)rq->removed;
        removed_ok = true;
    }
    if (rq->take) {
        /* a total below 0 (removals of objects nobody had charged, a
         * record rebuilt after a loss) grants nothing beyond the cap */
        int64_t room = (int64_t)rq->cap - (r->total > 0 ? r->total : 0);
        if (rq->cap == 0 || (int64_t)rq->take <= room) {
            r->total += (int64_t)rq->take;
            r->adds += rq->take;
            n->part += (int64_t)rq->take;
            n->pending += rq->take;
            granted = true;
        }
    }
    n->seen_ms = now_ms;
    kvt_brec_view(r, slot, out);
    out->granted = granted;
    out->removed_ok = removed_ok;
    out->rejoined = rejoined;
}

void kvt_brec_begin(const struct kvt_brec *r, const bool *alive, struct kvt_budget_snap *s)
{
    s->adds = r->adds;
    s->epoch = r->epoch;
    s->created = r->created_ms;
    s->pending = 0;
    for (int i = 0; i < KVT_BREC_NODES; i++)
        if (r->node[i].id && alive[i])
            s->pending += r->node[i].pending;
}

void kvt_brec_end(struct kvt_brec *r, const struct kvt_budget_snap *s, uint64_t walked,
                  uint64_t now_ms)
{
    int64_t before = r->total;
    /* adds only grows within one record; one re-created since the
     * snapshot (lost, torn) counts from 0, and may have passed the old
     * snapshot's adds already: all of its adds are since */
    bool same = r->created_ms == s->created && r->adds >= s->adds;
    uint64_t since = same ? r->adds - s->adds : r->adds;
    r->total = (int64_t)(walked + since + s->pending);
    r->epoch++;
    r->recounts++;
    r->recount_ms = now_ms;
    r->recount_walked = walked;
    r->recount_before = before;
    r->recount_after = r->total;
}

uint32_t kvt_brec_step(struct kvt_brec *r, int slot, const struct kvt_brec_op *op, bool rejoined,
                       uint64_t now_ms, kvt_brec_census_fn census, void *ctx,
                       struct kvt_budget_view *out)
{
    uint32_t folded = 0;
    if (op->kind == KVT_BREC_APPLY) {
        const struct kvt_budget_req *rq = op->rq;
        bool refresh = !rq->take && !rq->refund && !rq->removed;
        if (refresh && !rejoined) /* the periodic step counts and folds */
            folded = census(ctx, r, now_ms);
        kvt_brec_apply(r, slot, rq, rejoined, now_ms, out);
    } else {
        folded = census(ctx, r, now_ms);
        if (rejoined)
            kvt_brec_rejoin(r, slot, op->inflight);
        bool live[KVT_BREC_NODES];
        for (int i = 0; i < KVT_BREC_NODES; i++)
            live[i] = r->node[i].id != 0; /* census left only live entries */
        if (op->kind == KVT_BREC_BEGIN)
            kvt_brec_begin(r, live, op->snap);
        else
            kvt_brec_end(r, op->snap, op->walked, now_ms);
        r->node[slot].seen_ms = now_ms;
        if (out)
            kvt_brec_view(r, slot, out);
    }
    if (out)
        out->rejoined = out->rejoined || rejoined;
    return folded;
}

/* ---------------------------------------------------------- encoding */

void kvt_brec_encode(const struct kvt_brec *r, uint8_t *buf)
{
    memset(buf, 0, KVT_BREC_BYTES);
    memcpy(buf, MAGIC, 8);
    kvt_put32(buf + 8, VERSION);
    kvt_put32(buf + 12, KVT_BREC_NODES);
    kvt_put64(buf + 16, (uint64_t)r->total);
    kvt_put64(buf + 24, r->adds);
    kvt_put64(buf + 32, r->epoch);
    kvt_put64(buf + 40, r->recounts);
    kvt_put64(buf + 48, r->cap);
    kvt_put64(buf + 56, r->created_ms);
    kvt_put64(buf + 64, r->recount_ms);
    kvt_put64(buf + 72, r->recount_walked);
    kvt_put64(buf + 80, (uint64_t)r->recount_before);
    kvt_put64(buf + 88, (uint64_t)r->recount_after);
    /* 96..119 reserved; 120: the checksum of everything else */
    for (int i = 0; i < KVT_BREC_NODES; i++) {
        uint8_t *p = buf + 128 + (size_t)i * 64;
        const struct kvt_brec_node *n = &r->node[i];
        kvt_put64(p, n->id);
        kvt_put64(p + 8, (uint64_t)n->part);
        kvt_put64(p + 16, n->pending);
        kvt_put64(p + 24, n->seen_ms);
        kvt_put32(p + 32, n->pid);
        memcpy(p + 36, n->host, KVT_BREC_HOST);
        p[36 + KVT_BREC_HOST - 1] = 0;
        kvt_put32(p + 60, n->step);
    }
    kvt_put64(buf + 120, kvt_payload_hash(buf, KVT_BREC_BYTES));
}

int kvt_brec_decode(const uint8_t *buf, size_t n, struct kvt_brec *r)
{
    if (n == 0)
        return -ENODATA;
    if (n != KVT_BREC_BYTES || memcmp(buf, MAGIC, 8) != 0 || kvt_get32(buf + 8) != VERSION ||
        kvt_get32(buf + 12) != KVT_BREC_NODES)
        return -EBADMSG;
    uint8_t tmp[KVT_BREC_BYTES];
    memcpy(tmp, buf, sizeof(tmp));
    uint64_t sum = kvt_get64(tmp + 120);
    kvt_put64(tmp + 120, 0);
    if (kvt_payload_hash(tmp, sizeof(tmp)) != sum)
        return -EBADMSG;
    memset(r, 0, sizeof(*r));
    r->total = (int64_t)kvt_get64(buf + 16);
    r->adds = kvt_get64(buf + 24);
    r->epoch = kvt_get64(buf + 32);
    r->recounts = kvt_get64(buf + 40);
    r->cap = kvt_get64(buf + 48);
    r->created_ms = kvt_get64(buf + 56);
    r->recount_ms = kvt_get64(buf + 64);
    r->recount_walked = kvt_get64(buf + 72);
    r->recount_before = (int64_t)kvt_get64(buf + 80);
    r->recount_after = (int64_t)kvt_get64(buf + 88);
    for (int i = 0; i < KVT_BREC_NODES; i++) {
        const uint8_t *p = buf + 128 + (size_t)i * 64;
        struct kvt_brec_node *nd = &r->node[i];
        nd->id = kvt_get64(p);
        nd->part = (int64_t)kvt_get64(p + 8);
        nd->pending = kvt_get64(p + 16);
        nd->seen_ms = kvt_get64(p + 24);
        nd->pid = kvt_get32(p + 32);
        memcpy(nd->host, p + 36, KVT_BREC_HOST);
        nd->host[KVT_BREC_HOST - 1] = 0;
        nd->step = kvt_get32(p + 60);
    }
    return 0;
}
