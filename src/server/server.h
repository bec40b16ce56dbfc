/* kvtier server entry point (used by main.c). */
#ifndef KVT_SERVER_H
#define KVT_SERVER_H

#include "server/config.h"

/* Run until SIGTERM/SIGINT. Returns the process exit status (0 clean). */
int kvt_server_run(struct kvt_server_cfg *cfg);

#endif
