"""The contract every remote tier keeps, for resp (a real redis-server) and
s3 (s3rver with SigV4, and versitygw, a production S3 gateway): round trip and recovery after a SIGKILL, two kvtier
servers sharing one store, the capacity cap after a restart, a corrupt
object is a miss (counted, removed), persist_enabled: false deletes at
close. What only one of them does stays in test_resp.py / test_s3.py."""

import os
import signal

import pytest

from support.data import keys_for, random_payloads
from support.redis_servers import REDIS, Redis, resp_json
from support.s3_servers import S3Server, s3_json, start_s3
from support.server import l2_status, wait_for

KiB = 1 << 10
HDR = 512  # the object header in front of every value / object


class RedisTier:
    kind, prefix = "resp", "t@"

    def __init__(self, srv):
        self.srv = srv

    def spec(self, **kw):
        return resp_json(self.srv, **kw)

    def names(self):
        return self.srv.keys("t@*")

    def get(self, name):
        return self.srv.cmd("GET", name)

    def put(self, name, value):
        self.srv.cmd("SET", name, value)

    def before_stop(self):
        pass


class S3Tier:
    kind, prefix = "s3", "t/"

    def __init__(self, srv):
        self.srv = srv

    def spec(self, **kw):
        return s3_json(self.srv, **kw)

    def names(self):
        return self.srv.objects("t/")

    def get(self, name):
        with open(self.srv.object_file(name), "rb") as f:
            return f.read()

    def put(self, name, value):
        with open(self.srv.object_file(name), "wb") as f:
            f.write(value)

    def before_stop(self):
        if not isinstance(self.srv, S3Server):
            return
        # a file that is not an object keeps the directory: s3rver answers
        # 500 when concurrent deletes empty a directory (its store removes
        # empty directories racily; real S3 has no directories)
        with open(os.path.join(self.srv.dir, self.srv.bucket, "t", "keep"), "w") as f:
            f.write("x")


@pytest.fixture(params=["resp", "s3", "s3-versitygw"])
def tier(request, tmp_path):
    if request.param == "resp":
        if REDIS is None:
            pytest.skip("redis-server is not installed")
        d = tmp_path / "redis"
        d.mkdir()
        srv = Redis(d).start()
        t = RedisTier(srv)
    else:
        srv = start_s3("s3rver" if request.param == "s3" else "versitygw", tmp_path)
        t = S3Tier(srv)
    yield t
    srv.kill()


def name_of(tier, keys, i):
    return [n for n in tier.names() if keys.hashes[i].hex() in n][0]


def test_round_trip_and_restart(make_server, tier):
    """Values carry the object header; after a SIGKILL of kvtier the start-up
    scan restores the accounting before any lookup, and the bytes match."""
    s = make_server(["--l2-adapter", tier.spec()])
    keys = keys_for("org/model", 16)
    pay = random_payloads(16, 300 * KiB, seed=1)
    with s.client() as c:
        assert c.store(keys, pay) == 16
        c.flush()
        a = c.status()["l2"][0]
    names = tier.names()
    assert len(names) == 16 and all(n.startswith(tier.prefix) for n in names)
    assert all(any(h.hex() in n for n in names) for h in keys.hashes)
    v = tier.get(names[0])
    assert v[:8] == b"KVTOBJ1\n" and len(v) == HDR + 300 * KiB
    assert a["used_bytes"] == 16 * (HDR + 300 * KiB) and a["counters"]["store_ok"] == 16
    assert a["is_healthy"]
    if tier.kind == "resp":
        assert a["connected"]
    else:
        assert a["requests"]["put"] == 16 and a["circuit_breaker"]["state"] == "closed"
    s.kill(signal.SIGKILL)
    s.start()
    b = s.wait_recovered()["l2"][0]
    assert b["recovery"]["objects"] == 16 and b["used_bytes"] == a["used_bytes"]
    assert b["counters"]["lookups"] == 0
    with s.client() as c:
        assert c.lookup(keys) == 16
        assert c.retrieve(keys) == pay
    if tier.kind == "s3":
        b = l2_status(s)
        assert b["requests"]["head"] == 16 and b["requests"]["get"] == 16


