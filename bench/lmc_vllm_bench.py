"""bench/run.sh lmcache: kvtier --lmcache-port vs `lmcache server` (the pinned
lmcache package), both driven by the same real vLLM (the pinned CPU build) with
its in-tree LMCacheMPConnector (LMCACHE_MP_TRANSFER_MODE=engine_driven), the
same tiny random model, the same prompts, in one run, alternating:

  TTFT, no connector (cold prefill; the reference outputs)
  TTFT on an L1 hit          (a fresh prompt stored, vLLM's prefix cache reset)
  TTFT on an L2 hit after a server restart (the engine keeps running; its
                              worker registers again on its heartbeat)
  requests per second on a shared-prefix workload: the synthetic Mooncake
      trace's prefix structure (hash_ids -> one chunk of token ids each),
      vLLM's prefix cache reset before every request, so every shared
      prefix comes from the server
  server CPU seconds (user+system of the server's process tree, from ready to
      stop: start-up excluded) and peak RSS (VmHWM, summed over the tree)

Both servers: the same L1 size, one fs L2 on the same kind of directory, given
to both as the same --l2-adapter JSON (LMCache's fs spec); both write every
stored chunk through to the L2 (LMCache's store controller copies every L1
write to its adapters; bytes on disk are printed). Two runs, same engines
(--l2-modes): buffered I/O (use_odirect false, LMCache's default) and
O_DIRECT (use_odirect true) on both sides. The RESULT line is the first mode's.

Last line: RESULT lmcache ttft_kvtier_over_lmcache=<x> cpu_ratio=<y> identical=<yes|no>
  x: the worse (larger) of the L1-hit and L2-hit TTFT ratios (medians)
  y: server CPU seconds per GB moved through the connector, kvtier / lmcache
"""

import argparse
import atexit
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# the test harness (tests/support) and the kvtier module, as pytest.ini's pythonpath
sys.path[:0] = [os.path.join(ROOT, "tests"), os.path.join(ROOT, "python")]

from support.engine import Engine, venv_python  # noqa: E402
from support.model import make_tiny_model  # noqa: E402
from support.ports import free_port  # noqa: E402

BLOCK = 32
HEARTBEAT = 1.0
LMC_ENV = {"LMCACHE_MP_TRANSFER_MODE": "engine_driven", "LMCACHE_DISABLE_BANNER": "1",
           "LMCACHE_USAGE_TRACK": "0", "LMCACHE_TRACK_USAGE": "false"}
TRACE = next((t for t in (os.path.join(ROOT, up, "shared", "data", "mooncake_synthetic_trace.jsonl")
              for up in ("..", os.path.join("..", ".."))) if os.path.exists(t)),
             os.path.join(ROOT, "..", "shared", "data", "mooncake_synthetic_trace.jsonl"))
LIVE = []  # processes to end if the run fails half-way


def _end_live():
    for p in LIVE:
        if p.poll() is None:
            p.kill()
            p.wait()


atexit.register(_end_live)


def tree(pid):
    """pid and its live descendants."""
    kids = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open("/proc/%s/stat" % d) as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                kids.setdefault(ppid, []).append(int(d))
            except (OSError, ValueError, IndexError):
                pass
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += kids.get(p, [])
    return out


def cpu_s(pid):
    tck = os.sysconf("SC_CLK_TCK")
    t = 0
    for p in tree(pid):
        try:
            with open("/proc/%d/stat" % p) as f:
                parts = f.read().rsplit(")", 1)[1].split()
            t += int(parts[11]) + int(parts[12]) + int(parts[13]) + int(parts[14])
        except OSError:
            pass
    return t / tck


def rss_peak_kb(pid):
    t = 0
    for p in tree(pid):
        try:
            with open("/proc/%d/status" % p) as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        t += int(line.split()[1])
        except OSError:
            pass
    return t


