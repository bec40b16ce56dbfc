/*
 * AWS Signature Version 4 (header-based), for the s3 adapter.
 *
 * Our own implementation on OpenSSL's SHA-256 and HMAC rather than libcurl's
 * CURLOPT_AWS_SIGV4: it is unit-tested against AWS's published examples
 * (tests/unit/test_sigv4.c: canonical request, string to sign, signature),
 * it exposes the intermediate strings for debugging a SignatureDoesNotMatch,
 * and it signs exactly the headers we send.
 *
 *   canonical request = METHOD \n URI \n QUERY \n (name:value\n)* \n
 *                       signed;header;names \n payload-hash
 *   string to sign    = "AWS4-HMAC-SHA256" \n amz-date \n
 *                       date/region/service/aws4_request \n hex(sha256(canonical))
 *   signing key       = HMAC(HMAC(HMAC(HMAC("AWS4"+secret, date), region), service),
 *                            "aws4_request")
 *   signature         = hex(HMAC(signing key, string to sign))
 *
 * Thread rules: every function is reentrant.
 */
#ifndef KVT_SIGV4_H
#define KVT_SIGV4_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

struct kvt_sigv4_pair {
    const char *name;
    const char *value;
};

struct kvt_sigv4_req {
    const char *method; /* "GET", "PUT", ... */
    const char *uri;    /* canonical URI: the percent-encoded path as sent */
    const char *query;  /* canonical query string (kvt_sigv4_canonical_query) or "" */
    const struct kvt_sigv4_pair *hdrs; /* headers to sign, any case, any order */
    size_t nhdrs;
    const char *payload_hash; /* hex SHA-256 of the body, or "UNSIGNED-PAYLOAD" */
    const char *amz_date;     /* "YYYYMMDDTHHMMSSZ" (also sent as x-amz-date) */
    const char *region;
    const char *service; /* "s3" */
    const char *access_key;
    const char *secret_key;
    /* Optional: kvt_sigv4_signing_key(secret_key, amz_date[0..8), region,
     * service), derived once by a caller that signs many requests a day;
     * NULL: derived here. */
    const uint8_t *signing_key;
};

struct kvt_sigv4_out {
    char signature[65];
    char signed_headers[512];
    char scope[160];          /* date/region/service/aws4_request */
    char authorization[1024]; /* the Authorization header value */
    /* Optional: when not NULL, the intermediate strings are copied here. */
    char *canonical;
    size_t canonical_cap;
    char *string_to_sign;
    size_t sts_cap;
};

/* Sign a request. Returns 0, -EINVAL (missing field, too many or too long
 * headers) or -ENOMEM. */
int kvt_sigv4_sign(const struct kvt_sigv4_req *r, struct kvt_sigv4_out *o);

/* The derived signing key for (secret, "YYYYMMDD", region, service). */
void kvt_sigv4_signing_key(const char *secret, const char *date8, const char *region,
                           const char *service, uint8_t out[32]);

/* URI-encode per SigV4: unreserved A-Z a-z 0-9 - . _ ~ stay, everything
 * else becomes %XX (upper-case hex); '/' stays unless encode_slash.
 * Returns the encoded length, or -ENOSPC if out (cap bytes incl. NUL) is
 * too small. */
int kvt_sigv4_uri_encode(const char *in, size_t len, bool encode_slash, char *out, size_t cap);

/* Canonical query string from raw (unencoded) name/value pairs: each
 * encoded, sorted by name then value, joined "a=1&b=2" ("name=" for an
 * empty value). Returns the length or -ENOSPC. */
int kvt_sigv4_canonical_query(const struct kvt_sigv4_pair *params, size_t n, char *out, size_t cap);

/* Lower-case hex SHA-256 of n bytes (64 chars + NUL). */
void kvt_sha256_hex(const void *p, size_t n, char out[65]);

/* "YYYYMMDDTHHMMSSZ" for a UTC time. */
void kvt_sigv4_amz_date(time_t t, char out[17]);

/* HMAC-SHA256 (Azure's Shared Key signs with it too). */
void kvt_hmac_sha256(const void *key, size_t klen, const void *msg, size_t n, uint8_t out[32]);
/* Standard base64 with padding; returns the length written (out needs
 * 4 * ceil(n / 3) + 1 bytes) or -ENOSPC. */
int kvt_base64_encode(const void *in, size_t n, char *out, size_t cap);
/* Decode standard base64; returns the byte count or -EINVAL (not base64) /
 * -ENOSPC. */
int kvt_base64_decode(const char *in, uint8_t *out, size_t cap);

/* SHA-256 of the empty string, the payload hash of bodiless requests. */
#define KVT_SHA256_EMPTY "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

#endif
