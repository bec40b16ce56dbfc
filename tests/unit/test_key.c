/* Description: key validation, namespaces, file-name codecs, chunk-hash test vectors. */
#include "test.h"

#include "common/util.h"
#include "key/key.h"
#include "kvtier/error.h"

#include <string.h>

static uint32_t ns_of(const char *m, const char *s)
{
    uint32_t ns = 0;
    TEST_ASSERT(kvt_ns_intern(m, strlen(m), s, strlen(s), &ns, NULL) == 0);
    return ns;
}

static void test_validation(void)
{
    static const char *bad_models[] = {"", "a@b", "/../etc", "x/../y", "..", ".", "a/./b",
                                       "tab\there"};
    for (size_t i = 0; i < KVT_ARRAY_LEN(bad_models); i++) {
        uint32_t ns;
        const char *why = NULL;
        const char *m = bad_models[i];
        TEST_ASSERT(kvt_ns_intern(m, strlen(m), "", 0, &ns, &why) == KVT_E_BADKEY);
        TEST_ASSERT(why != NULL);
    }
    static const char *good_models[] = {"meta-llama/Llama-3-8B", "/models/MyModel/a84fadf1",
                                        "m..n", "a_b", "x--y"};
    for (size_t i = 0; i < KVT_ARRAY_LEN(good_models); i++)
        ns_of(good_models[i], "");
    static const char *bad_salts[] = {"a@b", "a/b", "a\\b"};
    for (size_t i = 0; i < KVT_ARRAY_LEN(bad_salts); i++) {
        uint32_t ns;
        TEST_ASSERT(kvt_ns_intern("m", 1, bad_salts[i], strlen(bad_salts[i]), &ns, NULL) ==
                    KVT_E_BADKEY);
    }
    char long_salt[130];
    memset(long_salt, 's', 129);
    long_salt[129] = 0;
    uint32_t ns;
    TEST_ASSERT(kvt_ns_intern("m", 1, long_salt, 129, &ns, NULL) == KVT_E_BADKEY);
    /* interning is stable */
    TEST_ASSERT(ns_of("m", "t1") == ns_of("m", "t1"));
    TEST_ASSERT(ns_of("m", "t1") != ns_of("m", "t2"));
    TEST_ASSERT(strcmp(kvt_ns_name(ns_of("/models/MyModel/a84fadf1", "")),
                       "--models--MyModel--a84fadf1") == 0);
    kvt_key k;
    uint8_t h[33] = {0};
    TEST_ASSERT(kvt_key_make(&k, ns_of("m", ""), h, 0, 0, 0) == KVT_E_BADKEY);
    TEST_ASSERT(kvt_key_make(&k, ns_of("m", ""), h, 33, 0, 0) == KVT_E_BADKEY);
}

