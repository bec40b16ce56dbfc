/*
 * subscribe_kv_events (lmcache 0.5.6, lmcache/v1/multiprocess/modules/
 * kv_events.py): a stream of L1 ("CPU") events for one model. With the
 * server's KV events on (--kv-events-endpoint), the core's tier-event
 * queue keeps a log of L1's events (core/events.h, kvt_events_log_*); each
 * stream pages through it by cursor, as LMCache's own log does:
 *
 *   request  [uid][op][instance_id][model_name][cursor][max_events]
 *   batch    [uid][op][KVEventBatch {enabled, incarnation, next_cursor, lost,
 *             events: [{seq, kind, medium, model_name, block_hashes,
 *             parent_block_hash, token_ids}]}]
 *   control  [uid][""]["ack"]: send the next batch; [uid][""]["cancel"]
 *   end      [uid][op] (no payload)
 *
 * The first batch goes at once; later ones when the client acknowledged
 * the previous one and there is something to say (records of the model,
 * or a loss). Docs: docs/lmcache-protocol.md.
 */
#include "common/log.h"
#include "common/util.h"
#include "core/events.h"
#include "front/lmcache/lmc_int.h"
#include "kvtier/error.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_SUBS 256

bool lmc_events_on(const struct kvt_lmc *m)
{
    return m->env->events != NULL;
}

void lmc_events_start(struct kvt_lmc *m)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    m->incarnation = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    if (m->env->events) /* before requests are served: L1 holds nothing yet */
        kvt_events_log_open(m->env->events, LMC_KV_EVENT_LOG, m->efd);
}

