/*
 * s3 adapter: multipart upload, for objects above s3_multipart_threshold_mb
 * (servers refuse a single PUT above their limit: AWS at 5 GiB, some
 * gateways far lower; parts also spread one large object over several
 * connections).
 *
 *   POST   /key?uploads                     (x-amz-meta-kvt goes here)
 *   PUT    /key?partNumber=N&uploadId=U     per part, all queued at once:
 *                                           s3_num_io_threads cap them
 *   POST   /key?uploadId=U                  the part list with the ETags
 *   DELETE /key?uploadId=U                  when a part or the completion failed
 *
 * Everything after the first request runs on the I/O thread, in completion
 * callbacks: no lock is needed for the upload's own state. The caller's
 * request completes (its done runs) only after every part finished, since
 * the parts read the caller's buffers; a failed upload completes it first
 * and then aborts, so the abort's round trip does not delay the store's
 * answer. An upload the abort could not reach (breaker open, SIGKILL) is
 * left to the server; docs/remote-tiers.md recommends a lifecycle rule.
 */
#include "common/log.h"
#include "common/util.h"
#include "l2/s3/s3_int.h"
#include "l2/s3/sigv4.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct mpu {
    struct s3_engine *e;
    struct s3_req *parent; /* the caller's PUT; NULL once completed */
    struct s3_req ctl;     /* create, then complete or abort */
    struct s3_req *parts;
    uint32_t nparts, left;
    bool failed;
    char upload_id[512];
    char *xml; /* the CompleteMultipartUpload body */
};

static void mpu_free(struct mpu *m)
{
    for (uint32_t i = 0; i < m->nparts; i++)
        kvt_s3_req_clear(&m->parts[i]);
    kvt_s3_req_clear(&m->ctl);
    free(m->parts);
    free(m->xml);
    free(m);
}

/* Keep the first failure's outcome and error fields for the caller. */
static void note_failure(struct mpu *m, const struct s3_req *r, const char *what)
{
    struct s3_req *p = m->parent;
    if (m->failed || !p)
        return;
    m->failed = true;
    p->outcome = r->outcome == S3_OK ? S3_SERVER : r->outcome;
    p->status = r->status;
    p->curl_rc = r->curl_rc;
    snprintf(p->err_code, sizeof(p->err_code), "%s", r->err_code);
    snprintf(p->err_msg, sizeof(p->err_msg), "%s: %.200s", what,
             r->err_msg[0] ? r->err_msg : kvt_s3_outcome_name(r->outcome));
}

/* Hand the caller's request back (on the I/O thread, as a PUT would). */
static void complete_parent(struct mpu *m)
{
    struct s3_req *p = m->parent;
    m->parent = NULL;
    if (m->failed)
        atomic_fetch_add(&m->e->mpu_failed, 1);
    else
        atomic_fetch_add(&m->e->mpu_ok, 1);
    if (p->done)
        p->done(m->e, p);
}

static int set_query(struct s3_req *r, const struct kvt_sigv4_pair *q, size_t n)
{
    char buf[2048]; /* a 511-byte id percent-encoded, and the part number */
    int len = kvt_sigv4_canonical_query(q, n, buf, sizeof(buf));
    if (len < 0)
        return len;
    free(r->query);
    r->query = kvt_xstrdup(buf);
    return 0;
}

static void abort_done(struct s3_engine *e, struct s3_req *r)
{
    struct mpu *m = r->ctx;
    if (r->outcome != S3_OK && r->outcome != S3_NOTFOUND)
        kvt_warn("%s: could not abort the multipart upload of %s (%s): the server keeps its "
                 "parts until a lifecycle rule removes them",
                 e->l2->name, r->path,
                 r->err_msg[0] ? r->err_msg : kvt_s3_outcome_name(r->outcome));
    mpu_free(m);
}

/* Complete the caller (failed), then DELETE ?uploadId so the server drops
 * the parts. */
