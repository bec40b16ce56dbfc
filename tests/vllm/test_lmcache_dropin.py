"""kvtier as a drop-in for `lmcache server`: vLLM's in-tree LMCacheMPConnector
(engine_driven) and LMCache's own client (the pinned lmcache package) against
`kvtier server --lmcache-port`, and the same vLLM run against LMCache's own
server when it starts here (CPU only).

Run: KVT_VENV_PYTHON=<venv>/bin/python <venv>/bin/python -m pytest tests/vllm/test_lmcache_dropin.py
"""

import json
import os
import signal
import subprocess
import time
import urllib.request

import pytest

from support.engine import Engine, venv_python
from support.model import make_tiny_model
from support.paths import BIN, ROOT
from support.ports import free_port

PROBE = os.path.join(ROOT, "tests", "lmcache", "lmc_probe.py")
CHUNK = 32
BLOCK = 32


class Kvtier:
    def __init__(self, workdir, data_dir, extra=(), lmc_host="127.0.0.1"):
        self.workdir = str(workdir)
        self.data_dir = str(data_dir)
        self.extra = list(extra)
        self.lmc_host = lmc_host
        self.port = free_port()
        self.lmc_port = free_port()
        self.http_port = free_port()
        self.proc = None
        self.log = os.path.join(self.workdir, "kvtier-%d.log" % self.lmc_port)

    def start(self):
        cmd = [BIN, "server", "--port", str(self.port), "--http-port", str(self.http_port),
               "--lmcache-port", str(self.lmc_port), "--lmcache-host", self.lmc_host,
               "--chunk-size", str(CHUNK), "--l1-size-gb", "0.25", "--l1-init-size-gb", "0.25",
               "--data-dir", self.data_dir] + self.extra
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

    def url(self):
        """What LMCache's connector connects to: lmcache.mp.host:lmcache.mp.port."""
        host = self.lmc_host if self.lmc_host.startswith("ipc://") else "tcp://" + self.lmc_host
        return "%s:%d" % (host, self.lmc_port)

    def flush(self):
        """Wait until every store reached L2 (store controller idle)."""
        deadline = time.time() + 30
        while time.time() < deadline:
            st = self.status()["store"]
            if st.get("done_seq", 0) >= st.get("last_seq", 0):
                return
            time.sleep(0.1)

    def stop(self, sig=signal.SIGTERM):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc:
            # a killed server cannot unlink its pool's name: the test does
            stale = "/dev/shm/lmcache_l1_pool_kvtier_%d" % self.proc.pid
            if os.path.exists(stale):
                os.unlink(stale)
        self.proc = None


@pytest.fixture
def kvt(tmp_path):
    servers = []

    def make(data_dir=None, extra=(), lmc_host="127.0.0.1"):
        s = Kvtier(tmp_path, data_dir or (tmp_path / "data"), extra, lmc_host)
        servers.append(s)
        return s.start()

    yield make
    for s in servers:
        s.stop()


@pytest.fixture
def lmc_auth(tmp_path):
    """Authentication on (docs/security.md): a server key and a short
    directory of mode 0700 for the LMCache port's Unix socket. Returns
    make(tenants): it writes the one client line, vllm, with those tenants
    (as written in the file), and gives (server flags, lmcache host)."""
    import shutil
    import tempfile
    keys = tmp_path / "keys"
    keys.mkdir()
    for n in ("server", "vllm"):
        subprocess.run([BIN, "keygen", str(keys / n)], check=True, capture_output=True)
    run = tempfile.mkdtemp(prefix="kvt-lmc-")  # a socket path holds at most 107 bytes

    def make(tenants):
        pub = [l for l in open(keys / "vllm.pub") if l.strip() and not l.startswith("#")][0]
        with open(keys / "clients", "w") as f:
            f.write("%s rw %s name=vllm\n" % (pub.strip(), tenants))
        return (["--auth-key", str(keys / "server.key"), "--auth-clients", str(keys / "clients"),
                 "--lmcache-client", "vllm"], "ipc://%s/lmc" % run)
    yield make
    shutil.rmtree(run, ignore_errors=True)


