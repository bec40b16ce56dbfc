"""Several kvtier servers ("nodes") on one L2: a real S3 server (versitygw)
and one shared directory (nixl_store_dynamic "shared": true, as on HF3FS);
the Redis Cluster case is in test_resp_cluster.py and uses the same
workload. Three servers store, load and delete the same keys at once from
three threads, one of them also evicting under a small cap: every load
through any server is a miss or the key's own bytes, never another's, and
the servers do find each other's chunks."""

import hashlib
import json
import random
import threading
import time

import pytest

from conftest import adapter_json, keys_for, l2_status
from test_s3 import s3_json, start_s3

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


def test_three_servers_one_bucket(make_server, tmp_path):
    srv = start_s3("versitygw", tmp_path)
    try:
        capped = s3_json(srv, max_capacity_gb=0.0005, eviction=EVICT)  # ~512 KiB: ~15 chunks
        servers = [make_server(L1 + ["--l2-adapter", capped])] + \
            [make_server(L1 + ["--l2-adapter", s3_json(srv)]) for _ in range(2)]
        for s in servers:
            s.wait_recovered()
        tally = shared_workload(servers)
        check_nodes(servers, tally)
    finally:
        srv.kill()


def test_three_servers_one_shared_directory(make_server, tmp_path):
    d = tmp_path / "hf3fs"
    d.mkdir()

    def spec(cap, **kw):
        return adapter_json(type="nixl_store_dynamic", backend="POSIX", shared=True,
                            backend_params={"file_path": str(d), "max_capacity_gb": cap}, **kw)

    servers = [make_server(L1 + ["--l2-adapter", spec(0.0005, eviction=EVICT)])] + \
        [make_server(L1 + ["--l2-adapter", spec(1)]) for _ in range(2)]
    for s in servers:
        s.wait_recovered()
    tally = shared_workload(servers)
    st = check_nodes(servers, tally)
    assert all(a["shared"] for a in st)
