"""The s3 tier under faults, with a real S3 server (versitygw) behind the
tests' own fault proxy (support/faultproxy.py), under steady verified load: one
client thread stores fresh keys and flushes (the flush's report says which
reached S3), another looks up and retrieves keys whose flush said they
reached S3 and checks every byte. The L2 store policy is skip_l1 and L1 is
small, so reads come from S3.

Each fault (hang longer than request_timeout, 500s, resets, refused
connections, the S3 server SIGSTOPped) runs for FAULT_S seconds. Asserted:
no wrong byte, the server alive with no sanitizer report, the fault detected
(breaker open, /healthz 503, the endpoint down in /status and /metrics)
within about one request_timeout, no client request waiting longer than
that, the breaker opening once per fault (no flapping on 500s), and after
the fault the endpoint up again, its last error cleared, stores and loads
landing, within the probe back-off in effect plus one request_timeout.

request_timeout and connection_timeout are the adapter's defaults (2 s),
given explicitly so that the numbers hold whatever the defaults become.
bench/s3_faults.py runs the same faults longer and prints the table."""

import json
import os
import random
import re
import signal
import threading
import time

import pytest

import kvtier
from support.data import keys_for, random_payloads
from support.faultproxy import FaultProxy
from support.s3_servers import s3_json, start_s3
from support.server import SLOW, l2_status, wait_for

KiB = 1 << 10
RT = 2.0        # request_timeout = connection_timeout (the defaults)
FAULT_S = 4.0   # how long each fault lasts: twice request_timeout
MARGIN = 1.0 * SLOW
CLIENT_TIMEOUT_MS = 20000  # the tests measure; the connector's would be 5000


class Load:
    """Steady verified load, each stream on its own client connection:
      writer   store + flush of fresh keys, about 15 batches a second; a
               batch whose flush reported no failure joins the unread set
      trickle  a store of one key every 50 ms, not waiting for its flush,
               as an engine saves KV while it computes
      readers  an arrival every 100 ms (open loop, as requests reach an
               inference server whatever the earlier ones do) takes an idle
               one of READERS clients: lookup + retrieve of an unread
               batch (so from S3: skip_l1 left it there only), every byte
               checked; otherwise of any flushed batch. Until draining is
               set (the fault starts) RESERVE unread batches are kept, so
               that the fault meets a backlog whatever the rates. An
               arrival that finds every reader busy is dropped (counted)
    ops: (start, end, kind, ok) per request; wrong: wrong bytes."""

    READERS = 16
    RESERVE = 2 * READERS

    def __init__(self, server, nkeys=4, size=64 * KiB):
        self.s, self.nkeys, self.size = server, nkeys, size
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.flushed = []          # (keys, payloads) whose flush reported no failure
        self.unread = []           # of those, the ones no reader took yet
        self.ops = []
        self.wrong = 0
        self.hits = 0
        self.dropped = 0
        self.errors = []           # anything but a KvtierError: the test fails
        self.idle = []             # idle reader clients
        self.rng = random.Random(7)
        self.draining = False
        self.threads = [threading.Thread(target=f, daemon=True)
                        for f in (self._writer, self._trickle, self._arrivals)]

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *a):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in self.threads), "a load thread hangs"
        for c in self.idle:
            c.close()

    def _guard(fn):
        def run(self, *a):
            try:
                fn(self, *a)
            except Exception as e:  # reported by the test
                self.errors.append(repr(e))
        return run

    def _client(self):
        return self.s.client(timeout_ms=CLIENT_TIMEOUT_MS, shm=False)

    def _op(self, kind, f):
        t0 = time.time()
        try:
            v, ok = f(), True
        except kvtier.KvtierError as e:
            v, ok = e, False
        with self.lock:
            self.ops.append((t0, time.time(), kind, ok))
        return v, ok

    def _mark(self, kind):
        with self.lock:
            self.ops.append((time.time(), time.time(), kind, True))

    @_guard
    def _writer(self):
        with self._client() as c:
            i = 0
            while not self.stop.is_set():
                keys = keys_for("w%d" % i, self.nkeys, seed=i)
                pay = random_payloads(self.nkeys, self.size, seed=100000 + i)
                i += 1
                _, ok = self._op("store", lambda: c.store(keys, pay))
                if not ok:
                    continue
                rep, ok = self._op("flush", c.flush)
                if ok and not rep:
                    with self.lock:
                        self.flushed.append((keys, pay))
                        self.unread.append((keys, pay))
                    self._mark("stored")
                self.stop.wait(0.05)

    @_guard
    def _trickle(self):
        with self._client() as c:
            i = 0
            while not self.stop.wait(0.05):
                keys = keys_for("t%d" % i, 1, seed=i)
                i += 1
                self._op("store", lambda: c.store(keys, random_payloads(1, 16 * KiB, seed=i)))

    @_guard
    def _arrivals(self):
        self.idle = [self._client() for _ in range(self.READERS)]
        readers = []
        while not self.stop.wait(0.1):
            with self.lock:
                spare = len(self.unread) > (0 if self.draining else self.RESERVE)
                pool = self.unread if spare else self.flushed
                c = self.idle.pop() if self.idle and pool else None
                if c is not None:
                    batch = pool.pop(self.rng.randrange(len(pool))) if pool is self.unread \
                        else self.rng.choice(pool)
            if c is None:
                self.dropped += bool(pool)
                continue
            t = threading.Thread(target=self._read, args=(c, batch), daemon=True)
            readers = [x for x in readers if x.is_alive()] + [t]
            t.start()
        for t in readers:
            t.join(timeout=60)

    @_guard
    def _read(self, c, batch):
        keys, pay = batch
        try:
            _, ok = self._op("lookup", lambda: c.lookup(keys))
            if not ok:
                return
            got, ok = self._op("retrieve", lambda: c.retrieve(keys))
            if not ok:
                return
            for i, g in enumerate(got):
                if i >= len(pay) or bytes(g) != pay[i]:
                    self.wrong += 1
            with self.lock:
                self.hits += len(got)
            if got:
                self._mark("hit")
        finally:
            with self.lock:
                self.idle.append(c)

    def first_after(self, kind, t):
        with self.lock:
            ends = [e for s, e, k, ok in self.ops if k == kind and ok and s >= t]
        return min(ends) if ends else None

    def slowest(self, t0, t1):
        """The longest request that started in [t0, t1]: (seconds, kind)."""
        with self.lock:
            d = [(e - s, k) for s, e, k, ok in self.ops
                 if t0 <= s <= t1 and k in ("store", "flush", "lookup", "retrieve")]
        return max(d) if d else (0.0, None)


