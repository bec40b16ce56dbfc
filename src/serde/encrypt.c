/*
 * encrypt serde: AES-GCM at rest for an L2 tier.
 *
 * Config: master_key_path (required): a file of 32 raw bytes or 64 hex
 *         characters (trailing whitespace allowed), not accessible by group
 *         or others; aes_bits 128 | 256 (default 256); key_provider "hkdf"
 *         (the only one, as in LMCache).
 * Keys:   one key per cache_salt, HKDF-SHA256(master, salt = none,
 *         info = "kvtier-l2-encrypt-v1" NUL cache_salt), aes_bits/8 bytes,
 *         cached per namespace. Anyone holding the master key can derive
 *         every tenant's key: this protects stored bytes from whoever can
 *         read the storage, not tenants from each other.
 * Frame:  [IV 12 random bytes][ciphertext, same length as the input][tag 16]
 * AAD:    the object's identity (model, salt, kv_rank, group, chunk hash,
 *         logical length, dtype). LMCache binds nothing, so a ciphertext
 *         copied under another key's name decrypts there; here the tag
 *         check fails and the load is a miss (decrypt_failures).
 * Key check: 8 bytes of HKDF(master, info "kvtier-l2-keycheck-v1") go into
 *         the chain id, so objects written under another master key are
 *         recognised as foreign (chain_mismatches) without trying them.
 * Nothing derived from key material is logged or shown in status.
 */
#include "serde/serde_int.h"
#include "common/u32map.h"
#include "common/util.h"
#include "kvtier/error.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/params.h>
#include <openssl/rand.h>

#define IV_LEN 12
#define TAG_LEN 16
#define KEY_CACHE_MAX 65536

struct enc {
    uint8_t master[32];
    int bits;
    EVP_CIPHER *cipher;
    EVP_KDF *kdf;
    uint8_t kcv[8];
    pthread_mutex_t lock;  /* guards map, keys, nkeys, capkeys */
    struct kvt_u32map map; /* namespace id -> position in keys */
    uint8_t (*keys)[32];
    uint32_t nkeys, capkeys;
};

/* HKDF-SHA256(master, info = prefix NUL suffix) -> out[len]. */
static int hkdf(const struct enc *e, const char *prefix, const char *suffix, uint8_t *out,
                size_t len)
{
    char info[16 + 32 + KVT_SALT_MAX + 2];
    size_t pl = strlen(prefix), sl = strlen(suffix);
    memcpy(info, prefix, pl + 1);
    memcpy(info + pl + 1, suffix, sl);
    EVP_KDF_CTX *k = EVP_KDF_CTX_new(e->kdf);
    if (!k)
        return -ENOMEM;
    OSSL_PARAM p[] = {
        OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, (char *)"SHA256", 0),
        OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, (void *)e->master, sizeof(e->master)),
        OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, info, pl + 1 + sl),
        OSSL_PARAM_construct_end(),
    };
    int ok = EVP_KDF_derive(k, out, len, p);
    EVP_KDF_CTX_free(k);
    return ok == 1 ? 0 : -EIO;
}

/* The key of a namespace's cache_salt into key[32]; cached per namespace. */
static int salt_key(struct enc *e, uint32_t ns, uint8_t key[32])
{
    uint32_t pos;
    int rc = 0;
    pthread_mutex_lock(&e->lock);
    if (kvt_u32map_get(&e->map, ns, &pos)) {
        memcpy(key, e->keys[pos], 32);
        goto out;
    }
    memset(key, 0, 32);
    rc = hkdf(e, "kvtier-l2-encrypt-v1", kvt_ns_salt(ns), key, (size_t)e->bits / 8);
    if (rc || e->nkeys >= KEY_CACHE_MAX)
        goto out;
    if (e->nkeys == e->capkeys) {
        uint32_t ncap = e->capkeys ? e->capkeys * 2 : 16;
        uint8_t(*nk)[32] = kvt_xcalloc(ncap, 32);
        if (e->keys) {
            memcpy(nk, e->keys, (size_t)e->nkeys * 32);
            OPENSSL_cleanse(e->keys, (size_t)e->capkeys * 32);
            free(e->keys);
        }
        e->keys = nk;
        e->capkeys = ncap;
    }
    memcpy(e->keys[e->nkeys], key, 32);
    kvt_u32map_put(&e->map, ns, e->nkeys++);
out:
    pthread_mutex_unlock(&e->lock);
    return rc;
}

/*
 * Read the master key file. Refused: missing or unreadable, not a regular
 * file, any permission bit for group or others (like ssh's private keys),
 * or content other than 32 raw bytes / 64 hex characters. The messages
 * describe the file, never its content.
 */
