/*
 * The HTTP admin API (docs/operations.md, "The admin API"): /admin/...
 * beside /status and /metrics, on the same libmicrohttpd daemon (a thread
 * per connection, so a long delete does not hold up /metrics). Requests
 * and replies are JSON; this file checks the credential, reads the
 * request, calls the core's admin calls (core/admin.h) and renders the
 * answer. Routes are one table.
 *
 * Who may call it (docs/security.md): with --admin-token, only a request
 * with "Authorization: Bearer <that token>"; without it, only requests
 * from loopback, and none at all while authentication is on (--auth-key).
 * Bad input is a 4xx with {"error": "...", "field": "..."} and changes
 * nothing.
 */
#include "common/log.h"
#include "common/secret.h"
#include "common/util.h"
#include "core/admin.h"
#include "kvtier/error.h"
#include "server/internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define BODY_MAX (8u << 20) /* a request body: 65,536 keys of 64 hex digits fit */

struct body {
    char *p;
    size_t len;
    bool too_big;
};

struct req {
    struct kvt_server *s;
    struct MHD_Connection *c;
    const char *method;
    json_t *body; /* parsed body (POST/PUT), or NULL */
    char err[1024];
    char field[128]; /* the field err is about, or "" (a copy: the body goes first) */
};

static enum MHD_Result send_json(struct MHD_Connection *c, unsigned status, json_t *o)
{
    char *text = json_dumps(o, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(15));
    json_decref(o);
    size_t len = strlen(text);
    text = kvt_xrealloc(text, len + 2);
    text[len++] = '\n';
    text[len] = 0;
    struct MHD_Response *r = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(r, "Content-Type", "application/json");
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result send_error(struct MHD_Connection *c, unsigned status, const char *msg,
                                  const char *field, json_t *detail)
{
    json_t *o = detail && json_is_object(detail) ? detail : json_object();
    if (detail && o != detail)
        json_decref(detail);
    json_object_set_new(o, "error", json_string(msg));
    if (field)
        json_object_set_new(o, "field", json_string(field));
    return send_json(c, status, o);
}

/* The HTTP status of an admin call's error. */
static unsigned status_of(int rc)
{
    switch (rc) {
    case -EINVAL:
        return MHD_HTTP_BAD_REQUEST;
    case -ENOENT:
        return MHD_HTTP_NOT_FOUND;
    case -EOVERFLOW:
    case -ENOTSUP:
    case -ENOSPC:
        return MHD_HTTP_CONFLICT;
    case -EBUSY:
        return MHD_HTTP_SERVICE_UNAVAILABLE;
    default:
        return MHD_HTTP_INTERNAL_SERVER_ERROR;
    }
}

static int bad(struct req *q, const char *field, const char *fmt, const char *v)
{
    snprintf(q->err, sizeof(q->err), fmt, v);
    snprintf(q->field, sizeof(q->field), "%s", field ? field : "");
    return -EINVAL;
}

/* ---------------------------------------------------------- credential */

static bool peer_loopback(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (!ci || !ci->client_addr)
        return false;
    const struct sockaddr *sa = ci->client_addr;
    if (sa->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    if (sa->sa_family == AF_INET6)
        return IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)sa)->sin6_addr);
    return false;
}

/* 0 when the request may use the admin API, else the HTTP status with why. */
static unsigned admin_allowed(struct kvt_server *s, struct MHD_Connection *c, const char **why)
{
    const struct kvt_server_cfg *cfg = s->cfg;
    if (cfg->admin_token[0]) {
        const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
        if (h && !strncasecmp(h, "Bearer ", 7)) {
            h += 7;
            while (*h == ' ')
                h++;
            if (kvt_secret_equal(h, cfg->admin_token))
                return 0;
        }
        *why = "the admin API needs Authorization: Bearer <the --admin-token token>";
        return MHD_HTTP_UNAUTHORIZED;
    }
    if (cfg->auth) {
        *why = "authentication is on and the server has no --admin-token: the admin API is closed";
        return MHD_HTTP_FORBIDDEN;
    }
    if (!peer_loopback(c)) {
        *why = "without --admin-token the admin API answers loopback clients only";
        return MHD_HTTP_FORBIDDEN;
    }
    return 0;
}

