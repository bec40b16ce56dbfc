/*
 * Description: SigV4 signing against AWS's published examples: the four
 * header-based S3 examples of "Signature Calculations for the Authorization
 * Header" (examplebucket, 20130524), the IAM ListUsers example and the
 * signing-key derivation example of the general SigV4 documentation, and the
 * get-vanilla case of the SigV4 test suite. Canonical request, string to
 * sign and signature are compared byte for byte.
 */
#include "common/util.h"
#include "l2/s3/sigv4.h"
#include "test.h"

#include <errno.h>
#include <string.h>

#define AKID "AKIAIOSFODNN7EXAMPLE"
#define SECRET "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
#define HOST "examplebucket.s3.amazonaws.com"
#define DATE "20130524T000000Z"

static char canon[4096], sts[1024];

static struct kvt_sigv4_req mkreq(const char *method, const char *uri, const char *query,
                                  const struct kvt_sigv4_pair *h, size_t nh, const char *phash,
                                  const char *date, const char *region, const char *service,
                                  const char *ak, const char *sk)
{
    struct kvt_sigv4_req r = {.method = method,
                              .uri = uri,
                              .query = query,
                              .hdrs = h,
                              .nhdrs = nh,
                              .payload_hash = phash,
                              .amz_date = date,
                              .region = region,
                              .service = service,
                              .access_key = ak,
                              .secret_key = sk};
    return r;
}

static void sign(struct kvt_sigv4_req *r, struct kvt_sigv4_out *o)
{
    memset(o, 0, sizeof(*o));
    o->canonical = canon;
    o->canonical_cap = sizeof(canon);
    o->string_to_sign = sts;
    o->sts_cap = sizeof(sts);
    TEST_ASSERT(kvt_sigv4_sign(r, o) == 0);
}

static void s3_get_object(void)
{
    struct kvt_sigv4_pair h[] = {{"Host", HOST},
                                 {"Range", "bytes=0-9"},
                                 {"x-amz-content-sha256", KVT_SHA256_EMPTY},
                                 {"x-amz-date", DATE}};
    struct kvt_sigv4_req r = mkreq("GET", "/test.txt", "", h, 4, KVT_SHA256_EMPTY, DATE,
                                   "us-east-1", "s3", AKID, SECRET);
    struct kvt_sigv4_out o;
    sign(&r, &o);
    TEST_ASSERT(strcmp(canon,
                       "GET\n/test.txt\n\n"
                       "host:examplebucket.s3.amazonaws.com\n"
                       "range:bytes=0-9\n"
                       "x-amz-content-sha256:" KVT_SHA256_EMPTY "\n"
                       "x-amz-date:20130524T000000Z\n\n"
                       "host;range;x-amz-content-sha256;x-amz-date\n" KVT_SHA256_EMPTY) == 0);
    TEST_ASSERT(strcmp(sts,
                       "AWS4-HMAC-SHA256\n20130524T000000Z\n20130524/us-east-1/s3/aws4_request\n"
                       "7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972") == 0);
    TEST_ASSERT(strcmp(o.signature,
                       "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41") == 0);
    TEST_ASSERT(
        strcmp(o.authorization,
               "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/"
               "aws4_request, SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
               "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41") == 0);
}

