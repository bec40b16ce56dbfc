#include "key/blocktag.h"
#include "common/util.h"

#include <stdlib.h>
#include <string.h>

struct kvt_blocktag *kvt_blocktag_new(uint32_t block_size, uint16_t nblocks, uint8_t hash_len,
                                      uint32_t ntokens)
{
    size_t h = hash_len ? hash_len : 8;
    size_t hb = KVT_ALIGN_UP((size_t)nblocks * h, sizeof(uint32_t));
    struct kvt_blocktag *t = kvt_xcalloc(1, sizeof(*t) + hb + (size_t)ntokens * sizeof(uint32_t));
    atomic_init(&t->refs, 1);
    t->ntokens = ntokens;
    t->tokens = (uint32_t *)(void *)(t->hashes + hb);
    t->block_size = block_size;
    t->nblocks = nblocks;
    t->hash_len = hash_len;
    return t;
}

void kvt_blocktag_ref(struct kvt_blocktag *t)
{
    /* relaxed: a new reference is taken from one already held */
    atomic_fetch_add_explicit(&t->refs, 1, memory_order_relaxed);
}

void kvt_blocktag_put(struct kvt_blocktag *t)
{
    /* acq_rel: the thread that frees sees every write made before the
     * other references were dropped */
    if (t && atomic_fetch_sub_explicit(&t->refs, 1, memory_order_acq_rel) == 1)
        free(t);
}
