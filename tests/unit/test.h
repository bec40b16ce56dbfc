/* Tiny in-tree test helper (Valkey style): TEST_ASSERT prints file:line. */
#ifndef KVT_TEST_H
#define KVT_TEST_H

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static int test_failures;

#define TEST_ASSERT(cond)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: FAILED: %s\n", __FILE__, __LINE__, #cond);                     \
            test_failures++;                                                                       \
            return_on_fail();                                                                      \
        }                                                                                          \
    } while (0)

/* Stop the current test function at its first failure. */
#define return_on_fail() abort_test()
static inline void abort_test(void)
{
    fprintf(stderr, "aborting after the first failure\n");
    exit(1);
}

#define RUN(fn)                                                                                    \
    do {                                                                                           \
        fprintf(stderr, "-- %s\n", #fn);                                                           \
        fn();                                                                                      \
    } while (0)

#define TEST_RESULT() (test_failures ? 1 : 0)

#endif