/* ---------------------------------------------------------------- keys */

/* Keys from {"model", "salt", "kv_rank", "group", "hashes": [hex]} or
 * {"names": [listed names]} under field; *n keys to free(). */
static int read_keys(struct req *q, const json_t *v, const char *field, kvt_key **out, uint32_t *n)
{
    *out = NULL;
    *n = 0;
    if (!json_is_object(v))
        return bad(q, field,
                   "%s must be an object {model, salt, kv_rank, group, hashes} or "
                   "{names}",
                   field);
    const json_t *names = json_object_get(v, "names"), *hashes = json_object_get(v, "hashes");
    const char *k;
    json_t *x;
    json_object_foreach((json_t *)v, k, x)
    {
        static const char *const known[] = {"names", "model", "salt", "kv_rank", "group", "hashes"};
        bool ok = false;
        for (size_t i = 0; i < KVT_ARRAY_LEN(known); i++)
            ok |= strcmp(k, known[i]) == 0;
        if (!ok)
            return bad(q, field,
                       "unknown field \"%s\" (known: model, salt, kv_rank, group, "
                       "hashes; or names)",
                       k);
    }
    if (!!names == !!hashes)
        return bad(q, field, "%s needs either \"hashes\" (with \"model\") or \"names\"", field);
    const json_t *arr = names ? names : hashes;
    size_t cnt = json_array_size(arr);
    if (!json_is_array(arr) || cnt == 0 || cnt > KVT_ADMIN_MAX_KEYS)
        return bad(q, field, "%s: a non-empty list of at most 65536 is needed", field);
    kvt_key *keys = kvt_xcalloc(cnt, sizeof(kvt_key));
    if (names) {
        for (size_t i = 0; i < cnt; i++) {
            const char *nm = json_string_value(json_array_get(arr, i));
            char file[KVT_NAME_MAX + 8];
            if (!nm || strlen(nm) > KVT_NAME_MAX ||
                (snprintf(file, sizeof(file), "%s.bin", nm),
                 kvt_key_decode(KVT_CODEC_NIXL, file, strlen(file), &keys[i]))) {
                free(keys);
                return bad(q, field, "names: '%.300s' is not an object name (as listed)",
                           nm ? nm : "(not a string)");
            }
        }
    } else {
        const json_t *m = json_object_get(v, "model"), *s = json_object_get(v, "salt");
        const json_t *r = json_object_get(v, "kv_rank"), *g = json_object_get(v, "group");
        const char *why = "";
        uint32_t ns = 0;
        if (!json_is_string(m) || (s && !json_is_string(s)) ||
            (r && (!json_is_integer(r) || json_integer_value(r) < 0 ||
                   json_integer_value(r) > UINT32_MAX)) ||
            (g && (!json_is_integer(g) || json_integer_value(g) < 0 ||
                   json_integer_value(g) > UINT32_MAX))) {
            free(keys);
            return bad(q, field,
                       "%s: model (string), salt (string), kv_rank and group "
                       "(integers >= 0) are expected",
                       field);
        }
        const char *salt = s ? json_string_value(s) : "";
        if (kvt_ns_intern(json_string_value(m), strlen(json_string_value(m)), salt, strlen(salt),
                          &ns, &why)) {
            free(keys);
            return bad(q, field, "invalid model or salt: %s", why);
        }
        for (size_t i = 0; i < cnt; i++) {
            const char *h = json_string_value(json_array_get(arr, i));
            uint8_t bin[KVT_HASH_MAX];
            size_t hl = h ? strlen(h) : 0;
            bool ok = h && hl && hl % 2 == 0 && hl <= 2 * KVT_HASH_MAX;
            for (size_t j = 0; ok && j < hl / 2; j++) {
                int hi = kvt_hexval(h[2 * j]), lo = kvt_hexval(h[2 * j + 1]);
                ok = hi >= 0 && lo >= 0;
                if (ok)
                    bin[j] = (uint8_t)(hi << 4 | lo);
            }
            if (!ok ||
                kvt_key_make(&keys[i], ns, bin, hl / 2, r ? (uint32_t)json_integer_value(r) : 0,
                             g ? (uint32_t)json_integer_value(g) : 0)) {
                free(keys);
                return bad(q, field, "hashes: '%.100s' is not 1 to 32 bytes of hex",
                           h ? h : "(not a string)");
            }
        }
    }
    *out = keys;
    *n = (uint32_t)cnt;
    return 0;
}

