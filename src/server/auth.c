/*
 * The authorized-clients table and the ZAP handler (auth.h).
 *
 * The handler is one thread with a REP socket on inproc://zeromq.zap.01:
 * libzmq asks it about every CURVE handshake and admits the peer only on
 * "200". Its answer's user id, the client's index in the table, comes back
 * on every message of that connection (zmq_msg_gets "User-Id"), which is
 * how the rpc thread knows who sent a request: O(1), no key compare.
 */
#include "server/auth.h"
#include "common/log.h"
#include "common/secret.h"
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

#include <zmq.h>

#define AUTH_FILE_MAX (4u << 20)

void kvt_auth_free(struct kvt_auth *a)
{
    while (a) { /* the newest table and the ones it superseded */
        struct kvt_auth *older = a->older;
        for (uint32_t i = 0; i < a->n; i++) {
            for (uint32_t t = 0; t < a->c[i].ntenants; t++)
                free(a->c[i].tenants[t]);
            free(a->c[i].tenants);
        }
        free(a->c);
        free(a);
        a = older;
    }
}

void kvt_auth_supersede(struct kvt_auth *cur, struct kvt_auth *fresh, uint32_t *added,
                        uint32_t *removed)
{
    fresh->gen = cur->gen + 1;
    fresh->older = cur;
    *added = *removed = 0;
    for (uint32_t i = 0; i < fresh->n; i++) {
        struct kvt_auth_client *o = kvt_auth_find(cur, fresh->c[i].bin);
        if (o) /* a counter must not go back (Prometheus) */
            atomic_store(&fresh->c[i].denied, atomic_load(&o->denied));
        else
            (*added)++;
    }
    for (struct kvt_auth *t = cur; t; t = t->older)
        for (uint32_t i = 0; i < t->n; i++) {
            struct kvt_auth_client *o = &t->c[i];
            o->successor = kvt_auth_find(fresh, o->bin);
            o->stale = true;
            if (t == cur && !o->successor)
                (*removed)++;
        }
}

struct kvt_auth_client *kvt_auth_live(struct kvt_auth_client *e)
{
    return e && e->stale ? e->successor : e;
}

struct kvt_auth_client *kvt_auth_by_uid(struct kvt_auth *cur, const char *uid)
{
    if (!uid)
        return NULL;
    char *end = NULL;
    unsigned long gen = strtoul(uid, &end, 10);
    if (end == uid || *end != ':')
        return NULL;
    const char *p = end + 1;
    unsigned long i = strtoul(p, &end, 10);
    if (end == p || *end)
        return NULL;
    for (struct kvt_auth *t = cur; t; t = t->older)
        if (t->gen == gen)
            return i < t->n ? kvt_auth_live(&t->c[i]) : NULL;
    return NULL;
}

/* One tenant of a list (l bytes at p) into a new string: "@none" is the
 * empty salt, %XX a byte. NULL with *why on a malformed one. */
static char *tenant_decode(const char *p, size_t l, const char **why)
{
    if (l == 5 && !memcmp(p, "@none", 5))
        return kvt_xcalloc(1, 1);
    if (!l) {
        *why = "an empty tenant (use @none for requests without a salt)";
        return NULL;
    }
    char *o = kvt_xmalloc(l + 1);
    size_t k = 0;
    for (size_t i = 0; i < l; i++) {
        if (p[i] != '%') {
            o[k++] = p[i];
            continue;
        }
        int h = i + 2 < l ? kvt_hexval(p[i + 1]) : -1, g = h >= 0 ? kvt_hexval(p[i + 2]) : -1;
        if (g < 0 || (h == 0 && g == 0)) {
            *why = "a '%' in a tenant must start a %XX escape (not %00)";
            free(o);
            return NULL;
        }
        o[k++] = (char)(h * 16 + g);
        i += 2;
    }
    o[k] = 0;
    const char *bad = NULL;
    for (size_t i = 0; i < k && !bad; i++) {
        unsigned char ch = (unsigned char)o[i];
        if (ch == '@' || ch == '/' || ch == '\\' || ch < 0x20 || ch == 0x7f)
            bad = "a tenant is a cache salt: no '@', '/', '\\' or control characters";
    }
    if (!bad && k > 128)
        bad = "a tenant is a cache salt: at most 128 bytes";
    if (bad) {
        *why = bad;
        free(o);
        return NULL;
    }
    return o;
}

