/* LMCache front end pieces without a server: BLAKE3 and LMCache's token
 * chunk hashing (vectors from the reference implementation and from
 * lmcache 0.5.6's TokenHasher), the MP protocol decoder, and the L1 pool as a
 * named POSIX shm object (what LMCache workers open). */
#include "key/blake3.h"
#include "kvtier/error.h"
#include "l1/l1.h"
#include "proto/lmc_wire.h"
#include "test.h"

#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

static void hex(const uint8_t *h, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", h[i]);
}

static void test_blake3_vectors(void)
{
    /* BLAKE3 test_vectors.json: input byte i is i % 251 */
    static const struct {
        size_t len;
        const char *hash;
    } v[] = {
        {0, "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"},
        {1, "2d3adedff11b61f14c886e35afa036736dcd87a74d27b5c1510225d0f592e213"},
        {63, "e9bc37a594daad83be9470df7f7b3798297c3d834ce80ba85d6e207627b7db7b"},
        {64, "4eed7141ea4a5cd4b788606bd23f46e212af9cacebacdc7d1f4c6dc7f2511b98"},
        {65, "de1e5fa0be70df6d2be8fffd0e99ceaa8eb6e8c93a63f2d8d1c30ecb6b263dee"},
        {1023, "10108970eeda3eb932baac1428c7a2163b0e924c9a9e25b35bba72b28f70bd11"},
        {1024, "42214739f095a406f3fc83deb889744ac00df831c10daa55189b5d121c855af7"},
        {1025, "d00278ae47eb27b34faecf67b4fe263f82d5412916c1ffd97c8cb7fb814b8444"},
        {2048, "e776b6028c7cd22a4d0ba182a8bf62205d2ef576467e838ed6f2529b85fba24a"},
        {2049, "5f4d72f40d7a5f82b15ca2b2e44b1de3c2ef86c426c95c1af0b6879522563030"},
        {3072, "b98cb0ff3623be03326b373de6b9095218513e64f1ee2edd2525c7ad1e5cffd2"},
        {3073, "7124b49501012f81cc7f11ca069ec9226cecb8a2c850cfe644e327d22d3e1cd3"},
        {5000, "ee78d92070de3df1c57c37002abf0a6b1a6589acdeef4d8ffac7cf3d9e8f2836"},
        {8193, "bab6c09cb8ce8cf459261398d2e7aef35700bf488116ceb94a36d0f5f1b7bc3b"},
    };
    uint8_t *in = malloc(8193);
    for (size_t i = 0; i < 8193; i++)
        in[i] = (uint8_t)(i % 251);
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        uint8_t h[32];
        char s[65];
        kvt_blake3(in, v[i].len, h);
        hex(h, 32, s);
        if (strcmp(s, v[i].hash))
            fprintf(stderr, "len %zu: %s\n", v[i].len, s);
        TEST_ASSERT(strcmp(s, v[i].hash) == 0);
    }
    free(in);
}

static void test_lmcache_token_hashes(void)
{
    /* lmcache 0.5.6: TokenHasher(chunk_size=16, hash_algorithm="blake3")
     * .compute_chunk_hashes([i * 7 + 1 for i in range(40)]) */
    uint32_t t[40];
    for (int i = 0; i < 40; i++)
        t[i] = (uint32_t)(i * 7 + 1);
    uint8_t h[32 * 4];
    char s[65];
    TEST_ASSERT(kvt_lmc_chunk_hashes(t, 40, 16, h, 4) == 2); /* 8 tokens: a partial chunk */
    hex(h, 32, s);
    TEST_ASSERT(strcmp(s, "7edd4ca4e1fd72d5b9b7b463c91475dd80fa68fb852127cef44608252f1cb0cf") == 0);
    hex(h + 32, 32, s);
    TEST_ASSERT(strcmp(s, "10e0dd51257d9b73b39608c3ce415546254ca812007d6e8638d39e6426c82933") == 0);
    TEST_ASSERT(kvt_lmc_chunk_hashes(t, 40, 16, h, 1) == 1); /* max_out caps */
    TEST_ASSERT(kvt_lmc_chunk_hashes(t, 15, 16, h, 4) == 0);
}