/* The body's fields must be among known (NULL-terminated). */
static int only(struct req *q, const char *const *known)
{
    const char *k;
    json_t *x;
    json_object_foreach(q->body, k, x)
    {
        bool ok = false;
        for (size_t i = 0; known[i]; i++)
            ok |= strcmp(k, known[i]) == 0;
        if (!ok)
            return bad(q, k, "unknown field \"%s\"", k);
    }
    return 0;
}

static const char *arg(struct req *q, const char *name)
{
    return MHD_lookup_connection_value(q->c, MHD_GET_ARGUMENT_KIND, name);
}

/* An optional tier ("l1", an adapter name) in v: *tier, or KVT_ADMIN_ALL. */
static int read_tier(struct req *q, const char *v, bool l2_only, int *tier)
{
    *tier = KVT_ADMIN_ALL;
    if (!v)
        return 0;
    int t = kvt_admin_tier(q->s->admin, v);
    if (t == -ENOENT || (l2_only && t == KVT_ADMIN_L1))
        return bad(q, "tier",
                   "unknown tier '%.100s' (l1, or an L2 adapter's name as /status "
                   "lists it)",
                   v);
    *tier = t;
    return 0;
}

static const char *str_field(struct req *q, const char *name, int *rc)
{
    const json_t *v = json_object_get(q->body, name);
    if (v && !json_is_string(v))
        *rc = bad(q, name, "\"%s\" must be a string", name);
    return v ? json_string_value(v) : NULL;
}

/* ---------------------------------------------------------- the routes */

static int h_objects(struct req *q, json_t **out)
{
    struct kvt_admin_filter f = {.model = arg(q, "model"),
                                 .salt = arg(q, "salt"),
                                 .ns = arg(q, "namespace"),
                                 .prefix = arg(q, "prefix")};
    int rc = read_tier(q, arg(q, "tier"), false, &f.tier);
    if (rc)
        return rc;
    if (f.ns && !kvt_admin_ns_known(f.ns)) {
        snprintf(q->err, sizeof(q->err),
                 "unknown namespace '%.200s': this server has never seen it", f.ns);
        snprintf(q->field, sizeof(q->field), "namespace");
        return -ENOENT;
    }
    const char *l = arg(q, "limit");
    long limit = 1000;
    if (l) {
        char *end;
        limit = strtol(l, &end, 10);
        if (*end || limit < 1 || limit > KVT_ADMIN_MAX_LIST)
            return bad(q, "limit", "limit must be 1 to 10000, got '%.50s'", l);
    }
    return kvt_admin_list(q->s->admin, &f, arg(q, "cursor"), (uint32_t)limit, out, q->err,
                          sizeof(q->err));
}