/* Split the line (NUL-terminated, comment removed) into words. */
static int words(char *line, char **w, int max)
{
    int n = 0;
    char *save = NULL;
    for (char *p = strtok_r(line, " \t\r", &save); p && p[0] != '#';
         p = strtok_r(NULL, " \t\r", &save))
        if (n < max)
            w[n++] = p;
        else
            return max + 1;
    return n;
}

static int parse_line(char *line, struct kvt_auth_client *c, const char **why)
{
    char *w[6];
    int n = words(line, w, 5);
    if (n < 3 || n > 5) {
        *why = "expected <public key> <ro|rw> <tenants> [admin] [name=LABEL]";
        return KVT_E_CONFIG;
    }
    if (!kvt_z85_key_ok(w[0]) || !zmq_z85_decode(c->bin, w[0])) {
        *why = "the first field must be a CURVE public key in Z85 (40 characters, as in "
               "the .pub file of kvtier keygen)";
        return KVT_E_CONFIG;
    }
    memcpy(c->key, w[0], 41);
    if (!strcmp(w[1], "rw"))
        c->rw = true;
    else if (strcmp(w[1], "ro")) {
        *why = "the second field must be ro or rw";
        return KVT_E_CONFIG;
    }
    snprintf(c->name, sizeof(c->name), "%.8s", c->key);
    for (int i = 3; i < n; i++) {
        if (!strcmp(w[i], "admin") && !c->admin)
            c->admin = true;
        else if (!strncmp(w[i], "name=", 5) && strlen(w[i]) > 5 && strlen(w[i]) < 64 + 5) {
            snprintf(c->name, sizeof(c->name), "%s", w[i] + 5);
            for (char *p = c->name; *p; p++)
                if (*p == '"' || *p == '\\' || (unsigned char)*p < 0x20 || *p == 0x7f) {
                    *why = "name=LABEL: no quotes, backslashes or control characters";
                    return KVT_E_CONFIG;
                }
        } else {
            *why = "after the tenants only \"admin\" and \"name=LABEL\" (1..63 bytes) may follow";
            return KVT_E_CONFIG;
        }
    }
    if (!strcmp(w[2], "*")) {
        c->any_tenant = true;
        return 0;
    }
    for (char *p = w[2];;) {
        char *comma = strchr(p, ',');
        size_t l = comma ? (size_t)(comma - p) : strlen(p);
        if (c->ntenants == KVT_AUTH_MAX_TENANTS) {
            *why = "more than 256 tenants for one key (use '*')";
            return KVT_E_CONFIG;
        }
        char *t = tenant_decode(p, l, why);
        if (!t)
            return KVT_E_CONFIG;
        c->tenants = kvt_xrealloc(c->tenants, (c->ntenants + 1) * sizeof(char *));
        c->tenants[c->ntenants++] = t;
        if (!comma)
            break;
        p = comma + 1;
    }
    return 0;
}

int kvt_auth_parse(const char *text, size_t len, const char *origin, struct kvt_auth **out,
                   char *err, size_t cap)
{
    struct kvt_auth *a = kvt_xcalloc(1, sizeof(*a));
    uint32_t cap_c = 0;
    size_t pos = 0;
    int lineno = 0;
    char line[4096];
    *out = NULL;
    while (pos < len) {
        lineno++;
        const char *nl = memchr(text + pos, '\n', len - pos);
        size_t l = nl ? (size_t)(nl - (text + pos)) : len - pos;
        if (l >= sizeof(line) || memchr(text + pos, 0, l)) {
            snprintf(err, cap, "%s line %d: %s", origin, lineno,
                     l >= sizeof(line) ? "longer than 4095 bytes" : "a NUL byte");
            goto fail;
        }
        memcpy(line, text + pos, l);
        line[l] = 0;
        pos += l + (nl ? 1 : 0);
        /* a comment: a line starting with '#', or the words from one that
         * starts with '#' (Z85 keys may hold a '#', never at their start:
         * kvtier keygen makes none such) */
        char first = line[strspn(line, " \t\r")];
        if (!first || first == '#')
            continue;
        if (a->n == KVT_AUTH_MAX_CLIENTS) {
            snprintf(err, cap, "%s line %d: more than %d clients", origin, lineno,
                     KVT_AUTH_MAX_CLIENTS);
            goto fail;
        }
        if (a->n == cap_c) {
            cap_c = cap_c ? cap_c * 2 : 8;
            a->c = kvt_xrealloc(a->c, cap_c * sizeof(*a->c));
        }
        struct kvt_auth_client *c = &a->c[a->n];
        memset(c, 0, sizeof(*c));
        a->n++; /* freed with the table if the line is bad */
        const char *why = NULL;
        if (parse_line(line, c, &why)) {
            snprintf(err, cap, "%s line %d: %s", origin, lineno, why);
            goto fail;
        }
        for (uint32_t i = 0; i + 1 < a->n; i++)
            if (!memcmp(a->c[i].bin, c->bin, 32)) {
                snprintf(err, cap, "%s line %d: key %s is listed twice", origin, lineno, c->key);
                goto fail;
            }
    }
    if (!a->n) {
        snprintf(err, cap, "%s: no client listed (nobody could connect)", origin);
        goto fail;
    }
    *out = a;
    return 0;
fail:
    kvt_auth_free(a);
    return KVT_E_CONFIG;
}

