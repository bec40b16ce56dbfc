"""The Python client against the real server: its first contact (no
server, a URL without a scheme, a listener that never answers) and the
operator commands' (status) view of the same; both data paths (shared
memory and inline), --bind ipc:// and --no-shm; what retrieve() and
store() copy; a client outliving a server restart; the chunk hashes of
docs/protocol.md.

Copies are counted with tracemalloc, which sees every Python-owned buffer:
retrieve() must copy each object once into a buffer it reuses once the
previous results are dropped, and store() must not copy a read-only payload
in Python at all (the library copies it once, into the pool).
"""

import errno
import gc
import socket
import time
import tracemalloc

import pytest

import kvtier
from support.data import keys_for, random_payloads
from support.ports import free_port
from support.server import run_kvtier

MiB = 1 << 20


def peak_during(fn):
    """fn()'s result and the peak of Python-owned memory allocated during it."""
    gc.collect()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        r = fn()
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    return r, peak


# ------------------------------------------------------------ first contact


def test_client_without_server_says_so_at_once():
    url = "tcp://127.0.0.1:%d" % free_port()
    t0 = time.monotonic()
    with pytest.raises(kvtier.KvtierError) as e:
        kvtier.Client(url)  # default timeouts: the request timeout is 30 s
    took = time.monotonic() - t0
    assert e.value.code == -errno.ECONNREFUSED, e.value
    assert "no server at " + url in str(e.value) and "connection refused" in str(e.value)
    assert took < 2.0, "took %.1f s to say that nobody listens" % took


def test_client_ipc_without_socket_says_so(tmp_path):
    path = tmp_path / "none.sock"
    t0 = time.monotonic()
    with pytest.raises(kvtier.KvtierError) as e:
        kvtier.Client("ipc://%s" % path)
    assert time.monotonic() - t0 < 2.0
    assert e.value.code == -errno.ENOENT and "no server at ipc://" in str(e.value), e.value


@pytest.mark.parametrize("url", ["127.0.0.1:5555", "localhost", "http://127.0.0.1:5555",
                                 "tcp://127.0.0.1", "tcp://127.0.0.1:0", "ipc://"])
def test_client_url_without_scheme_names_the_format(url):
    with pytest.raises(kvtier.KvtierError) as e:
        kvtier.Client(url)
    assert e.value.code == -errno.EINVAL
    assert "tcp://host:port" in str(e.value) and "ipc:///path" in str(e.value), e.value


def test_silent_listener_fails_after_the_connect_timeout():
    """Something accepts TCP connections but never speaks: E_TIMEOUT after
    connect_timeout_ms, not after the 30 s request timeout."""
    with socket.socket() as ls:
        ls.bind(("127.0.0.1", 0))
        ls.listen(16)
        url = "tcp://127.0.0.1:%d" % ls.getsockname()[1]
        t0 = time.monotonic()
        with pytest.raises(kvtier.KvtierError) as e:
            kvtier.Client(url, connect_timeout_ms=300)
        took = time.monotonic() - t0
    assert e.value.name == "E_TIMEOUT" and "no answer to hello, within 300 ms" in str(e.value)
    assert 0.25 < took < 5.0, took


def test_connect_timeout_leaves_the_request_timeout_alone(server):
    with server.client(connect_timeout_ms=100, timeout_ms=20000) as c:
        c.ping()
        assert c.status()["l1"]["capacity_bytes"] > 0


def test_status_without_server_says_so_at_once():
    url = "tcp://127.0.0.1:%d" % free_port()
    t0 = time.monotonic()
    r = run_kvtier("status", "--url", url)
    took = time.monotonic() - t0
    assert r.returncode == 1 and "connection refused" in r.stderr and url in r.stderr, r.stderr
    assert took < 2.0, "took %.1f s" % took


def test_status_url_without_scheme_is_a_usage_error():
    r = run_kvtier("status", "--url", "127.0.0.1:5555")
    assert r.returncode == 2, r.stderr
    assert "--url" in r.stderr and "tcp://host:port" in r.stderr, r.stderr