def probe(url, *args, timeout=180):
    out = subprocess.run([venv_python(), PROBE, url, *args], capture_output=True,
                         text=True, timeout=timeout)
    for line in out.stdout.splitlines():
        if line.startswith("PROBE "):
            return json.loads(line[6:])
    raise RuntimeError("probe failed: %s" % out.stderr[-4000:])


# ------------------------------------------------ LMCache's client, no vLLM

def test_lmcache_client_store_lookup_retrieve(kvt, tmp_path):
    s = kvt()
    r = probe(s.url(), "--chunks", "3")
    assert "error" not in r, r
    assert r["chunk_size"] == CHUNK and r["noop"] == "OK" and r["ping"] is True
    assert r["experimental"] == []
    assert r["shm_name"].startswith("lmcache_l1_pool_") and r["pool_size"] > 0
    assert r["lookup_cold"] == 0
    assert r["store_slots"] == 3 and r["store_chunk_indices"] == [0, 1, 2]
    assert r["commit_store"] is True and r["restore_slots"] == 0
    assert r["lookup_warm"] == 3 and r["retrieve_success"] and r["identical"]
    assert r["commit_retrieve"] is True and r["lookup_miss"] == 0 and r["wait_unknown"] == 0
    st = s.lmc()
    assert st["chunks_stored"] == 3 and st["chunks_retrieved"] == 3
    assert st["pending_transfers"] == 0


def test_lmcache_client_kv_event_stream(kvt, tmp_path):
    """With KV events on (docs/events.md), kvtier offers LMCache's
    "kv_event_stream": LMCache's own client subscribes (subscribe_kv_events)
    and decodes a first batch at once, then one "stored" record per chunk
    it stored (medium CPU, its chunk hash, the previous chunk's hash as
    parent, the chunk's tokens) and, after clear, a "removed" record for
    each; sequence numbers from 1, in order."""
    s = kvt(extra=["--kv-events-endpoint", "tcp://127.0.0.1:%d" % free_port()])
    r = probe(s.url(), "--chunks", "3", "--events")
    assert "error" not in r, r
    assert r["experimental"] == ["kv_event_stream"]
    batches = r["event_batches"]
    assert batches and all(isinstance(b, dict) for b in batches), batches
    assert batches[0]["enabled"] and not any(b["lost"] for b in batches)
    assert len({b["incarnation"] for b in batches}) == 1
    recs = [e for b in batches for e in b["events"]]
    assert [e["seq"] for e in recs] == list(range(1, len(recs) + 1))
    assert all(e["medium"] == "CPU" and e["model_name"] == "probe/model" for e in recs)
    stored = [e for e in recs if e["kind"] == "stored"]
    removed = [e for e in recs if e["kind"] == "removed"]
    assert len(stored) == 3 and all(len(e["block_hashes"]) == 1 for e in stored)
    hs = [e["block_hashes"][0] for e in stored]
    assert [e["parent"] for e in stored] == [None, hs[0], hs[1]]
    toks = r["tokens"]
    assert [e["token_ids"] for e in stored] == [toks[i * CHUNK:(i + 1) * CHUNK] for i in range(3)]
    assert sorted(h for e in removed for h in e["block_hashes"]) == sorted(hs)
    assert s.lmc()["kv_event_batches"] >= len(batches)


def test_lmcache_client_restart_hits_from_l2(kvt, tmp_path):
    data = tmp_path / "d"
    s = kvt(data)
    r = probe(s.url(), "--phase", "store", "--seed", "7")
    assert r.get("commit_store") is True, r
    s.flush()
    s.stop()
    assert not os.path.exists("/dev/shm/" + r["shm_name"])  # the pool went with the server
    s2 = kvt(data)
    r = probe(s2.url(), "--phase", "retrieve", "--seed", "7")
    assert r.get("lookup_warm") == 3 and r.get("identical") is True, r


