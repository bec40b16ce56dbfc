/* Purge through the adapter index or offline (rules in purge.h). */
#include "ops/purge.h"
#include "common/util.h"
#include "key/key.h"
#include "ops/scan.h"
#include "l2/kit/tmpguard.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static bool ns_match(const struct kvt_purge_req *q, const char *ns)
{
    return q->what == KVT_PURGE_ALL || (ns && strcmp(ns, q->ns) == 0);
}

/* Does this purge look at the entry (an object of a selected namespace, or
 * a tmp file)? The sweep and its progress total agree through it. */
static bool selected(const struct kvt_purge_req *q, const struct kvt_entry *e)
{
    if (e->kind == KVT_ENT_OBJECT)
        return q->what != KVT_PURGE_TMP && ns_match(q, e->ns);
    return e->kind == KVT_ENT_TMP && q->what != KVT_PURGE_NAMESPACE;
}

/*
 * Delete the selection from the index in batches of at most q->max: collect
 * READY unpinned entries under l2->lock, then kvt_l2_delete (which removes
 * the files without the lock and fixes the accounting). An entry pinned or
 * written meanwhile is skipped by kvt_l2_delete and counted as left.
 */
struct collect {
    const struct kvt_purge_req *q;
    struct kvt_purge_res *r;
    kvt_key *keys;
    uint32_t *stored;
    uint32_t n, cap;
};

/* Under the adapter's lock (kvt_l2_scan): take READY unpinned entries of
 * the selection until the batch is full. */
static bool collect_visit(const struct kvt_l2_entry *e, void *arg)
{
    struct collect *c = arg;
    if (!ns_match(c->q, kvt_ns_name(e->key.ns)))
        return true;
    c->r->matched++;
    if (!e->ready) {
        c->r->in_flight++;
    } else if (e->pins) {
        c->r->pinned++;
    } else {
        c->keys[c->n] = e->key;
        c->stored[c->n++] = e->stored;
    }
    return c->n < c->cap;
}

static void purge_index(kvt_l2 *l2, const struct kvt_purge_req *q, struct kvt_purge_res *r)
{
    uint32_t cap = q->max ? q->max : 4096, n = 0;
    kvt_key *keys = kvt_xcalloc(cap, sizeof(kvt_key));
    uint32_t *stored = kvt_xcalloc(cap, sizeof(uint32_t));
    bool limited = q->max != 0;
    uint32_t cursor = 0;
    for (;;) {
        struct collect c = {.q = q, .r = r, .keys = keys, .stored = stored, .cap = cap};
        bool done = kvt_l2_scan(l2, &cursor, collect_visit, &c);
        n = c.n;
        if (n && q->on_keys)
            q->on_keys(keys, n, q->on_keys_arg);
        if (n) {
            uint64_t *bits = kvt_xcalloc(kvt_bm_words(n), sizeof(uint64_t));
            uint32_t got = kvt_l2_delete(l2, keys, n, bits);
            r->removed += got;
            for (uint32_t i = 0; i < n; i++) {
                if (kvt_bm_test(bits, i))
                    r->removed_bytes += stored[i];
                else
                    r->pinned++; /* pinned or written between the walk and the delete */
            }
            free(bits);
        }
        if (done)
            break;
        if (limited && n == cap) {
            r->more = true;
            break;
        }
    }
    free(keys);
    free(stored);
}

struct sweep_ctx {
    kvt_l2 *l2; /* NULL offline */
    const struct kvt_purge_req *q;
    struct kvt_purge_res *r;
    struct kvt_tmpguard g;
    bool count_only;
    kvt_purge_progress progress;
    void *parg;
    uint64_t total, done;
    uint64_t last_ns;
};

static void tick(struct sweep_ctx *c, uint64_t bytes)
{
    c->done++;
    if (!c->progress)
        return;
    uint64_t now = kvt_now_ns();
    if (now - c->last_ns >= 100000000ull || c->done == c->total) {
        c->last_ns = now;
        c->progress(c->done, c->total, bytes, c->parg);
    }
}

