/* Description: tier events: L1's announcements (request order, temporary
 * objects silent, removals only of what was announced), the core's queue
 * (drops counted, full queue), the engine-hash table (a tier names a key
 * as it announced it; orphans) and the L1 log (cursor reads, overwrite). */
#include "test.h"

#include "core/events.h"
#include "l1/l1.h"

#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

static struct kvt_l1 *mk(void)
{
    struct kvt_l1_opts o = {.size_bytes = 8 << 20,
                            .init_bytes = 8 << 20,
                            .lazy = true,
                            .align = 4096,
                            .write_ttl_ns = 600e9,
                            .read_ttl_ns = 300e9,
                            .policy = "LRU",
                            .watermark = 0.8,
                            .ratio = 0.2};
    struct kvt_l1 *l1 = NULL;
    char err[256];
    TEST_ASSERT(kvt_l1_create(&o, &l1, err, sizeof(err)) == 0);
    return l1;
}

static kvt_key key(int i)
{
    uint32_t ns;
    TEST_ASSERT(kvt_ns_intern("m", 1, "", 0, &ns, NULL) == 0);
    uint8_t h[32] = {0};
    memcpy(h, &i, sizeof(i));
    kvt_key k;
    TEST_ASSERT(kvt_key_make(&k, ns, h, 32, 0, 0) == 0);
    return k;
}

static int key_id(const kvt_key *k)
{
    int i;
    memcpy(&i, k->hash, sizeof(i));
    return i;
}

static struct kvt_blocktag *tag(uint8_t b)
{
    struct kvt_blocktag *t = kvt_blocktag_new(16, 2, 32, 0);
    memset(t->hashes, b, 64);
    return t;
}

static void test_l1_announces(void)
{
    struct kvt_events *q;
    TEST_ASSERT(kvt_events_new(64, &q) == 0);
    struct kvt_l1 *l1 = mk();
    kvt_l1_set_event_hook(l1, &(struct kvt_tier_hook){.fn = kvt_events_hook, .arg = q, .tier = 0});
    uint32_t hs[3];
    kvt_objmeta m = {.len = 4096};
    for (int i = 0; i < 3; i++) {
        kvt_key k = key(i);
        struct kvt_l1_ref r;
        TEST_ASSERT(kvt_l1_reserve(l1, &k, &m, &r) == 0);
        hs[i] = r.h;
    }
    struct kvt_event ev[8];
    TEST_ASSERT(kvt_events_pop(q, ev, 8) == 0); /* being written: nothing */
    kvt_l1_commit(l1, hs, 3, 0);
    TEST_ASSERT(kvt_events_pop(q, ev, 8) == 3);
    for (int i = 0; i < 3; i++) /* in request order, though the policy learns them reversed */
        TEST_ASSERT(ev[i].ev == KVT_TIER_STORED && key_id(&ev[i].key) == i && ev[i].tier == 0);
    /* a temporary object is not announced, nor its end */
    kvt_key k9 = key(9);
    struct kvt_l1_ref r;
    TEST_ASSERT(kvt_l1_reserve(l1, &k9, &m, &r) == 0);
    kvt_l1_commit(l1, &r.h, 1, KVT_L1_TEMP);
    kvt_l1_put(l1, r.h);
    TEST_ASSERT(kvt_events_pop(q, ev, 8) == 0);
    /* an aborted write: nothing */
    kvt_key k8 = key(8);
    TEST_ASSERT(kvt_l1_reserve(l1, &k8, &m, &r) == 0);
    kvt_l1_abort(l1, r.h);
    kvt_l1_put(l1, r.h);
    TEST_ASSERT(kvt_events_pop(q, ev, 8) == 0);
    for (int i = 0; i < 3; i++)
        kvt_l1_put(l1, hs[i]);
    /* a delete and an eviction */
    kvt_key k1 = key(1);
    TEST_ASSERT(kvt_l1_delete(l1, &k1));
    TEST_ASSERT(kvt_events_pop(q, ev, 8) == 1);
    TEST_ASSERT(ev[0].ev == KVT_TIER_REMOVED && key_id(&ev[0].key) == 1);
    kvt_l1_evict_to(l1, 0);
    TEST_ASSERT(kvt_events_pop(q, ev, 8) == 2);
    TEST_ASSERT(ev[0].ev == KVT_TIER_REMOVED && ev[1].ev == KVT_TIER_REMOVED);
    kvt_l1_destroy(l1);
    kvt_events_free(q);
}

