/* The kvtier server's entry points. */
#ifndef KVT_SERVER_H
#define KVT_SERVER_H

#include "server/config.h"

/* `kvtier server` (argv[0] is "server"): parse, then --dry-run or run.
 * Returns the process exit status. The CLI's table calls it (cli/cli.h
 * declares it there too, without including this header). */
int kvt_server_main(int argc, char **argv);

/* Run until SIGTERM/SIGINT. Returns the process exit status (0 clean). */
int kvt_server_run(struct kvt_server_cfg *cfg);

#endif
