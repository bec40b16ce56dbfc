/*
 * The value-aware eviction policy ("eviction_policy": "value").
 *
 * The seed's retention ranking, made a real policy: an object is worth
 *
 *   V = freshness x reuse x prefix length x cost
 *
 * Freshness has two forms. Default (half_life 0): GreedyDual aging, no
 * clock: the key is H = L + (1 + min(reuses, 2))^a x (1 + len / L)^b
 * x (bytes / 1 MiB)^-c, fixed at the last touch, and L becomes the key of
 * each object evicted, so what was not touched falls behind at the pace of
 * the cache's own turnover (a fixed 24 h decay lost 12 points to LRU on a
 * cache that turns over in minutes; docs/operations.md). With a half-life:
 *
 *   V = 2^(-age / half_life) x (1 + reuses)^a x (1 + len / L)^b x (bytes / 1 MiB)^-c
 *
 * (age = time since the last store or read; reuses = reads
 * and repeated stores after the first; len = chunks in the request that
 * stored it: long histories are protected; bytes = storage cost). The least
 * valuable object is evicted first. Within one request (same age, reuses
 * and length) the head of the prefix outranks its tail by a tie-break on
 * the position far below any other term: a chunk is useless without the
 * chunks before it, so the tail must go first (as with LRU's reverse
 * insertion); a position weight of its own was measured to hurt.
 *
 * Why a heap with static keys works (aging: H changes only at a touch; the
 * decay:) log V = (t_last - now) / tau + w, where
 * w (reuse, position, cost) changes only when the object is touched. The
 * term now / tau is the same for every object, so the order by
 * k = t_last / tau + w never changes as time passes (the same trick as
 * GreedyDual's inflation value): each object keeps one key, recomputed on
 * access, in a binary min-heap. insert/access/remove are O(log n); the walk
 * enumerates the k least valuable objects in order in O(k log k) with a
 * frontier heap over heap positions, without popping anything.
 *
 * Per handle: heap position (4 bytes), reuse count (2), prefix position (2),
 * prefix length (2), cost class (1), plus the heap entry (double key +
 * handle: 16): 27 bytes (LRU: 8).
 *
 * Recovered objects (cold insert) get a key below the current minimum, in
 * insertion order, like LRU's cold end: the scan inserts newest first, so
 * the oldest file is evicted first; a read makes an object fresh again.
 *
 * Thread rules: none of its own; called under the tier's lock (policy.h).
 */
#include "common/util.h"
#include "kvtier/error.h"
#include "policy/policy.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NIL UINT32_MAX

struct hent {
    double key;
    uint32_t h;
};

struct value {
    struct kvt_policy base;
    struct kvt_value_params prm;
    double inv_tau;   /* ln 2 / half_life: key units per second */
    uint32_t *pos;    /* heap position of each handle, NIL when absent */
    uint16_t *reuse;  /* saturating */
    uint16_t *prefix; /* position in the request */
    uint16_t *plen;   /* prefix length (chunks in the request), 0 = unknown */
    uint8_t *costc;   /* log2(bytes) + 1, 0 = unknown */
    struct hent *heap;
    uint32_t n;
    double (*clock)(void *);
    void *clock_arg;
    double epoch;
    double L; /* aging: the key of the last object evicted (GreedyDual's inflation) */
};

static double mono_clock(void *arg)
{
    (void)arg;
    return kvt_now_s();
}

static double now_s(struct value *v)
{
    return v->clock(v->clock_arg) - v->epoch;
}

/* log of reuse x prefix length x cost for a handle (see the top comment);
 * aging caps the reuse count as LFU does. */
static double log_factors(const struct value *v, uint32_t h)
{
    const struct kvt_value_params *p = &v->prm;
    double r = v->inv_tau > 0 ? v->reuse[h] : KVT_MIN(v->reuse[h], KVT_LFU_FCAP - 1);
    double w = p->reuse_w * log1p(r);
    w += p->len_w * log1p((double)v->plen[h] / p->len_scale);
    if (v->costc[h])
        w -= p->cost_w * ((double)v->costc[h] - 21.0) * M_LN2; /* relative to 1 MiB */
    return w;
}

/* The heap key of a handle touched now. Decay: now / tau + log V's static
 * part. Aging: L + the factors' product. Either way the head of a request
 * outranks its tail by a tie-break far below any real difference. */