static void send_end(struct kvt_lmc *m, struct lmc_sub *s)
{
    zmq_msg_t id;
    zmq_msg_init(&id);
    zmq_msg_copy(&id, &s->ident);
    zmq_msg_send(&id, m->sock, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_msg_close(&id);
    zmq_send(m->sock, s->uid, s->uid_len, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(m->sock, s->op, s->op_len, ZMQ_DONTWAIT);
}

static void sub_free(struct lmc_sub *s)
{
    zmq_msg_close(&s->ident);
    free(s);
}

/* Unlink *pp, telling its client the stream ended. */
static void sub_end(struct kvt_lmc *m, struct lmc_sub **pp)
{
    struct lmc_sub *s = *pp;
    *pp = s->next;
    m->nsubs--;
    atomic_store_explicit(&m->nsubs_seen, m->nsubs, memory_order_relaxed);
    send_end(m, s);
    sub_free(s);
}

/* One KVEventRecord: the chunk's key hash (LMCache's chunk hash); the
 * parent and token ids when the chunk was stored with them as one chunk
 * (LMCache's own stores give them: lmc_handlers.c). */
static void pack_record(msgpack_packer *pk, const struct kvt_evrec *r, const char *model)
{
    const struct kvt_blocktag *t = r->tag;
    bool chunk_tag = t && t->nblocks == 1 && t->hash_len == r->key.hash_len &&
                     !memcmp(t->hashes, r->key.hash, r->key.hash_len);
    msgpack_pack_map(pk, 7);
    kvt_mp_str0(pk, "seq");
    msgpack_pack_uint64(pk, r->seq);
    kvt_mp_str0(pk, "kind");
    kvt_mp_str0(pk, r->ev == KVT_TIER_STORED ? "stored" : "removed");
    kvt_mp_str0(pk, "medium");
    kvt_mp_str0(pk, "CPU");
    kvt_mp_str0(pk, "model_name");
    kvt_mp_str0(pk, model);
    kvt_mp_str0(pk, "block_hashes");
    msgpack_pack_array(pk, 1);
    msgpack_pack_bin(pk, r->key.hash_len);
    msgpack_pack_bin_body(pk, r->key.hash, r->key.hash_len);
    kvt_mp_str0(pk, "parent_block_hash");
    if (chunk_tag && t->has_parent) {
        msgpack_pack_bin(pk, t->hash_len);
        msgpack_pack_bin_body(pk, t->parent, t->hash_len);
    } else {
        msgpack_pack_nil(pk);
    }
    kvt_mp_str0(pk, "token_ids");
    uint32_t nt = t ? t->ntokens : 0;
    msgpack_pack_array(pk, nt);
    for (uint32_t i = 0; i < nt; i++)
        msgpack_pack_uint32(pk, t->tokens[i]);
}

/*
 * Send s's next batch if it has credit and something to say (LMCache's
 * read_kv_events: records after the cursor for its model, at most
 * max_events; lost when records after the cursor were overwritten or the
 * cursor is beyond the log, e.g. from an earlier server).
 */
static void sub_service(struct kvt_lmc *m, struct lmc_sub *s)
{
    if (!s->credit)
        return;
    struct kvt_events *q = m->env->events;
    struct kvt_evrec *recs = kvt_xmalloc(s->max_events * sizeof(*recs));
    size_t ml = strlen(s->model);
    uint64_t first = 1, last = 0, next = s->cursor;
    uint32_t n = 0, keep = 0;
    bool lost = false;
    if (q) {
        for (;;) { /* skip other models' records without a batch */
            n = kvt_events_log_read(q, next, recs, s->max_events, &first, &last);
            if (next == s->cursor)
                lost = s->cursor + 1 < first || s->cursor > last;
            if (next > last)
                next = last;
            keep = 0;
            for (uint32_t i = 0; i < n; i++) {
                next = recs[i].seq;
                const char *rm = kvt_ns_model(recs[i].key.ns);
                if (strlen(rm) == ml && !memcmp(rm, s->model, ml))
                    recs[keep++] = recs[i];
                else
                    kvt_blocktag_put(recs[i].tag);
            }
            if (keep || n < s->max_events)
                break;
        }
    }
    if (!s->first && !keep && !lost && q) {
        s->cursor = next;
        free(recs);
        return;
    }
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 5);
    kvt_mp_str0(&pk, "enabled");
    if (q)
        msgpack_pack_true(&pk);
    else
        msgpack_pack_false(&pk);
    kvt_mp_str0(&pk, "incarnation");
    msgpack_pack_uint64(&pk, m->incarnation);
    kvt_mp_str0(&pk, "next_cursor");
    msgpack_pack_uint64(&pk, q ? next : 0);
    kvt_mp_str0(&pk, "lost");
    if (lost)
        msgpack_pack_true(&pk);
    else
        msgpack_pack_false(&pk);
    kvt_mp_str0(&pk, "events");
    msgpack_pack_array(&pk, keep);
    for (uint32_t i = 0; i < keep; i++) {
        pack_record(&pk, &recs[i], s->model);
        kvt_blocktag_put(recs[i].tag);
    }
    free(recs);
    zmq_msg_t id;
    zmq_msg_init(&id);
    zmq_msg_copy(&id, &s->ident);
    zmq_msg_send(&id, m->sock, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_msg_close(&id);
    zmq_send(m->sock, s->uid, s->uid_len, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(m->sock, s->op, s->op_len, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(m->sock, sb.data, sb.size, ZMQ_DONTWAIT);
    msgpack_sbuffer_destroy(&sb);
    atomic_fetch_add_explicit(&m->event_batches, 1, memory_order_relaxed);
    s->cursor = next;
    s->first = false;
    s->credit = false;
}

void lmc_events_service(struct kvt_lmc *m)
{
    for (struct lmc_sub **pp = &m->subs; *pp;) {
        struct lmc_sub *s = *pp;
        sub_service(m, s);
        if (!m->env->events && !s->first) { /* events off: one batch saying so, then the end */
            sub_end(m, pp);
            continue;
        }
        pp = &s->next;
    }
}

void lmc_h_subscribe(struct lmc_rq *q)
{
    struct kvt_lmc *m = q->m;
    int64_t inst, cursor, max;
    const char *model;
    size_t ml;
    if (lmc_decode_i64(q, 0, "instance_id", &inst) ||
        lmc_decode_str(q, 1, "model_name", &model, &ml) ||
        lmc_decode_i64(q, 2, "cursor", &cursor) || lmc_decode_i64(q, 3, "max_events", &max))
        return;
    size_t ul, ol;
    const void *uid = lmc_frame(q, 1, &ul), *op = lmc_frame(q, 2, &ol);
    if (cursor < 0 || max < 1 || max > 1024 || ml > KVT_MODEL_MAX || ul > MAX_FRAME_ECHO ||
        ol > MAX_FRAME_ECHO) {
        lmc_reply_err(q,
                      "cursor must be >= 0, max_events in [1, 1024] and model_name at most "
                      "%d bytes",
                      KVT_MODEL_MAX);
        return;
    }
    /* one stream per worker instance: a new one replaces the old */
    for (struct lmc_sub **pp = &m->subs; *pp; pp = &(*pp)->next)
        if ((*pp)->instance_id == inst) {
            sub_end(m, pp);
            break;
        }
    if (m->nsubs >= MAX_SUBS) { /* the oldest (at the tail) goes */
        struct lmc_sub **pp = &m->subs;
        while ((*pp)->next)
            pp = &(*pp)->next;
        sub_end(m, pp);
    }
    struct lmc_sub *s = kvt_xcalloc(1, sizeof(*s));
    s->instance_id = inst;
    zmq_msg_init(&s->ident);
    zmq_msg_copy(&s->ident, &q->parts[0]);
    memcpy(s->uid, uid, ul);
    s->uid_len = ul;
    memcpy(s->op, op, ol);
    s->op_len = ol;
    memcpy(s->model, model, ml);
    s->cursor = (uint64_t)cursor;
    s->max_events = (uint32_t)max;
    s->credit = s->first = true;
    s->next = m->subs;
    m->subs = s;
    m->nsubs++;
    atomic_store_explicit(&m->nsubs_seen, m->nsubs, memory_order_relaxed);
    q->done = true; /* the batches are the replies */
    lmc_events_service(m);
}

void lmc_stream_control(struct kvt_lmc *m, zmq_msg_t *parts, uint32_t n)
{
    if (n < 4)
        return;
    size_t il = zmq_msg_size(&parts[0]), ul = zmq_msg_size(&parts[1]);
    for (struct lmc_sub **pp = &m->subs; *pp; pp = &(*pp)->next) {
        struct lmc_sub *s = *pp;
        if (zmq_msg_size(&s->ident) != il || s->uid_len != ul ||
            memcmp(zmq_msg_data(&s->ident), zmq_msg_data(&parts[0]), il) ||
            memcmp(s->uid, zmq_msg_data(&parts[1]), ul))
            continue;
        size_t al = zmq_msg_size(&parts[3]);
        const char *a = zmq_msg_data(&parts[3]);
        if (al == 3 && !memcmp(a, "ack", 3)) {
            s->credit = true;
            sub_service(m, s);
        } else if (al == 6 && !memcmp(a, "cancel", 6)) {
            sub_end(m, pp);
        }
        return;
    }
}

void lmc_events_drop_instance(struct kvt_lmc *m, int64_t inst)
{
    for (struct lmc_sub **pp = &m->subs; *pp; pp = &(*pp)->next)
        if ((*pp)->instance_id == inst) {
            sub_end(m, pp);
            return;
        }
}

void lmc_events_free(struct kvt_lmc *m)
{
    while (m->subs) {
        struct lmc_sub *s = m->subs;
        m->subs = s->next;
        sub_free(s);
    }
    m->nsubs = 0;
}
