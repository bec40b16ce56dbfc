/* HTTP endpoints on libmicrohttpd (a thread per connection): /healthz
 * /status /metrics, and the admin API under /admin (admin_http.c).
 * kvt_http_start returns 0, -errno or KVT_E_* with err filled.
 * With --http-token, /status and /metrics need the bearer token; /healthz
 * stays open; /admin has its own credential (docs/security.md). */
#include "common/log.h"
#include "common/secret.h"
#include "kvtier/error.h"
#include "server/internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

static enum MHD_Result respond(struct MHD_Connection *c, unsigned status, char *body, size_t len,
                               const char *ctype)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(r, "Content-Type", ctype);
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

/* libmicrohttpd's own diagnostics (a port in use, a failed accept) go
 * through kvtier's logger, so --log-format json stays one JSON object per
 * line; the caller reports a failed start in its own words, so they are
 * debug lines. */
static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
        msg[--n] = 0;
    kvt_debug("http: libmicrohttpd: %s", msg);
}

/* With --http-token: "Authorization: Bearer <token>" (compared without an
 * early exit). Always true without one. */
static bool token_ok(struct kvt_server *s, struct MHD_Connection *c)
{
    if (!s->cfg->http_token[0])
        return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7))
        return false;
    h += 7;
    while (*h == ' ')
        h++;
    return kvt_secret_equal(h, s->cfg->http_token);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls)
{
    (void)version;
    struct kvt_server *s = cls;
    /* acquire: pairs with the release at the end of start-up */
    if (!atomic_load_explicit(&s->ready, memory_order_acquire))
        return respond(c, MHD_HTTP_SERVICE_UNAVAILABLE, strdup("starting\n"), 9, "text/plain");
    if (!strncmp(url, "/admin", 6) && (url[6] == '/' || !url[6]))
        return (enum MHD_Result)kvt_admin_http(s, c, url, method, upload, upload_size, con_cls);
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
        return respond(c, MHD_HTTP_METHOD_NOT_ALLOWED, strdup("method not allowed\n"), 19,
                       "text/plain");
    if (strcmp(url, "/healthz") == 0) { /* open to all: it shows nothing of the cache */
        char why[1024];
        bool ok = kvt_server_health(s, why, sizeof(why));
        char *body;
        int n = asprintf(&body, "%s%s\n", why,
                         s->cfg->insecure_no_auth
                             ? "; insecure: no authentication required (--insecure-no-auth)"
                             : "");
        return respond(c, ok ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE, body, (size_t)n,
                       "text/plain");
    }
    if ((!strcmp(url, "/status") || !strcmp(url, "/metrics")) && !token_ok(s, c))
        return respond(c, MHD_HTTP_UNAUTHORIZED,
                       strdup("401: /status and /metrics need Authorization: Bearer <token>\n"), 61,
                       "text/plain");
    if (strcmp(url, "/status") == 0) {
        json_t *st = kvt_server_status(s);
        char *body = json_dumps(st, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(15));
        json_decref(st);
        return respond(c, MHD_HTTP_OK, body, strlen(body), "application/json");
    }
    if (strcmp(url, "/metrics") == 0) {
        size_t len;
        char *body = kvt_server_metrics(s, &len);
        return respond(c, MHD_HTTP_OK, body, len, "text/plain; version=0.0.4");
    }
    return respond(c, MHD_HTTP_NOT_FOUND,
                   strdup("not found: try /healthz /status /metrics /admin/...\n"), 52,
                   "text/plain");
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)cls, (void)c, (void)toe;
    kvt_admin_http_done(*con_cls); /* only admin requests keep anything there */
    *con_cls = NULL;
}

int kvt_http_start(struct kvt_server *s, char *err, size_t cap)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)s->cfg->http_port)};
    if (inet_pton(AF_INET, s->cfg->http_host, &sa.sin_addr) != 1) {
        struct addrinfo hints = {.ai_family = AF_INET}, *res = NULL;
        if (getaddrinfo(s->cfg->http_host, NULL, &hints, &res) || !res) {
            snprintf(err, cap, "--http-host: cannot resolve '%s'", s->cfg->http_host);
            return KVT_E_CONFIG;
        }
        sa.sin_addr = ((struct sockaddr_in *)res->ai_addr)->sin_addr;
        freeaddrinfo(res);
    }
    /* bound here, not by libmicrohttpd, so that a failed bind says why
     * (its own start reports only NULL); MHD_stop_daemon closes it */
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) ||
        bind(fd, (struct sockaddr *)&sa, sizeof sa) || listen(fd, 64)) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        snprintf(err, cap, "cannot listen on http://%s:%d: %s (use --http-port)", s->cfg->http_host,
                 s->cfg->http_port, strerror(e));
        return -e;
    }
    /* the logger is the first option: libmicrohttpd warns through its own
     * logger about any option that comes before it */
    s->http = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ERROR_LOG,
        (uint16_t)s->cfg->http_port, NULL, NULL, on_request, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log,
        NULL, MHD_OPTION_LISTEN_SOCKET, (MHD_socket)fd, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, NULL, MHD_OPTION_END);
    if (!s->http) { /* fd left open: whether a failed start closed it is not documented */
        snprintf(err, cap, "cannot start the http server on http://%s:%d (libmicrohttpd)",
                 s->cfg->http_host, s->cfg->http_port);
        return KVT_E_UNSUPPORTED; /* libmicrohttpd gives no reason */
    }
    return 0;
}

void kvt_http_stop(struct kvt_server *s)
{
    if (s->http)
        MHD_stop_daemon(s->http);
    s->http = NULL;
}