def test_status_config_with_missing_root_says_so(tmp_path):
    root = tmp_path / "not-yet"
    env = tmp_path / "cache.env"
    env.write_text("KVP_CACHE_ROOT=%s\nKVP_SERVER_URL=tcp://127.0.0.1:%d\n" % (root, free_port()))
    r = run_kvtier("status", "--config", str(env))
    assert r.returncode != 0 and not root.exists()
    assert "does not exist yet" in r.stderr and str(root) in r.stderr, r.stderr
    # a server would not create a root whose parent is missing: not "creates it"
    deep = tmp_path / "no-parent" / "cache"
    env.write_text("KVP_CACHE_ROOT=%s\n" % deep)
    r = run_kvtier("status", "--config", str(env))
    assert r.returncode == 2 and not deep.parent.exists()
    assert "nor does its parent" in r.stderr and "creates it" not in r.stderr, r.stderr


# ---------------------------------------------------------------- copies


@pytest.mark.parametrize("shm", [True, False])
def test_retrieve_copies_once_into_a_reused_buffer(server, shm):
    keys = keys_for("reuse", 8, seed=1)
    pay = random_payloads(8, 4 * MiB + 3, seed=1)
    with server.client(shm=shm) as c:
        assert c.shm_active == shm
        assert c.store(keys, pay) == 8
        first = c.retrieve(keys)
        assert first == pay and all(isinstance(x, memoryview) and x.readonly for x in first)
        del first
        # the first call's buffer is idle now: the second one allocates
        # nothing big (before: two 32 MiB copies, one of them in Python)
        got, peak = peak_during(lambda: c.retrieve(keys))
        assert got == pay
        assert peak < MiB, "retrieve allocated %d bytes in Python" % peak


def test_retrieve_never_reuses_a_buffer_still_held(server):
    ka, kb = keys_for("held", 6, seed=2), keys_for("held", 6, seed=3)
    pa, pb = random_payloads(6, 2 * MiB, seed=2), random_payloads(6, 2 * MiB, seed=3)
    with server.client() as c:
        assert c.store(ka, pa) == 6 and c.store(kb, pb) == 6
        a = c.retrieve(ka)
        one = a[3]  # a single view keeps its call's buffer
        del a
        for _ in range(4):
            b = c.retrieve(kb)
            assert b == pb
        assert one == pa[3]
        x = bytes(one)
        assert x == pa[3] and isinstance(x, bytes)
        m = c.retrieve(ka, with_meta=True)
        assert [g[0] for g in m] == pa and m[0][1] == "raw" and m[0][2] == ()
    assert one == pa[3] and b == pb  # results outlive the client


def test_retrieve_meta_and_empty_objects(server):
    keys = keys_for("meta", 4, seed=4)
    pay = [b"", b"x", bytes(range(256)) * 4097, b""]
    with server.client() as c:
        assert c.store(keys, pay, dtype="float16", shape=[2, 3]) == 4
        got = c.retrieve(keys, with_meta=True)
    assert [g[0] for g in got] == pay
    assert all(g[1] == "float16" and g[2] == (2, 3) for g in got)


@pytest.mark.parametrize("shm", [True, False])
def test_store_does_not_copy_a_readonly_payload(server, shm):
    keys = keys_for("ro", 4, seed=5)
    pay = random_payloads(4, 8 * MiB, seed=5)
    views = [memoryview(p).toreadonly() for p in pay]
    with server.client(shm=shm) as c:
        acc, peak = peak_during(lambda: c.store(keys, views))
        assert acc == 4
        assert peak < MiB, "store copied %d bytes in Python" % peak
        assert c.retrieve(keys) == pay
        # writable and multi-byte buffers too, without a copy
        import array
        arr = array.array("d", range(1 << 18))
        k2 = keys_for("ro", 1, seed=6)
        acc, peak = peak_during(lambda: c.store(k2, [arr]))
        assert acc == 1 and peak < MiB
        assert c.retrieve(k2) == [arr.tobytes()]
        with pytest.raises(ValueError):
            c.store(keys_for("ro", 1, seed=7), [memoryview(pay[0])[::2]])


