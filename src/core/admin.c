/*
 * The admin calls (core/admin.h): listing, removals, pins, status. Quotas
 * are admin_quota.c, the jobs admin_jobs.c, bringing keys into L1
 * admin_fetch.c.
 */
#include "common/log.h"
#include "common/util.h"
#include "core/admin_int.h"
#include "kvtier/error.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int kvt_admin_open(struct kvt_core *c, const struct kvt_admin_opts *o, struct kvt_admin **out)
{
    struct kvt_admin *a = kvt_xcalloc(1, sizeof(*a));
    a->core = c;
    a->l1 = kvt_core_l1(c);
    a->nl2 = kvt_core_nl2(c);
    for (int i = 0; i < a->nl2; i++)
        a->l2s[i] = kvt_core_l2(c, i);
    a->o = *o;
    a->next_id = 1;
    pthread_mutex_init(&a->pin_lock, NULL);
    pthread_mutex_init(&a->lock, NULL);
    pthread_cond_init(&a->cond, NULL);
    kvt_kindex_init(&a->pin_map, sizeof(struct admin_pin), offsetof(struct admin_pin, key));
    int rc = kvt_admin_jobs_start(a);
    if (rc) {
        kvt_admin_close(a);
        return rc;
    }
    *out = a;
    return 0;
}

void kvt_admin_close(struct kvt_admin *a)
{
    if (!a)
        return;
    kvt_admin_jobs_stop(a);
    for (uint32_t i = 0; i < a->npins; i++) {
        struct admin_pin *p = &a->pins[i];
        kvt_l1_put(a->l1, p->l1h);
        for (int ad = 0; ad < a->nl2; ad++)
            if (p->l2mask & (1u << ad))
                kvt_l2_unlock(a->l2s[ad], &p->key, 1);
    }
    free(a->pins);
    kvt_kindex_free(&a->pin_map);
    pthread_cond_destroy(&a->cond);
    pthread_mutex_destroy(&a->lock);
    pthread_mutex_destroy(&a->pin_lock);
    free(a);
}

int kvt_admin_tier(struct kvt_admin *a, const char *name)
{
    if (strcmp(name, "l1") == 0 || strcmp(name, "L1") == 0)
        return KVT_ADMIN_L1;
    for (int i = 0; i < a->nl2; i++)
        if (strcmp(kvt_l2_name(a->l2s[i]), name) == 0)
            return i;
    return -ENOENT;
}

bool kvt_admin_ns_known(const char *ns)
{
    uint32_t n = kvt_ns_count();
    for (uint32_t id = 1; id <= n; id++) {
        const char *name = kvt_ns_name(id);
        if (name && strcmp(name, ns) == 0)
            return true;
    }
    return false;
}

void kvt_admin_name(const kvt_key *k, char *out)
{
    int len = kvt_key_encode(KVT_CODEC_NIXL, k, out);
    if (len < 0) {
        out[0] = 0;
        return;
    }
    if (len > 4 && strcmp(out + len - 4, ".bin") == 0)
        out[len - 4] = 0;
}

static void hex(const uint8_t *b, size_t n, char *out)
{
    static const char d[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = d[b[i] >> 4];
        out[2 * i + 1] = d[b[i] & 15];
    }
    out[2 * n] = 0;
}

/* ------------------------------------------------------------ listing */

/* What a walk collected of one object (built into JSON after the walk,
 * outside the tier's lock). */
struct seen {
    kvt_key key;
    uint32_t len;
    bool held; /* referenced (L1) or pinned (L2) by anyone */
};

struct walk {
    const struct kvt_admin_filter *f;
    struct seen *v;
    uint32_t n, max;
};

static bool filter_ok(const struct kvt_admin_filter *f, const kvt_key *k)
{
    if (f->model && strcmp(kvt_ns_model(k->ns), f->model) != 0)
        return false;
    if (f->salt && strcmp(kvt_ns_salt(k->ns), f->salt) != 0)
        return false;
    if (f->ns && strcmp(kvt_ns_name(k->ns), f->ns) != 0)
        return false;
    if (f->prefix) {
        char name[KVT_NAME_MAX + 1];
        kvt_admin_name(k, name);
        if (strncmp(name, f->prefix, strlen(f->prefix)) != 0)
            return false;
    }
    return true;
}

