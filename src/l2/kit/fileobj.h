/*
 * File-backed objects: the steps that the one-file-per-object engines (fs
 * and fs_native in fs.c, nixl_store_dynamic in nixl_dynamic.c) take the
 * same way. An object is a file `name` (relative to the directory fd dirfd;
 * it may hold shard directories) = object header (objfmt.h) + payload,
 * named by the adapter's key codec (l2->codec). The engines keep what
 * differs: naming, tmp files and publishing, O_DIRECT rules, I/O engines.
 *
 * A file that fails a check is a miss, counted in `corrupt`, and removed
 * (docs/adapters.md, "The object format"): never served.
 *
 * Thread rules: every function may be called from any engine thread; they
 * take l2->lock only for index updates, never across I/O.
 */
#ifndef KVT_L2_FILEOBJ_H
#define KVT_L2_FILEOBJ_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>

#include "l2/engine.h"
#include "l2/kit/objfmt.h"

/* Read and verify just the header of dirfd/name for the key want (compared
 * in codec's canonical form): header checksum, identity, and a file size of
 * exactly header + payload. Fills h and st. Returns 0, -errno (open, stat,
 * read), or KVT_E_CORRUPT with *why naming the failed check. */
int kvt_fileobj_read_header(int dirfd, const char *name, enum kvt_codec codec, const kvt_key *want,
                            struct kvt_objhdr *h, struct stat *st, const char **why);
/* The engine block hashes (a new reference) the verified header of
 * dirfd/name holds, or NULL: none, or the header does not verify, or the
 * file is no longer size bytes (a start-up scan, with KV events on:
 * kvt_l2_give_tag). Reads the header only; what is wrong with the file is
 * left to its first lookup or load. */
struct kvt_blocktag *kvt_fileobj_read_tag(int dirfd, const char *name, enum kvt_codec codec,
                                          const kvt_key *want, uint64_t size);

/* A corrupt object: count it, warn (naming the key and why), remove the
 * file. The caller forgets the index entry where it has one. */
void kvt_fileobj_corrupt(kvt_l2 *l2, int dirfd, const char *name, const kvt_key *k,
                         const char *why);

/* LOOKUP of key i of t, whose file is dirfd/name: a hit in the index with
 * a known header (aux != 0) is pinned and reported; otherwise the header on
 * disk is read and verified: a file another process published is adopted
 * and pinned (a secondary hit), an entry the start-up scan indexed without
 * its header learns it. A missing or corrupt file is a miss (and its entry
 * is forgotten). */
void kvt_fileobj_lookup(kvt_l2 *l2, int dirfd, const char *name, kvt_l2_task *t, uint32_t i);

/* Header length of the object key for a LOAD: the index's (aux), or, when
 * unknown or above max_hl, read and verified from dirfd/name; an indexed
 * entry whose header was unknown learns it (as a lookup's would), so only
 * the first load pays that read. Returns 0 with *hl set, or the error to
 * fail the key with (a corrupt file is reported and removed; a header
 * longer than max_hl is KVT_E_CORRUPT). */
int kvt_fileobj_load_hdr_len(kvt_l2 *l2, int dirfd, const char *name, const kvt_key *key,
                             uint32_t max_hl, uint16_t *hl);

/* The payload bytes to read for a LOAD of key from a file of st_size bytes
 * with an hl-byte header into a destination of cap bytes. A file whose size
 * differs from what the index recorded for it (extended, emptied or cut
 * behind the server's back), or shorter than its header, is KVT_E_CORRUPT
 * with *why (the caller reports it through kvt_fileobj_load_done, which
 * counts, removes and forgets it); a valid object larger than cap is
 * -EOVERFLOW (never an overrun). Returns 0 with *plen set. */
int kvt_fileobj_load_size(kvt_l2 *l2, const kvt_key *key, uint64_t st_size, uint16_t hl,
                          uint64_t cap, uint64_t *plen, const char **why);

/* End a LOAD of key i of t: hl header bytes at hdr and plen payload bytes
 * at t->bufs[i].ptr were read from dirfd/name. rc is the transfer's result
 * (0, -errno, or KVT_E_CORRUPT with why saying what was short). With rc 0
 * the header is decoded and checked against the key, the lengths read and
 * the payload checksum. A corrupt object is reported, removed and
 * forgotten. The key then fails with the error, or is ok with its meta,
 * bufs[i].len = plen and hl + plen bytes moved. */
