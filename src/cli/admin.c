/*
 * The admin subcommands: kvtier list, delete, clear, quota, pin, unpin,
 * warm, verify. Each is one call (or a few) of a running server's HTTP
 * admin API (docs/operations.md, "The admin API"), printed as a table, or
 * as the server's JSON with --json. Long operations (warm, verify) are
 * jobs: the command follows the job, with a progress bar on a terminal
 * (stderr), unless --no-wait.
 *
 * Where the server is: --http URL, else $KVTIER_ADMIN_URL, else
 * http://127.0.0.1:8080 (the server's --http-port default). The admin
 * token: --token FILE, else the file named by $KVTIER_ADMIN_TOKEN_FILE.
 *
 * Keys are named as `kvtier list` shows them (NAME ...), or by --model
 * (with --salt, --kv-rank, --group) and hashes in hex. Exit status: 0
 * done, 1 refused or failed by the server (its message printed), 2 bad
 * usage (the flag named).
 */
#include "cli/cli.h"
#include "common/secret.h"
#include "common/util.h"

#include <curl/curl.h>
#include <getopt.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------- the options */

enum {
    O_HTTP = 1,
    O_TOKEN,
    O_JSON,
    O_MODEL,
    O_SALT,
    O_RANK,
    O_GROUP,
    O_NS,
    O_TIER,
    O_PREFIX,
    O_LIMIT,
    O_ALL,
    O_SET,
    O_SET_GB,
    O_DELETE,
    O_ADAPTER,
    O_NOWAIT,
    O_HELP,
};

static const struct option longopts[] = {
    {"http", required_argument, NULL, O_HTTP},
    {"token", required_argument, NULL, O_TOKEN},
    {"json", no_argument, NULL, O_JSON},
    {"model", required_argument, NULL, O_MODEL},
    {"salt", required_argument, NULL, O_SALT},
    {"kv-rank", required_argument, NULL, O_RANK},
    {"group", required_argument, NULL, O_GROUP},
    {"namespace", required_argument, NULL, O_NS},
    {"tier", required_argument, NULL, O_TIER},
    {"prefix", required_argument, NULL, O_PREFIX},
    {"limit", required_argument, NULL, O_LIMIT},
    {"all", no_argument, NULL, O_ALL},
    {"set", required_argument, NULL, O_SET},
    {"set-gb", required_argument, NULL, O_SET_GB},
    {"delete", no_argument, NULL, O_DELETE},
    {"adapter", required_argument, NULL, O_ADAPTER},
    {"no-wait", no_argument, NULL, O_NOWAIT},
    {"help", no_argument, NULL, O_HELP},
    {NULL, 0, NULL, 0},
};

struct args {
    const char *cmd;
    const char *http, *token_file;
    char token[256];
    bool json, all, del, nowait;
    const char *model, *salt, *rank, *group, *ns, *tier, *prefix, *limit, *set, *set_gb, *adapter;
    char **pos; /* the words after the options */
    int npos;
};

/* One subcommand: its name, what it does, the options it takes beside
 * --http, --token and --json (their ids), and its usage line. */
struct cmd {
    const char *name;
    int (*run)(struct args *a);
    const int opts[8];
    const char *usage;
};

static int usage_fail(const struct args *a, const char *flag, const char *why)
{
    fprintf(stderr, "kvtier %s: %s%s%s\n", a->cmd, flag ? flag : "", flag ? ": " : "", why);
    return 2;
}

/* ------------------------------------------------------ HTTP, via curl */

struct buf {
    char *p;
    size_t len;
};

static size_t on_data(char *d, size_t sz, size_t n, void *arg)
{
    struct buf *b = arg;
    b->p = kvt_xrealloc(b->p, b->len + sz * n + 1);
    memcpy(b->p + b->len, d, sz * n);
    b->len += sz * n;
    b->p[b->len] = 0;
    return sz * n;
}

/* One request; *out: the JSON reply (NULL when the server sent none).
 * Returns the HTTP status, or -1 (printed) when there was no answer. */