static bool take(struct walk *w, const kvt_key *k, uint32_t len, bool held)
{
    if (!filter_ok(w->f, k))
        return true;
    w->v[w->n++] = (struct seen){*k, len, held};
    return w->n < w->max;
}

static bool visit_l1(const struct kvt_l1_entry *e, void *arg)
{
    return take(arg, &e->key, e->len, e->refs > 0);
}

static bool visit_l2(const struct kvt_l2_entry *e, void *arg)
{
    if (!e->ready)
        return true;
    return take(arg, &e->key, e->len, e->pins > 0);
}

/* Walk tier slot t (0: L1, 1 + a: adapter a) from *pos, adding matches to
 * w until it is full; true when the tier's end was reached. */
static bool walk_tier(struct kvt_admin *a, int t, uint32_t *pos, struct walk *w)
{
    if (t == 0)
        return kvt_l1_scan(a->l1, pos, visit_l1, w);
    return kvt_l2_scan(a->l2s[t - 1], pos, visit_l2, w);
}

static bool pinned(struct kvt_admin *a, const kvt_key *k)
{
    pthread_mutex_lock(&a->pin_lock);
    bool p = kvt_kindex_find(&a->pin_map, k) != KVT_NOHANDLE;
    pthread_mutex_unlock(&a->pin_lock);
    return p;
}

static json_t *object_json(struct kvt_admin *a, int t, const struct seen *s)
{
    char name[KVT_NAME_MAX + 1], h[2 * KVT_HASH_MAX + 1];
    kvt_admin_name(&s->key, name);
    hex(s->key.hash, s->key.hash_len, h);
    json_t *o = json_object();
    json_object_set_new(o, "name", json_string(name));
    json_object_set_new(o, "tier", json_string(t == 0 ? "l1" : kvt_l2_name(a->l2s[t - 1])));
    json_object_set_new(o, "model", json_string(kvt_ns_model(s->key.ns)));
    json_object_set_new(o, "salt", json_string(kvt_ns_salt(s->key.ns)));
    json_object_set_new(o, "namespace", json_string(kvt_ns_name(s->key.ns)));
    json_object_set_new(o, "kv_rank", json_integer(s->key.kv_rank));
    json_object_set_new(o, "group", json_integer(s->key.group));
    json_object_set_new(o, "hash", json_string(h));
    json_object_set_new(o, "bytes", json_integer(s->len));
    json_object_set_new(o, "pinned", json_boolean(pinned(a, &s->key)));
    json_object_set_new(o, "in_use", json_boolean(s->held));
    return o;
}

int kvt_admin_list(struct kvt_admin *a, const struct kvt_admin_filter *f, const char *cursor,
                   uint32_t limit, json_t **out, char *err, size_t cap)
{
    int t = 0;
    uint32_t pos = 0;
    if (cursor && cursor[0]) {
        char *end;
        long tv = strtol(cursor, &end, 10);
        unsigned long pv = *end == '.' ? strtoul(end + 1, &end, 10) : ULONG_MAX;
        if (*end || tv < 0 || tv > a->nl2 || pv > UINT32_MAX) {
            snprintf(err, cap, "cursor '%.100s' is not one this server gave", cursor);
            return -EINVAL;
        }
        t = (int)tv;
        pos = (uint32_t)pv;
    }
    limit = limit ? KVT_MIN(limit, KVT_ADMIN_MAX_LIST) : 1000;
    struct walk w = {.f = f, .v = kvt_xmalloc(limit * sizeof(struct seen)), .max = limit};
    json_t *objs = json_array();
    bool done = false;
    while (!done) {
        int tier = t == 0 ? KVT_ADMIN_L1 : t - 1;
        bool end = true;
        if (f->tier == KVT_ADMIN_ALL || f->tier == tier) {
            w.n = 0;
            end = walk_tier(a, t, &pos, &w);
            for (uint32_t i = 0; i < w.n; i++)
                json_array_append_new(objs, object_json(a, t, &w.v[i]));
            w.max -= w.n;
        }
        if (end) {
            t++;
            pos = 0;
        }
        done = t > a->nl2 || w.max == 0;
    }
    free(w.v);
    *out = json_object();
    json_object_set_new(*out, "objects", objs);
    char next[32];
    snprintf(next, sizeof(next), "%d.%u", t, pos);
    json_object_set_new(*out, "next_cursor", t > a->nl2 ? json_null() : json_string(next));
    return 0;
}

