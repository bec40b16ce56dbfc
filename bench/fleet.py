"""bench/run.sh fleet: a KV-aware router on kvtier's KV events against round
robin, each on a fleet of two vLLM engines (CPU build, kvtier's connector, a tiny
random-weight model built here) each beside its own kvtier server, the two
servers sharing one L2 (one fs directory, "shared": true).

The router subscribes to both servers' KV events (docs/events.md), decodes
every batch with vLLM's own classes (msgspec, vllm.distributed.kv_events),
keeps per server the engine block hashes each tier holds, computes each
request's block hashes as vLLM does (vllm.v1.core.kv_cache_utils'
hash_block_tokens, sha256, NONE_HASH from the same PYTHONHASHSEED as the
engines) and sends the request to the engine whose server holds the longest
prefix of them in L1 ("CPU"); the shared L2 ("STORAGE:fs[0]") is the same
for both engines, so it does not pick one. Ties (a new session): the engine
with fewer requests so far, then alternating.

Workload: a Mooncake-format multi-turn trace from bench/gen_trace.py
(sessions whose turns extend the previous turn's prefix, shared system
prompts), one trace block = --block-tokens tokens (random ids, one per
hash id: the same id, the same tokens), a short unique tail per request,
max_tokens 1, requests one at a time in trace order (closed loop, so TTFT
is the request latency without queueing).

Two fleets side by side, one per routing (4 engines, 4 servers, 2 shared
directories): each request goes to both, one after the other (which one
first alternates), before the next request, so that load from other work
on a shared machine falls on both routings alike. Every engine is warmed up
first on every length a request may compute (the CPU kernels pay once per
new shape). --repeats replays the trace again on restarted servers (empty
directories). vLLM's own prefix cache is emptied before every request, so
every reuse is kvtier's (what the events describe). After each request the
bench waits (untimed) until the request's chunks are announced in its
server's L1 and in the shared L2, as a router that keeps up with its events
sees them.

Per request: the connector's hit (vLLM's external prefix-cache hit
counter), of it what the server loaded from the shared L2 for the lookup
(/status prefetch.keys_loaded delta of that server; the rest came from its
L1), and the TTFT (the engine process' generate of 1 token).

Last line: RESULT fleet l1_hit_ratio_routed=<x> l1_hit_ratio_rr=<y> ttft_routed_over_rr=<z>
"""

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [os.path.join(ROOT, "tests"), os.path.join(ROOT, "python")]
os.environ.setdefault("KVTIER_LIB", os.path.join(ROOT, "build", "libkvtier_client.so"))

CHUNK = 64   # kvtier --chunk-size: two vLLM blocks
BLOCK = 32   # vLLM's block size (CPU)
HASH_SEED = "0"  # PYTHONHASHSEED of the engines and of the router's hashing


def parse():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="a smoke run: fewer requests, a smaller model")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--sessions", type=int, default=8, help="gen_trace --open: sessions open at once")
    ap.add_argument("--turns", type=float, default=4)
    ap.add_argument("--prompts", type=int, default=4, help="distinct system prompts")
    ap.add_argument("--prompt-blocks", type=int, default=2)
    ap.add_argument("--turn-blocks", type=int, default=2)
    ap.add_argument("--max-blocks", type=int, default=16, help="a longer request keeps its first blocks")
    ap.add_argument("--block-tokens", type=int, default=64, help="tokens of one trace block")
    ap.add_argument("--tail", type=int, default=8, help="unique tokens after each request's blocks")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--l1-gb", type=float, default=0.25)
    ap.add_argument("--kv-cache-gb", default="1", help="VLLM_CPU_KVCACHE_SPACE of each engine")
    ap.add_argument("--repeats", type=int, default=2, help="replays of the trace (fresh servers each)")
    ap.add_argument("--settle", type=float, default=10.0,
                    help="max seconds to wait for a request's chunks in the events")
    ap.add_argument("--dir", default=os.environ.get("BENCH_DIR", "/var/tmp/kvtier-bench"))
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "kvtier"))
    a = ap.parse_args()
    if a.quick:
        a.requests, a.sessions, a.layers, a.hidden, a.heads, a.max_blocks = 12, 4, 4, 256, 4, 8
        a.repeats = 1
    return a


