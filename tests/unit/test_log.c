/* Description: log records in both formats (src/common/log.c): the JSON-lines format escapes
 * every message into one valid JSON object per line, also when it is cut at the buffer. */
#include "common/log.h"
#include "test.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Run kvt_log once with stderr redirected to a temporary file; returns what it wrote. */
static char *capture(int level, const char *msg)
{
    FILE *tmp = tmpfile();
    TEST_ASSERT(tmp);
    int saved = dup(STDERR_FILENO);
    TEST_ASSERT(dup2(fileno(tmp), STDERR_FILENO) >= 0);
    kvt_log(level, "%s", msg);
    TEST_ASSERT(dup2(saved, STDERR_FILENO) >= 0);
    close(saved);
    off_t n = lseek(fileno(tmp), 0, SEEK_END);
    TEST_ASSERT(n >= 0);
    char *out = calloc(1, (size_t)n + 1);
    TEST_ASSERT(pread(fileno(tmp), out, (size_t)n, 0) == n);
    fclose(tmp);
    return out;
}

static void test_json_escapes(void)
{
    kvt_log_set_format(KVT_LOG_JSON);
    const char *msg = "quote \" backslash \\ newline \n tab \t bell \a end";
    char *out = capture(KVT_LOG_WARN, msg);
    size_t len = strlen(out);
    TEST_ASSERT(len > 0 && out[len - 1] == '\n');
    TEST_ASSERT(strchr(out, '\n') == out + len - 1); /* one line */
    json_error_t e;
    json_t *j = json_loads(out, 0, &e);
    TEST_ASSERT(j);
    TEST_ASSERT(strcmp(json_string_value(json_object_get(j, "msg")), msg) == 0);
    TEST_ASSERT(strcmp(json_string_value(json_object_get(j, "level")), "warn") == 0);
    TEST_ASSERT(strlen(json_string_value(json_object_get(j, "ts"))) == 24);
    json_decref(j);
    free(out);
}

static void test_json_long_message_cut_valid(void)
{
    kvt_log_set_format(KVT_LOG_JSON);
    char *msg = malloc(5000);
    for (int i = 0; i < 4999; i++)
        msg[i] = i % 3 ? '"' : 'x'; /* escapes double the length */
    msg[4999] = 0;
    char *out = capture(KVT_LOG_ERROR, msg);
    json_error_t e;
    json_t *j = json_loads(out, 0, &e);
    TEST_ASSERT(j);
    const char *got = json_string_value(json_object_get(j, "msg"));
    TEST_ASSERT(got && strlen(got) > 100 && strncmp(got, msg, strlen(got)) == 0);
    json_decref(j);
    free(out);
    free(msg);
}

static void test_text_unchanged(void)
{
    kvt_log_set_format(KVT_LOG_TEXT);
    char *out = capture(KVT_LOG_INFO, "plain \"text\"");
    /* 2026-11-29T12:00:00.123Z INFO  plain "text" */
    TEST_ASSERT(strlen(out) == 24 + 7 + strlen("plain \"text\"") + 1);
    TEST_ASSERT(strncmp(out + 24, " INFO  plain \"text\"\n", 20) == 0);
    free(out);
    TEST_ASSERT(kvt_log_parse_format("json") == KVT_LOG_JSON);
    TEST_ASSERT(kvt_log_parse_format("TEXT") == KVT_LOG_TEXT);
    TEST_ASSERT(kvt_log_parse_format("yaml") == -1);
}

int main(void)
{
    kvt_log_set_level(KVT_LOG_DEBUG);
    RUN(test_json_escapes);
    RUN(test_json_long_message_cut_valid);
    RUN(test_text_unchanged);
    return TEST_RESULT();
}
