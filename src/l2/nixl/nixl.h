/*
 * nixl_store_dynamic and nixl_store, private to this folder: their options
 * (one parser for both: nixl_cfg.c), and nixl_store's engine, which
 * nixl_store.c (the page allocator, the task path, open and close) and
 * nixl_pool.c (the pool's files) share. nixl_dynamic.c keeps its engine to
 * itself.
 */
#ifndef KVT_L2_NIXL_H
#define KVT_L2_NIXL_H

#include <stdbool.h>
#include <stdint.h>

#include "common/cfg.h"
#include "io/engine.h"
#include "io/tpool.h"
#include "l2/engine.h"
#include "l2/kit/fileobj.h"

#include <pthread.h>
#include <stdatomic.h>

struct kvt_l2_spec;

struct kvt_nixl_opts {
    const char *backend; /* POSIX, HF3FS, or OBJ for nixl_store (others are refused at parse) */
    const char *file_path;
    bool use_direct_io;
    uint64_t max_capacity_bytes; /* dynamic */
    bool shard_dirs;             /* dynamic */
    uint32_t pool_size;          /* static pool */
    uint64_t file_size;          /* static pool */
    uint32_t page_size;          /* static pool */
    int io_engine;               /* enum kvt_ioeng_kind */
    int queue_depth;             /* io_uring */
    int num_workers;
    bool durable;
    bool shared; /* dynamic: "shared", other servers use file_path too (l2/kit/dirlock.h) */
    void *
        obj; /* static pool, backend OBJ or AZURE_BLOB: the s3 engine's options (l2/s3/s3_nixl.h) */
};

/* dynamic: nixl_store_dynamic's keys, else nixl_store's. Returns c->rc. */
int kvt_nixl_parse(struct kvt_cfg *c, struct kvt_nixl_opts *o, bool dynamic);
/* Both types' kvt_l2_adapter_desc.storage: the directory file_path. */
const char *kvt_nixl_storage(const void *opts, const char **field, bool *is_dir);

/* ---- nixl_store's engine (nixl_store.c; its files: nixl_pool.c) ---- */

struct ns_ext {
    uint32_t page; /* global page number */
    uint32_t n;    /* pages */
};

struct ns_rec {
    struct ns_ext *ext;
    uint32_t nexts;
    uint32_t plen;      /* payload bytes stored */
    uint32_t next_free; /* free-list link when unused */
};

struct ns_stack {
    uint32_t *v; /* starting pages of free extents of this length */
    uint32_t n, cap;
};

struct ns_engine {
    char *base;
    int dirfd;
    bool made_dir;              /* this start created base: removed with the pool */
    bool locked;                /* pool file 0 is flocked: the pool files are ours */
    uint32_t nfiles, ppf, page; /* files, pages per file, page size */
    uint32_t pages;             /* total */
    int *fd;                    /* buffered */
    int *dfd;                   /* O_DIRECT, or -1 */
    struct kvt_odirect od;
    _Atomic bool warned_dry;
    struct kvt_ioeng *io;
    struct kvt_tpool *work;
    int nworkers;

    pthread_mutex_t lock; /* guards everything below */
    struct ns_stack *cls; /* cls[len]: free extents of len pages, 1..ppf */
    uint64_t *cls_bm;     /* non-empty classes */
    uint32_t bump;        /* first never-used page */
    uint32_t free_pages;
    uint32_t free_extents;
    struct ns_rec *recs;
    uint32_t nrecs, cap_recs, rec_free;
    uint64_t dry_batches, scattered;

    struct kvt_l2_drain drain; /* tasks in flight */
};

/* nixl_pool.c */
/* Open (create) pool file i, preallocated to size (one left by a server
 * that died is reused); 0 or an error with the message in err. */
int kvt_nixl_pool_open_file(kvt_l2 *l2, struct ns_engine *e, uint32_t i, uint64_t size, char *err,
                            size_t errcap);
/* Take the pool: file 0, locked (one pool per directory). */
int kvt_nixl_pool_lock(struct ns_engine *e, char *err, size_t errcap);
/* Bytes nfiles pool files still need in dirfd, and the bytes free. */
void kvt_nixl_pool_space(int dirfd, uint32_t nfiles, uint64_t file_size, uint64_t *need,
                         uint64_t *avail);
/* The shortfall message: 0, or -ENOSPC with what to change. */
int kvt_nixl_pool_space_check(const char *base, const struct kvt_nixl_opts *o, uint64_t need,
                              uint64_t avail, char *err, size_t errcap);
/* Pool files beyond pool_size, left by a larger pool: removed. */
void kvt_nixl_pool_remove_stale(struct ns_engine *e);
/* Remove the first nfiles files of the pool (and the directory this
 * start created). */
void kvt_nixl_pool_remove(struct ns_engine *e, uint32_t nfiles);
/* kvt_l2_adapter_desc.check of nixl_store. */
int kvt_nixl_pool_check(const struct kvt_l2_spec *spec, const void *opts, const char **field,
                        char *msg, size_t cap);

#endif
