"""Several kvtier servers ("nodes") on one L2, the workload of
tests/integration/test_shared_l2.py and of the Redis Cluster case in
test_resp_cluster.py: shared_workload() stores, loads and deletes the same
keys from one thread per server (a wrong byte or a failed request raises),
check_nodes() checks that the nodes found each other's chunks."""

import hashlib
import random
import threading
import time

from support.data import keys_for
from support.server import l2_status

KiB = 1 << 10


def payload(i):
    """Key i's bytes: its own content and its own length."""
    seed = hashlib.sha256(b"shared-l2 %d" % i).digest()
    n = 24 * KiB + i * 1024
    return (seed * (n // 32 + 1))[:n]


def shared_workload(servers, seconds=8.0, nkeys=40, model="shared-l2"):
    """Run store/load/delete from one thread per server; returns the
    totals. Raises on a wrong byte or a failed request."""
    keys = keys_for(model, nkeys)
    want = [payload(i) for i in range(nkeys)]
    errors, tally = [], {"store": 0, "hit": 0, "miss": 0, "delete": 0}
    lock = threading.Lock()
    deadline = time.time() + seconds

    def run(t, srv):
        rnd = random.Random(t)
        try:
            with srv.client(timeout_ms=20000) as c:
                while time.time() < deadline and not errors:
                    i = rnd.randrange(nkeys)
                    k = keys[i:i + 1]
                    op = rnd.random()
                    if op < 0.45:
                        c.store(k, [want[i]])
                        what = "store"
                    elif op < 0.85:
                        got = c.retrieve(k)
                        if got and got[0] != want[i]:
                            errors.append("server %d: key %d came back with %d wrong bytes" % (
                                t, i, len(got[0])))
                        what = "hit" if got else "miss"
                    else:
                        c.delete(k)
                        what = "delete"
                    with lock:
                        tally[what] += 1
        except Exception as e:  # a failed request fails the test
            errors.append("server %d: %r" % (t, e))

    threads = [threading.Thread(target=run, args=(t, s)) for t, s in enumerate(servers)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    # afterwards every server agrees with the bytes
    for s in servers:
        with s.client() as c:
            for i in range(nkeys):
                got = c.retrieve(keys[i:i + 1])
                assert not got or got[0] == want[i], "key %d" % i
    return tally


def check_nodes(servers, tally):
    st = [l2_status(s) for s in servers]
    assert tally["hit"] > 0 and tally["store"] > 0 and tally["delete"] > 0, tally
    # the nodes found chunks others had stored
    assert sum(a["counters"]["secondary_hits"] for a in st) > 0, [a["counters"] for a in st]
    assert st[0]["counters"]["evictions"] > 0, st[0]["counters"]
    return st


# Small L1s, so that loads go to the shared tier; stores go to L1 and L2.
L1 = ["--l1-size-gb", "0.02", "--l1-init-size-gb", "0.02"]
EVICT = {"eviction_policy": "LRU", "trigger_watermark": 0.8, "eviction_ratio": 0.3}
