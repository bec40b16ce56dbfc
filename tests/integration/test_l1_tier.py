"""L1 shared-memory tier, zero-copy path, controllers, policies, eviction and
observability, against the real binary."""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

import kvtier
from support.data import adapter_json, fs_files, keys_for, random_payloads
from support.paths import ROOT
from support.server import run_kvtier, wait_for

MiB = 1 << 20


def wait_until(pred, timeout=10.0, step=0.05):
    end = time.time() + timeout
    while time.time() < end:
        v = pred()
        if v:
            return v
        time.sleep(step)
    return pred()


def test_zero_copy_256_x_4mib(make_server, tmp_path):
    """256 x 4 MiB written straight into the pool and read straight out of it."""
    s = make_server(["--l1-size-gb", "1.5", "--l1-init-size-gb", "0.25", "--no-l2"])
    keys = keys_for("zc", 256)
    digests = []
    with s.client() as c:
        assert c.shm_active
        for b in range(0, 256, 32):
            batch = keys[b:b + 32]
            with c.store_view(batch, [4 * MiB] * 32, dtype="bfloat16") as views:
                for v in views:
                    data = os.urandom(4 * MiB)
                    v[:] = data
                    digests.append(hashlib.sha256(data).digest())
        assert c.lookup(keys) == 256
        got = []
        for b in range(0, 256, 64):
            rv = c.retrieve_view(keys[b:b + 64])
            with rv as views:
                assert len(views) == 64 and all(v.readonly for v in views)
                got += [hashlib.sha256(v).digest() for v in views]
            assert rv.metas[0][0] == "bfloat16"
        assert got == digests
        l1 = c.status()["l1"]
        assert l1["objects"] == 256 and l1["read_leases"] == 0 and l1["write_leases"] == 0


def test_numpy_like_buffers_round_trip(server):
    """memoryview-compatible payloads (array, bytearray) go in without a copy."""
    from array import array
    a = array("H", range(30000))
    b = bytearray(os.urandom(60000))
    keys = keys_for("bufs", 2)
    with server.client() as c:
        assert c.store(keys, [a, memoryview(b)], dtype="float16") == 2
        assert c.retrieve(keys) == [a.tobytes(), bytes(b)]


