#!/usr/bin/env python3
"""Cost of KV events on the store path (docs/events.md).

Three kvtier servers side by side, each with an fs L2 under --dir: events
off; events on with one subscriber that reads every message; events on
with one subscriber that never reads (its socket's receive buffer of one
message). Each round stores --keys fresh chunks of --size bytes (batches
of --batch) through each server in turn, in rotating order, and flushes
(every L2 store done): one store path is L1 publish + L2 write, each
announced. Prints the median seconds per round and the ratios to "off",
and the events each server published and dropped.

    bench/bench_events.py --dir /var/tmp/kvtier-bench [--rounds 9]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
import kvtier  # noqa: E402
from support.ports import free_port  # noqa: E402

READER = r"""
import sys, zmq
s = zmq.Context().socket(zmq.SUB)
s.setsockopt(zmq.SUBSCRIBE, b"")
if sys.argv[2] == "idle":
    s.setsockopt(zmq.RCVHWM, 1)
    s.setsockopt(zmq.RCVBUF, 4096)
s.connect(sys.argv[1])
print("ready", flush=True)
if sys.argv[2] == "idle":
    sys.stdin.read()  # never reads the socket
else:
    n = 0
    while True:
        s.recv_multipart()
        n += 1
"""


def start_server(binp, d, name, events):
    port, http = free_port(), free_port()
    args = [binp, "server", "--port", str(port), "--http-port", str(http), "--log-level", "warn",
            "--l1-size-gb", "0.5", "--l1-init-size-gb", "0.5",
            "--l2-adapter", json.dumps({"type": "fs", "base_path": os.path.join(d, name)})]
    ep = None
    if events:
        ep = "tcp://127.0.0.1:%d" % free_port()
        args += ["--kv-events-endpoint", ep]
    p = subprocess.Popen(args)
    url = "tcp://127.0.0.1:%d" % port
    for _ in range(200):
        try:
            c = kvtier.Client(url, timeout_ms=500)
            c.ping()
            c.close()
            return p, kvtier.Client(url, timeout_ms=60000), ep, http
        except kvtier.KvtierError:
            time.sleep(0.05)
    raise SystemExit("server %s did not start" % name)


def status(http):
    with urllib.request.urlopen("http://127.0.0.1:%d/status" % http) as r:
        return json.load(r)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/var/tmp/kvtier-bench")
    ap.add_argument("--bin", default=os.path.join(HERE, "..", "build", "kvtier"))
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--keys", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--size", type=int, default=16384)
    a = ap.parse_args()
    d = os.path.join(a.dir, "events-bench")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    names = ["off", "on-reader", "on-idle"]
    srv, subs = {}, []
    try:
        for n in names:
            srv[n] = start_server(a.bin, d, n, n != "off")
            if n != "off":
                sp = subprocess.Popen([sys.executable, "-c", READER, srv[n][2], n.split("-")[1]],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                assert sp.stdout.readline().strip() == "ready"
                subs.append(sp)
        time.sleep(0.5)  # subscriptions reach the servers
        payload = [os.urandom(a.size)] * a.batch
        times = {n: [] for n in names}
        for r in range(a.rounds):
            order = names[r % 3:] + names[:r % 3]
            for n in order:
                c = srv[n][1]
                keys = kvtier.chunk_keys("bench", [(r * 7919 + i) % 65536 + r * 131072
                                                  for i in range(a.keys * 16)], chunk_size=16)
                t0 = time.perf_counter()
                for b in range(0, a.keys, a.batch):
                    c.store(keys[b:b + a.batch], payload)
                c.flush()
                times[n].append(time.perf_counter() - t0)
        med = {n: statistics.median(times[n]) for n in names}
        mb = a.keys * a.size / 1e6
        print("store path: %d rounds of %d x %d B chunks (batches of %d) into L1 + fs L2, "
              "median per round" % (a.rounds, a.keys, a.size, a.batch))
        for n in names:
            st = status(srv[n][3])["kv_events"]
            extra = ""
            if st["enabled"]:
                extra = "  events: %d stored, %d removed, %d batches, %d dropped" % (
                    st["blocks_stored"], st["blocks_removed"], st["batches"], st["dropped"])
            print("  %-10s %.3f s  (%.0f MB/s)%s" % (n, med[n], mb / med[n], extra))
        r1 = med["on-reader"] / med["off"]
        r2 = med["on-idle"] / med["off"]
        print("RESULT events on_reader_over_off=%.3f on_idle_over_off=%.3f" % (r1, r2))
    finally:
        for sp in subs:
            sp.kill()
        for n in srv:
            srv[n][1].close()
            srv[n][0].terminate()
            srv[n][0].wait()
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
