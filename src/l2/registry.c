/*
 * --l2-adapter JSON -> spec -> adapter, and the table of adapter types:
 * one line each.
 *
 * An adapter's folder defines its descriptor, kvt_l2_<id>_desc (adapters.h:
 * struct kvt_l2_adapter_desc: the "type" name, its option parser, open,
 * and the hooks for what is type-specific); ADAPTER(id) below lists it. The
 * order is the order of "known types" in messages.
 */
#include "l2/adapters.h"
#include "common/util.h"
#include "policy/policy.h"
#include "kvtier/error.h"
#include "l2/kit/quota.h"
#include "l2/stage.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ADAPTERS(ADAPTER)                                                                          \
    ADAPTER(fs)                                                                                    \
    ADAPTER(fs_native)                                                                             \
    ADAPTER(mock)                                                                                  \
    ADAPTER(nixl_dynamic)                                                                          \
    ADAPTER(nixl_store)                                                                            \
    ADAPTER(raw_block)                                                                             \
    ADAPTER(dax)                                                                                   \
    ADAPTER(resp)                                                                                  \
    ADAPTER(valkey)                                                                                \
    ADAPTER(s3)                                                                                    \
    ADAPTER(mooncake)                                                                              \
    ADAPTER(fault_inject)

#define DECLARE(id) extern const struct kvt_l2_adapter_desc kvt_l2_##id##_desc;
ADAPTERS(DECLARE)
#undef DECLARE

static const struct kvt_l2_adapter_desc *const types[] = {
#define ENTRY(id) &kvt_l2_##id##_desc,
    ADAPTERS(ENTRY)
#undef ENTRY
};

const struct kvt_l2_adapter_desc *kvt_l2_adapter_at(size_t i)
{
    return i < KVT_ARRAY_LEN(types) ? types[i] : NULL;
}

const char *kvt_l2_types(void)
{
    static char buf[256];
    if (!buf[0])
        for (size_t i = 0; i < KVT_ARRAY_LEN(types); i++) {
            size_t l = strlen(buf);
            snprintf(buf + l, sizeof(buf) - l, "%s%s", i ? ", " : "", types[i]->name);
        }
    return buf;
}

static const struct kvt_l2_adapter_desc *find_type(const char *t)
{
    for (size_t i = 0; i < KVT_ARRAY_LEN(types); i++)
        if (strcmp(types[i]->name, t) == 0)
            return types[i];
    return NULL;
}

void kvt_l2_spec_free(struct kvt_l2_spec *s)
{
    json_decref(s->json);
    json_decref(s->resolved);
    s->json = s->resolved = NULL;
    kvt_serde_unref(s->serde);
    s->serde = NULL;
    json_decref(s->quotas);
    s->quotas = NULL;
    free(s->quotas_file);
    s->quotas_file = NULL;
    if (s->opts && s->desc && s->desc->opts_free)
        s->desc->opts_free(s->opts);
    free(s->opts);
    s->opts = NULL;
}

/* Common keys: persist_enabled, eviction, serde. */
static int parse_common(struct kvt_cfg *c, struct kvt_l2_spec *s)
{
    kvt_cfg_bool(c, "persist_enabled", true, &s->persist_enabled);
    const json_t *ev = kvt_cfg_raw(c, "eviction");
    if (!c->rc && ev && !json_is_null(ev)) {
        char msg[256];
        if (kvt_policy_parse(ev, &s->eviction, msg, sizeof(msg)))
            return kvt_cfg_fail(c, "eviction", "is invalid: %s", msg);
        s->has_eviction = true; /* the adapter builds its own policy from s->eviction */
        struct kvt_policy *p = kvt_policy_build(&s->eviction);
        json_object_set_new(c->resolved, "eviction", kvt_policy_describe(p));
        kvt_policy_destroy(p);
    }
    /* per-namespace quotas (kvtier addition; the file is read here, so a bad
     * quotas.json fails the config with exit 2, --dry-run included) */
    const json_t *q = kvt_cfg_raw(c, "namespace_quotas");
    if (!c->rc && q && !json_is_null(q)) {
        char msg[400];
        if (kvt_quota_parse(q, &s->quotas, msg, sizeof(msg)))
            return kvt_cfg_fail(c, "namespace_quotas", "%s", msg);
        if (json_is_string(q)) { /* where quotas set at run time are written */
            char *abs = realpath(json_string_value(q), NULL);
            s->quotas_file = abs ? abs : kvt_xstrdup(json_string_value(q));
        }
        json_object_set(c->resolved, "namespace_quotas", s->quotas);
    }
    /* a budget shared with other servers (l2/budget.h): read only when
     * given, so a config without it resolves exactly as before */
    if (!c->rc && kvt_cfg_has(c, "shared_budget"))
        kvt_cfg_bool(c, "shared_budget", false, &s->shared_budget);
    /* the chain is built here (key files read and checked), so a bad serde
     * fails the config with exit 2, --dry-run included */
    const json_t *serde = kvt_cfg_raw(c, "serde");
    if (!c->rc && serde && !json_is_null(serde))
        kvt_serde_parse(c, serde, &s->serde);
    return c->rc;
}