static long call(const struct args *a, const char *method, const char *path, json_t *body,
                 json_t **out)
{
    *out = NULL;
    CURL *h = curl_easy_init();
    char url[2048], auth[300];
    snprintf(url, sizeof(url), "%s%s", a->http, path);
    struct curl_slist *hd = curl_slist_append(NULL, "Content-Type: application/json");
    if (a->token[0]) {
        snprintf(auth, sizeof(auth), "Authorization: Bearer %s", a->token);
        hd = curl_slist_append(hd, auth);
    }
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    struct buf b = {0};
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hd);
    if (text)
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, text);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, 600L);
    CURLcode rc = curl_easy_perform(h);
    long status = -1;
    if (rc != CURLE_OK)
        fprintf(stderr, "kvtier %s: %s: %s\n", a->cmd, a->http, curl_easy_strerror(rc));
    else
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    if (b.p)
        *out = json_loads(b.p, 0, NULL);
    if (status >= 0 && !*out && b.p) { /* not JSON: the message as it came */
        *out = json_object();
        json_object_set_new(*out, "error", json_string(b.p));
    }
    free(b.p);
    free(text);
    curl_slist_free_all(hd);
    curl_easy_cleanup(h);
    return status;
}

/* A refusal: the server's message (and field) on stderr; exit 1. */
static int refused(const struct args *a, long status, json_t *o)
{
    const char *e = json_string_value(json_object_get(o, "error"));
    const char *f = json_string_value(json_object_get(o, "field"));
    fprintf(stderr, "kvtier %s: the server answered %ld: %s%s%s%s\n", a->cmd, status,
            e ? e : "(no message)", f ? " (field " : "", f ? f : "", f ? ")" : "");
    if (a->json && o)
        json_dumpf(o, stdout, JSON_INDENT(2) | JSON_SORT_KEYS), putchar('\n');
    json_decref(o);
    return 1;
}

static void print_json(json_t *o)
{
    json_dumpf(o, stdout, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(15));
    putchar('\n');
}

/* A call whose answer is printed as JSON (--json) or by show. */
static int simple(struct args *a, const char *method, const char *path, json_t *body,
                  void (*show)(const json_t *o))
{
    json_t *o;
    long st = call(a, method, path, body, &o);
    json_decref(body);
    if (st < 0)
        return 1;
    if (st >= 300)
        return refused(a, st, o);
    if (a->json || !show)
        print_json(o);
    else
        show(o);
    json_decref(o);
    return 0;
}

/* ------------------------------------------------------------- keys */

/* The keys the words name: {names: [...]}, or {model, ..., hashes}. */
static int keys_of(struct args *a, json_t **out)
{
    *out = NULL;
    if (!a->npos)
        return usage_fail(a, NULL,
                          "name the objects (NAME ..., as `kvtier list` shows them, or "
                          "--model M HASH ...)");
    json_t *k = json_object(), *arr = json_array();
    for (int i = 0; i < a->npos; i++)
        json_array_append_new(arr, json_string(a->pos[i]));
    if (a->model) {
        json_object_set_new(k, "model", json_string(a->model));
        json_object_set_new(k, "salt", json_string(a->salt ? a->salt : ""));
        const char *nums[2] = {a->rank, a->group}, *flags[2] = {"--kv-rank", "--group"};
        const char *fields[2] = {"kv_rank", "group"};
        for (int i = 0; i < 2; i++) {
            if (!nums[i])
                continue;
            char *end;
            long long v = strtoll(nums[i], &end, 10);
            if (*end || !*nums[i] || v < 0 || v > UINT32_MAX) {
                json_decref(k);
                json_decref(arr);
                return usage_fail(a, flags[i], "an integer from 0 to 4294967295 is expected");
            }
            json_object_set_new(k, fields[i], json_integer(v));
        }
        json_object_set_new(k, "hashes", arr);
    } else {
        if (a->salt || a->rank || a->group) {
            json_decref(k);
            json_decref(arr);
            return usage_fail(a,
                              a->salt   ? "--salt"
                              : a->rank ? "--kv-rank"
                                        : "--group",
                              "only with --model");
        }
        json_object_set_new(k, "names", arr);
    }
    *out = json_object();
    json_object_set_new(*out, "keys", k);
    return 0;
}

