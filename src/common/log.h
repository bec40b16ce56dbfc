/*
 * Leveled logging to stderr, one line per record:
 *   2026-11-29T12:00:00.123Z WARN  fs[0]: O_DIRECT refused (EINVAL) ...
 * or, in the JSON-lines format (--log-format json, KVT_LOG_FORMAT=json), one
 * JSON object per line for log shippers (journald, Loki, Vector):
 *   {"ts":"2026-11-29T12:00:00.123Z","level":"warn","msg":"fs[0]: O_DIRECT ..."}
 * The level comes from --log-level, KVT_LOG_LEVEL or LMCACHE_LOG_LEVEL.
 * Thread-safe: each record is one write(2).
 */
#ifndef KVT_LOG_H
#define KVT_LOG_H

#include <stdatomic.h>
#include <stdbool.h>

enum kvt_log_level { KVT_LOG_DEBUG = 0, KVT_LOG_INFO, KVT_LOG_WARN, KVT_LOG_ERROR, KVT_LOG_OFF };
enum kvt_log_format { KVT_LOG_TEXT = 0, KVT_LOG_JSON };

extern int kvt_log_level_current;

/* Parse "debug|info|warn|error|off"; returns -1 when unknown. */
int kvt_log_parse_level(const char *s);
void kvt_log_set_level(int level);
/* Parse "text|json"; returns -1 when unknown. */
int kvt_log_parse_format(const char *s);
/* Set before the threads that log start (not synchronized). */
void kvt_log_set_format(int format);
void kvt_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define kvt_debug(...)                                                                             \
    do {                                                                                           \
        if (kvt_log_level_current <= KVT_LOG_DEBUG)                                                \
            kvt_log(KVT_LOG_DEBUG, __VA_ARGS__);                                                   \
    } while (0)
#define kvt_info(...) kvt_log(KVT_LOG_INFO, __VA_ARGS__)
#define kvt_warn(...) kvt_log(KVT_LOG_WARN, __VA_ARGS__)
#define kvt_error(...) kvt_log(KVT_LOG_ERROR, __VA_ARGS__)

/* Log at most once per flag (e.g. one warning per adapter for a fallback). */
#define kvt_warn_once(flagp, ...)                                                                  \
    do {                                                                                           \
        if (!atomic_exchange((flagp), true))                                                       \
            kvt_log(KVT_LOG_WARN, __VA_ARGS__);                                                    \
    } while (0)

/* Always-on invariant check: logs file:line and aborts. */
#define KVT_ASSERT(cond)                                                                           \
    do {                                                                                           \
        if (__builtin_expect(!(cond), 0))                                                          \
            kvt_assert_fail(#cond, __FILE__, __LINE__);                                            \
    } while (0)
_Noreturn void kvt_assert_fail(const char *expr, const char *file, int line);

#endif