kvt_key *kvt_admin_l2_keys(struct kvt_admin *a, int tier, const char *ns, uint32_t *n)
{
    struct kvt_admin_filter f = {.ns = ns, .tier = tier};
    uint32_t cap = 1024, cnt = 0;
    kvt_key *keys = kvt_xmalloc(cap * sizeof(kvt_key));
    struct kvt_kindex seen;
    kvt_kindex_init(&seen, sizeof(kvt_key), 0);
    struct walk w = {.f = &f, .v = kvt_xmalloc(4096 * sizeof(struct seen))};
    for (int ad = 0; ad < a->nl2; ad++) {
        if (tier != KVT_ADMIN_ALL && tier != ad)
            continue;
        uint32_t pos = 0;
        bool end = false;
        while (!end) {
            w.n = 0;
            w.max = 4096;
            end = kvt_l2_scan(a->l2s[ad], &pos, visit_l2, &w);
            for (uint32_t i = 0; i < w.n; i++) {
                seen.base = (const char *)keys; /* keys may have moved */
                if (kvt_kindex_find(&seen, &w.v[i].key) != KVT_NOHANDLE)
                    continue;
                if (cnt == cap) {
                    cap *= 2;
                    keys = kvt_xrealloc(keys, cap * sizeof(kvt_key));
                    seen.base = (const char *)keys;
                }
                keys[cnt] = w.v[i].key;
                kvt_kindex_put(&seen, cnt++);
            }
        }
    }
    free(w.v);
    kvt_kindex_free(&seen);
    *n = cnt;
    return keys;
}

/* ----------------------------------------------------------- removals */

static bool known(struct kvt_admin *a, const kvt_key *k)
{
    if (kvt_l1_contains(a->l1, k))
        return true;
    for (int ad = 0; ad < a->nl2; ad++)
        if (kvt_l2_indexed(a->l2s[ad], k))
            return true;
    return false;
}

static void unpin_locked(struct kvt_admin *a, uint32_t i);

/* Delete keys (all known) from every tier, their pins released first. */
static json_t *delete_keys(struct kvt_admin *a, kvt_key *keys, uint32_t n)
{
    pthread_mutex_lock(&a->pin_lock);
    uint64_t unpinned = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t p = kvt_kindex_find(&a->pin_map, &keys[i]);
        if (p != KVT_NOHANDLE) {
            unpin_locked(a, p);
            unpinned++;
        }
    }
    pthread_mutex_unlock(&a->pin_lock);
    atomic_fetch_add(&a->nunpinned, unpinned);
    uint32_t removed_l2[KVT_MAX_ADAPTERS] = {0}, *skipped = kvt_xmalloc((n ? n : 1) * 4), nskip;
    kvt_key *orig = kvt_xmalloc((n ? n : 1) * sizeof(kvt_key));
    if (n)
        memcpy(orig, keys, n * sizeof(kvt_key));
    uint32_t l1n = kvt_core_delete(a->core, keys, n, removed_l2, skipped, &nskip);
    json_t *o = json_object(), *per = json_object(), *left = json_array();
    uint64_t total = l1n;
    for (int ad = 0; ad < a->nl2; ad++) {
        json_object_set_new(per, kvt_l2_name(a->l2s[ad]), json_integer(removed_l2[ad]));
        total += removed_l2[ad];
    }
    for (uint32_t i = 0; i < nskip; i++) {
        char name[KVT_NAME_MAX + 1];
        kvt_admin_name(&orig[skipped[i]], name);
        json_array_append_new(left, json_string(name));
    }
    json_object_set_new(o, "removed_l1", json_integer(l1n));
    json_object_set_new(o, "removed_l2", per);
    json_object_set_new(o, "unpinned", json_integer((json_int_t)unpinned));
    json_object_set_new(o, "left_in_use", left);
    atomic_fetch_add(&a->deletes, 1);
    atomic_fetch_add(&a->deleted_objects, total);
    kvt_info("admin: deleted %u key(s): %llu object(s) removed (%u in L1), %u left in use, %llu "
             "unpinned",
             n, (unsigned long long)total, l1n, nskip, (unsigned long long)unpinned);
    free(skipped);
    free(orig);
    return o;
}

