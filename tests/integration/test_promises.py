"""What the docs promise and no other test exercised: durable stores synced
before their acknowledgement, the LRU order restored at start-up, bytes per
cache salt, purge of busy objects, relative_tmp_dir, --bind ipc://,
--no-shm and --l2-prefetch-max-in-flight."""

import os
import threading
import time

import pytest

import kvtier
from support.data import adapter_json, du_bytes, fs_files, keys_for, random_payloads
from support.faultio import FAULTIO, needs_faultio
from support.server import l2_status, run_kvtier, wait_for

MiB = 1 << 20


def sync_lines(log):
    try:
        with open(log) as f:
            return [ln.split(" ", 1) for ln in f.read().splitlines()]
    except FileNotFoundError:
        return []


@needs_faultio
@pytest.mark.parametrize("durable", [True, False])
def test_durable_syncs_before_the_acknowledgement(make_server, tmp_path, durable):
    """docs/adapters.md: durable fdatasyncs the file and fsyncs its directory
    before acknowledging. Every sync of the disk takes 200 ms here (faultio),
    and the log of syncs is read the moment flush() returns: a store
    acknowledged before its syncs had finished would show."""
    d = tmp_path / "dur"
    d.mkdir()
    log = tmp_path / "sync.log"
    env = {"LD_PRELOAD": FAULTIO, "KVT_FAULTIO": "dir=%s,delay_ms=200,synclog=%s" % (d, log)}
    s = make_server(["--l2-store-policy", "skip_l1",
                     "--l2-adapter", adapter_json(type="fs", base_path=str(d), durable=durable)], env=env)
    keys = keys_for("durable", 3)
    pay = random_payloads(3, 10000)
    for i in range(3):
        with s.client() as c:
            assert c.store(keys[i:i + 1], pay[i:i + 1]) == 1
            t0 = time.time()
            c.flush()
            took = time.time() - t0
        lines = sync_lines(log)
        data = [p for what, p in lines if what == "fdatasync"]
        dirs = [p for what, p in lines if what == "fsync" and p == str(d)]
        if durable:
            assert len(data) == i + 1 and len(dirs) == i + 1, lines
            assert took >= 0.4  # both syncs were waited for
        else:
            assert lines == []
    assert len(fs_files(d)) == 3
    with s.client() as c:
        assert c.retrieve(keys) == pay


def test_lru_order_restored_at_start_up(make_server, tmp_path):
    """docs/adapters.md: recovered objects enter the LRU at the cold end, in
    mtime order. After a restart the objects with the oldest files go first,
    and nothing stored after the restart goes before a recovered object."""
    d = tmp_path / "lru"
    size = 60000
    spec = adapter_json(type="fs", base_path=str(d), max_capacity_gb=20.5 * (size + 512) / 2**30,
                        eviction={"eviction_policy": "LRU", "trigger_watermark": 0.8,
                                  "eviction_ratio": 0.2})
    s = make_server(["--l2-store-policy", "skip_l1", "--eviction-interval-ms", "50",
                     "--l2-adapter", spec])
    with s.client() as c:
        for i in range(10):  # one at a time: store order is known
            c.store(keys_for("old", 1, seed=i), random_payloads(1, size, seed=i))
            c.flush()
    s.kill()
    # file ages unrelated to the store order: oldest first = this order
    files = fs_files(d)
    order = files[3:] + files[:3]
    order = order[::2] + order[1::2]
    now = time.time()
    for age, f in enumerate(order):
        os.utime(d / f, (now - 10000 + age * 100, now - 10000 + age * 100))
    s.start()
    s.wait_recovered()
    with s.client() as c:
        for i in range(10):
            c.store(keys_for("new", 1, seed=100 + i), random_payloads(1, size, seed=100 + i))
            c.flush()
    # an eviction pass, ended: its accounting agrees with the files
    wait_for(lambda: (lambda a: a["counters"]["evictions"] > 0 and
                      a["used_bytes"] == du_bytes(d))(l2_status(s)),
             what="an eviction pass, and used_bytes equal to the files' bytes")
    left = set(fs_files(d))
    evicted = [f for f in order if f not in left]
    assert evicted, left
    # exactly the oldest recovered files, in age order, and no new one
    assert evicted == order[:len(evicted)], (evicted, order)
    new = set(fs_files(d)) - set(order)
    assert len(new) == 10


