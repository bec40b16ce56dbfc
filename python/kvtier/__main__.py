"""python3 -m kvtier status [--url URL] [--json] | library

status:  a running server's status document (what `kvtier status --url`
         reports), as a short summary or, with --json, the whole document.
library: the libkvtier_client this module loads (see kvtier._find_library).
Exit codes: 0 ok, 1 the server cannot be reached or the C library
(libkvtier_client.so) cannot be found, 2 usage. Errors are one line on
stderr.
"""

import argparse
import json
import sys

import kvtier


def _human(n):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return "%.1f %s" % (n, unit) if unit != "B" else "%d B" % n
        n /= 1024.0
    return str(n)


def _summary(st):
    lines = ["%s at %s (pid %s), up %.0f s, %s" % (
        st.get("server"), st.get("listen"), st.get("pid"), st.get("uptime_seconds", 0),
        "healthy" if st.get("health", {}).get("is_healthy") else
        "UNHEALTHY: %s" % st.get("health", {}).get("detail"))]
    l1 = st.get("l1", {})
    lines.append("L1: %s of %s used, %s objects" % (
        _human(l1.get("used_bytes", 0)), _human(l1.get("capacity_bytes", l1.get("cap_bytes", 0))),
        l1.get("objects", 0)))
    for a in st.get("l2", []):
        lines.append("L2 %s (%s): %s used, %s objects, recovery %s" % (
            a.get("name"), a.get("type"), _human(a.get("used_bytes", 0)), a.get("objects", 0),
            a.get("recovery", {}).get("state", "-")))
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python3 -m kvtier")
    sub = p.add_subparsers(dest="cmd", required=True)
    ps = sub.add_parser("status", help="a running server's status")
    ps.add_argument("--url", default="tcp://127.0.0.1:5555")
    ps.add_argument("--json", action="store_true", help="the whole status document")
    ps.add_argument("--timeout-ms", type=int, default=5000)
    sub.add_parser("library", help="the libkvtier_client this module loads")
    a = p.parse_args(argv)
    try:
        if a.cmd == "library":
            kvtier._L()  # found and loadable
            print(kvtier._find_library())
            return 0
        with kvtier.Client(a.url, timeout_ms=a.timeout_ms, shm=False, local=False) as c:
            st = c.status()
    except ImportError as e:  # no C library: the module alone was installed
        print("kvtier: %s" % e, file=sys.stderr)
        return 1
    except kvtier.KvtierError as e:
        print("kvtier: %s: %s" % (a.url, e), file=sys.stderr)
        return 1
    print(json.dumps(st, indent=2, sort_keys=True) if a.json else _summary(st))
    return 0


if __name__ == "__main__":
    sys.exit(main())
