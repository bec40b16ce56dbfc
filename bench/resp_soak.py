#!/usr/bin/env python3
"""A longer soak of the Redis tier's faults than CI runs: the fault suite
(tests/integration/test_resp_faults.py: a redis-server and a 3-master +
3-replica Redis Cluster stalled, killed, restarted without persistence,
under steady verified load) run several rounds with stalls of --stall-s
seconds, and one table of what it measured.

    bench/resp_soak.py [--rounds 3] [--stall-s 20] [--bin build/kvtier]
                       [--sanitizer address|thread]

Needs redis-server and redis-cli, and a built tree (build/kvtier,
build/libkvtier_client.so). Each round starts its own servers; a round
takes about a minute plus twice --stall-s. Prints one line per fault and
round, then the table: per fault the worst time to fail (from the fault
until status said so), the worst time to recover (from the node's return
until status said so; for a failover, from the kill), wrong bytes (all
rounds) and crashes (rounds whose kvtier server died or logged a sanitizer
report, or whose checks failed)."""

import argparse
import collections
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

TIER = {"standalone-stall": "resp (one server)"}


def run_round(args, env):
    cmd = [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
           os.path.join(ROOT, "tests", "integration", "test_resp_faults.py")]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    faults = []
    for ln in r.stdout.splitlines():
        m = re.match(r"FAULT (\S+) (.*)", ln)
        if m:
            faults.append((m.group(1), dict(kv.split("=", 1) for kv in m.group(2).split())))
            print(ln, flush=True)
    failed = re.findall(r"^FAILED (\S+)", r.stdout, re.M)
    for f in failed:
        print("FAILED", f, flush=True)
    if r.returncode not in (0, 1):
        print(r.stdout[-4000:], r.stderr[-4000:], file=sys.stderr)
    return faults, failed


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--stall-s", type=float, default=20.0)
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "kvtier"))
    ap.add_argument("--lib", default=os.path.join(ROOT, "build", "libkvtier_client.so"))
    ap.add_argument("--sanitizer", choices=("address", "thread"))
    args = ap.parse_args()
    env = dict(os.environ, KVTIER_BIN=os.path.abspath(args.bin),
               KVTIER_LIB=os.path.abspath(args.lib), KVT_FAULT_STALL_S=str(args.stall_s))
    if args.sanitizer:
        env["KVTIER_SANITIZER"] = args.sanitizer
    rows = collections.OrderedDict()
    for rnd in range(args.rounds):
        print("round %d/%d (stalls of %.0f s)" % (rnd + 1, args.rounds, args.stall_s), flush=True)
        faults, failed = run_round(args, env)
        for name, kv in faults:
            row = rows.setdefault(name, {"fail": 0.0, "recover": 0.0, "wrong": 0, "verified": 0,
                                         "runs": 0, "crashes": 0})
            row["fail"] = max(row["fail"], float(kv.get("t_fail", 0)))
            row["recover"] = max(row["recover"], float(kv.get("t_recover", 0)))
            row["wrong"] += int(kv.get("wrong", 0))
            row["verified"] += int(kv.get("verified", 0))
            row["runs"] += 1
        for f in failed:
            name = f.split("::")[-1]
            rows.setdefault(name, {"fail": 0.0, "recover": 0.0, "wrong": 0, "verified": 0,
                                   "runs": 0, "crashes": 0})["crashes"] += 1
    print()
    print("| tier | fault | runs | time to fail (worst) | time to recover (worst) | "
          "objects verified | wrong bytes | crashes or failed checks |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        print("| %s | %s | %d | %.2f s | %.2f s | %d | %d | %d |" % (
            TIER.get(name, "resp (cluster)"), name, r["runs"], r["fail"], r["recover"],
            r["verified"], r["wrong"], r["crashes"]))
    return 1 if any(r["crashes"] or r["wrong"] for r in rows.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
