/*
 * Operator operations: status (the server's status document), delete
 * (keys, from every tier) and purge (a namespace, everything, or crash
 * residue, through the adapters). status and purge are admin operations
 * (KVT_OPF_ADMIN in their rows); delete and purge run on the core's worker
 * pool.
 */
#include "common/util.h"
#include "front/native/native_int.h"
#include "key/key.h"
#include "kvtier/error.h"
#include "ops/purge.h"
#include "ops/scan.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

void kvt_op_status(struct kvt_native *n, struct request *q)
{
    json_t *st = kvt_server_status(n->host);
    kvt_mp_pack_json(&q->r->pk, st);
    json_decref(st);
}

struct delete_job {
    struct kvt_job job;
    struct kvt_native *n;
    struct reply *r;
    kvt_key *keys;
    uint32_t nk;
};

static void delete_job_fn(struct kvt_job *job, void *ctx)
{
    (void)ctx;
    struct delete_job *j = (struct delete_job *)job;
    struct kvt_core *core = j->n->env->core;
    int nl2 = kvt_core_nl2(core);
    uint32_t nskip = 0;
    uint32_t *skipped = kvt_xmalloc((j->nk ? j->nk : 1) * sizeof(uint32_t));
    uint32_t *l2n = kvt_xcalloc(nl2 ? (size_t)nl2 : 1, sizeof(uint32_t));
    /* a key read-locked by a lease (lookup -> retrieve) is skipped in every
     * tier: it stays whole and the reply names it */
    uint32_t l1n = kvt_core_delete(core, j->keys, j->nk, l2n, skipped, &nskip);
    msgpack_packer *pk = &j->r->pk;
    msgpack_pack_map(pk, 3);
    kvt_mp_str0(pk, "removed_l1");
    msgpack_pack_uint32(pk, l1n);
    kvt_mp_str0(pk, "removed_l2");
    msgpack_pack_array(pk, (uint32_t)nl2);
    for (int a = 0; a < nl2; a++)
        msgpack_pack_uint32(pk, l2n[a]);
    kvt_mp_str0(pk, "skipped");
    msgpack_pack_array(pk, nskip);
    for (uint32_t i = 0; i < nskip; i++)
        msgpack_pack_uint32(pk, skipped[i]);
    free(skipped);
    free(l2n);
    kvt_reply_post(j->n->host, j->r);
    free(j->keys);
    free(j);
}

void kvt_op_delete(struct kvt_native *n, struct request *q)
{
    struct delete_job *j = kvt_xcalloc(1, sizeof(*j));
    if (kvt_native_keys(n, q, &j->keys, &j->nk)) {
        free(j);
        return;
    }
    j->n = n;
    j->r = q->r;
    q->r = NULL;
    j->job.fn = delete_job_fn;
    kvt_core_defer(n->env->core, &j->job);
}

struct purge_job {
    struct kvt_job job;
    struct kvt_native *n;
    struct reply *r;
    struct kvt_purge_req q;
    char root[4096]; /* "" = every adapter */
};

/* On a worker: purge through every selected adapter (core.h). */
static void purge_job_fn(struct kvt_job *job, void *ctx)
{
    (void)ctx;
    struct purge_job *j = (struct purge_job *)job;
    json_t *out = NULL;
    int err = kvt_core_purge(j->n->env->core, j->root, &j->q, &out);
    if (err == KVT_E_NOTFOUND)
        kvt_reply_error(j->r, KVT_E_NOTFOUND, "no L2 adapter of this server keeps its files in %s",
                        j->root);
    else if (err)
        kvt_reply_error(j->r, err, "purge failed: %s%s", kvt_strerror(err),
                        err == -EBUSY ? " (the start-up scan is still running; retry)" : "");
    else
        kvt_mp_pack_json(&j->r->pk, out);
    json_decref(out);
    kvt_reply_post(j->n->host, j->r);
    free(j);
}

/* purge {namespace: str | all: true | tmp: true, root?: str, max?: uint} */
void kvt_op_purge(struct kvt_native *n, struct request *q)
{
    const char *why = NULL, *ns = NULL, *root = NULL;
    size_t nsl = 0, rl = 0;
    bool all = false, tmp = false;
    uint64_t max = 0;
    int rc;
    /* a namespace is a model: it spans every tenant's salt (an admin
     * operation: checked before it came here) */
    if ((rc = kvt_mp_str(&q->body, "namespace", false, &ns, &nsl, &why)) ||
        (rc = kvt_mp_str(&q->body, "root", false, &root, &rl, &why)) ||
        (rc = kvt_mp_bool(&q->body, "all", &all, &why)) ||
        (rc = kvt_mp_bool(&q->body, "tmp", &tmp, &why)) ||
        (rc = kvt_mp_u64(&q->body, "max", false, &max, &why))) {
        kvt_reply_error(q->r, rc, "%s", why);
        return;
    }
    struct purge_job *j = kvt_xcalloc(1, sizeof(*j));
    if ((ns != NULL) + all + tmp != 1) {
        kvt_reply_error(q->r, KVT_E_BADREQ, "purge needs exactly one of namespace, all, tmp");
        free(j);
        return;
    }
    if (ns && nsl < sizeof(j->q.ns)) {
        memcpy(j->q.ns, ns, nsl);
        j->q.ns[nsl] = 0;
    }
    if (ns && (nsl >= sizeof(j->q.ns) || strlen(j->q.ns) != nsl || !kvt_ns_name_ok(j->q.ns))) {
        kvt_reply_error(q->r, KVT_E_BADREQ, "\"%.*s\" is not a namespace name",
                        (int)KVT_MIN(nsl, 300), ns);
        free(j);
        return;
    }
    if (root && (rl == 0 || rl >= sizeof(j->root) || memchr(root, 0, rl))) {
        kvt_reply_error(q->r, KVT_E_BADREQ, "\"root\" must be a directory path");
        free(j);
        return;
    }
    if (root)
        memcpy(j->root, root, rl);
    j->q.what = ns ? KVT_PURGE_NAMESPACE : all ? KVT_PURGE_ALL : KVT_PURGE_TMP;
    j->q.max = (uint32_t)KVT_MIN(max, KVT_MAX_BATCH);
    j->n = n;
    j->r = q->r;
    q->r = NULL;
    j->job.fn = purge_job_fn;
    kvt_core_defer(n->env->core, &j->job);
}