def threads_cpu(pid):
    """{(pid, tid): (thread name, CPU seconds)} over pid's tree."""
    tck = os.sysconf("SC_CLK_TCK")
    out = {}
    for p in tree(pid):
        try:
            tids = os.listdir("/proc/%d/task" % p)
        except OSError:
            continue
        for t in tids:
            try:
                with open("/proc/%d/task/%s/stat" % (p, t)) as f:
                    st = f.read()
            except OSError:
                continue
            name = st[st.index("(") + 1:st.rindex(")")]
            f = st.rsplit(")", 1)[1].split()
            out[(p, t)] = (name, (int(f[11]) + int(f[12])) / tck)
    return out


def du(path):
    n = 0
    for d, _, fs in os.walk(path):
        for f in fs:
            try:
                n += os.stat(os.path.join(d, f)).st_size
            except OSError:
                pass
    return n


class Server:
    """One server side; `start`/`stop` keep the same port (the engine's
    connector is configured once) and the same L2 directory."""

    def __init__(self, name, port, l2, log):
        self.name, self.port, self.l2, self.log = name, port, l2, log
        self.proc = None
        self.cpu = 0.0      # CPU seconds, ready .. stop, all instances
        self.rss_kb = 0     # peak over instances
        self._c0 = 0.0
        self.threads = {}   # thread name: CPU s (ready .. stop), all instances
        self._t0 = {}

    def reset(self, l2, odirect):
        """A new L2 directory and I/O mode; counters start again."""
        self.l2, self.odirect = l2, odirect
        os.makedirs(l2)
        self.cpu, self.rss_kb, self.threads = 0.0, 0, {}

    def l2_json(self):
        return json.dumps({"type": "fs", "base_path": self.l2, "use_odirect": self.odirect})

    def cmd(self):
        raise NotImplementedError

    def ready(self):
        raise NotImplementedError

    def start(self):
        self.proc = subprocess.Popen(self.cmd(), stdout=open(self.log, "ab"),
                                     stderr=subprocess.STDOUT, env=self.env())
        LIVE.append(self.proc)
        deadline = time.time() + 300
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("%s exited %s: %s" % (self.name, self.proc.returncode,
                                                         open(self.log).read()[-3000:]))
            if self.ready():
                self._c0 = cpu_s(self.proc.pid)
                self._t0 = threads_cpu(self.proc.pid)
                return
            time.sleep(0.2)
        raise RuntimeError("%s did not come up: %s" % (self.name, open(self.log).read()[-3000:]))

    def env(self):
        return dict(os.environ)

    def cpu_now(self):
        return self.cpu + cpu_s(self.proc.pid) - self._c0

    def settle(self):
        """Wait until everything stored reached the L2."""
        raise NotImplementedError

    def stop(self):
        self.cpu += cpu_s(self.proc.pid) - self._c0
        for k, (name, v) in threads_cpu(self.proc.pid).items():
            self.threads[name] = self.threads.get(name, 0.0) + v - self._t0.get(k, ("", 0.0))[1]
        self.rss_kb = max(self.rss_kb, rss_peak_kb(self.proc.pid))
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


class KvtierServer(Server):
    def __init__(self, binary, port, l2, log, chunk, l1_gb):
        super().__init__("kvtier", port, l2, log)
        self.binary, self.chunk, self.l1_gb = binary, chunk, l1_gb
        self.http = free_port()

    def cmd(self):
        return [self.binary, "server", "--port", str(free_port()), "--http-port", str(self.http),
                "--lmcache-port", str(self.port), "--lmcache-host", "127.0.0.1",
                "--chunk-size", str(self.chunk), "--l1-size-gb", str(self.l1_gb),
                "--no-l1-use-lazy", "--l2-adapter", self.l2_json(),
                "--log-level", "warn"]

    def status(self):
        with urllib.request.urlopen("http://127.0.0.1:%d/status" % self.http, timeout=5) as r:
            return json.loads(r.read())

    def ready(self):
        try:
            st = self.status()
        except OSError:
            return False
        return all(a["recovery"]["state"] == "done" for a in st["l2"])

    def settle(self):
        deadline = time.time() + 60
        while time.time() < deadline:
            st = self.status()["store"]
            if st.get("done_seq", 0) >= st.get("last_seq", 0):
                return
            time.sleep(0.1)

    def registered(self):
        return self.status()["lmcache"]["contexts"] >= 1


