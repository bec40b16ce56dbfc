/*
 * The front ends that have listeners of their own: one line each, its
 * descriptor (front/front.h) and where its flags are in the server's
 * configuration. The server drives them through this table only: a new
 * front end is a folder under src/front/, a line here and its flags
 * (options.c). kvtier's own protocol is served by the rpc loop itself
 * (front/native).
 */
#include "front/lmcache/lmc.h"
#include "server/internal.h"

#include <stddef.h>

const struct kvt_front kvt_fronts[] = {
    {&kvt_front_lmcache, offsetof(struct kvt_server_cfg, lmc)},
};
const int kvt_nfronts = (int)(sizeof(kvt_fronts) / sizeof(kvt_fronts[0]));

_Static_assert(sizeof(kvt_fronts) / sizeof(kvt_fronts[0]) <= KVT_MAX_FRONTS,
               "struct kvt_server keeps KVT_MAX_FRONTS front ends");

int kvt_fronts_listen(struct kvt_server *s, char *err, size_t cap)
{
    for (int i = 0; i < kvt_nfronts; i++) {
        const struct kvt_front *f = &kvt_fronts[i];
        int rc =
            f->desc->listen(&s->env, (const char *)s->cfg + f->cfg_off, &s->fronts[i], err, cap);
        if (rc)
            return rc;
    }
    return 0;
}

int kvt_fronts_start(struct kvt_server *s, char *err, size_t cap)
{
    for (int i = 0; i < kvt_nfronts; i++) {
        if (!s->fronts[i])
            continue;
        int rc = kvt_fronts[i].desc->start(s->fronts[i], err, cap);
        if (rc)
            return rc;
    }
    return 0;
}

void kvt_fronts_stop(struct kvt_server *s)
{
    for (int i = 0; i < kvt_nfronts; i++)
        if (s->fronts[i])
            kvt_fronts[i].desc->stop(s->fronts[i]);
}

void kvt_fronts_free(struct kvt_server *s)
{
    for (int i = 0; i < kvt_nfronts; i++)
        if (s->fronts[i]) {
            kvt_fronts[i].desc->free(s->fronts[i]);
            s->fronts[i] = NULL;
        }
}

void kvt_fronts_status(struct kvt_server *s, json_t *o)
{
    for (int i = 0; i < kvt_nfronts; i++)
        if (s->fronts[i])
            json_object_set_new(o, kvt_fronts[i].desc->name,
                                kvt_fronts[i].desc->status(s->fronts[i]));
}

void kvt_fronts_banner(struct kvt_server *s)
{
    for (int i = 0; i < kvt_nfronts; i++)
        if (s->fronts[i] && kvt_fronts[i].desc->banner)
            kvt_fronts[i].desc->banner(s->fronts[i]);
}
