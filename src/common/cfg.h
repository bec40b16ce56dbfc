/*
 * Reading one adapter's JSON config with LMCache-compatible leniency and
 * strict errors:
 *  - booleans: true/false, or the strings "true"/"false" (any case), as
 *    LMCache users write them ("use_direct_io": "false"); numbers are refused;
 *  - numbers: JSON numbers or numeric strings ("max_capacity_gb": "10");
 *  - every field read is recorded in a resolved object (defaults included),
 *    printed by --dry-run;
 *  - fields never read are unknown: kvt_cfg_finish names them.
 * Errors name the adapter index, its type and the field:
 *   --l2-adapter #1 (fs): "use_odirect" must be true or false (got "yes")
 */
#ifndef KVT_CFG_H
#define KVT_CFG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

struct kvt_cfg {
    const json_t *obj;
    json_t *resolved; /* owned by the caller (the top-level cfg) */
    json_t *seen;     /* keys read, for the unknown-field check */
    json_t *own;      /* an empty object standing in for a missing sub-object */
    char prefix[64];  /* "backend_params." for nested objects */
    int index;
    const char *type;
    char *err;
    size_t errcap;
    int rc; /* first error; later reads are no-ops */
};

void kvt_cfg_init(struct kvt_cfg *c, const json_t *obj, int index, const char *type, char *err,
                  size_t errcap);
/* A nested object (e.g. backend_params); required: error if missing. */
int kvt_cfg_sub(struct kvt_cfg *c, const char *key, bool required, struct kvt_cfg *sub);
/* Attach a finished sub config's resolved object and errors to its parent. */
void kvt_cfg_sub_done(struct kvt_cfg *c, const char *key, struct kvt_cfg *sub);
void kvt_cfg_free(struct kvt_cfg *c);

bool kvt_cfg_has(struct kvt_cfg *c, const char *key);
int kvt_cfg_bool(struct kvt_cfg *c, const char *key, bool def, bool *out);
int kvt_cfg_num(struct kvt_cfg *c, const char *key, bool required, double def, double min,
                double max, double *out);
int kvt_cfg_int(struct kvt_cfg *c, const char *key, bool required, int64_t def, int64_t min,
                int64_t max, int64_t *out);
int kvt_cfg_str(struct kvt_cfg *c, const char *key, bool required, const char *def,
                const char **out);
/* One of a fixed set of strings (case-sensitive unless icase). */
int kvt_cfg_enum(struct kvt_cfg *c, const char *key, bool required, const char *def,
                 const char *const *choices, bool icase, const char **out);
/* A raw JSON value (for "eviction", "serde"); marks it seen. */
const json_t *kvt_cfg_raw(struct kvt_cfg *c, const char *key);
/* Mark keys as known without reading them (handled elsewhere). */
void kvt_cfg_ignore(struct kvt_cfg *c, const char *key);
/* A required field is missing: report it with fmt ("is required (or
 * AWS_DEFAULT_BUCKET)"), unless a field of the object that was not read is
 * a typo of it: then that one is named, with the field it is near
 * ("base_pth" is not a known field: did you mean "base_path"?). */
int kvt_cfg_missing(struct kvt_cfg *c, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Report the first error with a free-form message about a field. */
int kvt_cfg_fail(struct kvt_cfg *c, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The same for a valid setting this build cannot honour: c->rc becomes
 * KVT_E_UNSUPPORTED. key NULL: the message is about the adapter itself. */
int kvt_cfg_unsupported(struct kvt_cfg *c, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Unknown fields are errors. Returns c->rc. */
int kvt_cfg_finish(struct kvt_cfg *c);

#endif
