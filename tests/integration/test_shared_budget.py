"""Three kvtier servers sharing one L2 with "shared_budget": true hold one
byte cap together (l2/budget.h, docs/remote-tiers.md "Two kvtier servers
sharing one L2"): a shared directory (nixl_store_dynamic and fs with
"shared": true, the record a locked file in it) and one Redis (the record a
hash; the Redis Cluster case is in test_resp_cluster.py). Each server's
thread stores, loads and deletes keys of one key space at once, so the tier
fills and every server evicts; one server is SIGKILLed mid-run and started
again. A sampler measures the tier's real bytes all along: the object files'
sizes, or the values' STRLEN summed by one Lua script (an atomic snapshot).
The documented consistency allows none over the cap: an object's bytes are
charged before it is written and subtracted after it is gone."""

import json
import os
import re
import socket
import threading
import time

import pytest

from support.data import adapter_json, keys_for
from support.redis_servers import REDIS, Redis
from support.server import l2_status, run_kvtier, wait_for
from support.shared_budget import (CAP, CAP_GB, EVICT, HDR, L1, Sampler, budget, dir_object_bytes,
                                   file_bytes, final_recount, killed_run, payload, recounted_after,
                                   redis_value_bytes, stored_server, workload)

KiB = 1 << 10


def dir_spec(kind, d, **kw):
    if kind == "nixl_store_dynamic":
        return adapter_json(type="nixl_store_dynamic", backend="POSIX", shared=True,
                            shared_budget=True, eviction=EVICT,
                            backend_params={"file_path": str(d), "max_capacity_gb": CAP_GB}, **kw)
    return adapter_json(type="fs", base_path=str(d), shared=True, shared_budget=True,
                        max_capacity_gb=CAP_GB, eviction=EVICT, **kw)


@pytest.mark.parametrize("kind", ["nixl_store_dynamic", "fs"])
def test_three_servers_one_directory(make_server, tmp_path, kind):
    d = tmp_path / "hf3fs"
    d.mkdir()
    measure = lambda: dir_object_bytes(d)  # noqa: E731
    servers, _, _ = killed_run(make_server, dir_spec(kind, d), measure, kind)
    assert os.path.exists(d / ".kvtier-budget")
    final_recount(servers, measure)


def test_without_shared_budget_each_server_caps_only_itself(make_server, tmp_path):
    """The same run without "shared_budget": each server caps what it
    stored, so together they hold more than one cap (the sampler sees it)."""
    d = tmp_path / "hf3fs"
    d.mkdir()
    spec = adapter_json(type="nixl_store_dynamic", backend="POSIX", shared=True, eviction=EVICT,
                        backend_params={"file_path": str(d), "max_capacity_gb": CAP_GB})
    servers = [make_server(L1 + ["--l2-adapter", spec]) for _ in range(3)]
    for s in servers:
        s.wait_recovered()
    sampler = Sampler(lambda: dir_object_bytes(d))
    sampler.start()
    workload(servers, 4.0)
    peak = sampler.finish()
    print("\nwithout shared_budget: peak %d bytes of objects, cap %d (%+d)" % (peak, CAP, peak - CAP))
    assert peak > CAP
    assert "shared_budget" not in l2_status(servers[0])
    assert not os.path.exists(d / ".kvtier-budget")