static int h_delete(struct req *q, json_t **out)
{
    static const char *const known[] = {"keys", "prefix", NULL};
    int rc = only(q, known);
    const char *prefix = str_field(q, "prefix", &rc);
    const json_t *keys = json_object_get(q->body, "keys");
    if (rc)
        return rc;
    if (!!prefix == !!keys)
        return bad(q, "keys", "%s", "give either \"keys\" or \"prefix\"");
    if (prefix) {
        if (!prefix[0])
            return bad(q, "prefix", "%s", "an empty prefix would match everything: use clear");
        return kvt_admin_delete_prefix(q->s->admin, prefix, out, q->err, sizeof(q->err));
    }
    kvt_key *k;
    uint32_t n;
    if ((rc = read_keys(q, keys, "keys", &k, &n)))
        return rc;
    rc = kvt_admin_delete(q->s->admin, k, n, out, q->err, sizeof(q->err));
    free(k);
    return rc;
}

static int h_clear(struct req *q, json_t **out)
{
    static const char *const known[] = {"tier", NULL};
    int rc = only(q, known), tier;
    const char *t = str_field(q, "tier", &rc);
    if (rc)
        return rc;
    if (!t)
        return bad(q, "tier", "%s", "\"tier\" is required (l1, or an L2 adapter's name)");
    if ((rc = read_tier(q, t, false, &tier)))
        return rc;
    return kvt_admin_clear(q->s->admin, tier, out, q->err, sizeof(q->err));
}

static int h_quotas_get(struct req *q, json_t **out)
{
    int tier, rc = read_tier(q, arg(q, "adapter"), true, &tier);
    if (rc)
        return rc;
    const char *name = arg(q, "name");
    if (name)
        return kvt_admin_quota_get(q->s->admin, name, tier, out, q->err, sizeof(q->err));
    *out = json_object();
    for (int i = 0; i < kvt_core_nl2(q->s->core); i++)
        if (tier == KVT_ADMIN_ALL || tier == i) {
            kvt_l2 *l2 = kvt_core_l2(q->s->core, i);
            json_object_set_new(*out, kvt_l2_name(l2), kvt_l2_quotas(l2));
        }
    return 0;
}

static int h_quotas_put(struct req *q, json_t **out)
{
    static const char *const known[] = {"name", "max_bytes", "max_gb", "adapter", NULL};
    int rc = only(q, known), tier;
    const char *name = str_field(q, "name", &rc), *ad = str_field(q, "adapter", &rc);
    if (rc || (rc = read_tier(q, ad, true, &tier)))
        return rc;
    if (!name)
        return bad(q, "name", "%s", "\"name\" is required (a namespace, a model, or @SALT)");
    const json_t *mb = json_object_get(q->body, "max_bytes"),
                 *mg = json_object_get(q->body, "max_gb");
    if (!!mb == !!mg)
        return bad(q, "max_bytes", "%s", "give exactly one of \"max_bytes\" and \"max_gb\"");
    uint64_t bytes;
    if (mb) {
        if (!json_is_integer(mb) || json_integer_value(mb) < 0 ||
            json_integer_value(mb) > (json_int_t)1 << 53)
            return bad(q, "max_bytes", "%s", "\"max_bytes\" must be an integer from 0 to 2^53");
        bytes = (uint64_t)json_integer_value(mb);
    } else {
        double g = json_number_value(mg);
        if (!json_is_number(mg) || !isfinite(g) || g < 0 || g > 1e9)
            return bad(q, "max_gb", "%s", "\"max_gb\" must be a number of GiB from 0 to 1e9");
        bytes = (uint64_t)(g * (double)KVT_GIB);
    }
    return kvt_admin_quota_set(q->s->admin, name, bytes, tier, out, q->err, sizeof(q->err));
}

static int h_quotas_delete(struct req *q, json_t **out)
{
    int tier, rc = read_tier(q, arg(q, "adapter"), true, &tier);
    if (rc)
        return rc;
    const char *name = arg(q, "name");
    if (!name)
        return bad(q, "name", "%s", "?name= is required");
    return kvt_admin_quota_del(q->s->admin, name, tier, out, q->err, sizeof(q->err));
}

