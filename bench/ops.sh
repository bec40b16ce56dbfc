#!/usr/bin/env bash
# Operations layer measurements (docs/operations.md), side by side in one run:
#
#   bench/ops.sh [section...]     sections: replay live scan purge (default: all)
#
#   replay  offline hit ratios on the Mooncake trace, budget = 25% of its
#           unique blocks: every policy (value with its aging, and with a
#           fixed half-life scaled to the trace's 17 minutes), Belady's optimum
#   live    the same trace through a live server (nixl_store_dynamic, cap =
#           25% of unique blocks x stored block size, L1 20 MB), per policy
#   scan    `kvtier status --root` vs `du -sb` on N files, alternating rounds
#   purge   `kvtier purge --all --offline` vs `find -delete`, alternating
#
# Environment: TRACE (default ../shared/data/mooncake_synthetic_trace.jsonl),
# BENCH_DIR (default /var/tmp/kvtier-ops-bench), FILES (5000), ROUNDS (5).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BUILD:-build}/kvtier
TRACE=${TRACE:-../shared/data/mooncake_synthetic_trace.jsonl}
DIR=${BENCH_DIR:-/var/tmp/kvtier-ops-bench}
FILES=${FILES:-5000}
ROUNDS=${ROUNDS:-5}
sections=("$@")
[ ${#sections[@]} -eq 0 ] && sections=(replay live scan purge)
mkdir -p "$DIR"
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

now() { date +%s.%N; }
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
free_port() { /usr/bin/python3 tests/support/ports.py "$@"; }  # a free port not among the arguments

# N object files of 4 KiB in two namespaces, plus a few tmp files
make_files() {
  /usr/bin/python3 - "$1" "$FILES" <<'EOF'
import os, sys
d, n = sys.argv[1], int(sys.argv[2])
os.makedirs(d, exist_ok=True)
blob = b"k" * 4096
for i in range(n):
    ns = "--models--A--v1" if i % 3 else "--models--B--v2"
    with open(os.path.join(d, "%s_00000000_0_%064x.bin" % (ns, i)), "wb") as f:
        f.write(blob)
for i in range(10):
    with open(os.path.join(d, "x_00000000_0_%02x.bin.tmp.%x-1-1" % (i, 4000000 + i)), "wb") as f:
        f.write(b"t")
EOF
}

echo "kvtier operations benchmarks on $(hostname), $(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ)"
for s in "${sections[@]}"; do
case "$s" in
replay)
  echo
  echo "== offline replay of $TRACE (budget 25% of unique blocks)"
  $BIN replay --trace "$TRACE" --offline
  echo "  value with a fixed 40 s half-life:"
  $BIN replay --trace "$TRACE" --offline --value-half-life 40 | grep "offline prefix"
  ;;
live)
  echo
  echo "== live replay through a server (nixl_store_dynamic, watermark 0.95, ratio 0.05)"
  # the offline default budget (25% of the unique blocks); replay has no cheaper way to print it
  budget_blocks=$($BIN replay --trace "$TRACE" --offline --json | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["budget_blocks"])')
  cap=$(/usr/bin/python3 -c "print($budget_blocks * (16384 + 512) / 2**30)")
  for pol in 'LRU' 'adaptive' 'value' 'value:0.0001'; do
    name=${pol%%:*}; hl=${pol#*:}
    ev="{\"eviction_policy\":\"$name\",\"trigger_watermark\":0.95,\"eviction_ratio\":0.05"
    [ "$hl" != "$pol" ] && ev="$ev,\"half_life_hours\":$hl"
    ev="$ev}"
    rm -rf "$DIR/live"
    port=$(free_port)
    $BIN server --port "$port" --http-port 0 --l1-size-gb 0.02 --l1-init-size-gb 0.02 \
      --eviction-interval-ms 100 --l2-adapter "{\"type\":\"nixl_store_dynamic\",\"backend\":\"POSIX\",\"backend_params\":{\"file_path\":\"$DIR/live\",\"max_capacity_gb\":$cap},\"eviction\":$ev}" \
      > "$DIR/live.log" 2>&1 &
    PIDS+=($!)
    sleep 1
    $BIN replay --trace "$TRACE" --url "tcp://127.0.0.1:$port" --json 2>/dev/null |
      /usr/bin/python3 -c "import json,sys; l=json.load(sys.stdin)['live']; print('  %-22s prefix hit ratio %.4f  (%.1f s, wrong blocks %d, errors %d)' % ('$pol', l['prefix_hit_ratio'], l['seconds'], l['wrong_blocks'], l['errors']))"
    kill "${PIDS[-1]}"; wait "${PIDS[-1]}" 2>/dev/null || true
  done
  ;;
scan)
  echo
  echo "== status scan of $FILES files: kvtier status --root vs du -sb (peer), $ROUNDS rounds"
  rm -rf "$DIR/scan"; make_files "$DIR/scan"; sync
  : > "$DIR/a"; : > "$DIR/b"
  for r in $(seq "$ROUNDS"); do
    t0=$(now); du -sb "$DIR/scan" > /dev/null; t1=$(now)
    $BIN status --root "$DIR/scan" --json > /dev/null; t2=$(now)
    echo "$t1 - $t0" | bc >> "$DIR/b"; echo "$t2 - $t1" | bc >> "$DIR/a"
  done
  a=$(median < "$DIR/a"); b=$(median < "$DIR/b")
  printf "  kvtier status %.3f s, du %.3f s (medians), ratio kvtier/du %.2f\n" "$a" "$b" "$(echo "$a / $b" | bc -l)"
  ;;
purge)
  echo
  echo "== purge of $FILES files: kvtier purge --all --offline vs find -delete (peer), $ROUNDS rounds"
  : > "$DIR/a"; : > "$DIR/b"
  for r in $(seq "$ROUNDS"); do
    # both trees made and synced first; the side that goes first alternates
    rm -rf "$DIR/p1" "$DIR/p2"; make_files "$DIR/p1"; make_files "$DIR/p2"; sync
    for side in $( [ $((r % 2)) = 1 ] && echo "find kvtier" || echo "kvtier find"); do
      t0=$(now)
      if [ "$side" = find ]; then
        find "$DIR/p1" -name '*.bin' -delete
      else
        $BIN purge --root "$DIR/p2" --all --yes --offline > /dev/null
      fi
      t1=$(now)
      echo "$t1 - $t0" | bc >> "$DIR/$( [ "$side" = find ] && echo b || echo a)"
    done
  done
  a=$(median < "$DIR/a"); b=$(median < "$DIR/b")
  printf "  kvtier purge %.3f s, find -delete %.3f s (medians), ratio kvtier/find %.2f\n" "$a" "$b" "$(echo "$a / $b" | bc -l)"
  rm -rf "$DIR/p1" "$DIR/p2"
  ;;
*) echo "unknown section $s"; exit 2 ;;
esac
done
rm -rf "$DIR/scan" "$DIR/live"
