/*
 * kvtier purge: delete a namespace, everything, or crash residue.
 *
 *   kvtier purge --namespace=NAME --yes     one namespace (exact match)
 *   kvtier purge NAME --yes                 the same; NAME may begin with '-'
 *   kvtier purge --all --yes                every cache file and dead tmp file
 *   kvtier purge --tmp --yes                crash residue only (tmp guard rules)
 *   options: --config FILE | --root DIR, --url URL, --offline, --json
 *
 * Safety, in this order (docs/operations.md):
 *   - nothing happens without --yes: the command says what it would remove
 *     and exits 2;
 *   - a NAME that is a path ("/x", "a/b", "..") or a --root other than the
 *     configured KVP_CACHE_ROOT is refused with exit 2: only cache files
 *     directly under the root (or its shard directories) are ever removed;
 *   - with a server that keeps its files in the root (asked at --url, else
 *     KVP_SERVER_URL, else tcp://127.0.0.1:5555), the purge goes through it
 *     (operation "purge", docs/protocol.md) so its accounting stays exact;
 *   - with no such server, a process that holds the root open (a server on
 *     another address) makes the offline purge refuse (exit 1) instead of
 *     deleting under its feet; --offline skips asking a server.
 * A progress bar goes to a terminal on stderr.
 */
#include "cli/cli.h"
#include "common/util.h"
#include "key/key.h"
#include "kvtier/error.h"
#include "ops/cli.h"
#include "l2/kit/dirlock.h"
#include "ops/purge.h"
#include "ops/rpc.h"
#include "ops/scan.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BATCH 4096 /* objects per server call: progress, and bounded calls */
/* how long to wait for a server's start-up scan (it answers EBUSY at once) */
#define RECOVERY_WAIT_MS (10 * 60 * 1000)
#define RECOVERY_POLL_MS 250

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvtier purge (--namespace=NAME | NAME | --all | --tmp) --yes\n"
            "                    [--config FILE | --root DIR] [--url URL] [--offline] [--json]\n"
            "  NAME is a namespace exactly as `kvtier status` lists it (file-name prefix, e.g.\n"
            "  --models--MyModel--a84fadf1); --namespace=NAME, -- NAME, and the positional form\n"
            "  (when the root holds that namespace) accept names that begin with '-'; any other\n"
            "  word that begins with '-' is an unknown option (exit 2). A NAME that matches\n"
            "  nothing exits 1 and lists the namespaces. Without --yes nothing is removed.\n"
            "  A model name (Qwen/Qwen2-7B) is refused, naming its namespace (Qwen--Qwen2-7B).\n");
}

struct bar {
    bool on;
    const char *what;
};

static void draw(uint64_t done, uint64_t total, uint64_t bytes, void *arg)
{
    struct bar *b = arg;
    if (!b->on)
        return;
    char h[32];
    kvt_human(h, sizeof(h), (double)bytes);
    int width = 30, fill = total ? (int)((double)done / (double)total * width) : 0;
    if (fill > width)
        fill = width;
    fprintf(stderr, "\rpurging %s [", b->what);
    for (int i = 0; i < width; i++)
        fputc(i < fill ? '#' : '.', stderr);
    if (total)
        fprintf(stderr, "] %3.0f%% %llu/%llu files, %s ", 100.0 * (double)done / (double)total,
                (unsigned long long)done, (unsigned long long)total, h);
    else
        fprintf(stderr, "] %llu files, %s ", (unsigned long long)done, h);
    fflush(stderr);
}

static void bar_end(struct bar *b)
{
    if (b->on)
        fputc('\n', stderr);
}

/* An option's value: "--opt=V" or "--opt V". Returns the value or NULL.
 * The separate form never takes a word that begins with '-': in
 * "--namespace --yes" the name is missing, not "--yes" (names that begin
 * with '-' are given as --namespace=NAME). */
