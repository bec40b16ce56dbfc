/*
 * A front end: one protocol, translated into calls of the core
 * (core/core.h). Each lives in its own folder, src/front/<protocol>/, and
 * is described by one descriptor; the server lists the descriptors in one
 * table (src/server/fronts.c) and drives every front end through it:
 * listen with the other listeners (before storage opens), start once the
 * core runs, stop before the core's workers and controllers stop, free
 * after the prefetch controller stopped and before L1 goes, and status for
 * /status. docs/extending.md has the steps to add one.
 *
 * kvtier's own protocol (src/front/native) is served by the server's loop
 * (the ROUTER socket and the same-host socket are the server's): its front
 * end is the operation table that loop dispatches to (native.h).
 *
 * A front end includes common/, key/, io/, proto/, ops/, core/core.h, this
 * header and server/auth.h (a leaf: who may use which tenant); never l1/,
 * ctrl/, evict/ or the server's other headers (scripts/check-layers.py).
 */
#ifndef KVT_FRONT_H
#define KVT_FRONT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

struct kvt_core;
struct kvt_auth;
struct kvt_events;

/* What the server hands every front end. The server owns it and keeps it
 * until the front ends are freed; core is NULL until the core started
 * (listen runs before). */
struct kvt_front_env {
    struct kvt_core *core;
    int chunk_size;                 /* tokens per chunk, reported to clients */
    uint64_t max_object_bytes;      /* the largest object accepted */
    bool shm;                       /* the shared-memory data path is offered */
    double read_ttl_s, write_ttl_s; /* L1 lease TTLs */
    /* authentication: the first authorized-clients table (its counters),
     * NULL when off; the table in use (the rpc thread replaces it on
     * SIGHUP; a published table never changes but for atomic counters and
     * stays until exit); the file it came from */
    struct kvt_auth *auth;
    struct kvt_auth *_Atomic *auth_cur;
    const char *auth_clients_file;
    /* the tier-event queue (core/events.h) when the server publishes KV
     * events, else NULL; set before the front ends start */
    struct kvt_events *events;
};

/* The authorized-clients table in use (acquire: pairs with the rpc
 * thread's release when it publishes a reloaded one). */
static inline struct kvt_auth *kvt_front_auth(const struct kvt_front_env *env)
{
    return atomic_load_explicit(env->auth_cur, memory_order_acquire);
}

struct kvt_front_desc {
    const char *name; /* its object in /status */
    /* Bind its listener. cfg: its part of the server's configuration (the
     * table line says where). *out: its state, set as soon as it exists
     * (stop and free also clean up after a failed listen); NULL when its
     * flags leave it off. 0 or -errno / KVT_E_* with err. */
    int (*listen)(const struct kvt_front_env *env, const void *cfg, void **out, char *err,
                  size_t cap);
    int (*start)(void *fe, char *err, size_t cap); /* its threads; requests served from now */
    void (*stop)(void *fe);                        /* joins its threads */
    void (*free)(void *fe);
    json_t *(*status)(void *fe); /* its object in /status (the rpc thread) */
    void (*banner)(void *fe);    /* its start-up log line */
};

#endif
