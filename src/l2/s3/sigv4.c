/* AWS Signature Version 4 on OpenSSL. See sigv4.h. */
#include "l2/s3/sigv4.h"

#include "common/util.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>

#define MAX_HDRS 32
#define MAX_HDR_LEN 4096

void kvt_sha256_hex(const void *p, size_t n, char out[65])
{
    uint8_t md[SHA256_DIGEST_LENGTH];
    SHA256(p, n, md);
    kvt_hex(md, sizeof(md), out);
}

static void hmac(const void *key, size_t klen, const void *msg, size_t mlen, uint8_t out[32])
{
    unsigned int olen = 32;
    HMAC(EVP_sha256(), key, (int)klen, msg, mlen, out, &olen);
}

void kvt_hmac_sha256(const void *key, size_t klen, const void *msg, size_t n, uint8_t out[32])
{
    hmac(key, klen, msg, n, out);
}

int kvt_base64_encode(const void *in, size_t n, char *out, size_t cap)
{
    if (cap < 4 * ((n + 2) / 3) + 1)
        return -ENOSPC;
    return EVP_EncodeBlock((unsigned char *)out, in, (int)n);
}

int kvt_base64_decode(const char *in, uint8_t *out, size_t cap)
{
    size_t n = strlen(in);
    if (n % 4)
        return -EINVAL;
    if (cap < n / 4 * 3)
        return -ENOSPC;
    int len = EVP_DecodeBlock(out, (const unsigned char *)in, (int)n);
    if (len < 0)
        return -EINVAL;
    /* EVP_DecodeBlock counts the padding as zero bytes */
    if (n && in[n - 1] == '=')
        len--;
    if (n > 1 && in[n - 2] == '=')
        len--;
    return len;
}

void kvt_sigv4_signing_key(const char *secret, const char *date8, const char *region,
                           const char *service, uint8_t out[32])
{
    char k0[256];
    int n = snprintf(k0, sizeof(k0), "AWS4%s", secret);
    if (n < 0 || (size_t)n >= sizeof(k0))
        n = (int)sizeof(k0) - 1; /* secrets are 40 chars; never reached */
    uint8_t a[32], b[32];
    hmac(k0, (size_t)n, date8, strlen(date8), a);
    hmac(a, 32, region, strlen(region), b);
    hmac(b, 32, service, strlen(service), a);
    hmac(a, 32, "aws4_request", 12, out);
    OPENSSL_cleanse(k0, sizeof(k0));
    OPENSSL_cleanse(a, sizeof(a));
    OPENSSL_cleanse(b, sizeof(b));
}

int kvt_sigv4_uri_encode(const char *in, size_t len, bool encode_slash, char *out, size_t cap)
{
    static const char d[] = "0123456789ABCDEF";
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)in[i];
        bool keep = isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~' ||
                    (c == '/' && !encode_slash);
        if (o + (keep ? 1 : 3) + 1 > cap)
            return -ENOSPC;
        if (keep) {
            out[o++] = (char)c;
        } else {
            out[o++] = '%';
            out[o++] = d[c >> 4];
            out[o++] = d[c & 15];
        }
    }
    if (o + 1 > cap)
        return -ENOSPC;
    out[o] = 0;
    return (int)o;
}

struct qp {
    char *n, *v;
};

static int qp_cmp(const void *a, const void *b)
{
    const struct qp *x = a, *y = b;
    int c = strcmp(x->n, y->n);
    return c ? c : strcmp(x->v, y->v);
}

int kvt_sigv4_canonical_query(const struct kvt_sigv4_pair *params, size_t n, char *out, size_t cap)
{
    if (cap == 0)
        return -ENOSPC;
    out[0] = 0;
    if (n == 0)
        return 0;
    struct qp *v = calloc(n, sizeof(*v));
    if (!v)
        return -ENOMEM;
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        size_t nl = strlen(params[i].name), vl = params[i].value ? strlen(params[i].value) : 0;
        v[i].n = malloc(3 * nl + 1);
        v[i].v = malloc(3 * vl + 1);
        if (!v[i].n || !v[i].v) {
            rc = -ENOMEM;
            break;
        }
        kvt_sigv4_uri_encode(params[i].name, nl, true, v[i].n, 3 * nl + 1);
        kvt_sigv4_uri_encode(vl ? params[i].value : "", vl, true, v[i].v, 3 * vl + 1);
    }
    size_t o = 0;
    if (!rc) {
        qsort(v, n, sizeof(*v), qp_cmp);
        for (size_t i = 0; i < n; i++) {
            int w = snprintf(out + o, cap - o, "%s%s=%s", i ? "&" : "", v[i].n, v[i].v);
            if (w < 0 || (size_t)w >= cap - o) {
                rc = -ENOSPC;
                break;
            }
            o += (size_t)w;
        }
    }
    for (size_t i = 0; i < n; i++) {
        free(v[i].n);
        free(v[i].v);
    }
    free(v);
    return rc ? rc : (int)o;
}

void kvt_sigv4_amz_date(time_t t, char out[17])
{
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(out, 17, "%Y%m%dT%H%M%SZ", &tm);
}

struct chdr {
    char name[128];
    char value[MAX_HDR_LEN];
};