static const char *optval(int argc, char **argv, int *i, const char *opt, bool *bad)
{
    size_t n = strlen(opt);
    if (strncmp(argv[*i], opt, n) != 0)
        return NULL;
    if (argv[*i][n] == '=')
        return argv[*i] + n + 1;
    if (argv[*i][n] != 0)
        return NULL;
    if (*i + 1 >= argc || argv[*i + 1][0] == '-') {
        if (*i + 1 < argc)
            fprintf(stderr,
                    "kvtier purge: %s needs a value ('%s' is an option); for a value "
                    "that begins with '-' write %s=VALUE\n",
                    opt, argv[*i + 1], opt);
        else
            fprintf(stderr, "kvtier purge: %s needs a value\n", opt);
        *bad = true;
        return NULL;
    }
    return argv[++*i];
}

/* Namespaces the root holds, sorted: the server's index (adapter status
 * ad, may be NULL), and when want is not there (the server's start-up scan
 * may still run) or there is no server, a scan of the root. */
static json_t *known_namespaces(const char *root, const json_t *ad, const char *want)
{
    json_t *set = json_object();
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)json_object_get(ad, "per_namespace_bytes"), k, v)
        json_object_set(set, k, json_true());
    if (!want || !json_object_get(set, want)) {
        struct kvt_scan sc;
        if (kvt_scan_root(root, &sc, false) == 0) {
            json_object_foreach(sc.per_ns_bytes, k, v) json_object_set(set, k, json_true());
            kvt_scan_free(&sc);
        }
    }
    json_t *names = json_array();
    json_object_foreach(set, k, v)
    {
        size_t n = json_array_size(names), at = n;
        while (at > 0 && strcmp(json_string_value(json_array_get(names, at - 1)), k) > 0)
            at--;
        json_array_insert_new(names, at, json_string(k));
    }
    json_decref(set);
    return names;
}

/* The namespace name of `name` read as a model ("Qwen/Qwen2-7B" ->
 * "Qwen--Qwen2-7B"), into out; false when name is no valid model or maps to
 * itself. */
static bool ns_of_model(const char *name, char *out, size_t cap)
{
    size_t l = strlen(name);
    if (kvt_validate_model(name, l, NULL) || kvt_ns_name_of(name, l, out, cap) < 0)
        return false;
    return strcmp(out, name) != 0;
}

static bool has_name(const json_t *names, const char *n)
{
    size_t i;
    const json_t *v;
    json_array_foreach(names, i, v) if (!strcmp(json_string_value(v), n)) return true;
    return false;
}

/* "a, ab, --models--x" (at most 20, then how many more); "none" */
static void list_names(const json_t *names, char *out, size_t cap)
{
    out[0] = 0;
    size_t i, n = json_array_size(names);
    const json_t *v;
    json_array_foreach(names, i, v)
    {
        size_t l = strlen(out);
        if (i == 20) {
            snprintf(out + l, cap - l, ", ... (%zu more)", n - 20);
            break;
        }
        snprintf(out + l, cap - l, "%s%s", i ? ", " : "", json_string_value(v));
    }
    if (!n)
        snprintf(out, cap, "none: no cache files");
}

/* Add the integer fields of one into sum. keep_state: the fields of what
 * was left in place (a state, not a count of work done) replace sum's. */
static void add_totals(json_t *sum, const json_t *one, bool keep_state)
{
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)one, k, v)
    {
        if (!json_is_integer(v))
            continue;
        json_t *cur = json_object_get(sum, k);
        bool state = !strcmp(k, "pinned") || !strcmp(k, "in_flight") || !strcmp(k, "tmp_kept");
        json_int_t nv = (keep_state && state) || !cur
                            ? json_integer_value(v)
                            : json_integer_value(cur) + json_integer_value(v);
        json_object_set_new(sum, k, json_integer(nv));
    }
}