static void pack_op_int(msgpack_sbuffer *sb, int64_t v)
{
    msgpack_packer pk;
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    msgpack_pack_int64(&pk, v);
}

static void test_decode_op(void)
{
    enum lmc_op op;
    char name[80];
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    pack_op_int(&sb, 14);
    TEST_ASSERT(lmc_decode_op(sb.data, sb.size, &op, name, sizeof(name)) == 0);
    TEST_ASSERT(op == LMC_REGISTER_ED_CONTEXT);
    msgpack_sbuffer_clear(&sb);
    pack_op_int(&sb, 11); /* retired */
    TEST_ASSERT(lmc_decode_op(sb.data, sb.size, &op, name, sizeof(name)) == 0);
    TEST_ASSERT(op == LMC_OP_UNKNOWN && strstr(name, "11"));
    msgpack_sbuffer_clear(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_str_with_body(&pk, "subscribe_kv_events", 19);
    TEST_ASSERT(lmc_decode_op(sb.data, sb.size, &op, name, sizeof(name)) == 0);
    TEST_ASSERT(op == LMC_SUBSCRIBE_KV_EVENTS);
    /* trailing bytes, not msgpack, empty, a map */
    TEST_ASSERT(lmc_decode_op("\x08\x08", 2, &op, name, sizeof(name)) == KVT_E_BADREQ);
    TEST_ASSERT(lmc_decode_op("\xc1", 1, &op, name, sizeof(name)) == KVT_E_BADREQ);
    TEST_ASSERT(lmc_decode_op("", 0, &op, name, sizeof(name)) == KVT_E_BADREQ);
    TEST_ASSERT(lmc_decode_op("\x80", 1, &op, name, sizeof(name)) == KVT_E_BADREQ);
    msgpack_sbuffer_destroy(&sb);
    for (int i = 1; i < LMC_OP_COUNT; i++)
        TEST_ASSERT(lmc_ops[i].name && lmc_ops[i].name[0]);
}

static void pack_key(msgpack_packer *pk, const char *model, int ws, int worker, int ntok, int start,
                     int end, bool bad_token)
{
    msgpack_pack_map(pk, 9);
    msgpack_pack_str_with_body(pk, "model_name", 10);
    msgpack_pack_str_with_body(pk, model, strlen(model));
    msgpack_pack_str_with_body(pk, "world_size", 10);
    msgpack_pack_int(pk, ws);
    msgpack_pack_str_with_body(pk, "worker_id", 9);
    if (worker < 0)
        msgpack_pack_nil(pk);
    else
        msgpack_pack_int(pk, worker);
    msgpack_pack_str_with_body(pk, "token_ids", 9);
    msgpack_pack_array(pk, (size_t)ntok);
    for (int i = 0; i < ntok; i++) {
        if (bad_token && i == ntok - 1)
            msgpack_pack_int(pk, -1);
        else
            msgpack_pack_uint32(pk, (uint32_t)i * 3);
    }
    msgpack_pack_str_with_body(pk, "start", 5);
    msgpack_pack_int(pk, start);
    msgpack_pack_str_with_body(pk, "end", 3);
    msgpack_pack_int(pk, end);
    msgpack_pack_str_with_body(pk, "request_id", 10);
    msgpack_pack_str_with_body(pk, "req-1", 5);
    msgpack_pack_str_with_body(pk, "cache_salt", 10);
    msgpack_pack_str_with_body(pk, "", 0);
    msgpack_pack_str_with_body(pk, "num_kv_readers", 14);
    msgpack_pack_int(pk, 1);
}

static int decode_packed_key(const char *model, int ws, int worker, int ntok, bool bad,
                             struct lmc_key *k)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    pack_key(&pk, model, ws, worker, ntok, 0, ntok, bad);
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    char why[256];
    int rc = lmc_unpack(sb.data, sb.size, &up);
    if (rc == 0)
        rc = lmc_key_decode(&up.data, k, why, sizeof(why));
    if (rc == 0) /* strings point into the payload: copy what the test reads */
        k->model = k->model_len ? "ok" : "";
    msgpack_unpacked_destroy(&up);
    msgpack_sbuffer_destroy(&sb);
    return rc;
}