int kvt_admin_delete(struct kvt_admin *a, kvt_key *keys, uint32_t n, json_t **out, char *err,
                     size_t cap)
{
    json_t *unknown = json_array();
    for (uint32_t i = 0; i < n; i++)
        if (!known(a, &keys[i])) {
            char name[KVT_NAME_MAX + 1];
            kvt_admin_name(&keys[i], name);
            json_array_append_new(unknown, json_string(name));
        }
    if (json_array_size(unknown)) {
        snprintf(err, cap, "%zu of %u key(s) are held by no tier: nothing deleted",
                 json_array_size(unknown), n);
        *out = json_object();
        json_object_set_new(*out, "unknown", unknown);
        return -ENOENT;
    }
    json_decref(unknown);
    *out = delete_keys(a, keys, n);
    return 0;
}

int kvt_admin_delete_prefix(struct kvt_admin *a, const char *prefix, json_t **out, char *err,
                            size_t cap)
{
    struct kvt_admin_filter f = {.prefix = prefix, .tier = KVT_ADMIN_ALL};
    uint32_t n = 0, kcap = 1024;
    kvt_key *keys = kvt_xmalloc(kcap * sizeof(kvt_key));
    struct kvt_kindex seen;
    kvt_kindex_init(&seen, sizeof(kvt_key), 0);
    struct walk w = {.f = &f, .v = kvt_xmalloc(4096 * sizeof(struct seen))};
    for (int t = 0; t <= a->nl2; t++) {
        uint32_t pos = 0;
        bool end = false;
        while (!end) {
            w.n = 0;
            w.max = 4096;
            end = walk_tier(a, t, &pos, &w);
            for (uint32_t i = 0; i < w.n; i++) {
                seen.base = (const char *)keys;
                if (kvt_kindex_find(&seen, &w.v[i].key) != KVT_NOHANDLE)
                    continue;
                if (n == kcap) {
                    kcap *= 2;
                    keys = kvt_xrealloc(keys, kcap * sizeof(kvt_key));
                    seen.base = (const char *)keys;
                }
                keys[n] = w.v[i].key;
                kvt_kindex_put(&seen, n++);
            }
        }
    }
    free(w.v);
    kvt_kindex_free(&seen);
    if (!n) {
        snprintf(err, cap, "no object's name starts with '%.200s'", prefix);
        free(keys);
        return -ENOENT;
    }
    *out = NULL;
    for (uint32_t i = 0; i < n; i += 4096) { /* batches of a delete request's size */
        json_t *part = delete_keys(a, keys + i, KVT_MIN(4096, n - i));
        if (!*out) {
            *out = part;
            continue;
        }
        json_t *cur = json_object_get(*out, "removed_l1");
        json_object_set_new(*out, "removed_l1",
                            json_integer(json_integer_value(cur) +
                                         json_integer_value(json_object_get(part, "removed_l1"))));
        const char *k;
        json_t *v;
        json_t *per = json_object_get(*out, "removed_l2");
        json_object_foreach(json_object_get(part, "removed_l2"), k, v) json_object_set_new(
            per, k,
            json_integer(json_integer_value(json_object_get(per, k)) + json_integer_value(v)));
        json_array_extend(json_object_get(*out, "left_in_use"),
                          json_object_get(part, "left_in_use"));
        json_decref(part);
    }
    json_object_set_new(*out, "matched", json_integer(n));
    free(keys);
    return 0;
}

