#!/usr/bin/env bash
# Remote tiers against their peers, side by side in one run on the same
# server, alternating sides, several rounds; prints medians and ratios.
#
#   resp: bench_remote through the resp adapter  vs  redis-benchmark SET/GET
#         (same Redis, same value size, same number of connections)
#   resp-cluster: the same through a 3-master Redis Cluster on loopback
#         ("cluster": true) vs redis-benchmark --cluster
#   s3:   bench_remote through the s3 adapter    vs  curl --parallel PUT/GET
#         (same S3 test server, same object size, same number of transfers),
#         and deletes of DCOUNT (400) 4 KiB objects vs curl --parallel DELETE
#
# Usage: bench/remote.sh [resp|resp-cluster|s3|all]
#   env: ROUNDS (5), COUNT objects per phase (32), SIZE bytes (4194304),
#        CONC connections / transfers (4), BUILD (build),
#        S3_SERVER s3rver (default) or versitygw (the real S3 server the tests use)
# Throughput counts payload bytes only (the adapter also moves a 512-byte
# header per object). Writes go to fresh keys on both sides (Redis is
# flushed between phases); reads read values that exist.
set -euo pipefail
cd "$(dirname "$0")/.."
WHAT=${1:-all}
ROUNDS=${ROUNDS:-5}
COUNT=${COUNT:-32}
SIZE=${SIZE:-4194304}
CONC=${CONC:-4}
BUILD=${BUILD:-build}
BENCH=$BUILD/bench/bench_remote
[ -x "$BENCH" ] || { echo "build first: make build" >&2; exit 1; }
TMP=$(mktemp -d /tmp/kvt-remote-bench.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$TMP"
}
trap cleanup EXIT

