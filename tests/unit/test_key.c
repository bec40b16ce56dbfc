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
    static const char *bad_models[] = {"",   "a@b", "/../etc", "x/../y",
                                       "..", ".",   "a/./b",   "tab\there"};
    for (size_t i = 0; i < KVT_ARRAY_LEN(bad_models); i++) {
        uint32_t ns;
        const char *why = NULL;
        const char *m = bad_models[i];
        TEST_ASSERT(kvt_ns_intern(m, strlen(m), "", 0, &ns, &why) == KVT_E_BADKEY);
        TEST_ASSERT(why != NULL);
    }
    static const char *good_models[] = {"meta-llama/Llama-3-8B", "/models/MyModel/a84fadf1", "m..n",
                                        "a_b", "x--y"};
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
    static const char *junk[] = {"x.data",
                                 "a@b@c.data",
                                 "m@0x0000000g@0@00.data",
                                 "m@0x00000000@0@0.data",
                                 "m@0x00000000@0@00@.data",
                                 "m@0x00000000@0@00.data.tmp.1-2-3",
                                 "..",
                                 "."};
    for (size_t i = 0; i < KVT_ARRAY_LEN(junk); i++)
        TEST_ASSERT(kvt_key_decode(KVT_CODEC_FS, junk[i], strlen(junk[i]), &d) != 0);
    /* every encoded name stays inside its directory */
    TEST_ASSERT(kvt_key_make(&k, ns_of("/a/b/", "s"), h, 1, 0, 0) == 0);
    for (int c = 0; c < 3; c++) {
        TEST_ASSERT(kvt_key_encode((enum kvt_codec)c, &k, name) > 0);
        TEST_ASSERT(strchr(name, '/') == NULL && strcmp(name, "..") && strcmp(name, "."));
    }
}

/* encode k with codec c into name, check that it decodes to exactly k */
static void roundtrip(enum kvt_codec c, const kvt_key *k, char *name)
{
    kvt_key d;
    int n = kvt_key_encode(c, k, name);
    TEST_ASSERT(n > 0 && (size_t)n == strlen(name));
    TEST_ASSERT(kvt_key_decode(c, name, (size_t)n, &d) == 0);
    TEST_ASSERT(kvt_key_eq(k, &d));
}

/* issue 18 item 1: '/' is written as "-SEP-" (fs/obj) or "--" (nixl); a
 * model that already holds those sequences used to share the name */
