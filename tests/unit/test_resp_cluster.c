/* Description: Redis Cluster slots (CRC16 XMODEM, hash tags) and MOVED/ASK parsing
 * (src/l2/resp/resp_cluster.c). */
#include "l2/resp/resp_int.h"
#include "test.h"

#include <stdlib.h>
#include <string.h>

static unsigned slot(const char *k)
{
    return kvt_resp_cl_slot(k, strlen(k));
}

/* Values from the Redis Cluster spec and CLUSTER KEYSLOT on Redis 7.0. */
static void test_slots(void)
{
    TEST_ASSERT(slot("123456789") == (0x31C3 & 16383)); /* the spec's CRC16 check value */
    TEST_ASSERT(slot("foo") == 12182);
    TEST_ASSERT(slot("bar") == 5061);
    TEST_ASSERT(slot("") == 0);
    /* a hash tag: only the part inside the first {...} counts */
    TEST_ASSERT(slot("{user1000}.following") == slot("{user1000}.followers"));
    TEST_ASSERT(slot("{user1000}.following") == slot("user1000"));
    TEST_ASSERT(slot("foo{bar}{zap}") == slot("bar"));
    /* an empty tag or no closing brace: the whole key */
    TEST_ASSERT(slot("foo{}{bar}") != slot("bar"));
    TEST_ASSERT(slot("{bar") != slot("bar"));
    for (int i = 0; i < 1000; i++) {
        char k[32];
        snprintf(k, sizeof(k), "key:%d", i);
        TEST_ASSERT(slot(k) < CL_SLOTS);
    }
}

static void test_redirects(void)
{
    struct resp_engine *e = calloc(1, sizeof(*e));
    pthread_mutex_init(&e->maplock, NULL);
    pthread_mutex_init(&e->hlock, NULL);
    pthread_cond_init(&e->hcond, NULL);
    e->cluster = true;
    for (unsigned s = 0; s < CL_SLOTS; s++)
        e->slots[s] = CL_NO_NODE;
    TEST_ASSERT(kvt_resp_cl_node_add(e, "127.0.0.1", 7000) == 0);
    TEST_ASSERT(kvt_resp_cl_node_add(e, "127.0.0.1", 7000) == 0); /* known: same index */
    int node = -1;
    bool ask = true;
    TEST_ASSERT(kvt_resp_cl_error(e, "MOVED 3999 127.0.0.1:7001", &node, &ask) == 1);
    TEST_ASSERT(node == 1 && !ask && e->slots[3999] == 1 && e->moved == 1);
    TEST_ASSERT(e->refresh_needed);
    TEST_ASSERT(kvt_resp_cl_error(e, "ASK 42 127.0.0.1:7002", &node, &ask) == 1);
    TEST_ASSERT(node == 2 && ask && e->slots[42] == CL_NO_NODE && e->asked == 1);
    /* an empty host: the first seed's */
    TEST_ASSERT(kvt_resp_cl_error(e, "MOVED 7 :7001", &node, &ask) == 1 && node == 1);
    TEST_ASSERT(kvt_resp_cl_error(e, "CLUSTERDOWN The cluster is down", &node, &ask) == 2);
    TEST_ASSERT(
        kvt_resp_cl_error(e, "TRYAGAIN Multiple keys request during rehashing", &node, &ask) == 2);
    TEST_ASSERT(kvt_resp_cl_error(e, "OOM command not allowed", &node, &ask) == 0);
    TEST_ASSERT(kvt_resp_cl_error(e, "MOVED 99999 127.0.0.1:7001", &node, &ask) == 0);
    TEST_ASSERT(kvt_resp_cl_error(e, "MOVED 1 127.0.0.1", &node, &ask) == 0);
    int m[CL_MAX_NODES];
    TEST_ASSERT(kvt_resp_cl_masters(e, m, CL_MAX_NODES) == 1 && m[0] == 1);
    pthread_mutex_destroy(&e->maplock);
    pthread_mutex_destroy(&e->hlock);
    pthread_cond_destroy(&e->hcond);
    free(e);
}

int main(void)
{
    RUN(test_slots);
    RUN(test_redirects);
    return TEST_RESULT();
}