@pytest.mark.skipif(REDIS is None, reason="redis-server is not installed")
def test_three_servers_one_redis(make_server, tmp_path):
    rd = tmp_path / "redis"
    rd.mkdir()
    r = Redis(rd).start()
    try:
        spec = adapter_json(type="resp", host="127.0.0.1", port=r.port, key_prefix="sb",
                            max_capacity_gb=CAP_GB, shared_budget=True, eviction=EVICT)
        measure = lambda: redis_value_bytes([r], "sb")  # noqa: E731
        # the killed server's entry lives out its 30 s lease: 4 entries
        servers, _, b = killed_run(make_server, spec, measure, "redis", nodes=4)
        # the record, a hash beside the data
        rec = r.cmd("HGETALL", "kvtier:budget:sb")
        fields = dict(zip(rec[::2], rec[1::2]))
        assert int(fields[b"total"]) == b[0]["total_bytes"]
        assert int(fields[b"cap"]) == int(CAP_GB * (1 << 30))
        assert sum(1 for f in fields if f.startswith(b"t:")) == 4
        # the dead server's pending (its writes in flight when it died)
        # counts until its lease ends: the recount is exact but for them
        dead = sum(int(v) for f, v in fields.items() if f.startswith(b"q:"))
        final_recount(servers, measure, extra=dead)
        # SET ... NX: a key another server stored is adopted, not rewritten
        st = [l2_status(s) for s in servers]
        assert sum(a["counters"]["store_skipped"] for a in st) > 0
    finally:
        r.kill()


def bucket_object_bytes(srv, prefix):
    """Bytes of the objects under prefix in versitygw's bucket directory (an
    object is a file; its staging directories and the budget record are
    not objects)."""
    # dot-files: the record, versitygw's link-then-rename names
    return file_bytes(os.path.join(srv.dir, srv.bucket, prefix), lambda f: not f.startswith("."),
                      skip_dot_dirs=True)


def record_pending(path):
    """Sum of the entries' pending bytes in a budget record file (brec.h:
    128-byte header, 64-byte entries: id, part, pending, ...)."""
    with open(path, "rb") as f:
        buf = f.read()
    assert len(buf) == 4096 and buf[:8] == b"KVTBUDG1"
    total = 0
    for i in range(62):
        e = buf[128 + 64 * i:128 + 64 * (i + 1)]
        if int.from_bytes(e[0:8], "little"):
            total += int.from_bytes(e[16:24], "little")
    return total


def test_three_servers_one_bucket(make_server, tmp_path):
    """The same run on a real S3 server (versitygw): the record is the
    object "sb/.kvtier-budget" written with conditional PUTs, stores are
    If-None-Match: *, and each removal is claimed (HEAD, PUT If-Match of an
    empty marker) so that one server subtracts it."""
    from support.s3_servers import s3_json, start_s3
    srv = start_s3("versitygw", tmp_path)
    try:
        spec = s3_json(srv, key_prefix="sb", max_capacity_gb=CAP_GB, shared_budget=True,
                       eviction=EVICT)
        measure = lambda: bucket_object_bytes(srv, "sb")  # noqa: E731
        # the killed server's entry lives out its 30 s lease: 4 entries
        servers, _, b = killed_run(make_server, spec, measure, "s3 (versitygw)", nodes=4)
        assert b[0]["record"].endswith("/sb/.kvtier-budget"), b[0]
        st = [l2_status(s) for s in servers]
        claims = [a["removal_claims"] for a in st]
        assert sum(c["won"] for c in claims) > 0, claims
        # If-None-Match: a key another server stored is not written again
        assert sum(a["counters"]["store_skipped"] for a in st) > 0
        # the others stop first: their eviction cycles, driven by a total
        # that still holds the dead server's pending, would evict between
        # the measure and the walk
        for s in servers[1:]:
            s.stop()
        rec = os.path.join(srv.dir, srv.bucket, "sb", ".kvtier-budget")
        final_recount(servers, measure, extra=record_pending(rec))
    finally:
        srv.kill()