int kvt_l2_budget_needs_shared(struct kvt_cfg *c, bool shared)
{
    if (!shared)
        kvt_cfg_fail(c, "shared_budget",
                     "needs \"shared\": true: the budget is shared by the servers that share "
                     "the directory (without it the directory has one owner, whose "
                     "max_capacity_gb is the budget already)");
    return c->rc;
}

/* The types a budget can be shared on, for the refusal: "fs with
 * \"shared\": true, ..., s3". */
static const char *budget_types(void)
{
    static char buf[512];
    if (!buf[0])
        for (size_t i = 0; i < KVT_ARRAY_LEN(types); i++) {
            if (!types[i]->shared_budget)
                continue;
            size_t l = strlen(buf);
            snprintf(buf + l, sizeof(buf) - l, "%s%s%s%s", l ? ", " : "", types[i]->name,
                     types[i]->shared_budget_needs ? " " : "",
                     types[i]->shared_budget_needs ? types[i]->shared_budget_needs : "");
        }
    return buf;
}

/*
 * "shared_budget": true needs a tier that several servers really share, a
 * record kept there (the type's shared_budget hook says whether it keeps
 * one with these options, and what else it needs), and a cap.
 * persist_enabled false is refused as with "shared": a server would remove,
 * at close, objects the others' budget counts.
 */
static void check_shared_budget(struct kvt_cfg *c, const struct kvt_l2_spec *s)
{
    int rc = s->desc->shared_budget ? s->desc->shared_budget(c, s->opts) : KVT_L2_NO_BUDGET;
    if (rc == KVT_L2_NO_BUDGET) {
        kvt_cfg_fail(c, "shared_budget", "is for tiers several servers share: %s (not %s)",
                     budget_types(), s->type);
        return;
    }
    if (rc)
        return;
    /* the cap, at the top or in backend_params (nixl's form) */
    const json_t *cap = json_object_get(c->resolved, "max_capacity_gb");
    if (!cap)
        cap = json_object_get(json_object_get(c->resolved, "backend_params"), "max_capacity_gb");
    if (!(json_number_value(cap) > 0)) {
        kvt_cfg_fail(c, "shared_budget",
                     "needs max_capacity_gb > 0: the shared budget is that cap, held across "
                     "every server sharing the tier (give each the same value)");
        return;
    }
    if (!s->persist_enabled)
        kvt_cfg_fail(c, "shared_budget",
                     "cannot be combined with \"persist_enabled\": false: a server would remove "
                     "at close objects the other servers' budget counts (keep persist_enabled "
                     "true)");
}

int kvt_l2_spec_max_interval_ms(const struct kvt_l2_spec *s)
{
    return s->shared_budget && s->desc ? s->desc->budget_max_interval_ms : 0;
}

