/*
 * Block copies between an engine's paged KV cache (host memory) and one
 * kvtier object: the CPU half of python/kvtier/kvcopy.py, here so that the
 * copy is a plain memcpy per contiguous piece, run without Python's GIL
 * (ctypes drops it for the call), instead of a tensor indexing kernel.
 *
 * Object layout (docs/vllm.md): for each layer, in order, the chunk's blocks
 * of that layer as index_select(block_dim) lays them out: for each leading
 * slice p (K and V of a [2, num_blocks, ...] tensor; one slice when blocks
 * lead), the n blocks' bytes in chunk order.
 */
#include "kvtier/client.h"

#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22 /* Linux 5.14 */
#define MADV_POPULATE_WRITE 23
#endif

/* A pool slot this process has not touched yet costs one page fault per
 * 4 KiB page inside the copy loop (16384 for a 64 MiB load, about as long
 * as the copy itself); one madvise maps them all in a single kernel call.
 * Older kernels refuse (EINVAL) and the copy faults them in as before. */
static void populate(void *p, size_t len, bool write)
{
    long pg = sysconf(_SC_PAGESIZE);
    uintptr_t a = (uintptr_t)p & ~(uintptr_t)(pg - 1);
    uintptr_t e = ((uintptr_t)p + len + (uintptr_t)pg - 1) & ~(uintptr_t)(pg - 1);
    (void)madvise((void *)a, e - a, write ? MADV_POPULATE_WRITE : MADV_POPULATE_READ);
}

int kvt_copy_blocks(bool to_object, const kvt_copy_layer *layers, uint32_t nlayers, void *object,
                    size_t object_len, const int64_t *blocks, uint32_t nblocks)
{
    if ((!layers && nlayers) || (!object && object_len) || (!blocks && nblocks))
        return KVT_E_BADREQ;
    /* check everything first: a bad argument copies nothing */
    for (uint32_t l = 0; l < nlayers; l++) {
        const kvt_copy_layer *L = &layers[l];
        if (!L->base || !L->lead || !L->seg_bytes)
            return KVT_E_BADREQ;
        uint64_t span = (uint64_t)L->lead * nblocks * L->seg_bytes;
        if (L->obj_off > object_len || span > object_len - L->obj_off)
            return KVT_E_BADREQ;
    }
    for (uint32_t i = 0; i < nblocks; i++)
        for (uint32_t l = 0; l < nlayers; l++)
            if (blocks[i] >= (int64_t)layers[l].num_blocks)
                return KVT_E_BADREQ;
    uint8_t *obj = object;
    if (object_len)
        populate(object, object_len, to_object);
    for (uint32_t l = 0; l < nlayers; l++) {
        const kvt_copy_layer *L = &layers[l];
        uint8_t *base = (uint8_t *)(uintptr_t)L->base;
        for (uint32_t p = 0; p < L->lead; p++) {
            uint8_t *o = obj + L->obj_off + (uint64_t)p * nblocks * L->seg_bytes;
            uint8_t *t = base + (uint64_t)p * L->lead_stride;
            for (uint32_t i = 0; i < nblocks; i++, o += L->seg_bytes) {
                if (blocks[i] < 0) /* the engine already holds this block */
                    continue;
                uint8_t *b = t + (uint64_t)blocks[i] * L->block_stride;
                if (to_object)
                    memcpy(o, b, L->seg_bytes);
                else
                    memcpy(b, o, L->seg_bytes);
            }
        }
    }
    return 0;
}
