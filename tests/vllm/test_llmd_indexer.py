"""kvtier's KV events read by a real KV-aware router: llm-d's KV-cache indexer
(github.com/llm-d/llm-d-kv-cache, the version pinned in tests/llmd/go.mod),
run through tests/llmd, a thin driver around the library's own in-memory
kvblock index, its kvevents pool with the vLLM engine adapter (the msgpack
decoding), its ZMQ subscribers and its LongestPrefix scorer
(docs/events.md, Routers).

What the indexer keys: not the engine's block hashes. Its vLLM adapter
turns each hash into a uint64 (an integer as is, a bin by its last 8 bytes,
big-endian: an "engine key"), and the index is keyed by its own "request
keys": FNV-64a over CBOR [parent, the block's token ids, extra], chained,
from a seed hash of the model name (the topic's MODEL), in blocks of its own
block size (16 here). So an event is indexed only with its token_ids, and a
parent_block_hash must be an engine key it already knows (else the whole
event is dropped). An event without tokens only adds a medium to request
keys its engine keys already map to (a device-tier update, as for vLLM's
CPU offloading). A router computes the request keys of a prompt from its
token ids (ScoreTokens): the queries here send token ids, the driver asks
the library for the keys.

The subscriber of support.kvevents (vLLM's classes) reads the same servers'
events, replayed from sequence 0, as what each server announced."""

import hashlib
import json
import os
import subprocess
import threading

import pytest

from support.data import keys_for, random_payloads
from support.kvevents import Subscriber
from support.paths import ROOT
from support.ports import free_port
from support.server import SANITIZER_MARKERS, Server, run_kvtier, wait_for

MODEL = "tiny"
BLOCK = 16          # the engine's block size and the indexer's (blockSizeTokens)
CHUNK = 64          # tokens per kvtier chunk: 4 blocks
L1 = "CPU"
FS = "STORAGE:fs[0]"
# the medium weights the driver gives llm-d's scorer (lower case, as the
# indexer lower-cases each event's medium); a medium it has no weight for
# counts 1.0, as much as a GPU block
W_CPU, W_FS = 0.8, 0.5
WEIGHTS = {"cpu": W_CPU, "storage:fs[0]": W_FS}
MiB = 1 << 20
BUILD = os.environ.get("KVT_BUILD_DIR", os.path.join(ROOT, "build"))
DRIVER = os.path.join(BUILD, "llmd-indexer")


@pytest.fixture(scope="module")
def driver_bin():
    """Builds tests/llmd once per run (scripts/build-llmd-indexer.sh: the
    pinned module, GOMODCACHE in the build tree)."""
    r = subprocess.run([os.path.join(ROOT, "scripts", "build-llmd-indexer.sh"), BUILD],
                       capture_output=True, text=True, timeout=1800)
    if r.returncode == 3:
        pytest.skip("no Go toolchain (go on PATH or /usr/local/go/bin/go): "
                    "cannot build llm-d's indexer (tests/llmd)")
    assert r.returncode == 0, r.stdout + r.stderr
    return DRIVER


class Indexer:
    """The driver process: llm-d's indexer subscribed to kv@POD@ on each
    (pod, endpoint) of subs; JSON lines in and out. KVT_LLMD_V=5: the
    library's trace logs in llmd-indexer.log."""

    def __init__(self, binary, subs, workdir):
        args = [binary, "-block-size", str(BLOCK), "-v", os.environ.get("KVT_LLMD_V", "0")]
        for pod, ep in subs:
            args += ["-sub", "%s=%s" % (pod, ep)]
        for m, w in WEIGHTS.items():
            args += ["-weight", "%s=%s" % (m, w)]
        self.log_path = os.path.join(str(workdir), "llmd-indexer.log")
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, text=True, bufsize=1)
        self.lock = threading.Lock()
        assert json.loads(self.proc.stdout.readline()) == {"ready": True}

    def ask(self, **req):
        with self.lock:
            self.proc.stdin.write(json.dumps(req) + "\n")
            line = self.proc.stdout.readline()
        assert line, "the driver exited: %s" % open(self.log_path).read()[-4000:]
        r = json.loads(line)
        assert "error" not in r, r
        return r

    def score(self, tokens):
        return self.ask(op="score", model=MODEL, tokens=tokens, pods=[])

    def close(self):
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def pod_server(tmp_path, pod, extra=()):
    pub, rep = free_port(), free_port()
    d = tmp_path / pod
    d.mkdir()
    s = Server(["--kv-events-endpoint", "tcp://127.0.0.1:%d" % pub,
                "--kv-events-replay-endpoint", "tcp://127.0.0.1:%d" % rep,
                "--kv-events-topic", "kv@%s@%s" % (pod, MODEL)] + list(extra),
               d, data_dir=str(d / "data"))
    s.pub = "tcp://127.0.0.1:%d" % pub
    s.rep = "tcp://127.0.0.1:%d" % rep
    s.pod = pod
    return s


