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