static void fail_and_abort(struct mpu *m)
{
    complete_parent(m);
    if (!m->upload_id[0]) {
        mpu_free(m);
        return;
    }
    struct s3_req *c = &m->ctl;
    kvt_s3_req_clear(c);
    c->op = S3_MPU_ABORT;
    c->cond[0] = 0;
    c->done = abort_done;
    c->ctx = m;
    const struct kvt_sigv4_pair q[] = {{"uploadId", m->upload_id}};
    if (set_query(c, q, 1) < 0) {
        mpu_free(m);
        return;
    }
    kvt_s3_submit_req(m->e, c);
}

static void complete_done(struct s3_engine *e, struct s3_req *r)
{
    (void)e;
    struct mpu *m = r->ctx;
    /* S3 may answer 200 and report the failure in the body */
    if (r->outcome == S3_OK && r->body && strstr(r->body, "<Error>")) {
        kvt_s3_xml_field(r->body, NULL, "Code", r->err_code, sizeof(r->err_code));
        kvt_s3_xml_field(r->body, NULL, "Message", r->err_msg, sizeof(r->err_msg));
        r->outcome =
            strcmp(r->err_code, "InternalError") == 0 || strcmp(r->err_code, "SlowDown") == 0
                ? S3_SERVER
                : S3_REJECTED;
    }
    if (r->outcome != S3_OK) {
        note_failure(m, r, "CompleteMultipartUpload");
        fail_and_abort(m);
        return;
    }
    m->parent->outcome = S3_OK;
    m->parent->status = r->status;
    complete_parent(m);
    mpu_free(m);
}

static void send_complete(struct mpu *m)
{
    size_t cap = 64 + (size_t)m->nparts * (64 + sizeof(m->parts[0].etag)), len = 0;
    m->xml = kvt_xmalloc(cap);
    len += (size_t)snprintf(m->xml + len, cap - len, "<CompleteMultipartUpload>");
    for (uint32_t i = 0; i < m->nparts; i++)
        len += (size_t)snprintf(m->xml + len, cap - len,
                                "<Part><PartNumber>%u</PartNumber><ETag>%s</ETag></Part>", i + 1,
                                m->parts[i].etag);
    len += (size_t)snprintf(m->xml + len, cap - len, "</CompleteMultipartUpload>");
    struct s3_req *c = &m->ctl;
    kvt_s3_req_clear(c);
    c->op = S3_MPU_COMPLETE;
    c->mem = m->xml;
    c->mlen = len;
    /* the object's condition (If-None-Match: * with a shared budget) holds
     * where the object appears: at the completion */
    snprintf(c->cond, sizeof(c->cond), "%s", m->parent->cond);
    c->done = complete_done;
    c->ctx = m;
    const struct kvt_sigv4_pair q[] = {{"uploadId", m->upload_id}};
    if (set_query(c, q, 1) < 0) {
        snprintf(c->err_msg, sizeof(c->err_msg), "upload id too long");
        c->outcome = S3_REJECTED;
        note_failure(m, c, "CompleteMultipartUpload");
        fail_and_abort(m);
        return;
    }
    kvt_s3_submit_req(m->e, c);
}

static void part_done(struct s3_engine *e, struct s3_req *r)
{
    (void)e;
    struct mpu *m = r->ctx;
    if (r->outcome == S3_OK && !r->etag[0]) {
        r->outcome = S3_BADDATA;
        snprintf(r->err_msg, sizeof(r->err_msg), "the server answered part %u without an ETag",
                 r->i + 1);
    }
    if (r->outcome != S3_OK)
        note_failure(m, r, "UploadPart");
    if (--m->left)
        return;
    if (m->failed)
        fail_and_abort(m);
    else
        send_complete(m);
}

