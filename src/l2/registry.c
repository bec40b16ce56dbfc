/* --l2-adapter JSON -> spec -> adapter. One table of types. */
#include "l2/adapters.h"
#include "common/util.h"
#include "policy/policy.h"
#include "kvtier/error.h"
#include "l2/kit/quota.h"
#include "l2/stage.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int (*parse_fn)(struct kvt_cfg *c, void *opts);
typedef int (*open_fn)(kvt_l2 *l2, const struct kvt_l2_spec *spec, void *opts, char *err,
                       size_t errcap);

static int parse_fs(struct kvt_cfg *c, void *o)
{
    return kvt_fs_parse(c, o, false);
}
static int parse_fs_native(struct kvt_cfg *c, void *o)
{
    return kvt_fs_parse(c, o, true);
}
static int open_fs(kvt_l2 *l2, const struct kvt_l2_spec *s, void *o, char *err, size_t cap)
{
    return kvt_fs_open(l2, s, o, err, cap);
}
static int parse_mock(struct kvt_cfg *c, void *o)
{
    return kvt_mock_parse(c, o);
}
static int open_mock(kvt_l2 *l2, const struct kvt_l2_spec *s, void *o, char *err, size_t cap)
{
    return kvt_mock_open(l2, s, o, err, cap);
}

static int parse_nixl_dynamic(struct kvt_cfg *c, void *o)
{
    return kvt_nixl_parse(c, o, true);
}
static int open_nixl_dynamic(kvt_l2 *l2, const struct kvt_l2_spec *s, void *o, char *err,
                             size_t cap)
{
    return kvt_nixl_dynamic_open(l2, s, o, err, cap);
}
static int parse_nixl_store(struct kvt_cfg *c, void *o)
{
    return kvt_nixl_parse(c, o, false);
}
static int open_nixl_store(kvt_l2 *l2, const struct kvt_l2_spec *s, void *o, char *err,
                           size_t cap)
{
    return kvt_nixl_store_open(l2, s, o, err, cap);
}

static int parse_raw_block(struct kvt_cfg *c, void *o)
{
    return kvt_raw_block_parse(c, o);
}
static int open_raw_block(kvt_l2 *l2, const struct kvt_l2_spec *s, void *o, char *err, size_t cap)
{
    return kvt_raw_block_open(l2, s, o, err, cap);
}

static int parse_dax(struct kvt_cfg *c, void *o)
{
    return kvt_dax_parse(c, o);
}
static int open_dax(kvt_l2 *l2, const struct kvt_l2_spec *s, void *o, char *err, size_t cap)
{
    return kvt_dax_open(l2, s, o, err, cap);
}

static int parse_resp(struct kvt_cfg *c, void *o)
{
    return kvt_resp_parse(c, o, false);
}
static int parse_valkey(struct kvt_cfg *c, void *o)
{
    return kvt_resp_parse(c, o, true);
}
static int open_resp(kvt_l2 *l2, const struct kvt_l2_spec *s, void *o, char *err, size_t cap)
{
    return kvt_resp_open(l2, s, o, err, cap);
}

static int parse_s3(struct kvt_cfg *c, void *o)
{
    return kvt_s3_parse(c, o);
}
static int open_s3(kvt_l2 *l2, const struct kvt_l2_spec *s, void *o, char *err, size_t cap)
{
    return kvt_s3_open(l2, s, o, err, cap);
}

static int parse_mooncake(struct kvt_cfg *c, void *o)
{
    return kvt_mooncake_parse(c, o);
}
static int open_mooncake(kvt_l2 *l2, const struct kvt_l2_spec *s, void *o, char *err, size_t cap)
{
    return kvt_mooncake_open(l2, s, o, err, cap);
}

static int parse_fault(struct kvt_cfg *c, void *o)
{
    return kvt_fault_parse(c, o);
}
static int open_fault(kvt_l2 *l2, const struct kvt_l2_spec *s, void *o, char *err, size_t cap)
{
    return kvt_fault_open(l2, s, o, err, cap);
}

union any_opts {
    struct kvt_fs_opts fs;
    struct kvt_mock_opts mock;
    struct kvt_nixl_opts nixl;
    struct kvt_raw_block_opts raw_block;
    struct kvt_dax_opts dax;
    struct kvt_resp_opts resp;
    struct kvt_s3_opts s3;
    struct kvt_mooncake_opts mooncake;
    struct kvt_fault_opts fault;
};

