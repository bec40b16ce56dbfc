#include "common/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

int kvt_log_level_current = KVT_LOG_INFO;
static int log_format = KVT_LOG_TEXT;

static const char *const names[] = {"DEBUG", "INFO ", "WARN ", "ERROR"};

int kvt_log_parse_level(const char *s)
{
    static const char *const lv[] = {"debug", "info", "warn", "error", "off"};
    for (int i = 0; i < 5; i++)
        if (strcasecmp(s, lv[i]) == 0)
            return i;
    if (strcasecmp(s, "warning") == 0)
        return KVT_LOG_WARN;
    return -1;
}

void kvt_log_set_level(int level)
{
    kvt_log_level_current = level;
}

int kvt_log_parse_format(const char *s)
{
    if (strcasecmp(s, "text") == 0)
        return KVT_LOG_TEXT;
    if (strcasecmp(s, "json") == 0)
        return KVT_LOG_JSON;
    return -1;
}

void kvt_log_set_format(int format)
{
    log_format = format;
}

/* KVT_LOG_LEVEL, else LMCACHE_LOG_LEVEL (the seed's way to see L2 activity:
 * LMCACHE_LOG_LEVEL=DEBUG); --log-level overrides both. */
__attribute__((constructor)) static void log_from_env(void)
{
    const char *e = getenv("KVT_LOG_LEVEL");
    if (!e || kvt_log_parse_level(e) < 0)
        e = getenv("LMCACHE_LOG_LEVEL");
    if (e) {
        int l = kvt_log_parse_level(e);
        if (l >= 0)
            kvt_log_level_current = l;
    }
    /* KVT_LOG_FORMAT: a bad value is the server's config error (config.c) */
    e = getenv("KVT_LOG_FORMAT");
    if (e && kvt_log_parse_format(e) >= 0)
        log_format = kvt_log_parse_format(e);
}

/* Append s to buf[*n..cap) as the body of a JSON string: quote, backslash
 * and control bytes escaped; bytes >= 0x80 copied (messages are UTF-8 or
 * ASCII). Stops short rather than split an escape. */
static void json_escape(char *buf, size_t *n, size_t cap, const char *s)
{
    static const char hex[] = "0123456789abcdef";
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        char esc[7];
        size_t el = 0;
        if (ch == '"' || ch == '\\') {
            esc[0] = '\\', esc[1] = (char)ch, el = 2;
        } else if (ch == '\n') {
            esc[0] = '\\', esc[1] = 'n', el = 2;
        } else if (ch == '\t') {
            esc[0] = '\\', esc[1] = 't', el = 2;
        } else if (ch < 0x20) {
            memcpy(esc, "\\u00", 4);
            esc[4] = hex[ch >> 4], esc[5] = hex[ch & 15], el = 6;
        } else {
            esc[0] = (char)ch, el = 1;
        }
        if (*n + el >= cap)
            return;
        memcpy(buf + *n, esc, el);
        *n += el;
    }
}

void kvt_log(int level, const char *fmt, ...)
{
    if (level < kvt_log_level_current || level >= KVT_LOG_OFF)
        return;
    char buf[2048];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    char when[64];
    snprintf(when, sizeof(when), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900,
             tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000);
    size_t len;
    if (log_format == KVT_LOG_JSON) {
        static const char *const lv[] = {"debug", "info", "warn", "error"};
        char msg[1536];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        int n = snprintf(buf, sizeof(buf), "{\"ts\":\"%s\",\"level\":\"%s\",\"msg\":\"", when,
                         lv[level]);
        len = (size_t)n;
        json_escape(buf, &len, sizeof(buf) - 3, msg); /* room for "}\n */
        memcpy(buf + len, "\"}", 2);
        len += 2;
    } else {
        int n = snprintf(buf, sizeof(buf), "%s %s ", when, names[level]);
        va_list ap;
        va_start(ap, fmt);
        int m = vsnprintf(buf + n, sizeof(buf) - (size_t)n - 1, fmt, ap);
        va_end(ap);
        len = (size_t)n + (m < 0 ? 0 : (size_t)m);
        if (len > sizeof(buf) - 2)
            len = sizeof(buf) - 2;
    }
    buf[len++] = '\n';
    ssize_t w = write(STDERR_FILENO, buf, len);
    (void)w;
}

void kvt_assert_fail(const char *expr, const char *file, int line)
{
    kvt_log(KVT_LOG_ERROR, "assertion failed: %s (%s:%d)", expr, file, line);
    abort();
}