def test_lmcache_client_over_the_authenticated_unix_socket(kvt, lmc_auth):
    """With --auth-key: LMCache's own client over ipc:// (the server's uid),
    its requests acting as the one client line: its tenant is served byte
    for byte, another salt is a miss with nothing stored, never an error."""
    extra, host = lmc_auth("team-a")
    s = kvt(extra=extra, lmc_host=host)
    assert s.url().startswith("ipc://")
    r = probe(s.url(), "--chunks", "3", "--salt", "team-a", "--no-clear")
    assert "error" not in r, r
    assert r["store_slots"] == 3 and r["commit_store"] is True, r
    assert r["lookup_warm"] == 3 and r["identical"] is True, r
    r = probe(s.url(), "--chunks", "3", "--salt", "team-b", "--no-clear", "--seed", "2")
    assert "error" not in r, r
    assert r["lookup_cold"] == 0 and r["store_slots"] == 0 and r["lookup_warm"] == 0, r
    st = s.status()
    assert st["lmcache"]["chunks_stored"] == 3, st["lmcache"]
    assert st["lmcache"]["auth"]["denied_requests"] >= 3, st["lmcache"]


def _client_call(url, code):
    """Run `code` with c = LMCache's request client; return its printed result."""
    src = ("import json,sys\n"
           "from lmcache.v1.multiprocess.transport.factory import RequestClientFactory\n"
           "c = RequestClientFactory.create(%r)\n"
           "try:\n"
           "    r = %s\n"
           "    print('RES ' + json.dumps({'ok': repr(r)}))\n"
           "except Exception as e:\n"
           "    print('RES ' + json.dumps({'err': '%%s: %%s' %% (type(e).__name__, e)}))\n"
           "c.close()\n") % (url, code)
    out = subprocess.run([venv_python(), "-c", src], capture_output=True, text=True,
                         timeout=120)
    for line in out.stdout.splitlines():
        if line.startswith("RES "):
            return json.loads(line[4:])
    raise RuntimeError(out.stderr[-3000:])


def test_lmcache_driven_mode_refused_with_clear_message(kvt):
    s = kvt()
    t0 = time.time()
    r = _client_call(s.url(), "c.register_kv_cache(1, [], 'm', 1, 'vllm', {}, []).result(timeout=30)")
    assert time.time() - t0 < 25  # answered, not timed out
    assert "LMCACHE_MP_TRANSFER_MODE=engine_driven" in r["err"], r
    # store/retrieve (lmcache_driven forms) likewise
    from_key = ("__import__('lmcache.v1.multiprocess.custom_types', fromlist=['x'])"
                ".IPCCacheServerKey('m', 1, 0, (1,)*32, 0, 32, 'r', num_kv_readers=1)")
    r = _client_call(s.url(), "c.store(%s, 1, [[0]], b'').result(timeout=30)" % from_key)
    assert "LMCACHE_MP_TRANSFER_MODE=engine_driven" in r["err"], r


def test_pickle_transport_refused_with_clear_message(kvt):
    s = kvt()
    code = ("[c.register_kv_cache_engine_driven_context(__import__('lmcache.v1.multiprocess."
            "custom_types', fromlist=['x']).RegisterEngineDrivenContextPayload(instance_id=9, "
            "model_name='m', world_size=1, block_size=16, num_layers=2, hidden_dim_size=8, "
            "dtype_str='float16', use_mla=False, num_physical_slots=16)).result(timeout=30), "
            "c.commit_store(__import__('lmcache.v1.multiprocess.custom_types', fromlist=['x'])"
            ".IPCCacheServerKey('m', 1, 0, (1,)*32, 0, 32, 'r', num_kv_readers=1), 9, "
            "b'pickled').result(timeout=30)]")
    r = _client_call(s.url(), code)
    assert "pickle" in r["err"] and "LMCACHE_MP_TRANSFER_MODE=engine_driven" in r["err"], r