def test_two_servers_share_one_store(make_server, tier):
    """A chunk stored through one kvtier server is a hit through another;
    another cache salt names other objects."""
    s1 = make_server(["--l2-adapter", tier.spec()])
    s2 = make_server(["--l2-adapter", tier.spec()])
    keys = keys_for("shared", 8, salt="tenant-a")
    pay = random_payloads(8, 100 * KiB, seed=3)
    with s1.client() as c:
        assert c.store(keys, pay) == 8
        c.flush()
    with s2.client() as c:
        assert c.lookup(keys) == 8
        assert c.retrieve(keys) == pay
        assert c.lookup(keys_for("shared", 8, salt="tenant-b")) == 0
    assert l2_status(s2)["counters"]["secondary_hits"] == 8


def test_cap_holds_after_restart(make_server, tier):
    """max_capacity_gb is a hard cap that the restored accounting keeps:
    stores issued at once after a restart wait for the start-up scan and
    are refused over the cap."""
    cap_gb = 6.5 * (64 * KiB + HDR) / 2**30  # room for 6
    s = make_server(["--l2-adapter", tier.spec(max_capacity_gb=cap_gb)])
    keys = keys_for("cap", 14)
    pay = random_payloads(14, 64 * KiB, seed=10)
    with s.client() as c:
        for i in range(8):
            c.store(keys[i:i + 1], pay[i:i + 1])
        c.flush()
        a = c.status()["l2"][0]
    assert a["objects"] == 6 and a["counters"]["rejected_writes"] == 2
    s.kill()
    s.start()
    with s.client() as c:
        for i in range(8, 14):
            c.store(keys[i:i + 1], pay[i:i + 1])
        c.flush()
        a = c.status()["l2"][0]
    assert a["recovery"]["objects"] == 6 and a["objects"] == 6
    assert a["counters"]["rejected_writes"] == 6 and a["used_bytes"] <= a["capacity_bytes"]
    assert len(tier.names()) == 6


def test_corrupt_object_is_a_miss_and_removed(make_server, tier):
    """One payload byte flipped (only the checksum can tell): the prefix is
    cut there, the corruption is counted and the object removed."""
    s = make_server(["--l2-adapter", tier.spec()])
    keys = keys_for("bad", 6)
    pay = random_payloads(6, 32 * KiB, seed=9)
    with s.client() as c:
        assert c.store(keys, pay) == 6
        c.flush()
    s.kill()
    victim = name_of(tier, keys, 2)
    v = bytearray(tier.get(victim))
    v[HDR + 1000] ^= 0x40
    tier.put(victim, bytes(v))
    s.start()
    s.wait_recovered()
    with s.client() as c:
        assert c.lookup(keys) == 2
        assert c.retrieve(keys) == pay[:2]
        a = c.status()["l2"][0]
    assert a["counters"]["corrupt"] == 1
    wait_for(lambda: victim not in tier.names(), what="the corrupt object to be removed", timeout=30)
    assert len(tier.names()) == 5


def test_persist_enabled_false_deletes_at_close(make_server, tier):
    s = make_server(["--l2-adapter", tier.spec(persist_enabled=False)])
    keys = keys_for("gone", 30)
    with s.client() as c:
        assert c.store(keys, random_payloads(30, 4 * KiB, seed=13)) == 30
        c.flush()
    assert len(tier.names()) == 30
    tier.before_stop()
    assert s.stop() == 0
    assert tier.names() == []
    what = "removed 30 keys" if tier.kind == "resp" else "deleted 30 objects"
    assert "persist_enabled is false: " + what in s.read_log()