static void test_decode_key(void)
{
    struct lmc_key k;
    TEST_ASSERT(decode_packed_key("m/x", 2, -1, 33, false, &k) == 0);
    TEST_ASSERT(k.world_size == 2 && !k.has_worker && k.ntokens == 33 && k.tokens[32] == 96);
    TEST_ASSERT(k.end == 33 && k.rid_len == 5 && k.num_kv_readers == 1);
    lmc_key_free(&k);
    TEST_ASSERT(decode_packed_key("m", 2, 1, 4, false, &k) == 0);
    TEST_ASSERT(k.has_worker && k.worker_id == 1);
    lmc_key_free(&k);
    TEST_ASSERT(decode_packed_key("m", 2, 2, 4, false, &k) == KVT_E_BADREQ); /* worker >= world */
    TEST_ASSERT(decode_packed_key("m", 0, -1, 4, false, &k) == KVT_E_BADREQ);
    TEST_ASSERT(decode_packed_key("m", 256, -1, 4, false, &k) == KVT_E_BADREQ);
    TEST_ASSERT(decode_packed_key("m", 1, -1, 4, true, &k) == KVT_E_BADREQ); /* negative token */
    TEST_ASSERT(lmc_kv_rank(4, 3) == ((4u << 24) | (3u << 16) | (4u << 8) | 3u));
}

static void test_decode_register(void)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 9);
#define KS(s) msgpack_pack_str_with_body(&pk, s, strlen(s))
    KS("instance_id"), msgpack_pack_int(&pk, 77);
    KS("model_name"), KS("m");
    KS("world_size"), msgpack_pack_int(&pk, 1);
    KS("block_size"), msgpack_pack_int(&pk, 16);
    KS("num_layers"), msgpack_pack_int(&pk, 2);
    KS("hidden_dim_size"), msgpack_pack_int(&pk, 64);
    KS("dtype_str"), KS("bfloat16");
    KS("use_mla"), msgpack_pack_false(&pk);
    KS("num_physical_slots"), msgpack_pack_nil(&pk);
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    TEST_ASSERT(lmc_unpack(sb.data, sb.size, &up) == 0);
    struct lmc_register r;
    char why[256];
    TEST_ASSERT(lmc_register_decode(&up.data, &r, why, sizeof(why)) == 0);
    TEST_ASSERT(r.instance_id == 77 && r.num_layers == 2 && r.hidden_dim == 64);
    TEST_ASSERT(strcmp(r.dtype, "bfloat16") == 0 && !r.use_mla && r.num_physical_slots == 0);
    msgpack_unpacked_destroy(&up);
    /* a bad dtype names itself */
    msgpack_sbuffer_clear(&sb);
    msgpack_pack_map(&pk, 8);
    KS("instance_id"), msgpack_pack_int(&pk, 77);
    KS("model_name"), KS("m");
    KS("world_size"), msgpack_pack_int(&pk, 1);
    KS("block_size"), msgpack_pack_int(&pk, 16);
    KS("num_layers"), msgpack_pack_int(&pk, 2);
    KS("hidden_dim_size"), msgpack_pack_int(&pk, 64);
    KS("dtype_str"), KS("floaty");
    KS("use_mla"), msgpack_pack_true(&pk);
#undef KS
    msgpack_unpacked_init(&up);
    TEST_ASSERT(lmc_unpack(sb.data, sb.size, &up) == 0);
    TEST_ASSERT(lmc_register_decode(&up.data, &r, why, sizeof(why)) == KVT_E_BADREQ);
    TEST_ASSERT(strstr(why, "floaty") != NULL);
    msgpack_unpacked_destroy(&up);
    msgpack_sbuffer_destroy(&sb);
}

