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

#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <emmintrin.h>
#endif

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

/*
 * One segment (a block's bytes of one layer and one K/V slice: 16-256 KiB
 * for real models). A plain memcpy of it writes through the cache: each
 * destination line is first read (read for ownership), twice the memory
 * traffic of the copy, and glibc turns to non-temporal stores only for
 * copies of several MiB (a fraction of the last-level cache), which is why
 * one memcpy of a whole chunk ran at twice the rate of its blocks copied
 * one by one. Segments from 16 KiB are written with non-temporal stores
 * (SSE2, every x86-64): no read of the destination, no cache pollution
 * (neither side reads the bytes again soon: the engine's next forward pass
 * or the server's L2 write stream them). copy_one fences once at its end,
 * before the caller may hand the bytes to anyone.
 */
#define NT_MIN ((size_t)16 << 10)

static void copy_seg(void *dst, const void *src, size_t n)
{
#if defined(__x86_64__) || defined(__i386__)
    if (n >= NT_MIN) {
        uint8_t *d = dst;
        const uint8_t *s = src;
        size_t head = (16 - ((uintptr_t)d & 15)) & 15;
        memcpy(d, s, head);
        d += head;
        s += head;
        n -= head;
        for (; n >= 64; n -= 64, d += 64, s += 64) {
            __m128i x0 = _mm_loadu_si128((const __m128i *)(const void *)s);
            __m128i x1 = _mm_loadu_si128((const __m128i *)(const void *)(s + 16));
            __m128i x2 = _mm_loadu_si128((const __m128i *)(const void *)(s + 32));
            __m128i x3 = _mm_loadu_si128((const __m128i *)(const void *)(s + 48));
            _mm_stream_si128((__m128i *)(void *)d, x0);
            _mm_stream_si128((__m128i *)(void *)(d + 16), x1);
            _mm_stream_si128((__m128i *)(void *)(d + 32), x2);
            _mm_stream_si128((__m128i *)(void *)(d + 48), x3);
        }
        memcpy(d, s, n);
        return;
    }
#endif
    memcpy(dst, src, n);
}

/* Non-temporal stores are weakly ordered: make them visible before the
 * copy is reported done. */
static void copy_fence(void)
{
#if defined(__x86_64__) || defined(__i386__)
    _mm_sfence();
#endif
}

static int check(const kvt_copy_layer *layers, uint32_t nlayers, const void *object,
                 size_t object_len, const int64_t *blocks, uint32_t nblocks)
{
    if ((!layers && nlayers) || (!object && object_len) || (!blocks && nblocks))
        return KVT_E_BADREQ;
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
    return 0;
}

/* One checked chunk. */
static void copy_one(bool to_object, const kvt_copy_layer *layers, uint32_t nlayers, void *object,
                     size_t object_len, const int64_t *blocks, uint32_t nblocks)
{
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
                    copy_seg(o, b, L->seg_bytes);
                else
                    copy_seg(b, o, L->seg_bytes);
            }
        }
    }
    copy_fence();
}

int kvt_copy_blocks(bool to_object, const kvt_copy_layer *layers, uint32_t nlayers, void *object,
                    size_t object_len, const int64_t *blocks, uint32_t nblocks)
{
    /* a bad argument copies nothing */
    int rc = check(layers, nlayers, object, object_len, blocks, nblocks);
    if (rc)
        return rc;
    copy_one(to_object, layers, nlayers, object, object_len, blocks, nblocks);
    return 0;
}

struct chunks_job {
    bool to_object;
    const kvt_copy_layer *layers;
    uint32_t nlayers, nblocks, nchunks, step, first;
    void *const *objects;
    size_t object_len;
    const int64_t *blocks;
};

static void *chunks_run(void *arg)
{
    const struct chunks_job *j = arg;
    for (uint32_t c = j->first; c < j->nchunks; c += j->step)
        copy_one(j->to_object, j->layers, j->nlayers, j->objects[c], j->object_len,
                 j->blocks + (size_t)c * j->nblocks, j->nblocks);
    return NULL;
}

int kvt_copy_chunks(bool to_object, const kvt_copy_layer *layers, uint32_t nlayers,
                    void *const *objects, size_t object_len, const int64_t *blocks,
                    uint32_t nblocks, uint32_t nchunks, uint32_t nthreads)
{
    if (nchunks && !objects)
        return KVT_E_BADREQ;
    for (uint32_t c = 0; c < nchunks; c++) {
        int rc = check(layers, nlayers, objects[c], object_len,
                       blocks ? blocks + (size_t)c * nblocks : NULL, nblocks);
        if (rc)
            return rc;
    }
    uint32_t k = nthreads < 1 ? 1 : nthreads > 64 ? 64 : nthreads;
    if (k > nchunks)
        k = nchunks ? nchunks : 1;
    struct chunks_job jobs[64];
    pthread_t tids[64];
    uint32_t started = 0;
    for (uint32_t t = 0; t < k; t++)
        jobs[t] = (struct chunks_job){.to_object = to_object,
                                      .layers = layers,
                                      .nlayers = nlayers,
                                      .nblocks = nblocks,
                                      .nchunks = nchunks,
                                      .step = k,
                                      .first = t,
                                      .objects = objects,
                                      .object_len = object_len,
                                      .blocks = blocks};
    for (uint32_t t = 1; t < k; t++) {
        if (pthread_create(&tids[t], NULL, chunks_run, &jobs[t]) != 0)
            break; /* no thread: the caller copies the rest itself */
        started = t;
    }
    /* the caller takes its own share and the shares of threads not started */
    for (uint32_t t = 0; t < k; t++)
        if (t == 0 || t > started)
            chunks_run(&jobs[t]);
    for (uint32_t t = 1; t <= started; t++)
        pthread_join(tids[t], NULL);
    return 0;
}
