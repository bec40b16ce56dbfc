#include "common/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

int kvt_log_level_current = KVT_LOG_INFO;

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
    int n = snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s ", tm.tm_year + 1900,
                     tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                     ts.tv_nsec / 1000000, names[level]);
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(buf + n, sizeof(buf) - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof(buf) - 2)
        len = sizeof(buf) - 2;
    buf[len++] = '\n';
    ssize_t w = write(STDERR_FILENO, buf, len);
    (void)w;
}

void kvt_assert_fail(const char *expr, const char *file, int line)
{
    kvt_log(KVT_LOG_ERROR, "assertion failed: %s (%s:%d)", expr, file, line);
    abort();
}