static int keys_call(struct req *q, json_t **out,
                     int (*fn)(struct kvt_admin *, const kvt_key *, uint32_t, json_t **, char *,
                               size_t))
{
    static const char *const known[] = {"keys", NULL};
    int rc = only(q, known);
    if (rc)
        return rc;
    kvt_key *k;
    uint32_t n;
    if ((rc = read_keys(q, json_object_get(q->body, "keys"), "keys", &k, &n)))
        return rc;
    rc = fn(q->s->admin, k, n, out, q->err, sizeof(q->err));
    free(k);
    return rc;
}

static int h_pin(struct req *q, json_t **out)
{
    return keys_call(q, out, kvt_admin_pin);
}

static int h_unpin(struct req *q, json_t **out)
{
    return keys_call(q, out, kvt_admin_unpin);
}

static int h_pins(struct req *q, json_t **out)
{
    *out = kvt_admin_pins(q->s->admin);
    return 0;
}

static int h_warm(struct req *q, json_t **out)
{
    static const char *const known[] = {"keys", "namespace", NULL};
    int rc = only(q, known);
    const char *ns = str_field(q, "namespace", &rc);
    const json_t *keys = json_object_get(q->body, "keys");
    if (rc)
        return rc;
    if (!!ns == !!keys)
        return bad(q, "keys", "%s", "give either \"keys\" or \"namespace\"");
    kvt_key *k = NULL;
    uint32_t n = 0;
    if (keys && (rc = read_keys(q, keys, "keys", &k, &n)))
        return rc;
    rc = kvt_admin_warm(q->s->admin, k, n, ns, out, q->err, sizeof(q->err));
    if (rc == -ENOENT)
        snprintf(q->field, sizeof(q->field), "namespace");
    free(k);
    return rc;
}

static int h_verify(struct req *q, json_t **out)
{
    static const char *const known[] = {"tier", "namespace", NULL};
    int rc = only(q, known), tier;
    const char *ns = str_field(q, "namespace", &rc), *t = str_field(q, "tier", &rc);
    if (rc || (rc = read_tier(q, t, true, &tier)))
        return rc;
    rc = kvt_admin_verify(q->s->admin, tier, ns, out, q->err, sizeof(q->err));
    if (rc == -ENOENT)
        snprintf(q->field, sizeof(q->field), "namespace");
    return rc;
}

static int h_jobs(struct req *q, json_t **out)
{
    json_t *st = kvt_admin_status(q->s->admin);
    *out = json_object();
    json_object_set(*out, "jobs", json_object_get(st, "jobs"));
    json_decref(st);
    return 0;
}

/* One route: method, path (exact, or a prefix ending in '/' for an id),
 * handler, whether it changes data (counted and logged), whether a job
 * is started (202). */
struct route {
    const char *method, *path;
    int (*fn)(struct req *q, json_t **out);
    bool body;     /* reads a JSON body */
    bool accepted; /* answers 202: a job was queued */
};

static const struct route routes[] = {
    {"GET", "/admin/objects", h_objects, false, false},
    {"POST", "/admin/delete", h_delete, true, false},
    {"POST", "/admin/clear", h_clear, true, false},
    {"GET", "/admin/quotas", h_quotas_get, false, false},
    {"PUT", "/admin/quotas", h_quotas_put, true, false},
    {"DELETE", "/admin/quotas", h_quotas_delete, false, false},
    {"POST", "/admin/pin", h_pin, true, false},
    {"POST", "/admin/unpin", h_unpin, true, false},
    {"GET", "/admin/pins", h_pins, false, false},
    {"POST", "/admin/warm", h_warm, true, true},
    {"POST", "/admin/verify", h_verify, true, true},
    {"GET", "/admin/jobs", h_jobs, false, false},
};

static enum MHD_Result h_job(struct kvt_server *s, struct MHD_Connection *c, const char *id)
{
    char *end;
    unsigned long long v = strtoull(id, &end, 10);
    json_t *o = *id && !*end ? kvt_admin_job(s->admin, v) : NULL;
    if (!o)
        return send_error(c, MHD_HTTP_NOT_FOUND, "no such job", "id", NULL);
    return send_json(c, MHD_HTTP_OK, o);
}

