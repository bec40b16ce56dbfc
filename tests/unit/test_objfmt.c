/* The on-storage object header (l2/kit/objfmt.h): version 1 (no tag) as
 * written before tags existed, version 2 with the engine block hashes, the
 * tag kept as far as a fixed header area holds it, and corrupt tags refused. */
#include "test.h"

#include "common/le.h"
#include "key/blocktag.h"
#include "key/key.h"
#include "kvtier/error.h"
#include "l2/kit/objfmt.h"

#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

static const char MODEL[] = "meta-llama/Llama-3.1-8B-Instruct";
static const char SALT[] = "tenant-a";

static kvt_key make_key(uint8_t seed)
{
    uint32_t ns;
    kvt_key k;
    uint8_t h[32];
    for (int i = 0; i < 32; i++)
        h[i] = (uint8_t)(seed + i);
    TEST_ASSERT(kvt_ns_intern(MODEL, strlen(MODEL), SALT, strlen(SALT), &ns, NULL) == 0);
    TEST_ASSERT(kvt_key_make(&k, ns, h, 32, 3, 7) == 0);
    return k;
}

static kvt_objmeta make_meta(void)
{
    kvt_objmeta m = {.len = 4096, .ndim = 2, .dtype = KVT_DTYPE_BF16};
    m.shape[0] = 16;
    m.shape[1] = 128;
    return m;
}

/* A tag of nblocks hashes of hash_len bytes (0: integers), a parent, and
 * ntokens token ids. */
static struct kvt_blocktag *make_tag(uint16_t nblocks, uint8_t hash_len, uint32_t ntokens)
{
    struct kvt_blocktag *t = kvt_blocktag_new(16, nblocks, hash_len, ntokens);
    size_t hs = kvt_blocktag_hsize(t);
    t->has_parent = 1;
    for (size_t i = 0; i < hs; i++)
        t->parent[i] = (uint8_t)(0xA0 + i);
    for (size_t i = 0; i < nblocks * hs; i++)
        t->hashes[i] = (uint8_t)(i * 7 + 1);
    for (uint32_t i = 0; i < ntokens; i++)
        t->tokens[i] = 100000 + i;
    return t;
}

static void same_tag(const struct kvt_blocktag *a, const struct kvt_blocktag *b, bool tokens)
{
    TEST_ASSERT(a && b);
    TEST_ASSERT(a->block_size == b->block_size && a->nblocks == b->nblocks &&
                a->hash_len == b->hash_len && a->has_parent == b->has_parent);
    size_t hs = kvt_blocktag_hsize(a);
    TEST_ASSERT(!a->has_parent || memcmp(a->parent, b->parent, hs) == 0);
    TEST_ASSERT(memcmp(a->hashes, b->hashes, a->nblocks * hs) == 0);
    if (tokens) {
        TEST_ASSERT(a->ntokens == b->ntokens);
        TEST_ASSERT(memcmp(a->tokens, b->tokens, a->ntokens * sizeof(uint32_t)) == 0);
    } else {
        TEST_ASSERT(b->ntokens == 0);
    }
}

static void same_key_meta(const struct kvt_objhdr *h, const kvt_key *k, const kvt_objmeta *m)
{
    TEST_ASSERT(kvt_key_eq(&h->key, k));
    TEST_ASSERT(h->meta.len == m->len && h->meta.ndim == m->ndim && h->meta.dtype == m->dtype);
    TEST_ASSERT(h->meta.shape[0] == m->shape[0] && h->meta.shape[1] == m->shape[1]);
    TEST_ASSERT(h->payload_len == 5000 && h->payload_xxh3 == 0x1122334455667788ull);
}

/* A version 1 header as the format before tags wrote it, built here by its
 * layout (not by the encoder): the decoder of today must read it. */