static void s3_put_object(void)
{
    const char *body = "Welcome to Amazon S3.";
    char ph[65];
    kvt_sha256_hex(body, strlen(body), ph);
    TEST_ASSERT(strcmp(ph, "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072") ==
                0);
    char uri[64];
    TEST_ASSERT(kvt_sigv4_uri_encode("/test$file.text", 15, false, uri, sizeof(uri)) > 0);
    TEST_ASSERT(strcmp(uri, "/test%24file.text") == 0);
    struct kvt_sigv4_pair h[] = {{"Host", HOST},
                                 {"Date", "Fri, 24 May 2013 00:00:00 GMT"},
                                 {"x-amz-date", DATE},
                                 {"x-amz-storage-class", "REDUCED_REDUNDANCY"},
                                 {"x-amz-content-sha256", ph}};
    struct kvt_sigv4_req r = mkreq("PUT", uri, "", h, 5, ph, DATE, "us-east-1", "s3", AKID, SECRET);
    struct kvt_sigv4_out o;
    sign(&r, &o);
    TEST_ASSERT(strcmp(canon,
                       "PUT\n/test%24file.text\n\n"
                       "date:Fri, 24 May 2013 00:00:00 GMT\n"
                       "host:examplebucket.s3.amazonaws.com\n"
                       "x-amz-content-sha256:"
                       "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072\n"
                       "x-amz-date:20130524T000000Z\n"
                       "x-amz-storage-class:REDUCED_REDUNDANCY\n\n"
                       "date;host;x-amz-content-sha256;x-amz-date;x-amz-storage-class\n"
                       "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072") == 0);
    TEST_ASSERT(strcmp(sts,
                       "AWS4-HMAC-SHA256\n20130524T000000Z\n20130524/us-east-1/s3/aws4_request\n"
                       "9e0e90d9c76de8fa5b200d8c849cd5b8dc7a3be3951ddb7f6a76b4158342019d") == 0);
    TEST_ASSERT(strcmp(o.signature,
                       "98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd") == 0);
}

static void s3_get_lifecycle(void)
{
    struct kvt_sigv4_pair q[] = {{"lifecycle", ""}};
    char query[64];
    TEST_ASSERT(kvt_sigv4_canonical_query(q, 1, query, sizeof(query)) >= 0);
    TEST_ASSERT(strcmp(query, "lifecycle=") == 0);
    struct kvt_sigv4_pair h[] = {
        {"x-amz-date", DATE}, {"host", HOST}, {"x-amz-content-sha256", KVT_SHA256_EMPTY}};
    struct kvt_sigv4_req r =
        mkreq("GET", "/", query, h, 3, KVT_SHA256_EMPTY, DATE, "us-east-1", "s3", AKID, SECRET);
    struct kvt_sigv4_out o;
    sign(&r, &o);
    TEST_ASSERT(strcmp(canon, "GET\n/\nlifecycle=\n"
                              "host:examplebucket.s3.amazonaws.com\n"
                              "x-amz-content-sha256:" KVT_SHA256_EMPTY "\n"
                              "x-amz-date:20130524T000000Z\n\n"
                              "host;x-amz-content-sha256;x-amz-date\n" KVT_SHA256_EMPTY) == 0);
    TEST_ASSERT(strcmp(sts,
                       "AWS4-HMAC-SHA256\n20130524T000000Z\n20130524/us-east-1/s3/aws4_request\n"
                       "9766c798316ff2757b517bc739a67f6213b4ab36dd5da2f94eaebf79c77395ca") == 0);
    TEST_ASSERT(strcmp(o.signature,
                       "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543") == 0);
}

static void s3_list_objects(void)
{
    /* given out of order: the canonical query sorts them */
    struct kvt_sigv4_pair q[] = {{"prefix", "J"}, {"max-keys", "2"}};
    char query[64];
    TEST_ASSERT(kvt_sigv4_canonical_query(q, 2, query, sizeof(query)) >= 0);
    TEST_ASSERT(strcmp(query, "max-keys=2&prefix=J") == 0);
    struct kvt_sigv4_pair h[] = {
        {"Host", HOST}, {"x-amz-content-sha256", KVT_SHA256_EMPTY}, {"x-amz-date", DATE}};
    struct kvt_sigv4_req r =
        mkreq("GET", "/", query, h, 3, KVT_SHA256_EMPTY, DATE, "us-east-1", "s3", AKID, SECRET);
    struct kvt_sigv4_out o;
    sign(&r, &o);
    TEST_ASSERT(strcmp(sts,
                       "AWS4-HMAC-SHA256\n20130524T000000Z\n20130524/us-east-1/s3/aws4_request\n"
                       "df57d21db20da04d7fa30298dd4488ba3a2b47ca3a489c74750e0f1e7df1b9b7") == 0);
    TEST_ASSERT(strcmp(o.signature,
                       "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7") == 0);
}

