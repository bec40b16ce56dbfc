"""Regression tests of issue 18 (silent L2 failures): a store that cannot
reach L2 is loud (a warning, a counter) and flush() names it; an eviction
policy makes room before a store is refused; an object file changed behind
the server's back is corrupt (counted, removed, re-storable); dax checks its
geometry; the seed's debug log lines for L2 activity."""

import json
import os
import signal

import pytest

import kvtier
from support.data import adapter_json, keys_for, random_payloads
from support.server import l2_status, run_kvtier, wait_for
from test_resp import redis  # noqa: F401  (the Redis server fixture)

MiB = 1 << 20


def make_file(path, size):
    with open(path, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, size)
    return str(path)


def counters(server, i=0):
    return l2_status(server, i)["counters"]


# ------------------------------------------------------------------ item 4


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


# ------------------------------------------------------------------ item 5


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


# ----------------------------------------------------------------- item 19


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


# ------------------------------------------------------------------ item 6


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


# ------------------------------------------------------------------ item 7


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


def test_resp_burst_over_the_cap_evicts(make_server, redis):
    """Description: the same synchronous eviction on a Redis tier: a burst of
    3x the cap with LRU is stored (flush reports nothing failed), the cap
    holds."""
    from test_resp import resp_json
    ev = {"eviction_policy": "LRU", "trigger_watermark": 0.9, "eviction_ratio": 0.1}
    s = make_server(["--l2-store-policy", "skip_l1", "--eviction-interval-ms", "60000",
                     "--l2-adapter", resp_json(redis, max_capacity_gb=MiB / (1 << 30),
                                               eviction=ev)])
    with s.client() as c:
        for r in range(3):
            keys = keys_for("rburst", 5, seed=r)
            assert c.store(keys, random_payloads(5, 200000, seed=r)) == 5
            res = c.flush()
            assert res.l2_failed == 0, res
        st = c.status()["l2"][0]
        assert st["used_bytes"] <= MiB and st["counters"]["sync_evictions"] > 0, st
        assert c.lookup(keys_for("rburst", 5, seed=2)) == 5
