/*
 * BLAKE3 (hash mode, 32-byte output), portable C, one-shot.
 *
 * LMCache's multi-process server names chunks with BLAKE3 by default
 * (lmcache/v1/multiprocess/token_hasher.py); the LMCache front end
 * (src/front/lmcache/lmc.c) computes the same names. Written from the BLAKE3
 * specification (https://github.com/BLAKE3-team/BLAKE3-specs); checked
 * against the reference vectors in tests/unit/test_key.c.
 */
#include "key/blake3.h"

#include <stdlib.h>
#include <string.h>

#define B3_BLOCK 64
#define B3_CHUNK 1024
enum { CHUNK_START = 1, CHUNK_END = 2, PARENT = 4, ROOT = 8 };

static const uint32_t IV[8] = {0x6A09E667, 0xBB67AE85, 0x3C6EF372, 0xA54FF53A,
                               0x510E527F, 0x9B05688C, 0x1F83D9AB, 0x5BE0CD19};
static const uint8_t PERM[16] = {2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8};

static inline uint32_t rotr(uint32_t x, int n)
{
    return (x >> n) | (x << (32 - n));
}

static inline void g(uint32_t *s, int a, int b, int c, int d, uint32_t x, uint32_t y)
{
    s[a] = s[a] + s[b] + x;
    s[d] = rotr(s[d] ^ s[a], 16);
    s[c] = s[c] + s[d];
    s[b] = rotr(s[b] ^ s[c], 12);
    s[a] = s[a] + s[b] + y;
    s[d] = rotr(s[d] ^ s[a], 8);
    s[c] = s[c] + s[d];
    s[b] = rotr(s[b] ^ s[c], 7);
}

static void compress(const uint32_t cv[8], const uint8_t block[B3_BLOCK], uint64_t counter,
                     uint32_t block_len, uint32_t flags, uint32_t out[16])
{
    uint32_t m[16], t[16], s[16];
    for (int i = 0; i < 16; i++)
        m[i] = (uint32_t)block[4 * i] | (uint32_t)block[4 * i + 1] << 8 |
               (uint32_t)block[4 * i + 2] << 16 | (uint32_t)block[4 * i + 3] << 24;
    memcpy(s, cv, 8 * sizeof(uint32_t));
    memcpy(s + 8, IV, 4 * sizeof(uint32_t));
    s[12] = (uint32_t)counter;
    s[13] = (uint32_t)(counter >> 32);
    s[14] = block_len;
    s[15] = flags;
    for (int r = 0; r < 7; r++) {
        g(s, 0, 4, 8, 12, m[0], m[1]);
        g(s, 1, 5, 9, 13, m[2], m[3]);
        g(s, 2, 6, 10, 14, m[4], m[5]);
        g(s, 3, 7, 11, 15, m[6], m[7]);
        g(s, 0, 5, 10, 15, m[8], m[9]);
        g(s, 1, 6, 11, 12, m[10], m[11]);
        g(s, 2, 7, 8, 13, m[12], m[13]);
        g(s, 3, 4, 9, 14, m[14], m[15]);
        if (r < 6) {
            for (int i = 0; i < 16; i++)
                t[i] = m[PERM[i]];
            memcpy(m, t, sizeof(m));
        }
    }
    for (int i = 0; i < 8; i++) {
        out[i] = s[i] ^ s[i + 8];
        out[i + 8] = s[i + 8] ^ cv[i];
    }
}

/* What finalizing a node needs: compress its last block with or without ROOT. */
struct node {
    uint32_t cv[8];
    uint8_t block[B3_BLOCK];
    uint64_t counter;
    uint32_t block_len, flags;
};

static void node_cv(const struct node *n, uint32_t cv[8])
{
    uint32_t o[16];
    compress(n->cv, n->block, n->counter, n->block_len, n->flags, o);
    memcpy(cv, o, 8 * sizeof(uint32_t));
}