@pytest.fixture
def pods(tmp_path, driver_bin):
    """Two kvtier servers with events (fs L2): podA with a small L1 (30 MB),
    podB with the default; and the indexer subscribed to both."""
    made = []

    def start():
        a = pod_server(tmp_path, "podA", ["--l1-size-gb", "0.03", "--l1-init-size-gb", "0.03"])
        b = pod_server(tmp_path, "podB")
        for s in (a, b):
            made.append(s)
            s.start()
            s.wait_recovered()
        ix = Indexer(driver_bin, [("podA", a.pub), ("podB", b.pub)], tmp_path)
        made.append(ix)
        return a, b, ix

    yield start
    for x in made:
        if isinstance(x, Indexer):
            x.close()
        else:
            x.kill()
    for x in made:
        if not isinstance(x, Indexer):
            log = x.read_log()
            assert not any(m in log for m in SANITIZER_MARKERS), log[-6000:]


def prompt(seed, n_chunks):
    """Token ids of n_chunks chunks, and the engine's block hashes of them:
    32-byte prefix-chained SHA-256 (bins, as vLLM's sha256 hashes)."""
    toks = [(seed * 7919 + 13 * i) % 32000 for i in range(n_chunks * CHUNK)]
    hashes, h = [], b"\0" * 32
    for i in range(0, len(toks), BLOCK):
        h = hashlib.sha256(h + json.dumps(toks[i:i + BLOCK]).encode()).digest()
        hashes.append(h)
    return toks, hashes


