/*
 * Server URLs (tcp://host:port, ipc:///path or ipc://@name): the format
 * check and a quick "is anything listening there" probe, shared by the
 * client library and the operator commands (status, purge), so that a
 * missing server is reported at once instead of after a request timeout
 * (ZeroMQ connects asynchronously and never says that nobody answers).
 */
#ifndef KVT_URL_H
#define KVT_URL_H

#include <stddef.h>

#define KVT_URL_FORMATS "tcp://host:port or ipc:///path"

/* 0 when url has a scheme we connect to and the parts it needs; else
 * -EINVAL with "bad server URL '...': expected tcp://host:port or
 * ipc:///path" in err. */
int kvt_url_check(const char *url, char *err, size_t errcap);

/* Try to open a stream connection to url within timeout_ms and close it.
 * 0: something accepts connections there (or the URL is one we cannot
 * probe). Else a negative errno (-ECONNREFUSED, -ENOENT, ...) or
 * KVT_E_TIMEOUT, with the reason in err ("connection refused", "no socket
 * file /x", "no answer to a connection attempt within 1000 ms"). */
int kvt_url_probe(const char *url, int timeout_ms, char *err, size_t errcap);

#endif