static bool sweep_visit(const struct kvt_entry *e, void *arg)
{
    struct sweep_ctx *c = arg;
    struct kvt_purge_res *r = c->r;
    uint64_t sz = (uint64_t)e->st->st_size;
    if (!selected(c->q, e))
        return true;
    if (e->kind == KVT_ENT_OBJECT) {
        if (c->l2 && kvt_l2_indexed(c->l2, &e->key))
            return true; /* the index decides about it (pinned, in flight) */
        if (c->count_only) {
            r->matched++;
            return true;
        }
        if (unlinkat(e->dfd, e->name, 0) == 0) {
            r->files_removed++;
            r->files_bytes += sz;
        }
        tick(c, r->files_bytes + r->tmp_bytes);
    } else { /* a tmp file */
        enum kvt_tmp_verdict v = kvt_tmpguard_classify(&c->g, e->dfd, e->name, e->st, NULL);
        if (!kvt_tmp_removable(v)) {
            r->tmp_kept++;
            if (!c->count_only)
                tick(c, r->files_bytes + r->tmp_bytes); /* looked at: the total counts it */
            return true;
        }
        if (c->count_only) {
            r->tmp_removed++;
            r->tmp_bytes += sz;
            return true;
        }
        if (unlinkat(e->dfd, e->name, 0) == 0) {
            r->tmp_removed++;
            r->tmp_bytes += sz;
        }
        tick(c, r->files_bytes + r->tmp_bytes);
    }
    return true;
}

/* The progress bar's total: the files the sweep will look at, by name only
 * (the tmp guard's verdicts are the sweep's: no lock query, marker or /proc
 * read here). */
static bool total_visit(const struct kvt_entry *e, void *arg)
{
    struct sweep_ctx *c = arg;
    if (selected(c->q, e))
        c->total++;
    return true;
}

static int count_names(const char *root, const struct kvt_purge_req *q, uint64_t *total)
{
    int rootfd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (rootfd < 0)
        return -errno;
    struct sweep_ctx c = {.q = q};
    int rc = kvt_walk_root(rootfd, total_visit, &c);
    close(rootfd);
    *total = c.total;
    return rc;
}

static int sweep(const char *root, kvt_l2 *l2, const struct kvt_purge_req *q, bool count_only,
                 uint64_t total, kvt_purge_progress progress, void *parg, struct kvt_purge_res *r)
{
    int rootfd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (rootfd < 0)
        return -errno;
    struct sweep_ctx c = {.l2 = l2,
                          .q = q,
                          .r = r,
                          .count_only = count_only,
                          .progress = progress,
                          .parg = parg,
                          .total = total};
    kvt_tmpguard_init(&c.g, rootfd);
    int rc = kvt_walk_root(rootfd, sweep_visit, &c);
    if (!count_only && q->what != KVT_PURGE_NAMESPACE)
        kvt_tmpguard_sweep_markers(&c.g, &r->markers_swept, NULL);
    kvt_tmpguard_fini(&c.g);
    close(rootfd);
    return rc;
}

int kvt_purge_l2(kvt_l2 *l2, const char *root, const struct kvt_purge_req *q,
                 struct kvt_purge_res *r)
{
    memset(r, 0, sizeof(*r));
    if (kvt_l2_recovering(l2))
        return -EBUSY;
    if (q->what != KVT_PURGE_TMP)
        purge_index(l2, q, r);
    if (r->more)
        return 0;
    int rc = 0;
    if (root && root[0])
        rc = sweep(root, l2, q, false, 0, NULL, NULL, r);
    return rc == -ENOENT ? 0 : rc;
}

int kvt_purge_root(const char *root, const struct kvt_purge_req *q, bool count_only,
                   kvt_purge_progress progress, void *arg, struct kvt_purge_res *r)
{
    memset(r, 0, sizeof(*r));
    if (count_only)
        return sweep(root, NULL, q, true, 0, NULL, NULL, r);
    /* a pass counting names first gives the progress bar its total */
    uint64_t total = 0;
    if (progress) {
        int rc = count_names(root, q, &total);
        if (rc)
            return rc;
    }
    int rc = sweep(root, NULL, q, false, total, progress, arg, r);
    r->matched = r->files_removed;
    r->removed = r->files_removed;
    r->removed_bytes = r->files_bytes;
    return rc;
}

json_t *kvt_purge_res_json(const struct kvt_purge_res *r)
{
    json_t *o = json_object();
#define F(k) json_object_set_new(o, #k, json_integer((json_int_t)r->k))
    F(matched);
    F(removed);
    F(removed_bytes);
    F(l1_removed);
    F(pinned);
    F(in_flight);
    F(files_removed);
    F(files_bytes);
    F(tmp_removed);
    F(tmp_bytes);
    F(tmp_kept);
    F(markers_swept);
#undef F
    json_object_set_new(o, "more", json_boolean(r->more));
    return o;
}
