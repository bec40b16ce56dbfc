"""Faults of the Redis tier under load: a real redis-server and a real
3-master + 3-replica Redis Cluster stalled (SIGSTOP), killed (SIGKILL, with
the cluster's failover) and restarted without persistence, while two client
threads keep a steady verified load on one kvtier server
(support/faultload.py: stores + flushes, lookups + retrieves of every
acknowledged batch from Redis, every byte checked). Each test asserts no wrong byte, the server
alive with no sanitizer report, the time to fail and to recover within the
bounds docs/remote-tiers.md gives ("Faults: what a client sees, and when"),
and what /status, /metrics and /healthz say during and after."""

import json
import os
import re
import signal
import time

import pytest

from support.faultload import Load, slot_of
from support.redis_servers import CLI, REDIS, Redis, start_cluster
from support.server import SANITIZER_MARKERS, SLOW, l2_status, wait_for

pytestmark = pytest.mark.skipif(REDIS is None or CLI is None,
                                reason="redis-server / redis-cli are not installed")

# request_timeout / connection_timeout of the adapter under test; sanitized
# servers run several times slower, so a normal request gets more room
RT = 0.5 if SLOW == 1 else 1.0
# a probe's backoff tops out at 2 s (BACKOFF_MAX_NS), a probe waits at most RT
PROBE_CYCLE = 2.0 + RT
# scheduling slack of the 2-core test machine (sanitized: several times more)
SLACK = 1.0 * SLOW
# how long a stall lasts at least (bench/resp_soak.py sets longer ones)
STALL_S = float(os.environ.get("KVT_FAULT_STALL_S", "0"))
# cluster-node-timeout: a stall of a few seconds (or STALL_S) is no failover
NODE_TIMEOUT_MS = int(max(5.0, STALL_S + 5.0) * 1000)


def hold_stall(t0, load):
    """Keep a stall going until STALL_S after it began (the fault's length,
    not a wait for a state; the load runs on meanwhile)."""
    load.stop_ev.wait(max(0.0, t0 + STALL_S - time.monotonic()))


def adapter(port, prefix, cluster=False, **kw):
    spec = dict(type="resp", host="127.0.0.1", port=port, key_prefix=prefix, num_workers=4,
                request_timeout=RT, connection_timeout=RT, cluster=cluster)
    spec.update(kw)
    return json.dumps(spec)


def kvtier_server(make_server, spec):
    s = make_server(["--l2-store-policy", "skip_l1", "--l2-adapter", spec])
    s.wait_recovered()
    return s


def metrics(server):
    code, text = server.http_get("/metrics")
    assert code == 200
    out = {}
    for ln in text.splitlines():
        if ln and not ln.startswith("#"):
            k, v = ln.rsplit(" ", 1)
            out[k] = float(v)
    return out


def node_metric(m, name, node):
    hits = [v for k, v in m.items() if k.startswith(name + "{") and 'node="%s"' % node in k]
    assert len(hits) == 1, (name, node, sorted(k for k in m if k.startswith(name)))
    return hits[0]


def node_of(st, name):
    hits = [n for n in st["nodes"] if n["node"] == name]
    return hits[0] if hits else None


def assert_alive_and_clean(server):
    assert server.proc.poll() is None, "the kvtier server died:\n" + server.read_log()[-4000:]
    log = server.read_log()
    for m in SANITIZER_MARKERS:
        assert m not in log, log[log.index(m) - 200:][:4000]


def log_lines(server, pattern):
    return [ln for ln in server.read_log().splitlines() if re.search(pattern, ln)]


def timed(pred, timeout, what):
    """wait_for, returning the seconds it took."""
    t0 = time.monotonic()
    wait_for(pred, timeout=timeout, what=what)
    return time.monotonic() - t0


def report(name, **kw):
    """One line per fault for the suite's table (pytest -s shows it)."""
    print("\nFAULT %s %s" % (name, " ".join("%s=%s" % (k, ("%.2f" % v) if isinstance(v, float)
                                                          else v) for k, v in kw.items())))


# ---------------------------------------------------------------- standalone

