/*
 * The service manager's readiness protocol (sd_notify(3)) without libsystemd:
 * one datagram per message to the Unix socket named by $NOTIFY_SOCKET (a path,
 * or "@name" for the abstract namespace). Without $NOTIFY_SOCKET every call
 * is a no-op returning 0, so a server started by hand behaves as before.
 */
#ifndef KVT_SERVER_NOTIFY_H
#define KVT_SERVER_NOTIFY_H

#include <stdint.h>

/* Send msg ("READY=1", "WATCHDOG=1", "STOPPING=1\nSTATUS=...").
 * Returns 0 (also when no socket is set), or -errno. */
int kvt_notify(const char *msg);

/* The watchdog period the manager asked for ($WATCHDOG_USEC, when
 * $WATCHDOG_PID is unset or this process), in microseconds; 0 = none. */
uint64_t kvt_notify_watchdog_usec(void);

#endif
