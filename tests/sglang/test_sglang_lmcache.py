"""SGLang's LMCache path (`--enable-lmcache`) against `kvtier server
--lmcache-port`, at class level (build/sglang-venv, `make test-sglang`).

SGLang's `LMCacheUnifiedRadixCache`
(sglang/srt/mem_cache/storage/lmcache/lmcache_unified_radix_cache.py) owns
one `lmcache.integration.sglang.unified_lmcache_mp_connector.
UnifiedLMCacheMPConnector` (lmcache 0.5.6) and does all its KV I/O through
it. The radix cache itself cannot be built without SGLang's serving stack
(its module imports sglang.srt.managers.schedule_batch, which imports the
OpenAI protocol, grammar backends, ...; docs/sglang.md), so these tests
build the connector exactly as the radix cache does (same keyword
arguments, the LMCache YAML SGLang passes as --lmcache-config-file) over
SGLang's own device KV pool and page allocator, on the CPU, and make the
radix cache's calls in its order: submit_store/complete_store on a
finished request, submit_lookup/poll_lookup on prefetch,
free_lookup_locks, submit_load/prepare_load_on_stream/complete_load on
load-back, finish_request, clear, close. Bytes must come back identical;
LMCache's other transfer mode (lmcache_driven) is refused with a message
that says how to configure SGLang. docs/sglang.md, docs/lmcache-protocol.md."""

import json
import os
import signal
import subprocess
import time
import urllib.request
from types import SimpleNamespace

import pytest
import torch

from lmcache.integration.sglang.unified_lmcache_mp_connector import UnifiedLMCacheMPConnector
from sglang.srt.configs.model_config import AttentionArch
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool
from sglang.srt.mem_cache.unified_cache.components import ComponentType

from support.paths import BIN
from support.ports import free_port, own_connections

LAYERS, HEADS, DIM, PAGE, CHUNK, SLOTS = 3, 2, 16, 16, 32, 256
MODEL = "test/tiny-sglang-lmcache"
MQ_TIMEOUT = 30.0


class Kvtier:
    """kvtier server with its LMCache front end (as tests/vllm/test_lmcache_dropin.py)."""

    def __init__(self, workdir, extra=()):
        self.workdir = str(workdir)
        self.port, self.lmc_port, self.http_port = free_port(), free_port(), free_port()
        self.extra = list(extra)
        self.log = os.path.join(self.workdir, "kvtier-%d.log" % self.lmc_port)
        self.proc = None

    def start(self):
        cmd = [BIN, "server", "--port", str(self.port), "--http-port", str(self.http_port),
               "--lmcache-port", str(self.lmc_port), "--lmcache-host", "127.0.0.1",
               "--chunk-size", str(CHUNK), "--l1-size-gb", "0.25", "--l1-init-size-gb", "0.25",
               "--data-dir", os.path.join(self.workdir, "data")] + self.extra
        self.proc = subprocess.Popen(cmd, stdout=open(self.log, "ab"), stderr=subprocess.STDOUT,
                                     cwd=self.workdir)
        deadline = time.time() + 30
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("kvtier exited: " + open(self.log).read()[-3000:])
            try:
                self.status()
                return self
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("kvtier did not come up: " + open(self.log).read()[-3000:])

    def status(self):
        with urllib.request.urlopen("http://127.0.0.1:%d/status" % self.http_port, timeout=5) as r:
            return json.loads(r.read())

    def lmc(self):
        return self.status()["lmcache"]

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


@pytest.fixture
def kvt(tmp_path):
    s = Kvtier(tmp_path).start()
    yield s
    s.stop()


def config_file(tmp_path, port, **extra):
    """What SGLang takes as --lmcache-config-file (its example_config_mp.yaml,
    pointed at kvtier's LMCache port)."""
    p = tmp_path / "lmcache_mp.yaml"
    lines = ["mp_host: 127.0.0.1", "mp_port: %d" % port]
    # a reply that never comes fails the test in 30 s, not in the client's
    # default 300 s
    extra = {"lmcache.mp.mq_timeout": MQ_TIMEOUT, **extra}
    lines.append("extra_config:")
    lines += ["  %s: %s" % (k, json.dumps(v)) for k, v in extra.items()]
    p.write_text("\n".join(lines) + "\n")
    return str(p)