/* The chunk's output node: every block but the last compressed. */
static void chunk_node(const uint8_t *p, size_t len, uint64_t chunk, struct node *n)
{
    uint32_t cv[8], o[16];
    memcpy(cv, IV, sizeof(cv));
    uint32_t start = CHUNK_START;
    while (len > B3_BLOCK) {
        compress(cv, p, chunk, B3_BLOCK, start, o);
        memcpy(cv, o, sizeof(cv));
        start = 0;
        p += B3_BLOCK;
        len -= B3_BLOCK;
    }
    memcpy(n->cv, cv, sizeof(cv));
    memset(n->block, 0, sizeof(n->block));
    memcpy(n->block, p, len);
    n->counter = chunk;
    n->block_len = (uint32_t)len;
    n->flags = start | CHUNK_END;
}

static void parent_node(const uint32_t l[8], const uint32_t r[8], struct node *n)
{
    memcpy(n->cv, IV, sizeof(n->cv));
    for (int i = 0; i < 8; i++) {
        for (int b = 0; b < 4; b++) {
            n->block[4 * i + b] = (uint8_t)(l[i] >> (8 * b));
            n->block[32 + 4 * i + b] = (uint8_t)(r[i] >> (8 * b));
        }
    }
    n->counter = 0;
    n->block_len = B3_BLOCK;
    n->flags = PARENT;
}

void kvt_blake3(const void *data, size_t len, uint8_t out[32])
{
    const uint8_t *p = data;
    uint32_t stack[64][8]; /* one entry per level: enough for 2^64 chunks */
    int depth = 0;
    uint64_t chunk = 0;
    struct node n;
    /* every chunk but the last goes onto the merge stack */
    while (len > B3_CHUNK) {
        uint32_t cv[8];
        chunk_node(p, B3_CHUNK, chunk, &n);
        node_cv(&n, cv);
        uint64_t total = ++chunk;
        while ((total & 1) == 0) {
            struct node pn;
            parent_node(stack[--depth], cv, &pn);
            node_cv(&pn, cv);
            total >>= 1;
        }
        memcpy(stack[depth++], cv, sizeof(cv));
        p += B3_CHUNK;
        len -= B3_CHUNK;
    }
    chunk_node(p, len, chunk, &n);
    while (depth > 0) {
        uint32_t cv[8];
        node_cv(&n, cv);
        parent_node(stack[--depth], cv, &n);
    }
    uint32_t o[16];
    compress(n.cv, n.block, 0, n.block_len, n.flags | ROOT, o);
    for (int i = 0; i < 8; i++)
        for (int b = 0; b < 4; b++)
            out[4 * i + b] = (uint8_t)(o[i] >> (8 * b));
}

size_t kvt_lmc_chunk_hashes(const uint32_t *tokens, size_t n_tokens, size_t chunk_size,
                            uint8_t *out, size_t max_out)
{
    if (chunk_size == 0)
        return 0;
    size_t n = n_tokens / chunk_size;
    if (n > max_out)
        n = max_out;
    uint8_t prefix[32];
    static const uint8_t zeros[12];
    kvt_blake3(zeros, sizeof(zeros), prefix);
    uint8_t buf[32 + 4 * 4096];
    uint8_t *big = NULL;
    uint8_t *b = buf;
    if (chunk_size > 4096) {
        big = malloc(32 + 4 * chunk_size);
        if (!big)
            return 0;
        b = big;
    }
    for (size_t c = 0; c < n; c++) {
        memcpy(b, prefix, 32);
        const uint32_t *t = tokens + c * chunk_size;
        for (size_t i = 0; i < chunk_size; i++) {
            b[32 + 4 * i] = (uint8_t)(t[i] >> 24);
            b[32 + 4 * i + 1] = (uint8_t)(t[i] >> 16);
            b[32 + 4 * i + 2] = (uint8_t)(t[i] >> 8);
            b[32 + 4 * i + 3] = (uint8_t)t[i];
        }
        kvt_blake3(b, 32 + 4 * chunk_size, prefix);
        memcpy(out + 32 * c, prefix, 32);
    }
    free(big);
    return n;
}