def store_prompt(s, name, toks, hashes, n_chunks, size=4096):
    """Stores the first n_chunks chunks of a prompt as kvtier's connector
    does: one key per chunk, the chunk's engine block hashes, its tokens, the
    parent (none for the first chunk); flushed (L2 written)."""
    keys = keys_for(name, len(toks) // CHUNK, chunk=CHUNK)[:n_chunks]
    per = CHUNK // BLOCK
    with s.client() as c:
        assert c.store(keys, random_payloads(n_chunks, size),
                       blocks={"size": BLOCK, "hashes": hashes[:n_chunks * per], "parent": None,
                               "tokens": toks[:n_chunks * CHUNK]}) == n_chunks
        assert not c.flush()
    return keys


def expect(ix, tokens, pred, what, timeout=20):
    """Polls the indexer until pred(its answer for the prompt) holds in two
    answers in a row that are the same. The driver reads the index once per
    part of an answer (scores, media, hits) while the indexer's pool may
    still be applying events: one answer can mix two states."""
    last = {}

    def check():
        prev, last["r"] = last.get("r"), ix.score(tokens)
        return pred(last["r"]) and last["r"] == prev
    try:
        wait_for(check, timeout=timeout, what=what)
    except Exception:
        raise AssertionError("%s: the indexer answers %s" % (what, last.get("r")))
    return last["r"]


def subscribed(ix, s, seed):
    """llm-d's subscribers have no replay: what a server publishes before
    the SUB socket's subscription reaches it is lost. A probe chunk with
    tokens, stored until the indexer indexes it, then deleted."""
    toks, hashes = prompt(seed, 1)
    keys = None

    def seen():
        nonlocal keys
        keys = store_prompt(s, "probe-%s" % s.pod, toks, hashes, 1)
        # the events reach the indexer a little after the store's reply, and
        # its pool indexes them after that: a score asked at once misses
        # them every time, so the probe stays for up to 2 s before it is
        # deleted and stored again (the events of a store made before the
        # subscription reached the server are lost)
        try:
            return wait_for(lambda: ix.score(toks)["scores"].get(s.pod), timeout=2,
                            what="the probe")
        except AssertionError:
            pass
        with s.client() as c:
            c.delete(keys)
        return False
    wait_for(seen, timeout=30, what="the indexer subscribed to %s" % s.pod)
    with s.client() as c:
        c.delete(keys)
    expect(ix, toks, lambda r: not r["scores"], "the probe removed")


def test_indexer_scores_follow_each_servers_tiers(pods, tmp_path):
    """Two servers, different prefixes: llm-d's scores are what each holds
    (every block in L1 and fs: the CPU weight per block; per medium, the
    longest prefix held there). L1 evictions on podA lower podA's score to
    the fs weight while fs keeps every block; delete on podB and purge on
    podA take the blocks away in every medium."""
    a, b, ix = pods()
    subscribed(ix, a, 901)
    subscribed(ix, b, 902)
    x_toks, x_hashes = prompt(1, 4)   # 16 blocks
    y_toks, y_hashes = prompt(2, 3)   # 12 blocks
    with Subscriber(a.pub, a.rep) as sa, Subscriber(b.pub, b.rep) as sb:
        x_keys = store_prompt(a, "X", x_toks, x_hashes, 4, size=MiB)
        store_prompt(b, "X", x_toks, x_hashes, 1)           # X's first chunk only
        y_keys = store_prompt(b, "Y", y_toks, y_hashes, 3)

        r = expect(ix, x_toks, lambda r: r["scores"] == {"podA": pytest.approx(16 * W_CPU),
                                                         "podB": pytest.approx(4 * W_CPU)},
                   "X on podA (16 blocks) and podB (4)")
        assert len(r["keys"]) == 16
        assert r["media"] == {"cpu": {"podA": 16, "podB": 4}, "storage:fs[0]": {"podA": 16, "podB": 4}}
        assert r["hits"] == {"podA": {"cpu": 16, "storage:fs[0]": 16},
                             "podB": {"cpu": 4, "storage:fs[0]": 4}}
        r = expect(ix, y_toks, lambda r: r["scores"] == {"podB": pytest.approx(12 * W_CPU)},
                   "Y on podB only")
        # a prompt that extends X: the prefix counts
        z_toks, _ = prompt(1, 6)
        assert ix.score(z_toks)["scores"] == {"podA": pytest.approx(16 * W_CPU),
                                              "podB": pytest.approx(4 * W_CPU)}
        # the engine keys it learned: each engine hash (its last 8 bytes) maps
        # to the request key of its block, the keys a query computes
        mapped = ix.ask(op="engine", hashes=[h.hex() for h in x_hashes])["request_keys"]
        assert mapped == r_keys(ix, x_toks)
        # the indexer agrees with what podA's server announced
        sa.replay(0)
        sa.wait(lambda x: set(x_hashes) <= x.view().get(FS, set()))
        assert set(x_hashes) <= sa.view()[L1]

        # L1 eviction on podA: 40 more chunks of 1 MiB (no engine hashes:
        # named by kvtier's key hashes, which the indexer cannot place)
        fill = keys_for("fill", 40, chunk=CHUNK)
        with a.client() as c:
            for i in range(0, 40, 8):
                assert c.store(fill[i:i + 8], random_payloads(8, MiB)) == 8
            assert not c.flush()
        sa.wait(lambda x: not (set(x_hashes) & x.view().get(L1, set())), what="X evicted from L1")
        assert set(x_hashes) <= sa.view()[FS]
        with a.client() as c:
            assert c.lookup(x_keys) == 4  # still served: from fs
        r = expect(ix, x_toks, lambda r: r["scores"].get("podA") == pytest.approx(16 * W_FS),
                   "podA's X only in fs")
        assert r["media"]["storage:fs[0]"]["podA"] == 16 and "podA" not in r["media"].get("cpu", {})
        assert r["hits"]["podA"] == {"storage:fs[0]": 16}
        assert r["scores"]["podB"] == pytest.approx(4 * W_CPU)

        # delete on podB: Y gone from every medium
        with b.client() as c:
            c.delete(y_keys)
        expect(ix, y_toks, lambda r: not r["scores"], "Y deleted on podB")
        sb.replay(0)
        sb.wait(lambda x: not (set(y_hashes) & set().union(*x.view().values())), what="Y removed")

        # purge --all on podA: X gone from podA; podB keeps its chunk
        p = run_kvtier("purge", "--all", "--yes", "--root", str(tmp_path / "podA" / "data"),
                       "--url", a.url)
        assert p.returncode == 0, p.stderr + p.stdout
        r = expect(ix, x_toks, lambda r: r["scores"] == {"podB": pytest.approx(4 * W_CPU)},
                   "X purged on podA")
        assert r["hits"] == {"podB": {"cpu": 4, "storage:fs[0]": 4}}


def r_keys(ix, toks):
    return ix.ask(op="keys", model=MODEL, tokens=toks)["keys"]


def test_restart_the_indexer_relearns_recovered_chunks(pods):
    """A stop (AllBlocksCleared) clears podA in the indexer. After the
    restart kvtier announces what the fs scan recovered by the engine's
    block hashes and tokens it kept in each object's header (docs/events.md,
    Block hashes): the indexer maps them to the request keys again, so podA
    scores its fs tier for the prefix; a store of the same chunks adds its
    L1; podB is untouched throughout."""
    a, b, ix = pods()
    subscribed(ix, a, 903)
    subscribed(ix, b, 904)
    x_toks, x_hashes = prompt(3, 2)   # 8 blocks
    x_keys = store_prompt(a, "X", x_toks, x_hashes, 2)
    store_prompt(b, "X", x_toks, x_hashes, 2)
    expect(ix, x_toks, lambda r: r["scores"] == {"podA": pytest.approx(8 * W_CPU),
                                                 "podB": pytest.approx(8 * W_CPU)}, "X on both")
    a.stop()  # SIGTERM: the last batch is AllBlocksCleared
    expect(ix, x_toks, lambda r: r["scores"] == {"podB": pytest.approx(8 * W_CPU)},
           "podA cleared at its stop")
    a.start()
    a.wait_recovered()
    subscribed(ix, a, 905)  # the indexer's subscriber dialled the new server
    with Subscriber(a.pub, a.rep) as sa:
        sa.replay(0)
        sa.wait(lambda x: x.view() == {FS: set(x_hashes)},
                what="the recovered chunks by their engine hashes")
    r = expect(ix, x_toks, lambda r: r["scores"].get("podA") == pytest.approx(8 * W_FS),
               "podA's recovered fs chunks indexed")
    assert r["hits"]["podA"] == {"storage:fs[0]": 8}, r
    assert r["scores"]["podB"] == pytest.approx(8 * W_CPU), r
    # (no lookup here: its prefetch would hold the chunks in L1 as a
    # temporary copy, and a store of a key held sends nothing)
    store_prompt(a, "X", x_toks, x_hashes, 2)
    r = expect(ix, x_toks, lambda r: r["hits"].get("podA") == {"cpu": 8, "storage:fs[0]": 8},
               "podA's X stored again: L1 and fs")
    assert r["scores"] == {"podA": pytest.approx(8 * W_CPU), "podB": pytest.approx(8 * W_CPU)}
    # deleted: gone from both of podA's media, podB keeps X
    with a.client() as c:
        c.delete(x_keys)
    expect(ix, x_toks, lambda r: r["scores"] == {"podB": pytest.approx(8 * W_CPU)},
           "podA's X deleted")


def test_vllm_gpu_events_and_kvtier_tiers_of_one_pod(tmp_path, driver_bin):
    """One pod with two publishers under its topic kv@podA@tiny: vLLM's own
    ZmqEventPublisher (the GPU tier, with token ids) and a kvtier server. A
    client that sends engine hashes without tokens makes kvtier's events
    device-tier updates: the indexer adds CPU and STORAGE to the request
    keys the GPU event taught it, by engine key. vLLM freeing its GPU blocks
    leaves the pod scored by kvtier's tiers. kvtier's AllBlocksCleared at a
    stop clears the whole pod, GPU entries included: llm-d's Clear is not
    scoped by medium (docs/events.md, Routers)."""
    import time

    from vllm.distributed.kv_events import (BlockRemoved, BlockStored, KVEventBatch,
                                            ZmqEventPublisher)
    # vLLM binds only wildcard and ipc endpoints (a tcp host: it connects)
    gpu_ep = "ipc://%s" % (tmp_path / "gpu.ipc")
    gpu = ZmqEventPublisher(0, endpoint=gpu_ep, topic="kv@podA@%s" % MODEL)
    a = pod_server(tmp_path, "podA")
    a.start()
    a.wait_recovered()
    ix = Indexer(driver_bin, [("podA", gpu_ep), ("podA", a.pub)], tmp_path)

    def gpu_event(ev):
        gpu.publish(KVEventBatch(ts=time.time(), events=[ev]))

    def stored(toks, hashes):
        return BlockStored(block_hashes=hashes, parent_block_hash=None, token_ids=toks,
                           block_size=BLOCK, lora_id=None, medium="GPU", lora_name=None)
    try:
        subscribed(ix, a, 907)
        p_toks, p_hashes = prompt(908, 1)

        def gpu_seen():
            gpu_event(stored(p_toks, p_hashes))
            return ix.score(p_toks)["scores"].get("podA") == pytest.approx(4.0)
        wait_for(gpu_seen, timeout=30, what="the indexer subscribed to vLLM's publisher")
        gpu_event(BlockRemoved(block_hashes=p_hashes, medium="GPU"))

        x_toks, x_hashes = prompt(4, 2)   # 8 blocks
        gpu_event(stored(x_toks, x_hashes))
        expect(ix, x_toks, lambda r: r["hits"] == {"podA": {"gpu": 8}}, "X in vLLM's GPU tier")
        # kvtier: the engine's hashes, no tokens
        keys = keys_for("X", 2, chunk=CHUNK)
        with a.client() as c:
            assert c.store(keys, random_payloads(2, 4096),
                           blocks={"size": BLOCK, "hashes": x_hashes, "parent": None}) == 2
            assert not c.flush()
        r = expect(ix, x_toks, lambda r: r["hits"] == {"podA": {"gpu": 8, "cpu": 8, "storage:fs[0]": 8}},
                   "kvtier's tiers added to the GPU event's keys")
        assert r["scores"] == {"podA": pytest.approx(8.0)}  # the best medium of each block
        gpu_event(BlockRemoved(block_hashes=x_hashes, medium="GPU"))
        r = expect(ix, x_toks, lambda r: r["hits"] == {"podA": {"cpu": 8, "storage:fs[0]": 8}},
                   "vLLM freed its GPU blocks")
        assert r["scores"] == {"podA": pytest.approx(8 * W_CPU)}
        # a chunk stored without tokens whose engine keys the indexer never
        # saw with tokens is dropped: nothing to add a medium to
        y_toks, y_hashes = prompt(5, 1)
        with a.client() as c:
            assert c.store(keys_for("Y", 1, chunk=CHUNK), random_payloads(1, 4096),
                           blocks={"size": BLOCK, "hashes": y_hashes, "parent": None}) == 1
            assert not c.flush()
        subscribed(ix, a, 909)  # every event before the probe was processed
        assert ix.score(y_toks)["scores"] == {}
        # vLLM holds X on the GPU again; kvtier stops: AllBlocksCleared
        gpu_event(stored(x_toks, x_hashes))
        expect(ix, x_toks, lambda r: r["hits"].get("podA", {}).get("gpu") == 8, "X on the GPU again")
        a.stop()
        r = expect(ix, x_toks, lambda r: not r["scores"], "podA cleared by kvtier's stop")
        assert r["hits"] == {}  # vLLM's GPU entries too
    finally:
        ix.close()
        gpu.shutdown()
        a.kill()
        log = a.read_log()
        assert not any(m in log for m in SANITIZER_MARKERS), log[-6000:]