class LmcacheServer(Server):
    def __init__(self, exe, port, l2, log, chunk, l1_gb):
        super().__init__("lmcache", port, l2, log)
        self.exe, self.chunk, self.l1_gb = exe, chunk, l1_gb
        self.shm = "kvtbench%d" % port

    def cmd(self):
        return [self.exe, "server", "--host", "127.0.0.1", "--port", str(self.port),
                "--http-port", str(free_port()), "--l1-size-gb", str(self.l1_gb),
                "--eviction-policy", "LRU", "--chunk-size", str(self.chunk),
                "--supported-transfer-mode", "engine_driven", "--shm-name", self.shm,
                "--no-l1-use-lazy", "--disable-observability", "--disable-metrics",
                "--l2-adapter", self.l2_json()]

    def env(self):
        return dict(os.environ, LMCACHE_DISABLE_BANNER="1")

    def start(self):
        self._logpos = os.path.getsize(self.log) if os.path.exists(self.log) else 0
        super().start()

    def ready(self):
        with open(self.log, errors="replace") as f:
            f.seek(self._logpos)
            return "server is running" in f.read()

    def settle(self):
        # no status of its store controller over the wire: the L2 directory
        # stops growing (checked over 1.5 s; at most 60 s)
        deadline, last, since = time.time() + 60, -1, time.time()
        while time.time() < deadline:
            n = du(self.l2)
            if n != last:
                last, since = n, time.time()
            elif time.time() - since > 1.5:
                return
            time.sleep(0.25)

    def registered(self):
        return None  # unknown: the caller waits a few heartbeats