static void create_done(struct s3_engine *e, struct s3_req *r)
{
    struct mpu *m = r->ctx;
    if (r->outcome == S3_OK &&
        !kvt_s3_xml_field(r->body, NULL, "UploadId", m->upload_id, sizeof(m->upload_id))) {
        r->outcome = S3_BADDATA;
        snprintf(r->err_msg, sizeof(r->err_msg), "no UploadId in the answer");
    }
    if (r->outcome != S3_OK) {
        note_failure(m, r, "CreateMultipartUpload");
        m->upload_id[0] = 0;
        fail_and_abort(m);
        return;
    }
    struct s3_req *p = m->parent;
    uint64_t total = kvt_s3_body_len(p);
    m->nparts = (uint32_t)((total + e->mpu_part - 1) / e->mpu_part);
    m->parts = kvt_xcalloc(m->nparts, sizeof(struct s3_req));
    m->left = m->nparts;
    for (uint32_t i = 0; i < m->nparts; i++) {
        struct s3_req *q = &m->parts[i];
        q->op = S3_MPU_PART;
        memcpy(q->path, p->path, sizeof(q->path));
        q->put_hdr = p->put_hdr;
        q->payload = p->payload;
        q->plen = p->plen;
        q->boff = (uint64_t)i * e->mpu_part;
        q->blen_tx = KVT_MIN(e->mpu_part, total - q->boff);
        q->done = part_done;
        q->ctx = m;
        q->i = i;
        char num[16];
        snprintf(num, sizeof(num), "%u", i + 1);
        const struct kvt_sigv4_pair qs[] = {{"partNumber", num}, {"uploadId", m->upload_id}};
        int qrc = set_query(q, qs, 2); /* the id is < 512 bytes: the query fits */
        KVT_ASSERT(qrc == 0);
        q->next = i + 1 < m->nparts ? &m->parts[i + 1] : NULL;
    }
    kvt_s3_submit_reqs(e, &m->parts[0]);
}

void kvt_s3_put_multipart(struct s3_engine *e, struct s3_req *r)
{
    struct mpu *m = kvt_xcalloc(1, sizeof(*m));
    m->e = e;
    m->parent = r;
    r->outcome = S3_OK;
    r->status = 0;
    r->err_code[0] = r->err_msg[0] = 0;
    struct s3_req *c = &m->ctl;
    c->op = S3_MPU_CREATE;
    memcpy(c->path, r->path, sizeof(c->path));
    memcpy(c->meta, r->meta, sizeof(c->meta));
    c->done = create_done;
    c->ctx = m;
    const struct kvt_sigv4_pair q[] = {{"uploads", ""}};
    int qrc = set_query(c, q, 1);
    KVT_ASSERT(qrc == 0);
    kvt_s3_submit_req(e, c);
}

/* ----------------------------------------------- stale upload sweep */

/* The start-up sweep: ListMultipartUploads under the prefix, page by page,
 * and an AbortMultipartUpload for each upload initiated more than
 * stale_upload_s ago. Uploads younger than that may belong to another
 * server sharing the bucket and are left alone. All on the I/O thread. */
struct sweep {
    struct s3_engine *e;
    struct s3_req list;
    char key_marker[1100], id_marker[600];
    uint32_t aborts_left; /* aborts in flight; the sweep ends with the last */
    bool more;            /* another page follows */
};

struct sweep_abort {
    struct s3_req r;
    struct sweep *sw;
};

static void sweep_page(struct sweep *sw);

static bool stopping(struct s3_engine *e)
{
    pthread_mutex_lock(&e->lock);
    bool s = e->stop;
    pthread_mutex_unlock(&e->lock);
    return s;
}

static void sweep_next(struct sweep *sw)
{
    if (sw->aborts_left)
        return;
    if (sw->more && !stopping(sw->e)) {
        sweep_page(sw);
        return;
    }
    kvt_s3_req_clear(&sw->list);
    free(sw);
}

static void sweep_abort_done(struct s3_engine *e, struct s3_req *r)
{
    struct sweep_abort *a = (struct sweep_abort *)r;
    struct sweep *sw = a->sw;
    if (r->outcome == S3_OK || r->outcome == S3_NOTFOUND) {
        atomic_fetch_add(&e->mpu_stale, 1);
        kvt_info("%s: aborted a stale multipart upload of %s", e->l2->name, r->path);
    }
    kvt_s3_req_clear(r);
    free(a);
    sw->aborts_left--;
    sweep_next(sw);
}

