"""resp / valkey adapter against a real redis-server started by the tests on
a free loopback port: pipelining (round trips counted on the server), Redis
killed and restarted mid-run, truncated and foreign values, auth, bad
config. The contract it shares with s3 (round trip and restart, two servers
sharing, the cap after a restart, a corrupt value, persist_enabled: false)
is in test_remote_contract.py."""

import json
import os

import pytest

import kvtier
from support.data import adapter_json, keys_for, random_payloads
from support.redis_servers import REDIS, Redis, resp_json
from support.server import l2_status, run_kvtier, wait_for

pytestmark = pytest.mark.skipif(REDIS is None, reason="redis-server is not installed")
KiB = 1 << 10
MiB = 1 << 20
HDR = 512


@pytest.fixture
def redis(tmp_path):
    d = tmp_path / "redis"
    d.mkdir()
    r = Redis(d).start()
    yield r
    r.kill()


def test_batches_are_pipelined(make_server, redis):
    """A chunk stored through server 1 is a hit through server 2; server 2's
    lookup of 32 keys and their load take one round trip each: Redis counts
    2 x 32 + 32 commands but only a handful of socket reads."""
    s1 = make_server(["--l2-adapter", resp_json(redis)])
    s2 = make_server(["--l2-adapter", resp_json(redis)])
    s2.wait_recovered()
    keys = keys_for("pipe", 32)
    pay = random_payloads(32, 8 * KiB, seed=2)
    with s1.client() as c:
        assert c.store(keys, pay) == 32
        c.flush()
    assert l2_status(s1)["round_trips"] == 1  # 32 SETs, one round trip
    before = redis.info()
    rt0 = l2_status(s2)["round_trips"]
    with s2.client() as c:
        assert c.lookup(keys) == 32
        assert c.retrieve(keys) == pay
    after = redis.info()
    a = l2_status(s2)
    assert a["round_trips"] - rt0 == 2
    cmds = int(after["total_commands_processed"]) - int(before["total_commands_processed"])
    reads = int(after["total_reads_processed"]) - int(before["total_reads_processed"])
    # 64 lookup commands (GETRANGE + STRLEN) + 32 GETs + the INFO calls
    assert cmds >= 96, cmds
    # one read per batch (plus the INFO connections); unpipelined would be >= 96
    assert reads <= 10, (reads, cmds)
    assert a["counters"]["secondary_hits"] == 32


def test_redis_down_and_back(make_server, redis, tmp_path):
    """Redis SIGKILLed mid-run: unhealthy in /healthz and status, lookups miss
    on resp (served by fs), stores counted as failed; Redis restarted empty:
    reconnect with backoff, lost objects dropped from the accounting, new
    stores land again."""
    fsdir = tmp_path / "fs"
    s = make_server(["--l2-store-policy", "skip_l1",
                     "--l2-adapter", resp_json(redis),
                     "--l2-adapter", adapter_json(type="fs", base_path=str(fsdir))])
    keys = keys_for("down", 8)
    pay = random_payloads(8, 64 * KiB, seed=4)
    with s.client() as c:
        assert c.store(keys, pay) == 8
        c.flush()
    assert l2_status(s)["objects"] == 8
    assert s.http_get("/healthz")[0] == 200

    redis.kill()
    with s.client() as c:
        # served from fs: the resp adapter misses (or is found down at once)
        hits0 = c.status()["l2"][0]["counters"]["lookup_hits"]
        assert c.lookup(keys) == 8
        assert c.retrieve(keys) == pay
        assert c.status()["l2"][0]["counters"]["lookup_hits"] == hits0  # resp missed
    wait_for(lambda: not l2_status(s)["connected"], what="resp to notice")
    code, body = s.http_get("/healthz")
    assert code == 503 and "resp[0]" in body and "not connected" in body, body
    a = l2_status(s)
    assert a["is_healthy"] is False and "not connected" in a["health"]
    assert a["disconnects"] == 1
    more = keys_for("down2", 4)
    with s.client() as c:
        failed0 = c.status()["l2"][0]["counters"]["store_failed"]
        assert c.store(more, random_payloads(4, 64 * KiB, seed=5)) == 4
        c.flush()
        st = c.status()
    assert st["l2"][0]["counters"]["store_failed"] - failed0 == 4
    assert st["l2"][1]["counters"]["store_ok"] == 12  # fs kept everything

    redis.start()  # same port, no data
    wait_for(lambda: l2_status(s)["connected"], what="reconnect")
    a = wait_for(lambda: (lambda x: x if x["objects"] == 0 else None)(l2_status(s)),
                 what="reconcile")
    assert a["reconnects"] == 1 and a["swept_after_restart"] == 8
    assert a["used_bytes"] == 0 and a["is_healthy"]
    assert s.http_get("/healthz")[0] == 200
    last = keys_for("down3", 4)
    lp = random_payloads(4, 64 * KiB, seed=6)
    with s.client() as c:
        assert c.store(last, lp) == 4
        c.flush()
        assert c.lookup(last) == 4
        assert c.retrieve(last) == lp
    assert len(redis.keys("t@*")) == 4
    assert l2_status(s)["counters"]["load_ok"] >= 4


