/*
 * Authentication and tenants (docs/security.md).
 *
 * The authorized-clients file (--auth-clients): one client a line,
 *
 *   <public key> <ro|rw> <tenants> [admin] [name=LABEL]   # comment
 *
 * public key: the client's CURVE public key in Z85 (40 characters, as
 * `kvtier keygen` writes it to NAME.pub); ro|rw: whether it may store and
 * delete; tenants: '*' (every cache salt) or a comma-separated list of the
 * cache salts it may use, "@none" standing for requests without a salt and
 * %XX for a byte a salt may hold but the file cannot (space, ',', '#', '%');
 * admin: it may also read status and purge (operators). Empty lines, lines
 * starting with '#' and a trailing word starting with '#' and what follows
 * are comments (so a key may not start with '#'; kvtier keygen never makes
 * one). A key listed twice is an error.
 *
 * Reload (SIGHUP): the file is read again into a new table, which becomes
 * the current one; the old tables stay until exit (requests in flight and
 * status may still point into them), each entry marked stale with its
 * successor, the same key's entry in the newest table (NULL: removed).
 * kvt_auth_live maps an entry to its live one: so connections admitted
 * before a reload get the new rights, or E_DENIED when their key went.
 *
 * Thread rules: a table never changes once published, except the counters
 * (atomics, any thread) and the stale/successor marks, written and read by
 * the rpc thread only (kvt_auth_supersede, kvt_auth_live, kvt_auth_by_uid).
 */
#ifndef KVT_SERVER_AUTH_H
#define KVT_SERVER_AUTH_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#define KVT_AUTH_MAX_CLIENTS 4096
#define KVT_AUTH_MAX_TENANTS 256 /* salts listed for one key */

struct kvt_auth_client {
    char key[41];    /* Z85 public key (not secret) */
    uint8_t bin[32]; /* the same, decoded */
    char name[64];   /* name=LABEL, or the key's first 8 characters */
    bool rw, admin, any_tenant;
    uint32_t ntenants;
    char **tenants;                    /* the salts it may use (decoded; "" = no salt) */
    _Atomic uint64_t denied;           /* requests answered E_DENIED (carried over a reload) */
    bool stale;                        /* a newer table superseded this entry's (rpc thread) */
    struct kvt_auth_client *successor; /* then: the newest table's entry, NULL = removed */
};

struct kvt_auth {
    uint32_t n;
    struct kvt_auth_client *c;
    uint32_t gen;           /* 0 at start, +1 a reload */
    struct kvt_auth *older; /* the table this one superseded (kept until exit) */
    /* counters of the first table only (the server's for its whole run) */
    _Atomic uint64_t handshakes_refused; /* ZAP: key not in the file */
    _Atomic uint64_t handshakes_failed;  /* no key, wrong server key, bad handshake */
    _Atomic uint64_t reloads, reload_failures;
    _Atomic uint64_t lmc_refused; /* ZAP on the LMCache socket: another uid, or no client */
};

/* Parse an authorized-clients file's text (len bytes, no NUL needed).
 * 0, or KVT_E_CONFIG with err naming origin and the line. */
int kvt_auth_parse(const char *text, size_t len, const char *origin, struct kvt_auth **out,
                   char *err, size_t cap);
/* Read and parse path (refused when writable by group or others). */
int kvt_auth_load(const char *path, struct kvt_auth **out, char *err, size_t cap);
void kvt_auth_free(struct kvt_auth *a);
/* The client with this public key (32 bytes), or NULL. */
struct kvt_auth_client *kvt_auth_find(const struct kvt_auth *a, const uint8_t *bin);
/* Is id c's name= label or its public key (Z85)? */
bool kvt_auth_client_is(const struct kvt_auth_client *c, const char *id);
/* The one client of a that id names (kvt_auth_client_is), or NULL (none,
 * or several: a label given twice); *matches (if not NULL): how many. */
struct kvt_auth_client *kvt_auth_named(const struct kvt_auth *a, const char *id, uint32_t *matches);
/* May c use this salt (NUL-terminated, "" = none)? */
bool kvt_auth_salt_ok(const struct kvt_auth_client *c, const char *salt);
/* The counters (root: the first table) and the current table's clients,
 * for status (no secret in it). */
json_t *kvt_auth_status(const struct kvt_auth *root, const struct kvt_auth *cur);
/* fresh (just loaded) supersedes cur and every older table: gen, older,
 * the denied counts carried, every old entry stale with its successor. The
 * caller then publishes fresh (rpc thread). added/removed: keys. */
void kvt_auth_supersede(struct kvt_auth *cur, struct kvt_auth *fresh, uint32_t *added,
                        uint32_t *removed);
/* The live entry for e (itself, its successor, or NULL when its key was
 * removed); NULL for NULL. rpc thread. */
struct kvt_auth_client *kvt_auth_live(struct kvt_auth_client *e);
/* The live entry for a ZAP user id ("GEN:INDEX", see kvt_zap), looked up
 * from cur back through the older tables; NULL when unknown or removed. */
struct kvt_auth_client *kvt_auth_by_uid(struct kvt_auth *cur, const char *uid);

/* The ZAP handler (RFC 27) on zctx: answers every CURVE handshake of the
 * context's sockets, admitting the keys in a. Start before binding a CURVE
 * socket (without a handler libzmq admits every key); it ends when zctx is
 * shut down (zmq_ctx_shutdown), then join it with kvt_zap_join. */
struct kvt_zap;
/* root: the first table (its counters); cur: the caller's pointer to the
 * table in use, read at every handshake (a reload replaces it). */
int kvt_zap_start(void *zctx, struct kvt_auth *root, struct kvt_auth *_Atomic *cur,
                  struct kvt_zap **out);
/* The same for a context whose sockets have no CURVE (NULL mechanism, ZAP
 * domain set) and listen on Unix sockets only: admits a peer whose
 * SO_PEERCRED uid (libzmq puts ":uid:gid:pid" at the end of the ZAP
 * address) is this process's, while `client` names one client of the table
 * in use (kvt_auth_named); refusals count in root->lmc_refused. */
int kvt_zap_start_same_uid(void *zctx, struct kvt_auth *root, struct kvt_auth *_Atomic *cur,
                           const char *client, struct kvt_zap **out);
void kvt_zap_join(struct kvt_zap *z);

#endif