/* ------------------------------------------------------------- jobs */

static void bar(const char *what, const json_t *j, bool final)
{
    double p = json_real_value(json_object_get(j, "progress"));
    long long done = json_integer_value(json_object_get(j, "done"));
    long long total = json_integer_value(json_object_get(j, "total"));
    char b[31];
    int full = (int)(p * 30);
    for (int i = 0; i < 30; i++)
        b[i] = i < full ? '#' : '.';
    b[30] = 0;
    fprintf(stderr, "\r%s [%s] %3.0f%% %lld/%lld objects%s", what, b, p * 100, done, total,
            final ? "\n" : "");
}

/* Follow job j until it ends (a bar on a terminal); print its result. */
static int follow(struct args *a, json_t *j, const char *what, void (*show)(const json_t *o))
{
    bool tty = !a->json && isatty(STDERR_FILENO);
    char path[64];
    snprintf(path, sizeof(path), "/admin/jobs/%lld",
             (long long)json_integer_value(json_object_get(j, "id")));
    while (!a->nowait) {
        const char *st = json_string_value(json_object_get(j, "state"));
        bool end = st && strcmp(st, "queued") && strcmp(st, "running");
        if (tty)
            bar(what, j, end);
        if (end)
            break;
        struct timespec ts = {0, 200 * 1000 * 1000};
        nanosleep(&ts, NULL);
        json_t *n;
        long code = call(a, "GET", path, NULL, &n);
        if (code < 0 || code >= 300) {
            json_decref(j);
            return code < 0 ? 1 : refused(a, code, n);
        }
        json_decref(j);
        j = n;
    }
    if (a->json || a->nowait)
        print_json(j);
    else
        show(j);
    const char *st = json_string_value(json_object_get(j, "state"));
    int rc = a->nowait || (st && !strcmp(st, "done")) ? 0 : 1;
    json_decref(j);
    return rc;
}

static int start_job(struct args *a, const char *path, json_t *body, const char *what,
                     void (*show)(const json_t *o))
{
    json_t *o;
    long st = call(a, "POST", path, body, &o);
    json_decref(body);
    if (st < 0)
        return 1;
    if (st >= 300)
        return refused(a, st, o);
    return follow(a, o, what, show);
}

/* ---------------------------------------------------------- commands */

static void show_list(const json_t *o)
{
    const json_t *objs = json_object_get(o, "objects"), *x;
    size_t i;
    printf("%-8s %10s %-6s %s\n", "TIER", "BYTES", "PINNED", "NAME");
    json_array_foreach(objs, i, x)
    {
        printf("%-8s %10lld %-6s %s\n", json_string_value(json_object_get(x, "tier")),
               (long long)json_integer_value(json_object_get(x, "bytes")),
               json_is_true(json_object_get(x, "pinned")) ? "yes" : "",
               json_string_value(json_object_get(x, "name")));
    }
}

static void query_add(char *q, size_t cap, const char *k, const char *v)
{
    if (!v)
        return;
    char *e = curl_easy_escape(NULL, v, 0);
    size_t l = strlen(q);
    snprintf(q + l, cap - l, "%s%s=%s", strchr(q, '?') ? "&" : "?", k, e);
    curl_free(e);
}

