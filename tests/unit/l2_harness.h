/* Helpers to drive an L2 adapter through its contract in unit tests. */
#ifndef KVT_L2_HARNESS_H
#define KVT_L2_HARNESS_H

#include "test.h"

#include "common/util.h"
#include "l2/adapters.h"
#include "l2/engine.h"
#include "l2/evict.h"
#include "l2/l2.h"

#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static kvt_l2 *open_adapter(const char *json)
{
    struct kvt_l2_spec spec;
    char err[512];
    int rc = kvt_l2_spec_parse(json, 0, &spec, err, sizeof(err));
    if (rc)
        fprintf(stderr, "spec: %s\n", err);
    TEST_ASSERT(rc == 0);
    kvt_l2 *l2 = NULL;
    rc = kvt_l2_open(&spec, &l2, err, sizeof(err));
    if (rc)
        fprintf(stderr, "open: %s\n", err);
    TEST_ASSERT(rc == 0);
    kvt_l2_spec_free(&spec);
    return l2;
}

static void close_adapter(kvt_l2 *l2)
{
    kvt_l2_close(l2);
    free(l2);
}

static void wait_recovered(kvt_l2 *l2)
{
    for (int i = 0; i < 10000; i++) {
        pthread_mutex_lock(&l2->lock);
        bool r = l2->recovering;
        pthread_mutex_unlock(&l2->lock);
        if (!r)
            return;
        usleep(1000);
    }
    TEST_ASSERT(!"recovery did not finish");
}

/* Submit and wait for this task to come back. */
static void run_task(kvt_l2 *l2, kvt_l2_task *t)
{
    kvt_l2_submit(l2, t);
    for (;;) {
        struct pollfd p = {.fd = l2->efd[t->kind], .events = POLLIN};
        TEST_ASSERT(poll(&p, 1, 30000) == 1);
        kvt_l2_task *done[8];
        size_t n = kvt_l2_pop_done(l2, t->kind, done, 8);
        for (size_t i = 0; i < n; i++)
            TEST_ASSERT(done[i] == t); /* one task in flight at a time here */
        if (n)
            return;
    }
}

static kvt_key hkey(const char *model, const char *salt, int i)
{
    uint32_t ns;
    TEST_ASSERT(kvt_ns_intern(model, strlen(model), salt, strlen(salt), &ns, NULL) == 0);
    uint8_t h[32] = {0};
    memcpy(h, &i, sizeof(i));
    h[31] = 0x5a;
    kvt_key k;
    TEST_ASSERT(kvt_key_make(&k, ns, h, 32, 0, 0) == 0);
    return k;
}

#endif