/* msgpack-c allocates an array from its declared size before reading it: a
 * 6-byte payload declaring 2^31 elements must be refused before that (under
 * RLIMIT_AS the unchecked unpack fails with an allocation error instead). */
static void test_unpack_declared_lengths(void)
{
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    TEST_ASSERT(lmc_unpack("\xdd\x7f\xff\xff\xff\x01", 6, &up) == KVT_E_BADREQ);
    TEST_ASSERT(lmc_unpack("\xdf\x00\x01\x00\x00", 5, &up) == KVT_E_BADREQ);
    TEST_ASSERT(lmc_unpack("\xc6\xff\xff\xff\xff", 5, &up) == KVT_E_BADREQ);
    TEST_ASSERT(lmc_unpack("\x92\x01\x02", 3, &up) == 0 && up.data.via.array.size == 2);
    msgpack_unpacked_destroy(&up);
}

static void test_l1_named_pool(void)
{
    char name[64];
    snprintf(name, sizeof(name), "kvtier_unit_%d", (int)getpid());
    struct kvt_l1_opts o = {.size_bytes = 8 << 20,
                            .init_bytes = 1 << 20,
                            .lazy = true,
                            .align = 4096,
                            .write_ttl_ns = 1000000000ull,
                            .read_ttl_ns = 1000000000ull,
                            .policy = "LRU",
                            .watermark = 0.8,
                            .ratio = 0.2,
                            .shm_name = name};
    struct kvt_l1 *l1;
    char err[256];
    TEST_ASSERT(kvt_l1_create(&o, &l1, err, sizeof(err)) == 0);
    char path[96];
    snprintf(path, sizeof(path), "/%s", name);
    int fd = shm_open(path, O_RDWR, 0);
    TEST_ASSERT(fd >= 0);
    struct stat st;
    TEST_ASSERT(fstat(fd, &st) == 0 && st.st_size == 8 << 20); /* whole size, lazy or not */
    TEST_ASSERT((st.st_mode & 0777) == 0600);
    /* a second pool of the same name is refused, naming it */
    struct kvt_l1 *l2;
    TEST_ASSERT(kvt_l1_create(&o, &l2, err, sizeof(err)) != 0);
    TEST_ASSERT(strstr(err, name) != NULL);
    /* bytes written through the pool are seen through the name */
    kvt_key k;
    uint32_t ns;
    const char *why;
    TEST_ASSERT(kvt_ns_intern("m", 1, "", 0, &ns, &why) == 0);
    uint8_t h[32] = {1};
    kvt_key_make(&k, ns, h, 32, 0, 0);
    kvt_objmeta m = {.len = 5000};
    struct kvt_l1_ref ref;
    TEST_ASSERT(kvt_l1_reserve(l1, &k, &m, &ref) == 0);
    memcpy(ref.ptr, "hello", 5);
    char *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    TEST_ASSERT(map != MAP_FAILED && memcmp(map + ref.off, "hello", 5) == 0);
    munmap(map, (size_t)st.st_size);
    close(fd);
    kvt_l1_abort(l1, ref.h);
    kvt_l1_put(l1, ref.h);
    kvt_l1_destroy(l1);
    TEST_ASSERT(shm_open(path, O_RDONLY, 0) < 0); /* unlinked with the pool */
    o.hugepages = true;                           /* no name with huge pages */
    TEST_ASSERT(kvt_l1_create(&o, &l1, err, sizeof(err)) != 0);
}

int main(void)
{
    RUN(test_blake3_vectors);
    RUN(test_lmcache_token_hashes);
    RUN(test_decode_op);
    RUN(test_decode_key);
    RUN(test_decode_register);
    RUN(test_unpack_declared_lengths);
    RUN(test_l1_named_pool);
    return TEST_RESULT();
}
