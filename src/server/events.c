/*
 * The KV-events publisher (events.h; the wire format is docs/events.md).
 *
 * The "kv-events" thread waits on the tier-event queue's eventfd and the
 * replay socket (zmq_poll), turns each run of queued events of one kind
 * and tier into one vLLM event, sends a batch of them as
 *   [topic][sequence: 8 bytes big-endian][msgpack KVEventBatch]
 * on the PUB socket, and keeps the last --kv-events-buffer batches for the
 * replay socket. A PUB socket never blocks its sender: a subscriber that
 * cannot keep up loses messages at the high-water mark and sees a gap in
 * the sequence numbers. Events the queue had to drop are marked the same
 * way: the next batch skips one sequence number, which no replay can fill.
 */
#include "server/events.h"
#include "common/log.h"
#include "common/util.h"
#include "core/core.h"
#include "core/events.h"
#include "server/config.h"

#include <errno.h>
#include <msgpack.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#define POP_MAX 1024         /* tier events taken per batch */
#define COALESCE_NS 1000000L /* 1 ms: how long a wake waits for the rest of its burst */

struct replay_entry {
    uint64_t seq;
    char *buf;
    size_t len;
};

struct kvt_evpub {
    struct kvt_evpub_cfg cfg;
    struct kvt_events *q;
    void *zctx, *pub, *replay; /* the sockets: the thread's once it runs */
    pthread_t thread;
    bool started;
    _Atomic bool stop;
    int block_size;
    char media[1 + KVT_MAX_ADAPTERS][64];
    int nmedia;
    /* the replay buffer (the thread's): ring of cfg.buffer batches */
    struct replay_entry *ring;
    uint32_t rhead, rcount;
    /* the thread's */
    uint64_t seq, seen_dropped;
    struct kvt_event *evs;
    msgpack_sbuffer sb;
    /* stats: written by the thread, read by status (relaxed: statistics) */
    _Atomic uint64_t batches, stored, removed, cleared, gaps, replay_requests, replayed, next_seq;
    _Atomic uint64_t subscriptions; /* subscribe messages the XPUB socket passed up */
    _Atomic uint64_t held_ms;       /* how long the first batch waited for a subscriber */
    _Atomic uint32_t buffered;
};

/* ------------------------------------------------------------- set-up */

static bool endpoint_ok(const char *ep)
{
    return !strncmp(ep, "tcp://", 6) || !strncmp(ep, "ipc://", 6);
}

int kvt_evpub_cfg_check(const struct kvt_evpub_cfg *c, bool insecure_no_auth)
{
    static const char *const flags[2] = {"kv-events-endpoint", "kv-events-replay-endpoint"};
    const char *eps[2] = {c->endpoint, c->replay};
    if (!c->endpoint[0]) {
        if (c->replay[0]) {
            fprintf(stderr, "kvtier server: --kv-events-replay-endpoint: needs "
                            "--kv-events-endpoint (events are off without it)\n");
            return 2;
        }
        return 0;
    }
    for (int i = 0; i < 2; i++) {
        if (!eps[i][0])
            continue;
        if (!endpoint_ok(eps[i])) {
            fprintf(stderr,
                    "kvtier server: --%s: expected tcp://HOST:PORT or ipc://PATH, got '%s'\n",
                    flags[i], eps[i]);
            return 2;
        }
        if (!insecure_no_auth && !kvt_endpoint_is_local(eps[i])) {
            fprintf(stderr,
                    "kvtier server: --%s: %s is reachable beyond this host and KV events "
                    "have no authentication (they name every tenant's chunks): bind a "
                    "loopback address, or give --insecure-no-auth to accept that "
                    "(docs/security.md)\n",
                    flags[i], eps[i]);
            return 2;
        }
    }
    if (c->replay[0] && !strcmp(c->replay, c->endpoint)) {
        fprintf(stderr, "kvtier server: --kv-events-replay-endpoint: the same address as "
                        "--kv-events-endpoint\n");
        return 2;
    }
    return 0;
}