static double key_now(struct value *v, uint32_t h)
{
    if (v->inv_tau > 0)
        return now_s(v) * v->inv_tau + log_factors(v, h) - 1e-9 * (double)v->prefix[h];
    return v->L + exp(log_factors(v, h)) * (1.0 - 1e-7 * (double)v->prefix[h]);
}

static void place(struct value *v, uint32_t i, struct hent e)
{
    v->heap[i] = e;
    v->pos[e.h] = i;
}

static void sift_up(struct value *v, uint32_t i)
{
    struct hent e = v->heap[i];
    while (i) {
        uint32_t p = (i - 1) / 2;
        if (v->heap[p].key <= e.key)
            break;
        place(v, i, v->heap[p]);
        i = p;
    }
    place(v, i, e);
}

static void sift_down(struct value *v, uint32_t i)
{
    struct hent e = v->heap[i];
    for (;;) {
        uint32_t l = 2 * i + 1, m = i;
        double mk = e.key;
        if (l < v->n && v->heap[l].key < mk)
            m = l, mk = v->heap[l].key;
        if (l + 1 < v->n && v->heap[l + 1].key < mk)
            m = l + 1;
        if (m == i)
            break;
        place(v, i, v->heap[m]);
        i = m;
    }
    place(v, i, e);
}

static void heap_remove(struct value *v, uint32_t h)
{
    uint32_t i = v->pos[h];
    v->pos[h] = NIL;
    if (--v->n == i)
        return;
    struct hent last = v->heap[v->n];
    double old = v->heap[i].key;
    place(v, i, last);
    if (last.key < old)
        sift_up(v, i);
    else
        sift_down(v, i);
}

static bool present(const struct value *v, uint32_t h)
{
    return h < v->base.nhandles && v->pos[h] != NIL;
}

static void value_reserve(struct kvt_policy *p, uint32_t n)
{
    struct value *v = (struct value *)p;
    if (n <= p->nhandles)
        return;
    uint32_t o = p->nhandles, ncap = o ? o : 1024;
    while (ncap < n)
        ncap *= 2;
    v->pos = kvt_xrealloc(v->pos, (size_t)ncap * sizeof(uint32_t));
    v->reuse = kvt_xrealloc(v->reuse, (size_t)ncap * sizeof(uint16_t));
    v->prefix = kvt_xrealloc(v->prefix, (size_t)ncap * sizeof(uint16_t));
    v->plen = kvt_xrealloc(v->plen, (size_t)ncap * sizeof(uint16_t));
    v->costc = kvt_xrealloc(v->costc, (size_t)ncap);
    memset(v->pos + o, 0xff, (size_t)(ncap - o) * sizeof(uint32_t));
    v->heap = kvt_xrealloc(v->heap, (size_t)ncap * sizeof(struct hent));
    p->nhandles = ncap;
}

static uint8_t cost_class(uint32_t bytes)
{
    if (!bytes)
        return 0;
    return (uint8_t)(32 - __builtin_clz(bytes)); /* floor(log2) + 1 */
}

static void value_insert(struct kvt_policy *p, uint32_t h, bool cold,
                         const struct kvt_policy_hint *hint)
{
    struct value *v = (struct value *)p;
    kvt_policy_reserve(p, h + 1);
    if (present(v, h))
        heap_remove(v, h);
    v->reuse[h] = 0;
    v->prefix[h] = (uint16_t)KVT_MIN(hint ? hint->prefix_pos : 0, UINT16_MAX);
    v->plen[h] = (uint16_t)KVT_MIN(hint ? hint->prefix_len : 0, UINT16_MAX);
    v->costc[h] = cost_class(hint ? hint->bytes : 0);
    double k;
    if (cold) /* below everything present, each recovered object below the last */
        k = (v->n ? v->heap[0].key : v->inv_tau > 0 ? now_s(v) * v->inv_tau : v->L) - 1e-3;
    else
        k = key_now(v, h);
    v->heap[v->n] = (struct hent){k, h};
    v->pos[h] = v->n++;
    sift_up(v, v->n - 1);
}

