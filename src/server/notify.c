/* sd_notify(3) over $NOTIFY_SOCKET: see notify.h. */
#include "server/notify.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/*
 * One datagram, as libsystemd's sd_notify sends it. The socket is opened per
 * message: READY/STOPPING are sent once and WATCHDOG at most every few
 * seconds, so keeping an fd open buys nothing and a socket the manager
 * replaced (daemon-reexec) is picked up.
 */
int kvt_notify(const char *msg)
{
    const char *path = getenv("NOTIFY_SOCKET");
    if (!path || !path[0])
        return 0;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    size_t n = strlen(path);
    if ((path[0] != '/' && path[0] != '@') || n >= sizeof(sa.sun_path))
        return -EINVAL;
    memcpy(sa.sun_path, path, n);
    if (path[0] == '@')
        sa.sun_path[0] = 0; /* abstract namespace: the length bounds the name */
    socklen_t salen =
        (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + (path[0] == '/' ? 1 : 0));
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    int rc = 0;
    if (sendto(fd, msg, strlen(msg), MSG_NOSIGNAL, (struct sockaddr *)&sa, salen) < 0)
        rc = -errno;
    close(fd);
    return rc;
}

uint64_t kvt_notify_watchdog_usec(void)
{
    const char *us = getenv("WATCHDOG_USEC");
    if (!us || !us[0])
        return 0;
    const char *pid = getenv("WATCHDOG_PID");
    if (pid && pid[0] && strtol(pid, NULL, 10) != (long)getpid())
        return 0; /* meant for another process (our parent, a wrapper) */
    char *end;
    errno = 0;
    unsigned long long v = strtoull(us, &end, 10);
    if (errno || *end || end == us)
        return 0;
    return (uint64_t)v;
}
