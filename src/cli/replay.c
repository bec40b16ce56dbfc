/*
 * kvtier replay: drive a running server with a Mooncake-format trace.
 *
 * Each line is one request: {"timestamp": ms, "input_length": tokens,
 * "output_length": n, "hash_ids": [block ids, 512 tokens each]}. Block ids are
 * prefix-aware (the same id means the same prefix), so a block's key hash is
 * its id. For every request, in trace order:
 *   lookup(blocks) -> h leading hits; retrieve(blocks[:h]) (bytes verified:
 *   each block's payload is derived from its id); store(blocks[h:]).
 * The blocks it stores go into the server's cache under the model --model
 * ("replay"): every tier, persistent ones included (the shared Mooncake
 * trace is some 720 MB at the default 16 KiB per block). At the end it deletes every
 * block of the trace under that model from the server, unless --keep.
 * Prints the prefix hit ratio, bytes moved, wrong bytes (must be 0), latency
 * percentiles, and for the same budget the hit ratios of every policy that
 * keeps an order (policy.h's table: LRU, ARC, LFU, value, adaptive; through
 * the policy vtable the server runs, fed as the live L1 feeds it) and of
 * Belady's optimum (MIN: evict the block used farthest in the future),
 * computed offline.
 */
#include "cli/cli.h"
#include "common/util.h"
#include "policy/policy.h"
#include "kvtier/client.h"
#include "kvtier/error.h"

#include "proto/wire.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct trace {
    uint32_t nreq;
    uint32_t *start; /* nreq + 1 offsets into ids */
    double *ts;      /* nreq request times, seconds (the trace's ms / 1000) */
    uint64_t *ids;
    uint64_t nacc;
};

static void trace_free(struct trace *t)
{
    free(t->start);
    free(t->ts);
    free(t->ids);
}

/* Reads the trace (its first `limit` requests, 0: all): 0; -errno when
 * it cannot be opened; on a bad line says which, frees what it read and
 * returns KVT_E_BADREQ. */
static int load_trace(const char *path, struct trace *t, uint32_t limit)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        int e = errno;
        fprintf(stderr, "kvtier replay: cannot open %s\n", path);
        return -e;
    }
    size_t cap_r = 1024, cap_a = 1 << 16;
    t->start = malloc(cap_r * sizeof(uint32_t));
    t->ts = malloc(cap_r * sizeof(double));
    t->ids = malloc(cap_a * sizeof(uint64_t));
    t->nreq = 0;
    t->nacc = 0;
    char *line = NULL;
    size_t lcap = 0;
    ssize_t n;
    uint64_t lineno = 0;
    while ((n = getline(&line, &lcap, f)) > 0 && (!limit || t->nreq < limit)) {
        lineno++;
        if (n <= 1)
            continue;
        json_error_t je;
        json_t *j = json_loads(line, 0, &je);
        json_t *h = j ? json_object_get(j, "hash_ids") : NULL;
        if (!json_is_array(h)) {
            fprintf(stderr, "kvtier replay: %s:%llu: not a trace line (%s)\n", path,
                    (unsigned long long)lineno, j ? "no hash_ids array" : je.text);
            json_decref(j);
            free(line);
            fclose(f);
            trace_free(t);
            return KVT_E_BADREQ;
        }
        if (t->nreq + 2 > cap_r) {
            cap_r *= 2;
            t->start = realloc(t->start, cap_r * sizeof(uint32_t));
            t->ts = realloc(t->ts, cap_r * sizeof(double));
        }
        t->start[t->nreq] = (uint32_t)t->nacc;
        json_t *tsv = json_object_get(j, "timestamp");
        t->ts[t->nreq] = json_is_number(tsv) ? json_number_value(tsv) / 1000.0 : 0;
        size_t i;
        json_t *v;
        json_array_foreach(h, i, v)
        {
            if (!json_is_integer(v) || json_integer_value(v) < 0) {
                fprintf(stderr,
                        "kvtier replay: %s:%llu: hash_ids[%zu] is not a block id (a "
                        "whole number >= 0)\n",
                        path, (unsigned long long)lineno, i);
                json_decref(j);
                free(line);
                fclose(f);
                trace_free(t);
                return KVT_E_BADREQ;
            }
            if (t->nacc == cap_a) {
                cap_a *= 2;
                t->ids = realloc(t->ids, cap_a * sizeof(uint64_t));
            }
            t->ids[t->nacc++] = (uint64_t)json_integer_value(v);
        }
        t->nreq++;
        json_decref(j);
    }
    t->start[t->nreq] = (uint32_t)t->nacc;
    free(line);
    fclose(f);
    return 0;
}