static void value_access(struct kvt_policy *p, uint32_t h)
{
    struct value *v = (struct value *)p;
    if (!present(v, h))
        return;
    if (v->reuse[h] < UINT16_MAX)
        v->reuse[h]++;
    uint32_t i = v->pos[h];
    double k = key_now(v, h);
    double old = v->heap[i].key;
    v->heap[i].key = k;
    if (k < old)
        sift_up(v, i);
    else
        sift_down(v, i);
}

static void value_remove(struct kvt_policy *p, uint32_t h)
{
    struct value *v = (struct value *)p;
    if (!present(v, h))
        return;
    if (v->pos[h] == 0 && v->inv_tau == 0)
        v->L = v->heap[0].key; /* the least valuable went: everyone ages */
    heap_remove(v, h);
}

/* Least valuable first: a frontier heap of heap positions, ordered by key,
 * starts at the root; each visited position adds its two children. Nothing
 * in the policy changes during the walk. */
static void value_walk(struct kvt_policy *p, bool (*visit)(uint32_t, void *), void *arg)
{
    struct value *v = (struct value *)p;
    if (!v->n)
        return;
    uint32_t fcap = 64, fn = 0;
    uint32_t *f = kvt_xmalloc(fcap * sizeof(uint32_t));
    f[fn++] = 0;
    while (fn) {
        uint32_t top = f[0];
        /* pop the frontier's minimum */
        uint32_t last = f[--fn], i = 0;
        for (;;) {
            uint32_t l = 2 * i + 1, m = l;
            if (l >= fn)
                break;
            if (l + 1 < fn && v->heap[f[l + 1]].key < v->heap[f[l]].key)
                m = l + 1;
            if (v->heap[last].key <= v->heap[f[m]].key)
                break;
            f[i] = f[m];
            i = m;
        }
        if (fn)
            f[i] = last;
        if (!visit(v->heap[top].h, arg))
            break;
        for (uint32_t c = 2 * top + 1; c <= 2 * top + 2 && c < v->n; c++) {
            if (fn == fcap) {
                fcap *= 2;
                f = kvt_xrealloc(f, fcap * sizeof(uint32_t));
            }
            uint32_t j = fn++;
            while (j && v->heap[f[(j - 1) / 2]].key > v->heap[c].key) {
                f[j] = f[(j - 1) / 2];
                j = (j - 1) / 2;
            }
            f[j] = c;
        }
    }
    free(f);
}

static void value_destroy(struct kvt_policy *p)
{
    struct value *v = (struct value *)p;
    free(v->pos);
    free(v->reuse);
    free(v->prefix);
    free(v->plen);
    free(v->costc);
    free(v->heap);
    free(v);
}

static const struct kvt_policy_ops value_ops = {
    .name = "value",
    .insert = value_insert,
    .access = value_access,
    .remove = value_remove,
    .walk = value_walk,
    .reserve = value_reserve,
    .destroy = value_destroy,
};

void kvt_value_defaults(struct kvt_value_params *p)
{
    p->half_life_s = 0; /* aging */
    p->reuse_w = 1.0;
    p->len_w = 1.0;
    p->len_scale = 32.0;
    p->cost_w = 1.0;
    p->follow_recency = true;
}

struct kvt_policy *kvt_value_order_create(const struct kvt_value_params *prm)
{
    struct value *v = kvt_xcalloc(1, sizeof(*v));
    v->base.ops = &value_ops;
    if (prm)
        v->prm = *prm;
    else
        kvt_value_defaults(&v->prm);
    if (!(v->prm.half_life_s > 0))
        v->prm.half_life_s = 0;
    if (!(v->prm.len_scale > 0))
        v->prm.len_scale = 1.0;
    v->inv_tau = v->prm.half_life_s > 0 ? M_LN2 / v->prm.half_life_s : 0;
    v->clock = mono_clock;
    v->epoch = mono_clock(NULL);
    return &v->base;
}

/* The bare order behind p: itself, or the real one of a "value" policy. */
static struct value *order_of(const struct kvt_policy *p)
{
    if (p->ops == &value_ops)
        return (struct value *)p;
    struct kvt_policy *o[2];
    return kvt_value_orders(p, o) ? (struct value *)o[0] : NULL;
}

static void set_clock(struct value *v, double (*clock)(void *), void *arg)
{
    v->clock = clock ? clock : mono_clock;
    v->clock_arg = arg;
    v->epoch = v->clock(arg);
}