int kvt_auth_load(const char *path, struct kvt_auth **out, char *err, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(err, cap, "%s: cannot open: %s", path, kvt_strerror(-errno));
        return KVT_E_CONFIG;
    }
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size > (off_t)AUTH_FILE_MAX) {
        snprintf(err, cap, "%s: not a regular file of at most 4 MiB", path);
        close(fd);
        return KVT_E_CONFIG;
    }
    if (st.st_mode & 022) {
        snprintf(err, cap,
                 "%s: permissions %04o let group or others change who may connect (chmod "
                 "go-w %s)",
                 path, (unsigned)(st.st_mode & 07777), path);
        close(fd);
        return KVT_E_CONFIG;
    }
    char *buf = kvt_xmalloc((size_t)st.st_size + 1);
    size_t n = 0;
    while (n < (size_t)st.st_size) {
        ssize_t r = read(fd, buf + n, (size_t)st.st_size - n);
        if (r <= 0)
            break;
        n += (size_t)r;
    }
    close(fd);
    int rc = kvt_auth_parse(buf, n, path, out, err, cap);
    free(buf);
    return rc;
}

bool kvt_auth_client_is(const struct kvt_auth_client *c, const char *id)
{
    return !strcmp(c->name, id) || !strcmp(c->key, id);
}

struct kvt_auth_client *kvt_auth_named(const struct kvt_auth *a, const char *id, uint32_t *matches)
{
    struct kvt_auth_client *one = NULL;
    uint32_t n = 0;
    for (uint32_t i = 0; i < a->n; i++)
        if (kvt_auth_client_is(&a->c[i], id)) {
            one = &a->c[i];
            n++;
        }
    if (matches)
        *matches = n;
    return n == 1 ? one : NULL;
}

struct kvt_auth_client *kvt_auth_find(const struct kvt_auth *a, const uint8_t *bin)
{
    for (uint32_t i = 0; i < a->n; i++) /* at handshakes only */
        if (!memcmp(a->c[i].bin, bin, 32))
            return &a->c[i];
    return NULL;
}

bool kvt_auth_salt_ok(const struct kvt_auth_client *c, const char *salt)
{
    if (c->any_tenant)
        return true;
    for (uint32_t t = 0; t < c->ntenants; t++)
        if (!strcmp(c->tenants[t], salt))
            return true;
    return false;
}

json_t *kvt_auth_status(const struct kvt_auth *root, const struct kvt_auth *a)
{
    json_t *o = json_object(), *arr = json_array();
    json_object_set_new(o, "handshakes_refused",
                        json_integer((json_int_t)atomic_load(&root->handshakes_refused)));
    json_object_set_new(o, "handshakes_failed",
                        json_integer((json_int_t)atomic_load(&root->handshakes_failed)));
    json_object_set_new(o, "lmcache_connections_refused",
                        json_integer((json_int_t)atomic_load(&root->lmc_refused)));
    json_object_set_new(o, "generation", json_integer((json_int_t)a->gen));
    json_object_set_new(o, "reloads", json_integer((json_int_t)atomic_load(&root->reloads)));
    json_object_set_new(o, "reload_failures",
                        json_integer((json_int_t)atomic_load(&root->reload_failures)));
    for (uint32_t i = 0; i < a->n; i++) {
        const struct kvt_auth_client *c = &a->c[i];
        json_t *j = json_object();
        json_object_set_new(j, "name", json_string(c->name));
        json_object_set_new(j, "key", json_string(c->key)); /* public */
        json_object_set_new(j, "access", json_string(c->rw ? "rw" : "ro"));
        json_object_set_new(j, "admin", json_boolean(c->admin));
        json_object_set_new(j, "tenants",
                            json_integer(c->any_tenant ? -1 : (json_int_t)c->ntenants));
        json_object_set_new(j, "denied", json_integer((json_int_t)atomic_load(&c->denied)));
        json_array_append_new(arr, j);
    }
    json_object_set_new(o, "clients", arr);
    return o;
}

