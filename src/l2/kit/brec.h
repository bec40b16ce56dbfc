/*
 * The shared budget record's arithmetic (l2/budget.h has the rules), as
 * pure functions over an in-memory record: the file record
 * (l2/kit/budget_file.c) reads it under a lock, applies one step and writes
 * it back; the Redis record runs the same steps as Lua scripts
 * (l2/resp/resp_budget.c). tests/unit/test_budget.c checks them.
 *
 * On disk: a header ("KVTBUDG1", version, fields, an xxh3 of the
 * whole record; 128 bytes) and KVT_BREC_NODES 64-byte node entries,
 * little-endian: 4096 bytes.
 */
#ifndef KVT_L2_KIT_BREC_H
#define KVT_L2_KIT_BREC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "l2/budget.h"

/* 128 + 62 x 64 = 4096: one page, written with one pwrite */
#define KVT_BREC_NODES 62
#define KVT_BREC_HOST 24
#define KVT_BREC_BYTES (128 + KVT_BREC_NODES * 64)

struct kvt_brec_node {
    uint64_t id;      /* 0: a free entry */
    int64_t part;     /* net bytes: charged - refunded - removed */
    uint64_t pending; /* charged bytes whose writes may still land (upper bound) */
    uint64_t seen_ms; /* wall clock of its last step */
    uint32_t pid;
    char host[KVT_BREC_HOST]; /* NUL-terminated */
    uint32_t step;            /* the record's backend may tag its last step here (the
                               * bucket record: s3_budget.c); 0 otherwise */
};

struct kvt_brec {
    int64_t total; /* the tier's bytes, an upper bound */
    uint64_t adds; /* every byte ever charged */
    uint64_t epoch, recounts;
    uint64_t cap;        /* the cap of the server that created the record */
    uint64_t created_ms; /* wall clock */
    /* the last recount: when, what the walk found, the total before and after */
    uint64_t recount_ms, recount_walked;
    int64_t recount_before, recount_after;
    struct kvt_brec_node node[KVT_BREC_NODES];
};

/* A fresh record. Its epoch starts at now_ms (at least 1), above any
 * record's before it (one epoch per recount, far fewer than the ms between
 * two records), so a removal read in a lost record's epoch is never
 * subtracted from a rebuilt one. */
void kvt_brec_init(struct kvt_brec *r, uint64_t cap, uint64_t now_ms);
/* The entry of server id, or -1. */
int kvt_brec_find(const struct kvt_brec *r, uint64_t id);
/* A free entry, or -1 when all KVT_BREC_NODES are taken. */
int kvt_brec_free_slot(const struct kvt_brec *r);
/* Take entry slot for server id (free before): part 0, pending 0. */
void kvt_brec_join(struct kvt_brec *r, int slot, uint64_t id, uint32_t pid, const char *host,
                   uint64_t now_ms);
/* Fold a dead server's entry away: the total keeps its bytes (they may be
 * real objects), its pending is forgotten (it writes nothing any more). */
void kvt_brec_fold(struct kvt_brec *r, int slot);
/* A server's entry was just joined while it may hold charged bytes (its
 * old entry was folded while it lived, or the record was rebuilt): a
 * recount since may have left out its pending, so back bytes go (again)
 * into the total, adds and its part, and its pending starts at back. An
 * over-count when nothing was lost, which the next recount removes. */
void kvt_brec_rejoin(struct kvt_brec *r, int slot, uint64_t back);
/* One step of server slot; rejoined: the entry was just joined:
 * kvt_brec_rejoin with what it may hold (rq->inflight, which excludes this
 * step's refund and settled, less the take, plus those two, which the step
 * then subtracts as usual). Fills out (nodes and folded are the caller's). */
void kvt_brec_apply(struct kvt_brec *r, int slot, const struct kvt_budget_req *rq, bool rejoined,
                    uint64_t now_ms, struct kvt_budget_view *out);
/* A recount's snapshot: adds, and the pending of the entries alive[i]. */
void kvt_brec_begin(const struct kvt_brec *r, const bool *alive, struct kvt_budget_snap *s);
/* Complete a recount: total = walked + adds since s + s's pending; all of
 * the record's adds when it is not s's record (rebuilt since: created_ms
 * differs, or adds went back). */
void kvt_brec_end(struct kvt_brec *r, const struct kvt_budget_snap *s, uint64_t walked,
                  uint64_t now_ms);
/* One step of a record backend (budget.h's apply, begin and end). */
enum kvt_brec_kind { KVT_BREC_APPLY, KVT_BREC_BEGIN, KVT_BREC_END };
struct kvt_brec_op {
    enum kvt_brec_kind kind;
    const struct kvt_budget_req *rq; /* APPLY */
    uint64_t inflight;               /* BEGIN, END: what a rejoin adds back */
    struct kvt_budget_snap *snap;    /* BEGIN fills it, END reads it */
    uint64_t walked;                 /* END */
};
/* Folds the entries of dead servers (a backend's way of telling: locks,
 * leases) and returns how many. */
typedef uint32_t (*kvt_brec_census_fn)(void *ctx, struct kvt_brec *r, uint64_t now_ms);
/* The step op of server slot on a record the backend read and joined
 * (rejoined: just now): the periodic step (an APPLY of nothing) and the
 * recounts run census first; a recount's BEGIN and END renew slot's
 * seen_ms. Fills out when not NULL (nodes and folded are the caller's;
 * rejoined is or-ed in). Returns the entries census folded. */
uint32_t kvt_brec_step(struct kvt_brec *r, int slot, const struct kvt_brec_op *op, bool rejoined,
                       uint64_t now_ms, kvt_brec_census_fn census, void *ctx,
                       struct kvt_budget_view *out);
/* The view of entry slot (nodes, folded and the step's flags left 0). */
void kvt_brec_view(const struct kvt_brec *r, int slot, struct kvt_budget_view *out);

/* Encode into buf (KVT_BREC_BYTES). */
void kvt_brec_encode(const struct kvt_brec *r, uint8_t *buf);
/* Decode buf (n bytes): 0, -ENODATA for an empty record (n == 0), or
 * -EBADMSG (wrong magic, version, size or checksum: torn or foreign). */
int kvt_brec_decode(const uint8_t *buf, size_t n, struct kvt_brec *r);

#endif