static int cmd_list(struct args *a)
{
    if (a->npos)
        return usage_fail(a, a->pos[0], "unexpected argument");
    char *cursor = NULL;
    json_t *all = json_array();
    int rc = 0;
    for (;;) {
        char q[4096] = "/admin/objects";
        query_add(q, sizeof(q), "model", a->model);
        query_add(q, sizeof(q), "salt", a->salt);
        query_add(q, sizeof(q), "namespace", a->ns);
        query_add(q, sizeof(q), "tier", a->tier);
        query_add(q, sizeof(q), "prefix", a->prefix);
        query_add(q, sizeof(q), "limit", a->limit);
        query_add(q, sizeof(q), "cursor", cursor);
        json_t *o;
        long st = call(a, "GET", q, NULL, &o);
        if (st < 0 || st >= 300) {
            rc = st < 0 ? 1 : refused(a, st, o);
            break;
        }
        json_array_extend(all, json_object_get(o, "objects"));
        free(cursor);
        const char *next = json_string_value(json_object_get(o, "next_cursor"));
        cursor = next ? kvt_xstrdup(next) : NULL;
        json_decref(o);
        if (!cursor || !a->all)
            break;
    }
    if (!rc) {
        json_t *o = json_object();
        json_object_set(o, "objects", all);
        json_object_set_new(o, "next_cursor", cursor ? json_string(cursor) : json_null());
        if (a->json) {
            print_json(o);
        } else {
            show_list(o);
            if (cursor)
                printf("(more: --all, or the next page with the API's cursor %s)\n", cursor);
        }
        json_decref(o);
    }
    free(cursor);
    json_decref(all);
    return rc;
}

static void show_delete(const json_t *o)
{
    long long l2 = 0;
    const char *k;
    json_t *v;
    json_object_foreach(json_object_get(o, "removed_l2"), k, v) l2 += json_integer_value(v);
    printf("removed: %lld from L1, %lld from L2; %zu left in use; %lld unpinned\n",
           (long long)json_integer_value(json_object_get(o, "removed_l1")), l2,
           json_array_size(json_object_get(o, "left_in_use")),
           (long long)json_integer_value(json_object_get(o, "unpinned")));
}

static int cmd_delete(struct args *a)
{
    json_t *body = NULL;
    if (a->prefix) {
        if (a->npos || a->model)
            return usage_fail(a, "--prefix", "names no other keys");
        body = json_object();
        json_object_set_new(body, "prefix", json_string(a->prefix));
    } else {
        int rc = keys_of(a, &body);
        if (rc)
            return rc;
    }
    return simple(a, "POST", "/admin/delete", body, show_delete);
}

static void show_clear(const json_t *o)
{
    printf("%s: %lld object(s) removed (%lld bytes); %lld left (pinned or in use)\n",
           json_string_value(json_object_get(o, "tier")),
           (long long)json_integer_value(json_object_get(o, "removed")),
           (long long)json_integer_value(json_object_get(o, "freed_bytes")),
           (long long)json_integer_value(json_object_get(o, "left")));
}

static int cmd_clear(struct args *a)
{
    if (a->npos != 1)
        return usage_fail(a, NULL, "name one tier: l1, or an L2 adapter's name (fs[0])");
    json_t *body = json_object();
    json_object_set_new(body, "tier", json_string(a->pos[0]));
    return simple(a, "POST", "/admin/clear", body, show_clear);
}

static void show_quota(const json_t *o)
{
    const json_t *per = json_object_get(o, "adapters");
    const char *name = json_string_value(json_object_get(o, "name"));
    if (!per) { /* every quota: {adapter: {name: {...}}} */
        printf("%-10s %-40s %14s %14s %10s\n", "ADAPTER", "QUOTA", "LIMIT", "USED", "REJECTED");
        const char *ad, *qn;
        json_t *qs, *q;
        json_object_foreach((json_t *)o, ad, qs) json_object_foreach(qs, qn, q)
            printf("%-10s %-40s %14lld %14lld %10lld\n", ad, qn,
                   (long long)json_integer_value(json_object_get(q, "quota_bytes")),
                   (long long)json_integer_value(json_object_get(q, "used_bytes")),
                   (long long)json_integer_value(json_object_get(q, "rejected_writes")));
        return;
    }
    const char *ad;
    json_t *q;
    json_object_foreach((json_t *)per, ad, q)
        printf("%s %s: limit %lld bytes, used %lld, rejected writes %lld\n", name, ad,
               (long long)json_integer_value(json_object_get(q, "quota_bytes")),
               (long long)json_integer_value(json_object_get(q, "used_bytes")),
               (long long)json_integer_value(json_object_get(q, "rejected_writes")));
}

