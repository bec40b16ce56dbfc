/* Operator command helpers (see cli.h). */
#include "ops/cli.h"
#include "common/url.h"
#include "kvtier/error.h"

#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

bool kvt_same_dir(const char *a, const char *b)
{
    struct stat x, y;
    return stat(a, &x) == 0 && stat(b, &y) == 0 && S_ISDIR(x.st_mode) && x.st_dev == y.st_dev &&
           x.st_ino == y.st_ino;
}

void kvt_human(char *out, size_t cap, double b)
{
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    int i = 0;
    while (b >= 1024 && i < 5) {
        b /= 1024;
        i++;
    }
    snprintf(out, cap, i ? "%.2f %s" : "%.0f %s", b, u[i]);
}

/* Whether the directory that would hold path exists (a server creates only
 * the root's last level). */
static bool parent_exists(const char *path)
{
    char d[PATH_MAX];
    snprintf(d, sizeof d, "%s", path);
    struct stat st;
    return stat(dirname(d), &st) == 0 && S_ISDIR(st.st_mode);
}

int kvt_cli_target(const char *cmd, const char *config, const char *root, const char *url,
                   bool need_root, struct kvt_cli_target *t)
{
    memset(t, 0, sizeof(*t));
    if (config) {
        char err[1024];
        if (kvt_envcfg_load(config, &t->cfg, err, sizeof(err))) {
            fprintf(stderr, "kvtier %s: --config: %s\n", cmd, err);
            return 2;
        }
        t->have_cfg = true;
    }
    snprintf(t->url, sizeof(t->url), "%s", url ? url : t->have_cfg ? t->cfg.url : KVT_DEFAULT_URL);
    t->url_given = url || (t->have_cfg && t->cfg.url_set);
    char uerr[400];
    if (kvt_url_check(t->url, uerr, sizeof(uerr))) {
        fprintf(stderr, "kvtier %s: %s: %s\n", cmd, url ? "--url" : "KVP_SERVER_URL", uerr);
        kvt_cli_target_free(t);
        return 2;
    }
    const char *want = root ? root : t->have_cfg ? t->cfg.root : NULL;
    if (!want) {
        if (!need_root)
            return 0;
        fprintf(stderr,
                "kvtier %s: no cache root: give --config FILE (KVP_CACHE_ROOT) or "
                "--root DIR\n",
                cmd);
        kvt_cli_target_free(t);
        return 2;
    }
    if (!realpath(want, t->root)) {
        int e = errno;
        if (e == ENOENT && !root && parent_exists(want)) /* no server created it yet */
            fprintf(stderr,
                    "kvtier %s: the cache root %s (KVP_CACHE_ROOT of %s) does not exist "
                    "yet: nothing has been stored there. A server started with this "
                    "config creates it (kvtier server --config %s).\n",
                    cmd, want, config, config);
        else if (e == ENOENT && !root) /* the server would not create it either */
            fprintf(stderr,
                    "kvtier %s: the cache root %s (KVP_CACHE_ROOT of %s) does not exist, "
                    "nor does its parent directory (a server creates only the last "
                    "level): create the parent, or set KVP_CACHE_ROOT (environment or "
                    "%s.local) to a directory of yours.\n",
                    cmd, want, config, config);
        else
            fprintf(stderr, "kvtier %s: cache root %s: %s\n", cmd, want, kvt_strerror(-e));
        kvt_cli_target_free(t);
        return 2;
    }
    struct stat st;
    if (stat(t->root, &st) < 0 || !S_ISDIR(st.st_mode)) {
        fprintf(stderr, "kvtier %s: cache root %s is not a directory\n", cmd, want);
        kvt_cli_target_free(t);
        return 2;
    }
    if (strcmp(t->root, "/") == 0) {
        fprintf(stderr, "kvtier %s: refusing \"/\" as a cache root\n", cmd);
        kvt_cli_target_free(t);
        return 2;
    }
    if (root && t->have_cfg && !kvt_same_dir(t->root, t->cfg.root)) {
        fprintf(stderr,
                "kvtier %s: --root %s is outside the cache root %s (KVP_CACHE_ROOT of "
                "%s): refused\n",
                cmd, root, t->cfg.root, config);
        kvt_cli_target_free(t);
        return 2;
    }
    return 0;
}

void kvt_cli_target_free(struct kvt_cli_target *t)
{
    if (t->have_cfg)
        kvt_envcfg_free(&t->cfg);
    t->have_cfg = false;
}

const char *kvt_cli_adapter_root(const json_t *ad)
{
    const char *fp = json_string_value(json_object_get(ad, "file_path"));
    return fp ? fp : json_string_value(json_object_get(ad, "base_path"));
}

json_t *kvt_cli_pick_adapter(const json_t *status, const char *root)
{
    const json_t *l2 = json_object_get(status, "l2");
    size_t i;
    json_t *a, *first_file = NULL;
    json_array_foreach(l2, i, a)
    {
        const char *fp = kvt_cli_adapter_root(a);
        if (!fp)
            continue;
        if (root && root[0] && kvt_same_dir(fp, root))
            return a;
        if (!first_file)
            first_file = a;
    }
    if (root && root[0])
        return NULL;
    return first_file ? first_file : json_array_get(l2, 0);
}