static void old_header(uint8_t *p, const kvt_key *k, const kvt_objmeta *m)
{
    memset(p, 0, 512);
    memcpy(p, "KVTOBJ1\n", 8);
    kvt_put16(p + 8, 1);
    kvt_put16(p + 10, 512);
    kvt_put32(p + 12, 0);
    kvt_put64(p + 16, 5000);
    kvt_put64(p + 24, m->len);
    kvt_put64(p + 32, 0x1122334455667788ull);
    kvt_put32(p + 40, k->kv_rank);
    kvt_put32(p + 44, k->group);
    p[48] = k->hash_len;
    p[49] = m->ndim;
    kvt_put16(p + 50, m->dtype);
    kvt_put16(p + 52, (uint16_t)strlen(MODEL));
    kvt_put16(p + 54, (uint16_t)strlen(SALT));
    memcpy(p + 56, k->hash, 32);
    for (int i = 0; i < KVT_MAX_DIMS; i++)
        kvt_put32(p + 88 + 4 * i, m->shape[i]);
    size_t end = 120;
    memcpy(p + end, MODEL, strlen(MODEL));
    end += strlen(MODEL);
    memcpy(p + end, SALT, strlen(SALT));
    end += strlen(SALT);
    kvt_put64(p + end, XXH3_64bits(p, end));
}

static void test_old_format(void)
{
    kvt_key k = make_key(1);
    kvt_objmeta m = make_meta();
    uint8_t old[512], now[512];
    old_header(old, &k, &m);
    struct kvt_objhdr h;
    const char *why = NULL;
    TEST_ASSERT(kvt_objhdr_decode(old, sizeof(old), &h, &why) == 0);
    same_key_meta(&h, &k, &m);
    TEST_ASSERT(h.hdr_len == 512 && h.tag_len == 0);
    TEST_ASSERT(kvt_objhdr_tag(old, &h) == NULL);
    /* without a tag the encoder still writes exactly that */
    TEST_ASSERT(kvt_objhdr_encode(now, 512, &k, &m, NULL, 0, 5000, 0x1122334455667788ull) == 0);
    TEST_ASSERT(memcmp(old, now, 512) == 0);
    TEST_ASSERT(kvt_objhdr_len(&k, NULL, 512, KVT_OBJHDR_MAX) == 512);
    TEST_ASSERT(kvt_objhdr_len(&k, NULL, 4096, KVT_OBJHDR_MAX) == 4096);
}

static void roundtrip(uint16_t nblocks, uint8_t hash_len, uint32_t ntokens, uint32_t align,
                      uint16_t want_hl)
{
    kvt_key k = make_key(2);
    kvt_objmeta m = make_meta();
    struct kvt_blocktag *t = make_tag(nblocks, hash_len, ntokens);
    uint16_t hl = kvt_objhdr_len(&k, t, align, KVT_OBJHDR_MAX);
    TEST_ASSERT(hl == want_hl);
    TEST_ASSERT(hl % (align < 512 ? 512 : align) == 0);
    uint8_t *buf = malloc(hl);
    TEST_ASSERT(kvt_objhdr_encode(buf, hl, &k, &m, t, 0, 5000, 0x1122334455667788ull) == 0);
    TEST_ASSERT(kvt_get16(buf + 8) == KVT_OBJHDR_VERSION_TAG);
    struct kvt_objhdr h;
    const char *why = NULL;
    TEST_ASSERT(kvt_objhdr_decode(buf, hl, &h, &why) == 0);
    same_key_meta(&h, &k, &m);
    TEST_ASSERT(h.hdr_len == hl && h.tag_len > 0);
    struct kvt_blocktag *got = kvt_objhdr_tag(buf, &h);
    same_tag(t, got, true);
    kvt_blocktag_put(got);
    /* the header area cut short of the tag: refused, never a wrong tag */
    TEST_ASSERT(kvt_objhdr_decode(buf, h.tag_off + h.tag_len, &h, &why) == KVT_E_CORRUPT);
    free(buf);
    kvt_blocktag_put(t);
}

