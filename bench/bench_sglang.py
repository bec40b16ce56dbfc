"""kvtier.sglang.KvtierStorage against SGLang's own file backend (HiCacheFile)
on the same directory, with SGLang's host pool on the CPU (build/sglang-venv).

Each backend is driven as SGLang's cache controller drives it: kvtier with
interface_v1 (batch_set_v1 / batch_get_v1 straight between the host pool and
kvtier's shared-memory pool), HiCacheFile through the controller's generic
path (get_data_page -> batch_set; batch_get into flat pages ->
set_from_flat_data_page). Rounds alternate between the two; every round
stores fresh pages (a set that writes) and reads them back into zeroed host
slots, checking the bytes. kvtier's server has one fs L2 under DIR/kvtier,
HiCacheFile writes DIR/file: the same disk. A set returns when the backend
holds the pages (kvtier: in L1, written to L2 behind; HiCacheFile: in the
page cache); `set_l2` also waits for kvtier's L2 writes (flush), the like
for like figure that set_over_file uses. Gets read what the round just
stored: kvtier from its L1, HiCacheFile from the page cache.

Last line: RESULT sglang get_over_file=<x> set_over_file=<y>
"""

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "python"), os.path.join(ROOT, "tests")]

import torch  # noqa: E402

from sglang.srt.mem_cache.device_pool_info import KVBufferLayout, KVBuffers, MHABufferInfo  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig  # noqa: E402
from sglang.srt.mem_cache.pool_host.base import host_memory_budget_scope  # noqa: E402
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory  # noqa: E402

import kvtier  # noqa: E402
from support.ports import free_port  # noqa: E402


def host_pool(a, tokens):
    dt = torch.bfloat16
    k = tuple(torch.zeros(a.page, a.heads, a.dim, dtype=dt) for _ in range(a.layers))
    v = tuple(torch.zeros(a.page, a.heads, a.dim, dtype=dt) for _ in range(a.layers))
    ptrs = lambda ts: torch.tensor([t.data_ptr() for t in ts], dtype=torch.uint64)  # noqa: E731
    info = MHABufferInfo(buffers=KVBuffers(k=k, v=v, k_data_ptrs=ptrs(k), v_data_ptrs=ptrs(v),
                                           layout=KVBufferLayout.NHD),
                         page_size=a.page, head_num=a.heads, head_dim=a.dim, v_head_dim=a.dim,
                         dtype=dt, device=torch.device("cpu"))
    # SGLang would keep 10 GB of host RAM free; the pool is booked against
    # its own size instead (SGLang's scope for a budget)
    with host_memory_budget_scope(tokens * info.head_num * info.head_dim * 4 * a.layers + 1):
        return MHATokenToKVPoolHost(info, 2.0, 0, a.page, a.layout, pin_memory=False,
                                    device="cpu", device_capacity_tokens=a.page, start_layer=0,
                                    end_layer=a.layers, host_token_capacity=tokens)


def config(backend_extra):
    return HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0,
                                attn_cp_size=1, is_mla_model=False, enable_storage_metrics=False,
                                is_page_first_layout=True, model_name="bench/sglang",
                                extra_config=backend_extra)


