"""The connector's copy routines without vLLM (kvtier.kvcopy): a paged KV
cache (vLLM's [2, num_blocks, block_size, heads, head_dim] per layer) on the
CPU or a CUDA device, random block tables, chunks gathered into a real kvtier
server's shared-memory pool (store) and scattered back (load), compared in the
same run with the physical limit for the same bytes: a memcpy on the CPU, a
cudaMemcpy between pinned host memory and the device on CUDA.

    python bench/bench_kvcopy.py tcp://127.0.0.1:5555 [--device cuda] [--chunks 64]

The server must run on this host with a chunk size of --chunk tokens. On the
CPU the copies go through kvt_copy_chunks (memcpy per block, without the GIL);
the same rounds through torch's indexing kernels are printed for comparison.
Last line: RESULT kvcopy store_over_limit=<x> load_over_limit=<y>
"""

import argparse
import os
import random
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))

import torch  # noqa: E402

import kvtier  # noqa: E402
from kvtier.kvcopy import PagedLayout, register_pinned  # noqa: E402


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def limit_seconds(nbytes, dev, pool_view=None):
    """The same bytes moved once: memcpy (CPU) or pinned<->device cudaMemcpy."""
    if dev.type == "cpu":
        a = torch.empty(nbytes, dtype=torch.uint8)
        b = torch.empty(nbytes, dtype=torch.uint8)
        a.fill_(1)
        b.copy_(a)
        best = min(_timed(lambda: b.copy_(a)) for _ in range(5))
        return best, best
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    devb = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    host.fill_(1)
    d2h = min(_timed(lambda: (host.copy_(devb, non_blocking=True), sync(dev))) for _ in range(5))
    h2d = min(_timed(lambda: (devb.copy_(host, non_blocking=True), sync(dev))) for _ in range(5))
    return d2h, h2d


def _timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--chunks", type=int, default=16)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cache-gib", type=float, default=None,
                    help="place the layers in one zeroed buffer of this size, as vLLM allocates "
                         "its KV cache (vllm/v1/worker/utils.py allocate_kv_cache), so the "
                         "blocks spread over it; default: a cache just large enough")
    a = ap.parse_args()
    dev = torch.device(a.device)
    dt = getattr(torch, a.dtype)
    bpc = a.chunk // a.block
    nb = a.chunks * bpc * 2 + 8
    if a.cache_gib:
        per_block = 2 * a.block * a.heads * a.head_dim * dt.itemsize
        nb = max(nb, int(a.cache_gib * 2 ** 30) // (a.layers * per_block))
        buf = torch.zeros(nb * per_block * a.layers, dtype=torch.int8, device=dev)
        n = nb * per_block
        caches = {"layer.%d" % i: buf[i * n:(i + 1) * n].view(dt).view(2, nb, a.block, a.heads,
                                                                         a.head_dim)
                  for i in range(a.layers)}
    else:
        caches = {"layer.%d" % i: torch.randn(2, nb, a.block, a.heads, a.head_dim,
                                              device=dev).to(dt)
                  for i in range(a.layers)}
    L = PagedLayout(caches, nb, a.block, a.chunk)
    c = kvtier.Client(a.url)
    if c.chunk_size != a.chunk:
        sys.exit("the server's chunk size is %d, not --chunk %d" % (c.chunk_size, a.chunk))
    if not c.shm_active:
        sys.exit("no shared-memory pool: run the server on this host")
    unpin = register_pinned(*c.pool) if dev.type == "cuda" else None
    total = L.chunk_bytes * a.chunks
    print("%s: %d layers, chunk %d tokens = %.2f MiB, %d chunks = %.1f MiB a round, %s, "
          "%d copy threads, blocks drawn from %d (%.2f GiB); memcpy = torch's copy_ with %d "
          "threads"
          % (dev, a.layers, a.chunk, L.chunk_bytes / 2 ** 20, a.chunks, total / 2 ** 20, a.dtype,
             L.copy_threads if L._ccopy is not None else 1, nb,
             nb * L.chunk_bytes / bpc / 2 ** 30, torch.get_num_threads()))

    def rounds(paths):
        r = random.Random(7)
        st, ld = [], []
        for rnd in range(a.rounds):
            blocks = r.sample(range(nb), a.chunks * bpc * 2)
            src = [blocks[i * bpc:(i + 1) * bpc] for i in range(a.chunks)]
            dst = [blocks[(a.chunks + i) * bpc:(a.chunks + i + 1) * bpc] for i in range(a.chunks)]
            toks = [r.randrange(1 << 30) for _ in range(a.chunk * a.chunks)]
            keys = kvtier.chunk_keys("kvcopy-bench", toks, chunk_size=a.chunk)
            t0 = time.perf_counter()
            with c.store_view(keys, [L.chunk_bytes] * a.chunks, dtype=L.dtype_name,
                              shape=L.shape) as vs:
                paths.gather_many(zip(src, vs))
            st.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            with c.retrieve_view(keys) as vs:
                assert len(vs) == a.chunks
                paths.scatter_many(zip(vs, dst))
            sync(dev)
            ld.append(time.perf_counter() - t0)
            if rnd == 0:
                for t in caches.values():
                    assert torch.equal(t[:, dst[0]], t[:, src[0]]), "scatter(gather(x)) != x"
            c.delete(keys)
        return min(st), min(ld)

    s, l = rounds(L)
    torch_path = None
    if L._ccopy is not None:
        # the same copies through torch's indexing kernels, for comparison
        T = PagedLayout(caches, nb, a.block, a.chunk)
        T._ccopy = None
        torch_path = rounds(T)
    lim_store, lim_load = limit_seconds(total, dev)
    what = "memcpy" if dev.type == "cpu" else "cudaMemcpy pinned"
    print("store (gather into pool + commit): %.3f s = %.2f GB/s; %s %.3f s = %.2f GB/s; ratio %.2f"
          % (s, total / s / 1e9, what, lim_store, total / lim_store / 1e9, lim_store / s))
    print("load (retrieve + scatter):         %.3f s = %.2f GB/s; %s %.3f s = %.2f GB/s; ratio %.2f"
          % (l, total / l / 1e9, what, lim_load, total / lim_load / 1e9, lim_load / l))
    if torch_path:
        ts, tl = torch_path
        print("torch index_select/index_copy_ instead of kvt_copy_chunks: store %.3f s (%.2f GB/s), "
              "load %.3f s (%.2f GB/s)" % (ts, total / ts / 1e9, tl, total / tl / 1e9))
    if unpin:
        unpin()
    c.close()
    print("RESULT kvcopy store_over_limit=%.2f load_over_limit=%.2f" % (lim_store / s, lim_load / l))


if __name__ == "__main__":
    main()