static void test_queue_full_counts_drops(void)
{
    struct kvt_events *q;
    TEST_ASSERT(kvt_events_new(2, &q) == 0);
    for (int i = 0; i < 5; i++) {
        kvt_key k = key(i);
        kvt_events_hook(q, 1, KVT_TIER_STORED, &k);
    }
    struct kvt_events_stats st;
    kvt_events_stats(q, &st);
    TEST_ASSERT(st.pushed == 2 && st.dropped == 3 && st.depth == 2);
    TEST_ASSERT(kvt_events_dropped(q) == 3);
    uint64_t v;
    TEST_ASSERT(read(kvt_events_fd(q), &v, sizeof(v)) == sizeof(v)); /* woken once */
    struct kvt_event ev[4];
    TEST_ASSERT(kvt_events_pop(q, ev, 4) == 2 && key_id(&ev[0].key) == 0);
    kvt_events_free(q);
}

static void test_tags_follow_each_tier(void)
{
    struct kvt_events *q;
    TEST_ASSERT(kvt_events_new(64, &q) == 0);
    kvt_key a = key(1), b = key(2);
    struct kvt_event ev[8];
    /* b: tier 1 announced it before its tag came: named by its key there */
    kvt_events_hook(q, 1, KVT_TIER_STORED, &b);
    kvt_events_tag(q, &a, tag(0xaa));
    kvt_events_tag(q, &b, tag(0xbb));
    struct kvt_events_stats st;
    kvt_events_stats(q, &st);
    TEST_ASSERT(st.tagged == 2 && st.orphans == 2);
    kvt_events_hook(q, 0, KVT_TIER_STORED, &a);
    kvt_events_hook(q, 1, KVT_TIER_STORED, &a);
    kvt_events_hook(q, 0, KVT_TIER_STORED, &b);
    /* a tag given while a tier holds the key under one changes nothing */
    kvt_events_tag(q, &a, tag(0xcc));
    kvt_events_hook(q, 0, KVT_TIER_REMOVED, &a);
    kvt_events_hook(q, 1, KVT_TIER_REMOVED, &b); /* announced without it */
    kvt_events_hook(q, 0, KVT_TIER_REMOVED, &b);
    kvt_events_hook(q, 1, KVT_TIER_REMOVED, &a); /* the last tier: the entry goes */
    TEST_ASSERT(kvt_events_pop(q, ev, 8) == 8);
    TEST_ASSERT(!ev[0].tag);                                /* b in tier 1 */
    TEST_ASSERT(ev[1].tag && ev[1].tag->hashes[0] == 0xaa); /* a in L1 */
    TEST_ASSERT(ev[2].tag && ev[2].tag->hashes[0] == 0xaa); /* a in tier 1 */
    TEST_ASSERT(ev[3].tag && ev[3].tag->hashes[0] == 0xbb); /* b in L1 */
    TEST_ASSERT(ev[4].tag && ev[4].tag->hashes[0] == 0xaa); /* a leaves L1 */
    TEST_ASSERT(!ev[5].tag);                                /* b leaves tier 1 */
    TEST_ASSERT(ev[6].tag && ev[6].tag->hashes[0] == 0xbb); /* b leaves L1 */
    TEST_ASSERT(ev[7].tag && ev[7].tag->hashes[0] == 0xaa); /* a leaves tier 1 */
    for (int i = 0; i < 8; i++)
        kvt_blocktag_put(ev[i].tag);
    kvt_events_stats(q, &st);
    TEST_ASSERT(st.tagged == 0 && st.orphans == 0);
    kvt_events_free(q);
}