free_port() { /usr/bin/python3 tests/support/ports.py "$@"; }  # a free port not among the arguments
median() { sort -g | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
now() { date +%s.%N; }
mbs() { awk -v n="$1" -v s="$SIZE" -v a="$2" -v b="$3" 'BEGIN {printf "%.1f\n", n*s/(b-a)/1e6}'; }

report() { # name ours-file peer-file
  local o p
  o=$(median < "$2"); p=$(median < "$3")
  awk -v n="$1" -v o="$o" -v p="$p" 'BEGIN {printf "%-28s %10.1f %10.1f %8.2fx\n", n, o, p, o/p}'
}

bench_resp() {
  command -v redis-server >/dev/null && command -v redis-benchmark >/dev/null ||
    { echo "resp: redis-server / redis-benchmark not installed, skipped"; return; }
  local port; port=$(free_port)
  redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$TMP" \
    --loglevel warning >"$TMP/redis.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.05; done
  local spec="{\"type\":\"resp\",\"host\":\"127.0.0.1\",\"port\":$port,\"key_prefix\":\"bench\",\"num_workers\":$CONC}"
  : >"$TMP/rs"; : >"$TMP/rl"; : >"$TMP/bs"; : >"$TMP/bl"
  for r in $(seq "$ROUNDS"); do
    for side in $( ((r % 2)) && echo "ours peer" || echo "peer ours"); do
      redis-cli -p "$port" flushall >/dev/null
      if [ "$side" = ours ]; then
        out=$("$BENCH" "$spec" --size "$SIZE" --count "$COUNT" --batch "$CONC" --inflight 2 --seed "$r")
        echo "$out" | awk '/^store/ {print $2}' >>"$TMP/rs"
        echo "$out" | awk '/^load/ {print $2}' >>"$TMP/rl"
      else
        rps=$(redis-benchmark -p "$port" -t set -n "$COUNT" -r 1000000000 -d "$SIZE" -c "$CONC" --csv |
              awk -F'"' '/"SET"/ {print $4}')
        awk -v r="$rps" -v s="$SIZE" 'BEGIN {printf "%.1f\n", r*s/1e6}' >>"$TMP/bs"
        # GET reads existing values: populate key:000000000000.. first
        python3 - "$port" "$COUNT" "$SIZE" <<'EOF'
import socket, sys
port, n, size = map(int, sys.argv[1:])
s = socket.create_connection(("127.0.0.1", port))
v = bytes(size)
for i in range(n):
    k = b"key:%012d" % i
    s.sendall(b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n" % (len(k), k, size) + v + b"\r\n")
got = b""
while got.count(b"\r\n") < n:
    got += s.recv(65536)
EOF
        rps=$(redis-benchmark -p "$port" -t get -n "$COUNT" -r "$COUNT" -d "$SIZE" -c "$CONC" --csv |
              awk -F'"' '/"GET"/ {print $4}')
        awk -v r="$rps" -v s="$SIZE" 'BEGIN {printf "%.1f\n", r*s/1e6}' >>"$TMP/bl"
      fi
    done
  done
  echo "resp ($((SIZE >> 20)) MiB values, $CONC connections, $COUNT ops per phase, $ROUNDS rounds; MB/s medians)"
  printf "%-28s %10s %10s %9s\n" "" "kvtier" "redis-bm" "ratio"
  report "store (SET)" "$TMP/rs" "$TMP/bs"
  report "load (GET)" "$TMP/rl" "$TMP/bl"
}

bench_resp_cluster() {
  command -v redis-server >/dev/null && command -v redis-benchmark >/dev/null ||
    { echo "resp-cluster: redis-server / redis-benchmark not installed, skipped"; return; }
  local ports=() p
  while [ ${#ports[@]} -lt 3 ]; do # cluster bus ports are +10000
    p=$((20000 + RANDOM % 25000))
    (echo >/dev/tcp/127.0.0.1/$p) 2>/dev/null || (echo >/dev/tcp/127.0.0.1/$((p + 10000))) 2>/dev/null ||
      ports+=("$p")
  done
  for p in "${ports[@]}"; do
    mkdir -p "$TMP/c$p"
    redis-server --port "$p" --bind 127.0.0.1 --cluster-enabled yes --cluster-config-file nodes.conf \
      --save '' --appendonly no --dir "$TMP/c$p" --loglevel warning >"$TMP/c$p/redis.log" 2>&1 &
    PIDS+=($!)
  done
  for p in "${ports[@]}"; do
    for _ in $(seq 100); do redis-cli -p "$p" ping >/dev/null 2>&1 && break; sleep 0.05; done
  done
  redis-cli --cluster create "${ports[@]/#/127.0.0.1:}" --cluster-replicas 0 --cluster-yes >/dev/null
  for _ in $(seq 200); do
    redis-cli -p "${ports[0]}" cluster info | grep -q 'cluster_state:ok' && break; sleep 0.05
  done
  local spec="{\"type\":\"resp\",\"cluster\":true,\"host\":\"127.0.0.1\",\"port\":${ports[0]},\"key_prefix\":\"bench\",\"num_workers\":$CONC}"
  flush() { for p in "${ports[@]}"; do redis-cli -p "$p" flushall >/dev/null; done; }
  : >"$TMP/crs"; : >"$TMP/crl"; : >"$TMP/cbs"; : >"$TMP/cbl"
  for r in $(seq "$ROUNDS"); do
    for side in $( ((r % 2)) && echo "ours peer" || echo "peer ours"); do
      flush
      if [ "$side" = ours ]; then
        out=$("$BENCH" "$spec" --size "$SIZE" --count "$COUNT" --batch "$CONC" --inflight 2 --seed "$r")
        echo "$out" | awk '/^store/ {print $2}' >>"$TMP/crs"
        echo "$out" | awk '/^load/ {print $2}' >>"$TMP/crl"
      else
        rps=$(redis-benchmark --cluster -p "${ports[0]}" -t set -n "$COUNT" -r 1000000000 -d "$SIZE" \
              -c "$CONC" --csv 2>/dev/null | awk -F'"' '/"SET"/ {print $4}')
        awk -v r="$rps" -v s="$SIZE" 'BEGIN {printf "%.1f\n", r*s/1e6}' >>"$TMP/cbs"
        # GET reads existing values: SET each of the COUNT keys (per node tag) first
        redis-benchmark --cluster -p "${ports[0]}" -t set -n $((COUNT * 4)) -r "$COUNT" -d "$SIZE" \
          -c "$CONC" -q >/dev/null 2>&1
        rps=$(redis-benchmark --cluster -p "${ports[0]}" -t get -n "$COUNT" -r "$COUNT" -d "$SIZE" \
              -c "$CONC" --csv 2>/dev/null | awk -F'"' '/"GET"/ {print $4}')
        awk -v r="$rps" -v s="$SIZE" 'BEGIN {printf "%.1f\n", r*s/1e6}' >>"$TMP/cbl"
      fi
    done
  done
  echo "resp cluster (3 masters; $((SIZE >> 20)) MiB values, $CONC connections, $COUNT ops per phase, $ROUNDS rounds; MB/s medians)"
  printf "%-28s %10s %10s %9s\n" "" "kvtier" "redis-bm" "ratio"
  report "store (SET)" "$TMP/crs" "$TMP/cbs"
  report "load (GET)" "$TMP/crl" "$TMP/cbl"
}

bench_s3() {
  local server=${S3_SERVER:-s3rver}
  local port; port=$(free_port)
  if [ "$server" = versitygw ]; then
    local vgw=${KVT_VERSITYGW:-$BUILD/tools/bin/versitygw}
    [ -x "$vgw" ] || { echo "s3: $vgw missing (run make test-servers), skipped"; return; }
    mkdir -p "$TMP/vgw/bench"
    HOME=$TMP/vgw "$vgw" --port "127.0.0.1:$port" --access bench --secret bench-secret --quiet \
      posix "$TMP/vgw" >"$TMP/s3.out" 2>&1 &
    PIDS+=($!)
    for _ in $(seq 200); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.05; done
  else
    local modules=$BUILD/s3server/node_modules
    command -v node >/dev/null && [ -d "$modules/s3rver" ] ||
      { echo "s3: node or $modules missing (run make test-servers), skipped"; return; }
    mkdir -p "$TMP/s3"
    NODE_PATH=$modules node tests/support/s3server/server.js --port "$port" --dir "$TMP/s3" \
      --bucket bench --access-key bench --secret-key bench-secret >"$TMP/s3.out" 2>&1 &
    PIDS+=($!)
    for _ in $(seq 200); do grep -q ready "$TMP/s3.out" 2>/dev/null && break; sleep 0.05; done
  fi
  local url="http://127.0.0.1:$port/bench"
  local spec="{\"type\":\"s3\",\"s3_endpoint\":\"127.0.0.1:$port\",\"s3_bucket\":\"bench\",\"s3_addressing\":\"path\",\"s3_region\":\"us-east-1\",\"disable_tls\":true,\"aws_access_key_id\":\"bench\",\"aws_secret_access_key\":\"bench-secret\",\"s3_num_io_threads\":$CONC}"
  head -c "$SIZE" /dev/urandom >"$TMP/val.bin"
  local sig=(--aws-sigv4 "aws:amz:us-east-1:s3" --user bench:bench-secret -H "x-amz-content-sha256: UNSIGNED-PAYLOAD")
  : >"$TMP/ss"; : >"$TMP/sl"; : >"$TMP/cs"; : >"$TMP/cl"
  for r in $(seq "$ROUNDS"); do
    for side in $( ((r % 2)) && echo "ours peer" || echo "peer ours"); do
      if [ "$side" = ours ]; then
        out=$("$BENCH" "$(echo "$spec" | sed "s/}\$/,\"key_prefix\":\"kvt$r\"}/")" \
              --size "$SIZE" --count "$COUNT" --batch "$CONC" --inflight 2 --seed "$r")
        echo "$out" | awk '/^store/ {print $2}' >>"$TMP/ss"
        echo "$out" | awk '/^load/ {print $2}' >>"$TMP/sl"
      else
        : >"$TMP/put.cfg"; : >"$TMP/get.cfg"
        for i in $(seq 0 $((COUNT - 1))); do
          printf 'url = "%s/curl%d/obj%d"\nupload-file = "%s"\noutput = "/dev/null"\n' \
            "$url" "$r" "$i" "$TMP/val.bin" >>"$TMP/put.cfg"
          printf 'url = "%s/curl%d/obj%d"\noutput = "/dev/null"\n' "$url" "$r" "$i" >>"$TMP/get.cfg"
        done
        t0=$(now)
        curl -sS -f --no-progress-meter --parallel --parallel-max "$CONC" "${sig[@]}" -K "$TMP/put.cfg"
        t1=$(now)
        curl -sS -f --no-progress-meter --parallel --parallel-max "$CONC" "${sig[@]}" -K "$TMP/get.cfg"
        t2=$(now)
        mbs "$COUNT" "$t0" "$t1" >>"$TMP/cs"
        mbs "$COUNT" "$t1" "$t2" >>"$TMP/cl"
      fi
    done
  done
  # deletes (eviction, purge): DCOUNT small objects, both sides at CONC
  # concurrent requests; curl's time includes its start (a few ms). Each
  # side's prefix keeps one sentinel object: s3rver answers 500 when
  # concurrent deletes empty a directory (its store removes empty
  # directories racily), which real S3 never does.
  local dcount=${DCOUNT:-400}
  head -c 4096 /dev/urandom >"$TMP/small.bin"
  : >"$TMP/sd"; : >"$TMP/cd"
  for r in $(seq "$ROUNDS"); do
    for side in $( ((r % 2)) && echo "ours peer" || echo "peer ours"); do
      local pfx; pfx=$([ "$side" = ours ] && echo "del$r" || echo "cdel$r")
      curl -sS -f --no-progress-meter "${sig[@]}" -T "$TMP/small.bin" "$url/$pfx/sentinel"
      if [ "$side" = ours ]; then
        "$BENCH" "$(echo "$spec" | sed "s/}\$/,\"key_prefix\":\"del$r\"}/")" \
          --size 4096 --count "$dcount" --batch 64 --inflight 2 --seed "$r" --op store --delete |
          awk '/^delete/ {print $2}' >>"$TMP/sd"
      else
        : >"$TMP/dput.cfg"; : >"$TMP/del.cfg"
        for i in $(seq 0 $((dcount - 1))); do
          printf 'url = "%s/cdel%d/obj%d"\nupload-file = "%s"\noutput = "/dev/null"\n' \
            "$url" "$r" "$i" "$TMP/small.bin" >>"$TMP/dput.cfg"
          printf 'url = "%s/cdel%d/obj%d"\nrequest = "DELETE"\noutput = "/dev/null"\n' \
            "$url" "$r" "$i" >>"$TMP/del.cfg"
        done
        curl -sS -f --no-progress-meter --parallel --parallel-max "$CONC" "${sig[@]}" -K "$TMP/dput.cfg"
        t0=$(now)
        curl -sS -f --no-progress-meter --parallel --parallel-max "$CONC" "${sig[@]}" -K "$TMP/del.cfg"
        t1=$(now)
        awk -v n="$dcount" -v a="$t0" -v b="$t1" 'BEGIN {printf "%.1f\n", n/(b-a)}' >>"$TMP/cd"
      fi
    done
  done
  echo "s3 ($((SIZE >> 20)) MiB objects, $CONC parallel transfers, $COUNT ops per phase, $ROUNDS rounds; MB/s medians; server: $server)"
  printf "%-28s %10s %10s %9s\n" "" "kvtier" "curl" "ratio"
  report "store (PUT)" "$TMP/ss" "$TMP/cs"
  report "load (GET)" "$TMP/sl" "$TMP/cl"
  report "delete ($dcount, ops/s)" "$TMP/sd" "$TMP/cd"
}

case "$WHAT" in
  resp) bench_resp ;;
  resp-cluster) bench_resp_cluster ;;
  s3) bench_s3 ;;
  all) bench_resp; echo; bench_resp_cluster; echo; bench_s3 ;;
  *) echo "usage: $0 [resp|resp-cluster|s3|all]" >&2; exit 2 ;;
esac