def test_truncated_and_foreign_values_are_misses(make_server, redis):
    """(A flipped byte is in test_remote_contract.py.) A truncated value is
    skipped by the start-up scan (its size disagrees with its header), a
    value that is not ours under our name is a miss, not a crash."""
    s = make_server(["--l2-adapter", resp_json(redis)])
    keys = keys_for("bad", 8)
    pay = random_payloads(8, 32 * KiB, seed=8)
    with s.client() as c:
        assert c.store(keys, pay) == 8
        c.flush()
    s.kill()
    names = {i: n for n in redis.keys("t@*") for i in range(8) if keys.hashes[i].hex() in n}
    v6 = redis.cmd("GET", names[6])
    redis.cmd("SET", names[6], v6[:HDR + 1000])
    s.start()
    s.wait_recovered()
    with s.client() as c:
        assert c.lookup(keys) == 6
        assert c.retrieve(keys) == pay[:6]
        assert c.lookup(keys[7:]) == 1
        a = c.status()["l2"][0]
    assert a["counters"]["corrupt"] == 0
    assert a["foreign_values"] >= 1
    redis.cmd("SET", names[0], b"hello")
    s.kill()
    s.start()
    s.wait_recovered()
    with s.client() as c:
        assert c.lookup(keys) == 0


def test_auth(make_server, tmp_path):
    d = tmp_path / "redis-auth"
    d.mkdir()
    r = Redis(d, password="s3cret").start()
    try:
        bad = make_server(["--l2-adapter", resp_json(r, password="wrong")])
        a = l2_status(bad)
        assert a["is_healthy"] is False and "AUTH" in a["health"], a["health"]
        good = make_server(["--l2-adapter", resp_json(r, password="s3cret")])
        keys = keys_for("auth", 2)
        with good.client() as c:
            assert c.store(keys, random_payloads(2, 1000)) == 2
            c.flush()
        assert l2_status(good)["counters"]["store_ok"] == 2
        assert len(r.keys("t@*")) == 2
    finally:
        r.kill()


def test_valkey_type(redis):
    ok = run_kvtier("server", "--dry-run", "--l2-adapter",
                    json.dumps({"type": "valkey", "startup_nodes": "127.0.0.1:%d,h2:6379" % redis.port,
                                "key_prefix": "deploy1", "max_capacity_gb": "2"}))
    assert ok.returncode == 0, ok.stderr
    a = json.loads(ok.stdout)["l2_adapters"][0]
    # a stalled server fails a request in 1 s, well inside an engine's own
    # timeout (the vLLM connector's 5 s: docs/remote-tiers.md)
    assert a["type"] == "valkey" and a["num_workers"] == 8 and a["request_timeout"] == 1.0
    assert a["connection_timeout"] == 1.0 and a["max_capacity_gb"] == 2.0


RESP_BAD = [
    ({"type": "resp"}, '"host" is required'),
    ({"type": "valkey"}, '"startup_nodes" is required'),
    ({"type": "resp", "host": "h", "key_prefix": "a@b"}, '"key_prefix" must not contain \'@\''),
    ({"type": "resp", "host": "h", "port": 0}, '"port" must be between'),
    ({"type": "resp", "host": "h", "num_workers": 0}, '"num_workers" must be between'),
    ({"type": "valkey", "startup_nodes": "nohost"}, '"startup_nodes" entries must be'),
    ({"type": "valkey", "startup_nodes": "h:1", "host": "h"}, '"startup_nodes" and "host"'),
    ({"type": "valkey", "startup_nodes": "h:1", "cluster_mode": True, "database_id": 1},
     '"database_id" must be 0 in cluster mode'),
    ({"type": "valkey", "startup_nodes": "h:1", "tls_enable": "true"}, '"tls_enable" is not supported'),
    ({"type": "resp", "host": "h", "request_timeout": "soon"}, '"request_timeout" must be a number'),
    ({"type": "resp", "host": "h", "colour": 1}, '"colour" is not a known field'),
]


