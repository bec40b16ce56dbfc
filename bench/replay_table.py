#!/usr/bin/env python3
"""Print bench/run.sh replay's table from its JSON lines (one live replay a
line, with the offline results of every policy for the same budget)."""
import json
import sys

DEFAULT = "adaptive"  # the L1 default (--eviction-policy)


def main():
    cells = {}
    for line in open(sys.argv[1]):
        d = json.loads(line)
        c = cells.setdefault((d["trace"], d["pct"]), {"off": d["offline"]["policies"], "live": {}})
        c["live"][d["policy"]] = d["live"]["prefix_hit_ratio"]
        assert d["live"]["wrong_blocks"] == 0 and d["live"]["errors"] == 0, d
    # the policies kvtier replay compared (its table's order), Belady aside
    first = next(iter(cells.values()))["off"]
    POLS = [p for p in first if p != "Belady"]
    print("prefix hit ratio, live / offline per policy; Belady offline; 'gap': the live default (%s)"
          " below the best of LRU, ARC, LFU offline, in points; 'live-off': the largest"
          " |live - offline| of any policy, in points" % DEFAULT)
    hdr = "%-22s %4s " % ("trace", "bud") + " ".join("%15s" % p for p in POLS)
    print(hdr + " %7s %5s %8s" % ("Belady", "gap", "live-off"))
    worst_gap = worst_diff = 0.0
    for (trace, pct), c in sorted(cells.items()):
        row = "%-22s %3d%% " % (trace[:22], pct)
        diff = 0.0
        for p in POLS:
            off = c["off"][p]["prefix_hit_ratio"]
            live = c["live"].get(p)
            if live is None:
                row += "%15s" % ("- / %.4f" % off) + " "
                continue
            diff = max(diff, abs(live - off))
            row += "%15s " % ("%.4f/%.4f" % (live, off))
        best = max(c["off"][p]["prefix_hit_ratio"] for p in ("LRU", "ARC", "LFU"))
        gap = 100 * (best - c["live"].get(DEFAULT, 0))
        worst_gap, worst_diff = max(worst_gap, gap), max(worst_diff, 100 * diff)
        print(row + "%7.4f %5.2f %8.2f" % (c["off"]["Belady"]["prefix_hit_ratio"], gap, 100 * diff))
    print("worst gap %.2f points (goal <= 0.5); worst live - offline %.2f points (goal <= 0.2)"
          % (worst_gap, worst_diff))


if __name__ == "__main__":
    main()
