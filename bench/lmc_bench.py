"""LMCache-protocol server benchmark: LMCache's own client (the pinned lmcache
package) drives a server the way vLLM's LMCacheMPConnector does in
engine_driven mode, without vLLM: register, then per request lookup ->
query_prefetch_status -> prepare_store -> copy into the pool -> commit_store
(cold) or lookup -> query -> prepare_retrieve -> copy out -> commit_retrieve
-> end_session (warm). Prints one JSON line (BENCH {...}).

  python bench/lmc_bench.py URL --pid SERVER_PID [--requests 32 --chunks 8
      --layers 8 --hidden 512 --chunk-size 256] [--phase all|retrieve]

Timings are medians per request; cpu_s is the server's user+system CPU
seconds over the phase (from /proc/PID/stat), rss_peak_kb its VmHWM.
"""
import argparse
import hashlib
import json
import os
import statistics
import sys
import time
import uuid


def cpu_s(pid):
    with open("/proc/%d/stat" % pid) as f:
        parts = f.read().rsplit(")", 1)[1].split()
    tck = os.sysconf("SC_CLK_TCK")
    return (int(parts[11]) + int(parts[12])) / tck


def rss_peak_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--phase", default="all", choices=["all", "retrieve"])
    ap.add_argument("--timeout", type=float, default=60)
    ap.add_argument("--settle", type=float, default=5.0,
                    help="seconds between the store and retrieve phases (L2 writes finish)")
    a = ap.parse_args()

    import torch
    from multiprocessing import shared_memory
    from multiprocessing.resource_tracker import unregister
    from lmcache.v1.multiprocess.custom_types import (
        IPCCacheServerKey, RegisterEngineDrivenContextPayload)
    from lmcache.v1.multiprocess.transport.factory import RequestClientFactory

    T = a.timeout
    c = RequestClientFactory.create(a.url)
    C = c.get_chunk_size().result(timeout=T)
    inst = 4242
    model = "bench/model"
    reg = c.register_kv_cache_engine_driven_context(RegisterEngineDrivenContextPayload(
        instance_id=inst, model_name=model, world_size=1, block_size=min(C, 32),
        num_layers=a.layers, hidden_dim_size=a.hidden, dtype_str="float16", use_mla=False,
        num_physical_slots=C)).result(timeout=T)
    shm = shared_memory.SharedMemory(name=reg.shm_name.lstrip("/"), create=False)
    unregister("/" + shm.name, "shared_memory")
    buf = shm.buf
    shape = (2, a.layers, C, a.hidden)
    g = torch.Generator().manual_seed(5)
    src = [torch.randn(*shape, generator=g).to(torch.float16) for _ in range(a.chunks)]
    dst = torch.empty(shape, dtype=torch.float16)

    def toks(r):
        return tuple((r * 1000003 + i * 7 + 11) % 30000 for i in range(a.chunks * C + 1))

    def key(tk, rid, worker, end):
        return IPCCacheServerKey(model_name=model, world_size=1, worker_id=worker,
                                 token_ids=tk, start=0, end=end, request_id=rid,
                                 num_kv_readers=1)

    def view(s):
        t = torch.frombuffer(buf, dtype=getattr(torch, s["dtype"]), count=s["length"] // 2,
                             offset=s["offset"])
        return t.view(s["shape"])

    def lookup(tk, rid):
        c.lookup(key(tk, rid, None, a.chunks * C), 1).result(timeout=T)
        while True:
            r = c.wait_prefetch_status(rid, 5.0).result(timeout=T)
            if r is not None:
                return r

    out = {"chunk_bytes": src[0].numel() * 2, "chunks_per_request": a.chunks,
           "requests": a.requests}
    if a.phase == "all":
        t_store = []
        c0 = cpu_s(a.pid)
        for r in range(a.requests):
            tk = toks(r)
            rid = uuid.uuid4().hex
            t = time.perf_counter()
            lookup(tk, rid)
            ps = c.prepare_store(key(tk, rid, 0, a.chunks * C), inst).result(timeout=T)
            for s, i in zip(ps.context["slots"], ps.context["chunk_indices"]):
                view(s).copy_(src[i])
            ok = c.commit_store(key(tk, rid, 0, a.chunks * C), inst, b"").result(timeout=T)
            c.end_session(rid).result(timeout=T)
            t_store.append(time.perf_counter() - t)
            out["commit_store_false"] = out.get("commit_store_false", 0) + (not ok)
        out["store_cpu_s"] = cpu_s(a.pid) - c0
        out["store_ms"] = statistics.median(t_store) * 1e3
        time.sleep(a.settle)
    t_ret = []
    h = hashlib.sha256()
    hits = 0
    c0 = cpu_s(a.pid)
    for r in range(a.requests):
        tk = toks(r)
        rid = uuid.uuid4().hex
        t = time.perf_counter()
        n = lookup(tk, rid)
        hits += n
        pr = c.prepare_retrieve(key(tk, rid, 0, n * C), inst).result(timeout=T)
        if pr.success:
            for s in pr.context["slots"]:
                dst.copy_(view(s))
                h.update(dst.numpy().tobytes()[:4096])
        c.commit_retrieve(key(tk, rid, 0, n * C), inst).result(timeout=T)
        c.end_session(rid).result(timeout=T)
        t_ret.append(time.perf_counter() - t)
    out["retrieve_cpu_s"] = cpu_s(a.pid) - c0
    out["retrieve_ms"] = statistics.median(t_ret) * 1e3
    out["hit_chunks"] = hits
    out["digest"] = h.hexdigest()[:16]
    out["rss_peak_kb"] = rss_peak_kb(a.pid)
    out["bytes_moved"] = hits * out["chunk_bytes"] + (a.requests * a.chunks * out["chunk_bytes"]
                                                      if a.phase == "all" else 0)
    c.unregister_kv_cache_engine_driven_context(inst).result(timeout=T)
    del view
    shm.close()
    c.close()
    print("BENCH " + json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
