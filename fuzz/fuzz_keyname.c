/* libFuzzer target: object names (issue 18 item 1).
 *
 * 1. The input as a name read back from storage (start-up scans, offline
 *    scan/purge) for every codec: a name that decodes is exactly the name
 *    its key encodes to (decoding is injective, nothing else aliases it),
 *    and it stays inside its directory.
 * 2. The input as two keys: "model1 \n salt1 \n model2 \n salt2 \n" then
 *    bytes for kv_rank, group and hash. For each key that interns,
 *    decode(encode(k)) == k with every codec; when both intern and differ,
 *    their names differ with every codec (encode is injective), and so do
 *    their namespace names when the models differ. */
#include "key/key.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void as_name(const uint8_t *data, size_t size)
{
    if (size > KVT_NAME_MAX)
        return;
    for (int c = 0; c < 3; c++) {
        kvt_key k;
        if (kvt_key_decode((enum kvt_codec)c, (const char *)data, size, &k))
            continue;
        char name[KVT_NAME_MAX + 1];
        int n = kvt_key_encode((enum kvt_codec)c, &k, name);
        if (n < 0 || strchr(name, '/') || !strcmp(name, "..") || !strcmp(name, "."))
            abort();
        if ((size_t)n != size || memcmp(name, data, size) != 0)
            abort(); /* two names for one key */
    }
}

/* Next '\n'-terminated field of at most 200 bytes; false at the end. */
static int field(const uint8_t **p, const uint8_t *end, const char **s, size_t *len)
{
    const uint8_t *nl = memchr(*p, '\n', (size_t)(end - *p));
    if (!nl || nl - *p > 200)
        return 0;
    *s = (const char *)*p;
    *len = (size_t)(nl - *p);
    *p = nl + 1;
    return 1;
}

static uint32_t take32(const uint8_t **p, const uint8_t *end)
{
    uint32_t v = 0;
    for (int i = 0; i < 4 && *p < end; i++)
        v = v << 8 | *(*p)++;
    return v;
}

static void roundtrip(const kvt_key *k, char names[3][KVT_NAME_MAX + 1])
{
    for (int c = 0; c < 3; c++) {
        int n = kvt_key_encode((enum kvt_codec)c, k, names[c]);
        if (n < 0)
            abort(); /* an interned namespace always encodes */
        kvt_key d;
        if (kvt_key_decode((enum kvt_codec)c, names[c], (size_t)n, &d) || !kvt_key_eq(&d, k))
            abort();
    }
}

static void as_keys(const uint8_t *data, size_t size)
{
    const uint8_t *p = data, *end = data + size;
    const char *m[2], *s[2];
    size_t ml[2], sl[2];
    for (int i = 0; i < 2; i++)
        if (!field(&p, end, &m[i], &ml[i]) || !field(&p, end, &s[i], &sl[i]))
            return;
    uint32_t rank = take32(&p, end), group = take32(&p, end);
    uint8_t flip = p < end ? *p++ : 0;
    size_t hl = (size_t)(end - p);
    if (hl == 0 || hl > KVT_HASH_MAX)
        return;
    kvt_key k[2];
    int ok[2];
    for (int i = 0; i < 2; i++) {
        uint32_t ns;
        ok[i] = kvt_ns_intern(m[i], ml[i], s[i], sl[i], &ns, NULL) == 0 &&
                kvt_key_make(&k[i], ns, p, hl, rank, group) == 0;
    }
    /* let the fuzzer also vary rank/group/hash between the two keys */
    if (ok[1] && (flip & 1))
        k[1].kv_rank ^= 1;
    if (ok[1] && (flip & 2))
        k[1].group ^= 0x10;
    if (ok[1] && (flip & 4))
        k[1].hash[0] ^= 1;
    char n0[3][KVT_NAME_MAX + 1], n1[3][KVT_NAME_MAX + 1];
    if (ok[0])
        roundtrip(&k[0], n0);
    if (ok[1])
        roundtrip(&k[1], n1);
    if (!ok[0] || !ok[1])
        return;
    int same = kvt_key_eq(&k[0], &k[1]);
    for (int c = 0; c < 3; c++)
        if ((strcmp(n0[c], n1[c]) == 0) != same)
            abort(); /* two keys share an object name */
    int same_model = ml[0] == ml[1] && memcmp(m[0], m[1], ml[0]) == 0;
    if ((strcmp(kvt_ns_name(k[0].ns), kvt_ns_name(k[1].ns)) == 0) != same_model)
        abort(); /* two models share a namespace */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    as_name(data, size);
    as_keys(data, size);
    return 0;
}
