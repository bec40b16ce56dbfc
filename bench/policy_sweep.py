#!/usr/bin/env python3
"""Offline policy sweep: how far the adaptive default is from the best of
LRU, ARC and LFU, and `value` from LRU, on many (trace, budget) cells.

Generates the traces (bench/gen_trace.py) into a temp dir, runs
`kvtier replay --offline --json --budget-blocks N` on each at 10% and 25% of
its unique blocks (as bench/run.sh replay does), and prints per cell the
offline prefix hit ratios, the gap of adaptive below the best of LRU/ARC/LFU
and value minus LRU (points), then the worst and mean per set.

Sets:
  bench    the 5 traces of bench/run.sh replay (the shared Mooncake trace and
           chat, long-sessions, big-prompts, many-users)
  tuning   seeds 11-16, the traces the mechanism was first tuned on
  check    seeds 51-56, made to check that first mechanism
  fresh    seeds 71-78 and the Mooncake trace at 5, 10, 15, 25 and 40%, made
           only after the 2026-12-02 change (commit batches in the shadows,
           prefix-hit credit, stale lists), never used to choose anything
  random   60 traces (seeds 100-159) with parameters drawn at random from
           wide ranges (skew 0.3-2, 1-20 turns, 32-1500 open sessions, ...):
           the broad sample the 2026-12-02 change was judged on
  held     60 more drawn the same way (seeds 300-359), run only after the
           2026-12-05 change (the order by V as a gated fourth expert of
           adaptive) was chosen, to check it
  late     200 more drawn the same way (seeds 500-599, 700-799), drawn while the
           shadows fed by lookups (2026-12-05, adaptive.c: ad_request) were
           judged: the broad sample that change was chosen on
  scale    40 more parameter draws (seeds 910-949), each generated at 4,000,
           8,000 and 16,000 requests (names n4k-, n8k-, n16k-<seed>), drawn
           2026-12-06 after every choice: how the gap depends on the trace's
           length with the workload fixed (a held-back trace has
           some 180,000 unique blocks, as the 16,000-request ones here)

  bench/policy_sweep.py [--sets bench,tuning,check,fresh,random,held,late,scale] [--bin build/kvtier]
                        [--budgets 10,25] [--json OUT]
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
MOONCAKE = os.environ.get("KVT_TRACE", os.path.join(HERE, "..", "..", "shared", "data",
                                                    "mooncake_synthetic_trace.jsonl"))
REQ = ["--requests", "4000"]

# name -> gen_trace.py arguments (None: the shared Mooncake trace)
SETS = {
    "bench": [
        ("mooncake", None),
        ("chat", ["--seed", "1"] + REQ),
        ("long-sessions", ["--seed", "2", "--skew", "0.6", "--turns", "10", "--turn-blocks", "4"] + REQ),
        ("big-prompts", ["--seed", "3", "--skew", "1.4", "--turns", "2", "--prompt-blocks", "20",
                         "--turn-blocks", "16", "--prompts", "50"] + REQ),
        ("many-users", ["--seed", "4", "--turns", "6", "--open", "256", "--prompts", "1000"] + REQ),
    ],
    "tuning": [
        ("s11", ["--seed", "11", "--skew", "0.8", "--turns", "3", "--open", "64"] + REQ),
        ("s12", ["--seed", "12", "--skew", "1.2", "--turns", "8", "--open", "512", "--prompts", "300"] + REQ),
        ("s13", ["--seed", "13", "--skew", "1.0", "--turns", "4", "--prompt-blocks", "30",
                 "--turn-blocks", "2"] + REQ),
        ("s14", ["--seed", "14", "--skew", "0.5", "--turns", "12", "--open", "128", "--prompts", "2000"] + REQ),
        ("s15", ["--seed", "15", "--skew", "1.6", "--turns", "1", "--prompts", "200"] + REQ),
        ("s16", ["--seed", "16", "--skew", "1.1", "--turns", "5", "--open", "1024", "--prompts", "500",
                 "--turn-blocks", "8"] + REQ),
    ],
    "check": [
        ("s51", ["--seed", "51", "--skew", "0.9", "--turns", "6", "--open", "300", "--prompts", "800"] + REQ),
        ("s52", ["--seed", "52", "--skew", "1.3", "--turns", "3", "--open", "128", "--prompt-blocks", "12"] + REQ),
        ("s53", ["--seed", "53", "--skew", "0.7", "--turns", "9", "--open", "700", "--prompts", "1500",
                 "--turn-blocks", "3"] + REQ),
        ("s54", ["--seed", "54", "--skew", "1.0", "--turns", "2", "--open", "2000", "--prompts", "400"] + REQ),
        ("s55", ["--seed", "55", "--skew", "1.5", "--turns", "6", "--open", "256", "--prompts", "100",
                 "--turn-blocks", "10"] + REQ),
        ("s56", ["--seed", "56", "--skew", "0.6", "--turns", "4", "--open", "64", "--prompts", "5000"] + REQ),
    ],
    "fresh": [
        ("mooncake", None),
        ("s71", ["--seed", "71", "--skew", "1.8", "--turns", "20", "--open", "200", "--prompts", "300",
                 "--turn-blocks", "4"] + REQ),
        ("s72", ["--seed", "72", "--skew", "1.4", "--turns", "15", "--open", "1500", "--prompts", "1000",
                 "--prompt-blocks", "16", "--turn-blocks", "3"] + REQ),
        ("s73", ["--seed", "73", "--skew", "0.4", "--turns", "2", "--open", "32", "--prompts", "3000",
                 "--prompt-blocks", "4"] + REQ),
        ("s74", ["--seed", "74", "--skew", "1.0", "--turns", "30", "--open", "64", "--prompts", "50",
                 "--turn-blocks", "2"] + REQ),
        ("s75", ["--seed", "75", "--skew", "2.0", "--turns", "3", "--open", "400", "--prompts", "600",
                 "--prompt-blocks", "40", "--turn-blocks", "12"] + REQ),
        ("s76", ["--seed", "76", "--skew", "0.8", "--turns", "8", "--open", "3000", "--prompts", "200",
                 "--turn-blocks", "6", "--rate", "20"] + ["--requests", "8000"]),
        ("s77", ["--seed", "77", "--skew", "1.2", "--turns", "25", "--open", "100", "--prompts", "2000",
                 "--prompt-blocks", "24", "--turn-blocks", "5"] + REQ),
        ("s78", ["--seed", "78", "--skew", "0.9", "--turns", "5", "--open", "800", "--prompts", "150",
                 "--prompt-blocks", "6", "--turn-blocks", "20"] + REQ),
    ],
}


def random_params(seed):
    r = random.Random(seed * 7919)
    return ["--seed", str(seed), "--skew", "%.2f" % r.uniform(0.3, 2.0),
            "--turns", str(r.choice([1, 2, 3, 4, 6, 9, 12, 20])),
            "--open", str(r.choice([32, 64, 128, 300, 700, 1500])),
            "--prompts", str(r.choice([50, 200, 500, 1500, 4000])),
            "--prompt-blocks", str(r.choice([4, 8, 16, 30])),
            "--turn-blocks", str(r.choice([2, 4, 6, 10, 16]))] + REQ


SETS["random"] = [("w%d" % s, random_params(s)) for s in range(100, 160)]
SETS["held"] = [("h%d" % s, random_params(s)) for s in range(300, 360)]
SETS["late"] = [("x%d" % s, random_params(s)) for s in list(range(500, 600)) + list(range(700, 800))]


def with_requests(params, n):
    out = list(params)
    out[out.index("--requests") + 1] = str(n)
    return out


SETS["scale"] = [("n%dk-%d" % (n // 1000, s), with_requests(random_params(s), n))
                 for n in (4000, 8000, 16000) for s in range(910, 950)]

# extra budgets for the fresh set: the Mooncake trace at budgets never tuned on
FRESH_BUDGETS = [5, 10, 15, 25, 40]


def replay(binary, trace, blocks=None):
    cmd = [binary, "replay", "--trace", trace, "--offline", "--json"]
    if blocks is not None:
        cmd += ["--budget-blocks", str(blocks)]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sets", default="bench,tuning,check")
    ap.add_argument("--bin", default=os.path.join(HERE, "..", "build", "kvtier"))
    ap.add_argument("--budgets", default="10,25", help="percent of unique blocks")
    ap.add_argument("--json", help="write every cell's ratios here")
    a = ap.parse_args()
    budgets = [int(x) for x in a.budgets.split(",")]
    tmp = tempfile.mkdtemp(prefix="kvt-sweep-")
    cells = []
    hdr = "%-8s %-14s %4s %7s %7s %7s %7s %8s %6s %6s" % (
        "set", "trace", "bud", "LRU", "ARC", "LFU", "value", "adaptive", "gap", "v-LRU")
    print("offline prefix hit ratios; gap: adaptive below the best of LRU/ARC/LFU, points;"
          " v-LRU: value minus LRU, points")
    print(hdr)
    summary = []
    for s in a.sets.split(","):
        rows = []
        for name, args in SETS[s]:
            if args is None:
                trace = MOONCAKE
                if not os.path.exists(trace):
                    print("(no %s: set KVT_TRACE)" % trace, file=sys.stderr)
                    continue
            else:
                trace = os.path.join(tmp, "%s-%s.jsonl" % (s, name))
                subprocess.run([sys.executable, os.path.join(HERE, "gen_trace.py"), trace] + args,
                               check=True)
            u = replay(a.bin, trace)["unique_blocks"]
            bl = FRESH_BUDGETS if (s == "fresh" and args is None) else budgets
            for pct in bl:
                off = replay(a.bin, trace, u * pct // 100)["offline"]["policies"]
                r = {p: off[p]["prefix_hit_ratio"] for p in off}
                blk = {p: off[p]["block_hit_ratio"] for p in off}
                best = max(r["LRU"], r["ARC"], r["LFU"])
                gap = 100 * (best - r["adaptive"])
                vl = 100 * (r["value"] - r["LRU"])
                # the scale set is summed per length: n4k, n8k, n16k
                rows.append((s + ("-" + name.split("-")[0] if s == "scale" else ""), gap, vl))
                cells.append(dict(set=s, trace=name, pct=pct, ratios=r, block=blk, gap=gap, value_minus_lru=vl))
                print("%-8s %-14s %3d%% %7.4f %7.4f %7.4f %7.4f %8.4f %6.2f %6.2f" % (
                    s, name, pct, r["LRU"], r["ARC"], r["LFU"], r["value"], r["adaptive"], gap, vl))
        for grp in dict.fromkeys(k for k, _, _ in rows):
            gs = [g for k, g, _ in rows if k == grp]
            vs = [v for k, _, v in rows if k == grp]
            summary.append((grp, len(gs), max(gs), sum(gs) / len(gs), min(vs), sum(vs) / len(vs)))
    print()
    print("%-10s %5s %9s %8s %11s %10s" % ("set", "cells", "worst gap", "mean gap", "worst v-LRU",
                                          "mean v-LRU"))
    for s, n, wg, mg, wv, mv in summary:
        print("%-10s %5d %9.2f %8.2f %11.2f %10.2f" % (s, n, wg, mg, wv, mv))
    if cells:
        # points, as the table: a hit ratio of 0.2623 is 26.23 points
        print("cells with a gap above 0.5 points: %d of %d; value below LRU by more than 0.005 "
              "points: %d, by more than 0.2 points (about one expert's noise): %d"
              % (sum(c["gap"] > 0.5 for c in cells), len(cells),
                 sum(c["value_minus_lru"] < -0.005 for c in cells),
                 sum(c["value_minus_lru"] < -0.2 for c in cells)))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(cells, f, indent=1)
    for f in os.listdir(tmp):
        os.unlink(os.path.join(tmp, f))
    os.rmdir(tmp)


if __name__ == "__main__":
    main()