def test_killed_client_between_prepare_and_commit_leaks_nothing(make_server):
    s = make_server(["--l1-write-ttl-seconds", "1", "--l1-read-ttl-seconds", "1",
                     "--eviction-interval-ms", "100", "--no-l2"])
    code = (
        "import sys, os, signal; sys.path.insert(0, %r)\n"
        "import kvtier\n"
        "c = kvtier.Client(%r)\n"
        "keys = kvtier.chunk_keys('dead', list(range(8 * 16)), chunk_size=16)\n"
        "v = c.store_view(keys, [MiB] * 8)\n"
        "with open(%r, 'w') as f: f.write('prepared')\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    ) % (os.path.join(ROOT, "python"), s.url, os.path.join(s.workdir, "prepared"))
    code = code.replace("MiB", str(MiB))
    p = subprocess.run([sys.executable, "-c", code], env=dict(os.environ))
    assert p.returncode == -signal.SIGKILL
    with s.client() as c:
        l1 = c.status()["l1"]
        assert l1["write_leases"] == 1 and l1["objects_writing"] == 8
        assert l1["used_bytes"] == 8 * MiB
        # the reservation expires (1 s), is quarantined for one TTL, then freed
        wait_for(lambda: c.status()["l1"]["counters"]["leases_expired_write"] == 1,
                 what="the write lease to expire")
        wait_for(lambda: c.status()["l1"]["used_bytes"] == 0, what="the reservation to be freed")
        l1 = c.status()["l1"]
        assert l1["write_leases"] == 0 and l1["objects_writing"] == 0
        assert l1["counters"]["leases_expired_write"] == 1
        # the keys were never published
        assert c.lookup(kvtier.chunk_keys("dead", list(range(8 * 16)), chunk_size=16)) == 0


def test_expired_read_lease_fails_the_reader(make_server):
    s = make_server(["--l1-read-ttl-seconds", "0.3", "--eviction-interval-ms", "50", "--no-l2"])
    keys = keys_for("slow", 2)
    with s.client() as c:
        c.store(keys, random_payloads(2, 10000))
        rv = c.retrieve_view(keys)
        # the reader is too slow: its lease runs out (0.3 s) before it ends
        with s.client() as c2:
            wait_for(lambda: c2.status()["l1"]["counters"]["leases_expired_read"] == 1,
                     what="the read lease to expire")
        with pytest.raises(kvtier.KvtierError) as e:
            with rv as views:
                assert len(views) == 2
        assert e.value.name == "E_EXPIRED"
        assert c.retrieve(keys) == random_payloads(2, 10000)


def test_l1_eviction_under_load_larger_than_l1(make_server, tmp_path):
    d = tmp_path / "l2"
    s = make_server(["--l1-size-gb", str(64 / 1024), "--l1-init-size-gb", str(64 / 1024),
                     "--eviction-interval-ms", "100",
                     "--l2-adapter", adapter_json(type="fs", base_path=str(d))])
    keys = keys_for("evict", 200)
    pay = random_payloads(200, MiB, seed=9)
    peak = 0.0
    with s.client() as c:
        for b in range(0, 200, 8):
            assert c.store(keys[b:b + 8], pay[b:b + 8]) == 8
            c.flush()
            frac = wait_until(lambda: (lambda f: f if f <= 0.8 else None)(
                c.status()["l1"]["usage_fraction"]), timeout=5)
            assert frac is not None, c.status()["l1"]
            peak = max(peak, frac)
        l1 = c.status()["l1"]
        # L1 is filled up to the trigger watermark (0.8) and an eviction pass
        # frees its ratio (0.2), not everything (measured peak: 0.797)
        assert 0.7 <= peak <= 0.8, peak
        assert l1["usage_fraction"] >= 0.5, l1
        assert l1["counters"]["evictions"] > 100
        # the default follows LRU until another order earns credit: with no
        # key used twice, none does
        assert l1["eviction_policy"] == "adaptive" and l1["eviction_following"] == "LRU", l1
        assert l1["used_bytes"] <= l1["capacity_bytes"]
        # the oldest keys left L1 but are served from L2, byte-exact
        assert c.lookup(keys[:20]) == 20
        assert c.retrieve(keys[:20]) == pay[:20]
        assert c.status()["l2"][0]["counters"]["load_ok"] >= 20
    assert len(fs_files(d)) == 200


def test_skip_l1_buffer_only_mode(make_server, tmp_path):
    d = tmp_path / "l2"
    s = make_server(["--l2-store-policy", "skip_l1", "--eviction-policy", "noop",
                     "--l2-adapter", adapter_json(type="fs", base_path=str(d))])
    keys = keys_for("skip", 16)
    pay = random_payloads(16, 100000, seed=3)
    with s.client() as c:
        assert c.store(keys, pay) == 16
        c.flush()
        l1 = c.status()["l1"]
        assert l1["objects"] == 0 and l1["used_bytes"] == 0
        assert c.lookup(keys) == 16
        assert c.retrieve(keys) == pay
        st = c.status()
        assert st["l2"][0]["counters"]["lookup_hits"] >= 16
        assert st["l2"][0]["counters"]["load_ok"] >= 16
        # default prefetch: temporary objects are gone after the reader
        assert wait_until(lambda: c.status()["l1"]["objects"] == 0)


@pytest.mark.parametrize("policy,kept", [("default", 0), ("retain", 12)])
def test_prefetch_policies(make_server, tmp_path, policy, kept):
    d = tmp_path / "l2"
    s = make_server(["--l2-prefetch-policy", policy, "--l2-store-policy", "skip_l1",
                     "--l2-adapter", adapter_json(type="fs", base_path=str(d))])
    keys = keys_for("pf", 12)
    pay = random_payloads(12, 50000, seed=4)
    with s.client() as c:
        c.store(keys, pay)
        c.flush()
        assert c.status()["l1"]["objects"] == 0
        assert c.lookup(keys) == 12
        assert c.retrieve(keys) == pay
        assert wait_until(lambda: c.status()["l1"]["objects"] == kept), c.status()["l1"]
        if policy == "retain":
            before = c.status()["l2"][0]["counters"]["load_ok"]
            assert c.retrieve(keys) == pay  # now served from L1
            assert c.status()["l2"][0]["counters"]["load_ok"] == before


def test_lookup_without_retrieve_releases_locks(make_server, tmp_path):
    s = make_server(["--l2-store-policy", "skip_l1",
                     "--l2-adapter", adapter_json(type="fs", base_path=str(tmp_path / "l2"))])
    keys = keys_for("locks", 4)
    with s.client() as c:
        c.store(keys, random_payloads(4, 1000))
        c.flush()
        assert c.lookup(keys) == 4
        assert c.status()["l1"]["read_leases"] == 1
        c.free_locks()
        assert wait_until(lambda: c.status()["l1"]["read_leases"] == 0)
        assert wait_until(lambda: c.status()["l1"]["objects"] == 0)  # temporary objects freed


def test_two_adapters_cascade(make_server, tmp_path):
    d1, d2 = tmp_path / "a", tmp_path / "b"
    args = ["--l2-adapter", adapter_json(type="fs", base_path=str(d1)),
            "--l2-adapter", adapter_json(type="fs", base_path=str(d2))]
    s = make_server(args)
    keys = keys_for("cascade", 10)
    pay = random_payloads(10, 70000, seed=6)
    with s.client() as c:
        c.store(keys, pay)
        c.flush()
        st = c.status()
        assert st["l2"][0]["objects"] == 10 and st["l2"][1]["objects"] == 10
    assert len(fs_files(d1)) == 10 and len(fs_files(d2)) == 10
    # adapter 0 loses its data: loads come from adapter 1
    s.kill()
    shutil.rmtree(d1)
    s.start()
    s.wait_recovered()
    with s.client() as c:
        assert c.lookup(keys) == 10
        assert c.retrieve(keys) == pay
        st = c.status()
        assert st["l2"][0]["counters"]["load_ok"] == 0
        assert st["l2"][1]["counters"]["load_ok"] == 10
    # a store goes to both again (adapter 1 already holds it and skips it)
    s.restart()
    s.wait_recovered()
    with s.client() as c:
        assert c.store(keys[:1], pay[:1]) == 1
        c.flush()
        st = c.status()
        assert st["l2"][0]["objects"] == 1 and st["l2"][1]["objects"] == 10, st["l2"]
        assert st["l2"][1]["counters"]["store_ok"] == 0
    assert len(fs_files(d1)) == 1
    # and with both holding it, the first adapter serves
    s.restart()
    s.wait_recovered()
    with s.client() as c:
        assert c.retrieve(keys) == pay
        st = c.status()
        assert st["l2"][0]["counters"]["load_ok"] == 1
        assert st["l2"][1]["counters"]["load_ok"] == 9


def test_http_endpoints_reflect_operations(server, tmp_path):
    keys = keys_for("http", 5)
    with server.client(shm=False) as c:  # the inline ops: store, retrieve
        c.store(keys, random_payloads(5, 4096))
        c.flush()
        assert c.lookup(keys) == 5
        c.retrieve(keys)
    code, body = server.http_get("/healthz")
    assert code == 200 and body.strip() == "ok"
    code, body = server.http_get("/status")
    st = json.loads(body)
    assert code == 200 and st["l1"]["objects"] == 5 and st["l2"][0]["objects"] == 5
    assert st["rpc"]["ops"]["store"]["count"] == 1
    code, m = server.http_get("/metrics")
    assert code == 200
    assert 'kvtier_rpc_requests_total{op="store"} 1' in m
    assert 'kvtier_rpc_requests_total{op="lookup"} 1' in m
    assert 'kvtier_hits_total{tier="l1"} ' in m
    assert 'kvtier_objects{tier="l2",adapter="fs[0]"} 5' in m
    assert 'kvtier_rpc_latency_seconds_bucket{op="store",le="+Inf"} 1' in m
    assert "kvtier_l2_corrupt_objects_total" in m and "kvtier_l1_fragmentation" in m
    code, _ = server.http_get("/nope")
    assert code == 404
    # the data directory disappears: unhealthy, naming the part
    shutil.rmtree(tmp_path / "data")
    code, body = server.http_get("/healthz")
    assert code == 503 and "fs[0]" in body
    with server.client() as c:
        h = c.status()["health"]
        assert h["is_healthy"] is False and "fs[0]" in h["detail"]


def test_status_command(server):
    with server.client() as c:
        c.store(keys_for("st", 3), random_payloads(3, 1000))
        c.flush()
    r = run_kvtier("status", "--url", server.url)
    assert r.returncode == 0, r.stderr
    assert "L1" in r.stdout and "fs[0]" in r.stdout and "healthy" in r.stdout
    r = run_kvtier("status", "--url", server.url, "--json")
    st = json.loads(r.stdout)
    assert st["l2"][0]["objects"] == 3
    r = run_kvtier("status", "--url", "tcp://127.0.0.1:1")
    assert r.returncode == 1 and "cannot reach" in r.stderr


@pytest.mark.parametrize("shm,local", [(True, True), (True, False), (False, True), (False, False)])
def test_client_survives_server_restart(server, shm, local):
    """A long-lived client keeps working across a server restart: its mapping
    of the old pool is never used for the new server's offsets (that would
    move wrong bytes); it maps the new pool and carries on. Over the same-host
    socket the broken connection makes the client say hello (and remap)
    first; over ZeroMQ the socket reconnects silently, so the first
    zero-copy request meets the new pool's id and remaps there."""
    keys = keys_for("restart", 6)
    pay = random_payloads(6, 40000, seed=21)
    with server.client(shm=shm, local=local) as c:
        assert c.shm_active == shm
        assert c.store(keys[:3], pay[:3]) == 3
        c.flush()
        assert c.lookup(keys[:3]) == 3  # holds a lease of the old instance
        server.kill()
        server.start()
        server.wait_recovered()
        assert c.store(keys[3:], pay[3:]) == 3
        assert c.retrieve(keys) == pay
        with c.retrieve_view(keys) if shm else open(os.devnull) as views:
            if shm:
                assert [bytes(v) for v in views] == pay
        assert c.shm_active == shm


def test_request_in_flight_at_a_kill_fails_fast_and_reconnects(server):
    """A same-host client whose server dies under a request falls back to
    ZeroMQ and says hello there. Its ZeroMQ connection to the dead server may
    not have noticed the death yet: a hello written into it is lost, and the
    client used to wait its whole timeout (30 s by default) for a server that
    was back within a second. The fallback goes over a fresh connection."""
    import threading
    for _ in range(6):
        done = threading.Event()
        errors = []

        def pinger():
            with server.client(timeout_ms=20000) as c:
                assert c.local_active
                try:
                    while not done.is_set():
                        c.ping()  # the one in flight at the kill ends on the new server
                except kvtier.KvtierError as e:
                    errors.append(e)

        t = threading.Thread(target=pinger)
        t.start()
        time.sleep(0.05)
        server.kill()
        done.set()
        server.start()
        t0 = time.time()
        t.join(timeout=60)
        assert not t.is_alive() and not errors, errors
        assert time.time() - t0 < 3, "a request waited %.1f s for a restarted server" % (time.time() - t0)


def test_local_socket_oversize_payload_is_an_error(make_server):
    """A payload over the server's limit is refused with an error over the
    same-host socket too (the server would have to drop the connection),
    and the client keeps working."""
    s = make_server(["--max-object-mb", "1"])
    keys = keys_for("oversize", 2)
    with s.client(local=True, shm=False) as c:
        assert c.local_active
        with pytest.raises(kvtier.KvtierError, match="limit"):
            c.store(keys[:1], [bytes(2 << 20)])
        assert c.local_active
        assert c.store(keys[1:], [b"ok"]) == 1
    # the client refused that one itself: the server's own check, raw (a
    # frame over the object limit but within the frame limit is answered)
    pytest.importorskip("zmq")
    from support.rawproto import RawLocal, keys_body, local_name
    loc = RawLocal(local_name(s))
    try:
        r = loc.call([b"big", b"store", keys_body(keys[:1]), bytes(2 << 20)])
        assert r.rid == b"big" and r.status == -1005 and r.body["error"] == "E_TOOBIG", r
        assert loc.call([b"p", b"ping", b"\x80"]).status == 0
    finally:
        loc.close()


def test_local_socket_server_gone_is_an_error_not_sigpipe(make_server):
    """A client whose server died gets an error on its next request, not a
    SIGPIPE that kills the process (the child restores SIGPIPE's default
    action, as a C program has it)."""
    s = make_server()
    code = ("import signal, sys, kvtier\n"
            "signal.signal(signal.SIGPIPE, signal.SIG_DFL)\n"
            "c = kvtier.Client(sys.argv[1], local=True, shm=False, timeout_ms=3000)\n"
            "assert c.local_active\n"
            "print('ready', flush=True)\n"
            "sys.stdin.readline()\n"
            "try:\n"
            "    c.store(kvtier.chunk_keys('m', list(range(256)), chunk_size=256), [bytes(1 << 20)])\n"
            "    print('stored')\n"
            "except kvtier.KvtierError as e:\n"
            "    print('error', e)\n")
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    p = subprocess.Popen([sys.executable, "-c", code, s.url], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, env=env)
    assert p.stdout.readline().strip() == "ready"
    s.kill()
    out, _ = p.communicate("go\n", timeout=60)
    assert p.returncode == 0, (p.returncode, out)  # -13 would be SIGPIPE
    assert out.startswith("error"), out


@pytest.mark.parametrize("local", [True, False])
def test_same_host_socket_and_fallback(server, local):
    """Requests use the same-host socket when offered and wanted; every
    operation behaves the same over it and over ZeroMQ."""
    keys = keys_for("lsock", 5)
    pay = random_payloads(5, 3000, seed=31)
    with server.client(local=local, shm=False) as c:
        assert c.local_active == local
        assert c.store(keys, pay) == 5
        c.flush()
        assert c.lookup(keys) == 5
        assert c.retrieve(keys) == pay
        st = c.status()
        assert (st["rpc"]["local_connections"] >= 1) == local
        with pytest.raises(kvtier.KvtierError):
            c.store(keys_for("bad/../x", 1), [b"x"])
        c.ping()


def test_hugepages_refused_cleanly_when_none_are_reserved(tmp_path):
    """--l1-use-hugepages without reserved huge pages: a clear error at
    start-up, never a SIGBUS later."""
    from support.paths import BIN
    with open("/proc/sys/vm/nr_hugepages") as f:
        if int(f.read()) > 0:
            pytest.skip("huge pages are reserved on this machine")
    r = subprocess.run([BIN, "server", "--l1-use-hugepages", "--no-l2", "--port", "1",
                        "--http-port", "0"], capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "vm.nr_hugepages" in r.stderr


def test_prefetch_max_in_flight(make_server, tmp_path):
    """--l2-prefetch-max-in-flight N: at most N prefetch requests run at once,
    the others wait in a FIFO; all of them are answered, byte-exact."""
    d = tmp_path / "pf"
    s = make_server(["--l2-store-policy", "skip_l1", "--l2-prefetch-max-in-flight", "1",
                     "--l2-adapter", adapter_json(type="mock", max_size_gb=1, mock_bandwidth_gb=0.02)])
    keys = [keys_for("pf", 4, seed=i) for i in range(6)]
    pays = [random_payloads(4, MiB, seed=i) for i in range(6)]
    with s.client() as c:
        for k, p in zip(keys, pays):
            assert c.store(k, p) == 4
        c.flush()
    errors, got = [], {}

    def reader(i):
        try:
            with s.client() as c:
                got[i] = c.retrieve(keys[i])
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    ts = [threading.Thread(target=reader, args=(i,)) for i in range(6)]
    for t in ts:
        t.start()
    peak = 0
    while any(t.is_alive() for t in ts):
        with s.client() as c:
            pf = c.status()["prefetch"]
        peak = max(peak, pf["in_flight"])
        time.sleep(0.005)
    for t in ts:
        t.join()
    assert not errors, errors
    assert all(got[i] == pays[i] for i in range(6))
    assert peak == 1, peak