static void test_tag_roundtrip(void)
{
    /* 2 x 32-byte hashes and 16 tokens: 120 + 40 + 172 + 8 fits in 512 */
    roundtrip(2, 32, 16, 512, 512);
    /* 4 x 32-byte hashes and 64 tokens: 596 bytes -> 1024 */
    roundtrip(4, 32, 64, 512, 1024);
    /* 16 x 32-byte hashes (a 256-token chunk of 16-token blocks), 256
     * tokens: 120 + 40 + 8 + 32 + 512 + 4 + 1024 + 8 = 1748 -> 2048 */
    roundtrip(16, 32, 256, 512, 2048);
    /* the same under O_DIRECT with 4096-byte blocks */
    roundtrip(16, 32, 256, 4096, 4096);
    /* integer hashes (vLLM's int block hashes), no tokens */
    roundtrip(8, 0, 0, 512, 512);
    /* the largest tag: 64 x 32 bytes, no tokens */
    roundtrip(64, 32, 0, 512, 2560);
}

/* A fixed 512-byte area keeps what fits: the hashes without the tokens, or
 * no tag at all (version 1). kvt_objhdr_len under a cap does the same. */
static void test_tag_fits(void)
{
    kvt_key k = make_key(3);
    kvt_objmeta m = make_meta();
    uint8_t buf[512];
    struct kvt_objhdr h;
    const char *why = NULL;
    struct kvt_blocktag *t = make_tag(4, 32, 1024); /* 4 KiB of tokens */
    TEST_ASSERT(kvt_objhdr_encode(buf, 512, &k, &m, t, 0, 5000, 0x1122334455667788ull) == 0);
    TEST_ASSERT(kvt_objhdr_decode(buf, 512, &h, &why) == 0);
    struct kvt_blocktag *got = kvt_objhdr_tag(buf, &h);
    same_tag(t, got, false);
    kvt_blocktag_put(got);
    TEST_ASSERT(kvt_objhdr_len(&k, t, 512, 512) == 512);
    /* 4096 tokens: the whole tag is past KVT_OBJHDR_MAX, the hashes are kept */
    kvt_blocktag_put(t);
    t = make_tag(4, 32, 4096);
    TEST_ASSERT(kvt_objhdr_len(&k, t, 512, 65024) == 512);
    kvt_blocktag_put(t);
    t = make_tag(16, 32, 0); /* 520 bytes of hashes: no room in 512 */
    TEST_ASSERT(kvt_objhdr_encode(buf, 512, &k, &m, t, 0, 5000, 0x1122334455667788ull) == 0);
    TEST_ASSERT(kvt_get16(buf + 8) == KVT_OBJHDR_VERSION);
    TEST_ASSERT(kvt_objhdr_decode(buf, 512, &h, &why) == 0);
    TEST_ASSERT(h.tag_len == 0 && kvt_objhdr_tag(buf, &h) == NULL);
    TEST_ASSERT(kvt_objhdr_len(&k, t, 512, 512) == 512);
    TEST_ASSERT(kvt_objhdr_len(&k, t, 512, KVT_OBJHDR_MAX) == 1024);
    kvt_blocktag_put(t);
}

/* Rewrite the header's checksum after a change (what a bug or a hostile
 * writer would do): the structure checks still refuse the tag. */
static void reseal(uint8_t *p)
{
    size_t end = 120 + kvt_get16(p + 52) + kvt_get16(p + 54) + kvt_get32(p + 112);
    kvt_put64(p + end, XXH3_64bits(p, end));
}

