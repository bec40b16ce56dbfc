"""resp adapter in Redis Cluster mode ("cluster": true) against a real
6-node cluster (3 masters, 3 replicas) that this module starts once on
loopback: keys spread over every master, a master SIGKILLed under load
(failover), a reshard under load (MOVED/ASK), the cap and the start-up
scan across all masters, and config errors."""

import json
import signal
import subprocess
import threading
import time

import pytest

import kvtier
from support.data import keys_for, random_payloads
from support.redis_servers import CLI, REDIS, cluster_ports, start_cluster
from support.server import l2_status, run_kvtier, wait_for
from support.shared_l2 import EVICT, L1, check_nodes, shared_workload

pytestmark = pytest.mark.skipif(REDIS is None or CLI is None,
                                reason="redis-server / redis-cli are not installed")
KiB = 1 << 10
MiB = 1 << 20
HDR = 512


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory)
    yield c
    c.stop()


def cl_json(cluster, prefix, **kw):
    s = cluster.seed()
    others = [n for n in cluster.nodes if n is not s and n.alive()][:2]
    spec = dict(type="resp", host="127.0.0.1", port=s.port, cluster=True, key_prefix=prefix,
                nodes=["127.0.0.1:%d" % n.port for n in others], request_timeout=2.0,
                connection_timeout=1.0)
    spec.update(kw)
    return json.dumps(spec)


def keys_on_masters(cluster, prefix):
    return {m.port: len(m.cmd("KEYS", prefix + "@*")) for m in cluster.masters()}


def check_prefix(got, want):
    """A retrieve's result is a prefix of what was stored, byte for byte."""
    assert len(got) <= len(want)
    for i, g in enumerate(got):
        assert bytes(g) == want[i], "wrong bytes for key %d" % i


def store_96(server, model, seed):
    """96 keys of 8 KiB stored and flushed through server: (keys, payloads)."""
    keys = keys_for(model, 96)
    pay = random_payloads(96, 8 * KiB, seed=seed)
    with server.client() as c:
        assert c.store(keys, pay) == 96
        c.flush()
    return keys, pay


def test_store_load_spread_over_masters(make_server, cluster):
    """Many keys over all slots: stored through one kvtier, looked up and
    loaded through another (its L1 is empty: every byte comes from the
    cluster), each master holds a share, batches go one pipeline per node."""
    spec = cl_json(cluster, "spread")
    s1 = make_server(["--l2-adapter", spec])
    s2 = make_server(["--l2-adapter", spec])
    s2.wait_recovered()
    keys, pay = store_96(s1, "spread", 11)
    a = l2_status(s1)
    assert a["cluster"] is True and a["cluster_masters"] == 3 and a["slot_map_refreshes"] >= 1
    assert a["objects"] == 96
    # one pipelined round trip per master (3), not one per key
    assert a["round_trips"] <= 6, a["round_trips"]
    per = keys_on_masters(cluster, "spread")
    assert sum(per.values()) == 96 and all(v > 0 for v in per.values()), per
    with s2.client() as c:
        assert c.lookup(keys) == 96
        got = c.retrieve(keys)
    assert len(got) == 96
    check_prefix(got, pay)
    assert l2_status(s2)["counters"]["secondary_hits"] == 96


def replica_gets(cluster):
    """GET calls served by the replicas (INFO commandstats)."""
    total = 0
    for n in cluster.nodes:
        if n.alive() and not n.is_master():
            v = n.info("commandstats").get("cmdstat_get", "")
            total += int(v.split("calls=")[1].split(",")[0]) if "calls=" in v else 0
    return total


