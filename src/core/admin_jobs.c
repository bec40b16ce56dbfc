/*
 * Admin calls: the jobs (warm, verify) and their thread, "admin". Jobs run
 * one at a time in the order asked; each works in batches, so that a stop
 * ends it between two batches. Progress is a set of relaxed atomics the
 * status reads (statistics: no ordering with anything else is needed).
 */
#include "common/log.h"
#include "common/util.h"
#include "core/admin_int.h"
#include "kvtier/error.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define WARM_BATCH 64
#define VERIFY_BATCH 32

static double unix_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static bool stopping(struct kvt_admin *a)
{
    pthread_mutex_lock(&a->lock);
    bool s = a->stop;
    pthread_mutex_unlock(&a->lock);
    return s;
}

static const char *const kinds[] = {"warm", "verify"};
static const char *const states[] = {"queued", "running", "done", "failed", "cancelled"};

json_t *kvt_admin_job_json_locked(const struct admin_job *j)
{
    json_t *o = json_object();
    json_object_set_new(o, "id", json_integer((json_int_t)j->id));
    json_object_set_new(o, "kind", json_string(kinds[j->kind]));
    json_object_set_new(o, "state", json_string(states[j->state]));
    json_object_set_new(o, "namespace", j->ns ? json_string(j->ns) : json_null());
    json_object_set_new(o, "keys", json_integer(j->nkeys));
#define N(f)                                                                                       \
    json_object_set_new(                                                                           \
        o, #f, json_integer((json_int_t)atomic_load_explicit(&j->f, memory_order_relaxed)))
    N(total);
    N(done);
    N(failed);
    if (j->kind == JOB_WARM) {
        N(warmed);
        N(already);
        N(missing);
    } else {
        N(corrupt);
        N(removed);
        N(missing);
        json_object_set(o, "corrupt_objects", j->named);
    }
#undef N
    uint64_t total = atomic_load_explicit(&j->total, memory_order_relaxed);
    uint64_t done = atomic_load_explicit(&j->done, memory_order_relaxed);
    json_object_set_new(o, "progress",
                        json_real(j->state == JOB_DONE ? 1.0
                                  : total              ? (double)done / (double)total
                                                       : 0.0));
    json_object_set_new(o, "asked_unix", json_real(j->asked));
    json_object_set_new(o, "started_unix", j->started ? json_real(j->started) : json_null());
    json_object_set_new(o, "finished_unix", j->finished ? json_real(j->finished) : json_null());
    json_object_set_new(o, "error", j->error[0] ? json_string(j->error) : json_null());
    return o;
}

static void job_free(struct admin_job *j)
{
    free(j->ns);
    free(j->keys);
    json_decref(j->named);
    free(j);
}

/* ------------------------------------------------------------- warm */

static void warm_batch(struct kvt_admin *a, struct admin_job *j, const kvt_key *keys, uint32_t n)
{
    struct admin_fetch f;
    kvt_admin_fetch_find(a, &f, keys, n, false);
    uint32_t loaded = kvt_admin_fetch_load(a, &f);
    uint64_t already = 0, missing = 0, failed = 0;
    for (uint32_t i = 0; i < n; i++) {
        already += f.st[i] == FK_L1;
        missing += f.st[i] == FK_MISS;
        failed += f.st[i] == FK_FAILED;
    }
    kvt_admin_fetch_done(a, &f, false);
    atomic_fetch_add_explicit(&j->warmed, loaded, memory_order_relaxed);
    atomic_fetch_add_explicit(&j->already, already, memory_order_relaxed);
    atomic_fetch_add_explicit(&j->missing, missing, memory_order_relaxed);
    atomic_fetch_add_explicit(&j->failed, failed, memory_order_relaxed);
    atomic_fetch_add_explicit(&j->done, n, memory_order_relaxed);
    atomic_fetch_add(&a->warmed_objects, loaded);
}

static void run_warm(struct kvt_admin *a, struct admin_job *j)
{
    uint32_t n = j->nkeys;
    kvt_key *keys = j->keys;
    kvt_key *mine = NULL;
    if (j->ns)
        keys = mine = kvt_admin_l2_keys(a, KVT_ADMIN_ALL, j->ns, &n);
    atomic_store_explicit(&j->total, n, memory_order_relaxed);
    for (uint32_t i = 0; i < n && !stopping(a); i += WARM_BATCH)
        warm_batch(a, j, keys + i, KVT_MIN(WARM_BATCH, n - i));
    free(mine);
    kvt_info("admin: warm job %llu: %llu of %u object(s) loaded into L1 (%llu there already, "
             "%llu in no L2, %llu failed)",
             (unsigned long long)j->id, (unsigned long long)atomic_load(&j->warmed), n,
             (unsigned long long)atomic_load(&j->already),
             (unsigned long long)atomic_load(&j->missing),
             (unsigned long long)atomic_load(&j->failed));
}

/* ----------------------------------------------------------- verify */

static void name_corrupt(struct kvt_admin *a, struct admin_job *j, const kvt_key *k)
{
    char name[KVT_NAME_MAX + 1];
    kvt_admin_name(k, name);
    pthread_mutex_lock(&a->lock);
    if (json_array_size(j->named) < ADMIN_MAX_NAMED)
        json_array_append_new(j->named, json_string(name));
    pthread_mutex_unlock(&a->lock);
}

/*
 * Read keys[0..n) from adapter ad as a load does: a lookup pins them, a
 * load reads and checks them (header, key, length, checksum; the serde
 * stage decodes), and the engine removes what fails as corrupt, as on any
 * load. What is still indexed after a corrupt read (an engine that leaves
 * it) is deleted here.
 */
static void verify_batch(struct kvt_admin *a, struct admin_job *j, int ad, const kvt_key *keys,
                         uint32_t n)
{
    kvt_l2 *l2 = a->l2s[ad];
    kvt_l2_task *lk = kvt_l2_task_new(KVT_L2_LOOKUP, n);
    memcpy(lk->keys, keys, n * sizeof(kvt_key));
    kvt_l2_run(l2, lk);
    uint32_t hits = (uint32_t)kvt_bm_count(lk->ok, n), k = 0;
    atomic_fetch_add_explicit(&j->missing, n - hits, memory_order_relaxed);
    kvt_l2_task *ld = kvt_l2_task_new(KVT_L2_LOAD, hits ? hits : 1);
    ld->n = hits;
    for (uint32_t i = 0; i < n; i++) {
        if (!kvt_bm_test(lk->ok, i))
            continue;
        ld->keys[k] = keys[i];
        ld->bufs[k].len = lk->meta[i].len;
        ld->bufs[k].ptr = kvt_xmalloc(lk->meta[i].len ? lk->meta[i].len : 1);
        k++;
    }
    kvt_l2_run(l2, ld);
    kvt_l2_unlock(l2, ld->keys, ld->n); /* the lookup's pins */
    uint64_t ok = 0, corrupt = 0, removed = 0, failed = 0;
    for (uint32_t i = 0; i < ld->n; i++) {
        int code = kvt_l2_task_code(ld, i);
        if (code == 0) {
            ok++;
        } else if (code == KVT_E_CORRUPT || code == KVT_E_BADREQ) {
            corrupt++;
            name_corrupt(a, j, &ld->keys[i]);
            if (!kvt_l2_indexed(l2, &ld->keys[i]) || kvt_l2_delete(l2, &ld->keys[i], 1, NULL))
                removed++;
        } else {
            failed++;
        }
        free(ld->bufs[i].ptr);
    }
    kvt_l2_task_free(ld);
    kvt_l2_task_free(lk);
    atomic_fetch_add_explicit(&j->corrupt, corrupt, memory_order_relaxed);
    atomic_fetch_add_explicit(&j->removed, removed, memory_order_relaxed);
    atomic_fetch_add_explicit(&j->failed, failed, memory_order_relaxed);
    atomic_fetch_add_explicit(&j->done, n, memory_order_relaxed);
    atomic_fetch_add(&a->verified_objects, ok + corrupt);
    atomic_fetch_add(&a->corrupt_found, corrupt);
    atomic_fetch_add(&a->corrupt_removed, removed);
}

static void run_verify(struct kvt_admin *a, struct admin_job *j)
{
    uint32_t nk[KVT_MAX_ADAPTERS] = {0};
    kvt_key *keys[KVT_MAX_ADAPTERS] = {0};
    uint64_t total = 0;
    for (int ad = 0; ad < a->nl2; ad++) {
        if (j->tier != KVT_ADMIN_ALL && j->tier != ad)
            continue;
        keys[ad] = kvt_admin_l2_keys(a, ad, j->ns, &nk[ad]);
        total += nk[ad];
    }
    atomic_store_explicit(&j->total, total, memory_order_relaxed);
    for (int ad = 0; ad < a->nl2; ad++) {
        for (uint32_t i = 0; i < nk[ad] && !stopping(a); i += VERIFY_BATCH)
            verify_batch(a, j, ad, keys[ad] + i, KVT_MIN(VERIFY_BATCH, nk[ad] - i));
        free(keys[ad]);
    }
    uint64_t corrupt = atomic_load(&j->corrupt);
    if (corrupt)
        kvt_warn("admin: verify job %llu: %llu of %llu object(s) corrupt, %llu removed",
                 (unsigned long long)j->id, (unsigned long long)corrupt, (unsigned long long)total,
                 (unsigned long long)atomic_load(&j->removed));
    else
        kvt_info("admin: verify job %llu: %llu object(s) read, none corrupt",
                 (unsigned long long)j->id, (unsigned long long)total);
}

/* -------------------------------------------------------- the thread */

static struct admin_job *next_queued_locked(struct kvt_admin *a)
{
    for (uint32_t i = 0; i < a->njobs; i++)
        if (a->jobs[i]->state == JOB_QUEUED)
            return a->jobs[i];
    return NULL;
}

static void *job_main(void *arg)
{
    struct kvt_admin *a = arg;
    pthread_setname_np(pthread_self(), "admin");
    pthread_mutex_lock(&a->lock);
    for (;;) {
        struct admin_job *j;
        while (!a->stop && !(j = next_queued_locked(a)))
            pthread_cond_wait(&a->cond, &a->lock);
        if (a->stop)
            break;
        j->state = JOB_RUNNING;
        j->started = unix_now();
        pthread_mutex_unlock(&a->lock);
        if (j->kind == JOB_WARM)
            run_warm(a, j);
        else
            run_verify(a, j);
        pthread_mutex_lock(&a->lock);
        j->state = a->stop ? JOB_CANCELLED : JOB_DONE;
        j->finished = unix_now();
    }
    for (uint32_t i = 0; i < a->njobs; i++)
        if (a->jobs[i]->state == JOB_QUEUED)
            a->jobs[i]->state = JOB_CANCELLED;
    pthread_mutex_unlock(&a->lock);
    return NULL;
}

int kvt_admin_jobs_start(struct kvt_admin *a)
{
    int rc = pthread_create(&a->thread, NULL, job_main, a);
    if (rc)
        return -rc;
    a->thread_started = true;
    return 0;
}

void kvt_admin_jobs_stop(struct kvt_admin *a)
{
    pthread_mutex_lock(&a->lock);
    a->stop = true;
    pthread_cond_broadcast(&a->cond);
    pthread_mutex_unlock(&a->lock);
    if (a->thread_started)
        pthread_join(a->thread, NULL);
    a->thread_started = false;
    for (uint32_t i = 0; i < a->njobs; i++)
        job_free(a->jobs[i]);
    a->njobs = 0;
}

int kvt_admin_job_add(struct kvt_admin *a, struct admin_job *j, json_t **out, char *err, size_t cap)
{
    pthread_mutex_lock(&a->lock);
    if (a->njobs == ADMIN_MAX_JOBS) { /* forget the oldest finished job */
        uint32_t i = 0;
        while (i < a->njobs && a->jobs[i]->state <= JOB_RUNNING)
            i++;
        if (i == a->njobs) {
            pthread_mutex_unlock(&a->lock);
            snprintf(err, cap, "%d jobs are queued or running: try again later", ADMIN_MAX_JOBS);
            job_free(j);
            return -EBUSY;
        }
        job_free(a->jobs[i]);
        memmove(&a->jobs[i], &a->jobs[i + 1], (a->njobs - i - 1) * sizeof(a->jobs[0]));
        a->njobs--;
    }
    j->id = a->next_id++;
    j->state = JOB_QUEUED;
    j->asked = unix_now();
    j->named = json_array();
    a->jobs[a->njobs++] = j;
    *out = kvt_admin_job_json_locked(j);
    pthread_cond_signal(&a->cond);
    pthread_mutex_unlock(&a->lock);
    if (j->kind == JOB_WARM)
        atomic_fetch_add(&a->warm_jobs, 1);
    else
        atomic_fetch_add(&a->verify_jobs, 1);
    return 0;
}

int kvt_admin_warm(struct kvt_admin *a, const kvt_key *keys, uint32_t n, const char *ns,
                   json_t **out, char *err, size_t cap)
{
    if (ns && !kvt_admin_ns_known(ns)) {
        snprintf(err, cap, "unknown namespace '%.200s': this server has never seen it", ns);
        return -ENOENT;
    }
    struct admin_job *j = kvt_xcalloc(1, sizeof(*j));
    j->kind = JOB_WARM;
    j->tier = KVT_ADMIN_ALL;
    if (ns) {
        j->ns = kvt_xstrdup(ns);
    } else {
        j->keys = kvt_xmalloc((n ? n : 1) * sizeof(kvt_key));
        if (n)
            memcpy(j->keys, keys, n * sizeof(kvt_key));
        j->nkeys = n;
    }
    kvt_info("admin: warm job asked (%s%s%s, %u key(s))", ns ? "namespace " : "keys", ns ? ns : "",
             "", n);
    return kvt_admin_job_add(a, j, out, err, cap);
}

int kvt_admin_verify(struct kvt_admin *a, int tier, const char *ns, json_t **out, char *err,
                     size_t cap)
{
    if (ns && !kvt_admin_ns_known(ns)) {
        snprintf(err, cap, "unknown namespace '%.200s': this server has never seen it", ns);
        return -ENOENT;
    }
    if (tier == KVT_ADMIN_L1) {
        snprintf(err, cap, "verify reads L2 tiers (L1 is memory, checked as it came in)");
        return -EINVAL;
    }
    struct admin_job *j = kvt_xcalloc(1, sizeof(*j));
    j->kind = JOB_VERIFY;
    j->tier = tier;
    j->ns = ns ? kvt_xstrdup(ns) : NULL;
    kvt_info("admin: verify job asked (%s, %s)",
             tier == KVT_ADMIN_ALL ? "every L2 adapter" : kvt_l2_name(a->l2s[tier]),
             ns ? ns : "every namespace");
    return kvt_admin_job_add(a, j, out, err, cap);
}

json_t *kvt_admin_job(struct kvt_admin *a, uint64_t id)
{
    json_t *o = NULL;
    pthread_mutex_lock(&a->lock);
    for (uint32_t i = 0; i < a->njobs && !o; i++)
        if (a->jobs[i]->id == id)
            o = kvt_admin_job_json_locked(a->jobs[i]);
    pthread_mutex_unlock(&a->lock);
    return o;
}