json_t *kvt_evpub_cfg_json(const struct kvt_evpub_cfg *c)
{
    json_t *o = json_object();
    json_object_set_new(o, "endpoint", c->endpoint[0] ? json_string(c->endpoint) : json_null());
    json_object_set_new(o, "replay_endpoint", c->replay[0] ? json_string(c->replay) : json_null());
    json_object_set_new(o, "topic", json_string(c->topic));
    json_object_set_new(o, "buffer", json_integer(c->buffer));
    json_object_set_new(o, "queue", json_integer(c->queue));
    json_object_set_new(o, "hwm", json_integer(c->hwm));
    json_object_set_new(o, "wait_subscriber_ms", json_integer(c->wait_sub_ms));
    return o;
}

static int bind_socket(void *zctx, int type, const char *ep, int hwm, void **out, char *err,
                       size_t cap, const char *flag)
{
    void *s = zmq_socket(zctx, type);
    if (!s) {
        snprintf(err, cap, "--%s: cannot make a socket: %s", flag, zmq_strerror(errno));
        return -errno;
    }
    int linger = 1000;
    zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof(hwm));
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof(linger));
    if (zmq_bind(s, ep) < 0) {
        int e = errno;
        snprintf(err, cap, "--%s: cannot listen on %s: %s", flag, ep, zmq_strerror(e));
        zmq_close(s);
        return -e;
    }
    *out = s;
    return 0;
}

int kvt_evpub_listen(const struct kvt_evpub_cfg *c, struct kvt_evpub **out, char *err, size_t cap)
{
    *out = NULL;
    if (!c->endpoint[0])
        return 0;
    struct kvt_evpub *p = kvt_xcalloc(1, sizeof(*p));
    p->cfg = *c;
    p->zctx = zmq_ctx_new();
    int rc = kvt_events_new((uint32_t)c->queue, &p->q);
    if (rc) {
        snprintf(err, cap, "--kv-events-queue: %s", strerror(-rc));
        goto fail;
    }
    rc = bind_socket(p->zctx, ZMQ_XPUB, c->endpoint, c->hwm, &p->pub, err, cap,
                     "kv-events-endpoint");
    if (!rc) { /* every subscription passed up, not only a topic's first */
        int verbose = 1;
        zmq_setsockopt(p->pub, ZMQ_XPUB_VERBOSE, &verbose, sizeof(verbose));
    }
    /* a whole buffer's replay (and its end marker) fits a peer's pipe: the
     * ROUTER drops what is over its high-water mark */
    if (!rc && c->replay[0])
        rc = bind_socket(p->zctx, ZMQ_ROUTER, c->replay, c->buffer + 1, &p->replay, err, cap,
                         "kv-events-replay-endpoint");
    if (rc)
        goto fail;
    p->ring = kvt_xcalloc((size_t)c->buffer, sizeof(*p->ring));
    p->evs = kvt_xmalloc(POP_MAX * sizeof(*p->evs));
    msgpack_sbuffer_init(&p->sb);
    *out = p;
    return 0;
fail:
    kvt_evpub_free(p);
    return rc;
}

struct kvt_events *kvt_evpub_queue(struct kvt_evpub *p)
{
    return p ? p->q : NULL;
}

void kvt_evpub_medium(struct kvt_core *core, int tier, char *out, size_t cap)
{
    if (tier == 0)
        snprintf(out, cap, "CPU");
    else
        snprintf(out, cap, "STORAGE:%s", kvt_core_l2_name(core, tier - 1));
}

/* ----------------------------------------------------------- encoding */

static void pack_str(msgpack_packer *pk, const char *s)
{
    size_t l = strlen(s);
    msgpack_pack_str(pk, l);
    msgpack_pack_str_body(pk, s, l);
}

static void pack_hash(msgpack_packer *pk, const uint8_t *h, uint8_t hash_len)
{
    if (hash_len) {
        msgpack_pack_bin(pk, hash_len);
        msgpack_pack_bin_body(pk, h, hash_len);
    } else { /* vLLM's integer block hashes */
        uint64_t v = 0;
        for (int i = 0; i < 8; i++)
            v = v << 8 | h[i];
        msgpack_pack_uint64(pk, v);
    }
}