static void test_codecs(void)
{
    uint8_t h[32];
    for (int i = 0; i < 32; i++)
        h[i] = (uint8_t)i;
    kvt_key k, d;
    TEST_ASSERT(kvt_key_make(&k, ns_of("org/model", "tenant"), h, 32, 0x01000100, 7) == 0);
    char name[KVT_NAME_MAX + 1];
    TEST_ASSERT(kvt_key_encode(KVT_CODEC_FS, &k, name) > 0);
    TEST_ASSERT(strcmp(name, "org-SEP-model@0x01000100@7@000102030405060708090a0b0c0d0e0f10111213"
                             "1415161718191a1b1c1d1e1f@tenant.data") == 0);
    TEST_ASSERT(kvt_key_decode(KVT_CODEC_FS, name, strlen(name), &d) == 0);
    TEST_ASSERT(kvt_key_eq(&k, &d));
    TEST_ASSERT(kvt_key_encode(KVT_CODEC_NIXL, &k, name) > 0);
    TEST_ASSERT(strcmp(name, "org--model_01000100_7_000102030405060708090a0b0c0d0e0f1011121314"
                             "15161718191a1b1c1d1e1f@tenant.bin") == 0);
    TEST_ASSERT(kvt_key_decode(KVT_CODEC_NIXL, name, strlen(name), &d) == 0);
    TEST_ASSERT(kvt_key_eq(&k, &d));
    TEST_ASSERT(kvt_key_encode(KVT_CODEC_OBJ, &k, name) > 0);
    TEST_ASSERT(strstr(name, ".data") == NULL);
    TEST_ASSERT(kvt_key_decode(KVT_CODEC_OBJ, name, strlen(name), &d) == 0 && kvt_key_eq(&k, &d));
    /* no salt, model with underscores (nixl splits from the right) */
    TEST_ASSERT(kvt_key_make(&k, ns_of("my_model_v2", ""), h, 8, 3, 0) == 0);
    TEST_ASSERT(kvt_key_encode(KVT_CODEC_NIXL, &k, name) > 0);
    TEST_ASSERT(strcmp(name, "my_model_v2_00000003_0_0001020304050607.bin") == 0);
    TEST_ASSERT(kvt_key_decode(KVT_CODEC_NIXL, name, strlen(name), &d) == 0 && kvt_key_eq(&k, &d));
    /* names that are not objects */
    static const char *junk[] = {"x.data", "a@b@c.data", "m@0x0000000g@0@00.data",
                                 "m@0x00000000@0@0.data", "m@0x00000000@0@00@.data",
                                 "m@0x00000000@0@00.data.tmp.1-2-3", "..", "."};
    for (size_t i = 0; i < KVT_ARRAY_LEN(junk); i++)
        TEST_ASSERT(kvt_key_decode(KVT_CODEC_FS, junk[i], strlen(junk[i]), &d) != 0);
    /* canonical keys: a model containing the replacement shares the file */
    kvt_key a, b, ca, cb;
    TEST_ASSERT(kvt_key_make(&a, ns_of("x--y", ""), h, 4, 0, 0) == 0);
    TEST_ASSERT(kvt_key_make(&b, ns_of("x/y", ""), h, 4, 0, 0) == 0);
    kvt_key_canon(KVT_CODEC_NIXL, &a, &ca);
    kvt_key_canon(KVT_CODEC_NIXL, &b, &cb);
    TEST_ASSERT(kvt_key_eq(&ca, &cb));
    kvt_key_canon(KVT_CODEC_FS, &a, &ca);
    TEST_ASSERT(kvt_key_eq(&ca, &a));
    /* every encoded name stays inside its directory */
    TEST_ASSERT(kvt_key_make(&k, ns_of("/a/b/", "s"), h, 1, 0, 0) == 0);
    for (int c = 0; c < 3; c++) {
        TEST_ASSERT(kvt_key_encode((enum kvt_codec)c, &k, name) > 0);
        TEST_ASSERT(strchr(name, '/') == NULL && strcmp(name, "..") && strcmp(name, "."));
    }
}

static void test_chunk_hash_vectors(void)
{
    /* the vectors documented in docs/protocol.md (also checked from Python) */
    uint32_t t[512];
    for (int i = 0; i < 512; i++)
        t[i] = (uint32_t)i;
    uint8_t out[64];
    char hex[65];
    TEST_ASSERT(kvt_chunk_hashes(t, 512, 256, out) == 2);
    kvt_hex(out, 32, hex);
    TEST_ASSERT(strcmp(hex, "1d15876629a5821c35b4cd7de3514b5952e718a9e87f75aa41a781ebadb5abc9") == 0);
    kvt_hex(out + 32, 32, hex);
    TEST_ASSERT(strcmp(hex, "71354a739e18d56ecd771e486a3bfecccb25b6022ed5bb60ef2683482aaeeaa6") == 0);
    uint32_t t2[5] = {1, 2, 3, 4, 5};
    TEST_ASSERT(kvt_chunk_hashes(t2, 5, 2, out) == 2); /* the partial chunk is not hashed */
    kvt_hex(out, 32, hex);
    TEST_ASSERT(strcmp(hex, "dd433990c6daf93f596b060bd811a834197e36e952f26b41f0bc6b12b0dd819c") == 0);
    uint32_t t3[4] = {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu};
    TEST_ASSERT(kvt_chunk_hashes(t3, 4, 4, out) == 1);
    kvt_hex(out, 32, hex);
    TEST_ASSERT(strcmp(hex, "79f23b784d579500b71bdcff23fe78ccd3ec49016924e5a39385e03f2fc43d6f") == 0);
}

int main(void)
{
    RUN(test_validation);
    RUN(test_codecs);
    RUN(test_chunk_hash_vectors);
    return TEST_RESULT();
}