static void sweep_list_done(struct s3_engine *e, struct s3_req *r)
{
    struct sweep *sw = r->ctx;
    sw->more = false;
    if (r->outcome != S3_OK || !r->body) {
        if (r->outcome != S3_NOTFOUND)
            kvt_info("%s: no sweep of stale multipart uploads: ListMultipartUploads answered "
                     "%ld %s (%s); a bucket lifecycle rule can remove them",
                     e->l2->name, r->status, r->err_code,
                     r->err_msg[0] ? r->err_msg : kvt_s3_outcome_name(r->outcome));
        sweep_next(sw);
        return;
    }
    int64_t cutoff_ms = (int64_t)time(NULL) * 1000 - (int64_t)(e->stale_upload_s * 1000);
    struct s3_req *chain = NULL, **tail = &chain;
    char key[1024], id[512], when[64];
    for (const char *p = r->body; (p = strstr(p, "<Upload>"));) {
        const char *z = strstr(p, "</Upload>");
        if (!z)
            break;
        if (kvt_s3_xml_field(p, z, "Key", key, sizeof(key)) &&
            kvt_s3_xml_field(p, z, "UploadId", id, sizeof(id)) &&
            kvt_s3_xml_field(p, z, "Initiated", when, sizeof(when)) &&
            strncmp(key, e->prefix, e->prefix_len) == 0) {
            int64_t t = kvt_s3_iso_ms(when);
            struct sweep_abort *a = kvt_xcalloc(1, sizeof(*a));
            int bl = snprintf(a->r.path, sizeof(a->r.path), "%s/", e->base);
            const struct kvt_sigv4_pair q[] = {{"uploadId", id}};
            if (t > 0 && t < cutoff_ms &&
                kvt_sigv4_uri_encode(key, strlen(key), false, a->r.path + bl,
                                     sizeof(a->r.path) - (size_t)bl) >= 0 &&
                set_query(&a->r, q, 1) == 0) {
                a->r.op = S3_MPU_ABORT;
                a->r.done = sweep_abort_done;
                a->r.ctx = sw;
                a->sw = sw;
                sw->aborts_left++;
                *tail = &a->r;
                tail = &a->r.next;
            } else {
                kvt_s3_req_clear(&a->r);
                free(a);
            }
        }
        p = z;
    }
    char trunc[16] = "";
    kvt_s3_xml_field(r->body, NULL, "IsTruncated", trunc, sizeof(trunc));
    if (strcmp(trunc, "true") == 0 &&
        kvt_s3_xml_field(r->body, NULL, "NextKeyMarker", sw->key_marker, sizeof(sw->key_marker))) {
        kvt_s3_xml_field(r->body, NULL, "NextUploadIdMarker", sw->id_marker, sizeof(sw->id_marker));
        sw->more = true;
    }
    if (chain)
        kvt_s3_submit_reqs(e, chain);
    else
        sweep_next(sw);
}

static void sweep_page(struct sweep *sw)
{
    struct s3_engine *e = sw->e;
    struct s3_req *r = &sw->list;
    kvt_s3_req_clear(r);
    memset(r, 0, sizeof(*r));
    r->op = S3_MPU_LIST;
    snprintf(r->path, sizeof(r->path), "%s/", e->base);
    struct kvt_sigv4_pair q[5];
    size_t nq = 0;
    q[nq++] = (struct kvt_sigv4_pair){"uploads", ""};
    q[nq++] = (struct kvt_sigv4_pair){"max-uploads", "1000"};
    if (e->prefix_len)
        q[nq++] = (struct kvt_sigv4_pair){"prefix", e->prefix};
    if (sw->key_marker[0])
        q[nq++] = (struct kvt_sigv4_pair){"key-marker", sw->key_marker};
    if (sw->id_marker[0])
        q[nq++] = (struct kvt_sigv4_pair){"upload-id-marker", sw->id_marker};
    size_t cap = 3 * (strlen(e->prefix) + strlen(sw->key_marker) + strlen(sw->id_marker)) + 128;
    r->query = kvt_xmalloc(cap);
    kvt_sigv4_canonical_query(q, nq, r->query, cap);
    r->done = sweep_list_done;
    r->ctx = sw;
    kvt_s3_submit_req(e, r);
}

void kvt_s3_sweep_uploads(struct s3_engine *e)
{
    if (e->azure || e->stale_upload_s <= 0)
        return;
    struct sweep *sw = kvt_xcalloc(1, sizeof(*sw));
    sw->e = e;
    sweep_page(sw);
}
