/*
 * Description: the value eviction policy: the walk visits objects from the
 * least to the most valuable (checked against the value formula after
 * thousands of random inserts, accesses and removals); reuse, prefix length
 * and storage cost move objects the right way; freshness halves every 24 h
 * so a fresh object overtakes a reused stale one; the head of a request
 * outranks its tail; cold (recovered) inserts go below everything in order;
 * with every weight 0 it orders exactly like LRU; the config block accepts
 * its keys and refuses them for other policies; the "value" policy follows
 * plain recency where the factors would lose hits to it, victim for victim
 * the same as LRU; where the factors win (long histories that come back
 * beyond LRU's window), both "value" and "adaptive" follow the order by V.
 */
#include "test.h"

#include "policy/policy.h"
#include "kvtier/error.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static double fake_now;

static double fake_clock(void *arg)
{
    (void)arg;
    return fake_now;
}

struct order {
    uint32_t h[4096];
    uint32_t n, max;
};

static bool collect(uint32_t h, void *arg)
{
    struct order *o = arg;
    o->h[o->n++] = h;
    return o->n < o->max;
}

static void walk_all(struct kvt_policy *p, struct order *o, uint32_t max)
{
    o->n = 0;
    o->max = max;
    p->ops->walk(p, collect, o);
}

static struct kvt_policy *make(double half_life_h, double rw, double lw, double cw)
{
    struct kvt_value_params prm;
    kvt_value_defaults(&prm);
    prm.half_life_s = half_life_h * 3600;
    prm.reuse_w = rw;
    prm.len_w = lw;
    prm.cost_w = cw;
    struct kvt_policy *p = kvt_value_order_create(&prm);
    fake_now = 1000;
    kvt_value_set_clock(p, fake_clock, NULL);
    return p;
}

static void ins(struct kvt_policy *p, uint32_t h, uint32_t pos, uint32_t len, uint32_t bytes)
{
    struct kvt_policy_hint hint = {.prefix_pos = pos, .prefix_len = len, .bytes = bytes};
    p->ops->insert(p, h, false, &hint);
}

/* The test's own record of one object's touches, for model_value. */
struct touched {
    double t_last; /* time of the last store or read */
    uint32_t reuses, pos, len, bytes;
};

/* The documented formula (docs/operations.md, value.c's top comment), from
 * the test's record alone: V = 2^(-age / half_life) x (1 + reuses)^a
 * x (1 + len / 32)^b x (bytes / 1 MiB)^-c, times the head-first tie-break
 * e^(-1e-9 x position) (bytes are powers of two here, so the policy's
 * log2 cost class is exact). */
static double model_value(const struct touched *r, double now, double half_life_s, double a,
                          double b, double c)
{
    return pow(2.0, -(now - r->t_last) / half_life_s) * pow(1.0 + r->reuses, a) *
           pow(1.0 + r->len / 32.0, b) * pow(r->bytes / (double)(1 << 20), -c) *
           exp(-1e-9 * r->pos);
}