def test_read_from_replicas(make_server, cluster):
    """"read_from_replicas": true: loads go to a replica of each slot's
    master (connections opened READONLY), stores to the masters. A replica
    SIGKILLed: the loads it would have served are asked of its master in
    the same request: every key comes back, byte for byte."""
    s1 = make_server(["--l2-adapter", cl_json(cluster, "rr")])
    s2 = make_server(["--l2-adapter", cl_json(cluster, "rr", read_from_replicas=True)])
    s2.wait_recovered()
    keys, pay = store_96(s1, "rr", 12)
    for m in cluster.masters():  # every replica has the values
        assert m.cmd("WAIT", 1, 5000) == 1
    # the node asked for the slot map may not have heard of every replica
    # yet: the adapter reads the map again until each master has one
    wait_for(lambda: l2_status(s2)["cluster_nodes_known"] >= 6, what="the replicas in the map")
    before = replica_gets(cluster)
    with s2.client() as c:
        got = c.retrieve(keys)
    assert len(got) == 96
    check_prefix(got, pay)
    a = l2_status(s2)
    assert a["read_from_replicas"] is True and a["replica_loads"] == 96, a
    served = replica_gets(cluster) - before
    assert served >= 96, served  # the replicas served them (not the masters)
    # a replica dies: its master serves its slots' loads
    victim = next(n for n in cluster.nodes if n.alive() and not n.is_master())
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait(timeout=30)
    try:
        s3 = make_server(["--l2-adapter", cl_json(cluster, "rr", read_from_replicas=True)])
        s3.wait_recovered()
        with s3.client() as c:
            got = c.retrieve(keys)
        assert len(got) == 96
        check_prefix(got, pay)
        b = l2_status(s3)
        assert b["replica_fallbacks"] > 0 and b["counters"]["load_ok"] == 96, b
    finally:
        victim.start()  # rejoins as the replica it was
        cluster.wait_ok()


def test_cap_and_restart_recovers_from_every_master(make_server, cluster):
    """The cap holds across the whole cluster; a kvtier restart SCANs every
    master and recovers the same accounting."""
    obj = 64 * KiB
    cap_gb = 40 * (obj + HDR) / (1 << 30)  # room for 40 objects
    spec = cl_json(cluster, "cap", max_capacity_gb=cap_gb)
    s = make_server(["--l2-store-policy", "skip_l1", "--l2-adapter", spec])
    s.wait_recovered()
    keys = keys_for("cap", 60)
    pay = random_payloads(60, obj, seed=12)
    with s.client() as c:
        c.store(keys, pay)
        c.flush()
    a = l2_status(s)
    assert a["objects"] == 40 and a["used_bytes"] == 40 * (obj + HDR), a
    assert sum(keys_on_masters(cluster, "cap").values()) == 40
    assert a["counters"]["store_failed"] == 20
    s.restart()
    st = s.wait_recovered()["l2"][0]
    assert st["objects"] == 40 and st["used_bytes"] == 40 * (obj + HDR), st
    assert st["recovery"]["objects"] == 40
    with s.client() as c:  # still full: nothing more goes in
        c.store(keys_for("cap2", 4), random_payloads(4, obj, seed=13))
        c.flush()
    assert l2_status(s)["objects"] == 40


def test_delete_and_persist_false_unlink_on_each_node(make_server, cluster):
    """delete UNLINKs each key on its own master; persist_enabled: false
    removes the rest from every master at shutdown."""
    s = make_server(["--l2-adapter", cl_json(cluster, "gone", persist_enabled=False)])
    keys = keys_for("gone", 30)
    with s.client() as c:
        assert c.store(keys, random_payloads(30, 4 * KiB, seed=14)) == 30
        c.flush()
        assert sum(keys_on_masters(cluster, "gone").values()) == 30
        c.delete(keys[20:])
    wait_for(lambda: sum(keys_on_masters(cluster, "gone").values()) == 20, what="deletes")
    assert s.stop() == 0
    assert sum(keys_on_masters(cluster, "gone").values()) == 0
    assert "persist_enabled is false: removed 20 keys from the cluster" in s.read_log()


def test_three_servers_one_cluster(make_server, cluster):
    """Three kvtier servers on the cluster (one evicting under a small cap)
    store, load and delete the same keys at once: a load is a miss or the
    key's own bytes, and the servers find each other's chunks
    (test_shared_l2.py has the workload, and the bucket and directory
    cases)."""
    servers = [make_server(L1 + ["--l2-adapter", cl_json(cluster, "three", max_capacity_gb=0.0005,
                                                          eviction=EVICT)])] + \
        [make_server(L1 + ["--l2-adapter", cl_json(cluster, "three")]) for _ in range(2)]
    for s in servers:
        s.wait_recovered()
    check_nodes(servers, shared_workload(servers))


