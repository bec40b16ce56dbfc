/* Server URL check and listening probe (see url.h). */
#include "common/url.h"
#include "common/util.h"
#include "kvtier/error.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* The destination of a ZeroMQ tcp endpoint: "[src;]host:port". Splits it
 * into host (brackets of an IPv6 literal removed) and port; false when a
 * part is missing or the port is not a number 1..65535. */
static bool tcp_split(const char *rest, char *host, size_t hcap, char *port, size_t pcap)
{
    const char *semi = strrchr(rest, ';');
    if (semi)
        rest = semi + 1;
    const char *colon = strrchr(rest, ':');
    if (!colon || colon == rest || !colon[1])
        return false;
    const char *h = rest, *he = colon;
    if (*h == '[') {
        if (he[-1] != ']' || he - h < 3)
            return false;
        h++;
        he--;
    }
    char *end;
    long p = strtol(colon + 1, &end, 10);
    if (*end || p < 1 || p > 65535 || (size_t)(he - h) >= hcap)
        return false;
    memcpy(host, h, (size_t)(he - h));
    host[he - h] = 0;
    snprintf(port, pcap, "%ld", p);
    return strcmp(host, "*") != 0;
}

int kvt_url_check(const char *url, char *err, size_t errcap)
{
    char host[256], port[8];
    if (url && !strncmp(url, "tcp://", 6) &&
        tcp_split(url + 6, host, sizeof(host), port, sizeof(port)))
        return 0;
    if (url && !strncmp(url, "ipc://", 6) && url[6])
        return 0;
    snprintf(err, errcap, "bad server URL '%s': expected " KVT_URL_FORMATS, url ? url : "");
    return -EINVAL;
}

/* Non-blocking connect of fd to sa, waiting up to timeout_ms. */
static int connect_wait(int fd, const struct sockaddr *sa, socklen_t sl, int timeout_ms)
{
    if (connect(fd, sa, sl) == 0)
        return 0;
    if (errno != EINPROGRESS && errno != EAGAIN)
        return -errno;
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    uint64_t deadline = kvt_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    for (;;) {
        uint64_t now = kvt_now_ns();
        if (now >= deadline)
            return KVT_E_TIMEOUT;
        int pr = poll(&p, 1, (int)((deadline - now) / 1000000ull) + 1);
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr < 0)
            return -errno;
        if (pr == 0)
            continue;
        int e = 0;
        socklen_t el = sizeof(e);
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) < 0)
            return -errno;
        return e ? -e : 0;
    }
}

static int probe_ipc(const char *path, int timeout_ms, char *err, size_t errcap)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    size_t l = strlen(path);
    if (l >= sizeof(sa.sun_path))
        return 0; /* ZeroMQ's business: it says why */
    memcpy(sa.sun_path, path, l);
    if (path[0] == '@')
        sa.sun_path[0] = 0; /* abstract namespace */
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return 0;
    int rc = connect_wait(
        fd, (struct sockaddr *)&sa,
        (socklen_t)(offsetof(struct sockaddr_un, sun_path) + l + (path[0] == '@' ? 0 : 1)),
        timeout_ms);
    close(fd);
    if (rc == -ENOENT)
        snprintf(err, errcap, "no socket %s", path);
    else if (rc == -ECONNREFUSED)
        snprintf(err, errcap, "connection refused (nothing listens on %s)", path);
    else if (rc == KVT_E_TIMEOUT)
        snprintf(err, errcap, "no answer to a connection attempt within %d ms", timeout_ms);
    else if (rc)
        snprintf(err, errcap, "%s", kvt_strerror(rc));
    return rc;
}

static int probe_tcp(const char *rest, int timeout_ms, char *err, size_t errcap)
{
    char host[256], port[8];
    if (!tcp_split(rest, host, sizeof(host), port, sizeof(port)))
        return 0;
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV}, *ai = NULL;
    int g = getaddrinfo(host, port, &hints, &ai);
    if (g) {
        snprintf(err, errcap, "cannot resolve host '%s': %s", host, gai_strerror(g));
        return g == EAI_SYSTEM ? -errno : -EHOSTUNREACH;
    }
    int rc = -EHOSTUNREACH;
    uint64_t deadline = kvt_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    for (struct addrinfo *a = ai; a; a = a->ai_next) {
        uint64_t now = kvt_now_ns();
        int left = now < deadline ? (int)((deadline - now) / 1000000ull) : 0;
        if (a != ai && left == 0)
            break; /* the time went to earlier addresses */
        int fd =
            socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
        if (fd < 0)
            continue;
        rc = connect_wait(fd, a->ai_addr, a->ai_addrlen, left);
        close(fd);
        if (rc == 0)
            break;
    }
    freeaddrinfo(ai);
    if (rc == -ECONNREFUSED)
        snprintf(err, errcap, "connection refused (nothing listens on port %s of %s)", port, host);
    else if (rc == KVT_E_TIMEOUT)
        snprintf(err, errcap, "no answer to a connection attempt within %d ms", timeout_ms);
    else if (rc)
        snprintf(err, errcap, "%s", kvt_strerror(rc));
    return rc;
}

int kvt_url_probe(const char *url, int timeout_ms, char *err, size_t errcap)
{
    if (errcap)
        err[0] = 0;
    if (timeout_ms < 1)
        timeout_ms = 1;
    if (!strncmp(url, "tcp://", 6))
        return probe_tcp(url + 6, timeout_ms, err, errcap);
    if (!strncmp(url, "ipc://", 6))
        return probe_ipc(url + 6, timeout_ms, err, errcap);
    return 0;
}