/* The block hashes event e names: its tag's, else its key's hash. */
static uint32_t nhashes(const struct kvt_event *e)
{
    return e->tag ? e->tag->nblocks : 1;
}

static void pack_hashes_of(msgpack_packer *pk, const struct kvt_event *e)
{
    const struct kvt_blocktag *t = e->tag;
    if (!t) {
        msgpack_pack_bin(pk, e->key.hash_len);
        msgpack_pack_bin_body(pk, e->key.hash, e->key.hash_len);
        return;
    }
    for (uint32_t j = 0; j < t->nblocks; j++)
        pack_hash(pk, t->hashes + j * kvt_blocktag_hsize(t), t->hash_len);
}

/* One event of vLLM's tagged union: a map whose "type" names the class. A
 * BlockStored run is one chain (same_run): its parent is the first's. */
static void pack_event(struct kvt_evpub *p, msgpack_packer *pk, const struct kvt_event *run,
                       uint32_t n)
{
    bool stored = run[0].ev == KVT_TIER_STORED;
    const struct kvt_blocktag *t0 = run[0].tag;
    msgpack_pack_map(pk, stored ? 8 : 3);
    pack_str(pk, "type");
    pack_str(pk, stored ? "BlockStored" : "BlockRemoved");
    pack_str(pk, "block_hashes");
    uint32_t nh = 0;
    for (uint32_t i = 0; i < n; i++)
        nh += nhashes(&run[i]);
    msgpack_pack_array(pk, nh);
    for (uint32_t i = 0; i < n; i++)
        pack_hashes_of(pk, &run[i]);
    if (stored) {
        pack_str(pk, "parent_block_hash");
        if (t0 && t0->has_parent)
            pack_hash(pk, t0->parent, t0->hash_len);
        else
            msgpack_pack_nil(pk);
        pack_str(pk, "token_ids");
        uint32_t nt = 0;
        for (uint32_t i = 0; i < n; i++)
            nt += run[i].tag ? run[i].tag->ntokens : 0;
        msgpack_pack_array(pk, nt);
        for (uint32_t i = 0; i < n; i++)
            for (uint32_t j = 0; run[i].tag && j < run[i].tag->ntokens; j++)
                msgpack_pack_uint32(pk, run[i].tag->tokens[j]);
        pack_str(pk, "block_size");
        msgpack_pack_int(pk, t0 ? (int)t0->block_size : p->block_size);
        pack_str(pk, "lora_id");
        msgpack_pack_nil(pk);
    }
    pack_str(pk, "medium");
    pack_str(pk, p->media[run[0].tier < p->nmedia ? run[0].tier : 0]);
    if (stored) {
        pack_str(pk, "lora_name");
        msgpack_pack_nil(pk);
    }
}

/* Does b continue a's event? Removals of one tier always; stores of one
 * tier when neither has engine hashes, or when b's blocks follow a's (b's
 * parent is a's last block, same block size and kind of hash), so that a
 * BlockStored is one chain as vLLM's are. */
static bool same_run(const struct kvt_event *a, const struct kvt_event *b)
{
    if (a->ev != b->ev || a->tier != b->tier)
        return false;
    if (a->ev == KVT_TIER_REMOVED || (!a->tag && !b->tag))
        return true;
    const struct kvt_blocktag *x = a->tag, *y = b->tag;
    if (!x || !y || !y->has_parent || x->hash_len != y->hash_len ||
        x->block_size != y->block_size || (x->ntokens == 0) != (y->ntokens == 0))
        return false;
    size_t hs = kvt_blocktag_hsize(x);
    return memcmp(x->hashes + (x->nblocks - 1) * hs, y->parent, hs) == 0;
}

/* Encode [ts, [events], data_parallel_rank] into p->sb: n queued events
 * (grouped into runs), or AllBlocksCleared when n is 0. */
