/* kvtier: one binary, subcommands. */
#include "common/log.h"
#include "common/util.h"
#include "kvtier/client.h"
#include "server/config.h"
#include "server/server.h"

#include <getopt.h>
#include <malloc.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int kvt_cmd_status(int argc, char **argv);
int kvt_cmd_replay(int argc, char **argv);
int kvt_cmd_purge(int argc, char **argv);
int kvt_cmd_keygen(int argc, char **argv);

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvtier <command> [options]\n"
            "\n"
            "commands:\n"
            "  server     run the cache server (kvtier server --help)\n"
            "  status     show what a cache holds: a server, or a directory offline\n"
            "             (kvtier status --help)\n"
            "  purge      delete a namespace, everything, or crash residue (kvtier purge --help)\n"
            "  replay     replay a Mooncake trace against a server (kvtier replay --help)\n"
            "  keygen     make a CURVE key pair for authentication (kvtier keygen --help)\n"
            "  version    print the version\n");
}

static int cmd_server(int argc, char **argv)
{
    /* Inline payloads arrive in fresh ZeroMQ buffers of up to an object's
     * size. glibc serves those from mmap and returns freed heap tops to the
     * kernel, so every message would touch new pages (about 10 us per page on
     * some VMs: 12 ms per 4 MiB). Keep such buffers on the heap and keep
     * freed memory for reuse. */
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 512 << 20);
    struct kvt_server_cfg cfg;
    int rc = kvt_server_cfg_parse(&cfg, argc, argv);
    if (rc == 1)
        return 0; /* --help */
    if (rc)
        return rc;
    if (cfg.dry_run) {
        if (cfg.l1_fit_checked && cfg.l1_fit.verdict == KVT_L1_FIT_WARN)
            fprintf(stderr, "kvtier server: warning: %s\n", cfg.l1_fit.msg);
        json_t *j = kvt_server_cfg_json(&cfg);
        /* 15 significant digits: 0.8, not 0.80000000000000004 */
        char *s = json_dumps(j, JSON_INDENT(2) | JSON_REAL_PRECISION(15));
        printf("%s\n", s);
        free(s);
        json_decref(j);
        kvt_server_cfg_free(&cfg);
        return 0;
    }
    rc = kvt_server_run(&cfg);
    kvt_server_cfg_free(&cfg);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "server") == 0)
        return cmd_server(argc - 1, argv + 1);
    if (strcmp(cmd, "status") == 0)
        return kvt_cmd_status(argc - 1, argv + 1);
    if (strcmp(cmd, "purge") == 0)
        return kvt_cmd_purge(argc - 1, argv + 1);
    if (strcmp(cmd, "keygen") == 0)
        return kvt_cmd_keygen(argc - 1, argv + 1);
    if (strcmp(cmd, "replay") == 0)
        return kvt_cmd_replay(argc - 1, argv + 1);
    if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) {
        printf("kvtier %s\n", KVT_VERSION);
        return 0;
    }
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "kvtier: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