static void test_orphans_are_capped(void)
{
    struct kvt_events *q;
    TEST_ASSERT(kvt_events_new(4, &q) == 0);
    for (int i = 0; i < KVT_EVENTS_MAX_ORPHANS + 10; i++) {
        kvt_key k = key(i);
        kvt_events_tag(q, &k, tag(1));
    }
    struct kvt_events_stats st;
    kvt_events_stats(q, &st);
    TEST_ASSERT(st.orphans == KVT_EVENTS_MAX_ORPHANS && st.tagged == KVT_EVENTS_MAX_ORPHANS);
    kvt_events_free(q);
}

/* A persistent tier's calls: tag_of hands out the kept tag (a reference),
 * and a tag read back at start-up is kept even when the client orphans
 * fill the cap (the tier announces it next). */
static void test_tags_read_back(void)
{
    struct kvt_events *q;
    TEST_ASSERT(kvt_events_new(4, &q) == 0);
    for (int i = 0; i < KVT_EVENTS_MAX_ORPHANS; i++) {
        kvt_key k = key(i);
        kvt_events_tag(q, &k, tag(1));
    }
    kvt_key a = key(-1), b = key(-2);
    kvt_events_tag(q, &a, tag(2)); /* a client's: over the cap, dropped */
    TEST_ASSERT(kvt_events_tag_of(q, &a) == NULL);
    kvt_events_tag_hook(q, &b, tag(3)); /* read back: kept */
    struct kvt_blocktag *t = kvt_events_tag_of(q, &b);
    TEST_ASSERT(t && t->hashes[0] == 3);
    kvt_blocktag_put(t);
    kvt_events_hook(q, 1, KVT_TIER_STORED, &b);
    struct kvt_events_stats st;
    kvt_events_stats(q, &st);
    TEST_ASSERT(st.orphans == KVT_EVENTS_MAX_ORPHANS && st.tagged == KVT_EVENTS_MAX_ORPHANS + 1);
    struct kvt_event ev;
    TEST_ASSERT(kvt_events_pop(q, &ev, 1) == 1 && ev.tag && ev.tag->hashes[0] == 3);
    kvt_blocktag_put(ev.tag);
    kvt_events_free(q);
}

static void test_l1_log(void)
{
    struct kvt_events *q;
    TEST_ASSERT(kvt_events_new(64, &q) == 0);
    int fd = eventfd(0, EFD_NONBLOCK);
    kvt_events_log_open(q, 4, fd);
    struct kvt_evrec r[8];
    uint64_t first, last, v;
    TEST_ASSERT(kvt_events_log_read(q, 0, r, 8, &first, &last) == 0 && last == 0);
    for (int i = 0; i < 3; i++) {
        kvt_key k = key(i);
        kvt_events_hook(q, 0, KVT_TIER_STORED, &k);
        kvt_events_hook(q, 1, KVT_TIER_STORED, &k); /* not L1: not logged */
    }
    TEST_ASSERT(read(fd, &v, sizeof(v)) == sizeof(v)); /* the empty read armed it */
    TEST_ASSERT(kvt_events_log_read(q, 0, r, 8, &first, &last) == 3);
    TEST_ASSERT(first == 1 && last == 3 && r[0].seq == 1 && key_id(&r[2].key) == 2);
    TEST_ASSERT(kvt_events_log_read(q, 1, r, 1, &first, &last) == 1 && r[0].seq == 2);
    for (int i = 3; i < 6; i++) { /* past its 4 records: the oldest go */
        kvt_key k = key(i);
        kvt_events_hook(q, 0, KVT_TIER_REMOVED, &k);
    }
    TEST_ASSERT(kvt_events_log_read(q, 0, r, 8, &first, &last) == 4);
    TEST_ASSERT(first == 3 && last == 6 && r[0].seq == 3 && r[3].ev == KVT_TIER_REMOVED);
    close(fd);
    kvt_events_free(q);
}

int main(void)
{
    RUN(test_l1_announces);
    RUN(test_queue_full_counts_drops);
    RUN(test_tags_follow_each_tier);
    RUN(test_orphans_are_capped);
    RUN(test_tags_read_back);
    RUN(test_l1_log);
    return TEST_RESULT();
}