def test_standalone_stall(make_server, tmp_path):
    """redis-server SIGSTOPped (the kernel still accepts its connections)
    under load: the adapter is down within about one request_timeout
    (/healthz 503, status and metrics name the server, one log line), no
    request waits longer than request_timeout for it (stores fail, lookups
    miss), and after SIGCONT a probe brings it back by itself: every batch
    acknowledged before the stall reads back byte for byte."""
    d = tmp_path / "redis"
    d.mkdir()
    r = Redis(d).start()
    try:
        s = kvtier_server(make_server, adapter(r.port, "st"))
        endpoint = "127.0.0.1:%d" % r.port
        load = Load(s, "stall", ["all"], lambda h: "all").start()
        wait_for(lambda: load.verified >= 40 or load.errors, what="load before the stall")
        load.hold("all")  # batches stored before the stall, read during it
        wait_for(lambda: load.pending() >= 10 or load.errors, what="a backlog to read")
        wall0, t0 = time.time(), time.monotonic()
        r.proc.send_signal(signal.SIGSTOP)
        load.release("all")
        try:
            t_fail = timed(lambda: not l2_status(s)["connected"] or load.errors,
                           RT + SLACK, "the adapter down")
            t_down = time.monotonic()
            code, body = s.http_get("/healthz")
            assert code == 503 and "not connected to %s" % endpoint in body, body
            a = l2_status(s)
            assert a["is_healthy"] is False and a["disconnects"] == 1
            assert "request_timeout" in a["last_error"], a["last_error"]
            assert a["last_error_unix"] >= wall0 - 1
            n = a["nodes"][0]
            assert n["node"] == endpoint and n["role"] == "server" and not n["up"], n
            assert n["downs"] == 1 and n["last_error"] == a["last_error"]
            m = metrics(s)
            assert node_metric(m, "kvtier_l2_node_up", endpoint) == 0
            assert m['kvtier_l2_masters_down{adapter="resp[0]"}'] == 1
            # requests keep coming: they fail at once now
            wait_for(lambda: len(load.since(t_down + 0.2)) >= 10 or load.errors,
                     what="requests during the stall")
            hold_stall(t0, load)
        finally:
            r.proc.send_signal(signal.SIGCONT)
        t1 = time.monotonic()
        t_recover = timed(lambda: l2_status(s)["connected"], PROBE_CYCLE + SLACK,
                          "the adapter back after SIGCONT")
        wait_for(lambda: load.pending(before=t1) == 0 or load.errors, timeout=20 * SLOW,
                 what="every batch acknowledged before SIGCONT read back")
        load.stop()
        fault = load.during(t0, t1)
        worst = max(o.secs for o in fault)
        assert worst <= RT + SLACK, sorted(fault, key=lambda o: -o.secs)[:5]
        after = load.since(t_down + 0.2)
        fast = [o for o in after if o.t1 <= t1]
        assert max(o.secs for o in fast) <= RT / 2 + 0.25 * SLOW, \
            sorted(fast, key=lambda o: -o.secs)[:5]
        assert any(o.op == "flush" and o.got == 0 for o in fault)  # stores failed, counted
        a = l2_status(s)
        assert a["is_healthy"] and a["last_error"] is None and a["nodes"][0]["up"]
        assert a["counters"]["store_failed"] > 0
        assert s.http_get("/healthz")[0] == 200
        assert metrics(s)['kvtier_l2_masters_down{adapter="resp[0]"}'] == 0
        assert len(log_lines(s, r"lost %s" % re.escape(endpoint))) == 1
        assert len(log_lines(s, r"reconnected to %s" % re.escape(endpoint))) == 1
        assert load.wrong_bytes == 0
        assert_alive_and_clean(s)
        report("standalone-stall", t_fail=t_fail, t_recover=t_recover, worst_request=worst,
               verified=load.verified, wrong=load.wrong_bytes)
    finally:
        r.kill()


# ------------------------------------------------------------------- cluster

@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory, extra=["--cluster-node-timeout", str(NODE_TIMEOUT_MS)])
    yield c
    c.stop()


def slot_owners(cluster):
    """slot -> port of the master that serves it."""
    owners = {}
    for lo, hi, master, *_ in cluster.seed().cmd("CLUSTER", "SLOTS"):
        for sl in range(lo, hi + 1):
            owners[sl] = master[1]
    return owners


