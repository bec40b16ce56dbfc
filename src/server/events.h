/*
 * The KV-events publisher: what the tiers announce (core/events.h), sent in
 * vLLM's KV-events wire format (docs/events.md) on a ZeroMQ PUB socket,
 * with a ROUTER socket that replays recent batches to a subscriber that
 * missed some.
 *
 * Off unless --kv-events-endpoint is given. The server binds the sockets
 * with its other listeners (kvt_evpub_listen, before storage opens, so that
 * the queue exists when the adapters' start-up scans announce what they
 * found), starts the thread once the core runs (kvt_evpub_start), and
 * stops it after the core's threads stopped (kvt_evpub_stop).
 *
 * Opaque types: struct kvt_evpub. Non-opaque: struct kvt_evpub_cfg,
 * struct kvt_evpub_stats.
 *
 * Threads: one, "kv-events", owns both sockets and the replay buffer;
 * status and stats read atomics from any thread.
 */
#ifndef KVT_SERVER_EVENTS_H
#define KVT_SERVER_EVENTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

struct kvt_core;
struct kvt_events;
struct kvt_evpub;

struct kvt_evpub_cfg {
    char endpoint[300]; /* --kv-events-endpoint: PUB bind address; "" = off */
    char replay[300];   /* --kv-events-replay-endpoint: ROUTER bind address; "" = none */
    char topic[256];    /* --kv-events-topic: the first frame of every message */
    int buffer;         /* --kv-events-buffer: batches kept for replay */
    int queue;          /* --kv-events-queue: tier events waiting for the thread */
    int hwm;            /* --kv-events-hwm: the PUB socket's send high-water mark */
    int wait_sub_ms;    /* --kv-events-wait-subscriber-ms: hold the first batch until a
                         * subscriber subscribed, at most this long */
};

struct kvt_evpub_stats {
    uint64_t batches;         /* messages published (sequence numbers used) */
    uint64_t stored, removed; /* block hashes published in BlockStored / BlockRemoved */
    uint64_t cleared;         /* AllBlocksCleared events */
    uint64_t dropped;         /* tier events lost: the queue was full */
    uint64_t gaps;            /* sequence numbers skipped to mark dropped events */
    uint64_t replay_requests, replayed;
    uint64_t next_seq;
    uint32_t queue_depth, queue_cap, buffered, buffer_cap;
};

/* The checks that involve several of its flags, and the address rule of
 * docs/security.md (nothing beyond loopback without --insecure-no-auth):
 * 0, or 2 with a message naming the flag printed. */
int kvt_evpub_cfg_check(const struct kvt_evpub_cfg *c, bool insecure_no_auth);
/* Its part of --dry-run's resolved configuration. */
json_t *kvt_evpub_cfg_json(const struct kvt_evpub_cfg *c);

/* Bind the sockets and make the queue; *out = NULL when the flags leave
 * events off. 0, or -errno with err filled. */
int kvt_evpub_listen(const struct kvt_evpub_cfg *c, struct kvt_evpub **out, char *err, size_t cap);
/* The queue the core's tiers push into (kvt_core_opts.events). */
struct kvt_events *kvt_evpub_queue(struct kvt_evpub *p);
/* Start the thread: media names from the core's tiers, block_size the
 * chunk size in tokens. 0 or -errno. */
int kvt_evpub_start(struct kvt_evpub *p, struct kvt_core *core, int block_size, char *err,
                    size_t cap);
/* Publish what is queued, then AllBlocksCleared (the tiers' contents are
 * not served any more), join the thread. */
void kvt_evpub_stop(struct kvt_evpub *p);
void kvt_evpub_free(struct kvt_evpub *p);
void kvt_evpub_stats(struct kvt_evpub *p, struct kvt_evpub_stats *out);
json_t *kvt_evpub_status(struct kvt_evpub *p);
/* The medium name of tier t (0: L1, 1 + i: adapter i) into out. */
void kvt_evpub_medium(struct kvt_core *core, int tier, char *out, size_t cap);

#endif