class Engine:
    """What SGLang's scheduler hands LMCacheUnifiedRadixCache: its device KV
    pool (MHATokenToKVPool, NHD; or MLATokenToKVPool) and page allocator,
    here on the CPU; a model config with what the connector reads
    (attention_arch, hf_config, model_path)."""

    def __init__(self, mla=False, dtype=torch.bfloat16, seed=0):
        if mla:
            self.pool = MLATokenToKVPool(size=SLOTS, page_size=PAGE, dtype=dtype, kv_lora_rank=32,
                                         qk_rope_head_dim=16, layer_num=LAYERS, device="cpu",
                                         enable_memory_saver=False)
            self.buffers = list(self.pool.kv_buffer)
        else:
            self.pool = MHATokenToKVPool(size=SLOTS, page_size=PAGE, dtype=dtype, head_num=HEADS,
                                         head_dim=DIM, layer_num=LAYERS, device="cpu",
                                         enable_memory_saver=False, enable_alt_stream=False)
            self.buffers = [*self.pool.k_buffer, *self.pool.v_buffer]
        self.alloc = PagedTokenToKVPoolAllocator(SLOTS, PAGE, dtype, "cpu", self.pool,
                                                 need_sort=True)
        g = torch.Generator().manual_seed(seed)
        for b in self.buffers:
            b.copy_(torch.randn(b.shape, generator=g).to(dtype))
        self.model_config = SimpleNamespace(
            attention_arch=AttentionArch.MLA if mla else AttentionArch.MHA,
            hf_config={"architectures": ["DeepseekV3ForCausalLM" if mla else "LlamaForCausalLM"]},
            model_path=MODEL)

    def connector(self, cfg):
        # lmcache_unified_radix_cache.py: LMCacheUnifiedRadixCache.__init__ (TP 1, PP 1)
        return UnifiedLMCacheMPConnector(
            config_file=cfg, model_config=self.model_config, tp_size=1, tp_rank=0,
            tp_group=None, pp_size=1, pp_rank=0, pp_group=None, page_size=PAGE,
            token_to_kv_pool_allocator=self.alloc, req_to_token_pool=None,
            tree_components=(ComponentType.FULL,), mamba_component=None,
            sliding_window_size=None)

    def kv(self, slots):
        """Every layer's KV rows of these token slots."""
        return [b[slots].clone() for b in self.buffers]


