/*
 * nixl_store {"backend": "AZURE_BLOB"}: NIXL's Azure Blob plugin, served by
 * the s3 engine in Azure's REST dialect (e->azure: x-ms-* headers, Shared
 * Key or SAS, Put Blob as a block blob, List Blobs; s3_http.c, s3.c and s3_list.c).
 * backend_params, with NIXL's names and fallbacks (its
 * src/plugins/azure_blob/README.md):
 *   account_url     else $AZURE_STORAGE_ACCOUNT_URL: "https://<account>.blob.core.windows.net",
 *                   or an emulator's "http://127.0.0.1:10000/<account>" (the
 *                   account is then the first path segment, as Azurite has it)
 *   container_name  else $AZURE_STORAGE_CONTAINER_NAME
 *   ca_bundle       accepted: curl uses the system's CA store
 * and two of kvtier's, since NIXL's Entra ID chain is not available here:
 *   account_key     else $AZURE_STORAGE_KEY (Shared Key)
 *   sas_token       else $AZURE_STORAGE_SAS_TOKEN (a SAS, with or without '?')
 * pool_size becomes s3_num_io_threads. A blob holds at most 1 GiB here, below
 * Put Blob's 5000 MiB limit: no block lists.
 */
#include "common/cfg.h"
#include "common/util.h"
#include "kvtier/error.h"
#include "l2/adapters.h"
#include "l2/s3/s3_int.h"
#include "l2/s3/s3_nixl.h"
#include "l2/s3/sigv4.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool container_ok(const char *c)
{
    size_t n = strlen(c);
    if (n < 3 || n > 63 || c[0] == '-' || c[n - 1] == '-')
        return false;
    for (const char *p = c; *p; p++)
        if (!(islower((unsigned char)*p) || isdigit((unsigned char)*p) ||
              (*p == '-' && p[1] != '-')))
            return false;
    return true;
}

static const char *param_or_env(const char *v, const char *env)
{
    if (v)
        return v;
    const char *e = getenv(env);
    return e && e[0] ? e : NULL;
}

/* account_url -> scheme, host, account, base path. */
static int parse_account_url(struct kvt_cfg *bp, const char *url, const char *container,
                             struct kvt_s3_opts *o)
{
    const char *h = NULL;
    if (strncmp(url, "https://", 8) == 0)
        h = url + 8, snprintf(o->scheme, sizeof(o->scheme), "https");
    else if (strncmp(url, "http://", 7) == 0)
        h = url + 7, snprintf(o->scheme, sizeof(o->scheme), "http");
    const char *slash = h ? strchr(h, '/') : NULL;
    size_t hl = h ? (slash ? (size_t)(slash - h) : strlen(h)) : 0;
    bool host_ok = hl > 0 && hl < sizeof(o->host);
    for (size_t i = 0; host_ok && i < hl; i++)
        host_ok = isalnum((unsigned char)h[i]) || strchr("-.:[]", h[i]);
    if (!host_ok)
        return kvt_cfg_fail(bp, "account_url",
                            "must be \"https://<account>.blob.core.windows.net\" or an "
                            "emulator's \"http://<host>:<port>/<account>\" (got \"%s\")",
                            url);
    snprintf(o->host, sizeof(o->host), "%.*s", (int)hl, h);
    char seg[sizeof(o->az_account)] = "";
    if (slash) {
        const char *s = slash + 1, *e = strchr(s, '/');
        size_t sl = e ? (size_t)(e - s) : strlen(s);
        if (sl >= sizeof(o->az_account) || (e && e[1]))
            return kvt_cfg_fail(bp, "account_url",
                                "may have one path segment, the account (got \"%s\")", url);
        snprintf(seg, sizeof(seg), "%.*s", (int)sl, s);
    }
    if (seg[0]) { /* emulator form: the account in the path */
        snprintf(o->az_account, sizeof(o->az_account), "%s", seg);
        snprintf(o->az_base, sizeof(o->az_base), "/%s/%s", seg, container);
    } else {
        const char *dot = memchr(o->host, '.', hl);
        size_t al = dot ? (size_t)(dot - o->host) : 0;
        if (!al || al >= sizeof(o->az_account))
            return kvt_cfg_fail(bp, "account_url",
                                "does not name an account (\"https://<account>.blob.core."
                                "windows.net\"; got \"%s\")",
                                url);
        snprintf(o->az_account, sizeof(o->az_account), "%.*s", (int)al, o->host);
        snprintf(o->az_base, sizeof(o->az_base), "/%s", container);
    }
    for (const char *p = o->az_account; *p; p++)
        if (!isalnum((unsigned char)*p))
            return kvt_cfg_fail(bp, "account_url",
                                "names account \"%s\": an account is letters and digits",
                                o->az_account);
    return 0;
}

