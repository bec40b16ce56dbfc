/*
 * "eviction_policy": "noop": no order at all. Its walk names no victim, so
 * a tier under it never evicts: its hard cap alone holds (a full tier
 * refuses what does not fit).
 */
#include "common/util.h"
#include "policy/policy.h"

#include <stdlib.h>

static void noop_insert(struct kvt_policy *p, uint32_t h, bool cold,
                        const struct kvt_policy_hint *hint)
{
    (void)p, (void)h, (void)cold, (void)hint;
}
static void noop_h(struct kvt_policy *p, uint32_t h)
{
    (void)p, (void)h;
}
static void noop_walk(struct kvt_policy *p, bool (*visit)(uint32_t, void *), void *arg)
{
    (void)p, (void)visit, (void)arg;
}
static void noop_reserve(struct kvt_policy *p, uint32_t n)
{
    p->nhandles = n;
}
static void noop_destroy(struct kvt_policy *p)
{
    free(p);
}

static const struct kvt_policy_ops noop_ops = {
    .name = "noop",
    .insert = noop_insert,
    .access = noop_h,
    .remove = noop_h,
    .walk = noop_walk,
    .reserve = noop_reserve,
    .destroy = noop_destroy,
};

static struct kvt_policy *noop_from_cfg(const struct kvt_policy_cfg *cfg)
{
    (void)cfg;
    struct kvt_policy *p = kvt_xcalloc(1, sizeof(*p));
    p->ops = &noop_ops;
    return p;
}

const struct kvt_policy_desc kvt_policy_noop = {
    .name = "noop",
    .help = "never evicts: a full tier refuses stores",
    .flags = KVT_POLICY_NO_ORDER,
    .create = noop_from_cfg,
};
