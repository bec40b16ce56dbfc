/*
 * fault_inject: a test/diagnostic wrapper around any other adapter (LMCache's
 * FaultInjectL2Adapter). Every operation is the inner adapter's; only LOAD
 * results are post-processed: chosen keys fail to load although lookup
 * reported them present, the faithful "L2 retrieve error". The prefetch
 * controller must trim the prefix there and never serve those bytes.
 *
 * Config (LMCache's keys):
 *   inner            the wrapped adapter's full spec (required)
 *   rate             per-key drop probability in [0, 1] (0.0)
 *   seed             seed of the per-key hash (0): the same key drops the same
 *                    way at every load, reproducibly across runs
 *   gap_indices      positions (from the head of each load batch) to drop
 *   gap_tail_ratios  positions as distance-from-tail / batch length in
 *                    [0, 1]: 0 = last, 0.5 = middle, 1 = first
 * The per-key hash is XXH3-64 of (seed, canonical key) bucketed by rate
 * (LMCache uses blake2b: the drop sets differ, the semantics do not).
 */
#include "common/log.h"
#include "common/util.h"
#include "kvtier/error.h"
#include "l2/adapters.h"
#include "l2/engine.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#define MAX_GAPS 64 /* the lengths of kvt_fault_opts.gaps and .ratios */

struct kvt_fault_opts {
    struct kvt_l2_spec *inner; /* the wrapped adapter's spec, parsed once (owned) */
    double rate;
    uint64_t seed;
    uint32_t gaps[MAX_GAPS];
    int ngaps;
    double ratios[MAX_GAPS];
    int nratios;
};

struct fault {
    struct kvt_fault_opts o; /* as parsed; o.inner is not used after open */
    _Atomic uint64_t dropped;
};

static bool drop_key(const struct fault *f, const kvt_key *k)
{
    if (f->o.rate <= 0)
        return false;
    uint64_t h = XXH3_64bits_withSeed(k, sizeof(*k), f->o.seed);
    return (double)(h % 1000000) < f->o.rate * 1000000.0;
}

static void fault_finish(kvt_l2 *l2, void *ctx, kvt_l2_task *t)
{
    (void)l2;
    struct fault *f = ctx;
    if (t->kind != KVT_L2_LOAD || t->n == 0)
        return;
    for (uint32_t i = 0; i < t->n; i++) {
        bool drop = false;
        for (int g = 0; g < f->o.ngaps && !drop; g++)
            drop = f->o.gaps[g] == i;
        for (int r = 0; r < f->o.nratios && !drop; r++)
            drop = (uint32_t)lround((1.0 - f->o.ratios[r]) * (double)(t->n - 1)) == i;
        if (!drop) {
            kvt_key ck;
            kvt_l2_canon(l2, &t->keys[i], &ck);
            drop = drop_key(f, &ck);
        }
        if (drop && kvt_bm_test(t->ok, i)) {
            t->ok[i / 64] &= ~(1ull << (i % 64));
            atomic_fetch_add(&f->dropped, 1);
        }
    }
}

static int num_list(struct kvt_cfg *c, const char *key, double *out, int max, double lo, double hi,
                    bool integers)
{
    const json_t *v = kvt_cfg_raw(c, key);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_array(v) || (int)json_array_size(v) > max)
        return kvt_cfg_fail(c, key, "must be a list of at most %d numbers", max);
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e)
    {
        double d = json_number_value(e);
        if (!json_is_number(e) || (integers && !json_is_integer(e)) || d < lo || d > hi)
            return kvt_cfg_fail(c, key, "must be a list of %s in [%g, %g]",
                                integers ? "integers" : "numbers", lo, hi);
        out[i] = d;
    }
    return (int)json_array_size(v);
}