static void show_removed(const json_t *o)
{
    printf("quota %s removed\n", json_string_value(json_object_get(o, "name")));
}

static int cmd_quota(struct args *a)
{
    if (a->npos > 1)
        return usage_fail(a, a->pos[1], "unexpected argument (one quota name at a time)");
    const char *name = a->npos ? a->pos[0] : NULL;
    if ((a->set || a->set_gb || a->del) && !name)
        return usage_fail(a,
                          a->del   ? "--delete"
                          : a->set ? "--set"
                                   : "--set-gb",
                          "name the quota (a namespace, a model, or @SALT)");
    if ((a->set != NULL) + (a->set_gb != NULL) + a->del > 1)
        return usage_fail(a, "--set", "one of --set, --set-gb and --delete");
    char q[2048] = "/admin/quotas";
    if (a->set || a->set_gb) {
        json_t *body = json_object();
        json_object_set_new(body, "name", json_string(name));
        char *end;
        const char *v = a->set ? a->set : a->set_gb;
        if (a->set) {
            long long b = strtoll(v, &end, 10);
            if (*end || !*v || b < 0) {
                json_decref(body);
                return usage_fail(a, "--set", "a number of bytes >= 0 is expected");
            }
            json_object_set_new(body, "max_bytes", json_integer(b));
        } else {
            double g = strtod(v, &end);
            if (*end || !*v || !(g >= 0)) {
                json_decref(body);
                return usage_fail(a, "--set-gb", "a number of GiB >= 0 is expected");
            }
            json_object_set_new(body, "max_gb", json_real(g));
        }
        if (a->adapter)
            json_object_set_new(body, "adapter", json_string(a->adapter));
        return simple(a, "PUT", q, body, show_quota);
    }
    query_add(q, sizeof(q), "name", name);
    query_add(q, sizeof(q), "adapter", a->adapter);
    return simple(a, a->del ? "DELETE" : "GET", q, NULL, a->del ? show_removed : show_quota);
}

static void show_pins(const json_t *o)
{
    show_list(o);
    printf("pinned: %lld of %lld bytes\n",
           (long long)json_integer_value(json_object_get(o, "pinned_bytes")),
           (long long)json_integer_value(json_object_get(o, "max_pinned_bytes")));
}

static void show_pin(const json_t *o)
{
    const json_t *p = json_object_get(o, "pinned");
    printf("%s %lld key(s); pinned bytes now %lld\n", p ? "pinned" : "unpinned",
           (long long)json_integer_value(p ? p : json_object_get(o, "unpinned")),
           (long long)json_integer_value(json_object_get(o, "pinned_bytes")));
}

static int cmd_pin(struct args *a)
{
    if (!a->npos && !a->model)
        return simple(a, "GET", "/admin/pins", NULL, show_pins);
    json_t *body;
    int rc = keys_of(a, &body);
    return rc ? rc : simple(a, "POST", "/admin/pin", body, show_pin);
}

static int cmd_unpin(struct args *a)
{
    json_t *body;
    int rc = keys_of(a, &body);
    return rc ? rc : simple(a, "POST", "/admin/unpin", body, show_pin);
}

static void show_warm(const json_t *j)
{
    printf("warm job %lld %s: %lld loaded into L1, %lld there already, %lld in no L2, %lld "
           "failed\n",
           (long long)json_integer_value(json_object_get(j, "id")),
           json_string_value(json_object_get(j, "state")),
           (long long)json_integer_value(json_object_get(j, "warmed")),
           (long long)json_integer_value(json_object_get(j, "already")),
           (long long)json_integer_value(json_object_get(j, "missing")),
           (long long)json_integer_value(json_object_get(j, "failed")));
}

static int cmd_warm(struct args *a)
{
    json_t *body;
    if (a->ns) {
        if (a->npos || a->model)
            return usage_fail(a, "--namespace", "names no other keys");
        body = json_object();
        json_object_set_new(body, "namespace", json_string(a->ns));
    } else {
        int rc = keys_of(a, &body);
        if (rc)
            return rc;
    }
    return start_job(a, "/admin/warm", body, "warming", show_warm);
}