@pytest.mark.skipif(REDIS is None, reason="redis-server is not installed")
def test_redis_record_lost_is_made_full_then_recounted(make_server, tmp_path):
    """The record vanishes while a server uses it (an eviction policy, a
    FLUSHALL of that key): made again as full (nothing over the cap while
    the truth is unknown), then the SCAN the server starts recounts it."""
    rd = tmp_path / "redis"
    rd.mkdir()
    r = Redis(rd).start()
    try:
        spec = adapter_json(type="resp", host="127.0.0.1", port=r.port, key_prefix="gone",
                            max_capacity_gb=CAP_GB, shared_budget=True)
        s, _, stored = stored_server(make_server, spec, "gone", 6)
        real = redis_value_bytes([r], "gone")
        assert real == stored
        b0 = budget(s)
        assert b0["total_bytes"] == real
        assert r.cmd("DEL", "kvtier:budget:gone") == 1
        b = wait_for(lambda: recounted_after(s, b0), what="the recount after the record was lost")
        assert b["total_bytes"] == real, b
        assert "was gone" in s.read_log()
        # the record made again was recounted (it starts with recounts 0)
        rec = r.cmd("HMGET", "kvtier:budget:gone", "total", "recounts")
        assert int(rec[0]) == real and int(rec[1]) >= 1, rec
    finally:
        r.kill()


def test_metrics_and_status_show_the_record(make_server, tmp_path):
    d = tmp_path / "shared"
    d.mkdir()
    servers = [make_server(["--l2-adapter", dir_spec("nixl_store_dynamic", d)]) for _ in range(2)]
    for s in servers:
        s.wait_recovered()
    keys = keys_for("metrics", 4)
    with servers[0].client() as c:
        c.store(keys, [payload(i) for i in range(4)])
        c.flush()
    stored = sum(HDR + len(payload(i)) for i in range(4))
    # server 1 reads the record at its next periodic step
    b = wait_for(lambda: (lambda x: x if x["total_bytes"] == stored else None)(budget(servers[1])),
                 what="the total through the other server")
    assert b["nodes"] == 2 and b["node_bytes"] == 0
    b0 = budget(servers[0])
    assert b0["node_bytes"] == stored and b0["record"] == "file:%s/.kvtier-budget" % d
    code, text = servers[0].http_get("/metrics")
    assert code == 200
    assert 'kvtier_l2_shared_budget_bytes{adapter="nixl_store_dynamic[0]"} %d' % stored in text
    assert 'kvtier_l2_shared_budget_node_bytes{adapter="nixl_store_dynamic[0]"} %d' % stored in text
    assert 'kvtier_l2_shared_budget_nodes{adapter="nixl_store_dynamic[0]"} 2' in text
    # server 1 deletes server 0's objects: the total drops, server 1's part
    # goes negative (it removed what another stored)
    with servers[1].client() as c:
        assert len(c.retrieve(keys)) == 4  # found in the directory: adopted
        assert c.delete(keys) == 4
    b1 = wait_for(lambda: (lambda x: x if x["total_bytes"] == 0 else None)(budget(servers[1])),
                  what="the removals")
    assert b1["node_bytes"] == -stored
    # a server that stops leaves the record: its part folds into the total
    servers[0].stop()
    b1 = wait_for(lambda: (lambda x: x if x["nodes"] == 1 else None)(budget(servers[1])),
                  what="the census after a stop")
    assert b1["total_bytes"] == 0


def test_server_outside_the_budget_is_warned(make_server, tmp_path):
    """A server sharing the directory without "shared_budget" where the
    others keep a record: its stores would not count, and it says so."""
    d = tmp_path / "shared"
    d.mkdir()
    a = make_server(["--l2-adapter", dir_spec("nixl_store_dynamic", d)])
    a.wait_recovered()
    spec = adapter_json(type="nixl_store_dynamic", backend="POSIX", shared=True,
                        backend_params={"file_path": str(d), "max_capacity_gb": CAP_GB})
    b = make_server(["--l2-adapter", spec])
    b.wait_recovered()
    assert "has no \"shared_budget\": what it stores is not counted" in b.read_log()
    assert "not counted" not in a.read_log()


def shut(*socks):
    """Close connections for good (both directions at once)."""
    for x in socks:
        try:
            x.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        x.close()