static void encode_batch(struct kvt_evpub *p, const struct kvt_event *ev, uint32_t n)
{
    msgpack_sbuffer_clear(&p->sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &p->sb, msgpack_sbuffer_write);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    msgpack_pack_array(&pk, 3);
    msgpack_pack_double(&pk, (double)ts.tv_sec + (double)ts.tv_nsec / 1e9);
    if (n == 0) {
        msgpack_pack_array(&pk, 1);
        msgpack_pack_map(&pk, 1);
        pack_str(&pk, "type");
        pack_str(&pk, "AllBlocksCleared");
        atomic_fetch_add_explicit(&p->cleared, 1, memory_order_relaxed);
    } else {
        uint32_t runs = 1;
        for (uint32_t i = 1; i < n; i++)
            runs += !same_run(&ev[i - 1], &ev[i]);
        msgpack_pack_array(&pk, runs);
        uint64_t st = 0, rm = 0;
        for (uint32_t i = 0; i < n;) {
            uint32_t j = i + 1;
            while (j < n && same_run(&ev[j - 1], &ev[j]))
                j++;
            pack_event(p, &pk, ev + i, j - i);
            for (uint32_t k = i; k < j; k++)
                *(ev[i].ev == KVT_TIER_STORED ? &st : &rm) += nhashes(&ev[k]);
            i = j;
        }
        atomic_fetch_add_explicit(&p->stored, st, memory_order_relaxed);
        atomic_fetch_add_explicit(&p->removed, rm, memory_order_relaxed);
    }
    msgpack_pack_int(&pk, 0); /* data_parallel_rank: one publisher per server */
}

/* -------------------------------------------------------- publishing */

static void seq_bytes(uint64_t seq, uint8_t out[8])
{
    for (int i = 0; i < 8; i++)
        out[i] = (uint8_t)(seq >> (56 - 8 * i));
}

static void keep_for_replay(struct kvt_evpub *p, uint64_t seq)
{
    uint32_t cap = (uint32_t)p->cfg.buffer;
    struct replay_entry *e;
    if (p->rcount == cap) { /* the oldest goes */
        e = &p->ring[p->rhead];
        free(e->buf);
        p->rhead = (p->rhead + 1) % cap;
        p->rcount--;
    }
    e = &p->ring[(p->rhead + p->rcount) % cap];
    e->seq = seq;
    e->len = p->sb.size;
    e->buf = kvt_xmalloc(e->len ? e->len : 1);
    memcpy(e->buf, p->sb.data, e->len);
    p->rcount++;
    atomic_store_explicit(&p->buffered, p->rcount, memory_order_relaxed);
}

/* Send the batch in p->sb under the next sequence number. Events dropped
 * since the last batch cost one sequence number first: the subscriber
 * sees the gap. */
