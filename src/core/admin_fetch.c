/*
 * Admin calls: bringing keys from L2 into L1, for pin and warm. The same
 * steps as the prefetch controller's (lookup and pin in every adapter,
 * reserve L1 space, load straight into the pool, publish), run on the
 * caller's thread with kvt_l2_run, so no controller sees the tasks, and
 * published as ordinary (not temporary) objects: they stay in L1 after
 * the caller lets them go.
 */
#include "common/util.h"
#include "core/admin_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

void kvt_admin_fetch_find(struct kvt_admin *a, struct admin_fetch *f, const kvt_key *keys,
                          uint32_t n, bool ref_l1)
{
    memset(f, 0, sizeof(*f));
    f->n = n;
    f->keys = keys;
    f->ref_l1 = ref_l1;
    size_t m = n ? n : 1;
    f->refs = kvt_xcalloc(m, sizeof(*f->refs));
    f->st = kvt_xcalloc(m, 1);
    f->src = kvt_xcalloc(m, 1);
    f->len = kvt_xcalloc(m, sizeof(uint32_t));
    uint32_t *idx = kvt_xmalloc(m * sizeof(uint32_t)), k = 0;
    for (uint32_t i = 0; i < n; i++) {
        bool in_l1 = ref_l1 ? kvt_l1_get(a->l1, &keys[i], &f->refs[i]) == 0
                            : kvt_l1_contains(a->l1, &keys[i]);
        if (in_l1) {
            f->st[i] = FK_L1;
            f->len[i] = ref_l1 ? f->refs[i].meta.len : 0;
        } else {
            idx[k++] = i;
        }
    }
    /* one lookup per adapter over the keys L1 lacks; each key loads from
     * the lowest adapter that has it */
    for (int ad = 0; ad < a->nl2 && k; ad++) {
        kvt_l2_task *t = kvt_l2_task_new(KVT_L2_LOOKUP, k);
        for (uint32_t j = 0; j < k; j++)
            t->keys[j] = keys[idx[j]];
        kvt_l2_run(a->l2s[ad], t);
        f->lk[ad] = t;
        for (uint32_t j = 0; j < k; j++) {
            uint32_t i = idx[j];
            if (kvt_bm_test(t->ok, j) && f->st[i] == FK_MISS) {
                f->st[i] = FK_L2;
                f->src[i] = (int8_t)ad;
                f->len[i] = t->meta[j].len;
            }
        }
    }
    free(idx);
}

/* Reserve an L1 slot for key i; false when there is none (then FK_FAILED,
 * or FK_L1 with a reference when another writer published it since). */
static bool reserve(struct kvt_admin *a, struct admin_fetch *f, uint32_t i)
{
    kvt_objmeta m = {0};
    m.len = f->len[i];
    int rc = kvt_l1_reserve_free(a->l1, &f->keys[i], &m, &f->refs[i]);
    if (rc == 0)
        return true;
    if (rc == -EEXIST && kvt_l1_get(a->l1, &f->keys[i], &f->refs[i]) == 0) {
        f->st[i] = FK_L1;
        if (!f->ref_l1)
            kvt_l1_put(a->l1, f->refs[i].h);
    } else {
        f->st[i] = FK_FAILED;
    }
    return false;
}

/* The load into the reserved slot ended (ok: the bytes are verified and
 * as long as reserved): publish it, or drop it. */
static bool publish(struct kvt_admin *a, struct admin_fetch *f, uint32_t i, bool ok,
                    const kvt_objmeta *meta)
{
    struct kvt_l1_ref *r = &f->refs[i];
    if (ok) {
        kvt_objmeta m = *meta;
        m.len = r->meta.len;
        kvt_l1_set_meta(a->l1, r->h, &m);
        kvt_l1_commit(a->l1, &r->h, 1, 0);
        if (kvt_l1_winner(a->l1, r)) {
            f->st[i] = FK_LOADED;
            return true;
        }
    } else {
        kvt_l1_abort(a->l1, r->h);
    }
    kvt_l1_put(a->l1, r->h);
    f->st[i] = FK_FAILED;
    return false;
}

uint32_t kvt_admin_fetch_load(struct kvt_admin *a, struct admin_fetch *f)
{
    uint32_t loaded = 0;
    uint32_t *idx = kvt_xmalloc((f->n ? f->n : 1) * sizeof(uint32_t));
    for (int ad = 0; ad < a->nl2; ad++) {
        uint32_t k = 0;
        for (uint32_t i = 0; i < f->n; i++)
            if (f->st[i] == FK_L2 && f->src[i] == ad && reserve(a, f, i))
                idx[k++] = i;
        if (!k)
            continue;
        kvt_l2_task *t = kvt_l2_task_new(KVT_L2_LOAD, k);
        for (uint32_t j = 0; j < k; j++) {
            t->keys[j] = f->keys[idx[j]];
            t->bufs[j].ptr = f->refs[idx[j]].ptr;
            t->bufs[j].len = f->refs[idx[j]].meta.len;
        }
        kvt_l2_run(a->l2s[ad], t);
        for (uint32_t j = 0; j < k; j++) {
            uint32_t i = idx[j];
            bool ok =
                kvt_bm_test(t->ok, j) && t->bufs[j].len == f->len[i] && t->meta[j].len == f->len[i];
            loaded += publish(a, f, i, ok, &t->meta[j]);
        }
        kvt_l2_task_free(t);
    }
    free(idx);
    return loaded;
}

void kvt_admin_fetch_done(struct kvt_admin *a, struct admin_fetch *f, bool keep)
{
    for (int ad = 0; ad < a->nl2; ad++) {
        kvt_l2_task *t = f->lk[ad];
        if (!t)
            continue;
        /* only the hits: a miss holds no pin of ours to give back */
        kvt_key *hits = kvt_xmalloc((t->n ? t->n : 1) * sizeof(kvt_key));
        uint32_t h = 0;
        for (uint32_t j = 0; j < t->n; j++)
            if (kvt_bm_test(t->ok, j))
                hits[h++] = t->keys[j];
        kvt_l2_unlock(a->l2s[ad], hits, h);
        free(hits);
        kvt_l2_task_free(t);
        f->lk[ad] = NULL;
    }
    if (!keep)
        for (uint32_t i = 0; i < f->n; i++)
            if (f->st[i] == FK_LOADED || (f->st[i] == FK_L1 && f->ref_l1))
                kvt_l1_put(a->l1, f->refs[i].h);
    free(f->refs);
    free(f->st);
    free(f->src);
    free(f->len);
    memset(f, 0, sizeof(*f));
}