def cluster_load(make_server, cluster, prefix, **kw):
    """A kvtier server on the cluster and a load whose groups are the
    masters (by port, as the map stood at the start)."""
    s = kvtier_server(make_server, adapter(cluster.seed().port, prefix, cluster=True, **kw))
    # a new cluster's gossip may not have told the node asked for the map of
    # every replica yet: the monitor reads the map again every 5 s
    wait_for(lambda: len(l2_status(s)["nodes"]) == 6, timeout=15, what="6 nodes in the map")
    owners = slot_owners(cluster)
    masters = sorted(set(owners.values()))
    load = Load(s, "f", masters, lambda h: owners[slot_of(prefix, "f", h)])
    return s, load, masters


def test_cluster_master_stall(make_server, cluster):
    """One master SIGSTOPped under load (shorter than cluster-node-timeout:
    no failover): its keys fail within request_timeout and then at once,
    the other masters' keys keep their normal latency, status, metrics and
    the log name the node, /healthz stays 200 and names it; after SIGCONT
    a probe brings it back by itself and every acknowledged batch reads
    back byte for byte."""
    s, load, masters = cluster_load(make_server, cluster, "cs")
    victim = next(n for n in cluster.nodes if n.port == masters[0])
    name = "127.0.0.1:%d" % victim.port
    load.start()
    wait_for(lambda: load.verified >= 80 or load.errors, what="load before the stall")
    load.hold(victim.port)  # its batches stored before the stall, read during it
    wait_for(lambda: load.pending(victim.port) >= 10 or load.errors, what="a backlog to read")
    wall0, t0 = time.time(), time.monotonic()
    victim.proc.send_signal(signal.SIGSTOP)
    load.release(victim.port)
    try:
        t_fail = timed(lambda: l2_status(s)["cluster_masters_down"] == 1 or load.errors,
                       RT + SLACK, "the stalled master marked down")
        t_down = time.monotonic()
        wait_for(lambda: all(len([o for o in load.since(t_down + 0.2, "read", g) if o.got])
                             >= 5 for g in masters[1:]) or load.errors,
                 timeout=10 * SLOW, what="reads of the other masters during the stall")
        wait_for(lambda: len(load.since(t_down + 0.2, "read", victim.port)) >= 3 or load.errors,
                 timeout=10 * SLOW, what="reads of the stalled master's keys")
        a = l2_status(s)
        assert a["is_healthy"] and a["connected"], a["health"]
        assert name in a["health"] and "1 of 3 masters down" in a["health"], (
            a["health"], a["nodes"], {k: v for k, v in a.items() if k.startswith("cluster")})
        assert a["cluster_masters_down"] == 1 and a["cluster_nodes_down"] == 1
        assert name in a["last_error"] and "request_timeout" in a["last_error"], a["last_error"]
        assert a["last_error_unix"] >= wall0 - 1
        n = node_of(a, name)
        assert n and n["role"] == "master" and not n["up"] and n["downs"] == 1, n
        # every other node listed is up (the map re-read during the stall
        # may lack a replica whose gossip the node asked has not caught up
        # with, under a sanitizer's load: it is not down, only unlisted)
        masters_listed = [x for x in a["nodes"] if x["role"] == "master"]
        assert len(masters_listed) == 3 and len(a["nodes"]) >= 5, a["nodes"]
        assert [x["node"] for x in a["nodes"] if not x["up"]] == [name], a["nodes"]
        m = metrics(s)
        assert node_metric(m, "kvtier_l2_node_up", name) == 0
        assert m['kvtier_l2_masters_down{adapter="resp[0]"}'] == 1
        assert s.http_get("/healthz")[0] == 200
        hold_stall(t0, load)
        assert time.monotonic() - t0 < NODE_TIMEOUT_MS / 1000 - 0.5, "the stall ran too long"
    finally:
        victim.proc.send_signal(signal.SIGCONT)
    t1 = time.monotonic()
    t_recover = timed(lambda: l2_status(s)["cluster_masters_down"] == 0, PROBE_CYCLE + SLACK,
                      "the master back after SIGCONT")
    wait_for(lambda: load.pending(before=t1) == 0 or load.errors, timeout=20 * SLOW,
             what="every batch acknowledged before SIGCONT read back")
    load.stop()
    fault = load.during(t0, t1)
    worst = max(o.secs for o in fault)
    assert worst <= RT + SLACK, sorted(fault, key=lambda o: -o.secs)[:5]
    healthy = [o for o in load.since(t_down + 0.2) if o.group != victim.port and o.t1 <= t1]
    assert healthy and all(o.got == o.want for o in healthy if o.op == "read"), healthy[:5]
    normal = max(o.secs for o in healthy)
    assert normal <= RT / 2 + 0.25 * SLOW, sorted(healthy, key=lambda o: -o.secs)[:5]
    hung = [o for o in load.since(t_down + 0.2, group=victim.port) if o.t1 <= t1]
    assert hung and max(o.secs for o in hung) <= RT / 2 + 0.25 * SLOW, hung[:5]
    assert all(o.got == 0 for o in hung if o.op in ("read", "flush")), hung[:5]
    a = l2_status(s)
    assert a["is_healthy"] and a["last_error"] is None and a["cluster_failovers"] == 0
    assert all(x["up"] for x in a["nodes"]) and node_of(a, name)["last_error"] is None
    assert metrics(s)['kvtier_l2_masters_down{adapter="resp[0]"}'] == 0
    assert len(log_lines(s, r"cluster node %s \(master\) is down" % re.escape(name))) == 1
    assert len(log_lines(s, r"cluster node %s \(master\) answers again" % re.escape(name))) == 1
    assert load.wrong_bytes == 0
    assert_alive_and_clean(s)
    report("cluster-master-stall", t_fail=t_fail, t_recover=t_recover, worst_request=worst,
           healthy_worst=normal, verified=load.verified, wrong=load.wrong_bytes)