static void send_batch(struct kvt_evpub *p)
{
    uint64_t d = kvt_events_dropped(p->q);
    if (d != p->seen_dropped) {
        p->seen_dropped = d;
        p->seq++;
        atomic_fetch_add_explicit(&p->gaps, 1, memory_order_relaxed);
    }
    uint8_t sb[8];
    seq_bytes(p->seq, sb);
    size_t tl = strlen(p->cfg.topic);
    /* PUB never blocks: at the high-water mark a subscriber loses messages */
    zmq_send(p->pub, p->cfg.topic, tl, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(p->pub, sb, 8, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(p->pub, p->sb.data, p->sb.size, ZMQ_DONTWAIT);
    keep_for_replay(p, p->seq);
    p->seq++;
    atomic_fetch_add_explicit(&p->batches, 1, memory_order_relaxed);
    atomic_store_explicit(&p->next_seq, p->seq, memory_order_relaxed);
}

static void publish_queued(struct kvt_evpub *p)
{
    uint32_t n;
    while ((n = kvt_events_pop(p->q, p->evs, POP_MAX)) > 0) {
        encode_batch(p, p->evs, n);
        send_batch(p);
        for (uint32_t i = 0; i < n; i++)
            kvt_blocktag_put(p->evs[i].tag);
    }
}

static void publish_cleared(struct kvt_evpub *p)
{
    encode_batch(p, NULL, 0);
    send_batch(p);
}

/* --------------------------------------------------------------- replay */

/* A request is [identity][""][start sequence: 8 bytes big-endian], as
 * vLLM's subscriber sends it: every buffered batch from that sequence on
 * goes back as [identity][""][topic][sequence][payload], then the end
 * marker [identity][""][""][-1 as 8 bytes][""]. Anything else is ignored. */
static void serve_replay(struct kvt_evpub *p)
{
    for (;;) {
        zmq_msg_t parts[4];
        int n = 0;
        bool more = true;
        while (more) {
            zmq_msg_t m;
            zmq_msg_init(&m);
            if (zmq_msg_recv(&m, p->replay, n ? 0 : ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(&m);
                for (int i = 0; i < n && i < 4; i++)
                    zmq_msg_close(&parts[i]);
                return;
            }
            more = zmq_msg_more(&m);
            if (n < 4)
                parts[n] = m;
            else
                zmq_msg_close(&m);
            n++;
        }
        if (n == 3 && zmq_msg_size(&parts[2]) == 8) {
            atomic_fetch_add_explicit(&p->replay_requests, 1, memory_order_relaxed);
            const uint8_t *b = zmq_msg_data(&parts[2]);
            uint64_t start = 0;
            for (int i = 0; i < 8; i++)
                start = start << 8 | b[i];
            const void *id = zmq_msg_data(&parts[0]);
            size_t idl = zmq_msg_size(&parts[0]);
            size_t tl = strlen(p->cfg.topic);
            uint32_t cap = (uint32_t)p->cfg.buffer;
            for (uint32_t k = 0; k < p->rcount; k++) {
                const struct replay_entry *e = &p->ring[(p->rhead + k) % cap];
                if (e->seq < start)
                    continue;
                uint8_t sb[8];
                seq_bytes(e->seq, sb);
                zmq_send(p->replay, id, idl, ZMQ_SNDMORE | ZMQ_DONTWAIT);
                zmq_send(p->replay, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT);
                zmq_send(p->replay, p->cfg.topic, tl, ZMQ_SNDMORE | ZMQ_DONTWAIT);
                zmq_send(p->replay, sb, 8, ZMQ_SNDMORE | ZMQ_DONTWAIT);
                zmq_send(p->replay, e->buf, e->len, ZMQ_DONTWAIT);
                atomic_fetch_add_explicit(&p->replayed, 1, memory_order_relaxed);
            }
            static const uint8_t end[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
            zmq_send(p->replay, id, idl, ZMQ_SNDMORE | ZMQ_DONTWAIT);
            zmq_send(p->replay, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT);
            zmq_send(p->replay, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT);
            zmq_send(p->replay, end, 8, ZMQ_SNDMORE | ZMQ_DONTWAIT);
            zmq_send(p->replay, "", 0, ZMQ_DONTWAIT);
        }
        for (int i = 0; i < n && i < 4; i++)
            zmq_msg_close(&parts[i]);
    }
}

/* ------------------------------------------------------------- thread */

/* Read what subscribers sent the XPUB socket (a subscription is the byte 1
 * then the topic prefix, an unsubscription 0); count the subscriptions. */
static void drain_subscriptions(struct kvt_evpub *p)
{
    uint8_t buf[8];
    int n;
    while ((n = zmq_recv(p->pub, buf, sizeof(buf), ZMQ_DONTWAIT)) >= 0)
        if (n > 0 && buf[0] == 1)
            atomic_fetch_add_explicit(&p->subscriptions, 1, memory_order_relaxed);
}

/* A subscriber of the previous instance (a router) reconnects by itself,
 * but what a PUB socket sends before a subscription reaches it is lost for
 * it: the start's AllBlocksCleared and what recovery announces would be.
 * So the first batch waits until a subscriber has subscribed, at most
 * wait_sub_ms, and no longer than the queue has room for. */
static void wait_for_subscriber(struct kvt_evpub *p)
{
    uint64_t t0 = kvt_now_ns(), limit = (uint64_t)p->cfg.wait_sub_ms * 1000000u;
    zmq_pollitem_t it = {.socket = p->pub, .events = ZMQ_POLLIN};
    while (!atomic_load_explicit(&p->stop, memory_order_acquire) &&
           atomic_load_explicit(&p->subscriptions, memory_order_relaxed) == 0) {
        uint64_t el = kvt_now_ns() - t0;
        struct kvt_events_stats qs;
        kvt_events_stats(p->q, &qs);
        if (el >= limit || qs.depth >= qs.cap / 2)
            break;
        uint64_t left_ms = (limit - el) / 1000000u + 1;
        if (zmq_poll(&it, 1, left_ms < 50 ? (long)left_ms : 50) < 0 && errno != EINTR)
            break;
        drain_subscriptions(p);
    }
    atomic_store_explicit(&p->held_ms, (kvt_now_ns() - t0) / 1000000u, memory_order_relaxed);
}

static void *pub_main(void *arg)
{
    struct kvt_evpub *p = arg;
    pthread_setname_np(pthread_self(), "kv-events");
    wait_for_subscriber(p);
    /* whatever an earlier instance announced is void: what the tiers hold
     * now follows (the adapters' scans announce what they found) */
    publish_cleared(p);
    zmq_pollitem_t items[3] = {
        {.socket = NULL, .fd = kvt_events_fd(p->q), .events = ZMQ_POLLIN},
        {.socket = p->pub, .events = ZMQ_POLLIN},
        {.socket = p->replay, .events = ZMQ_POLLIN},
    };
    int nitems = p->replay ? 3 : 2;
    while (!atomic_load_explicit(&p->stop, memory_order_acquire)) {
        if (zmq_poll(items, nitems, 1000) < 0 && errno != EINTR)
            break;
        if (items[1].revents & ZMQ_POLLIN)
            drain_subscriptions(p);
        if (items[0].revents & ZMQ_POLLIN) {
            kvt_events_drain_fd(p->q);
            /* let the burst that woke us gather (a store announces its
             * chunks one by one): fewer wakes and batches, and the queue
             * stays non-empty, so the tiers write the eventfd less */
            nanosleep(&(struct timespec){0, COALESCE_NS}, NULL);
        }
        publish_queued(p);
        if (p->replay)
            serve_replay(p);
    }
    publish_queued(p);
    /* the server stops serving: nothing it announced stands */
    publish_cleared(p);
    return NULL;
}

int kvt_evpub_start(struct kvt_evpub *p, struct kvt_core *core, int block_size, char *err,
                    size_t cap)
{
    p->block_size = block_size;
    p->nmedia = 1 + kvt_core_nl2(core);
    for (int t = 0; t < p->nmedia; t++)
        kvt_evpub_medium(core, t, p->media[t], sizeof(p->media[t]));
    int rc = pthread_create(&p->thread, NULL, pub_main, p);
    if (rc) {
        snprintf(err, cap, "cannot start the kv-events thread: %s", strerror(rc));
        return -rc;
    }
    p->started = true;
    return 0;
}

void kvt_evpub_stop(struct kvt_evpub *p)
{
    if (!p || !p->started)
        return;
    /* release: the thread publishes what was queued before it sees stop */
    atomic_store_explicit(&p->stop, true, memory_order_release);
    kvt_events_wake(p->q);
    pthread_join(p->thread, NULL);
    p->started = false;
}

void kvt_evpub_free(struct kvt_evpub *p)
{
    if (!p)
        return;
    kvt_evpub_stop(p);
    if (p->pub)
        zmq_close(p->pub); /* lingers up to 1 s for the last messages */
    if (p->replay)
        zmq_close(p->replay);
    if (p->zctx)
        zmq_ctx_term(p->zctx);
    if (p->ring)
        for (uint32_t k = 0; k < p->rcount; k++)
            free(p->ring[(p->rhead + k) % (uint32_t)p->cfg.buffer].buf);
    free(p->ring);
    free(p->evs);
    msgpack_sbuffer_destroy(&p->sb);
    kvt_events_free(p->q);
    free(p);
}

/* ------------------------------------------------------------- status */

void kvt_evpub_stats(struct kvt_evpub *p, struct kvt_evpub_stats *o)
{
    struct kvt_events_stats qs;
    kvt_events_stats(p->q, &qs);
    o->batches = atomic_load_explicit(&p->batches, memory_order_relaxed);
    o->stored = atomic_load_explicit(&p->stored, memory_order_relaxed);
    o->removed = atomic_load_explicit(&p->removed, memory_order_relaxed);
    o->cleared = atomic_load_explicit(&p->cleared, memory_order_relaxed);
    o->gaps = atomic_load_explicit(&p->gaps, memory_order_relaxed);
    o->replay_requests = atomic_load_explicit(&p->replay_requests, memory_order_relaxed);
    o->replayed = atomic_load_explicit(&p->replayed, memory_order_relaxed);
    o->next_seq = atomic_load_explicit(&p->next_seq, memory_order_relaxed);
    o->buffered = atomic_load_explicit(&p->buffered, memory_order_relaxed);
    o->buffer_cap = (uint32_t)p->cfg.buffer;
    o->dropped = qs.dropped;
    o->queue_depth = qs.depth;
    o->queue_cap = qs.cap;
}

json_t *kvt_evpub_status(struct kvt_evpub *p)
{
    json_t *o = json_object();
    json_object_set_new(o, "enabled", json_boolean(p != NULL));
    if (!p)
        return o;
    struct kvt_evpub_stats s;
    kvt_evpub_stats(p, &s);
    json_object_set_new(o, "endpoint", json_string(p->cfg.endpoint));
    json_object_set_new(o, "replay_endpoint",
                        p->cfg.replay[0] ? json_string(p->cfg.replay) : json_null());
    json_object_set_new(o, "topic", json_string(p->cfg.topic));
    json_t *media = json_array();
    for (int t = 0; t < p->nmedia; t++)
        json_array_append_new(media, json_string(p->media[t]));
    json_object_set_new(o, "media", media);
    json_object_set_new(o, "batches", json_integer((json_int_t)s.batches));
    json_object_set_new(o, "next_seq", json_integer((json_int_t)s.next_seq));
    json_object_set_new(o, "blocks_stored", json_integer((json_int_t)s.stored));
    json_object_set_new(o, "blocks_removed", json_integer((json_int_t)s.removed));
    json_object_set_new(o, "all_cleared", json_integer((json_int_t)s.cleared));
    json_object_set_new(o, "dropped", json_integer((json_int_t)s.dropped));
    json_object_set_new(o, "gaps", json_integer((json_int_t)s.gaps));
    struct kvt_events_stats qs;
    kvt_events_stats(p->q, &qs);
    json_object_set_new(o, "tagged", json_integer(qs.tagged));
    json_object_set_new(o, "orphans", json_integer(qs.orphans));
    json_object_set_new(o, "queue_depth", json_integer(s.queue_depth));
    json_object_set_new(o, "queue_capacity", json_integer(s.queue_cap));
    json_object_set_new(o, "buffered", json_integer(s.buffered));
    json_object_set_new(o, "buffer_capacity", json_integer(s.buffer_cap));
    json_object_set_new(o, "replay_requests", json_integer((json_int_t)s.replay_requests));
    json_object_set_new(o, "replayed", json_integer((json_int_t)s.replayed));
    json_object_set_new(
        o, "subscriptions",
        json_integer((json_int_t)atomic_load_explicit(&p->subscriptions, memory_order_relaxed)));
    json_object_set_new(
        o, "first_batch_held_ms",
        json_integer((json_int_t)atomic_load_explicit(&p->held_ms, memory_order_relaxed)));
    return o;
}