def test_three_servers_shared_budget(make_server, cluster):
    """"shared_budget": three servers store, load and delete over one key
    space through the cluster while one is SIGKILLed and restarted: the
    values' bytes (summed on every master by one Lua script each) never go
    over the one cap they share (the workload is support/shared_budget.py;
    test_shared_budget.py has the directory and single-Redis cases)."""
    from support.shared_budget import CAP, CAP_GB, EVICT as SB_EVICT, killed_run, redis_value_bytes
    spec = cl_json(cluster, "sb", max_capacity_gb=CAP_GB, shared_budget=True, eviction=SB_EVICT)
    masters = cluster.masters()
    measure = lambda: redis_value_bytes(masters, "sb")  # noqa: E731
    # the killed server's entry lives out its lease: 4 entries
    _, real, _ = killed_run(make_server, spec, measure, "redis cluster", nodes=4,
                            model="sb-cluster")
    assert real <= CAP
    # the record is one hash on the master owning its slot
    holders = [m for m in masters if m.cmd("EXISTS", "kvtier:budget:sb") == 1]
    assert len(holders) == 1


def test_bad_config(cluster):
    base = {"type": "resp", "host": "127.0.0.1", "port": cluster.seed().port, "cluster": True}
    r = run_kvtier("server", "--dry-run", "--l2-adapter", json.dumps(dict(base, database_id=3)))
    assert r.returncode == 2 and '"database_id" must be 0 in cluster mode' in r.stderr, r.stderr
    r = run_kvtier("server", "--dry-run", "--l2-adapter",
                   json.dumps(dict(base, nodes=["nohost"])))
    assert r.returncode == 2 and '"nodes" entries must be' in r.stderr, r.stderr
    r = run_kvtier("server", "--dry-run", "--l2-adapter",
                   json.dumps(dict(base, cluster=False, nodes=["h:1"])))
    assert r.returncode == 2 and '"nodes" is for cluster mode only' in r.stderr, r.stderr
    r = run_kvtier("server", "--dry-run", "--l2-adapter",
                   json.dumps(dict(base, cluster=False, read_from_replicas=True)))
    assert r.returncode == 2 and '"read_from_replicas" is for cluster mode only' in r.stderr, \
        r.stderr
    r = run_kvtier("server", "--dry-run", "--l2-adapter",
                   json.dumps(dict(base, read_from_replicas="yes")))
    assert r.returncode == 2 and '"read_from_replicas"' in r.stderr, r.stderr
    ok = run_kvtier("server", "--dry-run", "--l2-adapter",
                    json.dumps(dict(base, nodes=["127.0.0.1:1"])))
    assert ok.returncode == 0, ok.stderr
    a = json.loads(ok.stdout)["l2_adapters"][0]
    assert a["cluster"] is True and a["nodes"] == ["127.0.0.1:1"]
    assert a["read_from_replicas"] is False


def test_unreachable_seeds(make_server, tmp_path):
    """No seed answers: kvtier serves with the adapter down, as for one
    unreachable server."""
    p1, p2 = cluster_ports(2)
    s = make_server(["--l2-adapter", json.dumps(
        {"type": "resp", "host": "127.0.0.1", "port": p1, "cluster": True,
         "nodes": ["127.0.0.1:%d" % p2], "connection_timeout": 0.5})])
    a = l2_status(s)
    assert a["is_healthy"] is False and a["connected"] is False
    assert "not connected" in a["health"]


def _store_load_loop(s1, s2, stop, errors, stats, tag):
    """Store fresh keys through s1, read them back through s2: every byte
    returned must be right. Misses are allowed, and so is a request that
    fails with an error (a key whose node died between lookup and load);
    wrong bytes are not."""
    i = 0
    try:
        with s1.client(timeout_ms=20000) as c1, s2.client(timeout_ms=20000) as c2:
            while not stop.is_set():
                keys = keys_for("%s%d" % (tag, i), 16, seed=i)
                pay = random_payloads(16, 16 * KiB, seed=1000 + i)
                i += 1
                try:
                    c1.store(keys, pay)
                    c1.flush()
                    got = c2.retrieve(keys)
                except kvtier.KvtierError as e:
                    stats["failed"] += 1
                    stats["last_failure"] = repr(e)
                    continue
                check_prefix(got, pay)
                stats["loads"] += 1
                stats["hits"] += len(got)
    except Exception as e:  # reported by the test
        errors.append(e)


