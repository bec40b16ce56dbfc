/*
 * Description: ARC and LFU with aging: the walk visits least valuable first;
 * ARC keeps a scan out of T2 and adapts its target p through the ghosts; LFU's
 * priority is L + min(uses, cap), the cap holds, evicting raises L so that
 * old favourites age out, and a recovered (cold) object goes first; on ties
 * all evict a request's deeper chunk before its head; the adaptive policy
 * follows ARC where a hot set outlives LRU's window and does as well as LRU
 * where blocks come back soon; names parse for L1
 * and in an adapter's "eviction" block, an unknown one is refused.
 */
#include "test.h"

#include "policy/policy.h"
#include "kvtier/error.h"

#include <string.h>

static bool first(uint32_t h, void *arg)
{
    *(uint32_t *)arg = h;
    return false;
}

static uint32_t victim(struct kvt_policy *p)
{
    uint32_t v = UINT32_MAX;
    p->ops->walk(p, first, &v);
    return v;
}

/* Evict the first victim as a tier would. */
static uint32_t evict(struct kvt_policy *p)
{
    uint32_t v = victim(p);
    if (v != UINT32_MAX)
        p->ops->remove(p, v);
    return v;
}

static void ins(struct kvt_policy *p, uint32_t h, uint32_t pos)
{
    struct kvt_policy_hint hint = {.prefix_pos = pos, .bytes = 16384, .fp = 1000 + h};
    p->ops->insert(p, h, false, &hint);
}

/* A request of n chunks h0..h0+n-1, inserted tail first as the tiers do. */
static void ins_request(struct kvt_policy *p, uint32_t h0, uint32_t n)
{
    for (uint32_t i = n; i-- > 0;)
        ins(p, h0 + i, i);
}

static void test_prefix_order_on_ties(void)
{
    const char *names[] = {"LRU", "ARC", "LFU", "adaptive"};
    for (int k = 0; k < 4; k++) {
        fprintf(stderr, "   %s\n", names[k]);
        struct kvt_policy *p = kvt_policy_create(names[k], 1, 0);
        ins_request(p, 0, 5);
        ins_request(p, 10, 5);
        /* the first request goes first, its deepest chunk first */
        for (uint32_t i = 5; i-- > 0;)
            TEST_ASSERT(evict(p) == i);
        for (uint32_t i = 5; i-- > 0;)
            TEST_ASSERT(evict(p) == 10 + i);
        TEST_ASSERT(victim(p) == UINT32_MAX);
        kvt_policy_destroy(p);
    }
    /* the value policy: within a request (its aging has no recency order
     * between requests stored between two evictions) */
    struct kvt_policy *p = kvt_policy_create("value", 1, 0);
    ins_request(p, 0, 5);
    for (uint32_t i = 5; i-- > 0;)
        TEST_ASSERT(evict(p) == i);
    kvt_policy_destroy(p);
}

static void test_lfu_aging(void)
{
    struct kvt_policy *p = kvt_policy_create("LFU", 1, 0);
    uint64_t L;
    for (uint32_t h = 0; h < 4; h++)
        ins(p, h, 0);
    TEST_ASSERT(kvt_lfu_priority(p, 0, &L) == 1 && L == 0);
    for (int i = 0; i < 10; i++) /* capped */
        p->ops->access(p, 0);
    TEST_ASSERT(kvt_lfu_priority(p, 0, &L) == KVT_LFU_FCAP);
    p->ops->access(p, 1);
    TEST_ASSERT(kvt_lfu_priority(p, 1, &L) == 2);
    /* least frequent, least recent first: 2, 3, then 1, then 0 */
    TEST_ASSERT(evict(p) == 2);
    TEST_ASSERT(kvt_lfu_priority(p, 3, &L) == 1 && L == 1);
    TEST_ASSERT(evict(p) == 3);
    /* aging: a new object enters at L + 1; after enough evictions the old
     * favourite 0 is the least valuable although nothing touched it */
    uint32_t h = 100;
    bool gone = false;
    for (int round = 0; round < 3 * KVT_LFU_FCAP && !gone; round++) {
        ins(p, h, 0);
        p->ops->access(p, h); /* used twice: priority L + 2 */
        h++;
        uint32_t v = evict(p);
        gone = v == 0;
    }
    TEST_ASSERT(gone);
    /* a recovered object goes before everything */
    struct kvt_policy_hint hint = {.bytes = 16384};
    p->ops->insert(p, 7, true, &hint);
    TEST_ASSERT(victim(p) == 7);
    kvt_policy_destroy(p);
}