static int load_key(struct kvt_cfg *c, const char *path, uint8_t master[32])
{
    uint8_t buf[258];
    ssize_t n = -1;
    int rc = 0;
    /* O_NONBLOCK: a FIFO or device named here must not hang the start-up;
     * it is refused as not a regular file below */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0)
        return kvt_cfg_fail(c, "master_key_path", "cannot be read: %s: %s", path,
                            kvt_strerror(-errno));
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        rc = kvt_cfg_fail(c, "master_key_path", "is not a regular file: %s", path);
        goto out;
    }
    if (st.st_mode & 077) {
        rc = kvt_cfg_fail(c, "master_key_path",
                          "is accessible by group or others (mode %04o): %s; restrict it "
                          "with chmod 600",
                          (unsigned)(st.st_mode & 07777), path);
        goto out;
    }
    size_t got = 0;
    while (got < sizeof(buf)) {
        n = read(fd, buf + got, sizeof(buf) - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    if (n < 0) {
        rc = kvt_cfg_fail(c, "master_key_path", "cannot be read: %s: %s", path,
                          kvt_strerror(-errno));
        goto out;
    }
    if (got == 32) {
        memcpy(master, buf, 32);
        goto out;
    }
    size_t len = got;
    while (len && (buf[len - 1] == '\n' || buf[len - 1] == '\r' || buf[len - 1] == ' ' ||
                   buf[len - 1] == '\t'))
        len--;
    bool hex = len == 64 && kvt_unhex((const char *)buf, 64, master) == 0;
    if (!hex) {
        OPENSSL_cleanse(master, 32);
        rc = kvt_cfg_fail(c, "master_key_path",
                          "must hold exactly 32 raw bytes or 64 hex characters: %s has %s%zu "
                          "bytes",
                          path, got >= sizeof(buf) ? "more than " : "",
                          got >= sizeof(buf) ? sizeof(buf) - 1 : got);
    }
out:
    OPENSSL_cleanse(buf, sizeof(buf));
    close(fd);
    return rc;
}

static void enc_free(struct kvt_sd *sd)
{
    struct enc *e = sd->priv;
    if (!e)
        return;
    OPENSSL_cleanse(e->master, sizeof(e->master));
    if (e->keys) {
        OPENSSL_cleanse(e->keys, (size_t)e->capkeys * 32);
        free(e->keys);
    }
    kvt_u32map_free(&e->map);
    EVP_CIPHER_free(e->cipher);
    EVP_KDF_free(e->kdf);
    pthread_mutex_destroy(&e->lock);
    free(e);
    sd->priv = NULL;
}

static int enc_parse(struct kvt_cfg *c, struct kvt_sd *sd)
{
    static const char *const providers[] = {"hkdf", NULL};
    const char *path = NULL, *prov = NULL;
    int64_t bits = 256;
    kvt_cfg_str(c, "master_key_path", true, NULL, &path);
    kvt_cfg_int(c, "aes_bits", false, 256, 128, 256, &bits);
    kvt_cfg_enum(c, "key_provider", false, "hkdf", providers, false, &prov);
    if (c->rc)
        return c->rc;
    if (bits != 128 && bits != 256)
        return kvt_cfg_fail(c, "aes_bits", "must be 128 or 256 (got %lld)", (long long)bits);
    if (!path[0])
        return kvt_cfg_fail(c, "master_key_path", "must not be empty");
    struct enc *e = kvt_xcalloc(1, sizeof(*e));
    pthread_mutex_init(&e->lock, NULL);
    kvt_u32map_init(&e->map);
    e->bits = (int)bits;
    sd->priv = e;
    if (load_key(c, path, e->master))
        return c->rc;
    e->cipher = EVP_CIPHER_fetch(NULL, bits == 256 ? "AES-256-GCM" : "AES-128-GCM", NULL);
    e->kdf = EVP_KDF_fetch(NULL, "HKDF", NULL);
    if (!e->cipher || !e->kdf)
        return kvt_cfg_fail(c, "type", "needs AES-GCM and HKDF, which this OpenSSL lacks");
    if (hkdf(e, "kvtier-l2-keycheck-v1", "", e->kcv, sizeof(e->kcv)))
        return kvt_cfg_fail(c, "master_key_path", "key derivation failed");
    return 0;
}

static void enc_describe(const struct kvt_sd *sd, char *buf, size_t cap)
{
    const struct enc *e = sd->priv;
    char h[17];
    kvt_hex(e->kcv, sizeof(e->kcv), h);
    snprintf(buf, cap, ":aes%d:kcv=%s", e->bits, h);
}

static uint64_t enc_bound(const struct kvt_sd *sd, uint64_t n)
{
    (void)sd;
    return n + IV_LEN + TAG_LEN;
}

static EVP_CIPHER_CTX *wctx_evp(struct kvt_serde_wctx *w)
{
    if (!w->evp)
        w->evp = EVP_CIPHER_CTX_new();
    return w->evp;
}

void kvt_sd_encrypt_wctx_free(struct kvt_serde_wctx *w)
{
    EVP_CIPHER_CTX_free(w->evp);
    w->evp = NULL;
}

static int enc_encode(const struct kvt_sd *sd, struct kvt_serde_wctx *w, struct kvt_sd_obj *o,
                      const uint8_t *in, size_t n, uint8_t *out, size_t cap, size_t *outn)
{
    struct enc *e = sd->priv;
    EVP_CIPHER_CTX *ctx = wctx_evp(w);
    if (!ctx)
        return -ENOMEM;
    if (cap < n + IV_LEN + TAG_LEN || n > INT32_MAX)
        return -ENOSPC;
    uint8_t key[32];
    int rc = salt_key(e, o->ck->ns, key);
    if (rc)
        return rc;
    int l = 0, fl = 0;
    rc = -EIO;
    if (RAND_bytes(out, IV_LEN) != 1)
        goto out;
    if (EVP_EncryptInit_ex2(ctx, e->cipher, key, out, NULL) != 1)
        goto out;
    if (EVP_EncryptUpdate(ctx, NULL, &l, o->id, (int)o->idlen) != 1)
        goto out;
    l = 0;
    if (n && EVP_EncryptUpdate(ctx, out + IV_LEN, &l, in, (int)n) != 1)
        goto out;
    if (EVP_EncryptFinal_ex(ctx, out + IV_LEN + l, &fl) != 1 || (size_t)(l + fl) != n)
        goto out;
    if (EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, TAG_LEN, out + IV_LEN + n) != 1)
        goto out;
    *outn = n + IV_LEN + TAG_LEN;
    o->dtype = KVT_DTYPE_U8; /* opaque from here on */
    rc = 0;
out:
    OPENSSL_cleanse(key, sizeof(key));
    return rc;
}