void kvt_fileobj_load_done(kvt_l2 *l2, int dirfd, const char *name, kvt_l2_task *t, uint32_t i,
                           const void *hdr, uint16_t hl, uint64_t plen, int rc, const char *why);

/* STORE of key i of t (canonical ck) lost the publishing race: another
 * writer renamed its file to dirfd/name first. Drop our reservation, adopt
 * that file (its size; header read at the first lookup) and report the key
 * as stored (skipped). */
void kvt_fileobj_store_adopt(kvt_l2 *l2, int dirfd, const char *name, kvt_l2_task *t, uint32_t i,
                             const kvt_key *ck);

/* O_DIRECT fell back at open, after the reservation: the object's header is
 * hl bytes (payload plen), not what was reserved; correct the entry's size,
 * header length (aux) and the adapter's, namespace's and quota's bytes. */
void kvt_fileobj_set_hdr_len(kvt_l2 *l2, const kvt_key *ck, uint16_t hl, uint64_t plen);

/* persist_enabled false, at close: remove every indexed object through the
 * engine's remove (which must not take l2->lock: it is called with it
 * held), and log how many files went. */
void kvt_fileobj_remove_indexed(kvt_l2 *l2);

/* Create directory path (one level) if missing and open it into *out.
 * what: its config key, for messages. 0 or -errno with the message. */
int kvt_fileobj_dir_open(const char *path, const char *what, int *out, char *err, size_t errcap);
/* A directory engine's object directory, at open: kvt_fileobj_dir_open
 * into *dirfd, writable, its owner lock taken (l2/kit/dirlock.h: shared
 * with other servers that set "shared", else exclusive; a file system
 * without locks is a warning) into *lockfd, and with "shared_budget" the
 * record in it attached (l2/kit/budget_file.h), or a warning when a
 * shared directory has a record this server does not use. The caller's
 * failure path closes *dirfd and *lockfd. 0 or an error with the message. */
int kvt_fileobj_dir_take(kvt_l2 *l2, const struct kvt_l2_spec *spec, const char *path,
                         const char *what, bool shared, bool durable, int *dirfd, int *lockfd,
                         char *err, size_t errcap);

/* O_DIRECT for one engine: what was asked, the file system's block size
 * and what the file system said. The seed's rules: a length that is not a
 * multiple of the block size, or a buffer not aligned to it, is buffered
 * for that transfer and counted (odirect_fallbacks); an open that the file
 * system refuses with EINVAL turns O_DIRECT off for good, warned once. */
struct kvt_odirect {
    bool on;              /* asked for */
    uint32_t blksz;       /* power of two, 512 .. max_blksz */
    const char *base;     /* the directory, for messages */
    _Atomic bool refused; /* the file system said EINVAL */
    _Atomic bool warned_refused, warned_len, warned_align;
    _Atomic uint64_t misaligned; /* transfers whose buffer was not aligned */
};

/* Block size from dirfd's file system (st_blksize, clamped; 4096 when odd). */
void kvt_odirect_init(struct kvt_odirect *od, bool on, int dirfd, uint32_t max_blksz,
                      const char *base);

/* Whether a transfer of len bytes at buf would use O_DIRECT (no counting). */
bool kvt_odirect_usable(const struct kvt_odirect *od, const void *buf, uint64_t len);

/* The same decision for a transfer about to run: counts and warns (once)
 * when O_DIRECT was asked for but cannot be used. */
bool kvt_odirect_ok(kvt_l2 *l2, struct kvt_odirect *od, const void *buf, uint64_t len);

/* openat(dirfd, name, flags | (*direct ? O_DIRECT : 0), 0644); an EINVAL for
 * O_DIRECT marks it refused (warned, counted), clears *direct and opens
 * buffered. Returns the fd or -errno. */
int kvt_odirect_openat(kvt_l2 *l2, struct kvt_odirect *od, int dirfd, const char *name, int flags,
                       bool *direct);

/* "odirect" (off | on | refused ...) and "block_size" into a status object. */
void kvt_odirect_status(const struct kvt_odirect *od, json_t *out);

/* Health of a file engine: its directory (config key `what`) still exists;
 * notes a refused O_DIRECT. */
bool kvt_fileobj_healthy(int dirfd, const struct kvt_odirect *od, const char *what, char *msg,
                         size_t cap);

#endif