static void test_walk_is_sorted(void)
{
    struct kvt_policy *p = make(24, 1, 1, 1);
    srand(7);
    bool in[3000] = {0};
    static struct touched rec[3000];
    for (int step = 0; step < 20000; step++) {
        fake_now += (double)(rand() % 600);
        uint32_t h = (uint32_t)(rand() % 3000);
        int op = rand() % 10;
        if (!in[h]) {
            uint32_t pos = (uint32_t)(rand() % 100), len = (uint32_t)(1 + rand() % 200);
            uint32_t bytes = (uint32_t)(4096u << (rand() % 10));
            ins(p, h, pos, len, bytes);
            rec[h] = (struct touched){fake_now, 0, pos, len, bytes};
            in[h] = true;
        } else if (op < 6) {
            p->ops->access(p, h);
            rec[h].t_last = fake_now;
            rec[h].reuses++;
        } else {
            p->ops->remove(p, h);
            in[h] = false;
        }
    }
    uint32_t live = 0, modelled = 0;
    for (int i = 0; i < 3000; i++) {
        live += in[i];
        if (!in[i]) {
            TEST_ASSERT(isnan(kvt_value_of(p, (uint32_t)i)));
            continue;
        }
        /* the policy's value against the formula, computed independently */
        double want = model_value(&rec[i], fake_now, 24 * 3600.0, 1, 1, 1);
        double got = kvt_value_of(p, (uint32_t)i);
        TEST_ASSERT(fabs(got - want) <= 1e-9 * want);
        modelled++;
    }
    TEST_ASSERT(modelled == live && live > 100);
    static struct order o;
    walk_all(p, &o, 4096);
    TEST_ASSERT(o.n == live);
    for (uint32_t i = 1; i < o.n; i++) {
        double a = kvt_value_of(p, o.h[i - 1]), b = kvt_value_of(p, o.h[i]);
        TEST_ASSERT(a <= b * (1 + 1e-9));
    }
    /* a partial walk is the prefix of the full one */
    static struct order part;
    walk_all(p, &part, 50);
    TEST_ASSERT(part.n == 50 && memcmp(part.h, o.h, 50 * sizeof(uint32_t)) == 0);
    kvt_policy_destroy(p);
}

static uint32_t least(struct kvt_policy *p)
{
    struct order o;
    walk_all(p, &o, 1);
    return o.n ? o.h[0] : UINT32_MAX;
}

static void test_factors(void)
{
    struct kvt_policy *p = make(24, 1, 1, 1);
    /* reuse */
    ins(p, 1, 0, 10, 1 << 20);
    ins(p, 2, 0, 10, 1 << 20);
    p->ops->access(p, 1);
    TEST_ASSERT(least(p) == 2);
    p->ops->remove(p, 2);
    /* prefix length: a chunk of a long history is worth more */
    ins(p, 3, 0, 400, 1 << 20);
    ins(p, 4, 0, 4, 1 << 20);
    p->ops->access(p, 1);
    p->ops->access(p, 1); /* keep 1 out of the way */
    TEST_ASSERT(least(p) == 4);
    p->ops->remove(p, 4);
    /* storage cost: a 16 MiB object is worth less than a 1 MiB one */
    ins(p, 5, 0, 400, 16 << 20);
    TEST_ASSERT(least(p) == 5);
    kvt_policy_destroy(p);

    /* freshness: value halves every 24 h, so a reused-once object (x2)
     * falls behind a fresh one after a bit more than a day */
    p = make(24, 1, 0, 0);
    ins(p, 1, 0, 0, 0);
    p->ops->access(p, 1); /* reuse 1: V = 2 now */
    fake_now += 20 * 3600;
    ins(p, 2, 0, 0, 0);
    TEST_ASSERT(least(p) == 2); /* 20 h: 2 * 2^(-20/24) = 1.12 > 1 */
    double v1 = kvt_value_of(p, 1);
    TEST_ASSERT(fabs(v1 - 2 * pow(2, -20.0 / 24)) < 1e-6);
    fake_now += 5 * 3600;
    p->ops->remove(p, 2);
    ins(p, 2, 0, 0, 0);
    TEST_ASSERT(least(p) == 1); /* 25 h: 0.97 < 1 */
    kvt_policy_destroy(p);
}

static void test_head_before_tail_and_cold(void)
{
    struct kvt_policy *p = make(24, 1, 1, 1);
    /* one request of 8 chunks stored at once (the base inserts tail first) */
    for (uint32_t i = 8; i-- > 0;)
        ins(p, 10 + i, i, 8, 1 << 20);
    struct order o;
    walk_all(p, &o, 100);
    TEST_ASSERT(o.n == 8);
    for (uint32_t i = 0; i < 8; i++)
        TEST_ASSERT(o.h[i] == 17 - i); /* tail (position 7) goes first */
    /* recovered objects: below everything, newest first in, so the last
     * inserted (the oldest file) is the least valuable */
    struct kvt_policy_hint hint = {0};
    p->ops->insert(p, 100, true, &hint);
    p->ops->insert(p, 101, true, &hint);
    p->ops->insert(p, 102, true, &hint);
    walk_all(p, &o, 3);
    TEST_ASSERT(o.h[0] == 102 && o.h[1] == 101 && o.h[2] == 100);
    /* a read makes a recovered object fresh */
    fake_now += 1;
    p->ops->access(p, 102);
    walk_all(p, &o, 100);
    TEST_ASSERT(o.h[o.n - 1] == 102);
    kvt_policy_destroy(p);
}

