/*
 * What the host can give an L1 pool: memory, the cgroup's limit, the
 * shared-memory file system, the address-space limit, huge pages.
 *
 * kvt_hostmem_read() reads the kernel's figures once (no allocation of
 * the pool, nothing created); kvt_l1_fit() judges a pool of a given size
 * against them. The server checks its --l1-size-gb with both before it
 * creates anything (--dry-run too):
 *
 *   - the mapping needs the whole size in the address space, lazy or not:
 *     more than RLIMIT_AS leaves (the limit minus what the process maps
 *     already) is refused;
 *   - a preallocated pool (--no-l1-use-lazy, or huge pages) is allocated
 *     at start: more than can be allocated now is refused. Now is the
 *     least of MemAvailable, the cgroup's limit minus its usage (at every
 *     level up to the hierarchy's root), and, for a pool in /dev/shm (a
 *     named pool), that file system's free bytes; with huge pages, the
 *     free huge pages;
 *   - a lazy pool grows while clients fill it: a size above what the host
 *     could ever back (the least of MemTotal, the cgroup's limit, and
 *     /dev/shm's size for a named pool) is allowed with a warning, since
 *     the pool would run the host (or the cgroup) out of memory before
 *     its own eviction starts.
 *
 * An anonymous pool (memfd) lives on the kernel's internal shmem mount,
 * which has no size of its own: /dev/shm's size bounds named pools only.
 *
 * Thread rules: none (plain functions over a caller's struct).
 */
#ifndef KVT_L1_HOSTMEM_H
#define KVT_L1_HOSTMEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#define KVT_HOSTMEM_NONE UINT64_MAX /* a limit that is not set */

struct kvt_hostmem {
    uint64_t mem_total;     /* MemTotal, bytes; 0 when unknown */
    uint64_t mem_available; /* MemAvailable, bytes; 0 when unknown */
    uint64_t shm_size;      /* /dev/shm's size and free bytes; 0 when unknown */
    uint64_t shm_free;
    uint64_t cg_limit; /* the tightest memory limit of the cgroup and its ancestors, or NONE */
    uint64_t cg_avail; /* the least (limit - usage) over those levels, or NONE */
    char cg_file[512]; /* the limit's file (memory.max, memory.limit_in_bytes), "" if none */
    uint64_t as_limit; /* RLIMIT_AS (soft), or NONE */
    uint64_t as_used;  /* VmSize: what the process maps already */
    uint64_t hp_free;  /* free huge pages x their size, bytes */
    uint64_t hp_size;  /* Hugepagesize, bytes; 0 when unknown */
};

/* Read the figures. root: "" for this host, or a directory standing for
 * "/" (tests: proc/meminfo, proc/self/cgroup, proc/self/mountinfo,
 * proc/self/status, dev/shm and the cgroup files under it). RLIMIT_AS is
 * always this process's. Never fails: what cannot be read stays unknown
 * (0) or unlimited (NONE). */
void kvt_hostmem_read(const char *root, struct kvt_hostmem *h);

/* The verdict on a pool of `size` bytes. */
enum kvt_l1_fit_verdict {
    KVT_L1_FITS = 0,
    KVT_L1_FIT_WARN = 1,   /* lazy, above what the host could ever back: allowed */
    KVT_L1_FIT_REFUSE = 2, /* cannot be created, or preallocated above what is free */
};

struct kvt_l1_fit {
    enum kvt_l1_fit_verdict verdict;
    uint64_t now;      /* bytes that can be allocated now, NONE if no figure */
    uint64_t ever;     /* bytes the host could ever back, NONE if no figure */
    char figures[768]; /* "MemAvailable 21.3 GiB of MemTotal 23.5 GiB; ..." */
    char msg[1400];    /* for WARN and REFUSE: what and why, naming the numbers */
};

/* Judge a pool. named: it lives in /dev/shm (a POSIX name); lazy: grows on
 * demand (false for huge pages). */
void kvt_l1_fit(const struct kvt_hostmem *h, uint64_t size, bool lazy, bool hugepages, bool named,
                struct kvt_l1_fit *out);

/* {"verdict", "available_bytes", "backable_bytes", "figures", "warning"}
 * for status and --dry-run. */
json_t *kvt_l1_fit_json(const struct kvt_l1_fit *f);

#endif