class Proxy(threading.Thread):
    """A TCP proxy on a free loopback port in front of 127.0.0.1:port: a
    thread per connection runs serve(client socket, server socket)."""

    def __init__(self, port):
        super().__init__(daemon=True)
        self.to = port
        self.ls = socket.socket()
        self.ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.ls.bind(("127.0.0.1", 0))
        self.ls.listen(16)
        self.port = self.ls.getsockname()[1]
        self.armed = threading.Event()

    def run(self):
        while True:
            try:
                c, _ = self.ls.accept()
            except OSError:
                return
            threading.Thread(target=self.serve_one, args=(c,), daemon=True).start()

    def serve_one(self, c):
        try:
            s = socket.create_connection(("127.0.0.1", self.to))
        except OSError:  # the server is gone (the test is ending)
            shut(c)
            return
        self.serve(c, s)

    def close(self):
        self.ls.close()


class BreakingProxy(Proxy):
    """A TCP proxy that, once armed, forwards the next request containing
    `trigger` (by default a pipelined SET ... NX to Redis; for S3 a PUT of
    the budget record, whose body it keeps forwarding for `linger` seconds)
    and closes the connection without passing the reply on: the request
    ran, its client never learns it."""

    def __init__(self, port, trigger=b"$2\r\nNX\r\n", linger=0.0):
        super().__init__(port)
        self.trigger = trigger
        self.linger = linger
        self.broke = threading.Event()

    def serve(self, c, s):
        drop = threading.Event()
        threading.Thread(target=self.down, args=(s, c, drop), daemon=True).start()
        self.up(c, s, drop)

    def up(self, c, s, drop):
        buf = b""
        try:
            while True:
                d = c.recv(1 << 16)
                if not d:
                    break
                hit = self.trigger in buf + d
                buf = (buf + d)[-256:]
                if self.armed.is_set() and hit:
                    drop.set()
                    s.sendall(d)
                    end = time.time() + self.linger  # the rest of its body
                    c.settimeout(0.02)
                    while time.time() < end:
                        try:
                            d = c.recv(1 << 16)
                        except socket.timeout:
                            continue
                        if not d:
                            break
                        s.sendall(d)
                    time.sleep(0.3)  # the server runs it and replies into the void
                    self.armed.clear()
                    self.broke.set()
                    break
                s.sendall(d)
        except OSError:
            pass
        shut(c, s)

    def down(self, s, c, drop):
        try:
            while True:
                d = s.recv(1 << 16)
                if not d or drop.is_set():
                    break
                c.sendall(d)
        except OSError:
            pass


def test_bucket_record_lost_is_made_full_then_recounted(make_server, tmp_path):
    """The record object vanishes under a running server (removed by hand,
    a lifecycle rule): the next step makes it again as full (nothing over
    the cap while the truth is unknown), and the server lists the bucket
    again to recount it."""
    from support.s3_servers import s3_json, start_s3
    srv = start_s3("versitygw", tmp_path)
    try:
        spec = s3_json(srv, key_prefix="gone", max_capacity_gb=CAP_GB, shared_budget=True)
        s, _, stored = stored_server(make_server, spec, "gone", 6)
        real = bucket_object_bytes(srv, "gone")
        assert real == stored
        b0 = budget(s)
        assert b0["total_bytes"] == real
        os.unlink(os.path.join(srv.dir, srv.bucket, "gone", ".kvtier-budget"))
        b = wait_for(lambda: recounted_after(s, b0), what="the recount after the record was lost")
        assert b["total_bytes"] == real, b
        assert b["recount"]["walked_bytes"] == real, b
        assert "the record is gone" in s.read_log()
        with s.client() as c:  # stores go on
            assert c.store(keys_for("gone-after", 1), [payload(7)]) == 1
    finally:
        srv.kill()