/* Purge through the server that serves the root; 0, or an exit status. */
static int via_server(const char *url, const char *root, const struct kvt_purge_req *q,
                      struct bar *b, uint64_t total, json_t *out)
{
    json_t *sum = json_object();
    int waited_ms = 0;
    for (int round = 0;; round++) {
        json_t *body = json_object(), *rep = NULL;
        if (q->what == KVT_PURGE_NAMESPACE)
            json_object_set_new(body, "namespace", json_string(q->ns));
        else
            json_object_set_new(body, q->what == KVT_PURGE_ALL ? "all" : "tmp", json_true());
        json_object_set_new(body, "root", json_string(root));
        json_object_set_new(body, "max", json_integer(BATCH));
        char err[512];
        int rc = kvt_ops_call(url, "purge", body, 120000, &rep, err, sizeof(err));
        json_decref(body);
        if (rc == -EBUSY && waited_ms < RECOVERY_WAIT_MS) {
            /* the server's start-up scan still adopts files: the waiting is
             * done here, not on the server's worker threads */
            if (waited_ms % 5000 == 0)
                fprintf(stderr,
                        "kvtier purge: the server at %s is still scanning its cache "
                        "(start-up); waiting%s (%ds)\n",
                        url, waited_ms ? "" : " to purge", waited_ms / 1000);
            struct timespec ts = {0, RECOVERY_POLL_MS * 1000000L};
            nanosleep(&ts, NULL);
            waited_ms += RECOVERY_POLL_MS;
            continue;
        }
        if (rc) {
            bar_end(b);
            fprintf(stderr, "kvtier purge: the server at %s: %s\n", url, err);
            json_decref(sum);
            return 1;
        }
        bool more = json_is_true(json_object_get(rep, "more"));
        size_t i;
        json_t *a;
        /* within one reply the adapters add up; across calls what was left
         * in place is the last call's */
        json_t *reply_sum = json_object();
        json_array_foreach(json_object_get(rep, "adapters"), i, a) add_totals(reply_sum, a, false);
        add_totals(sum, reply_sum, true);
        json_decref(reply_sum);
        json_decref(rep);
        uint64_t bytes = (uint64_t)json_integer_value(json_object_get(sum, "removed_bytes")) +
                         (uint64_t)json_integer_value(json_object_get(sum, "files_bytes"));
        uint64_t done = (uint64_t)json_integer_value(json_object_get(sum, "removed"));
        /* the server's count may have grown since it was asked */
        draw(done, KVT_MAX(total, done), bytes, b);
        if (!more || round > 1000000)
            break;
    }
    bar_end(b);
    json_object_set_new(out, "via", json_string("server"));
    json_object_set_new(out, "url", json_string(url));
    json_object_set_new(out, "result", sum);
    return 0;
}