/* ---- offline simulation (prefix hits, all blocks of a request cached after) */

struct hmap { /* block id -> slot, open addressing */
    uint64_t *keys;
    uint32_t *vals;
    size_t cap;
};

static size_t hslot(const struct hmap *m, uint64_t k)
{
    uint64_t x = k * 0x9e3779b97f4a7c15ull;
    size_t i = (size_t)(x >> 20) & (m->cap - 1);
    while (m->keys[i] != UINT64_MAX && m->keys[i] != k)
        i = (i + 1) & (m->cap - 1);
    return i;
}

static void hinit(struct hmap *m, size_t n)
{
    m->cap = 1;
    while (m->cap < n * 2)
        m->cap <<= 1;
    m->keys = malloc(m->cap * sizeof(uint64_t));
    m->vals = malloc(m->cap * sizeof(uint32_t));
    memset(m->keys, 0xff, m->cap * sizeof(uint64_t));
}

/* Dense ids 0..u-1 for the block ids. */
static uint32_t *densify(const struct trace *t, uint32_t *nuniq)
{
    struct hmap m;
    hinit(&m, t->nacc + 1);
    uint32_t *d = malloc((t->nacc + 1) * sizeof(uint32_t));
    uint32_t u = 0;
    for (uint64_t i = 0; i < t->nacc; i++) {
        size_t s = hslot(&m, t->ids[i]);
        if (m.keys[s] == UINT64_MAX) {
            m.keys[s] = t->ids[i];
            m.vals[s] = u++;
        }
        d[i] = m.vals[s];
    }
    free(m.keys);
    free(m.vals);
    *nuniq = u;
    return d;
}

struct simres {
    uint64_t prefix_hits, block_hits;
};

/* Hits of request blocks d[a..b) against the cached set: every cached block,
 * and the cached blocks before the first miss (what a prefix lookup serves). */
static void count_hits(const uint32_t *d, uint32_t a, uint32_t b, const uint8_t *in,
                       struct simres *r)
{
    bool prefix = true;
    for (uint32_t i = a; i < b; i++) {
        bool hit = in[d[i]];
        r->block_hits += hit;
        if (prefix && hit)
            r->prefix_hits++;
        else
            prefix = false;
    }
}

/* Belady's MIN with a max-heap of (next use, block), lazy deletion. */
struct hent {
    uint64_t nu;
    uint32_t x;
};

static void heap_push(struct hent *h, size_t *n, struct hent e)
{
    size_t i = (*n)++;
    h[i] = e;
    while (i && h[(i - 1) / 2].nu < h[i].nu) {
        struct hent tmp = h[i];
        h[i] = h[(i - 1) / 2];
        h[(i - 1) / 2] = tmp;
        i = (i - 1) / 2;
    }
}

static struct hent heap_pop(struct hent *h, size_t *n)
{
    struct hent top = h[0];
    h[0] = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < *n && h[l].nu > h[m].nu)
            m = l;
        if (r < *n && h[r].nu > h[m].nu)
            m = r;
        if (m == i)
            break;
        struct hent tmp = h[i];
        h[i] = h[m];
        h[m] = tmp;
        i = m;
    }
    return top;
}

static struct simres sim_belady(const struct trace *t, const uint32_t *d, uint32_t u, uint64_t cap)
{
    uint64_t N = t->nacc, NEVER = UINT64_MAX;
    uint64_t *nextuse = malloc(N * sizeof(uint64_t));
    uint64_t *last = malloc(u * sizeof(uint64_t));
    for (uint32_t x = 0; x < u; x++)
        last[x] = NEVER;
    for (uint64_t i = N; i-- > 0;) {
        nextuse[i] = last[d[i]];
        last[d[i]] = i;
    }
    uint64_t *cur = malloc(u * sizeof(uint64_t)); /* current next use of cached x */
    uint8_t *in = calloc(u, 1);
    struct hent *h = malloc((N + u + 1) * sizeof(struct hent));
    size_t hn = 0;
    uint64_t size = 0;
    struct simres r = {0};
    for (uint32_t q = 0; q < t->nreq; q++) {
        uint32_t a = t->start[q], b = t->start[q + 1];
        count_hits(d, a, b, in, &r);
        for (uint32_t i = a; i < b; i++) {
            uint32_t x = d[i];
            if (!in[x]) {
                in[x] = 1;
                size++;
            }
            cur[x] = nextuse[i];
            heap_push(h, &hn, (struct hent){nextuse[i], x});
        }
        while (size > cap && hn) {
            struct hent e = heap_pop(h, &hn);
            if (!in[e.x] || cur[e.x] != e.nu)
                continue; /* stale */
            in[e.x] = 0;
            size--;
        }
    }
    free(nextuse);
    free(last);
    free(cur);
    free(in);
    free(h);
    return r;
}