def wait(pred, timeout=20, what="condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = pred()
        if v is not None:
            return v
        time.sleep(0.01)
    raise AssertionError("timed out waiting for " + what)


def close(conn, port):
    """Close a connector and wait until its connection is gone. LMCache's
    client closes its monitor socket before its DEALER (MessageQueueClient.
    close); a server that drops the connection in between makes libzmq's
    I/O thread block for good sending the disconnect event to the closed
    monitor, and no later connector of this process ever connects (seen in
    CI: a 300 s timeout two tests on). A server stopping right after a close
    would do exactly that, so the close finishes first."""
    n = own_connections(port)
    assert n >= 1, "no connection to port %d to wait for" % port
    conn.close()
    wait(lambda: True if own_connections(port) < n else None, timeout=10,
         what="the connector's connection to close")


def salt(conn, cache_salt=None, extra_key=None):
    return conn.build_cache_salt(cache_salt, extra_key)


def store(conn, rid, tokens, slots, cache_salt=""):
    """_submit_store (a finished or chunked request), then check_hicache_events."""
    op = conn.submit_store(rid, tokens, conn.device_indices_by_group(slots),
                           device_indices_start=0, cache_salt=cache_salt)
    if op is None:
        return None
    wait(lambda: True if conn.ready_prefix_count([op]) == 1 else None, what="store")
    return conn.complete_store(op)


def lookup(conn, rid, tokens, local_hit=0, cache_salt=""):
    """prefetch_from_storage + check_prefetch_progress: the hit, in tokens."""
    op = conn.submit_lookup(rid, tokens, local_hit_tokens=local_hit, cache_salt=cache_salt)
    return op, wait(lambda: conn.poll_lookup(op), what="lookup")


def load(conn, op, slots, local_hit=0):
    """_start_external_load, then check_hicache_events."""
    ld = conn.submit_load(op, conn.device_indices_by_group(slots), local_hit_tokens=local_hit,
                          owned_device_indices=slots, producer_stream=None)
    ok = conn.prepare_load_on_stream(ld, None)
    wait(lambda: True if conn.ready_prefix_count([ld]) == 1 else None, what="load")
    return ok and conn.complete_load(ld)


def ops(kvt):
    return {k: v["count"] for k, v in kvt.lmc()["ops"].items()}


def settled(kvt):
    """kvtier's LMCache status once every session has ended: end_session
    (like free_lookup_locks) is sent without waiting for its reply."""
    st = kvt.lmc()
    return st if st["sessions"] == 0 else None


def assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert torch.equal(x, y)


TOKENS = list(range(1000, 1000 + 3 * CHUNK + 5))   # 3 full chunks and a tail


@pytest.mark.parametrize("mla", [False, True], ids=["mha", "mla"])
def test_store_lookup_retrieve_identical(tmp_path, kvt, mla):
    eng = Engine(mla=mla)
    conn = eng.connector(config_file(tmp_path, kvt.lmc_port,
                                     **{"lmcache.mp.heartbeat_interval": 0.1}))
    try:
        st = kvt.lmc()
        assert conn.chunk_size == CHUNK                 # get_chunk_size
        assert st["contexts"] == 1                      # register_kv_cache_engine_driven_context
        src = eng.alloc.alloc(len(TOKENS) // PAGE * PAGE)
        assert store(conn, "req-a", TOKENS, src)        # prepare_store, commit_store
        assert store(conn, "req-a", TOKENS, src) is None  # nothing new for this request
        conn.finish_request("req-a")                    # end_session
        assert kvt.lmc()["chunks_stored"] == 3

        op, hit = lookup(conn, "req-b", TOKENS)         # lookup, query_prefetch_status
        assert hit == 3 * CHUNK
        dst = eng.alloc.alloc(hit)
        assert not set(dst.tolist()) & set(src.tolist())
        page0 = eng.kv(torch.arange(PAGE))
        assert load(conn, op, dst)                      # prepare_retrieve, commit_retrieve
        assert_same(eng.kv(src[:hit]), eng.kv(dst))
        assert_same(eng.kv(torch.arange(PAGE)), page0)  # SGLang's padding page untouched
        conn.finish_request("req-b")

        op, hit = lookup(conn, "req-c", [t + 1 for t in TOKENS])  # shares nothing
        assert hit == 0
        conn.finish_request("req-c")
        wait(lambda: True if ops(kvt).get("ping", 0) > 0 else None, what="heartbeat")
        st = wait(lambda: settled(kvt), what="end_session")
        assert st["chunks_retrieved"] == 3 and st["lookup_hit_chunks"] == 3
        assert st["pending_transfers"] == 0
        assert all(v["errors"] == 0 for v in st["ops"].values()), st["ops"]
    finally:
        close(conn, kvt.lmc_port)                       # unregister_kv_cache_engine_driven_context
    st = kvt.lmc()
    assert st["contexts"] == 0
    assert set(st["ops"]) == {
        "get_chunk_size", "register_kv_cache_engine_driven_context", "prepare_store",
        "commit_store", "end_session", "lookup", "query_prefetch_status", "prepare_retrieve",
        "commit_retrieve", "ping", "unregister_kv_cache_engine_driven_context"}, st["ops"]


def test_chunked_store_and_partial_local_hit(tmp_path, kvt):
    """A request stored as its prefill advances (only the new chunk goes out);
    a later request with part of the prefix still on the device: the locks
    of the chunks it has are freed, the rest is loaded past a page-aligned
    local hit that is not chunk-aligned (skip_first_n_tokens)."""
    eng = Engine()
    conn = eng.connector(config_file(tmp_path, kvt.lmc_port))
    try:
        src = eng.alloc.alloc(len(TOKENS) // PAGE * PAGE)
        assert store(conn, "req-a", TOKENS[:2 * CHUNK], src[:2 * CHUNK])
        assert kvt.lmc()["chunks_stored"] == 2
        assert store(conn, "req-a", TOKENS, src)
        assert kvt.lmc()["chunks_stored"] == 3
        conn.finish_request("req-a")

        local = CHUNK + PAGE                       # what the radix tree still has
        op, hit = lookup(conn, "req-b", TOKENS, local_hit=local)
        assert hit == 3 * CHUNK
        conn.free_lookup_locks("req-b", start=0, end=CHUNK)   # check_prefetch_progress
        # a control request the connector does not wait for
        wait(lambda: True if ops(kvt).get("free_lookup_locks") == 1 else None,
             what="free_lookup_locks")
        dst = eng.alloc.alloc(hit - local)
        assert load(conn, op, dst, local_hit=local)
        assert_same(eng.kv(src[local:hit]), eng.kv(dst))
        conn.finish_request("req-b")
        st = wait(lambda: settled(kvt), what="end_session")
        assert st["pending_transfers"] == 0
        assert all(v["errors"] == 0 for v in st["ops"].values()), st["ops"]
    finally:
        close(conn, kvt.lmc_port)


def test_cache_salt_and_extra_key_separate(tmp_path, kvt):
    """SGLang's cache_salt and extra_key (LoRA id, ...) become LMCache's salt:
    the same tokens under another salt are another object."""
    eng = Engine()
    conn = eng.connector(config_file(tmp_path, kvt.lmc_port))
    try:
        src = eng.alloc.alloc(len(TOKENS) // PAGE * PAGE)
        s1 = salt(conn, "tenant-1", None)
        s2 = salt(conn, "tenant-1", "lora-7")
        assert store(conn, "req-a", TOKENS, src, cache_salt=s1)
        conn.finish_request("req-a")
        for rid, s, want in (("b", s1, 3 * CHUNK), ("c", s2, 0), ("d", "", 0)):
            _, hit = lookup(conn, rid, TOKENS, cache_salt=s)
            assert hit == want, (s, hit)
            conn.finish_request(rid)
    finally:
        close(conn, kvt.lmc_port)


def test_clear_and_restart_hit_from_l2(tmp_path):
    """clear() (SGLang's clear_storage_backend) empties kvtier's L1 only;
    the chunks come back from L2, also to a new SGLang after kvtier
    restarts, byte-identical."""
    s = Kvtier(tmp_path).start()
    try:
        eng = Engine()
        conn = eng.connector(config_file(tmp_path, s.lmc_port))
        src = eng.alloc.alloc(len(TOKENS) // PAGE * PAGE)
        want = eng.kv(src[:3 * CHUNK])
        assert store(conn, "req-a", TOKENS, src)
        conn.finish_request("req-a")
        wait(lambda: True if s.status()["store"].get("done_seq", 0)
             >= s.status()["store"].get("last_seq", 0) else None, what="L2 flush")
        assert conn.clear()
        assert ops(s)["clear"] == 1
        op, hit = lookup(conn, "req-b", TOKENS)
        assert hit == 3 * CHUNK
        dst = eng.alloc.alloc(hit)
        assert load(conn, op, dst)
        assert_same(want, eng.kv(dst))
        conn.finish_request("req-b")
        close(conn, s.lmc_port)

        s.stop()
        s.start()
        eng2 = Engine(seed=1)                       # a new SGLang process
        conn = eng2.connector(config_file(tmp_path, s.lmc_port))
        try:
            op, hit = lookup(conn, "req-c", TOKENS)
            assert hit == 3 * CHUNK
            dst = eng2.alloc.alloc(hit)
            assert load(conn, op, dst)
            assert_same(want, eng2.kv(dst))
            conn.finish_request("req-c")
        finally:
            close(conn, s.lmc_port)
    finally:
        s.stop()


def test_lmcache_driven_mode_refused_with_clear_message(tmp_path, kvt):
    """LMCache's other transfer mode (the server copying from the engine's
    KV cache itself; the default on CUDA, opt-in on the CPU): kvtier refuses
    its registration with a message that says how to run SGLang instead,
    and SGLang's cache construction fails with it."""
    eng = Engine()
    cfg = config_file(tmp_path, kvt.lmc_port, **{"lmcache.mp.mp_transfer_mode": "lmcache_driven"})
    with pytest.raises(Exception) as e:
        eng.connector(cfg)
    msg = str(e.value)
    assert "engine-driven transfer mode only" in msg, msg
    assert "LMCACHE_MP_TRANSFER_MODE=engine_driven" in msg and "SGLang" in msg, msg
    st = kvt.lmc()
    assert st["ops"]["register_kv_cache"]["errors"] == 1 and st["contexts"] == 0
    # and the engine-driven configuration on the same server works
    conn = eng.connector(config_file(tmp_path, kvt.lmc_port,
                                     **{"lmcache.mp.mp_transfer_mode": "engine_driven"}))
    close(conn, kvt.lmc_port)


def test_sglang_builds_this_connector():
    """The pinned SGLang's LMCache radix cache (not importable here: it needs
    SGLang's serving stack) builds the connector these tests drive, with the
    keyword arguments Engine.connector passes."""
    import importlib.util
    spec = importlib.util.find_spec("sglang.srt.mem_cache.storage.lmcache."
                                    "lmcache_unified_radix_cache")
    src = open(spec.origin).read()
    assert ("from lmcache.integration.sglang.unified_lmcache_mp_connector import (\n"
            "    UnifiedLMCacheMPConnector,") in src
    call = src[src.index("self.lmcache_connector = UnifiedLMCacheMPConnector("):]
    call = call[:call.index("\n        )")]
    kwargs = {line.strip().split("=")[0] for line in call.splitlines()[1:]}
    assert kwargs == {
        "config_file", "model_config", "tp_size", "tp_rank", "tp_group", "pp_size", "pp_rank",
        "pp_group", "page_size", "token_to_kv_pool_allocator", "req_to_token_pool",
        "tree_components", "mamba_component", "sliding_window_size"}
