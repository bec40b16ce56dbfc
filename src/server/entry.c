/* `kvtier server`: parse the flags, then --dry-run's resolved config or a
 * run until SIGTERM/SIGINT. */
#include "server/server.h"

#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>

int kvt_server_main(int argc, char **argv)
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
