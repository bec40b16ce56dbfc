/* kvtier: one binary, subcommands, listed in one table. */
#include "cli/cli.h"

#include <stdio.h>
#include <string.h>

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help; /* its lines in `kvtier help` */
} commands[] = {
    {"server", kvt_server_main, "run the cache server (kvtier server --help)"},
    {"status", kvt_cmd_status,
     "show what a cache holds: a server, or a directory offline\n"
     "             (kvtier status --help)"},
    {"purge", kvt_cmd_purge,
     "delete a namespace, everything, or crash residue (kvtier purge --help)"},
    {"replay", kvt_cmd_replay, "replay a Mooncake trace against a server (kvtier replay --help)"},
    {"keygen", kvt_cmd_keygen, "make a CURVE key pair for authentication (kvtier keygen --help)"},
    {"list", kvt_cmd_list, "list a server's objects (filters, pages; kvtier list --help)"},
    {"delete", kvt_cmd_delete, "delete objects by name, key or name prefix (every tier)"},
    {"clear", kvt_cmd_clear, "empty one tier of a server (l1, or an L2 adapter)"},
    {"quota", kvt_cmd_quota, "read, set or remove a namespace's or tenant's quota"},
    {"pin", kvt_cmd_pin, "keep objects from eviction in L1 and L2 (none: list pins)"},
    {"unpin", kvt_cmd_unpin, "let pinned objects be evicted again"},
    {"warm", kvt_cmd_warm, "load objects or a namespace from L2 into L1 (a job)"},
    {"verify", kvt_cmd_verify, "re-read L2 objects, remove the corrupt ones (a job)"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: kvtier <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "  %-10s %s\n", "version", "print the version");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        if (strcmp(cmd, commands[i].name) == 0)
            return commands[i].run(argc - 1, argv + 1);
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