def test_cluster_all_stalled(make_server, cluster):
    """Every node of the cluster SIGSTOPped under load (shorter than
    cluster-node-timeout): each master is marked down by the first request
    that waits request_timeout for it (this load's batches go to one master
    at a time: one request_timeout per master at most), so the adapter is
    unhealthy (/healthz 503) within a second or two, not 41 s, and every
    later request fails at once; after SIGCONT the probes bring every node
    back by themselves."""
    s, load, masters = cluster_load(make_server, cluster, "as")
    load.start()
    wait_for(lambda: load.verified >= 80 or load.errors, what="load before the stall")
    t0 = time.monotonic()
    for n in cluster.nodes:
        n.proc.send_signal(signal.SIGSTOP)
    try:
        t_fail = timed(lambda: s.http_get("/healthz")[0] == 503 or load.errors,
                       len(masters) * RT + SLACK, "/healthz 503")
        t_down = time.monotonic()
        a = l2_status(s)
        assert a["is_healthy"] is False and a["cluster_masters_down"] == 3, a["health"]
        assert "every master" in a["health"] or "not connected" in a["health"], a["health"]
        assert metrics(s)['kvtier_l2_masters_down{adapter="resp[0]"}'] == 3
        wait_for(lambda: len(load.since(t_down + 0.2)) >= 10 or load.errors,
                 what="requests during the stall")
        hold_stall(t0, load)
        assert time.monotonic() - t0 < NODE_TIMEOUT_MS / 1000 - 0.5, "the stall ran too long"
    finally:
        for n in cluster.nodes:
            n.proc.send_signal(signal.SIGCONT)
    t1 = time.monotonic()
    # the monitor may be in the middle of a map read that waits for each
    # node in turn (a probe's deadline each) when they come back
    t_recover = timed(lambda: (lambda x: x["is_healthy"] and x["cluster_nodes_down"] == 0)(
        l2_status(s)), PROBE_CYCLE + 6 * RT + SLACK, "every node back")
    wait_for(lambda: load.pending(before=t1) == 0 or load.errors, timeout=20 * SLOW,
             what="every batch acknowledged before SIGCONT read back")
    load.stop()
    fault = load.during(t0, t1)
    worst = max(o.secs for o in fault)
    assert worst <= RT + SLACK, sorted(fault, key=lambda o: -o.secs)[:5]
    later = [o for o in load.since(t_down + 0.2) if o.t1 <= t1]
    assert later and max(o.secs for o in later) <= RT / 2 + 0.25 * SLOW, later[:5]
    a = l2_status(s)
    assert a["last_error"] is None and all(x["up"] for x in a["nodes"]), a["nodes"]
    assert s.http_get("/healthz")[0] == 200
    assert load.wrong_bytes == 0
    assert_alive_and_clean(s)
    report("cluster-all-stalled", t_fail=t_fail, t_recover=t_recover, worst_request=worst,
           verified=load.verified, wrong=load.wrong_bytes)


