"""The fs tier, the embedded default, from a client through the real
binary: a round trip across a SIGKILL restart, a flipped byte and a tmp
leftover never a hit, the capacity a hard cap, persist_enabled false,
durable syncs before the acknowledgement, the LRU order restored at
start-up, relative_tmp_dir."""

import os
import signal
import threading
import time

import pytest

import kvtier
from support.data import adapter_json, du_bytes, fs_files, keys_for, random_payloads
from support.faultio import FAULTIO, needs_faultio
from support.server import l2_status, run_kvtier, wait_for

MiB = 1 << 20


def test_round_trip_survives_sigkill(server, tmp_path):
    """64 x 1 MiB stored, flushed, server SIGKILLed and restarted: lookup 64,
    identical bytes, and status shows the restored bytes before any lookup."""
    keys = kvtier.chunk_keys("my-model", list(range(64 * 256)), chunk_size=256)
    pay = random_payloads(64, MiB, seed=1)
    with server.client() as c:
        assert c.store(keys, pay) == 64
        c.flush()
        before = c.status()["l2"][0]
    assert before["objects"] == 64
    server.kill(signal.SIGKILL)
    server.start()
    st = server.wait_recovered()
    a = st["l2"][0]
    assert a["recovery"]["objects"] == 64
    assert a["used_bytes"] == before["used_bytes"] == du_bytes(tmp_path / "data")
    assert a["counters"]["lookups"] == 0  # restored before any lookup touched them
    with server.client() as c:
        assert c.lookup(keys) == 64
        assert c.retrieve(keys) == pay


def test_flipped_byte_is_a_miss(server, tmp_path):
    keys = keys_for("flip", 16)
    pay = random_payloads(16, 64 * 1024, seed=3)
    with server.client() as c:
        assert c.store(keys, pay) == 16
        c.flush()
    server.restart()  # empty L1: reads come from the fs tier
    server.wait_recovered()
    d = tmp_path / "data"
    victim = None
    for f in fs_files(d):
        if keys.hashes[10].hex() in f:
            victim = d / f
    assert victim is not None
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    with server.client() as c:
        n = c.lookup(keys)
        assert n == 10  # the prefix stops at the corrupt chunk
        got = c.retrieve(keys)
        assert len(got) == 10 and got == pay[:10]
        st = c.status()["l2"][0]
        assert st["counters"]["corrupt"] == 1


def test_tmp_leftover_is_never_a_hit(make_server, tmp_path):
    """A complete object under a tmp name (a writer killed before its rename)
    is not served, and is removed once its writer is known dead."""
    d = tmp_path / "data"
    s = make_server(data_dir=str(d))
    keys = keys_for("tmp", 2)
    pay = random_payloads(2, 10000, seed=4)
    with s.client() as c:
        c.store(keys[:1], pay[:1])
        c.flush()
    s.kill()
    final = [f for f in fs_files(d)][0]
    # the same bytes under the second key's name, left as a dead writer's tmp
    name2 = final.replace(keys.hashes[0].hex(), keys.hashes[1].hex())
    tmp = d / (name2 + ".tmp.%x-%x-0" % (999999, 12345))
    tmp.write_bytes((d / final).read_bytes())
    s.start()
    s.wait_recovered()
    with s.client() as c:
        assert c.lookup(keys[1:]) == 0
        assert c.lookup(keys) == 1
    assert not tmp.exists()  # pid 999999 is not alive: swept at start-up


def test_capacity_is_a_hard_cap(make_server, tmp_path):
    d = tmp_path / "cap"
    cap_gb = 8.5 * MiB / 2**30  # room for 8 objects of 1 MiB + header
    s = make_server(["--l2-adapter", adapter_json(type="fs", base_path=str(d), max_capacity_gb=cap_gb)])
    keys = keys_for("cap", 20)
    pay = random_payloads(20, MiB, seed=5)
    with s.client() as c:
        for i in range(20):
            c.store(keys[i:i + 1], pay[i:i + 1])
        c.flush()
        st = c.status()["l2"][0]
    assert st["objects"] == 8
    assert st["used_bytes"] <= st["capacity_bytes"]
    assert st["counters"]["rejected_writes"] == 12
    assert du_bytes(d) == st["used_bytes"] <= cap_gb * 2**30


def test_persist_disabled_removes_files_on_close(make_server, tmp_path):
    d = tmp_path / "np"
    s = make_server(["--l2-adapter", adapter_json(type="fs", base_path=str(d), persist_enabled="false")])
    with s.client() as c:
        c.store(keys_for("np", 3), random_payloads(3, 5000))
        c.flush()
    assert len(fs_files(d)) == 3
    assert s.stop() == 0
    assert fs_files(d) == []


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
