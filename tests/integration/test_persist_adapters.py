"""The persistent adapters through the real server: store, lookup-and-lock,
load, delete, usage and status; restart (SIGKILL) keeps the data where
persistence is promised and restores accounting before any lookup;
concurrent writers never push usage over the cap (checked with du);
fs_native's queue depth and O_DIRECT alignment rule; raw_block on a loop
device when the sandbox allows one."""

import json
import os
import signal
import subprocess
import threading

import pytest

import kvtier
from support.data import adapter_json, du_bytes, keys_for, random_payloads
from support.server import l2_status, run_kvtier, wait_for

MiB = 1 << 20
N = 16
SIZE = 200000  # not a multiple of 4096: exercises buffered tails and bounces


def make_file(path, size):
    with open(path, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, size)
    return str(path)


def specs(tmp_path):
    """type label -> (adapter json, persistent, bytes one object occupies)"""
    return {
        "nixl_store_dynamic": (adapter_json(
            type="nixl_store_dynamic", backend="POSIX",
            backend_params={"file_path": str(tmp_path / "nd"), "use_direct_io": "true",
                            "max_capacity_gb": "1"}), True, 512 + SIZE),  # buffered: length
        "nixl_store_dynamic-uring-shards": (adapter_json(
            type="nixl_store_dynamic", backend="HF3FS", io_engine="io_uring", durable=True,
            backend_params={"file_path": str(tmp_path / "nd2"), "use_direct_io": "false",
                            "max_capacity_gb": "1", "shard_dirs": "true"}), True, 512 + SIZE),
        "nixl_store": (adapter_json(
            type="nixl_store", backend="POSIX", pool_size=4,
            backend_params={"file_path": str(tmp_path / "ns"), "use_direct_io": "true",
                            "file_size": 8 * MiB}), False, 4096 * (1 + -(-SIZE // 4096))),
        "fs_native": (adapter_json(
            type="fs_native", base_path=str(tmp_path / "fsn"), num_workers=8,
            max_capacity_gb=1), True, 512 + SIZE),
        "raw_block": (adapter_json(
            type="raw_block", device_path=make_file(tmp_path / "rb.img", 40 * MiB),
            slot_bytes=256 * 1024, meta_total_bytes=MiB), True, 256 * 1024 + 4096),
        "raw_block-uring": (adapter_json(
            type="raw_block", device_path=make_file(tmp_path / "rb2.img", 40 * MiB),
            slot_bytes=256 * 1024, meta_total_bytes=MiB, io_engine="io_uring",
            iouring_queue_depth=16), True, 256 * 1024 + 4096),
        "dax": (adapter_json(
            type="dax", device_path=str(tmp_path / "dax.img"), max_dax_size_gb=0.02,
            slot_bytes=256 * 1024), True, 256 * 1024),
    }


LABELS = ["nixl_store_dynamic", "nixl_store_dynamic-uring-shards", "nixl_store", "fs_native",
          "raw_block", "raw_block-uring", "dax"]


@pytest.mark.parametrize("label", LABELS)
def test_adapter_contract_and_restart(make_server, tmp_path, label):
    spec, persistent, per_obj = specs(tmp_path)[label]
    s = make_server(["--l2-adapter", spec])
    keys = keys_for("persist/" + label, N, seed=3)
    pay = random_payloads(N, SIZE, seed=11)
    with s.client() as c:
        assert c.store(keys, pay) == N
        c.flush()
        st = c.status()["l2"][0]
        assert st["is_healthy"], st["health"]
        assert st["objects"] == N and st["used_bytes"] == N * per_obj
        assert st["counters"]["store_ok"] == N
        assert st["per_namespace_bytes"] == {"persist--" + label: N * per_obj}
        # delete 4 (L1 and L2), then the L2 copy is what serves the rest
        assert c.delete(keys[:4]) == 4
        st = c.status()["l2"][0]
        assert st["objects"] == N - 4 and st["used_bytes"] == (N - 4) * per_obj
    s.kill(signal.SIGKILL)
    s.start()
    st = s.wait_recovered()["l2"][0]
    with s.client() as c:
        if persistent:
            # accounting restored by the start-up scan, before any lookup
            assert st["counters"]["lookups"] == 0
            assert st["objects"] == N - 4 and st["used_bytes"] == (N - 4) * per_obj
            assert st["recovery"]["objects"] == N - 4
            assert c.lookup(keys[4:]) == N - 4
            assert c.retrieve(keys[4:]) == pay[4:]
            assert c.lookup(keys[:4]) == 0
            st = c.status()["l2"][0]
            assert st["counters"]["load_ok"] >= N - 4 and st["counters"]["corrupt"] == 0
            assert st["pinned_objects"] == 0  # retrieve unlocked what lookup pinned
        else:
            assert st["objects"] == 0 and st["persist_enabled"] is False
            assert c.lookup(keys) == 0
            # the pool is reused: it works after the restart
            assert c.store(keys, pay) == N
            c.flush()
            assert c.status()["l2"][0]["objects"] == N


@pytest.mark.parametrize("engine", ["posix", "io_uring"])
def test_concurrent_writers_never_exceed_the_cap(make_server, tmp_path, engine):
    """nixl_store_dynamic: 4 writers race for a cap of ~24 objects; usage (and
    du of the directory) stays under it, also after a restart and more
    writes (the seed's required fill -> restart -> write -> bounded test)."""
    d = tmp_path / "cap"
    obj = 4096 + 256 * 1024
    cap_gb = 24.5 * obj / 2**30
    spec = adapter_json(type="nixl_store_dynamic", backend="POSIX", io_engine=engine,
                        backend_params={"file_path": str(d), "use_direct_io": "true",
                                        "max_capacity_gb": cap_gb})
    s = make_server(["--l2-adapter", spec])

    def writer(w, n):
        with s.client() as c:
            for i in range(n):
                k = keys_for("cap%d" % w, 1, seed=1000 * w + i)
                c.store(k, random_payloads(1, 256 * 1024, seed=w * 100 + i))
            c.flush()

    for rnd in range(2):
        ts = [threading.Thread(target=writer, args=(w + 4 * rnd, 12)) for w in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        with s.client() as c:
            c.flush()
            st = c.status()["l2"][0]
        assert st["used_bytes"] <= st["capacity_bytes"]
        assert st["objects"] == 24
        assert st["counters"]["rejected_writes"] > 0
        assert du_bytes(d) == st["used_bytes"] <= cap_gb * 2**30
        s.kill(signal.SIGKILL)
        s.start()
        st = s.wait_recovered()["l2"][0]
        assert st["used_bytes"] == du_bytes(d) and st["objects"] == 24


def test_raw_block_cap_counts_slots(make_server, tmp_path):
    slot = MiB + 4096  # header_bytes + slot_bytes
    dev = make_file(tmp_path / "rbcap.img", MiB + 8 * slot)  # 1 MiB meta + 8 slots
    s = make_server(["--l2-adapter", adapter_json(type="raw_block", device_path=dev,
                                                  slot_bytes=MiB, meta_total_bytes=MiB)])
    keys = keys_for("rbcap", 12)
    with s.client() as c:
        for i in range(12):
            c.store(keys[i:i + 1], random_payloads(1, 1000, seed=i))
        c.flush()
        st = c.status()["l2"][0]
    assert st["objects"] == 8 and st["used_bytes"] == st["capacity_bytes"] == 8 * slot
    assert st["free_slots"] == 0 and st["counters"]["rejected_writes"] == 4


def test_nixl_store_pool_lives_while_the_server_runs(make_server, tmp_path):
    """The pool's index is volatile, so its files are only worth their
    space while the server runs: a SIGKILL leaves them and the next start
    reuses them (the same files: no new allocation), files of a larger
    earlier pool are removed, and a stop removes the pool."""
    d = tmp_path / "ns"
    d.mkdir()
    spec = adapter_json(type="nixl_store", backend="POSIX", pool_size=2,
                        backend_params={"file_path": str(d), "file_size": MiB})
    s = make_server(["--l2-adapter", spec])
    pool = sorted(os.listdir(d))
    assert pool == ["nixl_pool_0.bin", "nixl_pool_1.bin"], pool
    inodes = [os.stat(d / f).st_ino for f in pool]
    s.kill(signal.SIGKILL)
    assert sorted(os.listdir(d)) == pool
    with open(d / "nixl_pool_5.bin", "wb") as f:  # left by a pool of 6 files
        f.truncate(MiB)
    s.start()
    assert sorted(os.listdir(d)) == pool
    assert [os.stat(d / f).st_ino for f in pool] == inodes
    with s.client() as c:
        assert c.store(keys_for("pool", 2), random_payloads(2, 1000)) == 2
        assert c.flush().l2_failed == 0
    assert s.stop() == 0
    assert os.listdir(d) == []


def test_fs_native_queue_depth_is_num_workers(make_server, tmp_path):
    s = make_server(["--l2-adapter", adapter_json(type="fs_native", base_path=str(tmp_path / "q"),
                                                  num_workers=6)])
    names = []
    for tid in os.listdir("/proc/%d/task" % s.proc.pid):
        with open("/proc/%d/task/%s/comm" % (s.proc.pid, tid)) as f:
            names.append(f.read().strip())
    assert sorted(n for n in names if n.startswith("fs-")) == ["fs-%d" % i for i in range(6)]
    with s.client() as c:
        assert c.status()["l2"][0]["num_workers"] == 6


def test_fs_native_misaligned_buffer_is_an_error_not_a_crash(make_server, tmp_path):
    """With --l1-align-bytes 512, L1 objects are 512-aligned: an O_DIRECT
    transfer from one that is not 4096-aligned is refused (EINVAL, counted,
    logged with the fix), the server keeps serving."""
    d = tmp_path / "mis"
    s = make_server(["--l1-align-bytes", "512", "--l2-adapter",
                     adapter_json(type="fs_native", base_path=str(d), use_odirect=True)])
    st = None
    with s.client() as c:
        c.store(keys_for("mis", 1, seed=1), [b"y" * 512])   # takes the first 512 bytes of L1
        c.store(keys_for("mis", 4, seed=2), random_payloads(4, 64 * 1024, seed=2))
        c.flush()
        st = c.status()["l2"][0]
        c.ping()
    if st["odirect"] != "on":
        pytest.skip("O_DIRECT not supported under %s" % d)
    assert st["odirect_misaligned"] >= 1
    assert st["counters"]["store_failed"] == st["odirect_misaligned"]
    assert st["counters"]["odirect_fallbacks"] >= 1  # the 512-byte object: length rule
    assert "raise --l1-align-bytes" in s.read_log()


def test_nixl_store_dynamic_secondary_lookup_and_tmp_cleanup(make_server, tmp_path):
    """A file published by another process sharing the directory is found by
    lookup (secondary lookup); a dead writer's tmp file is removed at start,
    a foreign-format tmp file (LMCache's uuid suffix) only when stale."""
    d = tmp_path / "shared"
    spec = adapter_json(type="nixl_store_dynamic", backend="POSIX",
                        backend_params={"file_path": str(d), "use_direct_io": "false",
                                        "max_capacity_gb": 1})
    a = make_server(["--l2-adapter", spec])
    keys = keys_for("shared", 3, seed=5)
    pay = random_payloads(3, 50000, seed=5)
    with a.client() as c:
        assert c.store(keys, pay) == 3
        c.flush()
    a.kill()
    files = sorted(f for f in os.listdir(d) if f.endswith(".bin"))
    assert len(files) == 3 and all(f.startswith("shared_00000000_0_") for f in files)
    hidden = d / "elsewhere"
    hidden.mkdir()
    # server B starts without the files; they appear afterwards (another host)
    for f in files:
        os.rename(d / f, hidden / f)
    dead_tmp = d / (files[0] + ".tmp.%x-%x-0" % (999999, 12345))
    dead_tmp.write_bytes(b"partial")
    fresh_uuid_tmp = d / (files[1] + ".tmp.0123456789abcdef0123456789abcdef")
    fresh_uuid_tmp.write_bytes(b"lmcache in flight")
    b = make_server(["--l2-adapter", spec])
    st = b.wait_recovered()["l2"][0]
    assert st["objects"] == 0 and not dead_tmp.exists() and fresh_uuid_tmp.exists()
    for f in files:
        os.rename(hidden / f, d / f)
    with b.client() as c:
        assert c.lookup(keys) == 3
        assert c.retrieve(keys) == pay
        st = c.status()["l2"][0]
    assert st["counters"]["secondary_hits"] == 3 and st["objects"] == 3
    # persist_enabled false: files go at close, tmp leftovers always
    assert b.stop() == 0
    np_spec = json.loads(spec)
    np_spec["persist_enabled"] = "false"
    os.utime(fresh_uuid_tmp, (1, 1))  # stale now
    c2 = make_server(["--l2-adapter", json.dumps(np_spec)])
    c2.wait_recovered()
    assert c2.stop() == 0
    assert sorted(os.listdir(d)) == [".kvtier.lock", "elsewhere"]  # the owner's (empty) lock


def losetup(path):
    try:
        r = subprocess.run(["losetup", "--find", "--show", path], capture_output=True, text=True,
                           timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    dev = r.stdout.strip()
    return dev if r.returncode == 0 and dev.startswith("/dev/loop") else None


def test_raw_block_on_a_loop_device(make_server, tmp_path):
    img = make_file(tmp_path / "loop.img", 24 * MiB)
    dev = losetup(img)
    if not dev:
        pytest.skip("no loop device in this sandbox (losetup not permitted)")
    try:
        spec = adapter_json(type="raw_block", device_path=dev, slot_bytes=MiB,
                            meta_total_bytes=MiB, io_engine="io_uring")
        s = make_server(["--l2-adapter", spec])
        keys = keys_for("loop", 10)
        pay = random_payloads(10, 300000, seed=8)
        with s.client() as c:
            assert c.store(keys, pay) == 10
            c.flush()
            st = c.status()["l2"][0]
            assert st["block_device"] is True and st["slots"] == 22 and st["odirect"] == "on"
        s.kill(signal.SIGKILL)
        s.start()
        s.wait_recovered()
        with s.client() as c:
            assert c.retrieve(keys) == pay
        s.stop()
    finally:
        subprocess.run(["losetup", "-d", dev], timeout=20)


@pytest.mark.parametrize("label", ["raw_block", "dax", "nixl_store"])
def test_serde_in_front_of_slot_adapters(make_server, tmp_path, label):
    """A serde stage (zstd) in front of the slot-based adapters: stored bytes
    are the compressed ones, retrieve returns the original bytes, and after
    a restart (persistent ones) the same."""
    spec = json.loads(specs(tmp_path)[label][0])
    spec["serde"] = {"type": "zstd", "level": 1}
    s = make_server(["--l2-adapter", json.dumps(spec)])
    keys = keys_for("serde-" + label, 6)
    pay = [bytes([i]) * 150000 + os.urandom(1000) for i in range(6)]
    with s.client() as c:
        assert c.store(keys, pay) == 6
        c.flush()
        st = c.status()["l2"][0]
        assert st["serde"]["encoded"] == 6 and st["counters"]["store_ok"] == 6
        assert st["counters"]["bytes_written"] < sum(map(len, pay)) // 10
    s.kill(signal.SIGKILL)
    s.start()
    s.wait_recovered()
    with s.client() as c:
        if label == "nixl_store":
            assert c.lookup(keys) == 0
        else:
            assert c.retrieve(keys) == pay


def _flip_payload_byte(root, payload):
    """Flip one byte of payload where it lies in a file under root (the
    slot engines keep no file per object: find the bytes themselves)."""
    needle = payload[4096:4160]
    for d, _, files in os.walk(root):
        for f in files:
            path = os.path.join(d, f)
            with open(path, "r+b") as fh:
                data = fh.read()
                at = data.find(needle)
                if at >= 0:
                    fh.seek(at)
                    fh.write(bytes([data[at] ^ 0x01]))
                    fh.flush()
                    os.fsync(fh.fileno())
                    return path
    raise AssertionError("payload not found under %s" % root)


@pytest.mark.parametrize("label", ["raw_block", "raw_block-uring", "dax", "nixl_store"])
def test_corrupt_slot_is_a_miss_and_removed(make_server, tmp_path, label):
    """A slot engine's object that fails verification is a miss, counted,
    and then removed (slot freed, bytes uncounted, a raw_block DEL
    journaled) once its readers are done, like the file engines' corrupt
    files. A new store of the key works; after a restart it is not back."""
    spec, persistent, per_obj = specs(tmp_path)[label]
    s = make_server(["--l2-store-policy", "skip_l1", "--l2-adapter", spec])
    keys = keys_for("rot/" + label, 4, seed=5)
    pay = random_payloads(4, SIZE, seed=6)
    with s.client() as c:
        assert c.store(keys, pay) == 4
        c.flush()
        assert c.status()["l2"][0]["objects"] == 4
        _flip_payload_byte(str(tmp_path), pay[1])
        assert c.lookup(keys) == 1  # the prefix stops at the corrupt chunk
        assert c.retrieve(keys[:1]) == pay[:1]
        st = c.status()["l2"][0]
        assert st["counters"]["corrupt"] == 1, st["counters"]
        # the L2 eviction thread reaps it (1 s timer)
        # (the index entry goes first, the delete is counted when the
        # slot's removal completes: wait for both)
        st = wait_for(lambda: (lambda a: a if a["objects"] == 3 and a["counters"]["deleted"] == 1
                               else None)(c.status()["l2"][0]),
                      what="the corrupt slot to be removed")
        assert st["used_bytes"] == 3 * per_obj, st
        assert st["counters"]["deleted"] == 1 and st["pinned_objects"] == 0
        # now a plain miss: not loaded again, not counted again
        assert c.lookup(keys[1:2]) == 0
        assert c.status()["l2"][0]["counters"]["corrupt"] == 1
    if persistent:
        # the removal is durable (raw_block: its DEL is journaled): after a
        # SIGKILL the corrupt object is not back
        s.kill(signal.SIGKILL)
        s.start()
        st = s.wait_recovered()["l2"][0]
        assert st["objects"] == 3 and st["used_bytes"] == 3 * per_obj, st
    with s.client() as c:
        assert c.lookup(keys[1:2]) == 0
        assert c.status()["l2"][0]["counters"]["corrupt"] == (0 if persistent else 1)
        # a new store of the key works
        assert c.store(keys[1:2], pay[1:2]) == 1
        c.flush()
        assert c.lookup(keys) == 4 and c.retrieve(keys) == pay


def counters(server, i=0):
    return l2_status(server, i)["counters"]


@pytest.mark.parametrize("label", ["raw_block", "dax", "nixl_store"])
def test_object_larger_than_a_slot_is_loud(make_server, tmp_path, label):
    """Description: slot adapters given objects larger than a slot holds
    (raw_block: slot_bytes 1 MiB - 4 KiB; its header is in addition): each
    such store is counted (too_big), warned about once, and flush() names
    every key with E_TOOBIG."""
    spec = {
        "raw_block": dict(type="raw_block", device_path=make_file(tmp_path / "rb.img", 24 * MiB),
                          slot_bytes=MiB - 4096, meta_total_bytes=MiB),
        "dax": dict(type="dax", device_path=str(tmp_path / "dax.img"), max_dax_size_gb=0.02,
                    slot_bytes=MiB - 4096),
        "nixl_store": dict(type="nixl_store", backend="POSIX", pool_size=1,
                           backend_params={"file_path": str(tmp_path / "ns"),
                                           "file_size": MiB}),
    }[label]
    s = make_server(["--l2-adapter", json.dumps(spec)])
    keys = keys_for("big/" + label, 3)
    pay = random_payloads(3, MiB)
    with s.client() as c:
        assert c.store(keys, pay) == 3  # L1 took them
        res = c.flush()
        assert res.l2_failed == 3 and len(res.failed) == 3 and not res.truncated, res
        assert bool(res)
        assert {f.hash for f in res.failed} == set(keys.hashes)
        assert all(f.code == -1005 and f.error == "E_TOOBIG" and f.adapter == 0 and
                   f.model == "big/" + label for f in res.failed), res
        with pytest.raises(kvtier.KvtierError) as ei:
            c.store(keys_for("big2/" + label, 1), pay[:1])
            c.flush(check=True)
        assert ei.value.name == "E_TOOBIG"
        # each failure is reported once: the next flush is clean
        assert not c.flush() and c.flush().l2_failed == 0
    st = counters(s)
    assert st["too_big"] == 4 and st["store_failed"] == 4, st
    log = s.read_log()
    assert log.count("this adapter holds at most") == 1, log
    code, text = s.http_get("/metrics")
    assert code == 200 and 'kvtier_l2_too_big_total{adapter="%s[0]"} 4' % label in text, text
    # healthy, but the tier's line says what it refuses: status and kvtier status
    with s.client() as c:
        a = c.status()["l2"][0]
    assert a["is_healthy"] and "4 stores refused as too big (objects up to" in a["health"], a
    r = run_kvtier("status", "--url", s.url)
    assert r.returncode == 0, r.stderr
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("%s[0] " % label)]
    assert line and "4 stores refused as too big" in line[0], r.stdout
    assert "(too big 4)" in r.stdout, r.stdout


def test_flush_reports_only_the_clients_own_failures(make_server, tmp_path):
    """Description: failures are per client: a second client's flush does
    not see (or take) the first one's."""
    spec = adapter_json(type="dax", device_path=str(tmp_path / "dax.img"), max_dax_size_gb=0.01,
                        slot_bytes=256 * 1024)
    s = make_server(["--l2-adapter", spec])
    with s.client() as a, s.client() as b:
        a.store(keys_for("own", 2), random_payloads(2, 300000))
        b.store(keys_for("own", 2, seed=9), random_payloads(2, 1000))
        rb = b.flush()
        assert rb.l2_failed == 0, rb
        ra = a.flush()
        assert ra.l2_failed == 2, ra


@pytest.mark.parametrize("policy", ["LRU", "ARC", "LFU", "value"])
def test_burst_over_the_cap_evicts_instead_of_refusing(make_server, tmp_path, policy):
    """Description: with an eviction policy (each of them), a burst of stores
    larger than the gap between the watermark and the cap makes room
    synchronously: every store reaches L2 (flush reports none failed), usage
    never exceeds the cap, the oldest objects went."""
    ev = {"eviction_policy": policy, "trigger_watermark": 0.9, "eviction_ratio": 0.1}
    spec = adapter_json(type="fs", base_path=str(tmp_path / "d"), max_capacity_gb=4 * MiB / (1 << 30),
                        eviction=ev)
    # a slow evictor (60 s): only the synchronous path can make room in time
    s = make_server(["--l2-store-policy", "skip_l1", "--eviction-interval-ms", "60000",
                     "--l2-adapter", spec])
    size = 200000
    with s.client() as c:
        for r in range(4):  # 4 x 10 objects of 200 KB: 8 MB into a 4 MiB cap
            keys = keys_for("burst", 10, seed=r)
            assert c.store(keys, random_payloads(10, size, seed=r)) == 10
            res = c.flush()
            assert res.l2_failed == 0, res
        st = c.status()["l2"][0]
        assert st["used_bytes"] <= 4 * MiB, st
        assert st["counters"]["rejected_writes"] == 0, st["counters"]
        assert st["counters"]["sync_evictions"] > 0 and st["counters"]["evictions"] > 0
        # the newest round is there, the first is gone
        assert c.lookup(keys_for("burst", 10, seed=3)) == 10
        assert c.lookup(keys_for("burst", 10, seed=0)) == 0


def test_over_the_cap_without_eviction_is_reported(make_server, tmp_path):
    """Description: without an eviction policy the cap refuses, and flush()
    names the refused keys (E_FULL)."""
    spec = adapter_json(type="fs", base_path=str(tmp_path / "d"), max_capacity_gb=MiB / (1 << 30))
    s = make_server(["--l2-store-policy", "skip_l1", "--l2-adapter", spec])
    keys = keys_for("full", 8)
    with s.client() as c:
        assert c.store(keys, random_payloads(8, 200000)) == 8
        res = c.flush()
        assert res.l2_failed == 3, res  # 5 x (512 + 200000) fit in 1 MiB
        assert all(f.error == "E_FULL" for f in res.failed), res
        stored = set(keys.hashes) - {f.hash for f in res.failed}
        assert len(stored) == 5
        assert c.status()["l2"][0]["counters"]["rejected_writes"] == 3


@pytest.mark.parametrize("how", ["env", "flag"])
def test_debug_log_shows_l2_activity(make_server, tmp_path, how):
    """Description: LMCACHE_LOG_LEVEL=DEBUG (the seed's way) or --log-level
    debug prints the seed's three messages: submitted store task, store task
    completed, prefetch request with L1 hits and the L2 remainder."""
    args = ["--l2-store-policy", "skip_l1", "--l2-adapter",
            adapter_json(type="fs", base_path=str(tmp_path / "d"))]
    env = None
    if how == "env":
        env = {"LMCACHE_LOG_LEVEL": "DEBUG"}
        os.environ.pop("KVT_LOG_LEVEL", None)
    else:
        args = ["--log-level", "debug"] + args
    s = make_server(args, env=env)
    keys = keys_for("dbg", 4)
    with s.client() as c:
        c.store(keys, random_payloads(4, 1000))
        c.flush()
        assert c.lookup(keys) == 4
    log = s.read_log()
    assert "Submitted store task" in log, log
    assert "L2 store task" in log and "completed" in log, log
    assert "Prefetch request submitted: 4 total keys, 0 L1 prefix hits, 4 remaining for L2" in log, log


def _file_specs(tmp_path):
    return {
        "fs": adapter_json(type="fs", base_path=str(tmp_path / "d")),
        "nixl_store_dynamic": adapter_json(
            type="nixl_store_dynamic", backend="POSIX",
            backend_params={"file_path": str(tmp_path / "d"), "max_capacity_gb": "1"}),
    }


def _object_files(d):
    out = []
    for root, _, files in os.walk(d):
        for f in files:
            if f.endswith(".data") or f.endswith(".bin"):
                out.append(os.path.join(root, f))
    return sorted(out)


def _file_of(d, key_hash):
    hx = key_hash.hex()
    (path,) = [p for p in _object_files(d) if hx in os.path.basename(p)]
    return path


@pytest.mark.parametrize("label", ["fs", "nixl_store_dynamic"])
@pytest.mark.parametrize("change", ["extend", "empty", "padding"])
def test_object_file_changed_while_running_is_corrupt(make_server, tmp_path, label, change):
    """Description: an object file extended, emptied or with a nonzero byte
    in its header padding while the server runs is a mismatch like any
    other: a miss, counted as corrupt, removed, unindexed (used_bytes drops),
    and a new store of the key is written again (not skipped as present)."""
    s = make_server(["--l2-store-policy", "skip_l1", "--l2-adapter", _file_specs(tmp_path)[label]])
    keys = keys_for("chg", 3)
    pay = random_payloads(3, 100000)
    d = str(tmp_path / "d")
    with s.client() as c:
        assert c.store(keys, pay) == 3
        assert c.flush().l2_failed == 0
        st = c.status()["l2"][0]
        used0, one = st["used_bytes"], st["used_bytes"] // 3
        path = _file_of(d, keys.hashes[1])
        if change == "extend":
            with open(path, "ab") as f:
                f.write(b"x" * 100)
        elif change == "empty":
            open(path, "wb").close()
        else:
            with open(path, "r+b") as f:
                f.seek(500)  # header area of 512 bytes; model "chg": padding
                f.write(b"\x01")
        assert c.lookup(keys) in (1, 3)  # the index may answer before the load
        assert c.retrieve(keys) == pay[:1]
        st = c.status()["l2"][0]
        assert st["counters"]["corrupt"] == 1, st["counters"]
        assert st["objects"] == 2 and st["used_bytes"] == used0 - one, st
        assert not os.path.exists(path)
        # stored again, really written
        assert c.store(keys[1:2], pay[1:2]) == 1
        assert c.flush().l2_failed == 0
        assert os.path.getsize(path) == one
        assert c.retrieve(keys) == pay
        assert c.status()["l2"][0]["counters"]["corrupt"] == 1


@pytest.mark.parametrize("label", ["fs", "nixl_store_dynamic"])
def test_empty_object_file_at_restart_is_counted(make_server, tmp_path, label):
    """Description: an object file emptied while the server was down is
    counted as corrupt by the start-up scan and removed (it was silently
    skipped)."""
    s = make_server(["--l2-adapter", _file_specs(tmp_path)[label]])
    keys = keys_for("rst", 3)
    d = str(tmp_path / "d")
    with s.client() as c:
        c.store(keys, random_payloads(3, 5000))
        assert c.flush().l2_failed == 0
    s.kill(signal.SIGKILL)
    path = _file_of(d, keys.hashes[2])
    open(path, "wb").close()
    s.start()
    st = s.wait_recovered()["l2"][0]
    assert st["counters"]["corrupt"] == 1 and st["objects"] == 2, st
    assert not os.path.exists(path)


def test_dax_slot_bytes_change_reformats_clearly(make_server, tmp_path):
    """Description: dax restarted with another slot_bytes reformats the
    mapping with a warning (status reformatted_at_start) instead of reusing
    headers that point at other bytes (stale slots counted as used, then
    failing as corrupt). The same slot_bytes keeps the objects."""
    dev = str(tmp_path / "dax.img")

    def spec(slot):
        return adapter_json(type="dax", device_path=dev, max_dax_size_gb=0.02, slot_bytes=slot)

    keys = keys_for("geom", 4)
    pay = random_payloads(4, 100000)
    s = make_server(["--l2-adapter", spec(256 * 1024)])
    with s.client() as c:
        assert c.store(keys, pay) == 4
        assert c.flush().l2_failed == 0
    s.kill(signal.SIGKILL)
    s.start()
    st = s.wait_recovered()["l2"][0]
    assert st["objects"] == 4 and st["reformatted_at_start"] is None, st
    s.kill(signal.SIGKILL)
    s2 = make_server(["--l2-store-policy", "skip_l1", "--l2-adapter", spec(128 * 1024)])
    st = s2.wait_recovered()["l2"][0]
    assert st["objects"] == 0 and st["used_bytes"] == 0, st
    assert "another layout" in st["reformatted_at_start"], st
    assert "slot_bytes 262144" in s2.read_log()
    with s2.client() as c:
        assert c.lookup(keys) == 0
        assert c.store(keys, pay) == 4
        assert c.flush().l2_failed == 0
        assert c.retrieve(keys) == pay  # from the slots (skip_l1)
        st = c.status()["l2"][0]
        assert st["counters"]["corrupt"] == 0 and st["counters"]["load_ok"] == 4, st["counters"]