static void test_collisions(void)
{
    uint8_t h[4] = {0xde, 0xad, 0xbe, 0xef};
    static const char *pairs[][2] = {
        {"org/model", "org-SEP-model"},
        {"x/y", "x--y"},
        {"-SEP/", "/SEP-"},
        {"-/", "/-"},
        {"a/-b", "a-/b"},
        {"a%2Db", "a-b"},
        {"a%25b", "a%b"},
        {"a/b", "a%2D-b"},
        {"-SEP-SEP-", "/SEP/"},
        {"a---b", "a-/b"},
        {"a/SEP-b", "a-SEP-SEP-b"},
    };
    char n1[KVT_NAME_MAX + 1], n2[KVT_NAME_MAX + 1];
    for (size_t i = 0; i < KVT_ARRAY_LEN(pairs); i++) {
        kvt_key a, b;
        TEST_ASSERT(kvt_key_make(&a, ns_of(pairs[i][0], "s"), h, 4, 1, 2) == 0);
        TEST_ASSERT(kvt_key_make(&b, ns_of(pairs[i][1], "s"), h, 4, 1, 2) == 0);
        for (int c = 0; c < 3; c++) {
            roundtrip((enum kvt_codec)c, &a, n1);
            roundtrip((enum kvt_codec)c, &b, n2);
            if (!strcmp(n1, n2))
                fprintf(stderr, "%s / %s share %s\n", pairs[i][0], pairs[i][1], n1);
            TEST_ASSERT(strcmp(n1, n2) != 0);
        }
        TEST_ASSERT(strcmp(kvt_ns_name(a.ns), kvt_ns_name(b.ns)) != 0);
    }
    /* the exact names: LMCache's where nothing needs escaping */
    static const char *fs_names[][2] = {
        {"org/model", "org-SEP-model@0x00000001@2@deadbeef@s.data"},
        {"org-SEP-model", "org%2DSEP-model@0x00000001@2@deadbeef@s.data"},
        {"meta-llama/Llama-3-8B", "meta-llama-SEP-Llama-3-8B@0x00000001@2@deadbeef@s.data"},
        {"/models/x-SEP", "-SEP-models-SEP-x-SEP@0x00000001@2@deadbeef@s.data"},
        {"a-SEPb", "a-SEPb@0x00000001@2@deadbeef@s.data"},
        {"50%/x", "50%25-SEP-x@0x00000001@2@deadbeef@s.data"},
        {"-SEP/", "%2DSEP-SEP-@0x00000001@2@deadbeef@s.data"},
    };
    for (size_t i = 0; i < KVT_ARRAY_LEN(fs_names); i++) {
        kvt_key a;
        TEST_ASSERT(kvt_key_make(&a, ns_of(fs_names[i][0], "s"), h, 4, 1, 2) == 0);
        roundtrip(KVT_CODEC_FS, &a, n1);
        if (strcmp(n1, fs_names[i][1]))
            fprintf(stderr, "%s -> %s\n", fs_names[i][0], n1);
        TEST_ASSERT(strcmp(n1, fs_names[i][1]) == 0);
    }
    static const char *nixl_names[][2] = {
        {"x/y", "x--y_00000001_2_deadbeef@s.bin"},
        {"x--y", "x%2D-y_00000001_2_deadbeef@s.bin"},
        {"/models/My-Model/v-1", "--models--My-Model--v-1_00000001_2_deadbeef@s.bin"},
        {"-/", "%2D--_00000001_2_deadbeef@s.bin"},
        {"/-", "---_00000001_2_deadbeef@s.bin"},
        {"a%b", "a%25b_00000001_2_deadbeef@s.bin"},
    };
    for (size_t i = 0; i < KVT_ARRAY_LEN(nixl_names); i++) {
        kvt_key a;
        TEST_ASSERT(kvt_key_make(&a, ns_of(nixl_names[i][0], "s"), h, 4, 1, 2) == 0);
        roundtrip(KVT_CODEC_NIXL, &a, n1);
        if (strcmp(n1, nixl_names[i][1]))
            fprintf(stderr, "%s -> %s\n", nixl_names[i][0], n1);
        TEST_ASSERT(strcmp(n1, nixl_names[i][1]) == 0);
        /* the namespace name is the file-name prefix */
        const char *ns = kvt_ns_name(a.ns);
        TEST_ASSERT(strncmp(n1, ns, strlen(ns)) == 0 && n1[strlen(ns)] == '_');
        char model[KVT_NAME_MAX + 1];
        TEST_ASSERT(kvt_ns_name_model(ns, strlen(ns), model, sizeof(model)) ==
                    (int)strlen(nixl_names[i][0]));
        TEST_ASSERT(strcmp(model, nixl_names[i][0]) == 0);
    }
    /* only the exact encoding decodes: other spellings are not cache objects */
    static const char *noncanon[] = {
        "a%2Db@0x00000001@2@deadbeef.data",           /* needless escape */
        "org%2dSEP-model@0x00000001@2@deadbeef.data", /* lower-case escape */
        "%41@0x00000001@2@deadbeef.data",
        "a%@0x00000001@2@deadbeef.data",
        "a%2@0x00000001@2@deadbeef.data",
        "a@0x00000001@2@DEADBEEF.data", /* upper-case hex */
        "a@0x0000000A@2@deadbeef.data",
        "a@0x00000001@02@deadbeef.data",    /* leading zero */
        "a%40b@0x00000001@2@deadbeef.data", /* '@' in a model */
    };
    kvt_key d;
    for (size_t i = 0; i < KVT_ARRAY_LEN(noncanon); i++) {
        if (kvt_key_decode(KVT_CODEC_FS, noncanon[i], strlen(noncanon[i]), &d) == 0)
            fprintf(stderr, "decoded: %s\n", noncanon[i]);
        TEST_ASSERT(kvt_key_decode(KVT_CODEC_FS, noncanon[i], strlen(noncanon[i]), &d) != 0);
    }
    TEST_ASSERT(kvt_key_decode(KVT_CODEC_NIXL, "a%2Db_00000001_2_deadbeef.bin", 29, &d) != 0);
    char model[64];
    TEST_ASSERT(kvt_ns_name_model("x-%2D", 5, model, sizeof(model)) < 0); /* not canonical */
    TEST_ASSERT(kvt_ns_name_model("x%2D-y", 6, model, sizeof(model)) == 4 &&
                strcmp(model, "x--y") == 0);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* every model over a small alphabet rich in separator pieces, up to 6 bytes:
 * each codec's names (and the namespace names) are distinct and decode back */
static void test_injective_exhaustive(void)
{
    static const char alpha[] = "-SEP/%x";
    const size_t na = sizeof(alpha) - 1, maxlen = 6;
    size_t total = 0, pw = 1;
    for (size_t l = 1; l <= maxlen; l++)
        total += (pw *= na);
    char **names[4];
    for (int c = 0; c < 4; c++)
        names[c] = kvt_xcalloc(total, sizeof(char *));
    uint8_t h[2] = {1, 2};
    size_t n = 0;
    for (size_t l = 1; l <= maxlen; l++) {
        size_t count = 1;
        for (size_t i = 0; i < l; i++)
            count *= na;
        for (size_t v = 0; v < count; v++) {
            char m[8];
            size_t x = v;
            for (size_t i = 0; i < l; i++, x /= na)
                m[i] = alpha[x % na];
            m[l] = 0;
            uint32_t ns;
            TEST_ASSERT(kvt_ns_intern(m, l, "", 0, &ns, NULL) == 0);
            kvt_key k;
            TEST_ASSERT(kvt_key_make(&k, ns, h, 2, 0, 0) == 0);
            char name[KVT_NAME_MAX + 1];
            for (int c = 0; c < 3; c++) {
                roundtrip((enum kvt_codec)c, &k, name);
                names[c][n] = kvt_xstrdup(name);
            }
            names[3][n] = kvt_xstrdup(kvt_ns_name(ns));
            n++;
        }
    }
    TEST_ASSERT(n == total);
    for (int c = 0; c < 4; c++) {
        qsort(names[c], n, sizeof(char *), cmp_str);
        size_t dup = 0;
        for (size_t i = 1; i < n; i++)
            if (!strcmp(names[c][i - 1], names[c][i]) && dup++ < 3)
                fprintf(stderr, "codec %d: two models share %s\n", c, names[c][i]);
        TEST_ASSERT(dup == 0);
        for (size_t i = 0; i < n; i++)
            free(names[c][i]);
        free(names[c]);
    }
}

/* issue 18 item 12: byte limits, and the combined limit on the encoded name */
static void test_limits(void)
{
    char m[400], s[200];
    uint32_t ns;
    const char *why = NULL;
    memset(m, 'm', sizeof(m));
    memset(s, 's', sizeof(s));
    /* 128 bytes of UTF-8 (64 two-byte characters) is the most */
    char u[260];
    for (int i = 0; i < 65; i++)
        memcpy(u + 2 * i, "\xc3\xa9", 2);
    TEST_ASSERT(kvt_ns_intern(u, 128, "", 0, &ns, &why) == 0);
    TEST_ASSERT(kvt_ns_intern(u, 130, "", 0, &ns, &why) == KVT_E_BADKEY);
    TEST_ASSERT(strstr(why, "128 bytes") && strstr(why, "max_model_bytes"));
    TEST_ASSERT(kvt_ns_intern("m", 1, u, 130, &ns, &why) == KVT_E_BADKEY);
    TEST_ASSERT(strstr(why, "128 bytes") && strstr(why, "max_salt_bytes"));
    TEST_ASSERT(kvt_ns_intern("m", 1, s, 128, &ns, &why) == 0);
    /* the fs name: model + "@" + salt + 90 bytes for the longest key */
    TEST_ASSERT(kvt_name_bytes(m, 128, 21) == 240);
    TEST_ASSERT(kvt_ns_intern(m, 128, s, 21, &ns, &why) == 0);
    TEST_ASSERT(kvt_ns_intern(m, 128, s, 22, &ns, &why) == KVT_E_BADKEY);
    TEST_ASSERT(strstr(why, "max_name_bytes") && strstr(why, "241 bytes"));
    /* escapes count: 50 '%' are 150 bytes encoded */
    memset(m, '%', 50);
    TEST_ASSERT(kvt_name_bytes(m, 50, 0) == 240);
    TEST_ASSERT(kvt_ns_intern(m, 50, "", 0, &ns, &why) == 0);
    TEST_ASSERT(kvt_ns_intern(m, 51, "", 0, &ns, &why) == KVT_E_BADKEY);
    TEST_ASSERT(strstr(why, "max_name_bytes"));
    /* every key of an accepted namespace encodes with every codec */
    uint8_t h[32];
    memset(h, 0xff, sizeof(h));
    kvt_key k;
    char name[KVT_NAME_MAX + 1];
    TEST_ASSERT(kvt_ns_intern(m, 50, "", 0, &ns, &why) == 0);
    TEST_ASSERT(kvt_key_make(&k, ns, h, 32, 0xffffffffu, 0xffffffffu) == 0);
    for (int c = 0; c < 3; c++)
        roundtrip((enum kvt_codec)c, &k, name);
    memset(m, '-', 60); /* nixl escapes all but the last '-' */
    TEST_ASSERT(kvt_name_bytes(m, 60, 0) == 59 * 3 + 1 + 87);
    TEST_ASSERT(kvt_ns_intern(m, 50, "", 0, &ns, &why) == 0);
    TEST_ASSERT(kvt_key_make(&k, ns, h, 32, 0xffffffffu, 0xffffffffu) == 0);
    for (int c = 0; c < 3; c++)
        roundtrip((enum kvt_codec)c, &k, name);
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
    TEST_ASSERT(strcmp(hex, "1d15876629a5821c35b4cd7de3514b5952e718a9e87f75aa41a781ebadb5abc9") ==
                0);
    kvt_hex(out + 32, 32, hex);
    TEST_ASSERT(strcmp(hex, "71354a739e18d56ecd771e486a3bfecccb25b6022ed5bb60ef2683482aaeeaa6") ==
                0);
    uint32_t t2[5] = {1, 2, 3, 4, 5};
    TEST_ASSERT(kvt_chunk_hashes(t2, 5, 2, out) == 2); /* the partial chunk is not hashed */
    kvt_hex(out, 32, hex);
    TEST_ASSERT(strcmp(hex, "dd433990c6daf93f596b060bd811a834197e36e952f26b41f0bc6b12b0dd819c") ==
                0);
    uint32_t t3[4] = {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu};
    TEST_ASSERT(kvt_chunk_hashes(t3, 4, 4, out) == 1);
    kvt_hex(out, 32, hex);
    TEST_ASSERT(strcmp(hex, "79f23b784d579500b71bdcff23fe78ccd3ec49016924e5a39385e03f2fc43d6f") ==
                0);
}

int main(void)
{
    RUN(test_validation);
    RUN(test_codecs);
    RUN(test_collisions);
    RUN(test_injective_exhaustive);
    RUN(test_limits);
    RUN(test_chunk_hash_vectors);
    return TEST_RESULT();
}