static void show_verify(const json_t *j)
{
    printf("verify job %lld %s: %lld read, %lld corrupt (%lld removed), %lld failed to read\n",
           (long long)json_integer_value(json_object_get(j, "id")),
           json_string_value(json_object_get(j, "state")),
           (long long)json_integer_value(json_object_get(j, "done")),
           (long long)json_integer_value(json_object_get(j, "corrupt")),
           (long long)json_integer_value(json_object_get(j, "removed")),
           (long long)json_integer_value(json_object_get(j, "failed")));
    size_t i;
    json_t *n;
    json_array_foreach(json_object_get(j, "corrupt_objects"), i, n)
        printf("  corrupt: %s\n", json_string_value(n));
}

static int cmd_verify(struct args *a)
{
    if (a->npos)
        return usage_fail(a, a->pos[0], "unexpected argument");
    json_t *body = json_object();
    if (a->tier)
        json_object_set_new(body, "tier", json_string(a->tier));
    if (a->ns)
        json_object_set_new(body, "namespace", json_string(a->ns));
    return start_job(a, "/admin/verify", body, "verifying", show_verify);
}

#define KEYOPTS O_MODEL, O_SALT, O_RANK, O_GROUP
static const struct cmd cmds[] = {
    {"list",
     cmd_list,
     {O_MODEL, O_SALT, O_NS, O_TIER, O_PREFIX, O_LIMIT, O_ALL},
     "[--model M] [--salt S] [--namespace NS] [--tier T] [--prefix P] [--limit N] [--all]"},
    {"delete",
     cmd_delete,
     {KEYOPTS, O_PREFIX},
     "NAME... | --model M [--salt S] [--kv-rank R] [--group G] HASH... | --prefix P"},
    {"clear", cmd_clear, {0}, "TIER   (l1, or an L2 adapter's name: fs[0])"},
    {"quota",
     cmd_quota,
     {O_SET, O_SET_GB, O_DELETE, O_ADAPTER},
     "[NAME [--set BYTES | --set-gb G | --delete]] [--adapter A]\n"
     "               NAME: a namespace, a model, or @SALT (a tenant)"},
    {"pin", cmd_pin, {KEYOPTS}, "[NAME... | --model M [--salt S] ... HASH...]   (none: list pins)"},
    {"unpin", cmd_unpin, {KEYOPTS}, "NAME... | --model M [--salt S] ... HASH..."},
    {"warm",
     cmd_warm,
     {KEYOPTS, O_NS, O_NOWAIT},
     "--namespace NS | NAME... | --model M ... HASH...  [--no-wait]"},
    {"verify",
     cmd_verify,
     {O_TIER, O_NS, O_NOWAIT},
     "[--tier ADAPTER] [--namespace NS] [--no-wait]"},
};

static void cmd_usage(FILE *f, const struct cmd *c)
{
    fprintf(f,
            "usage: kvtier %s %s\n"
            "  common: [--http URL] (or $KVTIER_ADMIN_URL; http://127.0.0.1:8080)\n"
            "          [--token FILE] (or $KVTIER_ADMIN_TOKEN_FILE: the server's --admin-token)\n"
            "          [--json]\n"
            "see docs/operations.md, \"The admin API\"\n",
            c->name, c->usage);
}

static bool takes(const struct cmd *c, int id)
{
    for (size_t i = 0; i < KVT_ARRAY_LEN(c->opts); i++)
        if (c->opts[i] == id)
            return true;
    return false;
}