static int fault_parse(struct kvt_cfg *c, void *opts)
{
    struct kvt_fault_opts *o = opts;
    memset(o, 0, sizeof(*o));
    const json_t *inner = kvt_cfg_raw(c, "inner");
    if (!inner || !json_is_object(inner))
        return kvt_cfg_fail(c, "inner",
                            "is required: the wrapped adapter's spec with its \"type\"");
    const json_t *it = json_object_get(inner, "type");
    if (json_is_string(it) && strcmp(json_string_value(it), "fault_inject") == 0)
        return kvt_cfg_fail(c, "inner", "cannot itself be a fault_inject adapter");
    char *text = json_dumps(inner, JSON_COMPACT);
    char err[512];
    struct kvt_l2_spec *spec = kvt_xcalloc(1, sizeof(*spec));
    int rc = kvt_l2_spec_parse(text, c->index, spec, err, sizeof(err));
    free(text);
    if (rc) {
        free(spec);
        kvt_cfg_fail(c, "inner", "is invalid: %s", err);
        c->rc = rc;
        return rc;
    }
    json_object_set(c->resolved, "inner", spec->resolved);
    o->inner = spec; /* kept for open: the inner spec is not parsed again */
    kvt_cfg_num(c, "rate", false, 0.0, 0.0, 1.0, &o->rate);
    int64_t seed = 0;
    kvt_cfg_int(c, "seed", false, 0, INT64_MIN, INT64_MAX, &seed);
    o->seed = (uint64_t)seed;
    double tmp[MAX_GAPS];
    int n = num_list(c, "gap_indices", tmp, MAX_GAPS, 0, 1e9, true);
    for (int i = 0; i < n; i++)
        o->gaps[i] = (uint32_t)tmp[i];
    o->ngaps = n;
    o->nratios = num_list(c, "gap_tail_ratios", o->ratios, MAX_GAPS, 0.0, 1.0, false);
    return c->rc;
}

static void fault_status(kvt_l2 *l2, void *ctx, json_t *out)
{
    (void)l2;
    struct fault *f = ctx;
    json_t *o = json_object();
    json_object_set_new(o, "rate", json_real(f->o.rate));
    json_object_set_new(o, "seed", json_integer((json_int_t)f->o.seed));
    json_object_set_new(o, "gap_indices", json_integer(f->o.ngaps));
    json_object_set_new(o, "gap_tail_ratios", json_integer(f->o.nratios));
    json_object_set_new(o, "dropped_loads", json_integer((json_int_t)atomic_load(&f->dropped)));
    json_object_set_new(out, "fault_inject", o);
}

static void fault_detach(kvt_l2 *l2, void *ctx)
{
    (void)l2;
    free(ctx);
}

/* A filter that sees every finished task before its controller does. */
static const struct kvt_l2_filter_ops fault_filter = {
    .name = "fault_inject",
    .finish = fault_finish,
    .detach = fault_detach,
    .status = fault_status,
};

static void fault_opts_free(void *opts)
{
    struct kvt_fault_opts *o = opts;
    if (o->inner) {
        kvt_l2_spec_free(o->inner);
        free(o->inner);
        o->inner = NULL;
    }
}

static int fault_open(kvt_l2 *l2, const struct kvt_l2_spec *outer, const void *opts, char *err,
                      size_t errcap)
{
    const struct kvt_fault_opts *o = opts;
    (void)outer;
    /* a shallow copy: the parsed inner spec stays the options' (its owned
     * parts are only read while opening) */
    struct kvt_l2_spec spec = *o->inner;
    /* named before its threads start: they log the name */
    snprintf(spec.name_prefix, sizeof(spec.name_prefix), "fault_inject(%.20s)", spec.type);
    int rc = kvt_l2_open_into(&spec, l2, err, errcap);
    if (rc)
        return rc;
    struct fault *f = kvt_xcalloc(1, sizeof(*f));
    f->o = *o;
    f->o.inner = NULL;
    rc = kvt_l2_filter_attach(l2, &fault_filter, f); /* before any task was submitted */
    if (rc) {
        snprintf(err, errcap, "cannot attach the fault filter: %s", kvt_strerror(rc));
        free(f);
        kvt_l2_close(l2);
        return rc;
    }
    kvt_warn("%s ACTIVE (rate %.3f, seed %llu, %d gap indices, %d tail ratios): "
             "test/diagnostic use only",
             l2->name, o->rate, (unsigned long long)o->seed, o->ngaps, o->nratios);
    return 0;
}

/* The inner adapter's host checks are the wrapper's. */
static int fault_check(const struct kvt_l2_spec *outer, const void *opts, const char **field,
                       char *msg, size_t cap)
{
    const struct kvt_fault_opts *o = opts;
    (void)outer;
    const struct kvt_l2_spec *in = o->inner;
    return in && in->desc && in->desc->check ? in->desc->check(in, in->opts, field, msg, cap) : 0;
}

/* The inner adapter's storage is the wrapper's. */
static const char *fault_storage(const void *opts, const char **field, bool *is_dir)
{
    const struct kvt_fault_opts *o = opts;
    return o->inner ? kvt_l2_spec_storage(o->inner, field, is_dir) : NULL;
}

const struct kvt_l2_adapter_desc kvt_l2_fault_inject_desc = {
    .name = "fault_inject",
    .opts_size = sizeof(struct kvt_fault_opts),
    .parse = fault_parse,
    .open = fault_open,
    .opts_free = fault_opts_free,
    .check = fault_check,
    .storage = fault_storage,
};
