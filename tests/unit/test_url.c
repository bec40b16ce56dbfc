/* Description: server URL format check and the listening probe (src/common/url.c). */
#include "common/url.h"
#include "kvtier/error.h"
#include "test.h"

#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static void test_check(void)
{
    static const char *const good[] = {"tcp://127.0.0.1:5555",
                                       "tcp://localhost:1",
                                       "tcp://[::1]:65535",
                                       "tcp://eth0;10.0.0.1:5555",
                                       "ipc:///tmp/x.sock",
                                       "ipc://@abstract",
                                       NULL};
    static const char *const bad[] = {"127.0.0.1:5555",
                                      "localhost",
                                      "",
                                      "tcp://",
                                      "tcp://host",
                                      "tcp://host:",
                                      "tcp://:5555",
                                      "tcp://h:0",
                                      "tcp://h:65536",
                                      "tcp://h:5x",
                                      "tcp://*:5555",
                                      "tcp://[::1:5555",
                                      "ipc://",
                                      "http://h:80",
                                      "inproc://x",
                                      NULL};
    char err[256];
    for (int i = 0; good[i]; i++) {
        err[0] = 0;
        TEST_ASSERT(kvt_url_check(good[i], err, sizeof(err)) == 0);
        TEST_ASSERT(err[0] == 0);
    }
    for (int i = 0; bad[i]; i++) {
        TEST_ASSERT(kvt_url_check(bad[i], err, sizeof(err)) == -EINVAL);
        TEST_ASSERT(strstr(err, "tcp://host:port") && strstr(err, "ipc:///path"));
        TEST_ASSERT(strstr(err, bad[i]));
    }
    TEST_ASSERT(kvt_url_check(NULL, err, sizeof(err)) == -EINVAL);
}

static void test_probe_tcp(void)
{
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    TEST_ASSERT(ls >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof(sa);
    TEST_ASSERT(bind(ls, (struct sockaddr *)&sa, sl) == 0 && listen(ls, 4) == 0);
    TEST_ASSERT(getsockname(ls, (struct sockaddr *)&sa, &sl) == 0);
    char url[64], err[256];
    snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", ntohs(sa.sin_port));
    TEST_ASSERT(kvt_url_probe(url, 1000, err, sizeof(err)) == 0);
    close(ls); /* nothing listens on the port now */
    int rc = kvt_url_probe(url, 1000, err, sizeof(err));
    TEST_ASSERT(rc == -ECONNREFUSED);
    TEST_ASSERT(strstr(err, "connection refused"));
    /* schemes we cannot probe are left to ZeroMQ */
    TEST_ASSERT(kvt_url_probe("inproc://x", 10, err, sizeof(err)) == 0);
}

static void test_probe_ipc(void)
{
    char dir[] = "/tmp/kvt-url-XXXXXX", path[64], url[96], err[256];
    TEST_ASSERT(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/s", dir);
    snprintf(url, sizeof(url), "ipc://%s", path);
    TEST_ASSERT(kvt_url_probe(url, 1000, err, sizeof(err)) == -ENOENT);
    TEST_ASSERT(strstr(err, "no socket"));
    int ls = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un su = {.sun_family = AF_UNIX};
    snprintf(su.sun_path, sizeof(su.sun_path), "%s", path);
    TEST_ASSERT(bind(ls, (struct sockaddr *)&su, sizeof(su)) == 0 && listen(ls, 4) == 0);
    TEST_ASSERT(kvt_url_probe(url, 1000, err, sizeof(err)) == 0);
    close(ls); /* the socket file stays: a server that died */
    TEST_ASSERT(kvt_url_probe(url, 1000, err, sizeof(err)) == -ECONNREFUSED);
    unlink(path);
    rmdir(dir);
}

int main(void)
{
    RUN(test_check);
    RUN(test_probe_tcp);
    RUN(test_probe_ipc);
    return TEST_RESULT();
}