def test_bucket_record_step_whose_answer_was_lost_counts_once(make_server, tmp_path):
    """A PUT of the bucket record lands but its answer is lost (the proxy
    closes the connection): the server cannot tell whether its step went
    in. Applied again, a removal would be subtracted twice (an under-count);
    the step's tag in the server's entry says it landed, so it is not."""
    from support.s3_servers import s3_json, start_s3
    srv = start_s3("versitygw", tmp_path)
    proxy = BreakingProxy(srv.port, trigger=b"PUT /kvtier-test/lost/.kvtier-budget HTTP",
                          linger=0.3)
    proxy.start()
    try:
        spec = s3_json(srv, s3_endpoint="127.0.0.1:%d" % proxy.port, key_prefix="lost",
                       max_capacity_gb=CAP_GB, shared_budget=True)
        # one eviction cycle in 10 s: no periodic step gets in between
        s, keys, stored = stored_server(make_server, spec, "lost", 3,
                                        args=["--eviction-interval-ms", "10000"])
        assert bucket_object_bytes(srv, "lost") == stored
        assert budget(s)["total_bytes"] == stored
        proxy.armed.set()
        with s.client() as c:
            assert c.delete(keys[:1]) == 1  # its removal step: landed, answer lost
        assert proxy.broke.wait(5)
        left = stored - HDR - len(payload(0))
        assert bucket_object_bytes(srv, "lost") == left
        b = budget(s)
        assert b["total_bytes"] == left, b  # subtracted once
        assert b["removed_bytes"] == HDR + len(payload(0)), b
        assert "its answer was lost, and it had landed" in s.read_log()
    finally:
        proxy.close()
        srv.kill()


class HoldingProxy(Proxy):
    """A TCP proxy that, once armed, keeps the next request matching
    `pattern` (read whole, by its Content-Length), closes its connection
    without an answer, refuses any other matching request the same way
    while it holds one, and sends the kept request to the server only when
    release() is called: a write its client gave up on lands later."""

    def __init__(self, port, pattern):
        super().__init__(port)
        self.pattern = re.compile(pattern)
        self.held = None
        self.holding = threading.Event()

    @staticmethod
    def read_request(c, buf, body=True):
        """One whole request or answer from c (buf: bytes read already;
        body False: a HEAD's answer, whose Content-Length has no body):
        (it, the rest), or (None, b"") at EOF."""
        while b"\r\n\r\n" not in buf:
            d = c.recv(1 << 16)
            if not d:
                return None, b""
            buf += d
        head, _, rest = buf.partition(b"\r\n\r\n")
        m = re.search(rb"(?im)^content-length:\s*(\d+)", head)
        n = int(m.group(1)) if m and body else 0
        while len(rest) < n:
            d = c.recv(1 << 16)
            if not d:
                return None, b""
            rest += d
        return head + b"\r\n\r\n" + rest[:n], rest[n:]

    def serve(self, c, s):
        buf = b""
        try:
            while True:
                req, buf = self.read_request(c, buf)
                if req is None:
                    break
                if self.armed.is_set() and self.pattern.match(req):
                    if self.held is None:
                        self.held = req
                        self.holding.set()
                    break  # closed without an answer
                s.sendall(req)
                resp, _ = self.read_request(s, b"", body=not req.startswith(b"HEAD "))
                if resp is None:
                    break
                c.sendall(resp)
        except OSError:
            pass
        shut(c, s)

    def release(self):
        """Send the kept request to the server; its HTTP status."""
        self.armed.clear()
        with socket.create_connection(("127.0.0.1", self.to)) as s:
            s.sendall(self.held)
            resp, _ = self.read_request(s, b"")
        return int(resp.split(b" ", 2)[1])


def record_total(path):
    """The total of a budget record file (brec.h: at byte 16)."""
    with open(path, "rb") as f:
        buf = f.read()
    assert len(buf) == 4096 and buf[:8] == b"KVTBUDG1"
    return int.from_bytes(buf[16:24], "little", signed=True)


