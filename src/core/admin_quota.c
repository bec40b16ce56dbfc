/*
 * Admin calls: quotas at run time (core/admin.h). A change applies to the
 * adapters' accounting at once and is written into each adapter's quotas
 * file (the "namespace_quotas" path, or KVP_QUOTAS_FILE), so that the next
 * start reads it: the file is read, the one entry changed (any other
 * spelling of the same name removed), and the whole written to a tmp file
 * that is synced and renamed over it. A change that cannot be written is
 * undone: memory and file never disagree. Changes are serialized by
 * a->pin_lock.
 */
#include "common/log.h"
#include "common/util.h"
#include "core/admin_int.h"
#include "l2/kit/quota.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NAME_MAX_Q 256

/* The quota name as adapters keep it (a namespace name, or "@salt"),
 * validated by the quotas file's own rules. 0 or -EINVAL with err. */
static int resolve(const char *in, char *out, char *err, size_t cap)
{
    json_t *one = json_object(), *res = NULL;
    json_object_set_new(one, in, json_integer(0));
    char msg[400];
    int rc = kvt_quota_parse(one, &res, msg, sizeof(msg));
    json_decref(one);
    if (rc) {
        snprintf(err, cap, "quota name: %s", msg);
        return -EINVAL;
    }
    const char *k = json_object_iter_key(json_object_iter(res));
    snprintf(out, NAME_MAX_Q, "%s", k);
    json_decref(res);
    return 0;
}

/* The adapters a call names: adapter, or every one. */
static int targets(struct kvt_admin *a, int adapter, int *t)
{
    int n = 0;
    for (int i = 0; i < a->nl2; i++)
        if (adapter == KVT_ADMIN_ALL || adapter == i)
            t[n++] = i;
    return n;
}

/* Rewrite path with name's entry set to bytes (set) or removed. 0 or
 * -errno with err. */
