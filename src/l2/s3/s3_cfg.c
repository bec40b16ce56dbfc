/*
 * s3 configuration: the s3 type's keys, and nixl_store's "OBJ" form of
 * the same engine (NIXL's keys and fallbacks), into struct kvt_s3_opts:
 * the endpoint and addressing resolved, --dry-run's derived fields.
 */
#include "common/cfg.h"
#include "common/log.h"
#include "common/util.h"
#include "kvtier/error.h"
#include "l2/adapters.h"
#include "l2/s3/s3_int.h"
#include "l2/s3/s3_nixl.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* AWS wants 3..63 of a-z 0-9 . -; S3-compatible servers and legacy buckets
 * are laxer (the issue's own example is "kv"): accept what can appear in a
 * host name label or a path segment unescaped. */
static bool bucket_name_ok(const char *b)
{
    size_t n = strlen(b);
    if (n < 1 || n > 127)
        return false;
    for (const char *p = b; *p; p++)
        if (!(isalnum((unsigned char)*p) || *p == '-' || *p == '.' || *p == '_'))
            return false;
    return true;
}

/*
 * Where the bucket lives, from s3_endpoint (+ s3_bucket, s3_addressing):
 *   s3://bucket                   AWS: https://bucket.s3.<region>.amazonaws.com/<key>
 *   s3://bucket.host[:port], bucket.host[:port]
 *                                 virtual-hosted: the first label is the bucket
 *   host[:port] + s3_bucket       path style (default off AWS): host/bucket/<key>,
 *                                 or virtual with s3_addressing "virtual"
 *   http:// or https:// in front  choose the scheme (else disable_tls decides)
 */
static int resolve_endpoint(struct kvt_cfg *c, struct kvt_s3_opts *o, bool tls_explicit)
{
    const char *ep = o->endpoint;
    int kind = 0; /* 0 none, 1 s3://, 2 http://, 3 https:// */
    if (strncmp(ep, "s3://", 5) == 0)
        ep += 5, kind = 1;
    else if (strncmp(ep, "http://", 7) == 0)
        ep += 7, kind = 2;
    else if (strncmp(ep, "https://", 8) == 0)
        ep += 8, kind = 3;
    char rest[256];
    if (strlen(ep) >= sizeof(rest))
        return kvt_cfg_fail(c, "s3_endpoint", "is too long");
    snprintf(rest, sizeof(rest), "%s", ep);
    size_t rl = strlen(rest);
    while (rl && rest[rl - 1] == '/')
        rest[--rl] = 0;
    if (!rl || strchr(rest, '/') || strchr(rest, '@') || strchr(rest, ' '))
        return kvt_cfg_fail(c, "s3_endpoint",
                            "must be \"s3://<bucket>\", \"<bucket>.<host>[:port]\" or "
                            "\"[http[s]://]<host>[:port]\" with s3_bucket (got \"%s\")",
                            o->endpoint);
    bool tls = !o->disable_tls;
    if (kind == 2 || kind == 3) {
        tls = kind == 3;
        if (tls_explicit && tls == o->disable_tls)
            return kvt_cfg_fail(c, "disable_tls", "contradicts the scheme of s3_endpoint \"%s\"",
                                o->endpoint);
    }
    snprintf(o->scheme, sizeof(o->scheme), "%s", tls ? "https" : "http");
    const char *addr = o->addressing;
    if (o->bucket_opt) {
        if (!bucket_name_ok(o->bucket_opt))
            return kvt_cfg_fail(
                c, "s3_bucket",
                "must be a bucket name of letters, digits, '.', '-', '_' (got \"%s\")",
                o->bucket_opt);
        snprintf(o->bucket, sizeof(o->bucket), "%s", o->bucket_opt);
        bool aws = rl > 14 && strcmp(rest + rl - 14, ".amazonaws.com") == 0;
        o->path_style = addr ? strcmp(addr, "path") == 0 : !aws;
        if (o->path_style)
            snprintf(o->host, sizeof(o->host), "%s", rest);
        else
            snprintf(o->host, sizeof(o->host), "%.127s.%.255s", o->bucket, rest);
        return 0;
    }
    if (addr && strcmp(addr, "path") == 0)
        return kvt_cfg_fail(c, "s3_addressing",
                            "\"path\" needs \"s3_bucket\" (the endpoint is then the bare host)");
    o->path_style = false;
    if (kind == 1 && !strchr(rest, '.') && !strchr(rest, ':')) {
        if (!bucket_name_ok(rest))
            return kvt_cfg_fail(c, "s3_endpoint", "\"%s\" is not a valid bucket name", rest);
        snprintf(o->bucket, sizeof(o->bucket), "%.127s", rest);
        snprintf(o->host, sizeof(o->host), "%.127s.s3.%.63s.amazonaws.com", rest, o->region);
        return 0;
    }
    const char *dot = strchr(rest, '.');
    const char *colon = strchr(rest, ':');
    if (!dot || (colon && colon < dot))
        return kvt_cfg_fail(c, "s3_endpoint",
                            "\"%s\" does not name a bucket: add \"s3_bucket\" (and "
                            "\"s3_addressing\": \"path\" for servers such as MinIO)",
                            o->endpoint);
    snprintf(o->bucket, sizeof(o->bucket), "%.*s", (int)KVT_MIN((size_t)(dot - rest), 127), rest);
    snprintf(o->host, sizeof(o->host), "%s", rest);
    return 0;
}

static int check_prefix(struct kvt_cfg *c, const char *p)
{
    size_t n = strlen(p);
    if (n > 150)
        return kvt_cfg_fail(c, "key_prefix", "must be at most 150 bytes");
    if (p[0] == '/' || strstr(p, "//"))
        return kvt_cfg_fail(c, "key_prefix", "must not start with '/' or contain \"//\"");
    for (const char *s = p; *s; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7f || *s == '\\')
            return kvt_cfg_fail(c, "key_prefix", "must not contain control characters or '\\'");
    char tmp[160];
    snprintf(tmp, sizeof(tmp), "/%s/", p);
    if (strstr(tmp, "/./") || strstr(tmp, "/../"))
        return kvt_cfg_fail(c, "key_prefix", "must not contain \".\" or \"..\" components");
    return 0;
}

static int s3_check_opts(struct kvt_cfg *c, struct kvt_s3_opts *o, bool tls_explicit);

int kvt_s3_parse(struct kvt_cfg *c, void *opts)
{
    struct kvt_s3_opts *o = opts;
    memset(o, 0, sizeof(*o));
    static const char *const addrs[] = {"path", "virtual", NULL};
    int64_t nio = 64, thr = 3;
    /* request_timeout: no progress for this long fails a request (see
     * s3_http.c); 2 s is AWS's advice for retrying small GETs and PUTs and
     * leaves a client with a 5 s timeout (vLLM's connector) its answer */
    double cap = 0, ct = KVT_S3_CONNECT_TIMEOUT_S, rt = KVT_S3_REQUEST_TIMEOUT_S, mpu_thr = 64,
           mpu_part = 16, stale_h = 24;
    bool express = false;
    kvt_cfg_str(c, "s3_endpoint", true, NULL, &o->endpoint);
    kvt_cfg_str(c, "s3_region", true, NULL, &o->region);
    kvt_cfg_str(c, "s3_bucket", false, NULL, &o->bucket_opt);
    kvt_cfg_enum(c, "s3_addressing", false, NULL, addrs, true, &o->addressing);
    kvt_cfg_int(c, "s3_num_io_threads", false, 64, 1, 1024, &nio);
    kvt_cfg_bool(c, "s3_prefer_http2", true, &o->prefer_http2);
    kvt_cfg_bool(c, "s3_enable_s3express", false, &express);
    bool tls_explicit = kvt_cfg_has(c, "disable_tls");
    kvt_cfg_bool(c, "disable_tls", false, &o->disable_tls);
    kvt_cfg_str(c, "aws_access_key_id", false, NULL, &o->key_id);
    kvt_cfg_str(c, "aws_secret_access_key", false, NULL, &o->secret);
    kvt_cfg_str(c, "aws_session_token", false, NULL, &o->token);
    kvt_cfg_str(c, "key_prefix", false, "", &o->key_prefix);
    kvt_cfg_num(c, "connection_timeout", false, KVT_S3_CONNECT_TIMEOUT_S, 0.001, 3600, &ct);
    kvt_cfg_num(c, "request_timeout", false, KVT_S3_REQUEST_TIMEOUT_S, 0.1, 3600, &rt);
    kvt_cfg_int(c, "circuit_breaker_threshold", false, 3, 1, 1000, &thr);
    kvt_cfg_num(c, "max_capacity_gb", false, 0, 0, 1e9, &cap);
    /* S3's rules: parts of 5 MiB to 5 GiB (the last may be smaller), a
     * single PUT up to 5 GiB; an object is at most 1 GiB here */
    kvt_cfg_num(c, "s3_multipart_threshold_mb", false, 64, 5, 5120, &mpu_thr);
    kvt_cfg_num(c, "s3_multipart_part_mb", false, 16, 5, 5120, &mpu_part);
    kvt_cfg_num(c, "s3_stale_upload_hours", false, 24, 0, 87600, &stale_h);
    if (c->rc)
        return c->rc;
    o->mpu_threshold = (uint64_t)(mpu_thr * KVT_MIB);
    o->mpu_part = (uint64_t)(mpu_part * KVT_MIB);
    o->stale_upload_s = stale_h * 3600;
    /* the secrets are read but never echoed by --dry-run */
    if (o->secret)
        json_object_set_new(c->resolved, "aws_secret_access_key", json_string("<set>"));
    if (o->token)
        json_object_set_new(c->resolved, "aws_session_token", json_string("<set>"));
    o->num_io_threads = (int)nio;
    o->breaker_threshold = (int)thr;
    o->connection_timeout = ct;
    o->request_timeout = rt;
    o->max_capacity_bytes = (uint64_t)(cap * KVT_GIB);
    if (express)
        return kvt_cfg_unsupported(c, "s3_enable_s3express",
                                   "is not supported by this build: S3 Express One Zone needs "
                                   "CreateSession credentials, which kvtier does not implement "
                                   "(use a general-purpose bucket)");
    return s3_check_opts(c, o, tls_explicit);
}

/* What both config forms share once their keys are read: region, credentials
 * and prefix checks, the endpoint resolved, --dry-run's derived fields. */
static int s3_check_opts(struct kvt_cfg *c, struct kvt_s3_opts *o, bool tls_explicit)
{
    if (!o->region[0])
        return kvt_cfg_fail(c, "s3_region", "must not be empty");
    for (const char *p = o->region; *p; p++)
        if (!(islower((unsigned char)*p) || isdigit((unsigned char)*p) || *p == '-'))
            return kvt_cfg_fail(c, "s3_region", "must look like \"us-east-1\" (got \"%s\")",
                                o->region);
    if (!o->key_id != !o->secret)
        return kvt_cfg_fail(c, o->key_id ? "aws_secret_access_key" : "aws_access_key_id",
                            "is required with %s (give both, or neither to use the "
                            "environment or ~/.aws/credentials)",
                            o->key_id ? "aws_access_key_id" : "aws_secret_access_key");
    if ((o->key_id && (strlen(o->key_id) >= 128 || strlen(o->secret) >= 128)) ||
        (o->token && strlen(o->token) >= 2048))
        return kvt_cfg_fail(c, "aws_access_key_id", "or its secret/token is too long");
    if (check_prefix(c, o->key_prefix))
        return c->rc;
    if (resolve_endpoint(c, o, tls_explicit))
        return c->rc;
    json_object_set_new(c->resolved, "s3_bucket", json_string(o->bucket));
    json_object_set_new(c->resolved, "s3_addressing",
                        json_string(o->path_style ? "path" : "virtual"));
    char url[600];
    snprintf(url, sizeof(url), "%s://%s%s%s/", o->scheme, o->host, o->path_style ? "/" : "",
             o->path_style ? o->bucket : "");
    json_object_set_new(c->resolved, "endpoint_url", json_string(url));
    return 0;
}

/*
 * nixl_store {"backend": "OBJ"}: NIXL's object plugin is S3 (aws-sdk-cpp),
 * so the s3 engine serves it, with NIXL's keys in backend_params and NIXL's
 * fallbacks (its src/plugins/obj/README.md):
 *   bucket             else $AWS_DEFAULT_BUCKET (required)
 *   endpoint_override  "[http[s]://]host[:port]", else $AWS_ENDPOINT_URL_S3 or
 *                      $AWS_ENDPOINT_URL (the SDK's names), else AWS
 *   scheme             http | https (https); a scheme in the endpoint wins
 *   region             else $AWS_REGION, $AWS_DEFAULT_REGION, else us-east-1
 *   use_virtual_addressing  "true"/"false" (false, NIXL's default: path style;
 *                      on AWS without an endpoint: virtual)
 *   access_key, secret_key, session_token  else the environment / credentials file
 *   req_checksum       required | supported: accepted; the object header's
 *                      checksum guards every byte anyway
 *   create_bucket      "true" is refused: create the bucket first
 * pool_size (NIXL's descriptors in flight) becomes s3_num_io_threads.
 */
static int nixl_obj_parse(struct kvt_cfg *c, struct kvt_s3_opts *o)
{
    static const char *const schemes[] = {"http", "https", NULL};
    static const char *const cks[] = {"required", "supported", NULL};
    struct kvt_cfg bp;
    if (kvt_cfg_sub(c, "backend_params", false, &bp)) {
        kvt_cfg_free(&bp);
        return c->rc;
    }
    const char *scheme = NULL, *ep = NULL, *ck = NULL;
    bool virt = false, create = false;
    kvt_cfg_str(&bp, "access_key", false, NULL, &o->key_id);
    kvt_cfg_str(&bp, "secret_key", false, NULL, &o->secret);
    kvt_cfg_str(&bp, "session_token", false, NULL, &o->token);
    kvt_cfg_str(&bp, "bucket", false, NULL, &o->bucket_opt);
    kvt_cfg_str(&bp, "endpoint_override", false, NULL, &ep);
    kvt_cfg_enum(&bp, "scheme", false, "https", schemes, false, &scheme);
    kvt_cfg_str(&bp, "region", false, NULL, &o->region);
    bool virt_given = kvt_cfg_has(&bp, "use_virtual_addressing");
    kvt_cfg_bool(&bp, "use_virtual_addressing", false, &virt);
    kvt_cfg_enum(&bp, "req_checksum", false, NULL, cks, false, &ck);
    kvt_cfg_bool(&bp, "create_bucket", false, &create);
    if (!bp.rc && o->secret)
        json_object_set_new(bp.resolved, "secret_key", json_string("<set>"));
    if (!bp.rc && o->token)
        json_object_set_new(bp.resolved, "session_token", json_string("<set>"));
    if (!bp.rc && create)
        kvt_cfg_unsupported(&bp, "create_bucket",
                            "\"true\" is not supported: create the bucket first (kvtier "
                            "never creates or deletes buckets)");
    if (!bp.rc && !o->key_id != !o->secret)
        kvt_cfg_fail(&bp, o->key_id ? "secret_key" : "access_key",
                     "is required with %s (give both, or neither to use the environment or "
                     "~/.aws/credentials)",
                     o->key_id ? "access_key" : "secret_key");
    if (!bp.rc && !o->bucket_opt) {
        o->bucket_opt = getenv("AWS_DEFAULT_BUCKET");
        if (!o->bucket_opt || !o->bucket_opt[0])
            kvt_cfg_missing(&bp, "bucket",
                            "is required (or AWS_DEFAULT_BUCKET in the environment)");
    }
    if (!bp.rc && !bucket_name_ok(o->bucket_opt))
        kvt_cfg_fail(&bp, "bucket",
                     "must be a bucket name of letters, digits, '.', '-', '_' (got \"%s\")",
                     o->bucket_opt);
    if (!bp.rc && !ep) {
        ep = getenv("AWS_ENDPOINT_URL_S3");
        if (!ep || !ep[0])
            ep = getenv("AWS_ENDPOINT_URL");
        if (ep && !ep[0])
            ep = NULL;
    }
    if (!bp.rc && ep) {
        const char *h = strstr(ep, "://");
        h = h ? h + 3 : ep;
        size_t hl = strlen(h);
        while (hl && h[hl - 1] == '/')
            hl--;
        bool scheme_ok = strstr(ep, "://") == NULL || strncmp(ep, "http://", 7) == 0 ||
                         strncmp(ep, "https://", 8) == 0;
        if (!scheme_ok || !hl || memchr(h, '/', hl) || memchr(h, '@', hl) || hl > 250)
            kvt_cfg_fail(&bp, "endpoint_override",
                         "must be \"[http[s]://]<host>[:port]\" (got \"%s\")", ep);
    }
    if (!bp.rc) {
        if (!o->region) {
            o->region = getenv("AWS_REGION");
            if (!o->region || !o->region[0])
                o->region = getenv("AWS_DEFAULT_REGION");
            if (!o->region || !o->region[0])
                o->region = "us-east-1";
        }
        json_object_set_new(bp.resolved, "region", json_string(o->region));
        json_object_set_new(bp.resolved, "bucket", json_string(o->bucket_opt));
        kvt_cfg_finish(&bp);
    }
    kvt_cfg_sub_done(c, "backend_params", &bp);
    if (kvt_s3_nixl_common(c, o))
        return c->rc;
    o->mpu_threshold = 64ull << 20;
    o->stale_upload_s = 24 * 3600;
    o->addressing = virt ? "virtual" : "path";
    if (ep) {
        /* a scheme in the endpoint decides; else NIXL's "scheme" key */
        bool has_scheme = strstr(ep, "://") != NULL;
        snprintf(o->ep_buf, sizeof(o->ep_buf), "%s%s", has_scheme ? "" : scheme,
                 has_scheme ? ep : "://");
        if (!has_scheme)
            snprintf(o->ep_buf + strlen(o->ep_buf), sizeof(o->ep_buf) - strlen(o->ep_buf), "%s",
                     ep);
    } else {
        /* AWS itself: https://<bucket>.s3.<region>.amazonaws.com, unless
         * use_virtual_addressing is "false" */
        snprintf(o->ep_buf, sizeof(o->ep_buf), "https://s3.%s.amazonaws.com", o->region);
        if (!virt_given)
            o->addressing = "virtual";
    }
    o->endpoint = o->ep_buf;
    json_object_set_new(c->resolved, "served_by", json_string("s3"));
    return s3_check_opts(c, o, false);
}

int kvt_s3_nixl_common(struct kvt_cfg *c, struct kvt_s3_opts *o)
{
    int64_t ps = 0;
    double cap = 0;
    kvt_cfg_int(c, "pool_size", true, 0, 1, 1 << 24, &ps);
    kvt_cfg_num(c, "max_capacity_gb", false, 0, 0, 1e9, &cap);
    kvt_cfg_str(c, "key_prefix", false, "", &o->key_prefix);
    if (c->rc)
        return c->rc;
    o->num_io_threads = (int)KVT_MIN(ps, 1024);
    o->max_capacity_bytes = (uint64_t)(cap * KVT_GIB);
    o->prefer_http2 = true;
    o->connection_timeout = KVT_S3_CONNECT_TIMEOUT_S;
    o->request_timeout = KVT_S3_REQUEST_TIMEOUT_S;
    o->breaker_threshold = 3;
    o->mpu_part = 16ull << 20;
    return 0;
}

int kvt_s3_parse_nixl_obj(struct kvt_cfg *c, void **opts)
{
    struct kvt_s3_opts *o = kvt_xcalloc(1, sizeof(*o));
    *opts = o;
    return nixl_obj_parse(c, o);
}

void kvt_s3_nixl_obj_free(void *opts)
{
    free(opts);
}

/* "shared_budget": the record is an object in the bucket, written with
 * conditional PUTs (s3_budget.c); Azure Blob keeps none yet. */
int kvt_s3_nixl_obj_shared_budget(struct kvt_cfg *c, const void *opts)
{
    const struct kvt_s3_opts *o = opts;
    if (o->azure)
        return kvt_cfg_unsupported(
            c, "shared_budget",
            "is not available for Azure Blob yet (its record would need Azure's conditional "
            "headers, not written): share a budget through a bucket (s3), a directory (fs or "
            "nixl_store_dynamic with \"shared\": true) or Redis (resp, valkey), or give one "
            "server the container's cap");
    return 0;
}