def test_cluster_replica_stall_read_from_replicas(make_server, cluster):
    """"read_from_replicas": the replica that serves a master's loads is
    SIGSTOPped under load. The loads in flight fail within request_timeout
    (their fallback to the master finds the deadline spent: the master is
    not blamed for it and never marked down), the replica is marked down,
    and later loads of those keys go to the master at once and come back
    byte for byte; after SIGCONT the replica is back by itself."""
    s, load, masters = cluster_load(make_server, cluster, "rr", read_from_replicas=True)
    m0 = masters[0]
    rep = next(e[3][1] for e in cluster.seed().cmd("CLUSTER", "SLOTS") if e[2][1] == m0)
    victim = next(n for n in cluster.nodes if n.port == rep)
    name = "127.0.0.1:%d" % rep
    load.start()
    wait_for(lambda: load.verified >= 80 or load.errors, what="load before the stall")
    load.hold(m0)  # its batches stored before the stall, read during it
    wait_for(lambda: load.pending(m0) >= 10 or load.errors, what="a backlog to read")
    t0 = time.monotonic()
    victim.proc.send_signal(signal.SIGSTOP)
    load.release(m0)
    try:
        t_fail = timed(lambda: not (node_of(l2_status(s), name) or {"up": True})["up"]
                       or load.errors, RT + SLACK, "the stalled replica marked down")
        t_down = time.monotonic()
        wait_for(lambda: len([o for o in load.since(t_down + 0.2, "read", m0) if o.got == o.want])
                 >= 5 or load.errors, timeout=10 * SLOW, what="its master serving the loads")
        a = l2_status(s)
        assert a["cluster_masters_down"] == 0 and a["is_healthy"], a["health"]
        assert node_of(a, name)["role"] == "replica" and a["replica_fallbacks"] > 0
        hold_stall(t0, load)
        assert time.monotonic() - t0 < NODE_TIMEOUT_MS / 1000 - 0.5, "the stall ran too long"
    finally:
        victim.proc.send_signal(signal.SIGCONT)
    t1 = time.monotonic()
    t_recover = timed(lambda: node_of(l2_status(s), name)["up"], PROBE_CYCLE + SLACK,
                      "the replica back after SIGCONT")
    wait_for(lambda: load.pending(before=t1) == 0 or load.errors, timeout=20 * SLOW,
             what="every batch acknowledged before SIGCONT read back")
    load.stop()
    fault = load.during(t0, t1)
    worst = max(o.secs for o in fault)
    assert worst <= RT + SLACK, sorted(fault, key=lambda o: -o.secs)[:5]
    later = [o for o in load.since(t_down + 0.2, "read", m0) if o.t1 <= t1]
    assert later and all(o.got == o.want for o in later), later[:5]
    assert max(o.secs for o in later) <= RT / 2 + 0.25 * SLOW, later[:5]
    masters_named = ["127.0.0.1:%d" % p for p in masters]
    assert not [ln for ln in log_lines(s, r"is down") if any(m in ln for m in masters_named)]
    assert len(log_lines(s, r"cluster node %s \(replica\) is down" % re.escape(name))) == 1
    assert load.wrong_bytes == 0
    assert_alive_and_clean(s)
    report("cluster-replica-stall", t_fail=t_fail, t_recover=t_recover, worst_request=worst,
           verified=load.verified, wrong=load.wrong_bytes)