def mooncake_prompts(n, max_blocks, chunk, vocab, path=TRACE, scan=4000, per_group=3):
    """n requests of the trace whose prefixes are shared most (at most
    per_group of one first hash_id, so several prefixes), in trace order,
    each cut to max_blocks hash_ids; a hash_id becomes one chunk of token ids
    (random, seeded by the id), so requests that share hash_ids share prefixes."""
    reqs = []
    with open(path) as f:
        for _, line in zip(range(scan), f):
            reqs.append(json.loads(line))
    groups = {}
    for r in reqs:
        groups.setdefault(r["hash_ids"][0], []).append(r)
    shared = sorted((g for g in groups.values() if len(g) > 1), key=len, reverse=True)
    pick = set()
    for g in shared:
        for r in g[:per_group]:
            if len(pick) < n:
                pick.add(id(r))
    out = []
    for r in reqs:
        if id(r) in pick:
            toks = []
            for h in r["hash_ids"][:max_blocks]:
                rnd = random.Random(h * 7919 + 1)
                toks += [rnd.randrange(3, vocab - 1) for _ in range(chunk)]
            out.append({"tokens": toks + [5, 6, 7], "max_tokens": max(1, min(4, r["output_length"]))})
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--prompt-chunks", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workload", type=int, default=24, help="requests of the Mooncake workload")
    ap.add_argument("--workload-blocks", type=int, default=6, help="hash_ids (chunks) per request, at most")
    ap.add_argument("--l1-gb", type=float, default=1)
    ap.add_argument("--dir", default=os.environ.get("BENCH_DIR", "/var/tmp/kvtier-bench"))
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "kvtier"))
    ap.add_argument("--trace", default=TRACE)
    ap.add_argument("--l2-modes", default="buffered,odirect",
                    help="fs L2 runs, comma separated: buffered (LMCache's default), odirect")
    a = ap.parse_args()

    work = os.path.join(a.dir, "lmc-vllm")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    inter = int(a.hidden * 8 / 3) // 64 * 64
    prompt_len = a.prompt_chunks * a.chunk + 5
    max_len = max(prompt_len, a.workload_blocks * a.chunk + 3) + 64
    max_len = (max_len + BLOCK - 1) // BLOCK * BLOCK
    model = make_tiny_model(
        os.path.join(a.dir, "model-lmc-%dx%d" % (a.layers, a.hidden)), layers=a.layers,
        hidden=a.hidden, heads=a.heads, kv_heads=a.heads, vocab=a.vocab, intermediate=inter,
        max_pos=max_len + 1024)
    chunk_bytes = a.chunk * a.layers * 2 * a.hidden * 4
    work_prompts = mooncake_prompts(a.workload, a.workload_blocks, a.chunk, a.vocab, a.trace)
    print("model: %d layers, hidden %d, fp32, random weights; chunk %d tokens = %.1f MiB of KV; "
          "prompt %d chunks; %d rounds; Mooncake workload %d requests (%d chunks, %d distinct)"
          % (a.layers, a.hidden, a.chunk, chunk_bytes / 2 ** 20, a.prompt_chunks, a.rounds,
             len(work_prompts), sum(len(p["tokens"]) // a.chunk for p in work_prompts),
             len({tuple(p["tokens"][i:i + a.chunk]) for p in work_prompts
                  for i in range(0, len(p["tokens"]) - a.chunk + 1, a.chunk)})), flush=True)

    lmc_exe = os.path.join(os.path.dirname(venv_python()), "lmcache")
    srv = {
        "kvtier": KvtierServer(a.bin, free_port(), None, os.path.join(work, "kvtier.log"),
                               a.chunk, a.l1_gb),
        "lmcache": LmcacheServer(lmc_exe, free_port(), None, os.path.join(work, "lmcache.log"),
                                 a.chunk, a.l1_gb),
    }
    common = dict(block_size=BLOCK, max_model_len=max_len, max_num_seqs=2,
                  max_num_batched_tokens=max_len)

    def ktc(port):
        return {"kv_connector": "LMCacheMPConnector", "kv_role": "kv_both",
                "kv_connector_extra_config": {"lmcache.mp.host": "tcp://127.0.0.1",
                                              "lmcache.mp.port": port,
                                              "lmcache.mp.mq_timeout": 60.0,
                                              "lmcache.mp.heartbeat_interval": HEARTBEAT}}

    def gen(e, p, max_tokens=1):
        e.reset()  # vLLM's own prefix cache: a hit can only come from the server
        r = e.generate([{"tokens": p}], max_tokens=max_tokens)
        o = r["outputs"][0]
        return r["seconds"], o["tokens"], o["num_cached_tokens"]

    def wait_registered(s):
        deadline = time.time() + 60                      # the worker registers again
        time.sleep(3 * HEARTBEAT)
        while s.registered() is False and time.time() < deadline:
            time.sleep(0.2)

    modes = [m for m in a.l2_modes.split(",") if m]
    base, eng, results = None, None, {}
    rnd = random.Random(2000)
    prompts = [[rnd.randrange(3, a.vocab - 1) for _ in range(prompt_len)] for _ in range(a.rounds)]
    full = a.prompt_chunks * a.chunk
    want_rounds, want_work, base_ttft = None, None, []
    identical = True
    for mode in modes:
        # one fs L2 each, the same JSON on both sides (LMCache's fs adapter
        # spec, which kvtier parses as written)
        for n, s in srv.items():
            s.reset(os.path.join(work, "l2-%s-%s" % (n, mode)), mode == "odirect")
            s.start()
        if base is None:
            t0 = time.time()
            base = Engine(model, None, env=LMC_ENV,
                                  log=os.path.join(work, "engine-base.log"), **common)
            eng = {n: Engine(model, ktc(s.port), env=LMC_ENV,
                                     log=os.path.join(work, "engine-%s.log" % n), **common)
                   for n, s in srv.items()}
            LIVE.extend([base.proc] + [e.proc for e in eng.values()])
            print("three engines up in %.0f s" % (time.time() - t0), flush=True)
            warm = [random.Random(1).randrange(3, a.vocab - 1) for _ in range(2 * a.chunk + 7)]
            for e in [base] + list(eng.values()):
                gen(e, warm)
            want_rounds = []
            for p in prompts:
                t, tok, _ = gen(base, p)
                base_ttft.append(t)
                want_rounds.append(tok)
            want_work = [gen(base, q["tokens"], q["max_tokens"])[1] for q in work_prompts]
        else:
            for s in srv.values():
                wait_registered(s)
        print("-- L2 %s (fs, use_odirect %s on both)" % (mode, "true" if mode == "odirect" else
                                                         "false"), flush=True)
        bytes_moved = {n: 0 for n in srv}
        hits_ok = {n: True for n in srv}
        notes = []
        rows = {k: {n: [] for n in srv} for k in ("cold", "l1", "l2")}
        for i, p in enumerate(prompts):
            want = want_rounds[i]
            order = list(srv) if i % 2 == 0 else list(reversed(list(srv)))
            line = ["round %d: no connector %.3f s" % (i + 1, base_ttft[i])]
            for n in order:
                s, e = srv[n], eng[n]
                t, tok, c = gen(e, p)                        # computes and stores
                rows["cold"][n].append(t)
                identical &= tok == want
                bytes_moved[n] += a.prompt_chunks * chunk_bytes
                time.sleep(1.0)                              # its commit_store lands
                t, tok, c = gen(e, p)                        # L1 hit
                rows["l1"][n].append(t)
                identical &= tok == want
                hits_ok[n] &= c == full
                bytes_moved[n] += c // a.chunk * chunk_bytes
                s.settle()
                s.stop()
                s.start()
                wait_registered(s)
                t, tok, c2 = gen(e, p)                       # L2 hit after the restart
                if c2 != full:                               # a request while it re-registers
                    notes.append("%s round %d: L2 hit %d of %d tokens; again" % (n, i + 1, c2, full))
                    time.sleep(3 * HEARTBEAT)
                    t, tok, c2 = gen(e, p)
                rows["l2"][n].append(t)
                identical &= tok == want
                hits_ok[n] &= c2 == full
                bytes_moved[n] += c2 // a.chunk * chunk_bytes
                line.append("%s cold %.3f L1 %.3f (%d hit) L2 %.3f (%d hit)"
                            % (n, rows["cold"][n][-1], rows["l1"][n][-1], c // a.chunk,
                               rows["l2"][n][-1], c2 // a.chunk))
            print("; ".join(line), flush=True)

        # the shared-prefix workload, request by request alternating between
        # the two (the order flips every request: load on the shared cores
        # falls on both alike)
        rps, wcpu, whits, secs = {}, {}, {n: 0 for n in srv}, {n: 0.0 for n in srv}
        c0 = {n: s.cpu_now() for n, s in srv.items()}
        for j, (q, w) in enumerate(zip(work_prompts, want_work)):
            for n in (list(srv) if j % 2 == 0 else list(reversed(list(srv)))):
                t, tok, c = gen(eng[n], q["tokens"], q["max_tokens"])
                secs[n] += t
                whits[n] += c // a.chunk
                bytes_moved[n] += len(q["tokens"]) // a.chunk * chunk_bytes  # stored or loaded
                identical &= tok == w
        for n, s in srv.items():
            rps[n] = len(work_prompts) / secs[n]
            wcpu[n] = s.cpu_now() - c0[n]
            print("workload %s: %d requests in %.2f s of generate, %d chunks hit, server CPU %.2f s"
                  % (n, len(work_prompts), secs[n], whits[n], wcpu[n]), flush=True)
        for s in srv.values():
            s.settle()
        disk = {n: du(s.l2) for n, s in srv.items()}
        for s in srv.values():
            s.stop()

        med = {k: {n: statistics.median(v) for n, v in d.items()} for k, d in rows.items()}
        print()
        print("%-52s %10s %10s %8s" % ("L2 %s; median of %d rounds; TTFT in s" % (mode, a.rounds),
                                        "kvtier", "lmcache", "ratio"))

        def row(name, k, l, fmt="%.3f"):
            print("%-52s %10s %10s %8s" % (name, fmt % k, fmt % l, "%.2f" % (k / l) if l else "n/a"))
        print("%-52s %10.3f" % ("TTFT, no connector (cold prefill)", statistics.median(base_ttft)))
        row("TTFT, connector, cold (compute + store)", med["cold"]["kvtier"], med["cold"]["lmcache"])
        row("TTFT, L1 hit", med["l1"]["kvtier"], med["l1"]["lmcache"])
        row("TTFT, L2 hit after a server restart", med["l2"]["kvtier"], med["l2"]["lmcache"])
        row("Mooncake workload, requests/s", rps["kvtier"], rps["lmcache"], "%.2f")
        row("  chunks hit in the workload", whits["kvtier"], whits["lmcache"], "%d")
        row("  server CPU s during the workload", wcpu["kvtier"], wcpu["lmcache"], "%.2f")
        row("server CPU s, whole run (ready .. stop)", srv["kvtier"].cpu, srv["lmcache"].cpu, "%.2f")
        gb = {n: bytes_moved[n] / 2 ** 30 for n in srv}
        row("GiB moved through the connector", gb["kvtier"], gb["lmcache"], "%.2f")
        cpg = {n: srv[n].cpu / gb[n] for n in srv}
        row("server CPU s per GiB moved", cpg["kvtier"], cpg["lmcache"], "%.2f")
        row("server peak RSS, MiB (VmHWM; pool pages it touched)", srv["kvtier"].rss_kb / 1024,
            srv["lmcache"].rss_kb / 1024, "%.0f")
        row("L2 bytes on disk at the end, MiB", disk["kvtier"] / 2 ** 20, disk["lmcache"] / 2 ** 20,
            "%.0f")
        for n, s in srv.items():
            top = sorted(s.threads.items(), key=lambda kv: -kv[1])[:8]
            print("%s CPU by thread (s; live threads only): %s"
                  % (n, ", ".join("%s %.2f" % kv for kv in top)))
        for x in notes:
            print("note:", x)
        for n in srv:
            if not hits_ok[n]:
                print("note: %s missed some L1/L2 hits (see the rounds above)" % n)
        same = whits["kvtier"] == whits["lmcache"] and all(hits_ok.values())
        ttft = max(med["l1"]["kvtier"] / med["l1"]["lmcache"],
                   med["l2"]["kvtier"] / med["l2"]["lmcache"])
        results[mode] = (ttft, cpg["kvtier"] / cpg["lmcache"], same)
        print("L2 %s: ttft_kvtier_over_lmcache=%.2f cpu_ratio=%.2f" % (mode, ttft, results[mode][1]))
        print(flush=True)
    for e in [base] + list(eng.values()):
        e.close()
    # the last line: the first mode (LMCache's default, buffered) for ttft and
    # cpu; identical over every mode
    ttft, cpu, _ = results[modes[0]]
    same = identical and all(r[2] for r in results.values())
    print("(ttft = the worse of the L1-hit and L2-hit ratios; cpu_ratio = server CPU per GiB "
          "moved, L2 %s; identical = every output token equal to no connector, same hits)"
          % modes[0])
    print("RESULT lmcache ttft_kvtier_over_lmcache=%.2f cpu_ratio=%.2f identical=%s"
          % (ttft, cpu, "yes" if same else "no"))


if __name__ == "__main__":
    main()
