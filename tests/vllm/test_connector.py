"""vLLM serves from kvtier through kvtier's own connector (kvtier.vllm).

One kvtier server (fs L2) and two vLLM engine instances: the first computes
and stores, the second (a new process, so vLLM's own prefix cache is empty)
must load. The second instance then runs the other scenarios, with vLLM's
prefix cache reset between rounds so that every hit comes from kvtier.
Outputs are compared token for token with a run without any connector.
"""

import os
import signal
import threading
import time

import pytest

from support.engine import Engine, kvtier_connector_config
from support.prompts import BLOCK, CHUNK, MAX_TOKENS, keys_of, prompt, stored_keys, tokens
from support.server import wait_for

P_LONG = prompt("long", tokens(300, 1))                     # 4 full chunks + 44
P_SHARED_A = prompt("shared_a", tokens(192, 2) + tokens(100, 3))   # 3 shared chunks
P_SHARED_B = prompt("shared_b", tokens(192, 2) + tokens(100, 4))
P_RESTART = prompt("restart", tokens(260, 5))               # 4 full chunks
P_KILL = [prompt("kill%d" % i, tokens(200, 10 + i)) for i in range(4)]
P_DOWN = prompt("down", tokens(150, 20))
P_BACK = prompt("back", tokens(200, 21))
P_CORRUPT = prompt("corrupt", tokens(340, 6))               # 5 full chunks
P_TENANT = prompt("tenant", tokens(270, 7))                 # 4 full chunks


def full_chunks(toks):
    return len(toks) // CHUNK