def test_cluster_master_killed_failover(make_server, cluster):
    """A master SIGKILLed under load: it is marked down at once (a refused
    connection needs no timeout), its keys fail at once until its replica
    has taken over (cluster-node-timeout plus an election), then the adapter
    follows the new map by itself: the failover is counted and logged,
    last_error cleared, stores of those slots land again. Acknowledged
    writes the old master had not replicated yet may be lost (Redis
    replication is asynchronous): misses, never wrong bytes. The old master
    started again rejoins as a replica and shows up in the nodes list."""
    s, load, masters = cluster_load(make_server, cluster, "fo")
    victim = next(n for n in cluster.nodes if n.port == masters[1])
    name = "127.0.0.1:%d" % victim.port
    load.start()
    wait_for(lambda: load.verified >= 80 or load.errors, what="load before the kill")
    t0 = time.monotonic()
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait(timeout=30)
    cluster.replicas_synced = False
    try:
        t_fail = timed(lambda: l2_status(s)["cluster_masters_down"] == 1 or load.errors,
                       RT + SLACK, "the killed master marked down")
        a = l2_status(s)
        n = node_of(a, name)
        assert n and n["role"] == "master" and not n["up"], n
        assert name in a["last_error"] and a["is_healthy"], a["last_error"]
        assert "connect" in n["last_error"] or "reset" in n["last_error"].lower(), n
        assert len(log_lines(s, r"cluster node %s \(master\) is down" % re.escape(name))) == 1
        # the replica takes over after cluster-node-timeout: kvtier follows
        t_over = timed(lambda: (lambda x: x["cluster_failovers"] >= 1 and
                                x["cluster_masters_down"] == 0)(l2_status(s)) or load.errors,
                       NODE_TIMEOUT_MS / 1000 + 10 * SLOW, "kvtier to follow the failover")
        t_follow = time.monotonic()
        # stores of the failed master's slots land on its successor again
        wait_for(lambda: any(o.got for o in load.since(t_follow, "flush", victim.port))
                 or load.errors, timeout=5 * SLOW, what="stores of its slots after failover")
        t_recover = time.monotonic() - t0
        a = l2_status(s)
        assert a["is_healthy"] and a["last_error"] is None, a["last_error"]
        assert node_of(a, name) is None  # gone from the map until it rejoins
        m = metrics(s)
        assert m['kvtier_l2_masters_down{adapter="resp[0]"}'] == 0
        assert m['kvtier_l2_failovers_total{adapter="resp[0]"}'] == a["cluster_failovers"] >= 1
        assert len(log_lines(s, r"cluster failover: .*took over from %s" % re.escape(name))) == 1
        fault = load.during(t0, t_follow)
        worst = max(o.secs for o in fault)
        assert worst <= RT + SLACK, sorted(fault, key=lambda o: -o.secs)[:5]
        down = [o for o in load.since(t0 + t_fail + 0.2, group=victim.port) if o.t1 <= t_follow]
        assert down and max(o.secs for o in down) <= RT / 2 + 0.25 * SLOW, down[:5]
        load.stop()
        assert load.wrong_bytes == 0
        assert_alive_and_clean(s)
        report("cluster-master-kill", t_fail=t_fail, t_recover=t_recover,
               t_failover_followed=t_over + t_fail, worst_request=worst,
               verified=load.verified, wrong=load.wrong_bytes)
    finally:
        load.stop_ev.set()
        victim.start()  # rejoins as a replica of its successor
        cluster.replicas_synced = True
        cluster.wait_ok()
    # the map is read every 5 s: the old master shows up as a replica, up
    wait_for(lambda: (lambda n: n and n["role"] == "replica" and n["up"])(
        node_of(l2_status(s), name)), timeout=10 + PROBE_CYCLE + SLACK,
        what="the old master back as a replica")


def keys_on(nodes, prefix):
    return sum(len(n.cmd("KEYS", prefix + "@*")) for n in nodes)


def bytes_on(nodes, prefix):
    return sum(n.cmd("STRLEN", k) for n in nodes for k in n.cmd("KEYS", prefix + "@*"))


def reconciled(s, cluster, prefix):
    """The adapter's accounting equals what the masters hold."""
    a = l2_status(s)
    ms = cluster.masters()
    return a["objects"] == keys_on(ms, prefix) and a["used_bytes"] == bytes_on(ms, prefix)


