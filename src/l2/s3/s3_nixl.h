/*
 * What the nixl family may use of s3: nixl_store's object backends are
 * served by the s3 engine ("OBJ" is NIXL's S3 plugin; "AZURE_BLOB" the
 * s3 engine in Azure Blob's dialect), so nixl_store hands their whole
 * config over. The one header of src/l2/s3 another adapter family may
 * include (scripts/check-layers.py allows src/l2/nixl exactly this edge).
 */
#ifndef KVT_L2_S3_NIXL_H
#define KVT_L2_S3_NIXL_H

#include <stddef.h>

#include "common/cfg.h"
#include "l2/l2.h"

struct kvt_l2_spec;

/* Parse {"backend": "OBJ", "backend_params": {NIXL's keys}, "pool_size"}
 * into s3 options; *opts is allocated here (free with
 * kvt_s3_nixl_obj_free). Returns c->rc. */
int kvt_s3_parse_nixl_obj(struct kvt_cfg *c, void **opts);
/* {"backend": "AZURE_BLOB", "backend_params": {account_url, container_name,
 * ...}}: the s3 engine in Azure Blob's dialect; opened, checked and freed
 * as OBJ. */
int kvt_s3_parse_nixl_azure(struct kvt_cfg *c, void **opts);
/* Open the s3 engine from what either parser filled in. */
int kvt_s3_open_nixl_obj(kvt_l2 *l2, const struct kvt_l2_spec *spec, const void *opts, char *err,
                         size_t errcap);
void kvt_s3_nixl_obj_free(void *opts);
/* The s3 type's host check of those options (credentials: can a server
 * started now sign requests?), as kvt_l2_adapter_desc.check. */
int kvt_s3_nixl_obj_check(const void *opts, const char **field, char *msg, size_t cap);
/* The s3 type's "shared_budget" hook on those options
 * (kvt_l2_adapter_desc.shared_budget): a bucket keeps a record, Azure Blob
 * none yet. */
int kvt_s3_nixl_obj_shared_budget(struct kvt_cfg *c, const void *opts);

#endif
