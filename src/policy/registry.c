/*
 * The table of eviction policies: one line each.
 *
 * A policy's file defines its descriptor, kvt_policy_<id> (policy.h:
 * struct kvt_policy_desc: name, help, flags, constructor, its own fields);
 * POLICY(id) below lists it. The order is the order every list shows:
 * --help, the "known: ..." of error messages, cache.env's choices and the
 * columns of kvtier replay.
 */
#include "policy/policy.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#define POLICIES(POLICY)                                                                           \
    POLICY(lru)                                                                                    \
    POLICY(arc)                                                                                    \
    POLICY(lfu)                                                                                    \
    POLICY(value)                                                                                  \
    POLICY(adaptive)                                                                               \
    POLICY(noop)

#define DECLARE(id) extern const struct kvt_policy_desc kvt_policy_##id;
POLICIES(DECLARE)
#undef DECLARE

static const struct kvt_policy_desc *const table[] = {
#define ENTRY(id) &kvt_policy_##id,
    POLICIES(ENTRY)
#undef ENTRY
};

enum { NPOLICIES = sizeof(table) / sizeof(table[0]) };

const struct kvt_policy_desc *kvt_policy_at(size_t i)
{
    return i < NPOLICIES ? table[i] : NULL;
}

const struct kvt_policy_desc *kvt_policy_find(const char *name)
{
    for (size_t i = 0; i < NPOLICIES; i++)
        if (strcasecmp(name, table[i]->name) == 0)
            return table[i];
    return NULL;
}

static char names[256];
static pthread_once_t names_once = PTHREAD_ONCE_INIT;

static void build_names(void)
{
    size_t n = 0;
    for (size_t i = 0; i < NPOLICIES && n < sizeof(names); i++)
        n += (size_t)snprintf(names + n, sizeof(names) - n, "%s%s", i ? ", " : "", table[i]->name);
}

const char *kvt_policy_names(void)
{
    /* built once (pthread_once: any thread may ask first), then read-only */
    pthread_once(&names_once, build_names);
    return names;
}