def _run_loop(make_server, cluster, prefix, tag, action):
    spec = cl_json(cluster, prefix, num_workers=2)
    s1 = make_server(["--l2-store-policy", "skip_l1", "--l2-adapter", spec])
    s2 = make_server(["--l2-adapter", spec])
    s2.wait_recovered()
    stop, errors, stats = threading.Event(), [], {"loads": 0, "hits": 0, "failed": 0}
    th = threading.Thread(target=_store_load_loop, args=(s1, s2, stop, errors, stats, tag))
    th.start()
    try:
        wait_for(lambda: stats["loads"] >= 3 or errors, what="the loop to run")
        action()
        n0 = stats["loads"]
        wait_for(lambda: stats["loads"] >= n0 + 5 or errors, timeout=30, what="loads after")
    finally:
        stop.set()
        th.join(timeout=60)
    assert not errors, (errors, stats)
    return s1, s2, stats


def test_reshard_under_load(make_server, cluster):
    """500 slots move between masters while a loop stores and loads: no
    wrong bytes, the adapter follows MOVED (and ASK while slots migrate)."""
    def reshard():
        ms = cluster.masters()
        src, dst = ms[0], ms[1]
        r = subprocess.run([CLI, "--cluster", "reshard", "127.0.0.1:%d" % src.port,
                            "--cluster-from", src.myid(), "--cluster-to", dst.myid(),
                            "--cluster-slots", "500", "--cluster-yes"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        cluster.wait_ok()
    s1, s2, stats = _run_loop(make_server, cluster, "rs", "rs", reshard)
    a1, a2 = l2_status(s1), l2_status(s2)
    assert a1["moved_redirects"] + a2["moved_redirects"] > 0, (a1, a2)
    assert a1["is_healthy"] and a2["is_healthy"]
    assert stats["hits"] > 0


def test_master_killed_failover(make_server, cluster):
    """A master SIGKILLed under load: its replica takes over; loads return
    the right bytes or miss, never wrong ones, and the adapter is healthy
    once the cluster is (stores land on the new master)."""
    victim = {}

    def kill():
        m = cluster.masters()[0]
        victim["n"] = m
        m.proc.send_signal(signal.SIGKILL)
        m.proc.wait(timeout=30)
        cluster.replicas_synced = False
        cluster.wait_ok(timeout=40)
    s1, s2, stats = _run_loop(make_server, cluster, "fo", "fo", kill)
    def recovered(s):
        a = l2_status(s)
        return a["is_healthy"] and a["cluster_masters_down"] == 0
    wait_for(lambda: recovered(s1) and recovered(s2), timeout=20, what="healthy after failover")
    # every key round-trips once the adapter has the new map: a few rounds
    # at most (a worker's connection to the dead node may still be failing
    # its first request); a wrong byte fails at once in any round
    brief = ("cluster_masters", "cluster_masters_down", "slot_map_refreshes", "moved_redirects",
             "last_error", "counters")
    deadline, rnd, got = time.time() + 15, 0, []
    while True:
        keys = keys_for("fo-after%d" % rnd, 32)
        pay = random_payloads(32, 4 * KiB, seed=77 + rnd)
        rnd += 1
        with s1.client() as c:
            stored = c.store(keys, pay)
            c.flush()
        with s2.client() as c:
            got = c.retrieve(keys)
        check_prefix(got, pay)
        if stored == 32 and len(got) == 32:
            break
        assert time.time() < deadline, (rnd, stored, len(got), stats,
                                        [{k: l2_status(s).get(k) for k in brief} for s in (s1, s2)])
        time.sleep(0.5)
    assert l2_status(s1)["cluster_masters"] == 3
    victim["n"].start()  # rejoins as a replica of its successor
    cluster.replicas_synced = True
    cluster.wait_ok()