int kvt_admin_clear(struct kvt_admin *a, int tier, json_t **out, char *err, size_t cap)
{
    (void)err, (void)cap;
    uint64_t removed = 0, bytes = 0, left = 0;
    if (tier == KVT_ADMIN_L1) {
        struct kvt_l1_usage u0, u1;
        kvt_l1_usage(a->l1, &u0);
        bytes = kvt_core_clear_l1(a->core);
        kvt_l1_usage(a->l1, &u1);
        removed = u0.objects > u1.objects ? u0.objects - u1.objects : 0;
        left = u1.objects;
    } else {
        kvt_l2 *l2 = a->l2s[tier];
        struct kvt_l2_usage u0, u1;
        kvt_l2_usage(l2, &u0);
        uint32_t n;
        kvt_key *keys = kvt_admin_l2_keys(a, tier, NULL, &n);
        for (uint32_t i = 0; i < n; i += 1024)
            removed += kvt_l2_delete(l2, keys + i, KVT_MIN(1024, n - i), NULL);
        free(keys);
        kvt_l2_usage(l2, &u1);
        bytes = u0.used_bytes > u1.used_bytes ? u0.used_bytes - u1.used_bytes : 0;
        left = u1.objects;
    }
    const char *name = tier == KVT_ADMIN_L1 ? "l1" : kvt_l2_name(a->l2s[tier]);
    *out = json_object();
    json_object_set_new(*out, "tier", json_string(name));
    json_object_set_new(*out, "removed", json_integer((json_int_t)removed));
    json_object_set_new(*out, "freed_bytes", json_integer((json_int_t)bytes));
    json_object_set_new(*out, "left", json_integer((json_int_t)left));
    atomic_fetch_add(&a->clears, 1);
    atomic_fetch_add(&a->cleared_objects, removed);
    atomic_fetch_add(&a->cleared_bytes, bytes);
    kvt_info("admin: cleared %s: %llu object(s), %llu bytes removed; %llu left (pinned or in use)",
             name, (unsigned long long)removed, (unsigned long long)bytes,
             (unsigned long long)left);
    return 0;
}

/* --------------------------------------------------------------- pins */

/* Release pin i and take it out of the table (the last one moves into its
 * place). call with a->pin_lock held */
static void unpin_locked(struct kvt_admin *a, uint32_t i)
{
    struct admin_pin *p = &a->pins[i];
    kvt_l1_put(a->l1, p->l1h);
    for (int ad = 0; ad < a->nl2; ad++)
        if (p->l2mask & (1u << ad))
            kvt_l2_unlock(a->l2s[ad], &p->key, 1);
    a->pinned_bytes -= p->len;
    kvt_kindex_del(&a->pin_map, i);
    uint32_t last = --a->npins;
    if (i != last) {
        kvt_kindex_del(&a->pin_map, last);
        a->pins[i] = a->pins[last];
        kvt_kindex_put(&a->pin_map, i);
    }
}

static void pin_add_locked(struct kvt_admin *a, const kvt_key *k, const struct kvt_l1_ref *r)
{
    if (a->npins == a->cap_pins) {
        a->cap_pins = a->cap_pins ? 2 * a->cap_pins : 64;
        a->pins = kvt_xrealloc(a->pins, a->cap_pins * sizeof(*a->pins));
        a->pin_map.base = (const char *)a->pins;
    }
    struct admin_pin *p = &a->pins[a->npins];
    *p = (struct admin_pin){.key = *k, .l1h = r->h, .len = r->meta.len};
    for (int ad = 0; ad < a->nl2; ad++) {
        uint64_t held = 0;
        if (kvt_l2_hold(a->l2s[ad], k, 1, &held))
            p->l2mask |= 1u << ad;
    }
    a->pinned_bytes += p->len;
    kvt_kindex_put(&a->pin_map, a->npins++);
}