static const struct type_ent {
    const char *type;
    parse_fn parse;
    open_fn open;
} types[] = {
    {"fs", parse_fs, open_fs},
    {"fs_native", parse_fs_native, open_fs},
    {"mock", parse_mock, open_mock},
    {"nixl_store_dynamic", parse_nixl_dynamic, open_nixl_dynamic},
    {"nixl_store", parse_nixl_store, open_nixl_store},
    {"raw_block", parse_raw_block, open_raw_block},
    {"dax", parse_dax, open_dax},
    {"resp", parse_resp, open_resp},
    {"valkey", parse_valkey, open_resp},
    {"s3", parse_s3, open_s3},
    {"mooncake_store", parse_mooncake, open_mooncake},
    {"fault_inject", parse_fault, open_fault},
};

const char *kvt_l2_types(void)
{
    static char buf[256];
    if (!buf[0])
        for (size_t i = 0; i < KVT_ARRAY_LEN(types); i++) {
            size_t l = strlen(buf);
            snprintf(buf + l, sizeof(buf) - l, "%s%s", i ? ", " : "", types[i].type);
        }
    return buf;
}

static const struct type_ent *find_type(const char *t)
{
    for (size_t i = 0; i < KVT_ARRAY_LEN(types); i++)
        if (strcmp(types[i].type, t) == 0)
            return &types[i];
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
}

/* Common keys: persist_enabled, eviction, serde. */
static int parse_common(struct kvt_cfg *c, struct kvt_l2_spec *s)
{
    kvt_cfg_bool(c, "persist_enabled", true, &s->persist_enabled);
    const json_t *ev = kvt_cfg_raw(c, "eviction");
    if (!c->rc && ev && !json_is_null(ev)) {
        struct kvt_policy *p = NULL;
        char msg[256];
        if (kvt_policy_from_json(ev, &p, msg, sizeof(msg)))
            return kvt_cfg_fail(c, "eviction", "is invalid: %s", msg);
        s->has_eviction = true; /* the adapter builds its policy from the same object */
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
        json_object_set(c->resolved, "namespace_quotas", s->quotas);
    }
    /* the chain is built here (key files read and checked), so a bad serde
     * fails the config with exit 2, --dry-run included */
    const json_t *serde = kvt_cfg_raw(c, "serde");
    if (!c->rc && serde && !json_is_null(serde))
        kvt_serde_parse(c, serde, &s->serde);
    return c->rc;
}

int kvt_l2_spec_parse(const char *text, int index, struct kvt_l2_spec *s, char *err,
                      size_t errcap)
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
    const struct type_ent *te = find_type(json_string_value(ty));
    if (!te) {
        snprintf(err, errcap, "--l2-adapter #%d: unknown type \"%s\" (known types: %s)", index,
                 json_string_value(ty), kvt_l2_types());
        json_decref(j);
        return KVT_E_CONFIG;
    }
    snprintf(s->type, sizeof(s->type), "%s", te->type);
    s->json = j;
    struct kvt_cfg c;
    kvt_cfg_init(&c, j, index, te->type, err, errcap);
    kvt_cfg_ignore(&c, "type");
    union any_opts o;
    parse_common(&c, s);
    if (!c.rc)
        te->parse(&c, &o);
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
    int rc = c.rc;
    if (!rc) {
        s->resolved = json_object();
        json_object_set_new(s->resolved, "type", json_string(te->type));
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
    const struct type_ent *te = find_type(s->type);
    if (!te)
        return KVT_E_CONFIG;
    struct kvt_cfg c;
    char perr[512];
    kvt_cfg_init(&c, s->json, s->index, te->type, perr, sizeof(perr));
    union any_opts o;
    int rc = te->parse(&c, &o); /* strings in o point into s->json: keep c until open */
    if (rc) {
        snprintf(err, errcap, "%s", perr);
        kvt_cfg_free(&c);
        return rc;
    }
    char oerr[512] = "";
    rc = te->open(l2, s, &o, oerr, sizeof(oerr));
    kvt_cfg_free(&c);
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