/* ------------------------------------------------------------ ZAP */

struct kvt_zap {
    pthread_t tid;
    void *sock;
    struct kvt_auth *root;         /* the first table: its counters */
    struct kvt_auth *_Atomic *cur; /* the table that admits: the server's pointer */
    uint64_t last_log_ns;          /* zap thread only */
    const char *same_uid_client;   /* kvt_zap_start_same_uid: the client its peers act as */
};

static void zap_send(void *sock, const char *s, size_t l, bool more)
{
    zmq_send(sock, s, l, more ? ZMQ_SNDMORE : 0);
}

/* Send the reply to the request in f[0..n) and close its frames. 0. */
static int zap_answer(struct kvt_zap *z, zmq_msg_t *f, int n, const char *status, const char *text,
                      const char *uid)
{
    zap_send(z->sock, "1.0", 3, true);
    if (n >= 2)
        zmq_send(z->sock, zmq_msg_data(&f[1]), zmq_msg_size(&f[1]), ZMQ_SNDMORE);
    else
        zap_send(z->sock, "", 0, true);
    zap_send(z->sock, status, 3, true);
    zap_send(z->sock, text, strlen(text), true);
    zap_send(z->sock, uid, strlen(uid), true);
    zap_send(z->sock, "", 0, false);
    for (int i = 0; i < n; i++)
        zmq_msg_close(&f[i]);
    return 0;
}

/* The peer's uid from a ZAP address ending in ":uid:gid:pid" (libzmq adds
 * it from SO_PEERCRED on Unix sockets), and its pid; -1 when absent. */
static long long addr_uid(zmq_msg_t *addr, long long *pid)
{
    char b[128];
    size_t l = KVT_MIN(zmq_msg_size(addr), sizeof(b) - 1);
    memcpy(b, zmq_msg_data(addr), l);
    b[l] = 0;
    char *p3 = strrchr(b, ':');
    if (!p3)
        return -1;
    *p3 = 0;
    char *p2 = strrchr(b, ':');
    if (!p2)
        return -1;
    *p2 = 0;
    char *p1 = strrchr(b, ':');
    if (!p1)
        return -1;
    char *e1, *e3;
    errno = 0;
    long long u = strtoll(p1 + 1, &e1, 10), p = strtoll(p3 + 1, &e3, 10);
    if (errno || e1 == p1 + 1 || *e1 || e3 == p3 + 1 || *e3 || u < 0)
        return -1;
    *pid = p;
    return u;
}

/* kvt_zap_start_same_uid's rule: the server's uid, while its client exists. */
static int zap_same_uid(struct kvt_zap *z, struct kvt_auth *a, zmq_msg_t *f, int n)
{
    long long pid = -1, u = addr_uid(&f[3], &pid);
    bool client = kvt_auth_named(a, z->same_uid_client, NULL) != NULL;
    if (u == (long long)geteuid() && client)
        return zap_answer(z, f, n, "200", "OK", "lmcache");
    atomic_fetch_add(&z->root->lmc_refused, 1);
    uint64_t now = kvt_now_ns();
    if (now - z->last_log_ns >= 1000000000ull) { /* one line a second at most */
        if (!client)
            kvt_warn("auth: refused an LMCache connection: --lmcache-client %s is no longer "
                     "one client of the authorized-clients file (%llu refused so far)",
                     z->same_uid_client, (unsigned long long)atomic_load(&z->root->lmc_refused));
        else
            kvt_warn("auth: refused an LMCache connection from uid %lld (pid %lld): only this "
                     "server's uid %u may use it (%llu refused so far)",
                     u, pid, (unsigned)geteuid(),
                     (unsigned long long)atomic_load(&z->root->lmc_refused));
        z->last_log_ns = now;
    }
    return zap_answer(z, f, n, "400", client ? "another uid" : "no client", "");
}

