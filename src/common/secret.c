/* Secrets in files: the ownership and mode rules, one reader (secret.h). */
#include "common/secret.h"
#include "kvtier/error.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zmq.h>

#define SECRET_FILE_MAX 65536

int kvt_secret_read(const char *path, bool secret, char *out, size_t cap, char *err, size_t ecap)
{
    int fd = -1, rc = 0;
    char buf[SECRET_FILE_MAX + 1];
    ssize_t n = 0;
    out[0] = 0;
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
        rc = -errno;
        snprintf(err, ecap, "%s: cannot open: %s", path, kvt_strerror(-errno));
        goto out;
    }
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        rc = KVT_E_CONFIG;
        snprintf(err, ecap, "%s: not a regular file", path);
        goto out;
    }
    if (secret && (st.st_mode & 077)) {
        rc = KVT_E_CONFIG;
        snprintf(err, ecap,
                 "%s: permissions %04o are too open: a secret must not be accessible by group "
                 "or others (chmod 600 %s)",
                 path, (unsigned)(st.st_mode & 07777), path);
        goto out;
    }
    if (secret && st.st_uid != geteuid() && st.st_uid != 0) {
        rc = KVT_E_CONFIG;
        snprintf(err, ecap, "%s: owned by uid %u, not by this user (%u) or root", path,
                 (unsigned)st.st_uid, (unsigned)geteuid());
        goto out;
    }
    for (;;) {
        ssize_t r = read(fd, buf + n, (size_t)(SECRET_FILE_MAX - n));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            rc = -errno;
            snprintf(err, ecap, "%s: read: %s", path, kvt_strerror(-errno));
            goto out;
        }
        if (r == 0)
            break;
        n += r;
        if (n == SECRET_FILE_MAX) {
            rc = KVT_E_CONFIG;
            snprintf(err, ecap, "%s: larger than %d bytes", path, SECRET_FILE_MAX);
            goto out;
        }
    }
    buf[n] = 0;
    for (char *line = buf, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next)
            *next++ = 0;
        while (*line == ' ' || *line == '\t' || *line == '\r')
            line++;
        size_t l = strlen(line);
        while (l && (line[l - 1] == ' ' || line[l - 1] == '\t' || line[l - 1] == '\r'))
            line[--l] = 0;
        if (!l || line[0] == '#')
            continue;
        if (l >= cap) {
            rc = KVT_E_CONFIG;
            snprintf(err, ecap, "%s: the value is longer than %zu bytes", path, cap - 1);
            goto out;
        }
        memcpy(out, line, l + 1);
        goto out;
    }
    rc = KVT_E_CONFIG;
    snprintf(err, ecap, "%s: empty (no line other than comments)", path);
out:
    kvt_secret_wipe(buf, sizeof(buf));
    if (fd >= 0)
        close(fd);
    return rc;
}

bool kvt_z85_key_ok(const char *s)
{
    static const char z85[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                              ".-:+=^!/*?&<>()[]{}@%$#";
    if (strlen(s) != KVT_Z85_KEY_LEN)
        return false;
    for (const char *p = s; *p; p++)
        if (!strchr(z85, *p))
            return false;
    return true;
}

void kvt_secret_wipe(void *p, size_t n)
{
    explicit_bzero(p, n);
}

bool kvt_secret_equal(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    unsigned char d = la != lb;
    for (size_t i = 0; i < la; i++)
        d |= (unsigned char)(a[i] ^ b[i % (lb ? lb : 1)]);
    return d == 0 && lb == la;
}

bool kvt_secret_bytes_equal(const void *a, const void *b, size_t n)
{
    const unsigned char *x = a, *y = b;
    unsigned char d = 0;
    for (size_t i = 0; i < n; i++)
        d |= (unsigned char)(x[i] ^ y[i]);
    return d == 0;
}

static const char *opt_or_env(const char *v, const char *env)
{
    if (v && *v)
        return v;
    v = getenv(env);
    return v && *v ? v : NULL;
}

int kvt_curve_keys_load(const char *server_file, const char *client_file, struct kvt_curve_keys *k,
                        char *err, size_t ecap)
{
    const char *sk = opt_or_env(server_file, "KVTIER_SERVER_KEY");
    const char *ck = opt_or_env(client_file, "KVTIER_CLIENT_KEY");
    char why[1200];
    memset(k, 0, sizeof(*k));
    if (!sk && !ck)
        return 0;
    if (!sk || !ck) {
        snprintf(err, ecap,
                 "CURVE needs both keys: the server's public key (KVTIER_SERVER_KEY) "
                 "and this client's secret key (KVTIER_CLIENT_KEY); only the %s was "
                 "given",
                 sk ? "server's" : "client's");
        return -EINVAL;
    }
    if (!zmq_has("curve")) {
        snprintf(err, ecap, "this libzmq has no CURVE support");
        return -EINVAL;
    }
    int rc = kvt_secret_read(sk, false, k->server, sizeof(k->server), why, sizeof(why));
    if (!rc && !kvt_z85_key_ok(k->server)) {
        snprintf(why, sizeof(why), "%s: not a CURVE public key (40 Z85 characters)", sk);
        rc = -EINVAL;
    }
    if (rc) {
        snprintf(err, ecap, "server key: %s", why);
        return rc < -1000 ? -EINVAL : rc;
    }
    rc = kvt_secret_read(ck, true, k->sec, sizeof(k->sec), why, sizeof(why));
    if (!rc && (!kvt_z85_key_ok(k->sec) || zmq_curve_public(k->pub, k->sec))) {
        snprintf(why, sizeof(why), "%s: not a CURVE secret key (40 Z85 characters)", ck);
        rc = -EINVAL;
    }
    if (rc) {
        kvt_secret_wipe(k, sizeof(*k));
        snprintf(err, ecap, "client key: %s", why);
        return rc < -1000 ? -EINVAL : rc;
    }
    k->on = true;
    return 0;
}

int kvt_curve_keys_apply(void *sock, const struct kvt_curve_keys *k)
{
    if (!k->on)
        return 0;
    if (zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, k->server, 40) ||
        zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, k->pub, 40) ||
        zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, k->sec, 40))
        return -errno;
    return 0;
}
