/*
 * Private to the admin calls (core/admin.h):
 *   admin.c        open/close, listing, removals, pins, status
 *   admin_quota.c  quotas at run time and their files
 *   admin_fetch.c  bringing keys from L2 into L1 (pin, warm)
 *   admin_jobs.c   the job thread: warm and verify
 *
 * Lock order: a->pin_lock, then a->lock, then a tier's own lock (taken
 * inside l1/l2 calls). No call into a tier is made with a->lock held.
 */
#ifndef KVT_CORE_ADMIN_INT_H
#define KVT_CORE_ADMIN_INT_H

#include "core/admin.h"
#include "key/kindex.h"

#include <pthread.h>

enum { JOB_WARM = 0, JOB_VERIFY = 1 };
enum { JOB_QUEUED = 0, JOB_RUNNING, JOB_DONE, JOB_FAILED, JOB_CANCELLED };

#define ADMIN_MAX_JOBS 64  /* jobs remembered (the oldest finished ones go) */
#define ADMIN_MAX_NAMED 32 /* corrupt objects named in a verify job's report */

struct admin_job {
    uint64_t id;
    int kind, state; /* state: guarded by a->lock */
    int tier;        /* verify: an adapter or KVT_ADMIN_ALL */
    char *ns;        /* a namespace's objects (owned), or NULL */
    kvt_key *keys;   /* or these (owned) */
    uint32_t nkeys;
    /* progress: written by the job thread, read by status (relaxed) */
    _Atomic uint64_t total, done, warmed, already, missing, failed, corrupt, removed;
    double asked, started, finished; /* unix seconds; 0: not yet */
    char error[256];                 /* guarded by a->lock */
    json_t *named;                   /* corrupt objects' names (guarded by a->lock) */
};

/* An admin pin: the object's L1 reference and the adapters that hold it. */
struct admin_pin {
    kvt_key key;
    uint32_t l1h;    /* the L1 reference held */
    uint32_t len;    /* its payload bytes */
    uint32_t l2mask; /* bit a: adapter a holds it (kvt_l2_hold) */
};

struct kvt_admin {
    struct kvt_core *core;
    struct kvt_l1 *l1;
    kvt_l2 *l2s[KVT_MAX_ADAPTERS];
    int nl2;
    struct kvt_admin_opts o;

    pthread_mutex_t pin_lock; /* guards pins, npins, cap_pins, pin_map, pinned_bytes;
                               * and serializes quota changes (their files) */
    struct admin_pin *pins;
    uint32_t npins, cap_pins;
    struct kvt_kindex pin_map; /* key -> index into pins */
    uint64_t pinned_bytes;

    pthread_mutex_t lock; /* guards the jobs below */
    pthread_cond_t cond;  /* a job was queued, or stop */
    struct admin_job *jobs[ADMIN_MAX_JOBS];
    uint32_t njobs;
    uint64_t next_id;
    bool stop;
    pthread_t thread;
    bool thread_started;

    /* counters: atomics, any thread */
    _Atomic uint64_t deletes, deleted_objects, clears, cleared_objects, cleared_bytes;
    _Atomic uint64_t quota_sets, quota_deletes, npinned, nunpinned;
    _Atomic uint64_t warm_jobs, warmed_objects, verify_jobs, verified_objects;
    _Atomic uint64_t corrupt_found, corrupt_removed;
};

/* admin.c */
/* The object name the listing shows and prefixes match: the
 * nixl_store_dynamic file name without ".bin". out: KVT_NAME_MAX + 1. */
void kvt_admin_name(const kvt_key *k, char *out);
/* Keys of every READY L2 entry (of namespace ns, when not NULL) in the
 * adapters of tier (an adapter or KVT_ADMIN_ALL), each once: *n keys to
 * free(). */
kvt_key *kvt_admin_l2_keys(struct kvt_admin *a, int tier, const char *ns, uint32_t *n);

/* admin_fetch.c: bringing keys into L1. */
enum { FK_MISS = 0, FK_L1, FK_L2, FK_LOADED, FK_FAILED };
struct admin_fetch {
    uint32_t n;
    const kvt_key *keys;
    struct kvt_l1_ref *refs; /* FK_L1 (with ref_l1), FK_LOADED: a reference each */
    uint8_t *st;
    int8_t *src;                       /* FK_L2: the adapter to load from */
    uint32_t *len;                     /* FK_L1, FK_L2, FK_LOADED: payload bytes */
    kvt_l2_task *lk[KVT_MAX_ADAPTERS]; /* lookups (their hits are pinned until done) */
    bool ref_l1;
};
/* Where each key is: FK_L1 (a reference taken when ref_l1), FK_L2 (found
 * and pinned by a lookup in the lowest adapter that has it), or FK_MISS. */
void kvt_admin_fetch_find(struct kvt_admin *a, struct admin_fetch *f, const kvt_key *keys,
                          uint32_t n, bool ref_l1);
/* Load the FK_L2 keys into L1 (kept, not temporary): FK_LOADED with a
 * reference, or FK_FAILED (L1 full, a failed load). Returns how many
 * loaded. */
uint32_t kvt_admin_fetch_load(struct kvt_admin *a, struct admin_fetch *f);
/* Release the lookups' pins and, unless keep, every reference; free. */
void kvt_admin_fetch_done(struct kvt_admin *a, struct admin_fetch *f, bool keep);

/* admin_jobs.c */
int kvt_admin_jobs_start(struct kvt_admin *a);
void kvt_admin_jobs_stop(struct kvt_admin *a);
json_t *kvt_admin_job_json_locked(const struct admin_job *j);
int kvt_admin_job_add(struct kvt_admin *a, struct admin_job *j, json_t **out, char *err,
                      size_t cap);

#endif