int kvt_cmd_purge(int argc, char **argv)
{
    const char *config = NULL, *root = NULL, *url = NULL, *name = NULL;
    const char *unknown = NULL; /* a word that begins with '-' and is no option */
    bool yes = false, all = false, tmp = false, as_json = false, offline = false, bad = false;
    int positional = 0, named = 0, nunknown = 0;
    bool only_positional = false;
    for (int i = 1; i < argc && !bad; i++) {
        const char *a = argv[i], *v;
        if (only_positional) {
            name = a;
            positional++;
        } else if (!strcmp(a, "--")) {
            only_positional = true;
        } else if (!strcmp(a, "--yes") || !strcmp(a, "-y")) {
            yes = true;
        } else if (!strcmp(a, "--all")) {
            all = true;
        } else if (!strcmp(a, "--tmp")) {
            tmp = true;
        } else if (!strcmp(a, "--json")) {
            as_json = true;
        } else if (!strcmp(a, "--offline")) {
            offline = true;
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if ((v = optval(argc, argv, &i, "--namespace", &bad))) {
            name = v;
            named++;
        } else if ((v = optval(argc, argv, &i, "--config", &bad))) {
            config = v;
        } else if ((v = optval(argc, argv, &i, "--root", &bad))) {
            root = v;
        } else if ((v = optval(argc, argv, &i, "--url", &bad))) {
            url = v;
        } else if (bad) {
            break;
        } else if (a[0] == '-' && a[1]) {
            /* a mistyped option ("--al") or a positional namespace that
             * begins with '-' ("--models--x", as the seed writes it):
             * decided below against the namespaces the root holds */
            unknown = a;
            nunknown++;
        } else {
            name = a;
            positional++;
        }
    }
    if (bad)
        return 2;
    if (nunknown > 1 || (nunknown && (name || all || tmp))) {
        fprintf(stderr,
                "kvtier purge: unknown option '%s' (a namespace that begins with '-': "
                "--namespace=NAME, or -- NAME)\n",
                unknown);
        usage(stderr);
        return 2;
    }
    if (unknown) {
        name = unknown; /* only if the root holds it, checked once the root is known */
        positional++;
    }
    if (positional + named > 1) {
        fprintf(stderr, "kvtier purge: one namespace at a time\n");
        return 2;
    }
    if ((name != NULL) + all + tmp != 1) {
        fprintf(stderr, "kvtier purge: say what to purge: --namespace=NAME, NAME, --all or "
                        "--tmp (exactly one)\n");
        usage(stderr);
        return 2;
    }
    struct kvt_purge_req q = {.what = name  ? KVT_PURGE_NAMESPACE
                                      : all ? KVT_PURGE_ALL
                                            : KVT_PURGE_TMP};
    if (name) {
        if (strchr(name, '/') || !strcmp(name, ".") || !strcmp(name, "..")) {
            /* a model name ("Qwen/Qwen2-7B") is the likely intent: say
             * which namespace it is stored under */
            char ns[KVT_NAME_MAX + 1];
            if (ns_of_model(name, ns, sizeof(ns)))
                fprintf(stderr,
                        "kvtier purge: refused: '%s' is a path, not a namespace; purge "
                        "only removes cache files inside the cache root. As a model name it "
                        "is the namespace '%s': kvtier purge --namespace=%s\n",
                        name, ns, ns);
            else
                fprintf(stderr,
                        "kvtier purge: refused: '%s' is a path, not a namespace; purge "
                        "only removes cache files inside the cache root\n",
                        name);
            return 2;
        }
        if (!kvt_ns_name_ok(name) || strlen(name) >= sizeof(q.ns)) {
            fprintf(stderr,
                    "kvtier purge: refused: '%s' is not a namespace name (see the "
                    "\"namespaces\" of kvtier status)\n",
                    name);
            return 2;
        }
        snprintf(q.ns, sizeof(q.ns), "%s", name);
    }
    struct kvt_cli_target t;
    int rc = kvt_cli_target("purge", config, root, url, true, &t);
    if (rc)
        return rc;
    const char *what = name ? name : all ? "everything" : "tmp files";
    struct bar b = {.on = !as_json && isatty(STDERR_FILENO), .what = what};
    json_t *out = json_object();
    json_object_set_new(out, "root", json_string(t.root));
    json_object_set_new(out, "what",
                        json_string(q.what == KVT_PURGE_NAMESPACE ? "namespace"
                                    : q.what == KVT_PURGE_ALL     ? "all"
                                                                  : "tmp"));
    if (name)
        json_object_set_new(out, "namespace", json_string(name));
    int status = 0;
    int lockfd = -1;
    /* 1. a server that keeps its files here? */
    json_t *st = NULL, *ad = NULL;
    char err[512];
    bool answered = false;
    if (!offline) {
        int timeout = url ? 5000 : 1500;
        if (kvt_ops_call(t.url, "status", NULL, timeout, &st, err, sizeof(err)) == 0) {
            answered = true;
            ad = kvt_cli_pick_adapter(st, t.root);
        } else if (url) {
            fprintf(stderr, "kvtier purge: cannot reach a server at %s: %s\n", t.url, err);
            status = 1;
            goto out;
        }
    }
    if (answered && !ad && url) {
        fprintf(stderr,
                "kvtier purge: the server at %s keeps no adapter in %s: nothing "
                "removed (purge through the server that does, or --offline once no "
                "server uses %s)\n",
                t.url, t.root, t.root);
        status = 2;
        goto out;
    }
    /* 2. the name: a word that begins with '-' is a namespace only if the
     * root holds one of that name; any name that matches nothing is said
     * so, with the names there are */
    if (name) {
        json_t *names = known_namespaces(t.root, ad, name);
        if (!has_name(names, name)) {
            char list[2048];
            list_names(names, list, sizeof(list));
            if (unknown)
                fprintf(stderr,
                        "kvtier purge: unknown option '%s', and no namespace of that "
                        "name in %s (namespaces: %s); see kvtier purge --help\n",
                        name, t.root, list);
            else {
                /* the model "x--y" is the namespace "x%2D-y" */
                char ns[KVT_NAME_MAX + 1], hint[2 * KVT_NAME_MAX + 128] = "";
                if (ns_of_model(name, ns, sizeof(ns)) && has_name(names, ns))
                    snprintf(hint, sizeof(hint),
                             "; as a model name it is the namespace '%s': kvtier purge "
                             "--namespace=%s",
                             ns, ns);
                fprintf(stderr,
                        "kvtier purge: no namespace '%s' in %s: nothing removed "
                        "(namespaces: %s)%s\n",
                        name, t.root, list, hint);
            }
            json_decref(names);
            status = unknown ? 2 : 1;
            goto out;
        }
        json_decref(names);
    }
    if (ad) {
        uint64_t ns_bytes = name ? (uint64_t)json_integer_value(json_object_get(
                                       json_object_get(ad, "per_namespace_bytes"), name))
                                 : (uint64_t)json_integer_value(json_object_get(ad, "used_bytes"));
        if (!yes) {
            char h[32];
            kvt_human(h, sizeof(h), (double)ns_bytes);
            if (q.what == KVT_PURGE_TMP)
                fprintf(stderr,
                        "kvtier purge: would remove the removable tmp files under %s "
                        "(through the server at %s); nothing removed: add --yes\n",
                        t.root, t.url);
            else
                fprintf(stderr,
                        "kvtier purge: would remove %s of %s from %s (through the server "
                        "at %s); nothing removed: add --yes\n",
                        h, what, t.root, t.url);
            status = 2;
            goto out;
        }
        /* the bar's whole: the objects the server counts for what is
         * purged (tmp files are not counted: a count of files only) */
        uint64_t total = 0;
        if (q.what == KVT_PURGE_ALL)
            total = (uint64_t)json_integer_value(json_object_get(ad, "objects"));
        else if (q.what == KVT_PURGE_NAMESPACE)
            total = (uint64_t)json_integer_value(
                json_object_get(json_object_get(ad, "per_namespace_objects"), name));
        status = via_server(t.url, t.root, &q, &b, total, out);
        goto out;
    }
    /* 3. offline: nobody else may be using the root. A kvtier server holds
     * its lock file (l2/kit/dirlock.h); this purge takes it for the time it
     * deletes, so no server starts under it. Other processes that hold the
     * root open are found in /proc. */
    if (yes) {
        int dfd = open(t.root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        pid_t holder = 0;
        char lerr[PATH_MAX + 256];
        lockfd = dfd < 0 ? -errno
                         : kvt_dirlock_take_existing(dfd, t.root, "cache root", &holder, lerr,
                                                     sizeof(lerr));
        if (dfd >= 0)
            close(dfd);
        if (lockfd == -EBUSY) {
            char who[48] = "a kvtier server";
            if (holder > 0)
                snprintf(who, sizeof(who), "kvtier server pid %d", (int)holder);
            else if (holder < 0)
                snprintf(who, sizeof(who), "kvtier servers sharing it");
            if (answered)
                fprintf(stderr,
                        "kvtier purge: refused: %s holds %s, and the server at %s "
                        "does not serve it: purge through the server that does with "
                        "--url URL, or stop it first\n",
                        who, t.root, t.url);
            else
                fprintf(stderr,
                        "kvtier purge: refused: %s holds %s but no server answered "
                        "at %s: purge through it with --url URL, or stop it first\n",
                        who, t.root, t.url);
            status = 1;
            goto out;
        }
    }
    pid_t pids[8];
    int users = kvt_root_users(t.root, pids, 8);
    if (users > 0 && yes) {
        if (answered)
            fprintf(stderr,
                    "kvtier purge: refused: process %d holds %s open (a kvtier "
                    "server?), and the server at %s does not serve it: purge through "
                    "the server that does with --url URL, or stop it first\n",
                    (int)pids[0], t.root, t.url);
        else
            fprintf(stderr,
                    "kvtier purge: refused: process %d holds %s open (a kvtier "
                    "server?) but no server answered at %s; purge through it with "
                    "--url URL, or stop it first\n",
                    (int)pids[0], t.root, t.url);
        status = 1;
        goto out;
    }
    struct kvt_purge_res r;
    if (!yes) {
        rc = kvt_purge_root(t.root, &q, true, NULL, NULL, &r);
        if (rc) {
            fprintf(stderr, "kvtier purge: %s: %s\n", t.root, kvt_strerror(rc));
            status = 1;
            goto out;
        }
        fprintf(stderr,
                "kvtier purge: would remove %llu cache file(s) and %llu tmp file(s) "
                "(%s) from %s; nothing removed: add --yes\n",
                (unsigned long long)r.matched, (unsigned long long)r.tmp_removed, what, t.root);
        status = 2;
        goto out;
    }
    rc = kvt_purge_root(t.root, &q, false, b.on ? draw : NULL, &b, &r);
    bar_end(&b);
    if (rc) {
        fprintf(stderr, "kvtier purge: %s: %s\n", t.root, kvt_strerror(rc));
        status = 1;
        goto out;
    }
    json_object_set_new(out, "via", json_string("offline"));
    json_object_set_new(out, "result", kvt_purge_res_json(&r));
out:
    if (status == 0) {
        const json_t *res = json_object_get(out, "result");
        if (as_json) {
            char *js = json_dumps(out, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(15));
            printf("%s\n", js);
            free(js);
        } else {
            char h1[32], h2[32];
            json_int_t rb = json_integer_value(json_object_get(res, "removed_bytes")) +
                            (strcmp(json_string_value(json_object_get(out, "via")), "server")
                                 ? 0
                                 : json_integer_value(json_object_get(res, "files_bytes")));
            kvt_human(h1, sizeof(h1), (double)rb);
            kvt_human(h2, sizeof(h2),
                      (double)json_integer_value(json_object_get(res, "tmp_bytes")));
            json_int_t nrem = json_integer_value(json_object_get(res, "removed")) +
                              (strcmp(json_string_value(json_object_get(out, "via")), "server")
                                   ? 0
                                   : json_integer_value(json_object_get(res, "files_removed")));
            printf("purged %s from %s (%s): %lld object file(s), %s; %lld tmp file(s), %s", what,
                   t.root, json_string_value(json_object_get(out, "via")), (long long)nrem, h1,
                   (long long)json_integer_value(json_object_get(res, "tmp_removed")), h2);
            json_int_t left = json_integer_value(json_object_get(res, "pinned")) +
                              json_integer_value(json_object_get(res, "in_flight"));
            if (left)
                printf("; %lld object(s) in use left in place (purge again later)",
                       (long long)left);
            json_int_t kept = json_integer_value(json_object_get(res, "tmp_kept"));
            if (kept)
                printf("; %lld tmp file(s) kept (live or recent writers)", (long long)kept);
            printf("\n");
        }
    }
    if (lockfd >= 0)
        close(lockfd);
    json_decref(out);
    json_decref(st);
    kvt_cli_target_free(&t);
    return status;
}
