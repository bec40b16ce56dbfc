/*
 * kvtier server configuration: command-line flags (LMCache names and
 * defaults where they exist) and --l2-adapter specs.
 */
#ifndef KVT_SERVER_CONFIG_H
#define KVT_SERVER_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "core/core.h"
#include "front/lmcache/lmc.h"
#include "l1/hostmem.h"
#include "l2/adapters.h"
#include "server/auth.h"
#include "server/events.h"

struct kvt_server_cfg {
    char host[128];
    int port;
    char bind[300]; /* ZeroMQ endpoint; derived from host/port unless --bind */
    int chunk_size;
    int max_workers;
    int io_threads; /* --io-threads; 0 = kvt_server_io_threads() decides */

    double l1_size_gb, l1_init_size_gb;
    bool l1_lazy, l1_hugepages;
    uint32_t l1_align;
    double l1_write_ttl_s, l1_read_ttl_s;
    /* the pool against this host (l1/hostmem.h), judged while parsing;
     * not judged with --no-storage-check (the config is for another host) */
    bool l1_fit_checked;
    struct kvt_l1_fit l1_fit;
    char eviction_policy[16];
    double eviction_watermark, eviction_ratio;
    int eviction_interval_ms;

    int nadapters;
    struct kvt_l2_spec adapters[KVT_MAX_ADAPTERS];
    bool default_adapter; /* no --l2-adapter: fs under data_dir */
    char data_dir[1024];

    enum kvt_store_policy store_policy;
    enum kvt_prefetch_policy prefetch_policy;
    int prefetch_max_in_flight;

    char http_host[128];
    int http_port; /* 0 = off */

    /* the LMCache front end's flags (src/front/lmcache/) */
    struct kvt_lmc_cfg lmc;
    /* the KV-events publisher's flags (server/events.h) */
    struct kvt_evpub_cfg events;

    uint64_t max_object_bytes;
    bool shm;   /* offer the zero-copy path */
    bool no_l2; /* memory-only */
    bool local; /* offer the same-host unix socket (with shm) */
    bool dry_run;
    bool no_storage_check; /* --no-storage-check (with --dry-run): skip kvt_l2_spec_check */
    int log_level;
    int log_format;      /* enum kvt_log_format */
    json_t *config_file; /* --config: the file's values and the pre-flight (owned), or NULL */

    /* authentication (server/auth.h, docs/security.md) */
    char auth_key_file[1024];     /* --auth-key: the server's CURVE secret key */
    char auth_clients_file[1024]; /* --auth-clients */
    char auth_secret[41];         /* read from auth_key_file: never logged or shown */
    char auth_public[41];         /* derived from it (public) */
    struct kvt_auth *auth;        /* the authorized clients (owned); NULL = no authentication */
    char http_token_file[1024];   /* --http-token */
    char http_token[256];         /* read from it: never logged or shown; "" = none */
    char admin_token_file[1024];  /* --admin-token: the admin API's bearer token */
    char admin_token[256];        /* read from it: never logged or shown; "" = none */
    int max_pinned_mb;            /* --max-pinned-mb: the admin API's pinned bytes bound */
    bool insecure_no_auth;        /* --insecure-no-auth: beyond loopback without auth */
};

/* ZeroMQ I/O threads of the client socket: --io-threads, else 1 without
 * authentication (a plain frame costs its I/O thread a read) and half the
 * CPUs, 1..4, with it (CURVE encrypts and decrypts every byte on the I/O
 * thread that owns the connection: one thread caps the server near one
 * core's XSalsa20-Poly1305 rate). */
int kvt_server_io_threads(const struct kvt_server_cfg *c);

/* true if a ZeroMQ endpoint (tcp://host:port, ipc://, inproc://) or a host
 * name / address is reachable from this host only. */
bool kvt_endpoint_is_local(const char *endpoint);
bool kvt_host_is_loopback(const char *host);

/* Parse argv (after the "server" word). On error prints a message naming the
 * flag or adapter key to stderr and returns 2; returns 1 for --help (printed);
 * 0 on success. */
int kvt_server_cfg_parse(struct kvt_server_cfg *c, int argc, char **argv);
void kvt_server_cfg_free(struct kvt_server_cfg *c);
/* The resolved configuration (every value, defaults included). */
json_t *kvt_server_cfg_json(const struct kvt_server_cfg *c);
void kvt_server_usage(FILE *f);

#endif
