"""bench/run.sh vllm: time to first token of a real vLLM engine (CPU build) on a
prompt long enough that prefill dominates, in one run, alternating:

  (a) no connector (cold prefill)
  (b) kvtier connector, hit from L1
  (c) kvtier connector, hit from the fs L2 after a kvtier restart
  (d) vLLM's own CPU KV offloading (OffloadingConnector), hit from its CPU tier

and the connector's load throughput against a memcpy of the same bytes in the
same run; and, in every round after (c), fio reading as many bytes from
files of the chunks' size in the same directory as kvtier's fs tier (its
I/O mode and queue depth: buffered, 4 jobs), so that the L2 load inside
vLLM, (c) - (b), reads as a multiple of what the directory itself allows. vLLM's prefix cache is reset before every timed request, so a hit
can only come from the connector. The model is a ~100M-parameter Llama with
random weights built locally (nothing downloaded).

Last line: RESULT vllm ttft_hit_over_cold=<b/a> l2_load_over_fio=<((c)-(b))/fio>
identical=<yes|no>
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# the test harness (tests/support) and the kvtier module, as pytest.ini's pythonpath
sys.path[:0] = [os.path.join(ROOT, "tests"), os.path.join(ROOT, "python")]
os.environ.setdefault("KVTIER_LIB", os.path.join(ROOT, "build", "libkvtier_client.so"))

import kvtier  # noqa: E402
from fio_run import fio_bw  # noqa: E402
from support.engine import Engine, kvtier_connector_config  # noqa: E402
from support.model import make_tiny_model  # noqa: E402
from support.ports import free_port  # noqa: E402

BLOCK = 32


class Kvtier:
    def __init__(self, binary, data, chunk, l1_gb, log):
        self.cmd = [binary, "server", "--port", str(free_port()), "--http-port", "0",
                    "--chunk-size", str(chunk), "--l2-prefetch-policy", "retain", "--l1-size-gb", str(l1_gb), "--data-dir", data,
                    "--log-level", "warn"]
        self.url = "tcp://127.0.0.1:%s" % self.cmd[3]
        self.log = log
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(self.cmd, stdout=open(self.log, "ab"), stderr=subprocess.STDOUT)
        for _ in range(400):
            try:
                with kvtier.Client(self.url, timeout_ms=500) as c:
                    c.ping()
                    st = c.status()
                if all(a["recovery"]["state"] == "done" for a in st["l2"]):
                    return
            except kvtier.KvtierError:
                pass
            time.sleep(0.05)
        raise RuntimeError("kvtier did not start")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)

    def held(self, keys):
        with kvtier.Client(self.url, timeout_ms=5000) as c:
            n = c.lookup(keys)
            c.free_locks()
            return n


def ttft(eng, toks):
    """Seconds of a 1-token generate (prefill + first token), inside the engine
    process, and the token."""
    r = eng.generate([{"tokens": toks}], max_tokens=1)
    return r["seconds"], r["outputs"][0]["tokens"], r["metrics"]


def memcpy_seconds(url, keys, threads):
    """The physical limit of a load: the same pool bytes (kvtier's shared
    memory, as the connector reads them) copied by libc memcpy into memory
    already written, by as many threads as the connector copied with, best
    of 5, with vLLM idle."""
    import ctypes
    import threading
    import warnings
    import torch
    with kvtier.Client(url) as c, c.retrieve_view(keys) as views:
        total = sum(len(v) for v in views)
        dst = torch.ones(total, dtype=torch.uint8)    # written: its pages are mapped
        jobs, off = [], 0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")               # frombuffer of a read-only view
            for v in views:
                jobs.append((dst.data_ptr() + off, torch.frombuffer(v, dtype=torch.uint8).data_ptr(),
                             len(v)))
                off += len(v)
        k = max(1, min(threads, len(jobs)))

        def run(i):  # ctypes.memmove drops the GIL
            for d, src, n in jobs[i::k]:
                ctypes.memmove(d, src, n)

        best = None
        for _ in range(5):
            ts = [threading.Thread(target=run, args=(i,)) for i in range(1, k)]
            t0 = time.perf_counter()
            for t in ts:
                t.start()
            run(0)
            for t in ts:
                t.join()
            dt = time.perf_counter() - t0
            best = dt if best is None else min(best, dt)
        return best, total


def fio_read_seconds(d, nfiles, size):
    """Seconds fio needs to read nfiles files of size bytes under d, as the
    fs tier reads a prefix: buffered, 4 jobs (its 4 workers), 4 MiB reads.
    The files are laid out by the first call (written, so in the page cache
    as kvtier's recently stored chunks are)."""
    jobs = max(1, min(4, nfiles))
    per = max(1, nfiles // jobs)
    size = max(4096, size // 4096 * 4096)
    os.makedirs(d, exist_ok=True)
    bw = fio_bw("read", jobs, ["--nrfiles=%d" % per, "--filesize=%d" % size, "--directory=%s" % d])
    return jobs * per * size / bw


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--prompt", type=int, default=4096)
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--copy-threads", type=int, default=None,
                    help="the connector's copy_threads (default: its own, min(4, cores))")
    ap.add_argument("--copy-cpus", default=None,
                    help='the connector\'s copy_cpus: "inherit", or CPU ids "1,3" (default: its own)')
    ap.add_argument("--dir", default=os.environ.get("BENCH_DIR", "/var/tmp/kvtier-bench"))
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "kvtier"))
    a = ap.parse_args()

    work = tempfile.mkdtemp(prefix="vllm-", dir=a.dir)
    model = make_tiny_model(
        os.path.join(a.dir, "model-%dx%d" % (a.layers, a.hidden)), layers=a.layers,
        hidden=a.hidden, heads=a.heads, kv_heads=a.heads, vocab=a.vocab,
        intermediate=int(a.hidden * 8 / 3) // 64 * 64, max_pos=a.prompt + 1024)
    nparams = a.layers * (4 * a.hidden ** 2 + 3 * a.hidden * (int(a.hidden * 8 / 3) // 64 * 64)) \
        + 2 * a.vocab * a.hidden
    kv_bytes = a.prompt * a.layers * 2 * a.hidden * 4
    print("model: %d layers, hidden %d, ~%.0fM parameters (random), fp32; prompt %d tokens "
          "(%.0f MiB of KV); chunk %d, block %d; %d rounds"
          % (a.layers, a.hidden, nparams / 1e6, a.prompt, kv_bytes / 2 ** 20, a.chunk, BLOCK,
             a.rounds))
    stats_file = os.path.join(work, "loads.jsonl")
    kvt = Kvtier(a.bin, os.path.join(work, "data"), a.chunk, max(1, kv_bytes * 4 // 2 ** 30 + 1),
                 os.path.join(work, "kvtier.log"))
    kvt.start()
    common = dict(max_model_len=a.prompt + 1024, max_num_batched_tokens=a.prompt + 1024,
                  max_num_seqs=2, env={"VLLM_CPU_KVCACHE_SPACE": "3"})
    extra = {} if a.copy_threads is None else {"copy_threads": a.copy_threads}
    if a.copy_cpus is not None:
        extra["copy_cpus"] = (a.copy_cpus if a.copy_cpus == "inherit"
                              else [int(x) for x in a.copy_cpus.split(",")])
    cfg_b = kvtier_connector_config(kvt.url, timeout_ms=30000, **extra)
    eng_a = Engine(model, None, log=os.path.join(work, "engine-a.log"), **common)
    eng_b = Engine(model, cfg_b, log=os.path.join(work, "engine-b.log"),
                           **dict(common, env={"VLLM_CPU_KVCACHE_SPACE": "3",
                                               "KVTIER_VLLM_STATS": stats_file}))
    eng_d, d_err = None, None
    cfg_d = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
             "kv_connector_extra_config": {"cpu_bytes_to_use": kv_bytes * 4}}
    try:
        eng_d = Engine(model, cfg_d, log=os.path.join(work, "engine-d.log"), **common)
    except Exception as e:  # noqa: BLE001 - reported, the other rows still run
        d_err = str(e).splitlines()[0]
        with open(os.path.join(work, "engine-d.log"), errors="replace") as f:
            why = [l for l in f if "Worker failed with error" in l]
        if why:  # vLLM's own reason (the CPU build has no CPU offloading)
            d_err = why[-1].split("Worker failed with error", 1)[1].split(", please")[0].strip(" '")

    import random
    # warm-up: every engine's first request pays one-time costs (allocation,
    # the connector's first connection): one untimed request each
    warm = [random.Random(1).randrange(3, a.vocab - 1) for _ in range(2 * a.chunk + 7)]
    for e in (eng_a, eng_b, eng_d):
        if e is not None:
            ttft(e, warm)
            e.reset()
    rows = {"a": [], "b": [], "c": [], "d": [], "fio": []}
    identical = True
    loads, loads_c = [], []
    for i in range(a.rounds):
        r = random.Random(1000 + i)
        toks = [r.randrange(3, a.vocab - 1) for _ in range(a.prompt)]
        keys = kvtier.chunk_keys(model, toks, chunk_size=a.chunk, kv_rank=kvtier.kv_rank(1, 0, 1, 0))
        eng_a.reset()
        t, cold_tok, _ = ttft(eng_a, toks)
        rows["a"].append(t)
        eng_b.reset()
        ttft(eng_b, toks)                                  # computes and stores
        for _ in range(600):
            if kvt.held(keys) == len(keys):
                break
            time.sleep(0.1)
        with kvtier.Client(kvt.url) as c:
            c.flush()
        # the page cache's writeback of the chunks just written would run
        # during (b) and take CPU from it: let it finish first
        os.sync()
        eng_b.reset()
        open(stats_file, "w").close()
        t, tok, m = ttft(eng_b, toks)                      # (b) from L1
        rows["b"].append(t)
        identical &= tok == cold_tok
        with open(stats_file) as f:
            loads += [json.loads(l) for l in f if l.strip()]
        kvt.stop()
        kvt.start()
        eng_b.reset()
        os.sync()
        open(stats_file, "w").close()
        t, tok, _ = ttft(eng_b, toks)                      # (c) from the fs L2
        rows["c"].append(t)
        identical &= tok == cold_tok
        with open(stats_file) as f:
            loads_c += [json.loads(l) for l in f if l.strip()]
        # fio reads the bytes (c) loaded, from the same directory
        rows["fio"].append(fio_read_seconds(os.path.join(work, "fio"), len(keys),
                                            kv_bytes // len(keys)))
        if eng_d is not None:
            eng_d.reset()
            ttft(eng_d, toks)                              # computes and offloads
            time.sleep(1.0)                                # its offload is asynchronous
            eng_d.reset()
            t, tok, _ = ttft(eng_d, toks)
            rows["d"].append(t)
            identical &= tok == cold_tok
        print("round %d: a %.3f s, b %.3f s, c %.3f s, d %s, fio read %.3f s" % (
            i + 1, rows["a"][-1], rows["b"][-1], rows["c"][-1],
            "%.3f s" % rows["d"][-1] if rows["d"] else "n/a", rows["fio"][-1]), flush=True)
        last_keys = keys
    for e in (eng_a, eng_b, eng_d):
        if e is not None:
            e.close()

    med = {k: statistics.median(v) for k, v in rows.items() if v}
    print()
    print("%-44s %10s %10s" % ("TTFT (median of %d)" % a.rounds, "seconds", "vs (a)"))
    names = {"a": "(a) no connector, cold prefill", "b": "(b) kvtier, hit from L1",
             "c": "(c) kvtier, hit from fs L2 after restart",
             "d": "(d) vLLM OffloadingConnector (CPU tier)"}
    for k in "abcd":
        if k in med:
            print("%-44s %10.3f %10.3f" % (names[k], med[k], med[k] / med["a"]))
        else:
            print("%-44s %10s %10s   (%s)" % (names[k], "n/a", "n/a", d_err or "not run"))
    if loads:
        lb = statistics.median(l["bytes"] for l in loads)
        ls = statistics.median(l["seconds"] for l in loads)
        cs = statistics.median(l.get("copy_seconds", l["seconds"]) for l in loads)
        ct = loads[0].get("copy_threads", 1)
        # the calling copy thread's CPU time over its copy time: near 1 means
        # it ran all along (a slow copy), near 1/2 that it waited for a core
        share = statistics.median(l["copy_thread_cpu_seconds"] / l["copy_seconds"]
                                  for l in loads if l.get("copy_seconds"))
        ms, mb = memcpy_seconds(kvt.url, last_keys, ct)
        assert mb == lb, (mb, lb)
        print("connector load (b): %.1f MiB in %.3f s = %.2f GB/s (of it the copy into the paged "
              "cache, %d thread(s), %.3f s = %.2f GB/s); memcpy of the same pool bytes, as many "
              "threads, vLLM idle, %.3f s = %.2f GB/s; load time / memcpy time %.2f, copy time / "
              "memcpy time %.2f; the copy thread was on a CPU %.0f%% of its copy time"
              % (lb / 2 ** 20, ls, lb / ls / 1e9, ct, cs, lb / cs / 1e9, ms, lb / ms / 1e9,
                 ls / ms, cs / ms, 100 * share))
    kvt.stop()
    if loads and loads_c:
        print("connector load (c), after the restart: %.1f MiB in %.3f s = %.2f GB/s (the L2 read "
              "into L1 included where the load waited for it), against %.3f s in (b)"
              % (statistics.median(l["bytes"] for l in loads_c) / 2 ** 20,
                 statistics.median(l["seconds"] for l in loads_c),
                 statistics.median(l["bytes"] / l["seconds"] / 1e9 for l in loads_c),
                 statistics.median(l["seconds"] for l in loads)))
    l2_load = med["c"] - med["b"]
    print("L2 load inside vLLM, (c) - (b): %.3f s for %.1f MiB; fio reading the same bytes in the "
          "same directory (buffered, 4 jobs): %.3f s; ratio %.2f (goal <= 1.2)"
          % (l2_load, kv_bytes / 2 ** 20, med["fio"], l2_load / med["fio"]))
    if "d" in med:
        print("(b) / (d) %.2f, (c) / (d) %.2f" % (med["b"] / med["d"], med["c"] / med["d"]))
    print("RESULT vllm ttft_hit_over_cold=%.3f l2_load_over_fio=%.2f identical=%s"
          % (med["b"] / med["a"], l2_load / med["fio"], "yes" if identical else "no"))


if __name__ == "__main__":
    main()