@pytest.mark.parametrize("shm", [True, False])
def test_client_survives_server_restart(server, shm):
    keys = keys_for("restart", 6, seed=8)
    pay = random_payloads(6, MiB + 17, seed=8)
    c = server.client(shm=shm)
    try:
        assert c.store(keys, pay) == 6
        c.flush()
        held = c.retrieve(keys)
        server.restart()
        server.wait_recovered()
        assert c.lookup(keys) == 6
        assert c.retrieve(keys) == pay
        assert c.shm_active == shm
        k2 = keys_for("restart", 3, seed=9)
        p2 = random_payloads(3, 3 * MiB, seed=9)
        assert c.store(k2, p2) == 3 and c.retrieve(k2) == p2
        assert held == pay
    finally:
        c.close()


@pytest.mark.parametrize("shm", [True, False])
def test_store_retrieve_paths(server, shm):
    keys = keys_for("paths", 8)
    pay = random_payloads(8, 300000, seed=2)
    with server.client(shm=shm) as c:
        assert c.shm_active == shm
        assert c.store(keys, pay, dtype="float16", shape=[2, 75000]) == 8
        got = c.retrieve(keys, with_meta=True)
        assert [g[0] for g in got] == pay
        assert got[0][1] == "float16" and got[0][2] == (2, 75000)
        # the prefix only: a key never stored ends it
        other = keys_for("paths", 9)
        assert c.lookup(other) == 8


def test_bind_ipc(make_server, tmp_path):
    """docs/protocol.md: --bind ipc:///path works too."""
    path = tmp_path / "kvtier.ipc"
    s = make_server(["--bind", "ipc://%s" % path, "--no-l2"], start=False)
    s.url = "ipc://%s" % path
    s.start()
    keys = keys_for("ipc", 3)
    pay = random_payloads(3, 50000)
    with s.client(local=False) as c:
        assert c.store(keys, pay) == 3
        assert c.retrieve(keys) == pay
    assert path.exists()


def test_no_shm(make_server):
    """docs/protocol.md: with --no-shm the hello reply offers no pool: the
    client moves payloads inline and zero-copy views are refused."""
    s = make_server(["--no-shm", "--no-l2"])
    keys = keys_for("noshm", 3)
    pay = random_payloads(3, 50000)
    with s.client() as c:
        assert not c.shm_active
        assert c.store(keys, pay) == 3
        assert c.retrieve(keys) == pay
        with pytest.raises(kvtier.KvtierError) as e:
            c.retrieve_view(keys)
        assert e.value.name == "E_UNSUPPORTED"


def test_chunk_hash_vectors_match_docs():
    h = kvtier.chunk_hashes(list(range(512)), 256)
    assert h[0].hex() == "1d15876629a5821c35b4cd7de3514b5952e718a9e87f75aa41a781ebadb5abc9"
    assert h[1].hex() == "71354a739e18d56ecd771e486a3bfecccb25b6022ed5bb60ef2683482aaeeaa6"
    assert [x.hex() for x in kvtier.chunk_hashes([1, 2, 3, 4, 5], 2)] == [
        "dd433990c6daf93f596b060bd811a834197e36e952f26b41f0bc6b12b0dd819c",
        "10b1ad57104e9b1cc3e7f6c5e3b97b1b11bbb4f9e0c813265d8de233640caea6"]
    k = kvtier.chunk_keys("m", list(range(1000)), chunk_size=256, kv_rank=kvtier.kv_rank(2, 1, 2, 1), salt="t")
    assert len(k) == 3 and k.kv_rank == 0x02010201 and len(k[:2]) == 2