def test_cluster_master_restarted_empty(make_server, cluster):
    """A master killed and started again at once without persistence (no
    failover: it is back within cluster-node-timeout, as master, empty, and
    its replica follows it): kvtier sees its run_id change when its probe
    gets an answer and reconciles that master's keys: the accounting (and
    so the cap) matches what the cluster holds; the other masters' keys are
    untouched."""
    s, load, masters = cluster_load(make_server, cluster, "re")
    victim = next(n for n in cluster.nodes if n.port == masters[2])
    name = "127.0.0.1:%d" % victim.port
    load.start()
    wait_for(lambda: load.verified >= 80 or load.errors, what="load before the restart")
    before = l2_status(s)["objects"]
    t0 = time.monotonic()
    victim.kill()
    for f in os.listdir(victim.dir):  # no persistence: nothing to load back
        if f.endswith((".rdb", ".aof")):
            os.unlink(os.path.join(victim.dir, f))
    victim.start()
    t_back = timed(lambda: l2_status(s)["swept_after_restart"] > 0 or load.errors,
                   PROBE_CYCLE + 5 * SLOW, "the restarted master reconciled")
    load.stop()
    wait_for(lambda: reconciled(s, cluster, "re"), timeout=10 * SLOW,
             what="the accounting to match the masters")
    t_recover = time.monotonic() - t0
    a = l2_status(s)
    assert a["swept_after_restart"] < before, (a["swept_after_restart"], before)
    assert a["is_healthy"] and a["cluster_failovers"] == 0 and a["last_error"] is None
    assert node_of(a, name)["up"] and node_of(a, name)["role"] == "master"
    assert len(log_lines(s, r"%s \(master\).*reconciling its keys" % re.escape(name))) == 1
    assert load.wrong_bytes == 0
    assert_alive_and_clean(s)
    report("cluster-master-restart-empty", t_fail=0.0, t_recover=t_recover,
           t_reconciled=t_back, swept=a["swept_after_restart"], verified=load.verified,
           wrong=load.wrong_bytes)
    cluster.wait_ok()


def test_cluster_restart_without_persistence(make_server, cluster):
    """The whole cluster SIGKILLed under load and started again without
    persistence (each node keeps its nodes.conf: the same cluster, empty):
    the adapter is down while no node answers (/healthz 503), comes back by
    itself, and reconciles every master: its accounting and the cap match
    what the cluster holds within a bounded time; no wrong byte."""
    obj = 16 << 10
    cap_gb = 100000 * (obj + 512) / (1 << 30)  # a cap: stores wait for the start-up scan
    s, load, masters = cluster_load(make_server, cluster, "cr", max_capacity_gb=cap_gb)
    load.start()
    wait_for(lambda: load.verified >= 80 or load.errors, what="load before the restart")
    t0 = time.monotonic()
    for n in cluster.nodes:
        n.kill()
    t_fail = timed(lambda: not l2_status(s)["is_healthy"] or load.errors, RT + SLACK,
                   "the adapter unhealthy")
    code, body = s.http_get("/healthz")
    assert code == 503 and "resp[0]" in body, body
    for n in cluster.nodes:
        for f in os.listdir(n.dir):
            if f.endswith((".rdb", ".aof")):
                os.unlink(os.path.join(n.dir, f))
        n.start()
    cluster.wait_ok(timeout=60)
    t_ok = time.monotonic()
    wait_for(lambda: l2_status(s)["is_healthy"] or load.errors, timeout=PROBE_CYCLE + 5 * SLOW,
             what="the adapter healthy again")
    wait_for(lambda: any(o.got for o in load.since(t_ok, "flush")) or load.errors,
             timeout=5 * SLOW, what="stores after the restart")
    load.stop()
    t_rec = timed(lambda: reconciled(s, cluster, "cr"), 10 * SLOW,
                  "the accounting to match the masters")
    t_recover = time.monotonic() - t_ok + t_rec
    a = l2_status(s)
    assert a["swept_after_restart"] > 0 and a["is_healthy"] and a["last_error"] is None
    assert a["cluster_masters_down"] == 0 and all(x["up"] for x in a["nodes"]), a["nodes"]
    assert a["used_bytes"] <= a["capacity_bytes"]
    assert load.wrong_bytes == 0
    assert_alive_and_clean(s)
    report("cluster-restart-empty", t_fail=t_fail, t_recover=time.monotonic() - t_ok,
           t_cluster_back=t_ok - t0, swept=a["swept_after_restart"], verified=load.verified,
           wrong=load.wrong_bytes)
