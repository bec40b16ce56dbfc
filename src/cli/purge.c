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

/* The command line, as given. */
struct purge_args {
    const char *config, *root, *url, *name;
    const char *unknown; /* a word that begins with '-' and is no option */
    bool yes, all, tmp, as_json, offline;
    int positional, named, nunknown;
};

/* Read argv into a. Returns -1 to go on, else the exit status (0 after
 * --help). */
static int parse_args(int argc, char **argv, struct purge_args *a)
{
    bool bad = false, only_positional = false;
    for (int i = 1; i < argc && !bad; i++) {
        const char *w = argv[i], *v;
        if (only_positional) {
            a->name = w;
            a->positional++;
        } else if (!strcmp(w, "--")) {
            only_positional = true;
        } else if (!strcmp(w, "--yes") || !strcmp(w, "-y")) {
            a->yes = true;
        } else if (!strcmp(w, "--all")) {
            a->all = true;
        } else if (!strcmp(w, "--tmp")) {
            a->tmp = true;
        } else if (!strcmp(w, "--json")) {
            a->as_json = true;
        } else if (!strcmp(w, "--offline")) {
            a->offline = true;
        } else if (!strcmp(w, "--help") || !strcmp(w, "-h")) {
            usage(stdout);
            return 0;
        } else if ((v = optval(argc, argv, &i, "--namespace", &bad))) {
            a->name = v;
            a->named++;
        } else if ((v = optval(argc, argv, &i, "--config", &bad))) {
            a->config = v;
        } else if ((v = optval(argc, argv, &i, "--root", &bad))) {
            a->root = v;
        } else if ((v = optval(argc, argv, &i, "--url", &bad))) {
            a->url = v;
        } else if (bad) {
            break;
        } else if (w[0] == '-' && w[1]) {
            /* a mistyped option ("--al") or a positional namespace that
             * begins with '-' ("--models--x", as the seed writes it):
             * decided below against the namespaces the root holds */
            a->unknown = w;
            a->nunknown++;
        } else {
            a->name = w;
            a->positional++;
        }
    }
    if (bad)
        return 2;
    if (a->nunknown > 1 || (a->nunknown && (a->name || a->all || a->tmp))) {
        fprintf(stderr,
                "kvtier purge: unknown option '%s' (a namespace that begins with '-': "
                "--namespace=NAME, or -- NAME)\n",
                a->unknown);
        usage(stderr);
        return 2;
    }
    if (a->unknown) {
        a->name = a->unknown; /* only if the root holds it, checked once the root is known */
        a->positional++;
    }
    if (a->positional + a->named > 1) {
        fprintf(stderr, "kvtier purge: one namespace at a time\n");
        return 2;
    }
    if ((a->name != NULL) + a->all + a->tmp != 1) {
        fprintf(stderr, "kvtier purge: say what to purge: --namespace=NAME, NAME, --all or "
                        "--tmp (exactly one)\n");
        usage(stderr);
        return 2;
    }
    return -1;
}

/* The request: what to purge; a namespace name is checked here (never a
 * path). 0, or the exit status. */
static int make_request(const char *name, bool all, struct kvt_purge_req *q)
{
    *q = (struct kvt_purge_req){.what = name  ? KVT_PURGE_NAMESPACE
                                        : all ? KVT_PURGE_ALL
                                              : KVT_PURGE_TMP};
    if (!name)
        return 0;
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
    if (!kvt_ns_name_ok(name) || strlen(name) >= sizeof(q->ns)) {
        fprintf(stderr,
                "kvtier purge: refused: '%s' is not a namespace name (see the "
                "\"namespaces\" of kvtier status)\n",
                name);
        return 2;
    }
    snprintf(q->ns, sizeof(q->ns), "%s", name);
    return 0;
}

/* One purge run: the arguments, the target and what was learnt so far. */
struct purge_run {
    const struct purge_args *a;
    struct kvt_cli_target t;
    struct kvt_purge_req q;
    const char *what; /* for messages: the namespace, "everything" or "tmp files" */
    struct bar b;
    json_t *out;     /* the result document */
    json_t *st, *ad; /* the server's status and its adapter in the root, if any */
    bool answered;   /* a server answered at the URL */
    int lockfd;
};

/* A name must be one the root holds (a word that begins with '-' is a
 * namespace only then); one that matches nothing is said so, with the
 * names there are. 0, or the exit status. */