/* Any eviction policy through its vtable (the code the server runs), fed
 * exactly as the live L1 feeds it, so that live and offline agree: dense
 * ids are the handles. For each request: the lookup names all its blocks
 * to the policy (kvt_policy_request, as kvt_l1_note_request), its prefix hits are
 * touched tail first (kvt_l1_touch); the store of the rest goes in order,
 * a block already cached is a use (reserve's -EEXIST) and a new one takes
 * a slot, evicting the policy's first victim when the budget is full (new
 * blocks are not in the policy until the commit, so never victims); the
 * commit then inserts the new blocks tail first, hint = position among
 * them and their count, as kvt_l1_commit does. The policy's clock is the
 * trace's time. */
struct sim_clock {
    double now;
};

static double sim_now(void *arg)
{
    return ((struct sim_clock *)arg)->now;
}

static bool first_victim(uint32_t h, void *arg)
{
    *(uint32_t *)arg = h;
    return false;
}

enum { OUT = 0, CACHED = 1, PENDING = 2 };

static struct simres sim_policy(const struct trace *t, const uint32_t *d, uint32_t u, uint64_t cap,
                                struct kvt_policy *p, uint32_t block)
{
    struct sim_clock clk = {.now = t->nreq ? t->ts[0] : 0};
    kvt_value_set_clock(p, sim_now, &clk);
    kvt_policy_reserve(p, u);
    uint8_t *in = calloc(u, 1);
    uint64_t size = 0, *fps = NULL;
    uint32_t fpcap = 0;
    struct simres r = {0};
    for (uint32_t q = 0; q < t->nreq; q++) {
        uint32_t a = t->start[q], b = t->start[q + 1];
        clk.now = t->ts[q];
        count_hits(d, a, b, in, &r);
        if (b - a > fpcap) { /* the lookup (kvt_l1_note_request) */
            fpcap = b - a;
            fps = realloc(fps, fpcap * sizeof(uint64_t));
        }
        for (uint32_t i = a; i < b; i++)
            fps[i - a] = (uint64_t)d[i] + 1;
        kvt_policy_request(p, fps, b - a);
        uint32_t h = a;
        while (h < b && in[d[h]] == CACHED)
            h++;
        for (uint32_t i = h; i-- > a;)
            p->ops->access(p, d[i]);
        uint32_t nnew = 0;
        for (uint32_t i = h; i < b; i++) {
            uint32_t x = d[i];
            if (in[x] == CACHED) {
                p->ops->access(p, x);
                continue;
            }
            if (in[x] == PENDING)
                continue;
            while (size >= cap) {
                uint32_t v = UINT32_MAX;
                p->ops->walk(p, first_victim, &v);
                if (v == UINT32_MAX)
                    break;
                p->ops->remove(p, v);
                in[v] = OUT;
                size--;
            }
            in[x] = PENDING;
            size++;
            nnew++;
        }
        for (uint32_t i = b, k = nnew; i-- > h;) {
            uint32_t x = d[i];
            if (in[x] != PENDING)
                continue;
            struct kvt_policy_hint hint = {
                .prefix_pos = --k, .prefix_len = nnew, .bytes = block, .fp = (uint64_t)x + 1};
            p->ops->insert(p, x, false, &hint);
            in[x] = CACHED;
        }
    }
    free(fps);
    free(in);
    return r;
}

static struct simres sim_named(const struct trace *t, const uint32_t *d, uint32_t u, uint64_t cap,
                               const char *name, uint32_t block, double half_life)
{
    struct kvt_policy *p;
    if (strcmp(name, "value") == 0 && half_life > 0) {
        struct kvt_value_params prm;
        kvt_value_defaults(&prm);
        prm.half_life_s = half_life;
        p = kvt_value_create(&prm);
    } else {
        p = kvt_policy_create(name, 1, 0);
    }
    struct simres r = sim_policy(t, d, u, cap, p, block);
    kvt_policy_destroy(p);
    return r;
}

/* ---- live replay ---- */

static void fill_block(uint8_t *p, size_t n, uint64_t id)
{
    uint64_t x = id * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < n; i += 8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        memcpy(p + i, &x, KVT_MIN(8, n - i));
    }
}