int kvt_s3_parse_nixl_azure(struct kvt_cfg *c, void **opts)
{
    struct kvt_s3_opts *o = kvt_xcalloc(1, sizeof(*o));
    *opts = o;
    struct kvt_cfg bp;
    if (kvt_cfg_sub(c, "backend_params", false, &bp)) {
        kvt_cfg_free(&bp);
        return c->rc;
    }
    const char *url = NULL, *container = NULL, *ca = NULL;
    kvt_cfg_str(&bp, "account_url", false, NULL, &url);
    kvt_cfg_str(&bp, "container_name", false, NULL, &container);
    kvt_cfg_str(&bp, "ca_bundle", false, NULL, &ca);
    kvt_cfg_str(&bp, "account_key", false, NULL, &o->az_key);
    kvt_cfg_str(&bp, "sas_token", false, NULL, &o->az_sas);
    if (!bp.rc && o->az_key)
        json_object_set_new(bp.resolved, "account_key", json_string("<set>"));
    if (!bp.rc && o->az_sas)
        json_object_set_new(bp.resolved, "sas_token", json_string("<set>"));
    url = param_or_env(url, "AZURE_STORAGE_ACCOUNT_URL");
    container = param_or_env(container, "AZURE_STORAGE_CONTAINER_NAME");
    if (!bp.rc && !url)
        kvt_cfg_missing(&bp, "account_url", "is required (or AZURE_STORAGE_ACCOUNT_URL)");
    if (!bp.rc && !container)
        kvt_cfg_missing(&bp, "container_name", "is required (or AZURE_STORAGE_CONTAINER_NAME)");
    if (!bp.rc && !container_ok(container))
        kvt_cfg_fail(&bp, "container_name",
                     "must be 3..63 lower-case letters, digits and single hyphens (got \"%s\")",
                     container);
    if (!bp.rc && o->az_key && o->az_sas)
        kvt_cfg_fail(&bp, "sas_token", "and account_key exclude each other: give one");
    uint8_t tmp[96];
    if (!bp.rc && o->az_key && kvt_base64_decode(o->az_key, tmp, sizeof(tmp)) <= 0)
        kvt_cfg_fail(&bp, "account_key", "must be the account's base64 key");
    explicit_bzero(tmp, sizeof(tmp));
    if (!bp.rc)
        parse_account_url(&bp, url, container, o);
    if (!bp.rc) {
        json_object_set_new(bp.resolved, "account_url", json_string(url));
        json_object_set_new(bp.resolved, "container_name", json_string(container));
        kvt_cfg_finish(&bp);
    }
    kvt_cfg_sub_done(c, "backend_params", &bp);
    if (kvt_s3_nixl_common(c, o))
        return c->rc;
    if (o->key_prefix[0] == '/' || strstr(o->key_prefix, ".."))
        return kvt_cfg_fail(c, "key_prefix", "must not start with '/' or contain \"..\"");
    o->azure = true;
    o->mpu_threshold = UINT64_MAX; /* Put Blob takes up to 5000 MiB */
    o->path_style = true;
    o->region = "";
    snprintf(o->bucket, sizeof(o->bucket), "%s", container);
    char shown[700];
    snprintf(shown, sizeof(shown), "%s://%s%s/", o->scheme, o->host, o->az_base);
    json_object_set_new(c->resolved, "served_by", json_string("s3 (Azure Blob dialect)"));
    json_object_set_new(c->resolved, "endpoint_url", json_string(shown));
    return 0;
}

int kvt_s3_azure_creds(const struct kvt_s3_opts *o, struct s3_engine *e, char *err, size_t cap)
{
    const char *key = param_or_env(o->az_key, "AZURE_STORAGE_KEY");
    const char *sas = param_or_env(o->az_sas, "AZURE_STORAGE_SAS_TOKEN");
    e->azure = true;
    snprintf(e->az.account, sizeof(e->az.account), "%s", o->az_account);
    if (key && !(o->az_sas && !o->az_key)) {
        int n = kvt_base64_decode(key, e->az.key, sizeof(e->az.key));
        if (n <= 0) {
            snprintf(err, cap, "the Azure account key (%s) is not base64",
                     o->az_key ? "backend_params.account_key" : "AZURE_STORAGE_KEY");
            return KVT_E_CONFIG;
        }
        e->az.key_len = (size_t)n;
        snprintf(e->creds.source, sizeof(e->creds.source), "shared key from %s",
                 o->az_key ? "config" : "AZURE_STORAGE_KEY");
        return 0;
    }
    if (sas) {
        if (sas[0] == '?')
            sas++;
        if (strlen(sas) >= sizeof(e->az.sas)) {
            snprintf(err, cap, "the SAS token is longer than %zu bytes", sizeof(e->az.sas) - 1);
            return KVT_E_CONFIG;
        }
        snprintf(e->az.sas, sizeof(e->az.sas), "%s", sas);
        snprintf(e->creds.source, sizeof(e->creds.source), "SAS from %s",
                 o->az_sas ? "config" : "AZURE_STORAGE_SAS_TOKEN");
        return 0;
    }
    snprintf(err, cap,
             "no Azure credentials: give backend_params.account_key or sas_token, or set "
             "AZURE_STORAGE_KEY or AZURE_STORAGE_SAS_TOKEN (Entra ID sign-in is not supported)");
    return KVT_E_CONFIG;
}

int kvt_s3_azure_creds_check(bool explicit_creds, char *err, size_t cap)
{
    if (explicit_creds) /* checked at parse */
        return 0;
    struct kvt_s3_opts o; /* the environment's, as open will read them */
    memset(&o, 0, sizeof(o));
    struct s3_engine e;
    memset(&e, 0, sizeof(e));
    int rc = kvt_s3_azure_creds(&o, &e, err, cap);
    explicit_bzero(&e.az, sizeof(e.az));
    return rc;
}
