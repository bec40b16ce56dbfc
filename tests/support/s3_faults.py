"""The s3 tier's fault load and checks, shared by the fault suite
(tests/integration/test_s3_faults.py) and its longer runs
(bench/s3_faults.py): a steady verified load on a kvtier server whose L2 is
an S3 server behind the fault proxy (support/faultproxy.py), one fault at a
time, and what every fault must show."""
import random
import re
import signal
import threading
import time

import kvtier
from support.data import keys_for, random_payloads
from support.server import SLOW, l2_status, metric, wait_for

KiB = 1 << 10
RT = 2.0        # request_timeout = connection_timeout (the defaults)
FAULT_S = 4.0   # how long each fault lasts: twice request_timeout
MARGIN = 1.0 * SLOW
CLIENT_TIMEOUT_MS = 20000  # the tests measure; the connector's would be 5000


class Load:
    """Steady verified load, each stream on its own client connection:
      writer   store + flush of fresh keys, about 15 batches a second; a
               batch whose flush reported no failure joins the unread set
      trickle  a store of one key every 50 ms, not waiting for its flush,
               as an engine saves KV while it computes
      readers  an arrival every 100 ms (open loop, as requests reach an
               inference server whatever the earlier ones do) takes an idle
               one of READERS clients: lookup + retrieve of an unread
               batch (so from S3: skip_l1 left it there only), every byte
               checked; otherwise of any flushed batch. Until draining is
               set (the fault starts) RESERVE unread batches are kept, so
               that the fault meets a backlog whatever the rates. An
               arrival that finds every reader busy is dropped (counted)
    ops: (start, end, kind, ok) per request; wrong: wrong bytes."""

    READERS = 16
    RESERVE = 2 * READERS

    def __init__(self, server, nkeys=4, size=64 * KiB):
        self.s, self.nkeys, self.size = server, nkeys, size
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.flushed = []          # (keys, payloads) whose flush reported no failure
        self.unread = []           # of those, the ones no reader took yet
        self.ops = []
        self.wrong = 0
        self.hits = 0
        self.dropped = 0
        self.errors = []           # anything but a KvtierError: the test fails
        self.idle = []             # idle reader clients
        self.rng = random.Random(7)
        self.draining = False
        self.threads = [threading.Thread(target=f, daemon=True)
                        for f in (self._writer, self._trickle, self._arrivals)]

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *a):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in self.threads), "a load thread hangs"
        for c in self.idle:
            c.close()

    def _guard(fn):
        def run(self, *a):
            try:
                fn(self, *a)
            except Exception as e:  # reported by the test
                self.errors.append(repr(e))
        return run

    def _client(self):
        return self.s.client(timeout_ms=CLIENT_TIMEOUT_MS, shm=False)

    def _op(self, kind, f):
        t0 = time.time()
        try:
            v, ok = f(), True
        except kvtier.KvtierError as e:
            v, ok = e, False
        with self.lock:
            self.ops.append((t0, time.time(), kind, ok))
        return v, ok

    def _mark(self, kind):
        with self.lock:
            self.ops.append((time.time(), time.time(), kind, True))

    @_guard
    def _writer(self):
        with self._client() as c:
            i = 0
            while not self.stop.is_set():
                keys = keys_for("w%d" % i, self.nkeys, seed=i)
                pay = random_payloads(self.nkeys, self.size, seed=100000 + i)
                i += 1
                _, ok = self._op("store", lambda: c.store(keys, pay))
                if not ok:
                    continue
                rep, ok = self._op("flush", c.flush)
                if ok and not rep:
                    with self.lock:
                        self.flushed.append((keys, pay))
                        self.unread.append((keys, pay))
                    self._mark("stored")
                self.stop.wait(0.05)

    @_guard
    def _trickle(self):
        with self._client() as c:
            i = 0
            while not self.stop.wait(0.05):
                keys = keys_for("t%d" % i, 1, seed=i)
                i += 1
                self._op("store", lambda: c.store(keys, random_payloads(1, 16 * KiB, seed=i)))

    @_guard
    def _arrivals(self):
        self.idle = [self._client() for _ in range(self.READERS)]
        readers = []
        while not self.stop.wait(0.1):
            with self.lock:
                spare = len(self.unread) > (0 if self.draining else self.RESERVE)
                pool = self.unread if spare else self.flushed
                c = self.idle.pop() if self.idle and pool else None
                if c is not None:
                    batch = pool.pop(self.rng.randrange(len(pool))) if pool is self.unread \
                        else self.rng.choice(pool)
            if c is None:
                self.dropped += bool(pool)
                continue
            t = threading.Thread(target=self._read, args=(c, batch), daemon=True)
            readers = [x for x in readers if x.is_alive()] + [t]
            t.start()
        for t in readers:
            t.join(timeout=60)

    @_guard
    def _read(self, c, batch):
        keys, pay = batch
        try:
            _, ok = self._op("lookup", lambda: c.lookup(keys))
            if not ok:
                return
            got, ok = self._op("retrieve", lambda: c.retrieve(keys))
            if not ok:
                return
            for i, g in enumerate(got):
                if i >= len(pay) or bytes(g) != pay[i]:
                    self.wrong += 1
            with self.lock:
                self.hits += len(got)
            if got:
                self._mark("hit")
        finally:
            with self.lock:
                self.idle.append(c)

    def first_after(self, kind, t):
        with self.lock:
            ends = [e for s, e, k, ok in self.ops if k == kind and ok and s >= t]
        return min(ends) if ends else None

    def slowest(self, t0, t1):
        """The longest request that started in [t0, t1]: (seconds, kind)."""
        with self.lock:
            d = [(e - s, k) for s, e, k, ok in self.ops
                 if t0 <= s <= t1 and k in ("store", "flush", "lookup", "retrieve")]
        return max(d) if d else (0.0, None)


