/*
 * Private to the server's configuration: the flag table and its parser
 * (options.c) and the checks across flags that follow it (config.c).
 */
#ifndef KVT_SERVER_CONFIG_INT_H
#define KVT_SERVER_CONFIG_INT_H

#include "server/config.h"

/* One parse of argv: the configuration being filled and what the flags
 * leave for the checks after them. */
struct kvt_opt_parse {
    struct kvt_server_cfg *c;
    const char *l2_args[KVT_MAX_ADAPTERS]; /* --l2-adapter values, in order */
    int nl2;
    const char *config_path; /* --config */
    bool bind_given;         /* --host, --port or --bind was given */
};

/* Every field zeroed, then each flag's default from the table. */
void kvt_opt_defaults(struct kvt_opt_parse *p);
/* Apply argv's flags. 0; 1 after --help (printed); 2 after an error
 * naming the flag (printed). */
int kvt_opt_parse_args(struct kvt_opt_parse *p, int argc, char **argv);
/* "kvtier server: --FLAG: " + fmt with val, on stderr. Returns 2. */
int kvt_opt_fail(const char *flag, const char *fmt, const char *val);
/* A finite number in [min, max] for flag; 0 or 2 (printed). */
int kvt_opt_num(const char *flag, const char *s, double min, double max, double *out);

#endif
