#!/usr/bin/env python3
"""Soak of the s3 tier (versitygw) and its Azure Blob dialect (Azurite)
under faults, longer than CI's tests/integration/test_s3_faults.py, with
the same machinery: the tests' fault proxy in front of the server, the same
verified load (a writer storing and flushing, a trickle of stores, open-loop
readers checking every byte of what they load from the tier), each fault
held for --fault-s seconds. Prints one row per (tier, fault): time to fail
(fault start -> breaker open), the slowest client request during the
fault, time to recover (fault end -> breaker closed and a store landed),
breaker openings, verified L2 hits, wrong bytes, crashes.

    KVTIER_BIN=build/kvtier KVTIER_LIB=build/libkvtier_client.so \\
        python3 bench/s3_faults.py [--fault-s 30] [--warm-s 10] [--tiers s3,azure] [--faults hang,...]

Not run in CI (minutes). A row whose checks failed says which.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the test harness (tests/support) and the kvtier module, as pytest.ini's
# pythonpath
sys.path[:0] = [os.path.join(ROOT, "tests"), os.path.join(ROOT, "python")]

import support.s3_faults as tf  # noqa: E402
from support import azurite  # noqa: E402
from support.faultproxy import FaultProxy  # noqa: E402
from support.paths import BIN  # noqa: E402
from support.s3_servers import s3_json, start_s3  # noqa: E402
from support.server import SANITIZER_MARKERS, Server  # noqa: E402

FAULTS = ["hang", "500", "reset", "refuse", "sigstop"]


class Tmp:
    """What pytest's tmp_path is to start_s3: a directory with '/'."""

    def __init__(self, d):
        self.d = d

    def __truediv__(self, name):
        import pathlib
        return pathlib.Path(self.d) / name


def start_tier(tier, work):
    """(store server, proxy, kvtier server) for one run."""
    if tier == "s3":
        srv = start_s3("versitygw", Tmp(work))
        px = FaultProxy(srv.port)
        spec = json.loads(s3_json(srv, request_timeout=tf.RT, connection_timeout=tf.RT))
        spec["s3_endpoint"] = "127.0.0.1:%d" % px.port
    else:
        azurite.ensure_modules()
        d = os.path.join(work, "azurite")
        os.mkdir(d)
        srv = azurite.Azurite(Tmp(d).d).start()
        srv.create_container()
        px = FaultProxy(srv.port)
        spec = json.loads(azurite.azure_json(srv, account_key=azurite.KEY))
        spec["backend_params"]["account_url"] = "http://127.0.0.1:%d/%s" % (px.port,
                                                                         azurite.ACCOUNT)
    s = Server(["--l1-size-gb", "0.02", "--l1-init-size-gb", "0.02",
                         "--l2-store-policy", "skip_l1", "--l2-adapter", json.dumps(spec)], work)
    s.start()
    s.wait_recovered()
    return srv, px, s


def one(tier, fault, fault_s, warm_s):
    work = tempfile.mkdtemp(prefix="kvt-soak-")
    row = {"tier": tier, "fault": fault, "problem": ""}
    srv = px = s = None
    try:
        srv, px, s = start_tier(tier, work)
        m = tf.run_fault(srv, px, s, fault, fault_s=fault_s, warm_s=warm_s)
        row.update(m)
        try:
            tf.check(s, m)
        except AssertionError as e:
            row["problem"] = "check: %s" % str(e).splitlines()[0][:120]
    except Exception as e:  # a run that could not finish is a row too
        row["problem"] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:160] if str(e) else "")
        traceback.print_exc(file=sys.stderr)
    finally:
        crashed = s is not None and s.proc.poll() is not None
        log = s.read_log() if s else ""
        row["crash"] = ("exit %s" % s.proc.returncode) if crashed else (
            "sanitizer report" if any(x in log for x in SANITIZER_MARKERS) else "none")
        if s:
            s.kill()
        if srv and getattr(srv, "proc", None) and srv.proc.poll() is None:
            import signal
            srv.proc.send_signal(signal.SIGCONT)
        if px:
            px.close()
        if srv:
            srv.kill()
        shutil.rmtree(work, ignore_errors=True)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fault-s", type=float, default=30.0, help="how long each fault lasts")
    ap.add_argument("--warm-s", type=float, default=10.0,
                    help="seconds of load before each fault")
    ap.add_argument("--tiers", default="s3,azure")
    ap.add_argument("--faults", default=",".join(FAULTS))
    a = ap.parse_args()
    rows = []
    for tier in a.tiers.split(","):
        for fault in a.faults.split(","):
            if tier == "azure" and fault == "sigstop":
                continue  # Azurite is the stand-in server, not what is measured
            r = one(tier, fault, a.fault_s, a.warm_s)
            rows.append(r)
            print("%s %s: %s" % (tier, fault, {k: r.get(k) for k in (
                "detect_s", "slowest_s", "recover_s", "opens", "hits", "wrong", "crash", "problem")}),
                file=sys.stderr, flush=True)

    def f(r, k):
        return "%.2f s" % r[k] if k in r else "-"
    print("\nrequest_timeout = connection_timeout = %.0f s, %.0f s of load, then each fault held "
          "%.0f s, kvtier %s\n" % (tf.RT, a.warm_s, a.fault_s, BIN))
    print("| tier | fault | time to fail | slowest request | time to recover | openings | "
          "verified hits (L2 loads) | wrong bytes | crashes |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        loads = r["after"]["counters"]["load_ok"] if "after" in r else "-"
        print("| %s | %s | %s | %s | %s | %s | %s (%s) | %s | %s%s |" % (
            r["tier"], r["fault"], f(r, "detect_s"), f(r, "slowest_s"), f(r, "recover_s"),
            r.get("opens", "-"), r.get("hits", "-"), loads, r.get("wrong", "-"), r["crash"],
            ("; " + r["problem"]) if r["problem"] else ""))
    return 0 if all(not r["problem"] and r["crash"] == "none" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