static int cmpd(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double pct(double *v, size_t n, double p)
{
    if (!n)
        return 0;
    size_t i = (size_t)(p * (double)(n - 1) + 0.5);
    return v[i];
}

/* What the server's L1 holds of these blocks, beside the offline model's
 * budget: the live and offline figures are comparable only when the L1
 * holds exactly the budget, evicts on demand (trigger watermark 1.0) and
 * has no L2 behind it. Says on stderr what differs; the server's figure
 * goes into `live` (0 when status is refused). */
static uint64_t check_server(kvt_client *c, size_t block, uint64_t budget)
{
    char *js = NULL;
    if (kvt_status_json(c, &js))
        return 0;
    json_t *st = json_loads(js, 0, NULL);
    free(js);
    json_t *l1 = st ? json_object_get(st, "l1") : NULL;
    json_int_t cap = json_integer_value(json_object_get(l1, "capacity_bytes"));
    json_int_t align = json_integer_value(json_object_get(l1, "align_bytes"));
    double wm = json_number_value(json_object_get(l1, "trigger_watermark"));
    size_t nl2 = json_array_size(json_object_get(st, "l2"));
    uint64_t per = align > 0 ? KVT_ALIGN_UP((uint64_t)block, (uint64_t)align) : block;
    uint64_t blocks = cap > 0 ? (uint64_t)cap / per : 0;
    if (blocks && blocks != budget)
        fprintf(stderr,
                "kvtier replay: warning: the server's L1 holds %llu blocks of %zu bytes (%llu "
                "bytes each in it, capacity %lld), the offline model %llu (--budget-blocks): "
                "live and offline are not the same cache\n",
                (unsigned long long)blocks, block, (unsigned long long)per, (long long)cap,
                (unsigned long long)budget);
    if (l1 && wm < 1.0)
        fprintf(stderr,
                "kvtier replay: warning: the server evicts from %.0f%% full "
                "(--eviction-trigger-watermark 1.0 evicts only on demand, as the offline model)\n",
                100 * wm);
    if (nl2)
        fprintf(stderr,
                "kvtier replay: warning: the server has %zu L2 adapter(s): live hits include "
                "L2's, the offline model is the L1 alone (--no-l2 compares them)\n",
                nl2);
    json_decref(st);
    return blocks;
}

static int cmpu64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Delete every block of the trace (its keys under `model`) from the server,
 * in batches, after the replay: what it stored, from every tier. Returns a
 * JSON summary {deleted_keys, l2_removed, errors}; *err gets the first
 * failure's message. */
static json_t *delete_blocks(kvt_client *c, const struct trace *t, const char *model, char *err,
                             size_t errcap)
{
    enum { BATCH = 4096 };
    uint64_t *ids = kvt_xmalloc((t->nacc ? t->nacc : 1) * sizeof(uint64_t));
    memcpy(ids, t->ids, t->nacc * sizeof(uint64_t));
    qsort(ids, t->nacc, sizeof(uint64_t), cmpu64);
    uint8_t *hashes = kvt_xcalloc(BATCH, 32);
    uint64_t keys = 0, l2_removed = 0, errors = 0;
    size_t n = 0;
    err[0] = 0;
    for (uint64_t i = 0; i <= t->nacc; i++) {
        if (i < t->nacc && (i == 0 || ids[i] != ids[i - 1])) {
            memset(hashes + 32 * n, 0, 32);
            memcpy(hashes + 32 * n, &ids[i], 8);
            n++;
        }
        if (n == BATCH || (i == t->nacc && n)) {
            kvt_keys k = {.model = model, .hashes = hashes, .hash_len = 32, .n = n};
            size_t removed = 0;
            int rc = kvt_delete(c, &k, &removed);
            if (rc) {
                errors++;
                if (!err[0])
                    snprintf(err, errcap, "%s", kvt_client_last_error(c));
            } else {
                keys += n;
                l2_removed += removed;
            }
            n = 0;
        }
    }
    free(ids);
    free(hashes);
    json_t *o = json_object();
    json_object_set_new(o, "deleted_keys", json_integer((json_int_t)keys));
    json_object_set_new(o, "l2_removed", json_integer((json_int_t)l2_removed));
    json_object_set_new(o, "errors", json_integer((json_int_t)errors));
    return o;
}

/* A whole non-negative integer in [lo, hi] (decimal or 0x...): 0, or 2
 * (the exit status) after saying why. */
static int opt_u64(const char *name, const char *v, uint64_t lo, uint64_t hi, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 0);
    if (!*v || *end || errno || v[strspn(v, " \t")] == '-' || x < lo || x > hi) {
        fprintf(stderr, "kvtier replay: %s: '%s' is not a whole number in %llu..%llu\n", name, v,
                (unsigned long long)lo, (unsigned long long)hi);
        return 2;
    }
    *out = x;
    return 0;
}

