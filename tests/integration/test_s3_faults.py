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
import signal
import time

import pytest

import kvtier
from support.data import keys_for, random_payloads
from support.faultproxy import FaultProxy
from support.s3_servers import s3_json, start_s3
from support.s3_faults import CLIENT_TIMEOUT_MS, FAULT_S, MARGIN, RT, KiB, check, run_fault
from support.server import l2_status, wait_for

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