def test_unanswered_store_that_lands_after_a_recount_stays_counted(make_server, tmp_path):
    """A store's PUT gets no answer (the proxy closes the connection), but
    the S3 server has the whole request and runs it later: after another
    server's start-up listing recounted the tier. Its bytes stay pending
    (status unsure_bytes) for KVT_BUDGET_UNSURE_HOLD_S, so that recount
    counts them; settled at once, as before, the recount would leave them
    out and the total would fall below the tier's bytes when it lands."""
    from support.s3_servers import s3_json, start_s3
    srv = start_s3("versitygw", tmp_path)
    # a data object's PUT (not the record, a dot name)
    proxy = HoldingProxy(srv.port, rb"PUT /kvtier-test/late/[^.]")
    proxy.start()
    big = 200 * KiB  # more than a credit chunk (cap/64): no credit can hide it
    try:
        spec = dict(type="s3", key_prefix="late", max_capacity_gb=CAP_GB, shared_budget=True)
        a = make_server(L1 + ["--l2-adapter",
                              s3_json(srv, s3_endpoint="127.0.0.1:%d" % proxy.port, **spec)])
        a.wait_recovered()
        proxy.armed.set()
        key = keys_for("late", 1)
        with a.client() as c:
            assert c.store(key, [b"\x5a" * big]) == 1  # L1 took it; L2's write goes unanswered
            c.flush()
        assert proxy.holding.wait(10)
        want = HDR + big
        b = wait_for(lambda: (lambda x: x if x["credit_bytes"] == 0 and x["unsure_bytes"] else None)
                     (budget(a)), what="the unsure write and no credit")
        assert b["unsure_bytes"] == want and b["inflight_bytes"] == want, b
        assert b["node_pending_bytes"] == want, b
        assert bucket_object_bytes(srv, "late") == 0
        # another server starts: its listing recounts a tier without the object
        s = make_server(L1 + ["--l2-adapter", s3_json(srv, **spec)])
        s.wait_recovered()
        rb = budget(s)
        assert rb["recount"]["count"] == 1 and rb["recount"]["walked_bytes"] == 0, rb
        assert rb["total_bytes"] >= want, rb  # a's pending write is counted
        assert proxy.release() == 200  # it lands now
        real = bucket_object_bytes(srv, "late")
        assert real == want
        total = record_total(os.path.join(srv.dir, srv.bucket, "late", ".kvtier-budget"))
        assert total >= real, (total, real)
    finally:
        proxy.close()
        srv.kill()


@pytest.mark.skipif(REDIS is None, reason="redis-server is not installed")
def test_resent_set_nx_is_not_refunded(make_server, tmp_path):
    """A SET ... NX that ran on Redis but whose reply was lost is sent
    again on a new connection and answers nil: the value found is our own
    write, so its bytes stay charged (settled, not refunded), or the
    total would fall under the tier's bytes."""
    rd = tmp_path / "redis"
    rd.mkdir()
    r = Redis(rd).start()
    proxy = BreakingProxy(r.port)
    proxy.start()
    try:
        # one worker: the second store goes over the first one's connection
        spec = adapter_json(type="resp", host="127.0.0.1", port=proxy.port, key_prefix="resend",
                            max_capacity_gb=CAP_GB, shared_budget=True, num_workers=1)
        s = make_server(["--l2-adapter", spec])
        s.wait_recovered()
        keys = keys_for("resend", 2)
        with s.client() as c:
            c.store(keys[:1], [payload(0)])
            c.flush()
            proxy.armed.set()  # the store's connection is a used one: retried once
            c.store(keys[1:], [payload(1)])
            c.flush()
        assert proxy.broke.is_set()
        real = redis_value_bytes([r], "resend")
        assert real == sum(HDR + len(payload(i)) for i in range(2))
        st = l2_status(s)
        assert st["counters"]["store_skipped"] == 1, (st["counters"], s.read_log()[-3000:])
        # once the credit went back: the total still holds both values, and
        # the resent one stays in flight and pending (unsure: it might have
        # been another's, or land later) for KVT_BUDGET_UNSURE_HOLD_S
        b = wait_for(lambda: (lambda x: x if x["credit_bytes"] == 0 and
                              x["inflight_bytes"] == x["unsure_bytes"] else None)(budget(s)),
                     what="the credit to go back")
        assert b["unsure_bytes"] == HDR + len(payload(1)), b
        assert b["node_pending_bytes"] == b["unsure_bytes"], b
        assert b["total_bytes"] >= real, (b, real)
    finally:
        proxy.close()
        r.kill()


