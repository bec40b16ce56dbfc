#!/usr/bin/env python3
"""Store + flush to L2 through a real server, beside fio writing the same
bytes in the same directory with the adapter's I/O mode and queue depth.

    bench/bench_store_l2.py DIR [--objects N] [--rounds R] [--configs a,b,...]

For each adapter configuration a kvtier server is started (L1 1 GiB, queue
depth 4: num_workers 4, raw_block 4 store workers) and, in every round,
three rows run one after the other (alternated, so every row sees the same
machine): the C client (bench_client l2: one kvt_store of N objects of
4 MiB, then kvt_flush, which returns once the adapter has every object),
the Python client (Client.store, Client.flush, in this process) and fio
writing N x 4 MiB into the same directory. Every
row writes fresh files: kvtier's keys are deleted after its rows, fio's
files after its row (not timed). Medians over the rounds, min / max, and
the ratios kvtier / fio and Python / C.

Rows (fio beside each):
  default          `make run`'s configuration: no --l2-adapter, the fs tier
                   under --data-dir (buffered, 4 workers, no fsync)
                   -> fio psync buffered, one file per object, 4 jobs
  fs_odirect       fs with use_odirect         -> fio O_DIRECT, file per object
  fs_native        fs_native with use_odirect  -> the same
  fs_native_buffered  fs_native without        -> fio buffered, file per object
  nixl_dynamic     nixl_store_dynamic, POSIX, use_direct_io, posix engine
                   -> fio O_DIRECT, file per object
  nixl_store       nixl_store (a pool of files), POSIX, use_direct_io
                   -> fio O_DIRECT into one file, 4 jobs at their offsets
  raw_block        raw_block on an image file (O_DIRECT) -> the same

Then, per configuration (as root: it drops the kernel's caches; --no-load
skips it), the load side: N objects stored once, then in every round the
server is restarted with the caches dropped and one lookup of the N keys
loads them all from L2 into L1 (it answers once they are there), beside
fio reading as many bytes with O_DIRECT from files laid out the same way
in the same directory (4 jobs), the caches dropped before it too.

Output: tables, then "RESULT store_l2 <config>_over_fio=<x> <config>_py_over_c=<y>
<config>_lookup_over_fio_read=<z> ..." (one line), parsed by bench/run.sh.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BUILD = os.path.abspath(os.environ.get("BUILD", os.path.join(ROOT, "build")))
# the test harness (tests/support) and the kvtier module, as pytest.ini's pythonpath
sys.path[:0] = [os.path.join(ROOT, "tests"), os.path.join(ROOT, "python")]
os.environ.setdefault("KVTIER_LIB", os.path.join(BUILD, "libkvtier_client.so"))
os.environ.setdefault("KVTIER_BIN", os.path.join(BUILD, "kvtier"))

import kvtier  # noqa: E402
from fio_run import fio_bw  # noqa: E402
from support.server import Server  # noqa: E402

OBJ = 4 << 20
QD = 4


def adapter(config, d, n):
    """(--l2-adapter JSON or None, fio's write mode, the directory both write in)."""
    l2 = os.path.join(d, "l2")
    if config == "default":
        return None, "files-buffered", os.path.join(d, "data")
    if config == "fs_odirect":
        return json.dumps({"type": "fs", "base_path": l2, "use_odirect": True,
                           "num_workers": QD}), "files-direct", l2
    if config == "fs_native":
        return json.dumps({"type": "fs_native", "base_path": l2, "use_odirect": True,
                           "num_workers": QD}), "files-direct", l2
    if config == "fs_native_buffered":
        return json.dumps({"type": "fs_native", "base_path": l2, "use_odirect": False,
                           "num_workers": QD}), "files-buffered", l2
    if config == "nixl_dynamic":
        return json.dumps({"type": "nixl_store_dynamic", "backend": "POSIX",
                           "backend_params": {"file_path": l2, "use_direct_io": "true",
                                              "max_capacity_gb": 64},
                           "io_engine": "posix", "num_workers": QD}), "files-direct", l2
    if config == "nixl_store":
        per = (n * OBJ // QD + 2 * OBJ) // 4096 * 4096
        return json.dumps({"type": "nixl_store", "backend": "POSIX",
                           "backend_params": {"file_path": l2, "use_direct_io": "true",
                                              "file_size": per},
                           "pool_size": QD, "io_engine": "posix", "num_workers": QD}), \
            "one-file-direct", l2
    if config == "raw_block":
        os.makedirs(l2, exist_ok=True)
        img = os.path.join(l2, "dev.img")
        cap = (4 << 20) + (n + 2) * (OBJ + 8192)
        with open(img, "wb") as f:
            f.truncate(cap)  # zeros: kvtier formats a device of zeros only
        return json.dumps({"type": "raw_block", "device_path": img, "slot_bytes": OBJ + 4096,
                           "capacity_bytes": cap,
                           "meta_total_bytes": 4 << 20, "io_engine": "posix",
                           "num_store_workers": QD, "num_load_workers": 2}), \
            "one-file-direct", l2
    raise SystemExit("unknown config %s" % config)


# nixl_store keeps a volatile index and removes its pool at stop, as
# LMCache's (docs/persistent-adapters.md): nothing to look up after a restart
VOLATILE = {"nixl_store"}

CONFIGS = ["default", "fs_odirect", "fs_native", "fs_native_buffered", "nixl_dynamic",
           "nixl_store", "raw_block"]


def fio(rw, mode, where, n):
    """GB/s of fio moving n x 4 MiB under where/fio-<rw> in the adapter's
    mode, 4 jobs. write: one new file per object (removed after) or one
    preallocated file at the jobs' offsets; read: always O_DIRECT, from
    files laid out by its first call and kept."""
    d = os.path.join(where, "fio-" + rw)
    fresh = rw == "write" and mode.startswith("files")
    if fresh:
        shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d, exist_ok=True)
    if mode.startswith("files"):
        # one file per object, as the adapter: 4 jobs of n/4 files
        args = ["--directory=%s" % d, "--filesize=4M", "--nrfiles=%d" % (n // QD)]
        if fresh:
            args += ["--create_on_open=1", "--fallocate=none"]
    else:
        # one file, each job at its offset (the adapter's slots)
        args = ["--filename=%s" % os.path.join(d, "fio.dat"), "--size=%d" % (n * OBJ // QD),
                "--offset_increment=%d" % (n * OBJ // QD)]
    if rw == "read" or mode.endswith("direct"):
        args.append("--direct=1")
    bw = fio_bw(rw, QD, args)
    if fresh:
        shutil.rmtree(d, ignore_errors=True)
    return bw / 1e9


def py_row(c, n, tag, pays):
    keys = kvtier.Keys("bench-l2-py", [(b"%d-%d" % (tag, i)).ljust(32, b"\0") for i in range(n)])
    t0 = time.perf_counter()
    if c.store(keys, pays) != n:
        raise SystemExit("bench_store_l2: the Python store was not accepted whole (L1 too small?)")
    res = c.flush()
    t = time.perf_counter() - t0
    if res:
        raise SystemExit("bench_store_l2: stores did not reach L2: %s" % (res,))
    c.delete(keys)
    return n * OBJ / t / 1e9


class CClient:
    """bench_client l2: one process for every round (its pool mapping warm
    after the first, as an engine's client); a round per line on stdin."""

    def __init__(self, url, n):
        self.p = subprocess.Popen([os.path.join(BUILD, "bench", "bench_client"), "l2", url,
                                   "--batch", str(n), "--size", str(OBJ)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def row(self, tag):
        self.p.stdin.write("%d\n" % tag)
        self.p.stdin.flush()
        while True:
            line = self.p.stdout.readline()
            if not line:
                raise SystemExit("bench_client l2 failed (its message above)")
            if line.startswith("RESULT l2_gbps"):
                return float(line.split()[2])

    def close(self):
        self.p.stdin.close()
        self.p.wait()


def stats(v):
    return min(v), statistics.median(v), max(v)


def drop_caches():
    """sync, then drop the page cache, dentries and inodes (root)."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def run_config(config, base, n, rounds, pays, load, extra=()):
    d = os.path.join(base, config)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    js, mode, where = adapter(config, d, n)
    os.makedirs(where, exist_ok=True)
    # L1 1 GiB; the initial size back at the server's default (the harness
    # starts its test servers at 0.25)
    args = ["--log-level", "warn", "--l1-size-gb", "1", "--l1-init-size-gb", "20"]
    if js:
        args += ["--l2-adapter", js]
    srv = Server(args + list(extra), d, data_dir=os.path.join(d, "data"), http=False)
    srv.start()
    srv.wait_recovered()
    c = srv.client()
    rows = {"c": [], "py": [], "fio": [], "lookup": [], "fio_read": []}
    try:
        cc = CClient(srv.url, n)
        for r in range(-1, rounds):  # one warm-up round: pool pages mapped, files laid out
            tag = (os.getpid() << 20) + (r + 2) * 1000
            g = {"c": cc.row(tag), "py": py_row(c, n, tag + 1, pays),
                 "fio": fio("write", mode, where, n)}
            if r >= 0:
                for k, v in g.items():
                    rows[k].append(v)
        cc.close()
        if load and config not in VOLATILE:
            # a lookup after a restart with the kernel's caches dropped loads
            # every object from L2 into L1, beside fio reading as many bytes
            # with O_DIRECT (caches dropped too), alternated
            keys = kvtier.Keys("bench-l2-load", [(b"load-%d" % i).ljust(32, b"\0")
                                                 for i in range(n)])
            if c.store(keys, pays) != n or c.flush():
                raise SystemExit("bench_store_l2: %s: the load side's store did not reach L2"
                                 % config)
            fio("read", mode, where, n)  # lays its files out
            for r in range(rounds):
                c.close()
                srv.stop()
                drop_caches()
                srv.start()
                srv.wait_recovered()
                c = srv.client()
                t0 = time.perf_counter()
                hits = c.lookup(keys)
                t = time.perf_counter() - t0
                c.free_locks()
                if hits != n:
                    raise SystemExit("bench_store_l2: %s: a lookup after the restart found %d of "
                                     "%d" % (config, hits, n))
                rows["lookup"].append(n * OBJ / t / 1e9)
                drop_caches()
                rows["fio_read"].append(fio("read", mode, where, n))
        c.close()
    finally:
        srv.stop()
        shutil.rmtree(d, ignore_errors=True)
    return rows, mode


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--objects", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--server-args", default="",
                    help="more flags for every server, e.g. --server-args=--no-l1-use-lazy")
    ap.add_argument("--no-load", action="store_true",
                    help="skip the lookup-after-restart rows (they drop the kernel's caches: root)")
    a = ap.parse_args()
    load = not a.no_load and os.geteuid() == 0
    n = max(QD, a.objects // QD * QD)
    base = os.urandom(OBJ)
    pays = [i.to_bytes(8, "little") + base[8:] for i in range(n)]
    print("store + flush of %d x 4 MiB through a real server (L1 1 GiB, queue depth %d) vs fio "
          "writing the same bytes in the same directory; %d alternated rounds, GB/s min / "
          "median / max" % (n, QD, a.rounds))
    if load:
        print("then per configuration: a lookup after a restart with the kernel's caches dropped "
              "(every object loaded from L2 into L1) vs fio O_DIRECT reading as many bytes there, "
              "caches dropped, 4 jobs, alternated")
    elif not a.no_load:
        print("(not root: no lookup-after-restart rows, they drop the kernel's caches)")
    print("  %-20s %-16s %20s %20s %20s %8s %8s" % ("config", "fio mode", "C client", "Python client",
                                                   "fio", "C/fio", "py/C"))
    out, loads = [], []
    fmt = lambda v: "%.2f / %.2f / %.2f" % stats(v)  # noqa: E731
    for config in a.configs.split(","):
        rows, mode = run_config(config, a.dir, n, a.rounds, pays, load, a.server_args.split())
        mc, mp, mf = (statistics.median(rows[k]) for k in ("c", "py", "fio"))
        print("  %-20s %-16s %20s %20s %20s %8.2f %8.2f" % (config, mode, fmt(rows["c"]),
                                                           fmt(rows["py"]), fmt(rows["fio"]),
                                                           mc / mf, mp / mc))
        sys.stdout.flush()
        out.append("%s_over_fio=%.2f %s_py_over_c=%.2f" % (config, mc / mf, config, mp / mc))
        if load and rows["lookup"]:
            ml, mr = statistics.median(rows["lookup"]), statistics.median(rows["fio_read"])
            loads.append((config, fmt(rows["lookup"]), fmt(rows["fio_read"]), ml / mr))
            out.append("%s_lookup_over_fio_read=%.2f" % (config, ml / mr))
    if loads:
        print("lookup after a restart, caches dropped (GB/s min / median / max; goal >= 1.0):")
        print("  %-20s %20s %20s %8s" % ("config", "lookup", "fio O_DIRECT read", "ratio"))
        for config, l, f, ratio in loads:
            print("  %-20s %20s %20s %8.2f" % (config, l, f, ratio))
    print("RESULT store_l2 " + " ".join(out))


if __name__ == "__main__":
    main()
