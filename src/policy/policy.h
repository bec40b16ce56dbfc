/*
 * Eviction policies and watermark controllers.
 *
 * A policy orders objects of one tier by how much they are worth keeping.
 * It sees objects only as 32-bit handles (an index position of the tier), so
 * it adds a few bytes per object instead of a second key map: LRU keeps two
 * u32 links per handle.
 *
 * Policies are a vtable (like Valkey's dictType) behind a descriptor
 * (struct kvt_policy_desc, below): LRU, ARC, LFU (with aging), the
 * value-aware policy, adaptive and noop, each in its own file and one line
 * of the table in registry.c.
 *
 * Thread rules: a policy has no lock of its own. Every call is made with the
 * owning tier's lock held (l2->lock or the L1 lock).
 */
#ifndef KVT_POLICY_H
#define KVT_POLICY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

struct kvt_policy;

/* Extra facts a policy may use; each ignores what it does not need. */
struct kvt_policy_hint {
    uint32_t prefix_pos; /* position of the chunk in its request (0 = head) */
    uint32_t prefix_len; /* chunks in that request (the prefix length); 0 = unknown */
    uint32_t bytes;      /* storage cost */
    uint64_t fp;         /* the key's identity across handles (kvt_key_hash); 0 = none:
                            ARC remembers evicted keys by it */
};

struct kvt_policy_ops {
    const char *name;
    /* New object. cold: place it as the least valuable (recovery). */
    void (*insert)(struct kvt_policy *p, uint32_t h, bool cold, const struct kvt_policy_hint *hint);
    void (*access)(struct kvt_policy *p, uint32_t h);
    void (*remove)(struct kvt_policy *p, uint32_t h);
    /* Visit handles from least to most valuable until visit returns false. */
    void (*walk)(struct kvt_policy *p, bool (*visit)(uint32_t h, void *arg), void *arg);
    /* Grow per-handle state so that handles < n are valid. */
    void (*reserve)(struct kvt_policy *p, uint32_t n);
    void (*destroy)(struct kvt_policy *p);
    /* Optional (NULL: ignored): a lookup of one request's chunks, by key
     * fingerprint (kvt_key_hash), head first, hit or not, before the tier
     * touches its hits. "adaptive" and "value" feed their shadows from it. */
    void (*request)(struct kvt_policy *p, const uint64_t *fps, uint32_t n);
};

struct kvt_policy {
    const struct kvt_policy_ops *ops;
    double trigger_watermark; /* evict when usage fraction >= this */
    double eviction_ratio;    /* then free this fraction of what is used */
    uint32_t nhandles;        /* handles below this may be used */
};

/* Constructors of the built-in orders (the experts of adaptive.c use them). */
struct kvt_policy *kvt_lru_create(void);
struct kvt_policy *kvt_arc_create(void);
struct kvt_policy *kvt_lfu_create(void);
struct kvt_policy *kvt_adaptive_create(void);
/* For tests: the expert an adaptive policy follows ("adaptive": 0 LRU,
 * 1 ARC, 2 LFU, 3 the order by V; "value": 0 the order by V, 1 LRU, the
 * first) and each one's decayed shadow prefix hits (0 past the last
 * expert); -1 for other policies. */
#define KVT_ADAPTIVE_EXPERTS 4
int kvt_adaptive_state(const struct kvt_policy *p, double score[KVT_ADAPTIVE_EXPERTS]);
/* For status: the name of the order an "adaptive" or "value" policy
 * follows now ("LRU", "ARC", "LFU", or "value" for the order by V); NULL
 * for other policies. Called under the lock that guards the policy. */
const char *kvt_policy_following(const struct kvt_policy *p);

/* LFU's frequency cap: a use count stops growing here (lfu.c). */
#define KVT_LFU_FCAP 3
/* For tests: ARC's target size of T1 and |T1|, |T2|, |B1|, |B2|; LFU's
 * priority of h (0 when absent) and its inflation value. */
void kvt_arc_state(const struct kvt_policy *p, double *target, uint32_t n[4]);
uint64_t kvt_lfu_priority(const struct kvt_policy *p, uint32_t h, uint64_t *inflation);

/* The value-aware policy (value.c): parameters of
 * V = freshness x (1+reuses)^reuse_w x (1+prefix_len/len_scale)^len_w
 *     x (bytes/1MiB)^-cost_w, freshness = GreedyDual aging (half_life_s 0)
 *     or 2^(-age/half_life) */
struct kvt_value_params {
    double half_life_s;  /* 0: aging (default); > 0: a fixed decay (the seed: 86400) */
    double reuse_w;      /* 1 */
    double len_w;        /* 1 */
    double len_scale;    /* 32 chunks */
    double cost_w;       /* 1 */
    bool follow_recency; /* true: "value" as kvt_value_create says; false: the bare order */
};
void kvt_value_defaults(struct kvt_value_params *p);
/* "value": LRU, and the order by V (below) followed only while it has
 * earned it against plain recency (adaptive.c: a shadow of each, the same
 * mechanism as "adaptive"), so its factors are used where they help; with
 * follow_recency false, the bare order by V. NULL: defaults. */
