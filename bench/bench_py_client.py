#!/usr/bin/env python3
"""Python client data paths vs an in-process copy of the same bytes.

    bench/bench_py_client.py URL [--size B] [--batch N] [--rounds R] [--warmup W]

Per round (alternating, so every figure sees the same machine load), one
batch of N objects of B bytes (default 64 x 4 MiB = 256 MiB):

  copy_new      bytes(memoryview(p)) of every payload: an in-process copy
                into new Python-owned objects (what retrieve() must produce)
  copy_into     ctypes.memmove of every payload into one preallocated
                buffer: an in-process memcpy into memory already mapped
  store         Client.store(keys, payloads)          (fresh keys each round)
  retrieve      Client.retrieve(keys): one copy into the client's reused buffer
                (the previous round's results were dropped, as a loop does)
  retrieve_new  the same with Client(keep_buffers=0): into fresh memory each
                call (compare with copy_new)
  view_bytes    retrieve_view() + bytes(view) of each

Medians in GB/s (1e9 bytes/s) on stdout as "RESULT <name>_gbps <value>"
lines (parsed by bench/run.sh) after a human-readable table. Every
retrieved batch is checked against what was stored (outside the timing).
"""

import argparse
import ctypes
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
os.environ.setdefault("KVTIER_LIB", os.path.join(HERE, "..", "build", "libkvtier_client.so"))

import kvtier  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--size", type=int, default=4 << 20)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    a = ap.parse_args()

    c = kvtier.Client(a.url)
    try:
        c0 = kvtier.Client(a.url, keep_buffers=0)
    except TypeError:  # a client from before keep_buffers (to measure it)
        c0 = kvtier.Client(a.url)
    if not c.shm_active:
        sys.exit("bench_py_client: the shared-memory path is not available (same host?)")
    base = os.urandom(a.size)
    pay = [i.to_bytes(8, "little") + base[8:] for i in range(a.batch)]
    total = a.size * a.batch
    dst = bytearray(total)
    dst_addr = ctypes.addressof((ctypes.c_char * total).from_buffer(dst))
    tag = os.getpid().to_bytes(4, "little") + int(time.time() * 1e6).to_bytes(8, "little")
    res = {k: [] for k in ("copy_new", "copy_into", "store", "retrieve", "retrieve_new", "view_bytes")}

    def gbps(t):
        return total / t / 1e9

    for r in range(-a.warmup, a.rounds):
        hashes = [(tag + (r + a.warmup).to_bytes(4, "little") + i.to_bytes(4, "little")).ljust(32, b"\0")
                  for i in range(a.batch)]
        keys = kvtier.Keys("bench-py", hashes)

        t0 = time.perf_counter()
        out = [bytes(memoryview(p)) for p in pay]
        t_new = time.perf_counter() - t0
        del out

        t0 = time.perf_counter()
        off = 0
        for p in pay:
            ctypes.memmove(dst_addr + off, p, len(p))
            off += len(p)
        t_into = time.perf_counter() - t0

        t0 = time.perf_counter()
        acc = c.store(keys, pay)
        t_st = time.perf_counter() - t0
        if acc != a.batch:
            sys.exit("bench_py_client: store accepted %d of %d (L1 too small?)" % (acc, a.batch))

        t0 = time.perf_counter()
        got = c.retrieve(keys)
        t_rt = time.perf_counter() - t0
        if len(got) != a.batch or any(g != p for g, p in zip(got, pay)):
            sys.exit("bench_py_client: retrieve returned other bytes")
        del got

        t0 = time.perf_counter()
        got = c0.retrieve(keys)
        t_rn = time.perf_counter() - t0
        if len(got) != a.batch or any(g != p for g, p in zip(got, pay)):
            sys.exit("bench_py_client: retrieve returned other bytes")
        del got

        t0 = time.perf_counter()
        with c.retrieve_view(keys) as views:
            got = [bytes(v) for v in views]
        t_vb = time.perf_counter() - t0
        if len(got) != a.batch or any(g != p for g, p in zip(got, pay)):
            sys.exit("bench_py_client: retrieve_view returned other bytes")
        del got

        if r >= 0:
            res["copy_new"].append(gbps(t_new))
            res["copy_into"].append(gbps(t_into))
            res["store"].append(gbps(t_st))
            res["retrieve"].append(gbps(t_rt))
            res["retrieve_new"].append(gbps(t_rn))
            res["view_bytes"].append(gbps(t_vb))
    c.close()
    c0.close()

    med = {k: statistics.median(v) for k, v in res.items()}
    print("python client, %d x %d MiB per call, %d rounds (medians, GB/s)"
          % (a.batch, a.size >> 20, a.rounds))
    print("  in-process copy into new bytes   %6.2f" % med["copy_new"])
    print("  in-process memcpy into a buffer  %6.2f" % med["copy_into"])
    print("  Client.store()                   %6.2f" % med["store"])
    print("  Client.retrieve()                %6.2f   (reused buffer)" % med["retrieve"])
    print("  Client.retrieve(), keep_buffers=0%6.2f   (fresh memory)" % med["retrieve_new"])
    print("  retrieve_view() + bytes()        %6.2f" % med["view_bytes"])
    for k, v in med.items():
        print("RESULT py_%s_gbps %.3f" % (k, v))


if __name__ == "__main__":
    main()