static void test_corrupt_tag(void)
{
    kvt_key k = make_key(4);
    kvt_objmeta m = make_meta();
    struct kvt_blocktag *t = make_tag(4, 32, 8);
    uint8_t good[512], buf[512];
    TEST_ASSERT(kvt_objhdr_encode(good, 512, &k, &m, t, 0, 5000, 0x1122334455667788ull) == 0);
    kvt_blocktag_put(t);
    struct kvt_objhdr h;
    const char *why = NULL;
    TEST_ASSERT(kvt_objhdr_decode(good, 512, &h, &why) == 0);
    uint32_t off = h.tag_off, len = h.tag_len;
    /* every byte of the tag is under the header checksum */
    for (uint32_t i = 0; i < len; i++) {
        memcpy(buf, good, 512);
        buf[off + i] ^= 0x10;
        why = NULL;
        TEST_ASSERT(kvt_objhdr_decode(buf, 512, &h, &why) == KVT_E_CORRUPT);
        TEST_ASSERT(why && strcmp(why, "header checksum mismatch") == 0);
    }
    struct {
        size_t at;
        int kind; /* 0: byte, 1: u16, 2: u32 */
        uint32_t v;
        const char *what;
    } cases[] = {
        {0, 2, 0, "block size 0"},
        {4, 1, 0, "no blocks"},
        {4, 1, KVT_BLOCKTAG_MAX + 1, "too many blocks"},
        {6, 0, 33, "hash length over 32"},
        {7, 0, 1 | 2 | 4, "unknown tag flag"},
        {7, 0, 2, "no parent: the length disagrees"},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        memcpy(buf, good, 512);
        uint8_t *q = buf + off + cases[c].at;
        if (cases[c].kind == 0)
            *q = (uint8_t)cases[c].v;
        else if (cases[c].kind == 1)
            kvt_put16(q, (uint16_t)cases[c].v);
        else
            kvt_put32(q, cases[c].v);
        reseal(buf);
        why = NULL;
        fprintf(stderr, "   %s\n", cases[c].what);
        TEST_ASSERT(kvt_objhdr_decode(buf, 512, &h, &why) == KVT_E_CORRUPT);
    }
    /* token count beyond the tag */
    memcpy(buf, good, 512);
    kvt_put32(buf + off + len - 8 * 4 - 4, 9);
    reseal(buf);
    TEST_ASSERT(kvt_objhdr_decode(buf, 512, &h, &why) == KVT_E_CORRUPT);
    /* the word after tag_len must be zero */
    memcpy(buf, good, 512);
    kvt_put32(buf + 116, 1);
    reseal(buf);
    TEST_ASSERT(kvt_objhdr_decode(buf, 512, &h, &why) == KVT_E_CORRUPT);
    /* a tag length that runs past the area, or none with version 2 */
    memcpy(buf, good, 512);
    kvt_put32(buf + 112, 600);
    TEST_ASSERT(kvt_objhdr_decode(buf, 512, &h, &why) == KVT_E_CORRUPT);
    TEST_ASSERT(strcmp(why, "bad header lengths") == 0);
    memcpy(buf, good, 512);
    kvt_put32(buf + 112, 0);
    reseal(buf);
    TEST_ASSERT(kvt_objhdr_decode(buf, 512, &h, &why) == KVT_E_CORRUPT);
    /* a version 1 header whose reserved field holds a tag length: the tag
     * is not read (the checksum covers only what version 1 covers) */
    memcpy(buf, good, 512);
    kvt_put16(buf + 8, 1);
    TEST_ASSERT(kvt_objhdr_decode(buf, 512, &h, &why) == KVT_E_CORRUPT);
    /* an unknown version */
    memcpy(buf, good, 512);
    kvt_put16(buf + 8, 3);
    reseal(buf);
    TEST_ASSERT(kvt_objhdr_decode(buf, 512, &h, &why) == KVT_E_CORRUPT);
    TEST_ASSERT(strcmp(why, "unknown header version") == 0);
    /* nonzero padding after a tag */
    memcpy(buf, good, 512);
    buf[511] = 1;
    TEST_ASSERT(kvt_objhdr_decode(buf, 512, &h, &why) == KVT_E_CORRUPT);
    TEST_ASSERT(strcmp(why, "header padding not zero") == 0);
}

int main(void)
{
    RUN(test_old_format);
    RUN(test_tag_roundtrip);
    RUN(test_tag_fits);
    RUN(test_corrupt_tag);
    return TEST_RESULT();
}