struct kvt_policy *kvt_value_create(const struct kvt_value_params *p);
/* The bare order by V (value.c), for tests of the formula and the wrapper. */
struct kvt_policy *kvt_value_order_create(const struct kvt_value_params *p);
/* adaptive.c: the value orders inside a "value" policy (the real one first,
 * then its shadow): 2, or 0 for other policies. */
int kvt_value_orders(const struct kvt_policy *p, struct kvt_policy *out[2]);
/* Replace the clock (seconds; default: monotonic) - the offline replay runs
 * on trace time. Ignored for other policies. */
void kvt_value_set_clock(struct kvt_policy *p, double (*clock)(void *), void *arg);
/* The parameters of a value policy; false for other policies. */
bool kvt_value_get_params(const struct kvt_policy *p, struct kvt_value_params *out);
/* The current value V of a handle (NAN when absent), for tests and status. */
double kvt_value_of(struct kvt_policy *p, uint32_t h);

/* ---- The policy table (registry.c) ----
 * Each policy is one descriptor, defined in the policy's own file as
 * kvt_policy_<id> and listed once in registry.c. Every name a user may give
 * (--eviction-policy, an adapter's "eviction" object, cache.env), the lists
 * in --help and in error messages, and the policies kvtier replay compares
 * are read from the table, in its order. docs/extending.md has the steps. */
struct kvt_policy_cfg;

enum {
    /* keeps no order and never names a victim ("noop": the hard cap
     * alone); kvtier replay leaves it out of its comparison */
    KVT_POLICY_NO_ORDER = 1u << 0,
    /* offered by cache.env's KVP_EVICTION_POLICY too */
    KVT_POLICY_CACHE_ENV = 1u << 1,
};

struct kvt_policy_desc {
    const char *name; /* canonical spelling (status, --dry-run); accepted in any case */
    const char *help; /* one line for --help: what it keeps */
    unsigned flags;   /* KVT_POLICY_* */
    /* A new policy; cfg NULL: the defaults of its own fields. Never NULL.
     * The caller sets trigger_watermark and eviction_ratio. */
    struct kvt_policy *(*create)(const struct kvt_policy_cfg *cfg);
    /* Optional (NULL: none): its own fields of the "eviction" object
     * (NULL-terminated), their parser (fills cfg->opts; on error returns
     * KVT_E_CONFIG with a message naming the field in err), and what
     * kvt_policy_describe adds for them. */
    const char *const *fields;
    int (*parse)(const json_t *ev, struct kvt_policy_cfg *cfg, char *err, size_t errcap);
    void (*describe)(const struct kvt_policy *p, json_t *into);
};

/* The i-th policy of the table; NULL past the last. */
const struct kvt_policy_desc *kvt_policy_at(size_t i);
/* The policy of that name, in any case; NULL if none. */
const struct kvt_policy_desc *kvt_policy_find(const char *name);
/* Every name of the table, comma-separated, for messages and help. */
const char *kvt_policy_names(void);

/* Create a policy by name (kvt_policy_find) with its defaults; NULL if
 * unknown. */
struct kvt_policy *kvt_policy_create(const char *name, double watermark, double ratio);
void kvt_policy_destroy(struct kvt_policy *p);

/* A parsed "eviction" object: the config is read once (kvt_policy_parse,
 * when an adapter's spec is parsed) and each adapter builds its own policy
 * from it (kvt_policy_build: a policy has per-object state). */
struct kvt_policy_cfg {
    const struct kvt_policy_desc *desc;
    double watermark, ratio;
    union {                            /* the policy's own fields (desc->parse) */
        struct kvt_value_params value; /* "value" */
    } opts;
};
/* Parse an adapter's "eviction" object. On error returns KVT_E_CONFIG and
 * writes a message naming the field into err. */
int kvt_policy_parse(const json_t *ev, struct kvt_policy_cfg *cfg, char *err, size_t errcap);
struct kvt_policy *kvt_policy_build(const struct kvt_policy_cfg *cfg);
/* kvt_policy_parse and kvt_policy_build in one. */
int kvt_policy_from_json(const json_t *ev, struct kvt_policy **out, char *err, size_t errcap);

/* The resolved "eviction" object of a policy (every field, defaults
 * included), for --dry-run and status. Caller decrefs. */
json_t *kvt_policy_describe(const struct kvt_policy *p);

/* Grow per-handle arrays so that handles < n are valid. */
void kvt_policy_reserve(struct kvt_policy *p, uint32_t n);

static inline void kvt_policy_insert(struct kvt_policy *p, uint32_t h, bool cold,
                                     const struct kvt_policy_hint *hint)
{
    if (p)
        p->ops->insert(p, h, cold, hint);
}
static inline void kvt_policy_access(struct kvt_policy *p, uint32_t h)
{
    if (p)
        p->ops->access(p, h);
}
static inline void kvt_policy_remove(struct kvt_policy *p, uint32_t h)
{
    if (p)
        p->ops->remove(p, h);
}
static inline void kvt_policy_request(struct kvt_policy *p, const uint64_t *fps, uint32_t n)
{
    if (p && p->ops->request)
        p->ops->request(p, fps, n);
}

#endif