def test_every_request_gets_a_reply_even_malformed(kvt):
    """Raw frames: unknown ops, wrong argument counts, garbage payloads, bad keys."""
    s = kvt()
    src = r'''
import msgspec, zmq, json, sys
ctx = zmq.Context(); d = ctx.socket(zmq.DEALER); d.connect(sys.argv[1]); d.RCVTIMEO = 10000
enc = msgspec.msgpack.encode
cases = [
  [enc(1), enc(99)],                                   # unknown legacy id
  [enc(2), enc(11)],                                   # retired id
  [enc(3), enc("no_such_op")],
  [enc(4), b"\xc1"],                                   # not msgpack
  [enc(5), enc(8), b"\x93\x01"],                       # lookup with truncated arg
  [enc(6), enc(8), enc({"model_name": 1}), enc(1)],    # lookup with a bad key
  [enc(7), enc(16), enc([]), enc(1)],                  # prepare_store bad key
  [enc(8), enc(21), enc(1)],                           # get_chunk_size with an extra arg
  [enc(9), enc(8), enc({"model_name": "a@b", "world_size": 1, "worker_id": None,
       "token_ids": [1] * 32, "start": 0, "end": 32, "request_id": "x",
       "num_kv_readers": 1}), enc(1)],                 # model with '@'
  [enc(10), enc(16), enc({"model_name": "m", "world_size": 1, "worker_id": 0,
       "token_ids": [1] * 32, "start": 3, "end": 32, "request_id": "x",
       "num_kv_readers": 1}), enc(1)],                 # unregistered instance
  [enc(11), enc(14), enc({"instance_id": 1})],         # register with missing fields
  [enc(12), enc(22), enc(None)],                       # ping: ok
  [enc(13)] + [enc(0)] * 20,                           # too many frames
  [enc(14), enc(16), enc({"model_name": "m", "world_size": 1, "worker_id": 0,
       "token_ids": [1] * 32, "start": 0, "end": 32, "request_id": "x",
       "num_kv_readers": 1}), enc(12345)],             # unknown instance: a valid miss
  [enc(15), enc(22), enc(12345)],                      # its ping: false once (re-register)
  [enc(16), enc(22), enc(12345)],                      # then true
]
out = []
for c in cases:
    d.send_multipart(c)
    try:
        r = d.recv_multipart()
    except zmq.Again:
        out.append(None); continue
    op = r[1]
    try:
        op = msgspec.msgpack.decode(op)
    except Exception:
        op = repr(op)
    out.append([r[0].hex(), op, len(r)])
    if len(r) > 2:
        out[-1].append(repr(msgspec.msgpack.decode(r[2])))
print("RAW " + json.dumps(out))
'''
    out = subprocess.run([venv_python(), "-c", src, s.url()], capture_output=True,
                         text=True, timeout=120)
    line = [l for l in out.stdout.splitlines() if l.startswith("RAW ")]
    assert line, out.stderr[-3000:]
    res = json.loads(line[0][4:])
    assert all(r is not None for r in res), res  # every request answered
    for i, r in enumerate(res):
        if i in (11, 13, 14, 15):
            assert isinstance(r[1], int), (i, r)  # answered normally
        else:
            assert isinstance(r[1], str) and r[1].startswith("kvtier error:"), (i, r)
    assert "world_size" in res[10][1] or "missing field" in res[10][1]
    assert "'slots': []" in res[13][3], res[13]  # nothing to store, no error in the worker
    assert res[14][3] == "False" and res[15][3] == "True", res[13:]
    assert s.proc.poll() is None  # and the server is alive


# ------------------------------------------------------------- real vLLM

def _prompts(n=2, chunks=3, extra=5, seed=3):
    import random
    rnd = random.Random(seed)
    return [{"tokens": [rnd.randrange(3, 2000) for _ in range(chunks * CHUNK + extra)]}
            for _ in range(n)]


def _ktc(port, host="tcp://127.0.0.1", heartbeat=10.0):
    return {"kv_connector": "LMCacheMPConnector", "kv_role": "kv_both",
            "kv_connector_extra_config": {"lmcache.mp.host": host, "lmcache.mp.port": port,
                                          "lmcache.mp.mq_timeout": 60.0,
                                          "lmcache.mp.heartbeat_interval": heartbeat}}


LMC_ENV = {"LMCACHE_MP_TRANSFER_MODE": "engine_driven", "LMCACHE_DISABLE_BANNER": "1",
           "LMCACHE_USAGE_TRACK": "0", "LMCACHE_TRACK_USAGE": "false"}


def _engine(model, log, port=None, heartbeat=10.0, host="tcp://127.0.0.1"):
    return Engine(model, _ktc(port, host, heartbeat=heartbeat) if port else None,
                          block_size=BLOCK, max_model_len=1024, env=LMC_ENV, log=log)