def expected_hit_tokens(toks, chunks):
    """vLLM computes at least the last prompt token itself."""
    return min(chunks * CHUNK, (len(toks) - 1) // BLOCK * BLOCK)


def wait_stored(server, model, toks, salt="", n=None, timeout=60):
    """Stores run after the forward pass, in the background: wait for them."""
    keys = keys_of(model, toks, salt)
    n = len(keys) if n is None else n
    wait_for(lambda: stored_keys(server, keys) >= n, timeout=timeout,
             what="%d chunks of the prompt in kvtier" % n)


def ext_hits(m):
    return m.get("vllm:external_prefix_cache_hits", 0)


@pytest.fixture(scope="module")
def cfg(kvt_server):
    return kvtier_connector_config(kvt_server.url, retry_s=1, timeout_ms=3000)


@pytest.fixture(scope="module")
def engine(tiny_model, kvt_server, cfg, baseline, tmp_path_factory):
    """The second engine instance; the first one runs inside this fixture."""
    logs = tmp_path_factory.mktemp("logs")
    with Engine(tiny_model, cfg, log=str(logs / "engine-1.log")) as first:
        r = first.generate([{"tokens": P_LONG}], max_tokens=MAX_TOKENS)
        assert r["outputs"][0]["tokens"] == baseline["long"]
        assert r["outputs"][0]["num_cached_tokens"] == 0
        wait_stored(kvt_server, tiny_model, P_LONG)
    eng = Engine(tiny_model, cfg, log=str(logs / "engine-2.log"))
    yield eng
    eng.close()


def status(server):
    with server.client(timeout_ms=3000) as c:
        return c.status()


def run(engine, toks, salt=None):
    p = {"tokens": toks}
    if salt:
        p["salt"] = salt
    before = ext_hits(engine.metrics())
    r = engine.generate([p], max_tokens=MAX_TOKENS)
    return r["outputs"][0], ext_hits(r["metrics"]) - before


def test_second_instance_loads_every_full_chunk(engine, kvt_server, baseline):
    st0 = status(kvt_server)
    out, hits = run(engine, P_LONG)
    st1 = status(kvt_server)
    n = full_chunks(P_LONG)
    assert out["tokens"] == baseline["long"]
    assert hits == expected_hit_tokens(P_LONG, n) == n * CHUNK
    assert out["num_cached_tokens"] == hits
    # kvtier's side of the same hit: the scheduler's lookup and the worker's
    # prepare_retrieve each found the n chunks in L1, and nothing was stored
    assert st1["l1"]["counters"]["hits"] - st0["l1"]["counters"]["hits"] == 2 * n
    ops0, ops1 = st0["rpc"]["ops"], st1["rpc"]["ops"]
    assert ops1["prepare_retrieve"]["count"] - ops0.get("prepare_retrieve", {}).get("count", 0) == 1
    assert st1["l1"]["counters"]["stores"] == st0["l1"]["counters"]["stores"]


def test_shared_prefix_hits_exactly_the_shared_chunks(engine, kvt_server, tiny_model, baseline):
    engine.reset()
    out, hits = run(engine, P_SHARED_A)
    assert out["tokens"] == baseline["shared_a"] and hits == 0
    wait_stored(kvt_server, tiny_model, P_SHARED_A)
    engine.reset()
    out, hits = run(engine, P_SHARED_B)
    assert out["tokens"] == baseline["shared_b"]
    assert hits == 3 * CHUNK


def test_restart_keeps_hits_from_l2(engine, kvt_server, tiny_model, baseline):
    engine.reset()
    out, _ = run(engine, P_RESTART)
    assert out["tokens"] == baseline["restart"]
    wait_stored(kvt_server, tiny_model, P_RESTART)
    with kvt_server.client() as c:
        c.flush()
    kvt_server.stop()
    kvt_server.start()
    kvt_server.wait_recovered()
    st0 = status(kvt_server)
    assert st0["l1"]["objects"] == 0
    engine.reset()
    out, hits = run(engine, P_RESTART)
    st1 = status(kvt_server)
    assert out["tokens"] == baseline["restart"]
    n = full_chunks(P_RESTART)
    assert hits == n * CHUNK
    assert st1["prefetch"]["keys_loaded"] - st0["prefetch"]["keys_loaded"] == n
    assert st1["l2"][0]["counters"]["load_ok"] - st0["l2"][0]["counters"]["load_ok"] == n


def test_killed_kvtier_never_fails_a_request(engine, kvt_server, tiny_model, baseline):
    engine.reset()
    result = {}

    def gen():
        result["r"] = engine.generate([{"tokens": t} for t in P_KILL], max_tokens=MAX_TOKENS)

    th = threading.Thread(target=gen)
    th.start()
    time.sleep(0.3)
    kvt_server.kill(signal.SIGKILL)
    th.join(timeout=600)
    assert [o["tokens"] for o in result["r"]["outputs"]] == [baseline["kill%d" % i] for i in range(4)]
    # with kvtier down: recompute, no error
    out, hits = run(engine, P_DOWN)
    assert out["tokens"] == baseline["down"] and hits == 0
    # kvtier back: the connector reconnects by itself and hits resume
    kvt_server.start()
    kvt_server.wait_recovered()

    def stored_back():
        engine.reset()
        out, _ = run(engine, P_BACK)
        assert out["tokens"] == baseline["back"]
        try:
            wait_stored(kvt_server, tiny_model, P_BACK, timeout=5)
            return True
        except AssertionError:
            return False  # still inside the connector's retry window: again

    wait_for(stored_back, timeout=120, what="the connector storing again after the restart")
    engine.reset()
    out, hits = run(engine, P_BACK)
    assert out["tokens"] == baseline["back"]
    assert hits == full_chunks(P_BACK) * CHUNK


def test_corrupt_object_is_a_miss_and_a_recompute(engine, kvt_server, tiny_model, baseline):
    engine.reset()
    out, _ = run(engine, P_CORRUPT)
    assert out["tokens"] == baseline["corrupt"]
    wait_stored(kvt_server, tiny_model, P_CORRUPT)
    with kvt_server.client() as c:
        c.flush()
    kvt_server.stop()
    victim = keys_of(tiny_model, P_CORRUPT).hashes[2].hex()
    files = [f for f in os.listdir(kvt_server.data_dir) if victim in f]
    assert len(files) == 1, files
    path = os.path.join(kvt_server.data_dir, files[0])
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) - 100)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0x5A]))
    kvt_server.start()
    kvt_server.wait_recovered()
    engine.reset()
    out, hits = run(engine, P_CORRUPT)
    assert out["tokens"] == baseline["corrupt"]
    assert hits == 2 * CHUNK          # the prefix ends before the corrupt chunk
    assert status(kvt_server)["l2"][0]["counters"]["corrupt"] >= 1


def test_tenants_never_share_chunks(engine, kvt_server, tiny_model, baseline):
    engine.reset()
    out, hits = run(engine, P_TENANT, salt="tenant-a")
    assert out["tokens"] == baseline["tenant"] and hits == 0
    wait_stored(kvt_server, tiny_model, P_TENANT, salt="tenant-a")
    engine.reset()
    out, hits = run(engine, P_TENANT, salt="tenant-b")
    assert out["tokens"] == baseline["tenant"] and hits == 0
    engine.reset()
    out, hits = run(engine, P_TENANT)
    assert hits == 0
    engine.reset()
    out, hits = run(engine, P_TENANT, salt="tenant-a")
    assert out["tokens"] == baseline["tenant"]
    assert hits == full_chunks(P_TENANT) * CHUNK
    by_salt = status(kvt_server)["l2"][0]["bytes_by_cache_salt"]
    assert by_salt.get("tenant-a", 0) > 0 and by_salt.get("tenant-b", 0) > 0