int kvt_admin_pin(struct kvt_admin *a, const kvt_key *keys, uint32_t n, json_t **out, char *err,
                  size_t cap)
{
    pthread_mutex_lock(&a->pin_lock);
    /* the keys not pinned yet, each once */
    kvt_key *todo = kvt_xmalloc((n ? n : 1) * sizeof(kvt_key));
    uint32_t k = 0;
    struct kvt_kindex seen;
    kvt_kindex_init(&seen, sizeof(kvt_key), 0);
    seen.base = (const char *)todo;
    for (uint32_t i = 0; i < n; i++) {
        if (kvt_kindex_find(&a->pin_map, &keys[i]) != KVT_NOHANDLE ||
            kvt_kindex_find(&seen, &keys[i]) != KVT_NOHANDLE)
            continue;
        todo[k] = keys[i];
        kvt_kindex_put(&seen, k++);
    }
    kvt_kindex_free(&seen);
    struct admin_fetch f;
    kvt_admin_fetch_find(a, &f, todo, k, true);
    uint64_t add = 0;
    json_t *unknown = json_array();
    for (uint32_t i = 0; i < k; i++) {
        add += f.len[i];
        if (f.st[i] == FK_MISS) {
            char name[KVT_NAME_MAX + 1];
            kvt_admin_name(&todo[i], name);
            json_array_append_new(unknown, json_string(name));
        }
    }
    int rc = 0;
    *out = json_object();
    if (json_array_size(unknown)) {
        snprintf(err, cap, "%zu of %u key(s) are held by no tier: nothing pinned",
                 json_array_size(unknown), n);
        json_object_set(*out, "unknown", unknown);
        rc = -ENOENT;
    } else if (a->pinned_bytes + add > a->o.max_pinned_bytes) {
        snprintf(err, cap,
                 "pinning %" PRIu64 " more bytes would hold %" PRIu64
                 " pinned bytes, over the bound of %" PRIu64 " (--max-pinned-mb): nothing pinned",
                 add, a->pinned_bytes + add, a->o.max_pinned_bytes);
        rc = -EOVERFLOW;
    } else {
        kvt_admin_fetch_load(a, &f);
        json_t *failed = json_array();
        for (uint32_t i = 0; i < k; i++)
            if (f.st[i] != FK_L1 && f.st[i] != FK_LOADED) {
                char name[KVT_NAME_MAX + 1];
                kvt_admin_name(&todo[i], name);
                json_array_append_new(failed, json_string(name));
            }
        if (json_array_size(failed)) {
            snprintf(err, cap, "%zu key(s) could not be brought into L1 (full): nothing pinned",
                     json_array_size(failed));
            json_object_set(*out, "not_loaded", failed);
            rc = -ENOSPC;
        } else {
            for (uint32_t i = 0; i < k; i++)
                pin_add_locked(a, &todo[i], &f.refs[i]);
        }
        json_decref(failed);
    }
    kvt_admin_fetch_done(a, &f, rc == 0);
    json_decref(unknown);
    if (rc == 0) {
        json_object_set_new(*out, "pinned", json_integer(k));
        json_object_set_new(*out, "already_pinned", json_integer(n - k));
        json_object_set_new(*out, "pinned_bytes", json_integer((json_int_t)a->pinned_bytes));
        json_object_set_new(*out, "max_pinned_bytes",
                            json_integer((json_int_t)a->o.max_pinned_bytes));
        atomic_fetch_add(&a->npinned, k);
        kvt_info("admin: pinned %u key(s) (+%llu bytes; %llu pinned bytes of %llu)", k,
                 (unsigned long long)add, (unsigned long long)a->pinned_bytes,
                 (unsigned long long)a->o.max_pinned_bytes);
    }
    pthread_mutex_unlock(&a->pin_lock);
    free(todo);
    return rc;
}

int kvt_admin_unpin(struct kvt_admin *a, const kvt_key *keys, uint32_t n, json_t **out, char *err,
                    size_t cap)
{
    pthread_mutex_lock(&a->pin_lock);
    json_t *unknown = json_array();
    for (uint32_t i = 0; i < n; i++)
        if (kvt_kindex_find(&a->pin_map, &keys[i]) == KVT_NOHANDLE) {
            char name[KVT_NAME_MAX + 1];
            kvt_admin_name(&keys[i], name);
            json_array_append_new(unknown, json_string(name));
        }
    *out = json_object();
    if (json_array_size(unknown)) {
        snprintf(err, cap, "%zu of %u key(s) are not pinned: nothing unpinned",
                 json_array_size(unknown), n);
        json_object_set_new(*out, "not_pinned", unknown);
        pthread_mutex_unlock(&a->pin_lock);
        return -ENOENT;
    }
    json_decref(unknown);
    uint32_t done = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t p = kvt_kindex_find(&a->pin_map, &keys[i]);
        if (p != KVT_NOHANDLE) { /* a key given twice is unpinned once */
            unpin_locked(a, p);
            done++;
        }
    }
    json_object_set_new(*out, "unpinned", json_integer(done));
    json_object_set_new(*out, "pinned_bytes", json_integer((json_int_t)a->pinned_bytes));
    atomic_fetch_add(&a->nunpinned, done);
    kvt_info("admin: unpinned %u key(s) (%llu pinned bytes left)", done,
             (unsigned long long)a->pinned_bytes);
    pthread_mutex_unlock(&a->pin_lock);
    return 0;
}