def _dry(spec, *args):
    return run_kvtier("server", "--dry-run", *args, "--l2-adapter", json.dumps(spec))


def test_bad_config(tmp_path):
    d = str(tmp_path / "d")
    nd = {"type": "nixl_store_dynamic", "backend": "POSIX", "shared": True, "shared_budget": True,
          "backend_params": {"file_path": d, "max_capacity_gb": 1}}
    ok = _dry(nd)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["l2_adapters"][0]["shared_budget"] is True
    # without the key nothing changes in the resolved config
    plain = dict(nd)
    del plain["shared_budget"]
    assert "shared_budget" not in json.loads(_dry(plain).stdout)["l2_adapters"][0]
    cases = [
        (dict(nd, shared_budget="yes"), '"shared_budget" must be true or false (got "yes")'),
        (dict(nd, shared_budget=1), '"shared_budget" must be true or false'),
        (dict(nd, shared=False), '"shared_budget" needs "shared": true'),
        (dict(nd, persist_enabled=False), '"persist_enabled": false'),
        ({"type": "fs", "base_path": d, "shared": True, "shared_budget": True},
         '"shared_budget" needs max_capacity_gb > 0'),
        ({"type": "resp", "host": "127.0.0.1", "shared_budget": True},
         '"shared_budget" needs max_capacity_gb > 0'),
        ({"type": "mock", "max_size_gb": 1, "mock_bandwidth_gb": 1, "shared_budget": True},
         '"shared_budget" is for tiers several servers share'),
        ({"type": "s3", "s3_endpoint": "127.0.0.1:9", "s3_bucket": "b", "s3_region": "r",
          "aws_access_key_id": "a", "aws_secret_access_key": "s", "shared_budget": True},
         '"shared_budget" needs max_capacity_gb > 0'),
        ({"type": "nixl_store", "backend": "AZURE_BLOB", "shared_budget": True,
          "max_capacity_gb": 1, "pool_size": 8,
          "backend_params": {"account_url": "http://127.0.0.1:9/acct", "container_name": "kvc"}},
         '"shared_budget" is not available for Azure Blob yet'),
    ]
    for spec, msg in cases:
        r = _dry(spec)
        assert r.returncode == 2 and msg in r.stderr, (spec, r.returncode, r.stderr)
    # Redis: each eviction cycle renews the server's 30 s lease in the
    # record; an interval too long for it is refused, naming both
    rs = {"type": "resp", "host": "127.0.0.1", "max_capacity_gb": 1, "shared_budget": True}
    s3 = {"type": "s3", "s3_endpoint": "127.0.0.1:9", "s3_bucket": "b", "s3_region": "r",
          "aws_access_key_id": "a", "aws_secret_access_key": "s", "max_capacity_gb": 1,
          "shared_budget": True}
    assert _dry(rs, "--eviction-interval-ms", "10000").returncode == 0
    ok = _dry(s3, "--eviction-interval-ms", "10000")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["l2_adapters"][0]["shared_budget"] is True
    for spec in (rs, dict(rs, type="valkey"), s3):
        r = _dry(spec, "--eviction-interval-ms", "30000")
        assert r.returncode == 2, (spec, r.returncode, r.stderr)
        assert "--eviction-interval-ms" in r.stderr and '"shared_budget"' in r.stderr, r.stderr
    # without shared_budget, or on a directory (locks, no lease), any interval
    plain = dict(rs)
    del plain["shared_budget"]
    assert _dry(plain, "--eviction-interval-ms", "3600000").returncode == 0
    assert _dry(nd, "--eviction-interval-ms", "3600000").returncode == 0