def brk(server):
    return l2_status(server)["circuit_breaker"]


def faults(srv, px):
    """name -> (start, end) of each fault."""
    def stop():
        srv.proc.send_signal(signal.SIGSTOP)

    def cont():
        srv.proc.send_signal(signal.SIGCONT)
    return {
        "hang": (lambda: px.set_mode("hang"), lambda: px.set_mode("pass")),
        "500": (lambda: px.set_mode("500"), lambda: px.set_mode("pass")),
        "reset": (lambda: px.set_mode("reset"), lambda: px.set_mode("pass")),
        "refuse": (lambda: px.set_mode("refuse"), lambda: px.set_mode("pass")),
        "sigstop": (stop, cont),
    }


def run_fault(srv, px, s, name, fault_s=FAULT_S, warm_s=0.0):
    """One fault under load (after warm_s seconds of it without a fault);
    returns the measurements."""
    start, end = faults(srv, px)[name]
    with Load(s) as load:
        # a backlog of unread batches: the readers keep loading from S3
        wait_for(lambda: load.hits >= 8 and len(load.unread) >= Load.RESERVE or load.errors,
                 timeout=30 * SLOW, what="the load to store and read back from S3")
        load.stop.wait(warm_s)
        a0 = l2_status(s)
        assert a0["circuit_breaker"]["state"] == "closed", a0["circuit_breaker"]
        opens0, loads0 = a0["circuit_breaker"]["opens"], a0["counters"]["load_ok"]
        assert loads0 > 0  # the reader's hits came from S3
        load.draining = True
        t_fault = time.time()
        start()
        b = wait_for(lambda: (lambda x: x if x["state"] != "closed" else None)(brk(s)),
                     timeout=4 * RT + 10 * SLOW, what="the breaker to open")
        t_open = time.time()
        # during the fault: what an operator sees
        a = l2_status(s)
        node = a["nodes"][0]
        assert node["role"] == "endpoint" and not node["up"], node
        assert node["state"] in ("down", "probing") and node["breaker"] in ("open", "half_open")
        assert node["last_error"] and node["last_error_unix"] > t_fault - 1, node
        assert node["downs"] == opens0 + 1 and node["down_seconds"] >= 0
        code, body = s.http_get("/healthz")
        assert code == 503 and "circuit open" in body, body
        assert metric(s, "kvtier_l2_node_up", role="endpoint") == 0
        assert metric(s, "kvtier_l2_node_breaker_open", role="endpoint") == 1
        wait_for(lambda: time.time() >= t_fault + fault_s, timeout=fault_s + 60 * SLOW,
                 what="the fault's end")
        opens_during = brk(s)["opens"] - opens0
        t_end = time.time()
        end()
        wait_for(lambda: brk(s)["state"] == "closed", timeout=20 + 10 * SLOW,
                 what="the breaker to close")
        t_closed = time.time()
        stored = wait_for(lambda: load.first_after("stored", t_end), timeout=20 * SLOW,
                          what="a store to land after the fault")
        hit = wait_for(lambda: load.first_after("hit", stored), timeout=20 * SLOW,
                       what="a read after the fault")
        loads1 = l2_status(s)["counters"]["load_ok"]
        wait_for(lambda: l2_status(s)["counters"]["load_ok"] > loads1 or load.errors,
                 timeout=20 * SLOW, what="a load from S3 after the fault")
        slow, slow_kind = load.slowest(t_fault, t_end)
    assert not load.errors, load.errors
    after = l2_status(s)
    node = after["nodes"][0]
    return {
        "fault": name, "detect_s": t_open - t_fault, "slowest_s": slow, "slowest": slow_kind,
        "recover_s": max(stored, t_closed) - t_end, "closed_s": t_closed - t_end,
        "opens": opens_during, "wrong": load.wrong, "hits": load.hits,
        "state": b["state"], "node": node, "after": after, "hit_after": hit - t_end,
    }


def check(s, m, opens0=0):
    """What every fault must show."""
    assert s.proc.poll() is None, "the server died:\n" + s.read_log()[-4000:]
    assert m["wrong"] == 0, m
    assert m["detect_s"] <= RT + MARGIN, m
    assert m["slowest_s"] <= RT + MARGIN, m
    assert m["opens"] == 1, m  # one opening per fault: no flapping
    node = m["node"]
    assert node["up"] and node["state"] == "up" and node["breaker"] == "closed", node
    assert node["last_error"] is None and node["down_seconds"] == 0, node
    assert node["downs"] == m["after"]["circuit_breaker"]["opens"]
    assert m["after"]["circuit_breaker"]["last_error"] is None
    assert metric(s, "kvtier_l2_node_up", role="endpoint") == 1
    assert metric(s, "kvtier_l2_node_downs_total", role="endpoint") == node["downs"]
    assert s.http_get("/healthz")[0] == 200
    log = s.read_log()
    # one line per state change, none per request or probe
    assert len(re.findall(r"circuit open after", log)) == node["downs"], log[-3000:]
    assert len(re.findall(r"circuit closed after", log)) == node["downs"], log[-3000:]