static int chdr_cmp(const void *a, const void *b)
{
    return strcmp(((const struct chdr *)a)->name, ((const struct chdr *)b)->name);
}

/* Lower-case the name; trim the value and collapse runs of spaces. */
static int canon_header(const struct kvt_sigv4_pair *p, struct chdr *h)
{
    size_t nl = strlen(p->name);
    if (nl == 0 || nl >= sizeof(h->name))
        return -EINVAL;
    for (size_t i = 0; i <= nl; i++)
        h->name[i] = (char)tolower((unsigned char)p->name[i]);
    const char *s = p->value ? p->value : "";
    while (*s == ' ' || *s == '\t')
        s++;
    size_t o = 0;
    bool space = false;
    for (; *s; s++) {
        if (*s == ' ' || *s == '\t') {
            space = true;
            continue;
        }
        if (space && o) {
            if (o + 1 >= sizeof(h->value))
                return -EINVAL;
            h->value[o++] = ' ';
        }
        space = false;
        if (o + 1 >= sizeof(h->value))
            return -EINVAL;
        h->value[o++] = *s;
    }
    h->value[o] = 0;
    return 0;
}

/*
 * Build the canonical request and the string to sign, then the signature
 * and the Authorization header. Everything is assembled in heap buffers
 * sized from the inputs, so no input can truncate what is signed.
 */
int kvt_sigv4_sign(const struct kvt_sigv4_req *r, struct kvt_sigv4_out *o)
{
    if (!r->method || !r->uri || !r->payload_hash || !r->amz_date || strlen(r->amz_date) != 16 ||
        !r->region || !r->service || !r->access_key || !r->secret_key || r->nhdrs > MAX_HDRS)
        return -EINVAL;
    struct chdr *h = calloc(r->nhdrs ? r->nhdrs : 1, sizeof(*h));
    char *canon = NULL, *sts = NULL;
    int rc = -ENOMEM;
    if (!h)
        goto out;
    size_t need = strlen(r->method) + strlen(r->uri) + (r->query ? strlen(r->query) : 0) +
                  strlen(r->payload_hash) + 16;
    for (size_t i = 0; i < r->nhdrs; i++) {
        rc = canon_header(&r->hdrs[i], &h[i]);
        if (rc)
            goto out;
        need += 2 * strlen(h[i].name) + strlen(h[i].value) + 3;
    }
    qsort(h, r->nhdrs, sizeof(*h), chdr_cmp);
    o->signed_headers[0] = 0;
    size_t sl = 0;
    for (size_t i = 0; i < r->nhdrs; i++) {
        int w = snprintf(o->signed_headers + sl, sizeof(o->signed_headers) - sl, "%s%s",
                         i ? ";" : "", h[i].name);
        if (w < 0 || (size_t)w >= sizeof(o->signed_headers) - sl) {
            rc = -EINVAL;
            goto out;
        }
        sl += (size_t)w;
    }
    rc = -ENOMEM;
    canon = malloc(need);
    if (!canon)
        goto out;
    size_t cl =
        (size_t)snprintf(canon, need, "%s\n%s\n%s\n", r->method, r->uri, r->query ? r->query : "");
    for (size_t i = 0; i < r->nhdrs; i++)
        cl += (size_t)snprintf(canon + cl, need - cl, "%s:%s\n", h[i].name, h[i].value);
    cl += (size_t)snprintf(canon + cl, need - cl, "\n%s\n%s", o->signed_headers, r->payload_hash);

    char date8[9];
    memcpy(date8, r->amz_date, 8);
    date8[8] = 0;
    snprintf(o->scope, sizeof(o->scope), "%s/%s/%s/aws4_request", date8, r->region, r->service);
    char chash[65];
    kvt_sha256_hex(canon, cl, chash);
    size_t stsl = 17 + 17 + strlen(o->scope) + 1 + 64 + 1;
    sts = malloc(stsl);
    if (!sts)
        goto out;
    int sn = snprintf(sts, stsl, "AWS4-HMAC-SHA256\n%s\n%s\n%s", r->amz_date, o->scope, chash);

    uint8_t key[32], sig[32];
    if (r->signing_key)
        memcpy(key, r->signing_key, sizeof(key));
    else
        kvt_sigv4_signing_key(r->secret_key, date8, r->region, r->service, key);
    hmac(key, 32, sts, (size_t)sn, sig);
    OPENSSL_cleanse(key, sizeof(key));
    kvt_hex(sig, 32, o->signature);
    int w = snprintf(o->authorization, sizeof(o->authorization),
                     "AWS4-HMAC-SHA256 Credential=%s/%s, SignedHeaders=%s, Signature=%s",
                     r->access_key, o->scope, o->signed_headers, o->signature);
    if (w < 0 || (size_t)w >= sizeof(o->authorization)) {
        rc = -EINVAL;
        goto out;
    }
    if (o->canonical && o->canonical_cap)
        snprintf(o->canonical, o->canonical_cap, "%s", canon);
    if (o->string_to_sign && o->sts_cap)
        snprintf(o->string_to_sign, o->sts_cap, "%s", sts);
    rc = 0;
out:
    free(h);
    free(canon);
    free(sts);
    return rc;
}
