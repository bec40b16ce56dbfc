/* Description: the authorized-clients parser, secret files and the loopback test (server/auth.c,
 * common/secret.c, server/config.c). */
#include "common/secret.h"
#include "kvtier/error.h"
#include "server/auth.h"
#include "server/config.h"
#include "test.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zmq.h>

static char pub1[41], pub2[41];

static struct kvt_auth *parse(const char *text, char *err, size_t cap)
{
    struct kvt_auth *a = NULL;
    err[0] = 0;
    int rc = kvt_auth_parse(text, strlen(text), "f", &a, err, cap);
    if (rc)
        TEST_ASSERT(a == NULL && err[0]);
    return a;
}

static void test_parse(void)
{
    char text[1024], err[512];
    snprintf(text, sizeof(text),
             "# comment\n\n  %s rw team-a,b%%2Cc,@none name=alice # trailing\n%s ro * admin\n",
             pub1, pub2);
    struct kvt_auth *a = parse(text, err, sizeof(err));
    TEST_ASSERT(a && a->n == 2);
    struct kvt_auth_client *c = &a->c[0];
    TEST_ASSERT(c->rw && !c->admin && !c->any_tenant && c->ntenants == 3);
    TEST_ASSERT(!strcmp(c->name, "alice") && !strcmp(c->key, pub1));
    TEST_ASSERT(kvt_auth_salt_ok(c, "team-a") && kvt_auth_salt_ok(c, "b,c") &&
                kvt_auth_salt_ok(c, ""));
    TEST_ASSERT(!kvt_auth_salt_ok(c, "team-b") && !kvt_auth_salt_ok(c, "b"));
    c = &a->c[1];
    TEST_ASSERT(!c->rw && c->admin && c->any_tenant && kvt_auth_salt_ok(c, "anything"));
    TEST_ASSERT(!strncmp(c->name, pub2, 8) && strlen(c->name) == 8);
    uint8_t bin[32];
    zmq_z85_decode(bin, pub2);
    TEST_ASSERT(kvt_auth_find(a, bin) == c);
    bin[0] ^= 1;
    TEST_ASSERT(kvt_auth_find(a, bin) == NULL);
    json_t *st = kvt_auth_status(a, a);
    TEST_ASSERT(json_array_size(json_object_get(st, "clients")) == 2);
    json_decref(st);
    kvt_auth_free(a);
}

/* Description: a reload (kvt_auth_supersede) maps every older table's
 * entries to the newest one: a kept key to its new line (denied carried),
 * a removed key to NULL, through kvt_auth_live and ZAP user ids of any
 * generation; freeing the newest table frees the chain. */
static void test_supersede(void)
{
    char text[1024], err[512];
    snprintf(text, sizeof(text), "%s ro team-a name=alice\n%s rw * name=bob\n", pub1, pub2);
    struct kvt_auth *g0 = parse(text, err, sizeof(err));
    TEST_ASSERT(g0 && g0->gen == 0);
    atomic_store(&g0->c[0].denied, 5);
    snprintf(text, sizeof(text), "%s rw team-a,team-b name=alice\n", pub1);
    struct kvt_auth *g1 = parse(text, err, sizeof(err));
    uint32_t added, removed;
    kvt_auth_supersede(g0, g1, &added, &removed);
    TEST_ASSERT(g1->gen == 1 && g1->older == g0 && added == 0 && removed == 1);
    TEST_ASSERT(atomic_load(&g1->c[0].denied) == 5);
    TEST_ASSERT(kvt_auth_live(&g0->c[0]) == &g1->c[0] && g1->c[0].rw);
    TEST_ASSERT(kvt_auth_live(&g0->c[1]) == NULL); /* bob went */
    TEST_ASSERT(kvt_auth_live(&g1->c[0]) == &g1->c[0]);
    TEST_ASSERT(kvt_auth_by_uid(g1, "0:0") == &g1->c[0] && kvt_auth_by_uid(g1, "0:1") == NULL);
    TEST_ASSERT(kvt_auth_by_uid(g1, "1:0") == &g1->c[0] && kvt_auth_by_uid(g1, "1:1") == NULL);
    TEST_ASSERT(!kvt_auth_by_uid(g1, "2:0") && !kvt_auth_by_uid(g1, "0") &&
                !kvt_auth_by_uid(g1, "x:0") && !kvt_auth_by_uid(g1, "0:") &&
                !kvt_auth_by_uid(g1, "0:0x") && !kvt_auth_by_uid(g1, NULL));
    /* bob comes back: the older tables' entries follow to the newest */
    snprintf(text, sizeof(text), "%s ro * name=bob\n%s rw team-a name=alice\n", pub2, pub1);
    struct kvt_auth *g2 = parse(text, err, sizeof(err));
    kvt_auth_supersede(g1, g2, &added, &removed);
    TEST_ASSERT(g2->gen == 2 && added == 1 && removed == 0);
    TEST_ASSERT(kvt_auth_by_uid(g2, "0:1") == &g2->c[0] && !g2->c[0].rw);
    TEST_ASSERT(kvt_auth_by_uid(g2, "0:0") == &g2->c[1] && kvt_auth_by_uid(g2, "1:0") == &g2->c[1]);
    kvt_auth_free(g2); /* and g1, g0 */
}