static int check_known(struct purge_run *r)
{
    const char *name = r->a->name;
    json_t *names = known_namespaces(r->t.root, r->ad, name);
    int status = 0;
    if (!has_name(names, name)) {
        char list[2048];
        list_names(names, list, sizeof(list));
        if (r->a->unknown) {
            fprintf(stderr,
                    "kvtier purge: unknown option '%s', and no namespace of that "
                    "name in %s (namespaces: %s); see kvtier purge --help\n",
                    name, r->t.root, list);
        } else {
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
                    name, r->t.root, list, hint);
        }
        status = r->a->unknown ? 2 : 1;
    }
    json_decref(names);
    return status;
}

/* Through the server that keeps its files in the root (r->ad). */
static int through_server(struct purge_run *r)
{
    const json_t *ad = r->ad;
    const char *name = r->a->name;
    uint64_t ns_bytes = name ? (uint64_t)json_integer_value(json_object_get(
                                   json_object_get(ad, "per_namespace_bytes"), name))
                             : (uint64_t)json_integer_value(json_object_get(ad, "used_bytes"));
    if (!r->a->yes) {
        char h[32];
        kvt_human(h, sizeof(h), (double)ns_bytes);
        if (r->q.what == KVT_PURGE_TMP)
            fprintf(stderr,
                    "kvtier purge: would remove the removable tmp files under %s "
                    "(through the server at %s); nothing removed: add --yes\n",
                    r->t.root, r->t.url);
        else
            fprintf(stderr,
                    "kvtier purge: would remove %s of %s from %s (through the server "
                    "at %s); nothing removed: add --yes\n",
                    h, r->what, r->t.root, r->t.url);
        return 2;
    }
    /* the bar's whole: the objects the server counts for what is
     * purged (tmp files are not counted: a count of files only) */
    uint64_t total = 0;
    if (r->q.what == KVT_PURGE_ALL)
        total = (uint64_t)json_integer_value(json_object_get(ad, "objects"));
    else if (r->q.what == KVT_PURGE_NAMESPACE)
        total = (uint64_t)json_integer_value(
            json_object_get(json_object_get(ad, "per_namespace_objects"), name));
    return via_server(r->t.url, r->t.root, &r->q, &r->b, total, r->out);
}

/* Offline: nobody else may be using the root. A kvtier server holds its
 * lock file (l2/kit/dirlock.h); this purge takes it for the time it
 * deletes, so no server starts under it. Other processes that hold the
 * root open are found in /proc. 0, or the exit status. */
static int claim_root(struct purge_run *r)
{
    const char *root = r->t.root, *url = r->t.url;
    if (r->a->yes) {
        int dfd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        pid_t holder = 0;
        char lerr[PATH_MAX + 256];
        r->lockfd = dfd < 0 ? -errno
                            : kvt_dirlock_take_existing(dfd, root, "cache root", &holder, lerr,
                                                        sizeof(lerr));
        if (dfd >= 0)
            close(dfd);
        if (r->lockfd == -EBUSY) {
            char who[48] = "a kvtier server";
            if (holder > 0)
                snprintf(who, sizeof(who), "kvtier server pid %d", (int)holder);
            else if (holder < 0)
                snprintf(who, sizeof(who), "kvtier servers sharing it");
            if (r->answered)
                fprintf(stderr,
                        "kvtier purge: refused: %s holds %s, and the server at %s "
                        "does not serve it: purge through the server that does with "
                        "--url URL, or stop it first\n",
                        who, root, url);
            else
                fprintf(stderr,
                        "kvtier purge: refused: %s holds %s but no server answered "
                        "at %s: purge through it with --url URL, or stop it first\n",
                        who, root, url);
            return 1;
        }
    }
    pid_t pids[8];
    int users = kvt_root_users(root, pids, 8);
    if (users > 0 && r->a->yes) {
        if (r->answered)
            fprintf(stderr,
                    "kvtier purge: refused: process %d holds %s open (a kvtier "
                    "server?), and the server at %s does not serve it: purge through "
                    "the server that does with --url URL, or stop it first\n",
                    (int)pids[0], root, url);
        else
            fprintf(stderr,
                    "kvtier purge: refused: process %d holds %s open (a kvtier "
                    "server?) but no server answered at %s; purge through it with "
                    "--url URL, or stop it first\n",
                    (int)pids[0], root, url);
        return 1;
    }
    return 0;
}

/* Offline, once the root is ours: without --yes, what would go. */
static int offline(struct purge_run *r)
{
    int status = claim_root(r);
    if (status)
        return status;
    struct kvt_purge_res res;
    if (!r->a->yes) {
        int rc = kvt_purge_root(r->t.root, &r->q, true, NULL, NULL, &res);
        if (rc) {
            fprintf(stderr, "kvtier purge: %s: %s\n", r->t.root, kvt_strerror(rc));
            return 1;
        }
        fprintf(stderr,
                "kvtier purge: would remove %llu cache file(s) and %llu tmp file(s) "
                "(%s) from %s; nothing removed: add --yes\n",
                (unsigned long long)res.matched, (unsigned long long)res.tmp_removed, r->what,
                r->t.root);
        return 2;
    }
    int rc = kvt_purge_root(r->t.root, &r->q, false, r->b.on ? draw : NULL, &r->b, &res);
    bar_end(&r->b);
    if (rc) {
        fprintf(stderr, "kvtier purge: %s: %s\n", r->t.root, kvt_strerror(rc));
        return 1;
    }
    json_object_set_new(r->out, "via", json_string("offline"));
    json_object_set_new(r->out, "result", kvt_purge_res_json(&res));
    return 0;
}