static void test_arc_scan_and_adaptation(void)
{
    struct kvt_policy *p = kvt_policy_create("ARC", 1, 0);
    const uint32_t C = 8;
    /* a working set used twice lives in T2 */
    for (uint32_t h = 0; h < 4; h++) {
        ins(p, h, 0);
        p->ops->access(p, h);
    }
    /* a one-time scan fills T1 up to the capacity of 8 */
    for (uint32_t h = 10; h < 14; h++)
        ins(p, h, 0);
    double target;
    uint32_t n[4];
    kvt_arc_state(p, &target, n);
    TEST_ASSERT(n[0] == 4 && n[1] == 4 && target == 0);
    /* a longer scan at capacity C: each new object evicts from T1 (p = 0),
     * the working set stays */
    for (uint32_t h = 20; h < 40; h++) {
        uint32_t v = evict(p);
        TEST_ASSERT(v >= 10); /* never the working set */
        ins(p, h, 0);
    }
    kvt_arc_state(p, &target, n);
    TEST_ASSERT(n[1] == 4 && n[0] + n[1] == C && n[2] > 0); /* scan ghosts in B1 */
    /* a scanned object comes back: its ghost in B1 grows T1's target
     * (B1 keeps |T1| + |B1| <= C: the last ghosts are 32..35, then 36) */
    uint32_t back = 35;
    struct kvt_policy_hint hint = {.bytes = 16384, .fp = 1000 + back};
    TEST_ASSERT(evict(p) != UINT32_MAX);
    p->ops->insert(p, 200, false, &hint); /* a new handle, the same key */
    kvt_arc_state(p, &target, n);
    TEST_ASSERT(target >= 1);
    TEST_ASSERT(n[1] == 5); /* a ghost hit enters T2 */
    kvt_policy_destroy(p);
}

/* A tier of C objects in front of the policy: a use of key k (handle k) is
 * a hit (access) or a miss (evict the first victim when full, insert). */
static bool use(struct kvt_policy *p, uint8_t *in, uint32_t *n, uint32_t C, uint32_t k)
{
    if (in[k]) {
        p->ops->access(p, k);
        return true;
    }
    if (*n >= C) {
        uint32_t v = evict(p);
        TEST_ASSERT(v != UINT32_MAX);
        in[v] = 0;
        --*n;
    }
    ins(p, k, 0);
    in[k] = 1;
    ++*n;
    return false;
}

static void test_adaptive_follows_the_better_expert(void)
{
    /* a hot set of 4, each used twice in a row and again after 15 other
     * uses (3 one-time blocks after each hot pair), in a tier of 8: LRU's
     * window is too short for the first use of a pair, ARC keeps the hot set
     * in T2; the adaptive policy follows ARC and hits every first use too */
    struct kvt_policy *p = kvt_policy_create("adaptive", 1, 0);
    static uint8_t in[200000];
    uint32_t n = 0, scan = 1000, hits = 0;
    for (int round = 0; round < 5000; round++) {
        for (uint32_t k = 0; k < 4; k++) {
            bool hit = use(p, in, &n, 8, k);
            use(p, in, &n, 8, k);
            if (round >= 4000)
                hits += hit;
            for (int j = 0; j < 3; j++)
                use(p, in, &n, 8, scan++);
        }
    }
    double score[3];
    int lead = kvt_adaptive_state(p, score);
    fprintf(stderr, "   leader %d, shadow hits LRU %.1f ARC %.1f LFU %.1f, hot hits %u of 4000\n",
            lead, score[0], score[1], score[2], hits);
    TEST_ASSERT(lead != 0 && score[lead] > score[0]); /* not LRU: ARC or LFU keep the hot set */
    TEST_ASSERT(hits > 3600);                         /* of 4000 in the last 1000 rounds */
    kvt_policy_destroy(p);
    /* a stream of requests whose blocks come back soon: recency; the
     * adaptive policy does as well as LRU */
    struct kvt_policy *l = kvt_policy_create("LRU", 1, 0);
    p = kvt_policy_create("adaptive", 1, 0);
    static uint8_t in2[200000];
    memset(in, 0, sizeof(in));
    uint32_t n2 = 0, hl = 0, ha = 0;
    n = 0;
    for (uint32_t i = 0; i < 20000; i++) {
        uint32_t k = i / 3 + (i % 3) * 5; /* each key used 3 times within 16 uses */
        hl += use(l, in, &n, 16, k);
        ha += use(p, in2, &n2, 16, k);
    }
    TEST_ASSERT(ha >= hl);
    kvt_policy_destroy(l);
    kvt_policy_destroy(p);
}

static void test_names_and_config(void)
{
    const char *ok[] = {"lru", "arc", "lfu", "Adaptive", "Value", "noop"};
    for (int i = 0; i < 6; i++) {
        struct kvt_policy *p = kvt_policy_create(ok[i], 0.9, 0.1);
        TEST_ASSERT(p != NULL);
        kvt_policy_destroy(p);
    }
    TEST_ASSERT(kvt_policy_create("MRU", 0.9, 0.1) == NULL);
    char err[256];
    struct kvt_policy *p = NULL;
    json_t *ev = json_loads("{\"eviction_policy\": \"ARC\", \"trigger_watermark\": 0.9}", 0, NULL);
    TEST_ASSERT(kvt_policy_from_json(ev, &p, err, sizeof(err)) == 0 && p);
    json_t *d = kvt_policy_describe(p);
    TEST_ASSERT(strcmp(json_string_value(json_object_get(d, "eviction_policy")), "ARC") == 0);
    json_decref(d);
    json_decref(ev);
    kvt_policy_destroy(p);
    ev = json_loads("{\"eviction_policy\": \"LFUDA\"}", 0, NULL);
    TEST_ASSERT(kvt_policy_from_json(ev, &p, err, sizeof(err)) == KVT_E_CONFIG);
    TEST_ASSERT(strstr(err, "eviction.eviction_policy") && strstr(err, "ARC, LFU"));
    json_decref(ev);
}

int main(void)
{
    RUN(test_prefix_order_on_ties);
    RUN(test_lfu_aging);
    RUN(test_arc_scan_and_adaptation);
    RUN(test_adaptive_follows_the_better_expert);
    RUN(test_names_and_config);
    return TEST_RESULT();
}