static int write_file(const char *path, const char *name, bool set, uint64_t bytes, char *err,
                      size_t cap)
{
    json_error_t je;
    json_t *doc = json_load_file(path, 0, &je);
    if (!doc || !json_is_object(doc)) {
        snprintf(err, cap, "cannot read quotas file %s: %s", path, doc ? "not an object" : je.text);
        json_decref(doc);
        return -EIO;
    }
    const char *k;
    json_t *v;
    void *tmp;
    json_object_foreach_safe(doc, tmp, k, v)
    {
        char ns[NAME_MAX_Q];
        if (kvt_quota_ns_name(k, ns, sizeof(ns)) >= 0 && strcmp(ns, name) == 0)
            json_object_del(doc, k);
    }
    if (set) {
        json_t *e = json_object();
        json_object_set_new(e, "max_bytes", json_integer((json_int_t)bytes));
        json_object_set_new(doc, name, e);
    }
    char *text = json_dumps(doc, JSON_INDENT(2));
    json_decref(doc);
    char tmpf[4200];
    snprintf(tmpf, sizeof(tmpf), "%s.tmp.%d", path, (int)getpid());
    int rc = 0, fd = open(tmpf, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    size_t len = strlen(text);
    if (fd < 0 || write(fd, text, len) != (ssize_t)len || write(fd, "\n", 1) != 1 || fsync(fd) ||
        rename(tmpf, path))
        rc = -errno;
    if (fd >= 0)
        close(fd);
    if (rc) {
        unlink(tmpf);
        snprintf(err, cap, "cannot write quotas file %s: %s", path, strerror(-rc));
    }
    free(text);
    return rc;
}

/* The quotas files of adapters t[0..n), each once. */
static int files(struct kvt_admin *a, const int *t, int n, const char **out)
{
    int m = 0;
    for (int i = 0; i < n; i++) {
        const char *f = a->o.quotas_files[t[i]];
        bool dup = false;
        for (int j = 0; j < m; j++)
            dup |= strcmp(out[j], f) == 0;
        if (!dup)
            out[m++] = f;
    }
    return m;
}

/* Every target keeps its quotas in a file (else nothing could persist). */
static int need_files(struct kvt_admin *a, const int *t, int n, char *err, size_t cap)
{
    for (int i = 0; i < n; i++)
        if (!a->o.quotas_files[t[i]]) {
            snprintf(err, cap,
                     "%s keeps no quotas file, so a quota set now would not survive a restart: "
                     "give its \"namespace_quotas\" as a file path (a file holding {} will do)",
                     kvt_l2_name(a->l2s[t[i]]));
            return -ENOTSUP;
        }
    return 0;
}

int kvt_admin_quota_get(struct kvt_admin *a, const char *in, int adapter, json_t **out, char *err,
                        size_t cap)
{
    char name[NAME_MAX_Q];
    int t[KVT_MAX_ADAPTERS], n = targets(a, adapter, t), rc = resolve(in, name, err, cap);
    if (rc)
        return rc;
    json_t *per = json_object();
    int found = 0;
    for (int i = 0; i < n; i++) {
        struct kvt_l2_quota_info q;
        if (kvt_l2_quota_get(a->l2s[t[i]], name, &q) == 0) {
            json_t *e = json_object();
            json_object_set_new(e, "quota_bytes", json_integer((json_int_t)q.limit));
            json_object_set_new(e, "used_bytes", json_integer((json_int_t)q.used));
            json_object_set_new(e, "rejected_writes", json_integer((json_int_t)q.rejected));
            json_object_set_new(per, kvt_l2_name(a->l2s[t[i]]), e);
            found++;
        }
    }
    if (!found) {
        json_decref(per);
        snprintf(err, cap, "no quota named '%s'", name);
        return -ENOENT;
    }
    *out = json_object();
    json_object_set_new(*out, "name", json_string(name));
    json_object_set_new(*out, "adapters", per);
    return 0;
}

struct prev {
    bool had;
    uint64_t limit;
};

/* Put adapter i's quota back as it was before this call. */
static void restore(struct kvt_admin *a, int i, const char *name, const struct prev *p)
{
    uint64_t used;
    if (p->had)
        kvt_l2_quota_set(a->l2s[i], name, p->limit, &used);
    else
        kvt_l2_quota_del(a->l2s[i], name);
}

int kvt_admin_quota_set(struct kvt_admin *a, const char *in, uint64_t bytes, int adapter,
                        json_t **out, char *err, size_t cap)
{
    char name[NAME_MAX_Q];
    int t[KVT_MAX_ADAPTERS], n = targets(a, adapter, t), rc = resolve(in, name, err, cap);
    if (rc || (rc = need_files(a, t, n, err, cap)))
        return rc;
    if (!n) {
        snprintf(err, cap, "this server has no L2 adapter to hold a quota");
        return -ENOTSUP;
    }
    pthread_mutex_lock(&a->pin_lock);
    struct prev prev[KVT_MAX_ADAPTERS];
    int done = 0;
    *out = json_object();
    for (; done < n; done++) {
        int i = t[done];
        struct kvt_l2_quota_info q;
        prev[done].had = kvt_l2_quota_get(a->l2s[i], name, &q) == 0;
        prev[done].limit = prev[done].had ? q.limit : 0;
        uint64_t used = 0;
        rc = kvt_l2_quota_set(a->l2s[i], name, bytes, &used);
        if (rc == -EOVERFLOW) {
            snprintf(err, cap,
                     "%s already holds %" PRIu64 " bytes of '%s', more than %" PRIu64
                     ": nothing changed (delete or purge objects first, then set it)",
                     kvt_l2_name(a->l2s[i]), used, name, bytes);
            json_object_set_new(*out, "adapter", json_string(kvt_l2_name(a->l2s[i])));
            json_object_set_new(*out, "used_bytes", json_integer((json_int_t)used));
        } else if (rc) {
            snprintf(err, cap, "%s: at most %d quotas", kvt_l2_name(a->l2s[i]), KVT_L2_MAX_QUOTAS);
        }
        if (rc)
            break;
    }
    const char *fl[KVT_MAX_ADAPTERS];
    int nf = rc ? 0 : files(a, t, n, fl);
    for (int f = 0; f < nf && !rc; f++)
        rc = write_file(fl[f], name, true, bytes, err, cap);
    if (rc) { /* undo: memory and files as they were */
        for (int j = 0; j < done && j < n; j++)
            restore(a, t[j], name, &prev[j]);
        if (rc != -EOVERFLOW)
            for (int f = 0; f < nf; f++) {
                char e2[64];
                bool had = false;
                uint64_t lim = 0;
                for (int j = 0; j < n; j++)
                    if (!strcmp(a->o.quotas_files[t[j]], fl[f]) && prev[j].had)
                        had = true, lim = prev[j].limit;
                write_file(fl[f], name, had, lim, e2, sizeof(e2));
            }
        pthread_mutex_unlock(&a->pin_lock);
        return rc;
    }
    pthread_mutex_unlock(&a->pin_lock);
    json_object_clear(*out);
    json_decref(*out);
    atomic_fetch_add(&a->quota_sets, 1);
    kvt_info("admin: quota '%s' set to %" PRIu64 " bytes on %d adapter(s)", name, bytes, n);
    return kvt_admin_quota_get(a, name, adapter, out, err, cap);
}

int kvt_admin_quota_del(struct kvt_admin *a, const char *in, int adapter, json_t **out, char *err,
                        size_t cap)
{
    char name[NAME_MAX_Q];
    int t[KVT_MAX_ADAPTERS], n = targets(a, adapter, t), rc = resolve(in, name, err, cap);
    if (rc || (rc = need_files(a, t, n, err, cap)))
        return rc;
    pthread_mutex_lock(&a->pin_lock);
    struct prev prev[KVT_MAX_ADAPTERS];
    int had = 0;
    for (int j = 0; j < n; j++) {
        struct kvt_l2_quota_info q;
        prev[j].had = kvt_l2_quota_get(a->l2s[t[j]], name, &q) == 0;
        prev[j].limit = q.limit;
        had += prev[j].had;
    }
    if (!had) {
        pthread_mutex_unlock(&a->pin_lock);
        snprintf(err, cap, "no quota named '%s'", name);
        return -ENOENT;
    }
    const char *fl[KVT_MAX_ADAPTERS];
    int nf = files(a, t, n, fl);
    for (int f = 0; f < nf && !rc; f++)
        rc = write_file(fl[f], name, false, 0, err, cap);
    if (!rc)
        for (int j = 0; j < n; j++)
            kvt_l2_quota_del(a->l2s[t[j]], name);
    pthread_mutex_unlock(&a->pin_lock);
    if (rc)
        return rc;
    atomic_fetch_add(&a->quota_deletes, 1);
    kvt_info("admin: quota '%s' removed from %d adapter(s)", name, had);
    *out = json_object();
    json_object_set_new(*out, "name", json_string(name));
    json_object_set_new(*out, "removed", json_integer(had));
    return 0;
}