@pytest.mark.parametrize("how", ["unlink", "rename"])
def test_removed_record_does_not_drain_the_index(make_server, tmp_path, how):
    """The record file removed (or renamed away with its link kept, as NFS
    silly-renames a file removed on the same host, and another file put at
    the name) under a running server: every step fails
    (ESTALE) and the total it last read never moves again. The eviction
    controller must not keep evicting on that stale total (each cycle's
    removals fail to be subtracted, so the usage never falls and the index
    would drain); it skips watermark eviction until the record answers,
    and status says the record is unavailable."""
    d = tmp_path / "shared"
    d.mkdir()
    ev = {"eviction_policy": "LRU", "trigger_watermark": 0.5, "eviction_ratio": 0.1}
    args = L1[:4] + ["--eviction-interval-ms", "1000"]
    spec = adapter_json(type="fs", base_path=str(d), shared=True, shared_budget=True,
                        max_capacity_gb=CAP_GB, eviction=ev)
    s = make_server(args + ["--l2-adapter", spec])
    s.wait_recovered()
    keys = keys_for("stale", 20)
    with s.client() as c:  # ~660 KB: over the watermark, under the cap
        c.store(keys, [payload(i) for i in range(20)])
        c.flush()
    if how == "unlink":
        os.unlink(d / ".kvtier-budget")
    else:  # moved away with its link kept (NFS's silly rename), another file at the name
        os.rename(d / ".kvtier-budget", d / ".nfs000000000001")
        (d / "new-record").write_bytes(b"")
        os.rename(d / "new-record", d / ".kvtier-budget")
    before = dir_object_bytes(d)
    assert before > 0.55 * CAP, before  # at most one cycle ran since
    b = wait_for(lambda: (lambda x: x if x["record_state"] == "unavailable" else None)(budget(s)),
                 what="the record to be reported unavailable")
    assert "removed" in b["last_error"], b
    time.sleep(5.0)  # five eviction cycles: 10% each with the stale total
    after = dir_object_bytes(d)
    assert after == before, (before, after)
    assert budget(s)["record_state"] == "unavailable"


def test_redis_record_lost_during_the_scan_is_recounted_again(make_server, tmp_path):
    """The record lost while the start-up SCAN runs: the next step makes
    it again as full and asks for a SCAN. That request must not be lost
    when the running SCAN ends (it began before the record was made, so its
    end cannot make the new record exact): a second SCAN recounts it."""
    rd = tmp_path / "redis"
    rd.mkdir()
    r = Redis(rd).start()
    try:
        # keys under the prefix that are no objects: the SCAN walks them all
        # (about a second per million), which gives the test its window
        for _ in range(6):
            r.cmd("EVAL", "local b = redis.call('DBSIZE') for i = 1, 250000 do "
                  "redis.call('SET', 'mid@junk:' .. (b + i), 'x') end return 0", "0")
        spec = adapter_json(type="resp", host="127.0.0.1", port=r.port, key_prefix="mid",
                            max_capacity_gb=CAP_GB, shared_budget=True)
        s = make_server(L1 + ["--l2-adapter", spec])
        rec = "kvtier:budget:mid"
        wait_for(lambda: r.cmd("EXISTS", rec) == 1, what="the record", timeout=10)
        if l2_status(s)["recovery"]["state"] == "done":
            pytest.skip("the start-up SCAN ended before the record could be removed")
        assert r.cmd("DEL", rec) == 1
        wait_for(lambda: r.cmd("EXISTS", rec) == 1, what="the record made again", timeout=10)
        if l2_status(s)["recovery"]["state"] == "done":
            pytest.skip("the start-up SCAN ended before the record was made again")
        s.wait_recovered(timeout=120)
        b = wait_for(lambda: (lambda x: x if x["recount"]["count"] >= 2 else None)(budget(s)),
                     what="a second recount of the record made during the first", timeout=60)
        assert b["total_bytes"] == 0, b
        assert "was gone" in s.read_log()
    finally:
        r.kill()
