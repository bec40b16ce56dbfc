/*
 * The LMCache front end: LMCache's multi-process protocol (lmcache 0.5.6,
 * engine-driven mode) on --lmcache-port, on its own thread. Its flags fill
 * struct kvt_lmc_cfg; docs/lmcache-protocol.md describes the protocol.
 */
#ifndef KVT_FRONT_LMC_H
#define KVT_FRONT_LMC_H

#include <stdbool.h>

#include "front/front.h"

struct kvt_lmc_cfg {
    int port;           /* 0 = off */
    char host[128];     /* a host, or ipc://PATH (the endpoint is then ipc://PATH:PORT) */
    char client[64];    /* --lmcache-client: the authorized client its requests act as */
    char shm_name[224]; /* the L1 pool's POSIX shm name when port is set */
};

/* --lmcache-host is ipc://PATH (a Unix socket) */
bool kvt_lmc_host_is_ipc(const char *host);

extern const struct kvt_front_desc kvt_front_lmcache;

#endif