static int parse(const struct cmd *c, int argc, char **argv, struct args *a)
{
    memset(a, 0, sizeof(*a));
    a->cmd = c->name;
    a->http = getenv("KVTIER_ADMIN_URL");
    a->token_file = getenv("KVTIER_ADMIN_TOKEN_FILE");
    optind = 0; /* GNU getopt: a full reset; options may follow the words (permuted) */
    opterr = 0;
    int o, li;
    while ((o = getopt_long(argc, argv, "", longopts, &li)) != -1) {
        if (o == '?' || o == ':') {
            const char *w = argv[optind - 1];
            fprintf(stderr, "kvtier %s: %s: an unknown option, or one without its value\n", c->name,
                    w);
            cmd_usage(stderr, c);
            return 2;
        }
        bool common = o == O_HTTP || o == O_TOKEN || o == O_JSON || o == O_HELP;
        if (!common && !takes(c, o)) {
            fprintf(stderr, "kvtier %s: --%s: not an option of this command\n", c->name,
                    longopts[o - 1].name);
            cmd_usage(stderr, c);
            return 2;
        }
        switch (o) {
        case O_HTTP:
            a->http = optarg;
            break;
        case O_TOKEN:
            a->token_file = optarg;
            break;
        case O_JSON:
            a->json = true;
            break;
        case O_MODEL:
            a->model = optarg;
            break;
        case O_SALT:
            a->salt = optarg;
            break;
        case O_RANK:
            a->rank = optarg;
            break;
        case O_GROUP:
            a->group = optarg;
            break;
        case O_NS:
            a->ns = optarg;
            break;
        case O_TIER:
            a->tier = optarg;
            break;
        case O_PREFIX:
            a->prefix = optarg;
            break;
        case O_LIMIT:
            a->limit = optarg;
            break;
        case O_ALL:
            a->all = true;
            break;
        case O_SET:
            a->set = optarg;
            break;
        case O_SET_GB:
            a->set_gb = optarg;
            break;
        case O_DELETE:
            a->del = true;
            break;
        case O_ADAPTER:
            a->adapter = optarg;
            break;
        case O_NOWAIT:
            a->nowait = true;
            break;
        case O_HELP:
            cmd_usage(stdout, c);
            return 1;
        }
    }
    a->pos = argv + optind;
    a->npos = argc - optind;
    if (!a->http || !a->http[0])
        a->http = "http://127.0.0.1:8080";
    if (strncmp(a->http, "http://", 7) && strncmp(a->http, "https://", 8))
        return usage_fail(a, "--http", "an http:// URL is expected");
    if (a->token_file && a->token_file[0]) {
        char err[1200];
        if (kvt_secret_read(a->token_file, true, a->token, sizeof(a->token), err, sizeof(err)))
            return usage_fail(a, "--token", err);
    }
    if (a->limit) {
        char *end;
        long l = strtol(a->limit, &end, 10);
        if (*end || l < 1 || l > 10000)
            return usage_fail(a, "--limit", "a number from 1 to 10000 is expected");
    }
    return 0;
}

static int run(const char *name, int argc, char **argv)
{
    const struct cmd *c = NULL;
    for (size_t i = 0; i < KVT_ARRAY_LEN(cmds); i++)
        if (!strcmp(cmds[i].name, name))
            c = &cmds[i];
    struct args a;
    int rc = parse(c, argc, argv, &a);
    if (rc)
        return rc == 1 ? 0 : rc;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    rc = c->run(&a);
    kvt_secret_wipe(a.token, sizeof(a.token));
    return rc;
}

int kvt_cmd_list(int argc, char **argv)
{
    return run("list", argc, argv);
}
int kvt_cmd_delete(int argc, char **argv)
{
    return run("delete", argc, argv);
}
int kvt_cmd_clear(int argc, char **argv)
{
    return run("clear", argc, argv);
}
int kvt_cmd_quota(int argc, char **argv)
{
    return run("quota", argc, argv);
}
int kvt_cmd_pin(int argc, char **argv)
{
    return run("pin", argc, argv);
}
int kvt_cmd_unpin(int argc, char **argv)
{
    return run("unpin", argc, argv);
}
int kvt_cmd_warm(int argc, char **argv)
{
    return run("warm", argc, argv);
}
int kvt_cmd_verify(int argc, char **argv)
{
    return run("verify", argc, argv);
}