static void test_zero_weights_is_lru(void)
{
    struct kvt_policy *v = make(24, 0, 0, 0), *l = kvt_policy_create("LRU", 0.9, 0.1);
    srand(11);
    bool in[500] = {0};
    for (int step = 0; step < 5000; step++) {
        fake_now += 1; /* distinct times: recency decides */
        uint32_t h = (uint32_t)(rand() % 500);
        if (!in[h]) {
            ins(v, h, 0, 0, 0);
            struct kvt_policy_hint hint = {0};
            l->ops->insert(l, h, false, &hint);
            in[h] = true;
        } else if (rand() % 4) {
            v->ops->access(v, h);
            l->ops->access(l, h);
        } else {
            v->ops->remove(v, h);
            l->ops->remove(l, h);
            in[h] = false;
        }
    }
    static struct order a, b;
    walk_all(v, &a, 4096);
    walk_all(l, &b, 4096);
    TEST_ASSERT(a.n == b.n && memcmp(a.h, b.h, a.n * sizeof(uint32_t)) == 0);
    kvt_policy_destroy(v);
    kvt_policy_destroy(l);
}

static void test_config(void)
{
    char err[256];
    struct kvt_policy *p = NULL;
    json_t *ev = json_loads("{\"eviction_policy\": \"value\", \"trigger_watermark\": 0.9, "
                            "\"eviction_ratio\": \"0.1\", \"half_life_hours\": \"6\", "
                            "\"reuse_weight\": 0}",
                            0, NULL);
    TEST_ASSERT(kvt_policy_from_json(ev, &p, err, sizeof(err)) == 0);
    struct kvt_value_params prm;
    TEST_ASSERT(kvt_value_get_params(p, &prm) && prm.half_life_s == 6 * 3600 && prm.reuse_w == 0);
    TEST_ASSERT(p->trigger_watermark == 0.9 && fabs(p->eviction_ratio - 0.1) < 1e-12);
    json_t *d = kvt_policy_describe(p);
    TEST_ASSERT(json_real_value(json_object_get(d, "half_life_hours")) == 6);
    TEST_ASSERT(json_is_true(json_object_get(d, "follow_recency")));
    json_decref(d);
    double score[KVT_ADAPTIVE_EXPERTS];
    TEST_ASSERT(kvt_adaptive_state(p, score) == 1); /* follows LRU until V has earned it */
    kvt_policy_destroy(p);
    json_decref(ev);
    /* follow_recency false: the bare order by V */
    ev = json_loads("{\"eviction_policy\": \"value\", \"follow_recency\": false}", 0, NULL);
    TEST_ASSERT(kvt_policy_from_json(ev, &p, err, sizeof(err)) == 0);
    TEST_ASSERT(kvt_adaptive_state(p, score) == -1 && kvt_value_get_params(p, &prm) &&
                !prm.follow_recency);
    kvt_policy_destroy(p);
    json_decref(ev);
    const char *bad[][2] = {
        {"{\"eviction_policy\": \"LRU\", \"half_life_hours\": 2}", "value\" only"},
        {"{\"eviction_policy\": \"value\", \"half_life_hours\": 0}", "hours > 0"},
        {"{\"eviction_policy\": \"value\", \"cost_weight\": -1}", "[0, 100]"},
        {"{\"eviction_policy\": \"value\", \"reuse_weight\": \"x\"}", "[0, 100]"},
        {"{\"eviction_policy\": \"value\", \"decay\": 1}", "unknown field"},
        {"{\"eviction_policy\": \"value\", \"follow_recency\": \"yes\"}", "true or false"},
        {"{\"eviction_policy\": \"LRU\", \"follow_recency\": true}", "value\" only"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ev = json_loads(bad[i][0], 0, NULL);
        p = NULL;
        TEST_ASSERT(kvt_policy_from_json(ev, &p, err, sizeof(err)) == KVT_E_CONFIG);
        if (!strstr(err, bad[i][1]))
            fprintf(stderr, "%s -> %s\n", bad[i][0], err);
        TEST_ASSERT(strstr(err, bad[i][1]) != NULL && p == NULL);
        json_decref(ev);
    }
}

/* Victims of hot_hits, in order, while record_victims is set. */
static bool record_victims;
static uint32_t victims[8000 * 2], victims_val[8000 * 2], victims_n;

/* Store chunk h (position pos of a request of len chunks) into a simulated
 * cache of cap objects under p: evict the policy's first victims until
 * there is room, then insert it with the tier's hint. */
static void store(struct kvt_policy *p, bool *in, uint32_t *n, uint32_t cap, uint32_t h,
                  uint32_t pos, uint32_t len)
{
    while (*n >= cap) {
        struct order o;
        walk_all(p, &o, 1);
        if (record_victims && victims_n < sizeof(victims) / sizeof(victims[0]))
            victims[victims_n++] = o.h[0];
        p->ops->remove(p, o.h[0]);
        in[o.h[0]] = false;
        --*n;
    }
    struct kvt_policy_hint hint = {.prefix_pos = pos,
                                   .prefix_len = len,
                                   .bytes = 16384,
                                   .fp = 0x9e3779b97f4a7c15ull * (h + 1)};
    p->ops->insert(p, h, false, &hint);
    in[h] = true;
    ++*n;
}

/* One simulated cache of cap objects under p: hot keys 0..29 come back
 * every ~90 inserts (short requests, prefix length 1); between them,
 * requests of 2 one-time chunks of a long history (prefix length 200).
 * Returns the hot hits of the last half of the steps. */
static uint32_t hot_hits(struct kvt_policy *p, uint32_t cap)
{
    static bool in[20000];
    memset(in, 0, sizeof(in));
    uint32_t n = 0, next = 1000, hits = 0, hot = 0;
    srand(5);
    for (int step = 0; step < 8000; step++) {
        uint32_t hs[2], len, k;
        if (rand() % 2) {
            hs[0] = hot++ % 30, k = 1, len = 1;
        } else {
            hs[0] = next++, hs[1] = next++, k = 2, len = 200;
        }
        for (uint32_t i = 0; i < k; i++) {
            uint32_t h = hs[i];
            if (in[h]) {
                hits += step >= 4000 && h < 30;
                p->ops->access(p, h);
                continue;
            }
            store(p, in, &n, cap, h, i, len);
        }
    }
    return hits;
}

static void test_value_follows_recency_where_factors_lose(void)
{
    struct kvt_policy *lru = kvt_policy_create("LRU", 1, 0), *bare = kvt_value_order_create(NULL),
                      *val = kvt_policy_create("value", 1, 0);
    uint32_t l = hot_hits(lru, 100), b = hot_hits(bare, 100);
    victims_n = 0;
    record_victims = true;
    uint32_t v = hot_hits(val, 100);
    record_victims = false;
    /* LRU again, recording: value never followed V, so its victims are LRU's, one by one */
    struct kvt_policy *lru2 = kvt_policy_create("LRU", 1, 0);
    uint32_t nv = victims_n;
    memcpy(victims_val, victims, nv * sizeof(uint32_t));
    victims_n = 0;
    record_victims = true;
    TEST_ASSERT(hot_hits(lru2, 100) == l);
    record_victims = false;
    TEST_ASSERT(victims_n == nv && memcmp(victims, victims_val, nv * sizeof(uint32_t)) == 0);
    kvt_policy_destroy(lru2);
    double score[KVT_ADAPTIVE_EXPERTS];
    int lead = kvt_adaptive_state(val, score);
    fprintf(stderr, "   hot hits: LRU %u, order by V %u, value %u (leader %d, %.1f / %.1f)\n", l, b,
            v, lead, score[0], score[1]);
    TEST_ASSERT(b < l * 9 / 10); /* the factors keep the long one-time chunks */
    TEST_ASSERT(v == l);         /* the policy followed recency all along */
    TEST_ASSERT(lead == 1 && score[1] > score[0]);
    kvt_policy_destroy(lru);
    kvt_policy_destroy(bare);
    kvt_policy_destroy(val);
}

/* Chunks of long histories (prefix length 200) come back once, 200 steps
 * after they were stored (stored again when missed), between one-time
 * short prompts (prefix length 1), in a tier of cap (300) objects: beyond
 * LRU's window (some 330 stores), with no reuse to tell ARC or LFU anything
 * at their first use; only V's length factor keeps them. Returns the
 * returning chunks' hits in the last half of the steps (of 3000). */
static uint32_t long_hits(struct kvt_policy *p, uint32_t cap)
{
    static bool in[40000];
    memset(in, 0, sizeof(in));
    uint32_t n = 0, hits = 0;
    for (uint32_t step = 0; step < 9000; step++) {
        uint32_t keys[5], len[5], pos[5], k = 0;
        keys[k] = 20000 + step, len[k] = 1, pos[k++] = 0; /* a one-time short prompt */
        if (step % 3 == 0)                                /* a long history's two new chunks */
            for (uint32_t i = 0; i < 2; i++)
                keys[k] = 2 * step + 1 - i, len[k] = 200, pos[k++] = 1 - i; /* tail first */
        if (step >= 200 && (step - 200) % 3 == 0) /* the history stored 200 steps ago returns */
            for (uint32_t i = 0; i < 2; i++) {
                uint32_t h = 2 * (step - 200) + 1 - i;
                if (in[h]) {
                    hits += step >= 4500;
                    p->ops->access(p, h);
                } else {
                    keys[k] = h, len[k] = 200, pos[k++] = 1 - i; /* recomputed, stored again */
                }
            }
        for (uint32_t i = 0; i < k; i++)
            store(p, in, &n, cap, keys[i], pos[i], len[i]);
    }
    return hits;
}

static void test_adaptive_follows_value_where_factors_win(void)
{
    const uint32_t CAP = 300;
    const char *names[] = {"LRU", "ARC", "LFU"};
    uint32_t best = 0;
    for (int i = 0; i < 3; i++) {
        struct kvt_policy *p = kvt_policy_create(names[i], 1, 0);
        uint32_t h = long_hits(p, CAP);
        fprintf(stderr, "   %s %u\n", names[i], h);
        best = h > best ? h : best;
        kvt_policy_destroy(p);
    }
    struct kvt_policy *bare = kvt_value_order_create(NULL),
                      *ad = kvt_policy_create("adaptive", 1, 0),
                      *val = kvt_policy_create("value", 1, 0);
    uint32_t b = long_hits(bare, CAP), a = long_hits(ad, CAP), v = long_hits(val, CAP);
    double score[KVT_ADAPTIVE_EXPERTS];
    int lead = kvt_adaptive_state(ad, score);
    fprintf(stderr, "   order by V %u, value %u, adaptive %u (leader %d: %.1f %.1f %.1f %.1f)\n", b,
            v, a, lead, score[0], score[1], score[2], score[3]);
    TEST_ASSERT(b > 2 * best + 500); /* of 3000 returning chunks in the last half */
    TEST_ASSERT(lead == 3 && score[3] > score[0] && score[3] > score[1] && score[3] > score[2]);
    TEST_ASSERT(a >= b * 9 / 10 && v >= b * 9 / 10);
    TEST_ASSERT(kvt_adaptive_state(val, score) == 0); /* "value" follows V here too */
    kvt_policy_destroy(bare);
    kvt_policy_destroy(ad);
    kvt_policy_destroy(val);
}

int main(void)
{
    RUN(test_walk_is_sorted);
    RUN(test_factors);
    RUN(test_head_before_tail_and_cold);
    RUN(test_zero_weights_is_lru);
    RUN(test_config);
    RUN(test_value_follows_recency_where_factors_lose);
    RUN(test_adaptive_follows_value_where_factors_win);
    return TEST_RESULT();
}
