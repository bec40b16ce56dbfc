#!/usr/bin/env python3
"""What "shared_budget": true costs a store, side by side in one run: one
kvtier server stores N objects of 4 KiB straight to L2
(--l2-store-policy skip_l1, through the C client) on the same tier with and
without a shared budget, ROUNDS rounds each, alternating, and prints the
rates and their ratio. Tiers: a shared directory (nixl_store_dynamic
"shared": true), one Redis (when redis-server is installed), one versitygw
bucket (when make test-servers built it).

  KVTIER_BIN=build/kvtier KVTIER_LIB=build/libkvtier_client.so \\
      python3 bench/shared_budget_cost.py [N] [ROUNDS]

The cap is large (no eviction): this measures the record steps (one per
chunk of credit: a sixty-fourth of the cap, at most 4 MiB, so about one per
1 000 objects of 4 KiB) and, on S3, the conditional PUT (If-None-Match: *).
Last line: RESULT shared_budget <tier>=<ratio> ... (rate with / without)."""

import json
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the test harness (tests/support) and the kvtier module, as pytest.ini's pythonpath
sys.path[:0] = [os.path.join(ROOT, "tests"), os.path.join(ROOT, "python")]

from support.data import keys_for  # noqa: E402
from support.redis_servers import REDIS, Redis  # noqa: E402
from support.s3_servers import VERSITYGW, VersityGw, s3_json  # noqa: E402
from support.server import Server  # noqa: E402

N = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
CAP_GB = 8.0
ARGS = ["--l2-store-policy", "skip_l1", "--l1-size-gb", "0.05", "--l1-init-size-gb", "0.05"]


def run_once(workdir, spec, tag):
    s = Server(ARGS + ["--l2-adapter", json.dumps(spec)], workdir)
    s.start()
    try:
        s.wait_recovered()
        keys = keys_for("cost-%s" % tag, N)
        vals = [os.urandom(4096) for _ in range(N)]
        with s.client(shm=False, timeout_ms=60000) as c:
            t0 = time.perf_counter()
            for i in range(0, N, 16):
                c.store(keys[i:i + 16], vals[i:i + 16])
            c.flush()
            secs = time.perf_counter() - t0
        return N / secs
    finally:
        s.stop()


def tiers(root):
    out = []
    d = os.path.join(root, "shared-dir")
    os.makedirs(d)
    out.append(("directory", None,
                lambda: {"type": "nixl_store_dynamic", "backend": "POSIX", "shared": True,
                         "backend_params": {"file_path": d, "max_capacity_gb": CAP_GB}}))
    if REDIS:
        rd = os.path.join(root, "redis")
        os.makedirs(rd)
        r = Redis(rd).start()
        out.append(("redis", r, lambda: {"type": "resp", "host": "127.0.0.1", "port": r.port,
                                         "key_prefix": "cost", "max_capacity_gb": CAP_GB}))
    if os.access(VERSITYGW, os.X_OK):
        sd = os.path.join(root, "s3")
        os.makedirs(sd)
        g = VersityGw(sd).start()
        out.append(("s3", g, lambda: dict(json.loads(s3_json(g, key_prefix="cost")),
                                          max_capacity_gb=CAP_GB)))
    return out


def main():
    results = {}
    with tempfile.TemporaryDirectory(prefix="kvt-sbcost-") as root:
        for name, proc, spec_of in tiers(root):
            rates = {False: [], True: []}
            try:
                for rnd in range(ROUNDS):
                    for shared in (False, True):  # alternating, same tier
                        spec = spec_of()
                        if shared:
                            spec["shared_budget"] = True
                        rate = run_once(root, spec, "%s-%d-%d" % (name, rnd, shared))
                        rates[shared].append(rate)
                        print("%-9s round %d %-14s %9.0f objects/s" % (
                            name, rnd, "shared_budget" if shared else "plain", rate), flush=True)
            finally:
                if proc is not None:
                    proc.kill()
            best = {k: max(v) for k, v in rates.items()}
            results[name] = best[True] / best[False]
            print("%-9s best of %d: plain %.0f, shared_budget %.0f objects/s: %.2fx" % (
                name, ROUNDS, best[False], best[True], results[name]), flush=True)
    print("RESULT shared_budget " + " ".join("%s=%.2f" % kv for kv in results.items()))


if __name__ == "__main__":
    main()