def keys_for(tag, n):
    import hashlib
    return [hashlib.sha256(("%s-%d" % (tag, i)).encode()).hexdigest() for i in range(n)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--page", type=int, default=64)
    ap.add_argument("--pages", type=int, default=64, help="pages per round")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2,
                    help="uncounted rounds first: the client maps kvtier's pool page by page "
                         "(a first touch costs a fault), a running engine has long done so")
    ap.add_argument("--layout", default="page_first")
    a = ap.parse_args()

    base = os.path.join(a.dir, "sglang")
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(base)
    pool = host_pool(a, a.pages * a.page * 2)
    idx = pool.alloc(a.pages * a.page)
    page_bytes = pool.get_data_page(0).numel() * 2
    total = a.pages * page_bytes
    l1_gb = max(0.25, 2.5 * total / 1e9)
    port = free_port()
    log = open(os.path.join(base, "server.log"), "wb")
    srv = subprocess.Popen([a.bin, "server", "--port", str(port), "--http-port", "0",
                            "--l1-size-gb", "%.2f" % l1_gb, "--l1-init-size-gb", "%.2f" % l1_gb,
                            "--data-dir", os.path.join(base, "data"),
                            "--l2-prefetch-policy", "retain", "--l2-adapter",
                            json.dumps({"type": "fs", "base_path": os.path.join(base, "kvtier")})],
                           stdout=log, stderr=subprocess.STDOUT)
    url = "tcp://127.0.0.1:%d" % port
    try:
        for _ in range(200):
            try:
                kvtier.Client(url, timeout_ms=500).close()
                break
            except kvtier.KvtierError:
                time.sleep(0.05)
        kv = StorageBackendFactory.create_backend("dynamic", config({
            "backend_name": "kvtier", "module_path": "kvtier.sglang",
            "class_name": "KvtierStorage", "interface_v1": 1, "url": url,
            "max_batch_bytes": 1 << 30}), pool)
        kv.register_mem_pool_host(pool)
        fb = StorageBackendFactory.create_backend(
            "file", config({"file_storage_path": os.path.join(base, "file")}), pool)
        fb.register_mem_pool_host(pool)

        g = torch.Generator().manual_seed(0)
        starts = [int(idx[p * a.page]) for p in range(a.pages)]

        def fill():
            for s in starts:
                page = pool.get_data_page(s, flat=False)
                page.copy_(torch.randn(page.shape, generator=g).to(page.dtype))
            return [pool.get_data_page(s).clone() for s in starts]

        def zero():
            for s in starts:
                pool.get_data_page(s, flat=False).zero_()

        def check(want):
            for s, w in zip(starts, want):
                assert torch.equal(pool.get_data_page(s), w), "bytes differ"

        def kv_set(keys):
            return all(kv.batch_set_v1(keys, idx))

        def kv_get(keys):
            return all(kv.batch_get_v1(keys, idx))

        def file_set(keys):
            return fb.batch_set(keys, [pool.get_data_page(s) for s in starts])

        def file_get(keys):
            got = fb.batch_get(keys, [pool.get_dummy_flat_data_page() for _ in keys])
            for s, d in zip(starts, got):
                if d is None:
                    return False
                pool.set_from_flat_data_page(s, d)
            return True

        res = {"kvtier": {"set": [], "get": [], "set_l2": []}, "file": {"set": [], "get": []}}
        for r in range(-a.warmup, a.rounds):
            for name, st, gt in (("kvtier", kv_set, kv_get), ("file", file_set, file_get)) \
                    if r % 2 == 0 else (("file", file_set, file_get), ("kvtier", kv_set, kv_get)):
                keys = keys_for("%s-%d" % (name, r + a.warmup), a.pages)
                want = fill()
                t0 = time.perf_counter()
                assert st(keys), name + " set failed"
                t1 = time.perf_counter()
                if name == "kvtier":
                    # the L2 (disk) copies are written too: a flush covers the stores of
                    # the client that made them, the backend's client of this thread
                    kv._conn().get().flush(check=True)
                    if r >= 0:
                        res[name]["set_l2"].append(total / (time.perf_counter() - t0) / 1e9)
                zero()
                t2 = time.perf_counter()
                assert gt(keys), name + " get failed"
                t3 = time.perf_counter()
                check(want)
                if r < 0:
                    continue
                res[name]["set"].append(total / (t1 - t0) / 1e9)
                res[name]["get"].append(total / (t3 - t2) / 1e9)
        med = {n: {k: statistics.median(v) for k, v in d.items()} for n, d in res.items()}
        print("SGLang host pool %s, page %d tokens x %d layers x %d heads x %d dim bf16 = %.1f MiB, "
              "%d pages a round, %d rounds after %d uncounted (median GB/s):"
              % (a.layout, a.page, a.layers, a.heads, a.dim, page_bytes / 2**20, a.pages, a.rounds,
                 a.warmup))
        print("  kvtier  set %.2f  get %.2f  (set incl. fs L2 flush %.2f)"
              % (med["kvtier"]["set"], med["kvtier"]["get"], med["kvtier"]["set_l2"]))
        print("  file    set %.2f  get %.2f" % (med["file"]["set"], med["file"]["get"]))
        # set: like for like, kvtier's set until its fs L2 files are written
        # (HiCacheFile's set returns once its file is written, no fsync either);
        # the set SGLang's backup thread waits for returns once in kvtier's L1
        print("  kvtier / file: get %.2f, set to L1 %.2f, set incl. L2 %.2f"
              % (med["kvtier"]["get"] / med["file"]["get"], med["kvtier"]["set"] / med["file"]["set"],
                 med["kvtier"]["set_l2"] / med["file"]["set"]))
        print("RESULT sglang get_over_file=%.2f set_over_file=%.2f"
              % (med["kvtier"]["get"] / med["file"]["get"], med["kvtier"]["set_l2"] / med["file"]["set"]))
        kv.close()
    finally:
        srv.send_signal(signal.SIGTERM)
        srv.wait(timeout=60)
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