/* One request: [version][request id][domain][address][identity][mechanism]
 * [credentials...]. Answer [version][request id][status][text][user id]
 * [metadata]. */
static int zap_one(struct kvt_zap *z)
{
    zmq_msg_t f[8];
    int n = 0;
    bool more = true;
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, z->sock, 0) < 0) {
            int e = errno;
            zmq_msg_close(&m);
            for (int i = 0; i < n; i++)
                zmq_msg_close(&f[i]);
            return -e;
        }
        more = zmq_msg_more(&m);
        if (n < 8)
            memcpy(&f[n++], &m, sizeof(m));
        else
            zmq_msg_close(&m);
    }
    const char *status = "400", *text = "unknown key";
    char uid[32] = "";
    struct kvt_auth_client *c = NULL;
    struct kvt_auth *a = atomic_load_explicit(z->cur, memory_order_acquire);
    if (z->same_uid_client) {
        if (n >= 6 && zmq_msg_size(&f[5]) == 4 && !memcmp(zmq_msg_data(&f[5]), "NULL", 4))
            return zap_same_uid(z, a, f, n);
    } else if (n >= 7 && zmq_msg_size(&f[5]) == 5 && !memcmp(zmq_msg_data(&f[5]), "CURVE", 5) &&
               zmq_msg_size(&f[6]) == 32) {
        c = kvt_auth_find(a, zmq_msg_data(&f[6]));
    }
    if (c) {
        status = "200";
        text = "OK";
        /* the table's generation and the key's index: the rpc thread finds
         * the entry in O(1) (plus the tables since, after a reload) */
        snprintf(uid, sizeof(uid), "%u:%u", (unsigned)a->gen, (unsigned)(c - a->c));
    } else {
        atomic_fetch_add(&z->root->handshakes_refused, 1);
        char addr[64] = "?";
        if (n >= 4)
            snprintf(addr, sizeof(addr), "%.*s", (int)KVT_MIN(zmq_msg_size(&f[3]), 60),
                     (const char *)zmq_msg_data(&f[3]));
        /* at most one line a second: a peer looping on handshakes must not
         * flood the log (the counter has them all) */
        uint64_t now = kvt_now_ns();
        if (now - z->last_log_ns >= 1000000000ull) {
            kvt_warn("auth: refused a connection from %s: its key is not in the "
                     "authorized-clients file (%llu refused so far)",
                     addr, (unsigned long long)atomic_load(&z->root->handshakes_refused));
            z->last_log_ns = now;
        }
    }
    return zap_answer(z, f, n, status, text, uid);
}

static void *zap_main(void *arg)
{
    struct kvt_zap *z = arg;
    pthread_setname_np(pthread_self(), z->same_uid_client ? "zap-lmcache" : "zap");
    while (zap_one(z) != -ETERM)
        ;
    int linger = 0;
    zmq_setsockopt(z->sock, ZMQ_LINGER, &linger, sizeof(linger));
    zmq_close(z->sock);
    return NULL;
}

int kvt_zap_start(void *zctx, struct kvt_auth *root, struct kvt_auth *_Atomic *cur,
                  struct kvt_zap **out)
{
    return kvt_zap_start_same_uid(zctx, root, cur, NULL, out);
}

int kvt_zap_start_same_uid(void *zctx, struct kvt_auth *root, struct kvt_auth *_Atomic *cur,
                           const char *client, struct kvt_zap **out)
{
    struct kvt_zap *z = kvt_xcalloc(1, sizeof(*z));
    z->root = root;
    z->cur = cur;
    z->same_uid_client = client;
    z->sock = zmq_socket(zctx, ZMQ_REP);
    if (!z->sock || zmq_bind(z->sock, "inproc://zeromq.zap.01") < 0) {
        int e = errno;
        if (z->sock)
            zmq_close(z->sock);
        free(z);
        return -e;
    }
    int rc = pthread_create(&z->tid, NULL, zap_main, z);
    if (rc) {
        zmq_close(z->sock);
        free(z);
        return -rc;
    }
    *out = z;
    return 0;
}

void kvt_zap_join(struct kvt_zap *z)
{
    if (!z)
        return;
    pthread_join(z->tid, NULL);
    free(z);
}