struct replay_args {
    const char *url, *path, *model;
    size_t block;    /* bytes of one block (one object) */
    uint64_t budget; /* blocks; 0: a quarter of the unique ones */
    uint32_t limit;  /* requests; 0: all */
    bool offline, as_json, keep;
    double half_life; /* the value policy's; 0: its own aging, no clock */
};

static void usage(void)
{
    printf("usage: kvtier replay --trace FILE [--url URL] [--block-bytes 16384]\n"
           "                     [--budget-blocks N (default 25%% of unique blocks)]\n"
           "                     [--limit REQUESTS] [--model NAME] [--offline] [--json]\n"
           "                     [--keep]\n"
           "                     [--value-half-life SECONDS (offline value policy with a\n"
           "                      fixed half-life; default: its own aging)]\n"
           "\n"
           "Against a server (without --offline) every block the server misses is\n"
           "stored in its cache under the model NAME (default \"replay\"), in every\n"
           "tier, persistent L2 adapters included: up to unique blocks x --block-bytes\n"
           "bytes (the shared mooncake_synthetic_trace: 43,924 blocks, some\n"
           "720 MB). At the end the replay deletes every block of the trace under\n"
           "that model from the server; --keep leaves them (a second replay then\n"
           "starts warm; kvtier purge --namespace=NAME removes them later).\n");
}

