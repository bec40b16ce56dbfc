/* Description: page-run allocator: alignment, coalescing, mixed-size churn, fragmentation. */
#include "test.h"

#include "l1/palloc.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static void test_basic(void)
{
    struct kvt_palloc a;
    kvt_palloc_init(&a);
    kvt_palloc_grow(&a, 100);
    uint32_t s1, s2, s3;
    TEST_ASSERT(kvt_palloc_alloc(&a, 10, &s1) == 0);
    TEST_ASSERT(kvt_palloc_alloc(&a, 20, &s2) == 0);
    TEST_ASSERT(kvt_palloc_alloc(&a, 70, &s3) == 0);
    TEST_ASSERT(a.free_pages == 0);
    uint32_t x;
    TEST_ASSERT(kvt_palloc_alloc(&a, 1, &x) == -ENOSPC);
    kvt_palloc_free(&a, s2, 20);
    kvt_palloc_free(&a, s1, 10);
    TEST_ASSERT(a.live_runs == 1); /* merged */
    TEST_ASSERT(kvt_palloc_largest(&a) == 30);
    kvt_palloc_free(&a, s3, 70);
    TEST_ASSERT(a.live_runs == 1 && kvt_palloc_largest(&a) == 100);
    TEST_ASSERT(kvt_palloc_fragmentation(&a) == 0.0);
    kvt_palloc_grow(&a, 200); /* growth merges with the free tail */
    TEST_ASSERT(a.live_runs == 1 && kvt_palloc_largest(&a) == 200);
    kvt_palloc_destroy(&a);
}

/* Random mixed sizes: no overlap, page accounting exact, and no two free
 * runs are ever adjacent (checked by freeing everything: one run remains). */
static void test_churn(void)
{
    struct kvt_palloc a;
    kvt_palloc_init(&a);
    const uint32_t total = 1 << 16;
    kvt_palloc_grow(&a, total);
    uint8_t *owner = calloc(total, 1);
    struct {
        uint32_t s, n;
    } live[4096];
    int nlive = 0;
    srand(7);
    uint64_t used = 0;
    for (int it = 0; it < 200000; it++) {
        if (nlive < 4096 && (rand() % 3 != 0 || nlive == 0)) {
            uint32_t n = (uint32_t)(rand() % 5 == 0 ? 1 + rand() % 1024 : 1 + rand() % 16);
            uint32_t s;
            if (kvt_palloc_alloc(&a, n, &s) == 0) {
                TEST_ASSERT(s + n <= total);
                for (uint32_t p = s; p < s + n; p++) {
                    TEST_ASSERT(owner[p] == 0);
                    owner[p] = 1;
                }
                live[nlive].s = s;
                live[nlive].n = n;
                nlive++;
                used += n;
            }
        } else {
            int i = rand() % nlive;
            for (uint32_t p = live[i].s; p < live[i].s + live[i].n; p++)
                owner[p] = 0;
            kvt_palloc_free(&a, live[i].s, live[i].n);
            used -= live[i].n;
            live[i] = live[--nlive];
        }
        TEST_ASSERT(a.free_pages == total - used);
    }
    double frag = kvt_palloc_fragmentation(&a);
    TEST_ASSERT(frag >= 0.0 && frag <= 1.0);
    for (int i = 0; i < nlive; i++)
        kvt_palloc_free(&a, live[i].s, live[i].n);
    TEST_ASSERT(a.free_pages == total && a.live_runs == 1);
    free(owner);
    kvt_palloc_destroy(&a);
}

/* A request is served whenever some free run is large enough. */
static void test_exact_fit_found(void)
{
    struct kvt_palloc a;
    kvt_palloc_init(&a);
    kvt_palloc_grow(&a, 1000);
    uint32_t s[3];
    TEST_ASSERT(kvt_palloc_alloc(&a, 100, &s[0]) == 0);
    TEST_ASSERT(kvt_palloc_alloc(&a, 837, &s[1]) == 0);
    TEST_ASSERT(kvt_palloc_alloc(&a, 63, &s[2]) == 0);
    kvt_palloc_free(&a, s[1], 837);
    uint32_t x;
    TEST_ASSERT(kvt_palloc_alloc(&a, 837, &x) == 0 && x == s[1]);
    kvt_palloc_destroy(&a);
}

int main(void)
{
    RUN(test_basic);
    RUN(test_churn);
    RUN(test_exact_fit_found);
    return TEST_RESULT();
}
