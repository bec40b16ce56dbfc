/*
 * Secrets in files: CURVE keys and bearer tokens (docs/security.md).
 *
 * A secret file must be a regular file owned by the caller's uid or root
 * and not accessible by group or others (mode 0600 or stricter), as ssh
 * requires of its private keys; anything else is refused. Error messages
 * name the file and the problem, never the bytes read.
 */
#ifndef KVT_COMMON_SECRET_H
#define KVT_COMMON_SECRET_H

#include <stdbool.h>
#include <stddef.h>

#define KVT_Z85_KEY_LEN 40 /* a CURVE key (32 bytes) in Z85 */

/* Read the first line of path that is neither empty nor a '#' comment,
 * without surrounding whitespace, into out (cap bytes, NUL-terminated).
 * secret: apply the ownership and mode rules above (public keys skip them).
 * 0, or -errno / KVT_E_CONFIG with err filled. */
int kvt_secret_read(const char *path, bool secret, char *out, size_t cap, char *err, size_t ecap);

/* true if s is exactly one Z85-encoded 32-byte key (40 characters). */
bool kvt_z85_key_ok(const char *s);

/* Overwrite n bytes at p with zeros in a way the compiler keeps. */
void kvt_secret_wipe(void *p, size_t n);

/* Compare two strings without an early exit on the first difference (for
 * tokens): true if equal. */
bool kvt_secret_equal(const char *a, const char *b);
/* The same for n bytes (binary secrets such as tickets). */
bool kvt_secret_bytes_equal(const void *a, const void *b, size_t n);

/* A CURVE client's keys (Z85, NUL-terminated); on = false: no CURVE. */
struct kvt_curve_keys {
    bool on;
    char server[41], pub[41], sec[41]; /* sec: wipe after use */
};

/* The keys named by server_file / client_file, each taking the environment
 * variable KVTIER_SERVER_KEY / KVTIER_CLIENT_KEY when NULL or "": none
 * named is no CURVE (0, k->on false); both must be given. 0, or -EINVAL /
 * -errno with err filled. */
int kvt_curve_keys_load(const char *server_file, const char *client_file, struct kvt_curve_keys *k,
                        char *err, size_t ecap);
/* Set k on a ZeroMQ socket before it connects: 0 or -errno. */
int kvt_curve_keys_apply(void *sock, const struct kvt_curve_keys *k);

#endif