static void test_errors(void)
{
    char text[1024], err[512];
    static const struct {
        const char *fmt, *needle;
    } bad[] = {
        {"%s\n", "expected"},
        {"%s rx a\n", "ro or rw"},
        {"short rw a\n", "Z85"},
        {"%s rw a,,b\n", "empty tenant"},
        {"%s rw a%%2\n", "%XX"},
        {"%s rw a%%00\n", "%XX"},
        {"%s rw a@b\n", "cache salt"},
        {"%s rw a%%2Fb\n", "cache salt"},
        {"%s rw a admin admin\n", "admin"},
        {"%s rw a name=\n", "name=LABEL"},
        {"%s rw a extra\n", "name=LABEL"},
        {"# only comments\n", "no client"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        snprintf(text, sizeof(text), bad[i].fmt, pub1);
        TEST_ASSERT(parse(text, err, sizeof(err)) == NULL);
        if (!strstr(err, bad[i].needle))
            fprintf(stderr, "case %zu: %s\n", i, err);
        TEST_ASSERT(strstr(err, bad[i].needle) != NULL);
    }
    snprintf(text, sizeof(text), "%s rw a\n%s ro b\n", pub1, pub1);
    TEST_ASSERT(parse(text, err, sizeof(err)) == NULL && strstr(err, "line 2") &&
                strstr(err, "twice"));
    /* a NUL inside the text is refused, not cut */
    struct kvt_auth *a = NULL;
    TEST_ASSERT(kvt_auth_parse("x\0y", 3, "f", &a, err, sizeof(err)) == KVT_E_CONFIG);
}

static void write_file(const char *path, const char *text, mode_t mode)
{
    unlink(path);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, mode);
    TEST_ASSERT(fd >= 0);
    TEST_ASSERT(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
    fchmod(fd, mode);
    close(fd);
}

static void test_secret_files(void)
{
    char dir[] = "/tmp/kvt_test_auth_XXXXXX", path[128], out[64], err[512];
    TEST_ASSERT(mkdtemp(dir) != NULL);
    snprintf(path, sizeof(path), "%s/k", dir);
    write_file(path, "# header\n\n  s3cr3t-value  \n second\n", 0600);
    TEST_ASSERT(kvt_secret_read(path, true, out, sizeof(out), err, sizeof(err)) == 0);
    TEST_ASSERT(!strcmp(out, "s3cr3t-value"));
    chmod(path, 0640);
    TEST_ASSERT(kvt_secret_read(path, true, out, sizeof(out), err, sizeof(err)) == KVT_E_CONFIG);
    TEST_ASSERT(strstr(err, "too open") && !strstr(err, "s3cr3t"));
    TEST_ASSERT(kvt_secret_read(path, false, out, sizeof(out), err, sizeof(err)) == 0);
    write_file(path, "# nothing\n", 0600);
    TEST_ASSERT(kvt_secret_read(path, true, out, sizeof(out), err, sizeof(err)) == KVT_E_CONFIG);
    TEST_ASSERT(kvt_secret_read(dir, true, out, sizeof(out), err, sizeof(err)) == KVT_E_CONFIG);
    unlink(path);
    TEST_ASSERT(kvt_secret_read(path, true, out, sizeof(out), err, sizeof(err)) < 0);
    /* the clients file may be world-readable, not world-writable */
    char text[256];
    snprintf(text, sizeof(text), "%s rw *\n", pub1);
    write_file(path, text, 0644);
    struct kvt_auth *a = NULL;
    TEST_ASSERT(kvt_auth_load(path, &a, err, sizeof(err)) == 0 && a && a->n == 1);
    kvt_auth_free(a);
    a = NULL;
    chmod(path, 0666);
    TEST_ASSERT(kvt_auth_load(path, &a, err, sizeof(err)) == KVT_E_CONFIG && !a);
    unlink(path);
    rmdir(dir);
    TEST_ASSERT(kvt_secret_equal("abc", "abc") && !kvt_secret_equal("abc", "abd") &&
                !kvt_secret_equal("abc", "ab") && !kvt_secret_equal("", "a"));
    TEST_ASSERT(kvt_z85_key_ok(pub1) && !kvt_z85_key_ok("abc"));
}

static void test_loopback(void)
{
    static const char *const local[] = {"tcp://127.0.0.1:5555",
                                        "tcp://localhost:1",
                                        "tcp://[::1]:5",
                                        "tcp://127.1.2.3:9",
                                        "ipc:///tmp/x",
                                        "ipc://@abs",
                                        NULL};
    static const char *const beyond[] = {
        "tcp://0.0.0.0:5555", "tcp://*:5555",           "tcp://[::]:5",     "tcp://10.0.0.1:5",
        "tcp://myhost:5",     "tcp://eth0;127.0.0.1:5", "ws://127.0.0.1:5", NULL};
    for (int i = 0; local[i]; i++)
        TEST_ASSERT(kvt_endpoint_is_local(local[i]));
    for (int i = 0; beyond[i]; i++)
        TEST_ASSERT(!kvt_endpoint_is_local(beyond[i]));
    TEST_ASSERT(kvt_host_is_loopback("localhost") && kvt_host_is_loopback("::1") &&
                !kvt_host_is_loopback("0.0.0.0") && !kvt_host_is_loopback(""));
}

/* kvt_strerror is the one text for every code: libzmq's own errno values
 * read as zmq_strerror reads them, libc's as strerror, ours from the table. */
static void test_strerror(void)
{
    const int zmq_errs[] = {EFSM, ENOCOMPATPROTO, ETERM, EMTHREAD, EADDRINUSE, ENOTSOCK, EINVAL};
    for (size_t i = 0; i < sizeof(zmq_errs) / sizeof(zmq_errs[0]); i++)
        TEST_ASSERT(strcmp(kvt_strerror(-zmq_errs[i]), zmq_strerror(zmq_errs[i])) == 0);
    TEST_ASSERT(strcmp(kvt_errname(-ETERM), "ETERM") == 0);
    TEST_ASSERT(strcmp(kvt_strerror(-ENOENT), strerror(ENOENT)) == 0);
    TEST_ASSERT(strcmp(kvt_strerror(KVT_E_CONFIG), "invalid configuration") == 0);
    TEST_ASSERT(strcmp(kvt_errname(KVT_E_CONFIG), "E_CONFIG") == 0);
}

int main(void)
{
    char sec[41];
    RUN(test_strerror);
    if (!zmq_has("curve")) {
        fprintf(stderr, "skip: libzmq without CURVE\n");
        return 77;
    }
    zmq_curve_keypair(pub1, sec);
    zmq_curve_keypair(pub2, sec);
    /* the parser takes a line starting with '#' for a comment */
    while (pub1[0] == '#')
        zmq_curve_keypair(pub1, sec);
    while (pub2[0] == '#' || !strcmp(pub1, pub2))
        zmq_curve_keypair(pub2, sec);
    RUN(test_parse);
    RUN(test_supersede);
    RUN(test_errors);
    RUN(test_secret_files);
    RUN(test_loopback);
    return TEST_RESULT();
}
