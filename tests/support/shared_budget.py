"""Several kvtier servers under one "shared_budget" byte cap: the workload
of tests/integration/test_shared_budget.py (and the Redis Cluster case of
test_resp_cluster.py). One thread per server stores, loads and deletes
over one key space while a Sampler measures the tier's real bytes;
check_run() holds the documented bounds (never over the cap, each
server's total an upper bound of the tier's bytes), killed_run() runs it
with one server SIGKILLed and started again."""

import hashlib
import os
import random
import threading
import time

from support.data import keys_for
from support.server import l2_status, wait_for

KiB = 1 << 10
MiB = 1 << 20
CAP = 1 * MiB
CAP_GB = CAP / (1 << 30)
HDR = 512  # the object header in front of every payload (no O_DIRECT here)
L1 = ["--l1-size-gb", "0.02", "--l1-init-size-gb", "0.02", "--eviction-interval-ms", "200"]
EVICT = {"eviction_policy": "LRU", "trigger_watermark": 0.8, "eviction_ratio": 0.3}
NKEYS = 160


def payload(i):
    seed = hashlib.sha256(b"budget %d" % i).digest()
    n = 16 * KiB + (i * 7919) % (32 * KiB)
    return (seed * (n // 32 + 1))[:n]


class Sampler(threading.Thread):
    """Calls measure() (-> bytes) until stopped; keeps the maximum."""

    def __init__(self, measure):
        super().__init__(daemon=True)
        self.measure = measure
        self.stop = threading.Event()
        self.max = 0
        self.samples = 0
        self.error = None

    def run(self):
        try:
            while not self.stop.is_set():
                self.max = max(self.max, self.measure())
                self.samples += 1
                time.sleep(0.003)
        except Exception as e:  # reported by the test
            self.error = e

    def finish(self):
        self.stop.set()
        self.join()
        assert self.error is None, self.error
        return self.max


def dir_object_bytes(d):
    """Bytes of the object files under d (tmp files of writes in flight are
    not objects: their bytes are charged as the write's)."""
    return file_bytes(d, lambda f: f.endswith(".bin") or f.endswith(".data"))


def file_bytes(top, counts, skip_dot_dirs=False):
    """Sizes of the files under top whose name counts(name) accepts, as one
    instant's: a walk is not a snapshot (an object counted, then removed,
    and another stored in a directory walked later would both count, where
    the tier never held both), so the walk is taken only when every file it
    counted is still there, unchanged, once it ends -- then they all existed
    together at that moment and their sum is at most the tier's bytes then
    -- and taken again otherwise."""
    for _ in range(1000):
        seen = {}
        for root, dirs, files in os.walk(top):
            if skip_dot_dirs:
                dirs[:] = [x for x in dirs if not x.startswith(".")]
            for f in filter(counts, files):
                p = os.path.join(root, f)
                seen[p] = file_ident(p)
        seen = {p: v for p, v in seen.items() if v}  # removed before its stat
        if all(file_ident(p) == v for p, v in seen.items()):
            return sum(v[1] for v in seen.values())
    raise AssertionError("no walk of %s without a counted file changing in 1000 tries" % top)


def file_ident(path):
    """(inode, size, mtime) of path, None when it is gone."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


SUM_LUA = ("local s = 0 for _, k in ipairs(redis.call('KEYS', ARGV[1])) do "
           "s = s + redis.call('STRLEN', k) end return s")


def redis_value_bytes(nodes, prefix):
    """Sum of the values' lengths under prefix: one read-only Lua script per
    server, an atomic snapshot of it. Of a cluster's masters: every one's
    writes paused first (CLIENT PAUSE WRITE), so that the sums are one
    instant's (the moment the last pause took effect), not an object
    removed on one master after its sum plus one stored on the next."""
    if len(nodes) > 1:
        for n in nodes:
            assert n.cmd("CLIENT", "PAUSE", 2000, "WRITE") == b"OK"
    try:
        total = 0
        for n in nodes:
            r = n.cmd("EVAL_RO", SUM_LUA, 0, prefix + "@*")
            if isinstance(r, Exception):
                raise r
            total += r
        return total
    finally:
        if len(nodes) > 1:
            for n in nodes:
                n.cmd("CLIENT", "UNPAUSE")


def workload(servers, seconds, kill=None, model="budget"):
    """One thread per server: store (batches of 1-3 keys), load, delete over
    one key space. kill=(i, at): server i is SIGKILLed at `at` seconds and
    started again; its thread waits and reconnects. Returns the tally;
    raises on a wrong byte or a failed request of a server not being
    killed."""
    keys = keys_for(model, NKEYS)
    want = [payload(i) for i in range(NKEYS)]
    errors, tally = [], {"store": 0, "hit": 0, "miss": 0, "delete": 0, "reconnect": 0,
                         "killed": 0}
    lock = threading.Lock()
    down = threading.Event()
    t0 = time.time()
    deadline = t0 + seconds

    def run(t, srv):
        rnd = random.Random(t)
        c = None
        while time.time() < deadline and not errors:
            try:
                if c is None:
                    c = srv.client(timeout_ms=10000)
                i = rnd.randrange(NKEYS)
                op = rnd.random()
                if op < 0.55:
                    n = min(NKEYS - i, rnd.randint(1, 3))
                    c.store(keys[i:i + n], want[i:i + n])
                    what = "store"
                elif op < 0.85:
                    got = c.retrieve(keys[i:i + 1])
                    if got and got[0] != want[i]:
                        errors.append("server %d: key %d came back with wrong bytes" % (t, i))
                    what = "hit" if got else "miss"
                else:
                    c.delete(keys[i:i + 1])
                    what = "delete"
                with lock:
                    tally[what] += 1
            except Exception as e:
                if kill and t == kill[0] and (down.is_set() or time.time() >= t0 + kill[1]):
                    if c is not None:
                        c.close()
                    c = None
                    while down.is_set() and time.time() < deadline:
                        time.sleep(0.05)
                    with lock:
                        tally["reconnect"] += 1
                    continue
                errors.append("server %d: %r" % (t, e))
        if c is not None:
            c.close()

    def killer():
        time.sleep(kill[1])
        down.set()
        pid = servers[kill[0]].proc.pid
        servers[kill[0]].kill()
        servers[kill[0]].start()
        assert servers[kill[0]].proc.pid != pid
        tally["killed"] += 1
        down.clear()

    threads = [threading.Thread(target=run, args=(t, s)) for t, s in enumerate(servers)]
    if kill:
        threads.append(threading.Thread(target=killer))
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    return tally


def stored_server(make_server, spec, model, n, args=()):
    """A recovered server on spec that stored keys_for(model, n) with
    payload(i): (server, keys, their bytes with headers)."""
    s = make_server(list(args) + ["--l2-adapter", spec])
    s.wait_recovered()
    keys = keys_for(model, n)
    with s.client() as c:
        c.store(keys, [payload(i) for i in range(n)])
        c.flush()
    return s, keys, sum(HDR + len(payload(i)) for i in range(n))


def budget(server):
    return l2_status(server)["shared_budget"]


def recounted_after(server, before):
    """server's budget status once the recount of a lost record has ended
    (None until then): a recount counted after the status `before` that
    started from the rebuilt record (made again as full: its total before
    the recount at least the cap). The count alone is not enough: a server
    starts with two recounts (the adapter's first SCAN, and the one asked
    for when it created the record), `before` can be read between them, and
    the second then stands in for the recount of the loss (seen in CI: the
    view read after it was the rebuilt record's, cap + this server's part,
    1235969 against 187393). That second one starts from the truth, below
    the cap."""
    x = budget(server)
    rc = x["recount"]
    return x if rc["count"] > before["recount"]["count"] and \
        rc["total_before"] >= x["capacity_bytes"] else None


def settle(servers, what):
    """Wait until no store is queued or in flight and every server reported
    its writes (its periodic step): the record then holds the tier's bytes
    plus only what a crash left over. A view is the record's total at the
    server's last step (status shows it with its age_seconds), so the views
    returned were all taken after the store controllers had drained: one
    from before (its server's last step came before another server's last
    stores were charged; seen in CI: 934915 < 946670, with the other
    servers' views equal to the tier) is older than the tier's last bytes.
    After the drain nothing is charged any more; removals only make the
    tier smaller. One status per server and poll carries both."""
    since = None  # when the controllers were first all seen drained

    def quiet():
        nonlocal since
        views = []
        for s in servers:
            asked = time.time()
            with s.client() as c:
                st = c.status()
            if st["store"]["in_flight_batches"]:
                since = None
                return False
            views.append((asked, st["l2"][0]["shared_budget"]))
        if since is None:
            since = time.time()  # every store charged before this has landed
            return False
        if any(asked - x["age_seconds"] <= since for asked, x in views):
            return False  # a view from before the drain: wait for its server's next step
        b = [x for _, x in views]
        return all(x["inflight_bytes"] == 0 and x["node_pending_bytes"] == 0 for x in b) and b
    time.sleep(1.0)
    return wait_for(quiet, timeout=60, what=what)


def check_run(servers, sampler, measure, tally, tier, nodes=3):
    peak = sampler.finish()
    print("\n%s: %d samples, peak %d bytes of objects, cap %d (%+d); tally %s" % (
        tier, sampler.samples, peak, CAP, peak - CAP, tally))
    assert sampler.samples > 100
    assert tally["store"] > 100 and tally["hit"] > 0 and tally["delete"] > 0, tally
    # the cap held across the servers at every sample
    assert peak <= CAP, "%s held %d bytes over the %d-byte cap" % (tier, peak - CAP, CAP)
    b = settle(servers, "the servers to settle")
    real = measure()
    for x in b:
        assert x["total_bytes"] >= real, (x, real)  # an upper bound, never below
        assert x["nodes"] == nodes, x
        # over the cap only by what the documented over-counts allow: the
        # killed server's writes in flight (at most a batch of 3 x 48 KiB
        # and its credit) and a recount that counted a write landing during
        # its walk twice (charged before, then walked)
        assert 0 < x["usage_fraction"] <= 1.25, x
    st = [l2_status(s) for s in servers]
    assert sum(a["counters"]["evictions"] for a in st) > 0, [a["counters"] for a in st]
    assert sum(a["shared_budget"]["removed_bytes"] for a in st) > 0
    return real, b


def final_recount(servers, measure, idx=0, extra=0):
    """A server restarted with nothing in flight recounts the tier at start:
    the record's total is then exactly the tier's bytes (plus extra: the
    pending bytes of servers presumed alive). The tier is measured with
    every server stopped: a running one still evicts while the record's
    total (an upper bound) is over its watermark, so a measure taken before
    its stop can count objects it then removes (seen under TSan in CI:
    walked 31925 against 67668 measured)."""
    servers[idx].stop()
    real = measure()
    servers[idx].start()
    servers[idx].wait_recovered()
    b = budget(servers[idx])
    assert b["recount"]["count"] == 1 and b["recount"]["walked_bytes"] == real, b
    assert b["total_bytes"] == real + extra, (b, real, extra)
    return b


def killed_run(make_server, spec, measure, tier, nodes=3, model="budget"):
    """Three servers on spec run the workload for 10 s, server 1 SIGKILLed
    at 4 s and started again, under the sampler; check_run's checks, and
    the killed server's successor recounted the tier at its start.
    Returns (servers, real bytes, budget status of each)."""
    servers = [make_server(L1 + ["--l2-adapter", spec]) for _ in range(3)]
    for s in servers:
        s.wait_recovered()
    sampler = Sampler(measure)
    sampler.start()
    tally = workload(servers, 10.0, kill=(1, 4.0), model=model)
    real, b = check_run(servers, sampler, measure, tally, tier, nodes=nodes)
    assert tally["killed"] == 1
    assert b[1]["recount"]["count"] == 1, b[1]
    return servers, real, b