static void signing_key_derivation(void)
{
    uint8_t k[32];
    char hx[65];
    kvt_sigv4_signing_key("wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "20120215", "us-east-1",
                          "iam", k);
    kvt_hex(k, sizeof(k), hx);
    TEST_ASSERT(strcmp(hx, "f4780e2d9f65fa895f9c67b32ce1baf0b0d8a43505a000a1a9e090d414db404d") ==
                0);
}

static void iam_list_users(void)
{
    struct kvt_sigv4_pair q[] = {{"Version", "2010-05-08"}, {"Action", "ListUsers"}};
    char query[128];
    TEST_ASSERT(kvt_sigv4_canonical_query(q, 2, query, sizeof(query)) >= 0);
    TEST_ASSERT(strcmp(query, "Action=ListUsers&Version=2010-05-08") == 0);
    struct kvt_sigv4_pair h[] = {
        {"Content-Type", "application/x-www-form-urlencoded; charset=utf-8"},
        {"Host", "iam.amazonaws.com"},
        {"X-Amz-Date", "20150830T123600Z"}};
    struct kvt_sigv4_req r =
        mkreq("GET", "/", query, h, 3, KVT_SHA256_EMPTY, "20150830T123600Z", "us-east-1", "iam",
              "AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY");
    struct kvt_sigv4_out o;
    sign(&r, &o);
    TEST_ASSERT(strcmp(canon, "GET\n/\nAction=ListUsers&Version=2010-05-08\n"
                              "content-type:application/x-www-form-urlencoded; charset=utf-8\n"
                              "host:iam.amazonaws.com\n"
                              "x-amz-date:20150830T123600Z\n\n"
                              "content-type;host;x-amz-date\n" KVT_SHA256_EMPTY) == 0);
    TEST_ASSERT(strcmp(sts,
                       "AWS4-HMAC-SHA256\n20150830T123600Z\n20150830/us-east-1/iam/aws4_request\n"
                       "f536975d06c0309214f805bb90ccff089219ecd68b2577efef23edd43b7e1a59") == 0);
    TEST_ASSERT(strcmp(o.signature,
                       "5d672d79c15b13162d9279b0855cfba6789a8edb4c82c400e06b5924a6f2b5d7") == 0);
}

static void suite_get_vanilla(void)
{
    struct kvt_sigv4_pair h[] = {{"Host", "example.amazonaws.com"},
                                 {"X-Amz-Date", "20150830T123600Z"}};
    struct kvt_sigv4_req r =
        mkreq("GET", "/", "", h, 2, KVT_SHA256_EMPTY, "20150830T123600Z", "us-east-1", "service",
              "AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY");
    struct kvt_sigv4_out o;
    sign(&r, &o);
    TEST_ASSERT(strcmp(o.signature,
                       "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31") == 0);
}

static void header_values_are_trimmed(void)
{
    /* leading/trailing blanks dropped, inner runs collapsed (SigV4 rules) */
    struct kvt_sigv4_pair h[] = {{"My-Header1", "  a   b   c  "}, {"Host", "h"}};
    struct kvt_sigv4_req r =
        mkreq("GET", "/", "", h, 2, "UNSIGNED-PAYLOAD", DATE, "us-east-1", "s3", AKID, SECRET);
    struct kvt_sigv4_out o;
    sign(&r, &o);
    TEST_ASSERT(strstr(canon, "\nmy-header1:a b c\n") != NULL);
    TEST_ASSERT(strcmp(o.signed_headers, "host;my-header1") == 0);
    char enc[64];
    TEST_ASSERT(kvt_sigv4_uri_encode("m-SEP-x@0x00000001 ~", 20, true, enc, sizeof(enc)) > 0);
    TEST_ASSERT(strcmp(enc, "m-SEP-x%400x00000001%20~") == 0);
    TEST_ASSERT(kvt_sigv4_uri_encode("abc", 3, true, enc, 3) == -ENOSPC);
}

int main(void)
{
    RUN(s3_get_object);
    RUN(s3_put_object);
    RUN(s3_get_lifecycle);
    RUN(s3_list_objects);
    RUN(signing_key_derivation);
    RUN(iam_list_users);
    RUN(suite_get_vanilla);
    RUN(header_values_are_trimmed);
    return TEST_RESULT();
}