int kvt_l2_spec_parse(const char *text, int index, struct kvt_l2_spec *s, char *err, size_t errcap)
{
    memset(s, 0, sizeof(*s));
    s->index = index;
    json_error_t je;
    json_t *j = json_loads(text, JSON_REJECT_DUPLICATES, &je);
    if (!j) {
        snprintf(err, errcap, "--l2-adapter #%d: invalid JSON: %s (line %d, column %d)", index,
                 je.text, je.line, je.column);
        return KVT_E_CONFIG;
    }
    if (!json_is_object(j)) {
        snprintf(err, errcap, "--l2-adapter #%d: must be a JSON object", index);
        json_decref(j);
        return KVT_E_CONFIG;
    }
    const json_t *ty = json_object_get(j, "type");
    if (!ty || !json_is_string(ty)) {
        snprintf(err, errcap, "--l2-adapter #%d: \"type\" is %s (known types: %s)", index,
                 ty ? "not a string" : "missing", kvt_l2_types());
        json_decref(j);
        return KVT_E_CONFIG;
    }
    const struct kvt_l2_adapter_desc *te = find_type(json_string_value(ty));
    if (!te) {
        snprintf(err, errcap, "--l2-adapter #%d: unknown type \"%s\" (known types: %s)", index,
                 json_string_value(ty), kvt_l2_types());
        json_decref(j);
        return KVT_E_CONFIG;
    }
    snprintf(s->type, sizeof(s->type), "%s", te->name);
    s->json = j;
    struct kvt_cfg c;
    kvt_cfg_init(&c, j, index, te->name, err, errcap);
    kvt_cfg_ignore(&c, "type");
    s->desc = te;
    parse_common(&c, s);
    if (!c.rc) {
        /* kept in the spec for kvt_l2_open (strings point into s->json) */
        s->opts = kvt_xcalloc(1, te->opts_size);
        te->parse(&c, s->opts);
    }
    if (!c.rc)
        kvt_cfg_finish(&c);
    /* a directory shared by several servers ("shared": fs, nixl_store_dynamic):
     * removing "our" files at close would remove the others' too, and no
     * server's cap can bound what all of them write */
    if (!c.rc && json_is_true(json_object_get(c.resolved, "shared")) && !s->persist_enabled)
        kvt_cfg_fail(&c, "shared",
                     "true cannot be combined with \"persist_enabled\": false: a server would "
                     "remove the files of the other servers sharing the directory when it "
                     "stops (keep persist_enabled true, or give each server its own "
                     "directory)");
    if (!c.rc && s->shared_budget)
        check_shared_budget(&c, s);
    int rc = c.rc;
    if (!rc) {
        s->resolved = json_object();
        json_object_set_new(s->resolved, "type", json_string(te->name));
        json_object_update(s->resolved, c.resolved);
    }
    kvt_cfg_free(&c);
    if (rc) {
        kvt_l2_spec_free(s);
    }
    return rc;
}

int kvt_l2_open_into(const struct kvt_l2_spec *s, kvt_l2 *l2, char *err, size_t errcap)
{
    const struct kvt_l2_adapter_desc *te = s->desc;
    if (!te || !s->opts)
        return KVT_E_CONFIG;
    char oerr[512] = "";
    int rc = te->open(l2, s, s->opts, oerr, sizeof(oerr));
    if (rc) {
        if (s->origin[0])
            snprintf(err, errcap, "%s: %s", s->origin, oerr);
        else
            snprintf(err, errcap, "--l2-adapter #%d (%s): %s", s->index, s->type, oerr);
        return rc;
    }
    /* the serde stage goes in front of whatever engine was opened (for a
     * wrapper such as fault_inject: the inner spec's chain, or the outer's) */
    if (s->serde) {
        rc = kvt_serde_stage_attach(l2, s->serde, oerr, sizeof(oerr));
        if (rc) {
            snprintf(err, errcap, "--l2-adapter #%d (%s): %s", s->index, s->type, oerr);
            kvt_l2_close(l2);
        }
    }
    return rc;
}

int kvt_l2_open(const struct kvt_l2_spec *s, kvt_l2 **out, char *err, size_t errcap)
{
    kvt_l2 *l2 = kvt_xcalloc(1, sizeof(*l2));
    int rc = kvt_l2_open_into(s, l2, err, errcap);
    if (rc) {
        free(l2);
        return rc;
    }
    *out = l2;
    return 0;
}