void kvt_value_set_clock(struct kvt_policy *p, double (*clock)(void *), void *arg)
{
    if (p->ops == &value_ops) {
        set_clock((struct value *)p, clock, arg);
        return;
    }
    struct kvt_policy *o[2];
    int n = kvt_value_orders(p, o); /* the real order and its shadow */
    for (int i = 0; i < n; i++)
        set_clock((struct value *)o[i], clock, arg);
}

bool kvt_value_get_params(const struct kvt_policy *p, struct kvt_value_params *out)
{
    struct value *v = order_of(p);
    if (!v)
        return false;
    *out = v->prm;
    return true;
}

double kvt_value_of(struct kvt_policy *p, uint32_t h)
{
    struct value *v = order_of(p);
    if (!v || !present(v, h))
        return NAN;
    double k = v->heap[v->pos[h]].key;
    if (v->inv_tau == 0) /* aging: the priority above today's inflation */
        return k - v->L;
    /* log V = key - now / tau */
    return exp(k - now_s(v) * v->inv_tau);
}

/* ---- "eviction_policy": "value": its descriptor and its own fields ---- */

/* A finite number >= 0, given as a JSON number or a numeric string. */
static int nonneg(const json_t *v, double *out)
{
    double d;
    if (json_is_number(v)) {
        d = json_number_value(v);
    } else if (json_is_string(v)) {
        char *end;
        d = strtod(json_string_value(v), &end);
        if (*end || end == json_string_value(v))
            return -1;
    } else {
        return -1;
    }
    if (!(d >= 0 && d < 1e12))
        return -1;
    *out = d;
    return 0;
}

static const char *const value_fields[] = {"half_life_hours", "reuse_weight",   "length_weight",
                                           "cost_weight",     "follow_recency", NULL};
enum { NUMERIC_VALUE_FIELDS = 4 }; /* the first ones; then the boolean */

/* The value policy's optional fields; weights may be 0 (that factor off). */
static int value_parse(const json_t *ev, struct kvt_policy_cfg *cfg, char *err, size_t errcap)
{
    struct kvt_value_params *prm = &cfg->opts.value;
    kvt_value_defaults(prm);
    double *dst[] = {&prm->half_life_s, &prm->reuse_w, &prm->len_w, &prm->cost_w};
    const json_t *fr = json_object_get(ev, "follow_recency");
    if (fr && !json_is_boolean(fr)) {
        snprintf(err, errcap, "\"eviction.follow_recency\" must be true or false");
        return KVT_E_CONFIG;
    }
    if (fr)
        prm->follow_recency = json_is_true(fr);
    for (int i = 0; i < NUMERIC_VALUE_FIELDS; i++) {
        const json_t *v = json_object_get(ev, value_fields[i]);
        double d = 0;
        if (!v)
            continue;
        if (nonneg(v, &d) || (i == 0 && d == 0) || (i > 0 && d > 100)) {
            snprintf(err, errcap, "\"eviction.%s\" must be %s", value_fields[i],
                     i == 0 ? "a number of hours > 0" : "a number in [0, 100]");
            return KVT_E_CONFIG;
        }
        *dst[i] = i == 0 ? d * 3600.0 : d;
    }
    return 0;
}

static void value_describe(const struct kvt_policy *p, json_t *into)
{
    struct kvt_value_params prm;
    if (!kvt_value_get_params(p, &prm))
        return;
    /* no half-life: freshness by aging (above), no clock */
    json_object_set_new(into, "half_life_hours",
                        prm.half_life_s > 0 ? json_real(prm.half_life_s / 3600.0) : json_null());
    json_object_set_new(into, "reuse_weight", json_real(prm.reuse_w));
    json_object_set_new(into, "length_weight", json_real(prm.len_w));
    json_object_set_new(into, "cost_weight", json_real(prm.cost_w));
    json_object_set_new(into, "follow_recency", json_boolean(prm.follow_recency));
}

static struct kvt_policy *value_from_cfg(const struct kvt_policy_cfg *cfg)
{
    return kvt_value_create(cfg ? &cfg->opts.value : NULL);
}

const struct kvt_policy_desc kvt_policy_value = {
    .name = "value",
    .help = "freshness, reuse, prefix length, size",
    .flags = KVT_POLICY_CACHE_ENV,
    .create = value_from_cfg,
    .fields = value_fields,
    .parse = value_parse,
    .describe = value_describe,
};