json_t *kvt_admin_pins(struct kvt_admin *a)
{
    pthread_mutex_lock(&a->pin_lock);
    uint32_t n = a->npins;
    struct admin_pin *copy = kvt_xmalloc((n ? n : 1) * sizeof(*copy));
    if (n) /* no pins yet: a->pins may be NULL */
        memcpy(copy, a->pins, n * sizeof(*copy));
    uint64_t bytes = a->pinned_bytes;
    pthread_mutex_unlock(&a->pin_lock);
    json_t *arr = json_array();
    for (uint32_t i = 0; i < n; i++) {
        struct seen s = {copy[i].key, copy[i].len, true};
        json_t *o = object_json(a, 0, &s);
        json_object_del(o, "tier");
        json_object_del(o, "in_use");
        json_t *tiers = json_array();
        json_array_append_new(tiers, json_string("l1"));
        for (int ad = 0; ad < a->nl2; ad++)
            if (copy[i].l2mask & (1u << ad))
                json_array_append_new(tiers, json_string(kvt_l2_name(a->l2s[ad])));
        json_object_set_new(o, "tiers", tiers);
        json_array_append_new(arr, o);
    }
    free(copy);
    json_t *o = json_object();
    json_object_set_new(o, "objects", arr);
    json_object_set_new(o, "pinned_bytes", json_integer((json_int_t)bytes));
    json_object_set_new(o, "max_pinned_bytes", json_integer((json_int_t)a->o.max_pinned_bytes));
    return o;
}

/* ------------------------------------------------------------- status */

void kvt_admin_stats(struct kvt_admin *a, struct kvt_admin_stats *s)
{
    *s = (struct kvt_admin_stats){
        .deletes = atomic_load(&a->deletes),
        .deleted_objects = atomic_load(&a->deleted_objects),
        .clears = atomic_load(&a->clears),
        .cleared_objects = atomic_load(&a->cleared_objects),
        .cleared_bytes = atomic_load(&a->cleared_bytes),
        .quota_sets = atomic_load(&a->quota_sets),
        .quota_deletes = atomic_load(&a->quota_deletes),
        .pins = atomic_load(&a->npinned),
        .unpins = atomic_load(&a->nunpinned),
        .warm_jobs = atomic_load(&a->warm_jobs),
        .warmed_objects = atomic_load(&a->warmed_objects),
        .verify_jobs = atomic_load(&a->verify_jobs),
        .verified_objects = atomic_load(&a->verified_objects),
        .corrupt_found = atomic_load(&a->corrupt_found),
        .corrupt_removed = atomic_load(&a->corrupt_removed),
        .max_pinned_bytes = a->o.max_pinned_bytes,
    };
    pthread_mutex_lock(&a->pin_lock);
    s->pinned_objects = a->npins;
    s->pinned_bytes = a->pinned_bytes;
    pthread_mutex_unlock(&a->pin_lock);
}

json_t *kvt_admin_status(struct kvt_admin *a)
{
    struct kvt_admin_stats s;
    kvt_admin_stats(a, &s);
    json_t *o = json_object(), *c = json_object();
#define NUM(f) json_object_set_new(c, #f, json_integer((json_int_t)s.f))
    NUM(deletes);
    NUM(deleted_objects);
    NUM(clears);
    NUM(cleared_objects);
    NUM(cleared_bytes);
    NUM(quota_sets);
    NUM(quota_deletes);
    NUM(pins);
    NUM(unpins);
    NUM(warm_jobs);
    NUM(warmed_objects);
    NUM(verify_jobs);
    NUM(verified_objects);
    NUM(corrupt_found);
    NUM(corrupt_removed);
#undef NUM
    json_object_set_new(o, "counters", c);
    json_object_set_new(o, "pinned_objects", json_integer((json_int_t)s.pinned_objects));
    json_object_set_new(o, "pinned_bytes", json_integer((json_int_t)s.pinned_bytes));
    json_object_set_new(o, "max_pinned_bytes", json_integer((json_int_t)s.max_pinned_bytes));
    json_t *jobs = json_array();
    pthread_mutex_lock(&a->lock);
    for (uint32_t i = 0; i < a->njobs; i++)
        json_array_append_new(jobs, kvt_admin_job_json_locked(a->jobs[i]));
    pthread_mutex_unlock(&a->lock);
    json_object_set_new(o, "jobs", jobs);
    return o;
}