@pytest.mark.parametrize("spec,msg", RESP_BAD)
def test_config_errors(spec, msg):
    r = run_kvtier("server", "--dry-run", "--l2-adapter", json.dumps(spec))
    assert r.returncode == 2, (spec, r.stderr)
    assert "--l2-adapter #0 (%s)" % spec["type"] in r.stderr and msg in r.stderr, (spec, r.stderr)


def test_unreachable_at_start_then_available(make_server, tmp_path):
    """kvtier starts while Redis is down (serving, unhealthy), and connects
    once Redis comes up."""
    d = tmp_path / "late"
    d.mkdir()
    r = Redis(d)
    s = make_server(["--l2-adapter", resp_json(r)])
    try:
        a = l2_status(s)
        assert a["is_healthy"] is False and a["connected"] is False
        keys = keys_for("late", 2)
        with s.client() as c:
            assert c.store(keys, random_payloads(2, 1000)) == 2  # L1 takes it
        r.start()
        wait_for(lambda: l2_status(s)["connected"], what="first connection")
        more = keys_for("late2", 2)
        with s.client() as c:
            c.store(more, random_payloads(2, 1000))
            c.flush()
        assert len(r.keys("t@*")) == 2
    finally:
        r.kill()


def test_delete_and_eviction_remove_values(make_server, redis):
    """delete removes values from Redis (UNLINK); under a cap with an LRU
    eviction block the eviction controller keeps usage under the watermark
    by removing the coldest values."""
    cap_gb = 16 * (64 * KiB + HDR) / 2**30
    s = make_server(["--l2-adapter", resp_json(redis, max_capacity_gb=cap_gb, eviction={
        "eviction_policy": "LRU", "trigger_watermark": 0.5, "eviction_ratio": 0.5})])
    keys = keys_for("evict", 12)
    pay = random_payloads(12, 64 * KiB, seed=11)
    with s.client() as c:
        assert c.store(keys[:4], pay[:4]) == 4
        c.flush()
        assert c.delete(keys[:2]) == 2
    assert len(redis.keys("t@*")) == 2
    with s.client() as c:
        for i in range(4, 12):
            c.store(keys[i:i + 1], pay[i:i + 1])
        c.flush()
    a = wait_for(lambda: (lambda x: x if x["counters"]["evictions"] > 0 and
                          x["usage_fraction"] <= 0.5 else None)(l2_status(s)),
                 what="eviction below the watermark")
    assert len(redis.keys("t@*")) == a["objects"] < 10
    assert a["used_bytes"] == sum(len(redis.cmd("GET", k)) for k in redis.keys("t@*"))


def test_serde_chain_over_redis(make_server, redis, tmp_path):
    """A serde chain (zstd, then AES-GCM) in front of the resp engine: values
    in Redis hold no plaintext, and a second kvtier sharing the Redis and the
    key reads the chunks back exactly, with their dtype and shape."""
    keyfile = tmp_path / "master.key"
    keyfile.write_bytes(os.urandom(32))
    os.chmod(keyfile, 0o600)
    serde = [{"type": "zstd", "level": 3}, {"type": "encrypt", "master_key_path": str(keyfile)}]
    s1 = make_server(["--l2-adapter", resp_json(redis, serde=serde)])
    s2 = make_server(["--l2-adapter", resp_json(redis, serde=serde)])
    keys = keys_for("serde-resp", 6)
    pay = [bytes([i]) * 40000 + os.urandom(24000) for i in range(6)]
    with s1.client() as c:
        assert c.store(keys, pay, dtype="float16", shape=[32000]) == 6
        c.flush()
    # each value against its own chunk: zstd alone already removes the run
    # of bytes([i]), but keeps the random tail readable (as is, or byte-split
    # for float16: even bytes first), which only the encryption hides
    names = {i: n for n in redis.keys("t@*") for i in range(6) if keys.hashes[i].hex() in n}
    assert sorted(names) == list(range(6)) and len(redis.keys("t@*")) == 6
    for i, k in names.items():
        v = redis.cmd("GET", k)
        assert v[:8] == b"KVTOBJ1\n" and bytes([1]) * 4096 not in v
        tail = pay[i][40000:40128]
        assert tail[:64] not in v and tail[::2] not in v, f"plaintext of chunk {i} in Redis"
    with s2.client() as c:
        assert c.lookup(keys) == 6
        got = c.retrieve(keys, with_meta=True)
    assert [g[0] for g in got] == pay and got[0][1] == "float16" and got[0][2] == (32000,)


def test_resp_burst_over_the_cap_evicts(make_server, redis):
    """Description: the same synchronous eviction on a Redis tier: a burst of
    3x the cap with LRU is stored (flush reports nothing failed), the cap
    holds."""
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
