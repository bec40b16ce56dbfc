/*
 * The kvtier binary's subcommands (main.c lists them in one table). Each
 * takes its own argv (argv[0] is the command's name) and returns the
 * process's exit status: 0, 1 for a failure, 2 for bad usage.
 *
 * CLI code never includes the server's, the core's or a front end's
 * headers: it reaches a running server through the protocol (ops/rpc.h,
 * the client library) and a cache root through ops/ (scan, purge).
 */
#ifndef KVT_CLI_H
#define KVT_CLI_H

int kvt_cmd_status(int argc, char **argv); /* status.c */
int kvt_cmd_purge(int argc, char **argv);  /* purge.c */
int kvt_cmd_replay(int argc, char **argv); /* replay.c */
int kvt_cmd_keygen(int argc, char **argv); /* keygen.c */
/* admin.c: the admin API of a running server (HTTP) */
int kvt_cmd_list(int argc, char **argv);
int kvt_cmd_delete(int argc, char **argv);
int kvt_cmd_clear(int argc, char **argv);
int kvt_cmd_quota(int argc, char **argv);
int kvt_cmd_pin(int argc, char **argv);
int kvt_cmd_unpin(int argc, char **argv);
int kvt_cmd_warm(int argc, char **argv);
int kvt_cmd_verify(int argc, char **argv);

/* `kvtier server`: runs the server until SIGTERM/SIGINT (or prints the
 * resolved config with --dry-run). Defined by the server
 * (src/server/entry.c, declared for it in server/server.h): the CLI's one
 * edge into the server is this call, resolved when the binary is linked. */
int kvt_server_main(int argc, char **argv);

#endif