def test_bytes_by_cache_salt(make_server, tmp_path):
    """docs/adapters.md: accounting per namespace and per cache salt, in
    status and restored after a restart."""
    d = tmp_path / "salt"
    s = make_server(["--l2-store-policy", "skip_l1",
                     "--l2-adapter", adapter_json(type="fs", base_path=str(d))])
    with s.client() as c:
        c.store(keys_for("m", 3, salt="alice"), random_payloads(3, 10000, seed=1))
        c.store(keys_for("m", 2, seed=5, salt="bob"), random_payloads(2, 30000, seed=2))
        c.store(keys_for("m", 1, seed=7), random_payloads(1, 5000, seed=3))
        c.flush()
        a = c.status()["l2"][0]
    per = a["bytes_by_cache_salt"]
    assert set(per) == {"alice", "bob", ""}, per
    assert per["bob"] > per["alice"] > per[""] > 0
    assert sum(per.values()) == a["used_bytes"]
    s.kill()
    s.start()
    b = s.wait_recovered()["l2"][0]
    assert b["bytes_by_cache_salt"] == per


@needs_faultio
def test_purge_leaves_busy_objects_and_reports_them(make_server, tmp_path):
    """docs/operations.md: a purge of a busy object (one being loaded: pinned;
    one being written: in_flight) leaves it in place and reports it; the
    others go. A later purge takes what is no longer busy. Every read and
    write of the disk takes 300 ms here (faultio), so both are busy when the
    purge comes."""
    import json
    from test_ops import bin_files, config_server
    root = tmp_path / "kv"
    root.mkdir()
    s, cfg = config_server(make_server, tmp_path, root, CACHE_BUDGET_GB=1, start=False,
                           extra=["--l2-store-policy", "skip_l1", "--eviction-policy", "noop"])
    s.env = {"LD_PRELOAD": FAULTIO, "KVT_FAULTIO": "dir=%s,delay_ms=300" % root}
    s.start()
    keys = keys_for("busy", 4)
    pay = random_payloads(4, 10000)
    with s.client() as c:
        c.store(keys, pay)
        c.flush()
    got = []
    t = threading.Thread(target=lambda: got.append(s.client().retrieve(keys[:1])))
    t.start()
    with s.client() as c:
        wait_for(lambda: c.status()["prefetch"]["in_flight"] >= 1, what="the load to start")
        c.store(keys_for("busy-new", 1), random_payloads(1, 10000))  # being written
        r = run_kvtier("purge", "--config", cfg, "--all", "--yes", "--json")
        assert r.returncode == 0, r.stderr + r.stdout
        out = json.loads(r.stdout)
        assert out["via"] == "server"
        res = out["result"]
        assert res["pinned"] == 1 and res["in_flight"] == 1 and res["removed"] == 3, out
        t.join()
        assert got == [pay[:1]]  # the load of the pinned object completed, intact
        c.flush()
    assert len(bin_files(root)) == 2
    r = run_kvtier("purge", "--config", cfg, "--all", "--yes")
    assert r.returncode == 0 and "2 object file(s)" in r.stdout, r.stdout + r.stderr
    assert "left in place" not in r.stdout
    assert bin_files(root) == []


def test_relative_tmp_dir(make_server, tmp_path):
    """docs/adapters.md: files being written go to relative_tmp_dir under
    base_path, then are renamed into base_path; ".." and "/" are refused."""
    d = tmp_path / "rt"
    d.mkdir()
    (d / "wip").mkdir()
    hold = threading.Event()
    s = make_server(["--l2-store-policy", "skip_l1",
                     "--l2-adapter", adapter_json(type="fs", base_path=str(d), relative_tmp_dir="wip")])
    keys = keys_for("rt", 20)
    pay = random_payloads(20, 2 * MiB)
    seen = []

    def watch():
        while not hold.is_set():
            seen.extend(f for f in os.listdir(d / "wip") if f not in seen)

    t = threading.Thread(target=watch)
    t.start()
    try:
        with s.client() as c:
            assert c.store(keys, pay) == 20
            c.flush()
    finally:
        hold.set()
        t.join()
    assert len(fs_files(d)) == 20
    assert os.listdir(d / "wip") == []
    assert seen, "no file was ever written in relative_tmp_dir"
    assert not [f for f in os.listdir(d) if ".tmp" in f]
    with s.client() as c:
        assert c.retrieve(keys) == pay
    for bad in ("..", "a/b", "/abs"):
        r = run_kvtier("server", "--dry-run", "--l2-adapter",
                       adapter_json(type="fs", base_path=str(d), relative_tmp_dir=bad))
        assert r.returncode == 2 and "relative_tmp_dir" in r.stderr, (bad, r.stderr)


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