A = parse()
os.environ["KVTIER_BIN"] = A.bin = os.path.abspath(A.bin)  # the servers run in their work dir
os.environ["PYTHONHASHSEED"] = HASH_SEED  # read by init_none_hash below (and the engines get it)

import kvtier  # noqa: E402
import msgspec  # noqa: E402
import zmq  # noqa: E402
from vllm.distributed.kv_events import (AllBlocksCleared, BlockRemoved, BlockStored,  # noqa: E402
                                        KVEventBatch)
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core import kv_cache_utils  # noqa: E402

from support.engine import Engine, kvtier_connector_config  # noqa: E402
from support.model import make_tiny_model  # noqa: E402
from support.ports import free_port  # noqa: E402
from support.server import Server  # noqa: E402

kv_cache_utils.init_none_hash(sha256)
END_SEQ = (-1).to_bytes(8, "big", signed=True)
L1 = "CPU"


def request_chunks(tokens):
    """The request's full kvtier chunks, each as (vLLM's block hashes of its
    blocks, kvtier's chunk key hash). kvtier's events name a chunk by the
    engine's block hashes when the connector stored it with them, and by its
    key hash when the server never got them (a chunk this server found in
    the shared L2, written through the other server: the hashes are not in
    L2, docs/events.md): the router matches either."""
    bh = block_hashes(tokens)
    per = CHUNK // BLOCK
    keys = kvtier.chunk_hashes(list(tokens), CHUNK)
    return [(bh[c * per:(c + 1) * per], keys[c]) for c in range(len(tokens) // CHUNK)]


def block_hashes(tokens):
    """vLLM's request block hashes (full blocks of BLOCK tokens, chained
    from NONE_HASH), as its KV events publish them (bytes)."""
    out, parent = [], None
    for i in range(0, len(tokens) // BLOCK * BLOCK, BLOCK):
        parent = kv_cache_utils.hash_block_tokens(sha256, parent, tokens[i:i + BLOCK])
        out.append(kv_cache_utils.maybe_convert_block_hash(parent))
    return out


class Feed:
    """One server's KV events: a SUB socket (and its replay socket for
    gaps), decoded by vLLM's decoder; held[medium] = block hashes."""

    decoder = msgspec.msgpack.Decoder(type=KVEventBatch)

    def __init__(self, ctx, pub, rep, topic):
        self.ctx, self.rep, self.topic = ctx, rep, topic
        self.sub = ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, topic)
        self.sub.connect(pub)
        self.held = {}
        self.next = None
        self.batches = self.events = self.gaps = self.replayed = 0

    def _apply(self, seq, payload):
        if self.next is not None and seq < self.next:
            return  # replayed twice
        if self.next is not None and seq > self.next:
            self.gaps += 1
            self._replay(self.next, seq)
        self.next = seq + 1
        batch = self.decoder.decode(payload)
        self.batches += 1
        for e in batch.events:
            self.events += 1
            if isinstance(e, AllBlocksCleared):
                self.held = {}
            elif isinstance(e, BlockStored):
                self.held.setdefault(e.medium, set()).update(e.block_hashes)
            elif isinstance(e, BlockRemoved):
                self.held.setdefault(e.medium, set()).difference_update(e.block_hashes)

    def _replay(self, start, stop):
        d = self.ctx.socket(zmq.DEALER)
        d.connect(self.rep)
        d.send_multipart([b"", start.to_bytes(8, "big")])
        try:
            while d.poll(5000):
                _, _, seq, payload = d.recv_multipart()
                if seq == END_SEQ:
                    break
                s = int.from_bytes(seq, "big")
                if s < stop and (self.next is None or s >= self.next):
                    self.next = s
                    self._apply(s, payload)
                    self.replayed += 1
        finally:
            d.close(linger=0)
        self.next = stop

    def poll(self, timeout_ms=0):
        while self.sub.poll(timeout_ms):
            topic, seq, payload = self.sub.recv_multipart()
            self._apply(int.from_bytes(seq, "big"), payload)
            timeout_ms = 0

    def close(self):
        self.sub.close(linger=0)

    def chunks_held(self, chunks, media):
        """How many of a request's chunks, from the first, some medium in
        media holds, and of them how many only by their kvtier key hash."""
        sets = [h for m, h in self.held.items() if media(m)]
        n = by_key = 0
        for blocks, key in chunks:
            if any(all(b in h for b in blocks) for h in sets):
                n += 1
            elif any(key in h for h in sets):
                n += 1
                by_key += 1
            else:
                break
        return n, by_key


def is_l1(m):
    return m == L1


def is_l2(m):
    return m.startswith("STORAGE")


def held_everywhere(feeds, chunks, media):
    """Every chunk held in media by some feed (the shared L2: any server's
    announcement stands for the one directory)."""
    for blocks, key in chunks:
        if not any(f.chunks_held([(blocks, key)], media)[0] for f in feeds):
            return False
    return True


def make_trace(a, work):
    path = os.path.join(work, "trace.jsonl")
    subprocess.run([sys.executable, os.path.join(HERE, "gen_trace.py"), path, "--seed", str(a.seed),
                    "--requests", str(a.requests), "--turns", str(a.turns),
                    "--prompt-blocks", str(a.prompt_blocks), "--turn-blocks", str(a.turn_blocks),
                    "--prompts", str(a.prompts), "--open", str(a.sessions)], check=True)
    reqs = []
    with open(path) as f:
        for i, line in enumerate(f):
            ids = json.loads(line)["hash_ids"][:a.max_blocks]
            toks = []
            for h in ids:
                r = random.Random(h * 1000003 + 17)
                toks += [r.randrange(3, a.vocab - 1) for _ in range(a.block_tokens)]
            r = random.Random(-1 - i)
            toks += [r.randrange(3, a.vocab - 1) for _ in range(a.tail)]
            reqs.append({"ids": ids, "tokens": toks})
    return reqs


def status(srv):
    with srv.client(timeout_ms=5000) as c:
        return c.status()


def ext_hits(metrics):
    """vLLM's external (connector) prefix-cache hit counter, tokens."""
    return sum(v or 0 for k, v in metrics.items() if "external_prefix_cache_hits" in k)


class Fleet:
    """Two kvtier servers on one shared fs directory, an engine beside each,
    and a routing ("routed" or "rr") with its own router state."""

    def __init__(self, mode, model, maxlen, work, a, ctx):
        self.mode, self.a, self.ctx = mode, a, ctx
        self.shared = os.path.join(work, "shared-l2-" + mode)
        adapter = json.dumps({"type": "fs", "base_path": self.shared, "shared": True})
        self.servers = []
        for i in range(2):
            pub, rep = free_port(), free_port()
            topic = "kv@%s-engine%d@fleet" % (mode, i)
            s = Server(["--chunk-size", str(CHUNK), "--l2-prefetch-policy", "retain",
                        "--l1-size-gb", str(a.l1_gb), "--l1-init-size-gb", str(a.l1_gb),
                        "--l2-adapter", adapter, "--log-level", "warn",
                        "--kv-events-endpoint", "tcp://127.0.0.1:%d" % pub,
                        "--kv-events-replay-endpoint", "tcp://127.0.0.1:%d" % rep,
                        "--kv-events-topic", topic], work)
            s.pub, s.rep, s.topic = "tcp://127.0.0.1:%d" % pub, "tcp://127.0.0.1:%d" % rep, \
                topic.encode()
            self.servers.append(s)
        self.engines = [None, None]
        self.model, self.maxlen, self.work = model, maxlen, work
        self.feeds = []
        self.runs = []

    def start_engine(self, i):
        cfg = kvtier_connector_config(self.servers[i].url, retry_s=1, timeout_ms=30000)
        self.engines[i] = Engine(
            self.model, cfg, block_size=BLOCK, max_model_len=self.maxlen + 64,
            max_num_batched_tokens=self.maxlen + 64, max_num_seqs=2,
            log=os.path.join(self.work, "engine-%s-%d.log" % (self.mode, i)),
            env={"VLLM_CPU_KVCACHE_SPACE": self.a.kv_cache_gb, "PYTHONHASHSEED": HASH_SEED})

    def start_servers(self):
        shutil.rmtree(self.shared, ignore_errors=True)
        for s in self.servers:
            s.start()
        for s in self.servers:
            s.wait_recovered()

    def stop_servers(self):
        for s in self.servers:
            s.stop()

    def begin(self, tag):
        """A run: the servers restarted on an empty shared directory, a
        fresh router state, the connectors reconnected."""
        self.feeds = [Feed(self.ctx, s.pub, s.rep, s.topic) for s in self.servers]
        self.start_servers()
        time.sleep(0.3)  # subscriptions reach the servers
        reconnect(self.engines, self.a, "%s-%s" % (self.mode, tag))
        for f in self.feeds:
            f.poll(100)
        self.last = [ext_hits(e.metrics()) for e in self.engines]
        self.cur = {"sent": [0, 0], "chunks": 0, "l1": 0, "l2": 0, "computed": 0, "ttfts": [],
                    "predicted": 0, "timeouts": 0, "key_only": 0}

    def step(self, n, r):
        a, cur, feeds = self.a, self.cur, self.feeds
        toks = r["tokens"]
        chunks = request_chunks(toks)
        for f in feeds:
            f.poll(0)
        held = [f.chunks_held(chunks, is_l1) for f in feeds]
        pref = [h[0] for h in held]
        if self.mode == "rr":
            i = n % 2
        else:
            best = max(pref)
            cands = [j for j in range(2) if pref[j] == best]
            if len(cands) > 1:
                lo = min(cur["sent"][j] for j in cands)
                cands = [j for j in cands if cur["sent"][j] == lo]
            i = cands[0] if len(cands) == 1 else n % 2
        cur["sent"][i] += 1
        e, s = self.engines[i], self.servers[i]
        e.reset()
        before = status(s)["prefetch"]["keys_loaded"]
        res = e.generate([{"tokens": toks}], max_tokens=1)
        after = status(s)["prefetch"]["keys_loaded"]
        m = ext_hits(res["metrics"])
        hit_tokens = m - self.last[i]
        self.last[i] = m
        nc = len(chunks)
        hit = min(nc, -(-hit_tokens // CHUNK))  # the last loaded chunk may stop a token short
        l2 = min(hit, after - before)
        l1 = hit - l2
        cur["predicted"] += pref[i] == l1
        cur["key_only"] += held[i][1]
        cur["chunks"] += nc
        cur["l1"] += l1
        cur["l2"] += l2
        cur["computed"] += nc - hit
        cur["ttfts"].append(res["seconds"])
        print("  %-6s req %2d -> engine %d: %4d tokens, %2d chunks: L1 %2d, L2 %2d, computed %2d; "
              "router: L1 prefix %d / %d (engine 0 / 1); TTFT %.3f s"
              % (self.mode, n, i, len(toks), nc, l1, l2, nc - hit, pref[0], pref[1],
                 res["seconds"]), flush=True)
        # untimed: wait until the request's full chunks are announced in its
        # server's L1 and in the shared L2 (some server's STORAGE)
        deadline = time.time() + a.settle
        while True:
            for f in feeds:
                f.poll(20)
            in_l1 = feeds[i].chunks_held(chunks, is_l1)[0]
            if in_l1 == nc and held_everywhere(feeds, chunks, is_l2):
                break
            if time.time() > deadline:
                cur["timeouts"] += 1
                print("    (settle timeout: %d of %d chunks announced in L1, in L2: %s)"
                      % (in_l1, nc, held_everywhere(feeds, chunks, is_l2)), flush=True)
                break
        return res["seconds"]

    def end(self):
        self.stop_servers()
        for f in self.feeds:
            f.poll(200)
            f.close()
        cur = self.cur
        cur["events"] = "%d / %d / %d" % (sum(f.batches for f in self.feeds),
                                          sum(f.gaps for f in self.feeds), cur["timeouts"])
        self.runs.append(cur)
        c = max(cur["chunks"], 1)
        print("%s: L1 %.3f, L2 %.3f, computed %.3f; TTFT median %.3f s"
              % (self.mode, cur["l1"] / c, cur["l2"] / c, cur["computed"] / c,
                 statistics.median(cur["ttfts"])), flush=True)

    def close(self):
        for e in self.engines:
            if e is not None:
                e.close()
        for s in self.servers:
            s.kill()
        shutil.rmtree(self.shared, ignore_errors=True)  # the KV; the logs stay

    def pooled(self):
        runs = self.runs
        if not runs:
            return None
        c = max(sum(r["chunks"] for r in runs), 1)
        t = [x for r in runs for x in r["ttfts"]]
        return {"runs": len(runs), "chunks": sum(r["chunks"] for r in runs),
                "l1_share": sum(r["l1"] for r in runs) / c, "l2_share": sum(r["l2"] for r in runs) / c,
                "computed_share": sum(r["computed"] for r in runs) / c,
                "ttft_median": statistics.median(t), "ttft_mean": statistics.mean(t),
                "run_medians": " ".join("%.3f" % statistics.median(r["ttfts"]) for r in runs),
                "split": ", ".join("%d / %d" % tuple(r["sent"]) for r in runs),
                "predicted": ", ".join("%d of %d" % (r["predicted"], len(r["ttfts"])) for r in runs),
                "key_only": sum(r["key_only"] for r in runs),
                "events": ", ".join(r["events"] for r in runs)}


def reconnect(engines, a, tag):
    """Untimed: the connectors' clients find the restarted servers (a first
    request after a restart fails over to a recompute and reconnects after
    retry_s): a prompt of its own per engine until it is stored and hit."""
    for i, e in enumerate(engines):
        r = random.Random("%s-%d" % (tag, i))
        w = [r.randrange(3, a.vocab - 1) for _ in range(2 * CHUNK + 5)]
        for _ in range(3):
            e.reset()
            e.generate([{"tokens": w}], max_tokens=1)
            time.sleep(1.2)
        e.reset()


def main():
    a = A
    os.makedirs(a.dir, exist_ok=True)
    work = tempfile.mkdtemp(prefix="fleet-", dir=a.dir)
    t_start = time.time()
    reqs = make_trace(a, work)
    maxlen = max(len(r["tokens"]) for r in reqs)
    chunks_of = [len(r["tokens"]) // CHUNK for r in reqs]
    model = make_tiny_model(
        os.path.join(a.dir, "model-%dx%d-v%d" % (a.layers, a.hidden, a.vocab)), layers=a.layers,
        hidden=a.hidden, heads=a.heads, kv_heads=a.heads, vocab=a.vocab,
        intermediate=int(a.hidden * 8 / 3) // 64 * 64, max_pos=maxlen + 1024)
    chunk_bytes = CHUNK * a.layers * 2 * a.hidden * 4
    print("two fleets side by side, one per routing (routed on KV events, round robin), each 2 vLLM "
          "engines (CPU) + 2 kvtier servers (L1 %.2f GiB each) on one shared fs L2; the same "
          "request goes to both fleets, one after the other, before the next (%s)" % (a.l1_gb, work))
    print("model: %d layers, hidden %d, vocab %d (random, fp32); chunk %d tokens = %.1f MiB of KV, "
          "block %d; trace: %d requests, %d system prompts used, %d-%d tokens (median %d), "
          "%d prompt chunks, %d distinct; %d tokens a trace block; %d repeat(s)"
          % (a.layers, a.hidden, a.vocab, CHUNK, chunk_bytes / 2 ** 20, BLOCK, len(reqs),
             len({r["ids"][0] for r in reqs}), min(len(r["tokens"]) for r in reqs), maxlen,
             statistics.median(len(r["tokens"]) for r in reqs), sum(chunks_of),
             len({tuple(r["ids"][:i + 1]) for r in reqs for i in range(len(r["ids"]))
                  if (i + 1) * a.block_tokens <= len(r["tokens"])}) * a.block_tokens // CHUNK,
             a.block_tokens, a.repeats), flush=True)

    ctx = zmq.Context()
    fleets = {m: Fleet(m, model, maxlen, work, a, ctx) for m in ("routed", "rr")}
    try:
        for f in fleets.values():
            f.start_servers()
        t0 = time.time()
        errs = []

        def start(f, i):
            try:
                f.start_engine(i)
            except Exception as e:  # noqa: BLE001
                errs.append(e)
        ths = [threading.Thread(target=start, args=(f, i)) for f in fleets.values() for i in range(2)]
        for t in ths:
            t.start()
        for t in ths:
            t.join()
        if errs:
            raise errs[0]
        print("4 engines up in %.0f s" % (time.time() - t0), flush=True)
        # warm-up: each engine's first requests pay one-time costs
        # (allocation, the connector's connection, the first load), and the
        # CPU kernels pay again for every new shape: every length a request
        # of the trace may compute (its tail up to a whole prompt, in chunk
        # steps), cold and then hit from kvtier, on every engine. Untimed;
        # the servers restart on an empty directory after it.
        t0 = time.time()
        lens = sorted({len(r["tokens"]) - CHUNK * j for r in reqs
                       for j in range(len(r["tokens"]) // CHUNK + 1)} - {0})
        for f in fleets.values():
            for e in f.engines:
                wr = random.Random(7)
                for n in lens:
                    warm = [wr.randrange(3, a.vocab - 1) for _ in range(n)]
                    for _ in range(2):
                        e.reset()
                        e.generate([{"tokens": warm}], max_tokens=1)
                e.reset()
            f.stop_servers()
        print("warm-up: %d prompt lengths, cold and hit, on every engine, in %.0f s"
              % (len(lens), time.time() - t0), flush=True)
        paired = []
        for rep in range(a.repeats):
            for f in fleets.values():
                f.begin(rep)
            for n, r in enumerate(reqs):
                # alternate which fleet goes first
                order = ("routed", "rr") if (n + rep) % 2 == 0 else ("rr", "routed")
                t = {m: fleets[m].step(n, r) for m in order}
                paired.append(t["routed"] / t["rr"])
            for f in fleets.values():
                f.end()
    finally:
        for f in fleets.values():
            f.close()
        ctx.destroy(linger=0)

    R, Q = fleets["routed"].pooled(), fleets["rr"].pooled()
    print()
    print("%-48s %16s %16s" % ("(every repeat pooled)", "routed", "round robin"))

    def row(name, key, fmt):
        print("%-48s %16s %16s" % (name, fmt % R[key] if R else "n/a", fmt % Q[key] if Q else "n/a"))
    row("runs", "runs", "%d")
    row("prompt chunks (full)", "chunks", "%d")
    row("  from the engine's own kvtier L1", "l1_share", "%.3f")
    row("  from the shared L2 (fs)", "l2_share", "%.3f")
    row("  computed", "computed_share", "%.3f")
    row("TTFT median, s", "ttft_median", "%.3f")
    row("TTFT mean, s", "ttft_mean", "%.3f")
    row("TTFT median of each repeat, s", "run_medians", "%s")
    row("requests to engine 0 / engine 1, each repeat", "split", "%s")
    row("router's L1 prefix = the L1 hit, each repeat", "predicted", "%s")
    row("L1-hit chunks known by key hash only", "key_only", "%d")
    row("events: batches / gaps / settle timeouts", "events", "%s")
    print("%-48s %16.3f" % ("TTFT routed / rr, median of per-request ratios", statistics.median(paired)))
    print("(shares of every request's full %d-token chunks; TTFT: the engine's generate of 1 "
          "token, vLLM's own prefix cache emptied before each request)" % CHUNK)
    print("total %.0f s" % (time.time() - t_start))
    print("RESULT fleet l1_hit_ratio_routed=%.3f l1_hit_ratio_rr=%.3f ttft_routed_over_rr=%.3f"
          % (R["l1_share"], Q["l1_share"], R["ttft_median"] / Q["ttft_median"]))


if __name__ == "__main__":
    main()