def metric(server, name, **labels):
    code, text = server.http_get("/metrics")
    assert code == 200
    for line in text.splitlines():
        if line.startswith(name + "{") and all('%s="%s"' % kv in line for kv in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


def brk(server):
    return l2_status(server)["circuit_breaker"]


@pytest.fixture
def rig(make_server, tmp_path):
    """versitygw, the proxy in front of it, a kvtier server on the proxy."""
    srv = start_s3("versitygw", tmp_path)
    px = FaultProxy(srv.port)
    spec = json.loads(s3_json(srv, request_timeout=RT, connection_timeout=RT))
    spec["s3_endpoint"] = "127.0.0.1:%d" % px.port
    s = make_server(["--l1-size-gb", "0.02", "--l1-init-size-gb", "0.02",
                     "--l2-store-policy", "skip_l1", "--l2-adapter", json.dumps(spec)])
    s.wait_recovered()
    try:
        yield srv, px, s
    finally:
        if srv.proc and srv.proc.poll() is None:
            srv.proc.send_signal(signal.SIGCONT)
        px.close()
        srv.kill()


def faults(srv, px):
    """name -> (start, end) of each fault."""
    def stop():
        srv.proc.send_signal(signal.SIGSTOP)

    def cont():
        srv.proc.send_signal(signal.SIGCONT)
    return {
        "hang": (lambda: px.set_mode("hang"), lambda: px.set_mode("pass")),
        "500": (lambda: px.set_mode("500"), lambda: px.set_mode("pass")),
        "reset": (lambda: px.set_mode("reset"), lambda: px.set_mode("pass")),
        "refuse": (lambda: px.set_mode("refuse"), lambda: px.set_mode("pass")),
        "sigstop": (stop, cont),
    }


def run_fault(srv, px, s, name, fault_s=FAULT_S, warm_s=0.0):
    """One fault under load (after warm_s seconds of it without a fault);
    returns the measurements."""
    start, end = faults(srv, px)[name]
    with Load(s) as load:
        # a backlog of unread batches: the readers keep loading from S3
        wait_for(lambda: load.hits >= 8 and len(load.unread) >= Load.RESERVE or load.errors,
                 timeout=30 * SLOW, what="the load to store and read back from S3")
        load.stop.wait(warm_s)
        a0 = l2_status(s)
        assert a0["circuit_breaker"]["state"] == "closed", a0["circuit_breaker"]
        opens0, loads0 = a0["circuit_breaker"]["opens"], a0["counters"]["load_ok"]
        assert loads0 > 0  # the reader's hits came from S3
        load.draining = True
        t_fault = time.time()
        start()
        b = wait_for(lambda: (lambda x: x if x["state"] != "closed" else None)(brk(s)),
                     timeout=4 * RT + 10 * SLOW, what="the breaker to open")
        t_open = time.time()
        # during the fault: what an operator sees
        a = l2_status(s)
        node = a["nodes"][0]
        assert node["role"] == "endpoint" and not node["up"], node
        assert node["state"] in ("down", "probing") and node["breaker"] in ("open", "half_open")
        assert node["last_error"] and node["last_error_unix"] > t_fault - 1, node
        assert node["downs"] == opens0 + 1 and node["down_seconds"] >= 0
        code, body = s.http_get("/healthz")
        assert code == 503 and "circuit open" in body, body
        assert metric(s, "kvtier_l2_node_up", role="endpoint") == 0
        assert metric(s, "kvtier_l2_node_breaker_open", role="endpoint") == 1
        wait_for(lambda: time.time() >= t_fault + fault_s, timeout=fault_s + 60 * SLOW,
                 what="the fault's end")
        opens_during = brk(s)["opens"] - opens0
        t_end = time.time()
        end()
        wait_for(lambda: brk(s)["state"] == "closed", timeout=20 + 10 * SLOW,
                 what="the breaker to close")
        t_closed = time.time()
        stored = wait_for(lambda: load.first_after("stored", t_end), timeout=20 * SLOW,
                          what="a store to land after the fault")
        hit = wait_for(lambda: load.first_after("hit", stored), timeout=20 * SLOW,
                       what="a read after the fault")
        loads1 = l2_status(s)["counters"]["load_ok"]
        wait_for(lambda: l2_status(s)["counters"]["load_ok"] > loads1 or load.errors,
                 timeout=20 * SLOW, what="a load from S3 after the fault")
        slow, slow_kind = load.slowest(t_fault, t_end)
    assert not load.errors, load.errors
    after = l2_status(s)
    node = after["nodes"][0]
    return {
        "fault": name, "detect_s": t_open - t_fault, "slowest_s": slow, "slowest": slow_kind,
        "recover_s": max(stored, t_closed) - t_end, "closed_s": t_closed - t_end,
        "opens": opens_during, "wrong": load.wrong, "hits": load.hits,
        "state": b["state"], "node": node, "after": after, "hit_after": hit - t_end,
    }


def check(s, m, opens0=0):
    """What every fault must show."""
    assert s.proc.poll() is None, "the server died:\n" + s.read_log()[-4000:]
    assert m["wrong"] == 0, m
    assert m["detect_s"] <= RT + MARGIN, m
    assert m["slowest_s"] <= RT + MARGIN, m
    assert m["opens"] == 1, m  # one opening per fault: no flapping
    node = m["node"]
    assert node["up"] and node["state"] == "up" and node["breaker"] == "closed", node
    assert node["last_error"] is None and node["down_seconds"] == 0, node
    assert node["downs"] == m["after"]["circuit_breaker"]["opens"]
    assert m["after"]["circuit_breaker"]["last_error"] is None
    assert metric(s, "kvtier_l2_node_up", role="endpoint") == 1
    assert metric(s, "kvtier_l2_node_downs_total", role="endpoint") == node["downs"]
    assert s.http_get("/healthz")[0] == 200
    log = s.read_log()
    # one line per state change, none per request or probe
    assert len(re.findall(r"circuit open after", log)) == node["downs"], log[-3000:]
    assert len(re.findall(r"circuit closed after", log)) == node["downs"], log[-3000:]


@pytest.mark.parametrize("name", ["hang", "500", "reset", "refuse", "sigstop"])
def test_fault_under_load(rig, name):
    """Each fault: detected within about one request_timeout, no client
    request waits longer, one breaker opening, no wrong byte, recovery by
    itself once the fault ends (hang: the SIGSEGV regression, a probe
    reused while in flight)."""
    srv, px, s = rig
    m = run_fault(srv, px, s, name)
    print("s3 %-8s detect %.2f s, slowest request %.2f s (%s), recover %.2f s, opens %d, "
          "hits %d, wrong %d" % (name, m["detect_s"], m["slowest_s"], m["slowest"],
                                 m["recover_s"], m["opens"], m["hits"], m["wrong"]))
    check(s, m)
    # recovery: the probe back-off in effect when the fault ended (it doubles
    # from 0.5 s per failed probe, about FAULT_S by then) plus a request
    assert m["recover_s"] <= FAULT_S + RT + 2 * MARGIN, m



@pytest.mark.parametrize("name", ["hang", "500"])
def test_azure_fault_under_load(make_server, tmp_path, name):
    """The Azure Blob dialect (nixl_store AZURE_BLOB) is the same engine: its
    breaker, probe (Get Container Properties) and deadline behave the same
    behind the proxy, here with that form's default timeouts (2 s: it has no
    timeout keys)."""
    from support import azurite
    if azurite.NODE is None:
        pytest.skip("node is not installed: no Azurite")
    azurite.ensure_modules()
    d = tmp_path / "azurite"
    d.mkdir()
    srv = azurite.Azurite(d).start()
    srv.create_container()
    px = FaultProxy(srv.port)
    try:
        spec = json.loads(azurite.azure_json(srv, account_key=azurite.KEY))
        spec["backend_params"]["account_url"] = "http://127.0.0.1:%d/%s" % (px.port, azurite.ACCOUNT)
        s = make_server(["--l1-size-gb", "0.02", "--l1-init-size-gb", "0.02",
                         "--l2-store-policy", "skip_l1", "--l2-adapter", json.dumps(spec)])
        s.wait_recovered()
        m = run_fault(srv, px, s, name)
        print("azure %-6s detect %.2f s, slowest request %.2f s (%s), recover %.2f s, opens %d, "
              "hits %d, wrong %d" % (name, m["detect_s"], m["slowest_s"], m["slowest"],
                                     m["recover_s"], m["opens"], m["hits"], m["wrong"]))
        assert m["after"]["api"] == "azure_blob"
        check(s, m)
        assert m["recover_s"] <= FAULT_S + RT + 2 * MARGIN, m
    finally:
        px.close()
        srv.kill()

def proxied(make_server, tmp_path, args=(), **kw):
    """versitygw, the proxy, and a kvtier server on the proxy (spec keys kw)."""
    srv = start_s3("versitygw", tmp_path)
    px = FaultProxy(srv.port)
    spec = json.loads(s3_json(srv, **kw))
    spec["s3_endpoint"] = "127.0.0.1:%d" % px.port
    s = make_server(list(args) + ["--l2-adapter", json.dumps(spec)])
    s.wait_recovered()
    return srv, px, s


def test_flush_waits_only_for_its_own_stores(make_server, tmp_path):
    """Client A's stores hang on the endpoint (the proxy holds the PUTs of
    A's model); client B stores after A and flushes: B's flush is answered
    once B's own stores landed, not after A's hang. A's flush is answered
    when its PUTs fail (no progress for request_timeout) and reports them."""
    rt = 4.0
    srv, px, s = proxied(make_server, tmp_path, ["--l2-store-policy", "skip_l1"],
                         request_timeout=rt, connection_timeout=rt)
    try:
        px.set_hang_if(lambda method, path: method == "PUT" and "slowmodel" in path)
        ka, kb = keys_for("slowmodel", 2), keys_for("fastmodel", 2)
        pa, pb = random_payloads(2, 32 * KiB, seed=1), random_payloads(2, 32 * KiB, seed=2)
        with s.client(timeout_ms=CLIENT_TIMEOUT_MS) as a, s.client(timeout_ms=CLIENT_TIMEOUT_MS) as b:
            t_a = time.time()
            assert a.store(ka, pa) == 2
            wait_for(lambda: px.stats["held"] >= 2, what="A's PUTs to reach the endpoint")
            assert b.store(kb, pb) == 2
            t0 = time.time()
            rb = b.flush()
            took_b = time.time() - t0
            assert not rb and took_b < rt / 4, (rb, took_b)
            assert l2_status(s)["counters"]["store_ok"] == 2
            ra = a.flush()
            took_a = time.time() - t_a
            assert ra.l2_failed == 2 and {f.error for f in ra.failed} == {"E_UNHEALTHY"}, ra
            assert rt - 0.5 <= took_a <= rt + MARGIN, took_a
        print("flush of B: %.3f s while A's stores hung; A's flush after %.2f s" % (took_b, took_a))
    finally:
        px.set_hang_if(None)
        px.close()
        srv.kill()


def test_budget_step_gives_up_within_request_timeout(make_server, tmp_path):
    """shared_budget: the record's conditional PUT hangs. The store that
    charges the record fails within about one request_timeout, retries
    included (the step re-reads the record after a lost answer: it stops
    once S3 stayed silent for request_timeout or the breaker opened)."""
    srv, px, s = proxied(make_server, tmp_path, ["--eviction-interval-ms", "10000"],
                         request_timeout=RT, connection_timeout=RT, max_capacity_gb=1,
                         shared_budget=True,
                         eviction={"eviction_policy": "LRU", "trigger_watermark": 0.9,
                                   "eviction_ratio": 0.1})
    try:
        px.set_hang_if(lambda method, path: method == "PUT" and ".kvtier-budget" in path)
        keys = keys_for("budget", 2)
        with s.client(timeout_ms=CLIENT_TIMEOUT_MS) as c:
            assert c.store(keys, random_payloads(2, 32 * KiB, seed=3)) == 2
            t0 = time.time()
            r = c.flush()
            took = time.time() - t0
        assert px.stats["held"] >= 1
        assert r.l2_failed == 2, r
        assert took <= RT + MARGIN, took
        assert s.proc.poll() is None
    finally:
        px.set_hang_if(None)
        px.close()
        srv.kill()


def test_slow_download_is_not_cut(make_server, tmp_path):
    """A load over a slow link: the answer arrives at 256 KiB/s, so a 1 MiB
    object takes about 4 s, four times request_timeout (1 s here). The
    deadline is on progress, not on the total: the load succeeds byte for
    byte and the breaker stays closed."""
    rt = 1.0
    srv, px, s = proxied(make_server, tmp_path, ["--l2-store-policy", "skip_l1"],
                         request_timeout=rt, connection_timeout=rt)
    try:
        keys = keys_for("slowlink", 1)
        pay = random_payloads(1, 1 << 20, seed=9)
        with s.client(timeout_ms=CLIENT_TIMEOUT_MS) as c:
            assert c.store(keys, pay) == 1
            assert not c.flush()
            px.set_mode("slow", rate=256 * KiB)
            t0 = time.time()
            assert c.lookup(keys) == 1  # loaded from S3 into L1 (skip_l1 left it only there)
            got = c.retrieve(keys)
            took = time.time() - t0
        assert [bytes(g) for g in got] == pay
        assert took >= 3 * rt, took  # the answer really was slow
        a = l2_status(s)
        assert a["circuit_breaker"]["opens"] == 0 and a["counters"]["load_ok"] == 1, a
        assert a["failed_requests"] == 0
    finally:
        px.close()
        srv.kill()


def test_delete_retries_stay_within_request_timeout(make_server, tmp_path):
    """A DELETE answered with a 500 after 1.2 s each time: the retries
    (after 50 and 200 ms) keep the first attempt's clock, so the delete gives
    up after about one request_timeout instead of three slow answers in a
    row. One key: its failures stay below the breaker's threshold."""
    srv, px, s = proxied(make_server, tmp_path, request_timeout=RT, connection_timeout=RT)
    try:
        keys = keys_for("del", 1)
        with s.client(timeout_ms=CLIENT_TIMEOUT_MS) as c:
            assert c.store(keys, random_payloads(1, 16 * KiB, seed=4)) == 1
            assert not c.flush()
            px.set_mode("500", delay=1.2)
            t0 = time.time()
            try:
                c.delete(keys)
            except kvtier.KvtierError:
                pass  # the tier could not delete: reported either way
            took = time.time() - t0
        assert px.stats["answered_500"] >= 1
        assert took <= RT + MARGIN, took
        assert s.proc.poll() is None
    finally:
        px.close()
        srv.kill()


def test_default_timeouts():
    """request_timeout and connection_timeout default to 2 s: a request to a
    hung endpoint fails well inside a 5 s client timeout (the nixl OBJ and
    AZURE_BLOB forms, which have no such keys, get the same: see
    test_azure_fault_under_load)."""
    from support.server import run_kvtier
    spec = {"type": "s3", "s3_endpoint": "127.0.0.1:9000", "s3_bucket": "kv",
            "s3_region": "us-east-1", "disable_tls": True, "aws_access_key_id": "a",
            "aws_secret_access_key": "b"}
    r = run_kvtier("server", "--dry-run", "--no-storage-check", "--l2-adapter", json.dumps(spec))
    assert r.returncode == 0, r.stderr
    a = json.loads(r.stdout)["l2_adapters"][0]
    assert (a["request_timeout"], a["connection_timeout"]) == (2.0, 2.0), a