def _each(eng, prompts):
    """One prompt per generate call, as in every run here (same batch shapes)."""
    outs = [eng.generate([p])["outputs"][0] for p in prompts]
    return [o["tokens"] for o in outs], [o["num_cached_tokens"] for o in outs]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_tiny_model(str(tmp_path_factory.mktemp("model") / "tiny"))


@pytest.fixture(scope="module")
def baseline(model, tmp_path_factory):
    prompts = _prompts()
    with _engine(model, str(tmp_path_factory.mktemp("logs") / "baseline.log")) as eng:
        toks, _ = _each(eng, prompts)
    return prompts, toks


def test_vllm_second_engine_hits_every_full_chunk(kvt, model, baseline, tmp_path):
    prompts, want = baseline
    full = [len(p["tokens"]) // CHUNK for p in prompts]
    data = tmp_path / "vdata"
    s = kvt(data)
    log = str(tmp_path / "vllm.log")
    # engine 1: cold, stores every full chunk
    with _engine(model, log, s.lmc_port) as eng:
        toks, _ = _each(eng, prompts)
    assert toks == want
    st = s.lmc()
    assert st["chunks_stored"] == sum(full), st
    # engine 2: a fresh instance: every full chunk comes from kvtier
    with _engine(model, log, s.lmc_port) as eng:
        toks, cached = _each(eng, prompts)
    assert toks == want
    st = s.lmc()
    assert st["chunks_retrieved"] == sum(full), st
    assert cached == [f * CHUNK for f in full], cached
    assert st["pending_transfers"] == 0
    # kvtier restarts: the hits come from its L2 (the fs adapter)
    s.flush()
    s.stop()
    s2 = kvt(data)
    with _engine(model, log, s2.lmc_port) as eng:
        toks, cached = _each(eng, prompts)
    assert toks == want
    assert s2.lmc()["chunks_retrieved"] == sum(full)
    assert cached == [f * CHUNK for f in full], cached


def test_vllm_kvtier_restart_and_kill_under_a_running_engine(kvt, lmc_auth, model, baseline,
                                                             tmp_path):
    """One engine keeps running while kvtier restarts (the worker registers
    again on its heartbeat and hits come from kvtier's L2), then while kvtier
    is SIGKILLed: every request completes, token-identical to no cache.
    kvtier runs with authentication on, as docs/security.md sets it up: the
    LMCache port is a Unix socket ("lmcache.mp.host": "ipc://..."), the
    requests (no cache_salt: @none) act as the client line vllm."""
    prompts, want = baseline
    full = len(prompts[0]["tokens"]) // CHUNK
    extra, host = lmc_auth("@none")
    s = kvt(tmp_path / "kdata", extra=extra, lmc_host=host)
    with _engine(model, str(tmp_path / "vllm-restart-kill.log"), s.lmc_port, 1.0,
                 host=host) as eng:
        toks, _ = _each(eng, prompts[:1])
        assert toks == want[:1]
        # restart on the same port; the L1 pool is new (a new name)
        s.flush()
        s.stop()
        s.start()
        deadline = time.time() + 60
        while s.lmc()["contexts"] < 1 and time.time() < deadline:
            time.sleep(0.2)  # the worker's heartbeat: false once, then it registers again
        assert s.lmc()["contexts"] == 1
        eng.reset()  # vLLM's own prefix cache: what follows can only hit kvtier
        toks, cached = _each(eng, prompts[:1])
        assert toks == want[:1]
        assert s.lmc()["chunks_retrieved"] == full  # served from the L2 after the restart
        assert cached == [full * CHUNK]
        assert s.lmc()["auth"]["denied_requests"] == 0
        s.stop(signal.SIGKILL)
        time.sleep(4)  # > two heartbeat intervals: the adapters go degraded
        toks, _ = _each(eng, prompts[1:])
        assert toks == want[1:]


def _lmcache_server(tmp_path, port, name):
    exe = os.path.join(os.path.dirname(venv_python()), "lmcache")
    log = str(tmp_path / "lmcache-server.log")
    cmd = [exe, "server", "--host", "127.0.0.1", "--port", str(port), "--http-port",
           str(free_port()), "--l1-size-gb", "0.25", "--eviction-policy", "LRU",
           "--chunk-size", str(CHUNK), "--supported-transfer-mode", "engine_driven",
           "--shm-name", name, "--no-l1-use-lazy", "--disable-observability",
           "--disable-metrics"]
    env = dict(os.environ, LMCACHE_DISABLE_BANNER="1")
    p = subprocess.Popen(cmd, stdout=open(log, "ab"), stderr=subprocess.STDOUT, env=env)
    deadline = time.time() + 180
    while time.time() < deadline:
        if p.poll() is not None:
            pytest.skip("lmcache server does not start here (%s): %s" %
                        (" ".join(cmd), open(log).read()[-1500:]))
        if "server is running" in open(log, errors="replace").read():
            return p
        time.sleep(0.5)
    p.kill()
    pytest.skip("lmcache server did not come up in 180 s: " + open(log).read()[-1500:])


def test_vllm_same_run_against_lmcache_server(model, baseline, tmp_path):
    """The same two-engine run against LMCache's own server (pinned package,
    CPU only, engine_driven): identical outputs and the same hits, so the test
    above exercises LMCache's protocol, not kvtier's conventions."""
    prompts, want = baseline
    full = [len(p["tokens"]) // CHUNK for p in prompts]
    port = free_port()
    p = _lmcache_server(tmp_path, port, "kvt_test_%d" % port)
    try:
        log = str(tmp_path / "vllm-lmc.log")
        with _engine(model, log, port) as eng:
            toks, _ = _each(eng, prompts)
        assert toks == want
        with _engine(model, log, port) as eng:
            toks, cached = _each(eng, prompts)
        assert toks == want
        assert cached == [f * CHUNK for f in full], cached
    finally:
        p.send_signal(signal.SIGINT)
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def test_vllm_lmcache_path_publishes_kvtiers_l1_events(kvt, model, baseline, tmp_path):
    """vLLM's LMCacheMPConnector with vLLM's own KV events on, against kvtier
    with --kv-events-endpoint: LMCache's worker subscribes to kvtier's
    stream and vLLM's publisher announces, medium CPU, exactly the chunks
    kvtier's own PUB socket announces in L1 (LMCache's chunk hashes, as
    vLLM converts them); the outputs are the no-connector run's."""
    import sys
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from support.kvevents import Subscriber
    from vllm.distributed.kv_events import BlockStored

    prompts, want = baseline
    s = kvt(extra=["--kv-events-endpoint", "tcp://127.0.0.1:%d" % free_port()])
    pub = s.status()["kv_events"]["endpoint"]
    vport = free_port()
    ev = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://*:%d" % vport}
    full = sum(len(p["tokens"]) // CHUNK for p in prompts)
    with Subscriber(pub) as kv, Subscriber("tcp://127.0.0.1:%d" % vport) as vl:
        with Engine(model, _ktc(s.lmc_port), block_size=BLOCK, max_model_len=1024, env=LMC_ENV,
                    log=str(tmp_path / "vllm.log"), kv_events_config=ev) as eng:
            toks, _ = _each(eng, prompts)
            assert toks == want
            assert s.lmc()["kv_event_streams"] == 1  # LMCache's elected worker subscribed
            kv.wait(lambda x: len(x.view().get("CPU", ())) >= full, timeout=60,
                    what="kvtier's L1 events")
            ours = kv.view()["CPU"]

            def conv(h):  # as vLLM publishes a hash (the engine has this environment)
                from vllm.v1.core.kv_cache_utils import BlockHash, maybe_convert_block_hash
                return maybe_convert_block_hash(BlockHash(h))

            vl.wait(lambda x: {h for _, e in x.events() if isinstance(e, BlockStored)
                               and e.medium == "CPU" for h in e.block_hashes}
                    >= {conv(h) for h in ours}, timeout=120, what="vLLM's CPU events")
        cpu = [e for _, e in vl.events() if isinstance(e, BlockStored) and e.medium == "CPU"]
        got = [h for e in cpu for h in e.block_hashes]
        assert sorted(got) == sorted(conv(h) for h in ours) and len(ours) == full
        assert all(e.block_size == CHUNK and len(e.token_ids) == CHUNK for e in cpu)