static enum MHD_Result dispatch(struct kvt_server *s, struct MHD_Connection *c, const char *url,
                                const char *method, struct body *b)
{
    if (!strncmp(url, "/admin/jobs/", 12) && !strcmp(method, "GET"))
        return h_job(s, c, url + 12);
    const struct route *rt = NULL;
    bool path_known = false;
    for (size_t i = 0; i < KVT_ARRAY_LEN(routes); i++)
        if (!strcmp(url, routes[i].path)) {
            path_known = true;
            if (!strcmp(method, routes[i].method))
                rt = &routes[i];
        }
    if (!rt) {
        atomic_fetch_add(&s->admin_bad, 1);
        return send_error(c, path_known ? MHD_HTTP_METHOD_NOT_ALLOWED : MHD_HTTP_NOT_FOUND,
                          path_known ? "method not allowed on this path"
                                     : "no such admin endpoint (docs/operations.md)",
                          NULL, NULL);
    }
    struct req q = {.s = s, .c = c, .method = method};
    if (rt->body) {
        json_error_t je;
        if (b->too_big) {
            atomic_fetch_add(&s->admin_bad, 1);
            return send_error(c, 413, "request body over 8 MiB", NULL, NULL);
        }
        q.body = b->len ? json_loadb(b->p, b->len, JSON_REJECT_DUPLICATES, &je) : NULL;
        if (!q.body || !json_is_object(q.body)) {
            char msg[300];
            snprintf(msg, sizeof(msg), "the body must be a JSON object%s%s", q.body ? "" : ": ",
                     q.body ? "" : (b->len ? je.text : "none was sent"));
            json_decref(q.body);
            atomic_fetch_add(&s->admin_bad, 1);
            return send_error(c, MHD_HTTP_BAD_REQUEST, msg, NULL, NULL);
        }
    }
    json_t *out = NULL;
    int rc = rt->fn(&q, &out);
    json_decref(q.body);
    if (rc) {
        if (rc == -EINVAL)
            atomic_fetch_add(&s->admin_bad, 1);
        kvt_info("admin: %s %s refused: %s", method, url, q.err);
        return send_error(c, status_of(rc), q.err[0] ? q.err : kvt_strerror(rc),
                          q.field[0] ? q.field : NULL, out);
    }
    return send_json(c, rt->accepted ? MHD_HTTP_ACCEPTED : MHD_HTTP_OK, out);
}

int kvt_admin_http(struct kvt_server *s, struct MHD_Connection *c, const char *url,
                   const char *method, const char *upload, size_t *upload_size, void **con_cls)
{
    struct body *b = *con_cls;
    if (!b) { /* the headers: check the caller first, before any body is read */
        const char *why = NULL;
        unsigned st = admin_allowed(s, c, &why);
        if (st) {
            atomic_fetch_add(&s->admin_denied, 1);
            kvt_warn("admin: %s %s refused (%u): %s", method, url, st, why);
            return send_error(c, st, why, NULL, NULL);
        }
        if (!s->admin)
            return send_error(c, MHD_HTTP_SERVICE_UNAVAILABLE, "starting", NULL, NULL);
        *con_cls = b = kvt_xcalloc(1, sizeof(*b));
        return MHD_YES;
    }
    if (*upload_size) {
        if (b->len + *upload_size > BODY_MAX) {
            b->too_big = true;
        } else {
            b->p = kvt_xrealloc(b->p, b->len + *upload_size + 1);
            memcpy(b->p + b->len, upload, *upload_size);
            b->len += *upload_size;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    return dispatch(s, c, url, method, b);
}

void kvt_admin_http_done(void *con_cls)
{
    struct body *b = con_cls;
    if (b)
        free(b->p);
    free(b);
}