/* The result: JSON, or one line. */
static void print_result(const struct purge_run *r)
{
    const json_t *out = r->out, *res = json_object_get(out, "result");
    if (r->a->as_json) {
        char *js = json_dumps(out, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(15));
        printf("%s\n", js);
        free(js);
        return;
    }
    char h1[32], h2[32];
    bool via_server = !strcmp(json_string_value(json_object_get(out, "via")), "server");
    json_int_t rb = json_integer_value(json_object_get(res, "removed_bytes")) +
                    (via_server ? json_integer_value(json_object_get(res, "files_bytes")) : 0);
    kvt_human(h1, sizeof(h1), (double)rb);
    kvt_human(h2, sizeof(h2), (double)json_integer_value(json_object_get(res, "tmp_bytes")));
    json_int_t nrem = json_integer_value(json_object_get(res, "removed")) +
                      (via_server ? json_integer_value(json_object_get(res, "files_removed")) : 0);
    printf("purged %s from %s (%s): %lld object file(s), %s; %lld tmp file(s), %s", r->what,
           r->t.root, json_string_value(json_object_get(out, "via")), (long long)nrem, h1,
           (long long)json_integer_value(json_object_get(res, "tmp_removed")), h2);
    json_int_t left = json_integer_value(json_object_get(res, "pinned")) +
                      json_integer_value(json_object_get(res, "in_flight"));
    if (left)
        printf("; %lld object(s) in use left in place (purge again later)", (long long)left);
    json_int_t kept = json_integer_value(json_object_get(res, "tmp_kept"));
    if (kept)
        printf("; %lld tmp file(s) kept (live or recent writers)", (long long)kept);
    printf("\n");
}

/* Ask for a server that keeps its files in the root (unless --offline),
 * then purge through it or offline. */
static int run(struct purge_run *r)
{
    const struct purge_args *a = r->a;
    char err[512];
    if (!a->offline) {
        int timeout = a->url ? 5000 : 1500;
        if (kvt_ops_call(r->t.url, "status", NULL, timeout, &r->st, err, sizeof(err)) == 0) {
            r->answered = true;
            r->ad = kvt_cli_pick_adapter(r->st, r->t.root);
        } else if (a->url) {
            fprintf(stderr, "kvtier purge: cannot reach a server at %s: %s\n", r->t.url, err);
            return 1;
        }
    }
    if (r->answered && !r->ad && a->url) {
        fprintf(stderr,
                "kvtier purge: the server at %s keeps no adapter in %s: nothing "
                "removed (purge through the server that does, or --offline once no "
                "server uses %s)\n",
                r->t.url, r->t.root, r->t.root);
        return 2;
    }
    int status = a->name ? check_known(r) : 0;
    if (status)
        return status;
    return r->ad ? through_server(r) : offline(r);
}

int kvt_cmd_purge(int argc, char **argv)
{
    struct purge_args a = {0};
    int status = parse_args(argc, argv, &a);
    if (status >= 0)
        return status;
    struct purge_run r = {.a = &a, .lockfd = -1};
    status = make_request(a.name, a.all, &r.q);
    if (status)
        return status;
    status = kvt_cli_target("purge", a.config, a.root, a.url, true, &r.t);
    if (status)
        return status;
    r.what = a.name ? a.name : a.all ? "everything" : "tmp files";
    r.b = (struct bar){.on = !a.as_json && isatty(STDERR_FILENO), .what = r.what};
    r.out = json_object();
    json_object_set_new(r.out, "root", json_string(r.t.root));
    json_object_set_new(r.out, "what",
                        json_string(r.q.what == KVT_PURGE_NAMESPACE ? "namespace"
                                    : r.q.what == KVT_PURGE_ALL     ? "all"
                                                                    : "tmp"));
    if (a.name)
        json_object_set_new(r.out, "namespace", json_string(a.name));
    status = run(&r);
    if (status == 0)
        print_result(&r);
    if (r.lockfd >= 0)
        close(r.lockfd);
    json_decref(r.out);
    json_decref(r.st);
    kvt_cli_target_free(&r.t);
    return status;
}