static int enc_decode(const struct kvt_sd *sd, struct kvt_serde_wctx *w, struct kvt_sd_obj *o,
                      const uint8_t *in, size_t n, uint8_t *out, size_t cap, size_t *outn)
{
    struct enc *e = sd->priv;
    EVP_CIPHER_CTX *ctx = wctx_evp(w);
    if (!ctx)
        return kvt_sd_bad(o, KVT_SERDE_NOMEM);
    if (n < IV_LEN + TAG_LEN)
        return kvt_sd_bad(o, KVT_SERDE_FORMAT);
    size_t plen = n - IV_LEN - TAG_LEN;
    if (plen > cap || plen > INT32_MAX)
        return kvt_sd_bad(o, KVT_SERDE_LENGTH);
    uint8_t key[32];
    if (salt_key(e, o->ck->ns, key))
        return kvt_sd_bad(o, KVT_SERDE_NOMEM);
    int l = 0, fl = 0, rc = kvt_sd_bad(o, KVT_SERDE_DECRYPT);
    if (EVP_DecryptInit_ex2(ctx, e->cipher, key, in, NULL) != 1)
        goto out;
    if (EVP_DecryptUpdate(ctx, NULL, &l, o->id, (int)o->idlen) != 1)
        goto out;
    l = 0;
    if (plen && EVP_DecryptUpdate(ctx, out, &l, in + IV_LEN, (int)plen) != 1)
        goto out;
    if (EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, TAG_LEN, (void *)(in + IV_LEN + plen)) != 1)
        goto out;
    /* the tag is checked here; before it, out holds unauthenticated bytes */
    if (EVP_DecryptFinal_ex(ctx, out + l, &fl) != 1 || (size_t)(l + fl) != plen)
        goto out;
    *outn = plen;
    o->fail = KVT_SERDE_OK;
    rc = 0;
out:
    if (rc)
        memset(out, 0, plen); /* never leave unauthenticated plaintext behind */
    OPENSSL_cleanse(key, sizeof(key));
    return rc;
}

const struct kvt_sd_ops kvt_sd_encrypt_ops = {
    .type = "encrypt",
    .parse = enc_parse,
    .bound = enc_bound,
    .encode = enc_encode,
    .decode = enc_decode,
    .describe = enc_describe,
    .free = enc_free,
};