/* Read argv into a. Returns -1 to go on, else the exit status. */
static int parse_args(int argc, char **argv, struct replay_args *a)
{
    static const struct option opts[] = {{"url", required_argument, NULL, 'u'},
                                         {"trace", required_argument, NULL, 't'},
                                         {"block-bytes", required_argument, NULL, 'b'},
                                         {"budget-blocks", required_argument, NULL, 'k'},
                                         {"limit", required_argument, NULL, 'l'},
                                         {"model", required_argument, NULL, 'm'},
                                         {"offline", no_argument, NULL, 'o'},
                                         {"json", no_argument, NULL, 'j'},
                                         {"value-half-life", required_argument, NULL, 'v'},
                                         {"keep", no_argument, NULL, 'K'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    *a = (struct replay_args){.url = "tcp://127.0.0.1:5555", .model = "replay", .block = 16384};
    uint64_t num;
    int ch;
    optind = 1;
    opterr = 0;
    while ((ch = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (ch) {
        case 'u':
            a->url = optarg;
            break;
        case 't':
            a->path = optarg;
            break;
        case 'b': /* one block is one object of the server's (max_object_bytes: 1 GiB) */
            if (opt_u64("--block-bytes", optarg, 1, 1ull << 30, &num))
                return 2;
            a->block = (size_t)num;
            break;
        case 'k':
            if (opt_u64("--budget-blocks", optarg, 1, UINT32_MAX, &a->budget))
                return 2;
            break;
        case 'l':
            if (opt_u64("--limit", optarg, 1, UINT32_MAX, &num))
                return 2;
            a->limit = (uint32_t)num;
            break;
        case 'm':
            a->model = optarg;
            break;
        case 'o':
            a->offline = true;
            break;
        case 'j':
            a->as_json = true;
            break;
        case 'K':
            a->keep = true;
            break;
        case 'v': {
            char *end;
            a->half_life = strtod(optarg, &end);
            if (!*optarg || *end || !(a->half_life > 0) || a->half_life > 1e12) {
                fprintf(stderr,
                        "kvtier replay: --value-half-life: '%s' is not a number of "
                        "seconds above 0\n",
                        optarg);
                return 2;
            }
            break;
        }
        case 'h':
            usage();
            return 0;
        default:
            fprintf(stderr, "kvtier replay: unknown option '%s'\n", argv[optind - 1]);
            return 2;
        }
    }
    if (!a->path) {
        fprintf(stderr, "kvtier replay: --trace FILE is required\n");
        return 2;
    }
    if (optind < argc) {
        fprintf(stderr, "kvtier replay: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    return -1;
}

/* The offline replay: every policy of the table that keeps an order,
 * through its vtable (the code the server runs), and MIN. */
struct sims {
    const char *pols[64]; /* the table holds far fewer */
    struct simres res[64];
    int npol, lru, value;
    struct simres bel;
};

static json_t *simulate(const struct trace *t, const uint32_t *d, uint32_t u,
                        const struct replay_args *a, struct sims *sm)
{
    const struct kvt_policy_desc *pd;
    sm->npol = sm->lru = sm->value = 0;
    for (size_t i = 0; (pd = kvt_policy_at(i)) && sm->npol < 64; i++) {
        if (pd->flags & KVT_POLICY_NO_ORDER)
            continue;
        sm->lru = strcmp(pd->name, "LRU") == 0 ? sm->npol : sm->lru;
        sm->value = strcmp(pd->name, "value") == 0 ? sm->npol : sm->value;
        sm->pols[sm->npol++] = pd->name;
    }
    for (int i = 0; i < sm->npol; i++)
        sm->res[i] = sim_named(t, d, u, a->budget, sm->pols[i], (uint32_t)a->block, a->half_life);
    sm->bel = sim_belady(t, d, u, a->budget);
    double nacc = (double)t->nacc;
    json_t *off = json_object(), *by = json_object();
    for (int i = 0; i <= sm->npol; i++) {
        const struct simres *x = i < sm->npol ? &sm->res[i] : &sm->bel;
        const char *name = i < sm->npol ? sm->pols[i] : "Belady";
        json_t *o = json_object();
        json_object_set_new(o, "prefix_hit_ratio", json_real((double)x->prefix_hits / nacc));
        json_object_set_new(o, "block_hit_ratio", json_real((double)x->block_hits / nacc));
        json_object_set_new(by, name, o);
    }
    json_object_set_new(off, "policies", by);
    /* the flat names of earlier versions (bench/ops.sh, tests) */
    const struct simres *lru = &sm->res[sm->lru], *val = &sm->res[sm->value];
    json_object_set_new(off, "lru_prefix_hit_ratio", json_real((double)lru->prefix_hits / nacc));
    json_object_set_new(off, "lru_block_hit_ratio", json_real((double)lru->block_hits / nacc));
    json_object_set_new(off, "belady_prefix_hit_ratio",
                        json_real((double)sm->bel.prefix_hits / nacc));
    json_object_set_new(off, "belady_block_hit_ratio",
                        json_real((double)sm->bel.block_hits / nacc));
    json_object_set_new(off, "value_prefix_hit_ratio", json_real((double)val->prefix_hits / nacc));
    json_object_set_new(off, "value_block_hit_ratio", json_real((double)val->block_hits / nacc));
    if (a->half_life > 0)
        json_object_set_new(off, "value_half_life_seconds", json_real(a->half_life));
    return off;
}

/* What the live replay counted. */
struct live {
    uint64_t hits, bytes_in, bytes_out, wrong, stored, errors;
    double *lat_lookup, *lat_get; /* us, per request; retrieves only for requests with hits */
    size_t nget;
    double secs;
};

/* One request of the trace against the server: lookup, retrieve the hits
 * (checked byte for byte), store the rest, into b (buffers sized for the
 * longest request) and L. */
struct scratch {
    uint8_t *hashes, *pay, *want;
    const void **bufs;
    size_t *lens;
};

static void replay_one(kvt_client *c, const struct trace *t, const struct replay_args *a,
                       uint32_t q, struct scratch *b, struct live *L)
{
    size_t block = a->block;
    uint32_t first = t->start[q], n = t->start[q + 1] - first; /* whole, as offline */
    memset(b->hashes, 0, (size_t)n * 32);
    for (uint32_t i = 0; i < n; i++)
        memcpy(b->hashes + 32 * i, &t->ids[first + i], 8);
    kvt_keys k = {.model = a->model, .hashes = b->hashes, .hash_len = 32, .n = n};
    uint64_t t0 = kvt_now_ns();
    size_t h = 0;
    if (kvt_lookup(c, &k, &h)) {
        L->errors++;
        h = 0;
    }
    L->lat_lookup[q] = (double)(kvt_now_ns() - t0) / 1e3;
    t0 = kvt_now_ns();
    kvt_blob *blobs = NULL;
    size_t got = 0;
    kvt_keys kh = k;
    kh.n = h;
    if (h && kvt_retrieve(c, &kh, &blobs, &got) == 0) {
        for (size_t i = 0; i < got; i++) {
            fill_block(b->want, block, t->ids[first + i]);
            if (blobs[i].len != block || memcmp(blobs[i].data, b->want, block))
                L->wrong++;
            L->bytes_out += blobs[i].len;
        }
        kvt_blobs_free(blobs, got);
    } else if (h) {
        L->errors++;
    }
    if (h)
        L->lat_get[L->nget++] = (double)(kvt_now_ns() - t0) / 1e3;
    L->hits += got;
    if (got < n) {
        for (uint32_t i = (uint32_t)got; i < n; i++) {
            fill_block(b->pay + (size_t)(i - got) * block, block, t->ids[first + i]);
            b->bufs[i - got] = b->pay + (size_t)(i - got) * block;
            b->lens[i - got] = block;
        }
        kvt_keys ks = k;
        ks.hashes = b->hashes + 32 * got;
        ks.n = n - got;
        size_t acc = 0;
        if (kvt_store(c, &ks, b->bufs, b->lens, NULL, &acc))
            L->errors++;
        L->stored += acc;
        L->bytes_in += (uint64_t)(n - got) * block;
    }
}

/* The live replay against the server at a->url: out gets "live". Returns
 * the exit status. */
static int replay_live(const struct trace *t, const struct replay_args *a, uint32_t longest,
                       json_t *out)
{
    kvt_client *c;
    int rc = kvt_client_open(a->url, NULL, &c);
    if (rc) {
        const char *why = kvt_client_open_error();
        fprintf(stderr, "kvtier replay: cannot reach %s: %s\n", a->url,
                why[0] ? why : kvt_strerror(rc));
        return 1;
    }
    uint64_t server_blocks = check_server(c, a->block, a->budget);
    size_t lmax = KVT_MAX(longest, 1u);
    struct scratch b = {
        .hashes = kvt_xmalloc(lmax * 32),
        .pay = kvt_xmalloc(a->block * lmax),
        .want = malloc(a->block),
        .bufs = kvt_xmalloc(lmax * sizeof(void *)),
        .lens = kvt_xmalloc(lmax * sizeof(size_t)),
    };
    struct live L = {.lat_lookup = malloc(t->nreq * sizeof(double)),
                     .lat_get = malloc(t->nreq * sizeof(double))};
    uint64_t t_start = kvt_now_ns();
    for (uint32_t q = 0; q < t->nreq; q++) {
        replay_one(c, t, a, q, &b, &L);
        if (!a->as_json && (q + 1) % 500 == 0)
            fprintf(stderr, "  %u/%u requests, hit ratio %.3f\n", q + 1, t->nreq,
                    (double)L.hits / (double)(t->start[q + 1]));
    }
    kvt_flush(c);
    L.secs = (double)(kvt_now_ns() - t_start) / 1e9;
    qsort(L.lat_lookup, t->nreq, sizeof(double), cmpd);
    qsort(L.lat_get, L.nget, sizeof(double), cmpd);
    json_t *live = json_object();
    json_object_set_new(live, "prefix_hit_ratio", json_real((double)L.hits / (double)t->nacc));
    json_object_set_new(live, "blocks_hit", json_integer((json_int_t)L.hits));
    json_object_set_new(live, "bytes_retrieved", json_integer((json_int_t)L.bytes_out));
    json_object_set_new(live, "bytes_stored", json_integer((json_int_t)L.bytes_in));
    json_object_set_new(live, "blocks_stored", json_integer((json_int_t)L.stored));
    json_object_set_new(live, "wrong_blocks", json_integer((json_int_t)L.wrong));
    json_object_set_new(live, "server_l1_blocks", json_integer((json_int_t)server_blocks));
    json_object_set_new(live, "errors", json_integer((json_int_t)L.errors));
    json_object_set_new(live, "seconds", json_real(L.secs));
    json_object_set_new(live, "lookup_us_p50", json_real(pct(L.lat_lookup, t->nreq, 0.5)));
    json_object_set_new(live, "lookup_us_p99", json_real(pct(L.lat_lookup, t->nreq, 0.99)));
    json_object_set_new(live, "retrieve_us_p50", json_real(pct(L.lat_get, L.nget, 0.5)));
    json_object_set_new(live, "retrieve_us_p99", json_real(pct(L.lat_get, L.nget, 0.99)));
    json_object_set_new(out, "live", live);
    if (a->keep) {
        json_object_set_new(live, "cleanup", json_string("kept (--keep)"));
    } else {
        char derr[512];
        json_t *cl = delete_blocks(c, t, a->model, derr, sizeof(derr));
        if (json_integer_value(json_object_get(cl, "errors"))) {
            fprintf(stderr,
                    "kvtier replay: warning: could not delete the trace's blocks from the "
                    "server (%s): its cache keeps them under the model '%s' (kvtier purge "
                    "--namespace=%s)\n",
                    derr, a->model, a->model);
        }
        json_object_set_new(live, "cleanup", cl);
    }
    kvt_client_close(c);
    free(b.hashes);
    free(b.pay);
    free(b.bufs);
    free(b.lens);
    free(b.want);
    free(L.lat_lookup);
    free(L.lat_get);
    return L.wrong || L.errors ? 1 : 0;
}

/* The text report (without --json). */
static void print_text(const struct trace *t, uint32_t u, const struct replay_args *a,
                       const struct sims *sm, const json_t *out)
{
    printf("trace %s: %u requests, %llu block accesses, %u unique blocks; budget %llu blocks "
           "(%.1f%% of unique) of %zu bytes\n",
           a->path, t->nreq, (unsigned long long)t->nacc, u, (unsigned long long)a->budget,
           100.0 * (double)a->budget / u, a->block);
    printf("  offline prefix hit ratio:");
    for (int i = 0; i < sm->npol; i++)
        printf("  %s %.4f", sm->pols[i], (double)sm->res[i].prefix_hits / (double)t->nacc);
    printf("  Belady %.4f", (double)sm->bel.prefix_hits / (double)t->nacc);
    if (a->half_life > 0)
        printf("  (value: half-life %g s)", a->half_life);
    printf("\n");
    json_t *live = json_object_get(out, "live");
    if (live)
        printf("  kvtier (live)   prefix hit ratio %.4f; %.1f MB retrieved, %.1f MB stored; "
               "wrong blocks %lld, errors %lld; lookup p50 %.0f us p99 %.0f us, retrieve p50 "
               "%.0f us p99 %.0f us; %.1f s\n",
               json_real_value(json_object_get(live, "prefix_hit_ratio")),
               (double)json_integer_value(json_object_get(live, "bytes_retrieved")) / 1e6,
               (double)json_integer_value(json_object_get(live, "bytes_stored")) / 1e6,
               (long long)json_integer_value(json_object_get(live, "wrong_blocks")),
               (long long)json_integer_value(json_object_get(live, "errors")),
               json_real_value(json_object_get(live, "lookup_us_p50")),
               json_real_value(json_object_get(live, "lookup_us_p99")),
               json_real_value(json_object_get(live, "retrieve_us_p50")),
               json_real_value(json_object_get(live, "retrieve_us_p99")),
               json_real_value(json_object_get(live, "seconds")));
    const json_t *cl = live ? json_object_get(live, "cleanup") : NULL;
    if (json_is_object(cl))
        printf("  deleted the trace's %lld blocks (model '%s') from the server: %lld objects "
               "removed from L2 (--keep keeps them)\n",
               (long long)json_integer_value(json_object_get(cl, "deleted_keys")), a->model,
               (long long)json_integer_value(json_object_get(cl, "l2_removed")));
    else if (cl)
        printf("  kept the stored blocks in the server under the model '%s' (--keep)\n", a->model);
}

int kvt_cmd_replay(int argc, char **argv)
{
    struct replay_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc >= 0)
        return rc;
    struct trace t = {0};
    if (load_trace(a.path, &t, a.limit))
        return 2;
    if (!t.nacc) {
        fprintf(stderr, "kvtier replay: %s: no request with a block in it\n", a.path);
        trace_free(&t);
        return 2;
    }
    uint32_t longest = 0; /* blocks of the longest request: the live replay sends it whole */
    for (uint32_t q = 0; q < t.nreq; q++)
        longest = KVT_MAX(longest, t.start[q + 1] - t.start[q]);
    if (!a.offline && longest > KVT_MAX_BATCH) {
        fprintf(stderr,
                "kvtier replay: %s: a request of %u blocks; one request carries at most %u keys "
                "(use --offline)\n",
                a.path, longest, KVT_MAX_BATCH);
        trace_free(&t);
        return 2;
    }
    uint32_t u;
    uint32_t *d = densify(&t, &u);
    if (!a.budget)
        a.budget = KVT_MAX(u / 4, 1u);
    struct sims sm;
    json_t *out = json_object();
    json_object_set_new(out, "requests", json_integer(t.nreq));
    json_object_set_new(out, "block_accesses", json_integer((json_int_t)t.nacc));
    json_object_set_new(out, "unique_blocks", json_integer(u));
    json_object_set_new(out, "budget_blocks", json_integer((json_int_t)a.budget));
    json_object_set_new(out, "block_bytes", json_integer((json_int_t)a.block));
    json_object_set_new(out, "offline", simulate(&t, d, u, &a, &sm));
    rc = a.offline ? 0 : replay_live(&t, &a, longest, out);
    if (rc == 1 && !json_object_get(out, "live")) { /* the server could not be reached */
        json_decref(out);
        free(d);
        trace_free(&t);
        return 1;
    }
    if (a.as_json) {
        char *s = json_dumps(out, JSON_INDENT(2));
        printf("%s\n", s);
        free(s);
    } else {
        print_text(&t, u, &a, &sm, out);
    }
    json_decref(out);
    free(d);
    trace_free(&t);
    return rc;
}
