#!/usr/bin/env python3
"""The include directions of src/ (docs/architecture.md), checked.

Every file under src/ belongs to one part; a part may include headers of the
parts listed for it below and its own. Run by `make test` (make check-layers):
an include against these directions fails the build's test run, naming the
file, the line and the rule, so the layering cannot drift.
"""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")

# part -> parts it may include (besides itself and the public kvtier/ headers)
RULES = {
    "common": [],
    "key": ["common"],
    "io": ["common"],
    "policy": ["common", "key"],
    "serde": ["common", "key", "io"],
    "l1": ["common", "key", "io", "policy"],
    "proto": ["common", "key"],
    # l2/l2.h, l2/evict.h, l2/adapters.h: what code above L2 may see
    "l2-contract": ["common", "key", "policy"],
    # l2/kit: helpers several engines share
    "l2-kit": ["common", "key", "io", "l2-contract", "l2-engine", "l2-kit-leaf"],
    "l2-kit-leaf": ["common", "key"],
    # l2/engine.h, l2/stage.h and the base's .c files
    "l2-engine": ["common", "key", "io", "policy", "serde", "l2-contract", "l2-kit"],
    # one folder per adapter family: the base and the kit, never another adapter
    "l2-adapter": ["common", "key", "io", "l2-contract", "l2-engine", "l2-kit"],
    "evict": ["common", "key", "io", "policy", "l1", "l2-contract"],
    "ctrl": ["common", "key", "io", "policy", "l1", "l2-contract"],
    # operations glue (cache.env, preflight, scan, purge, one-request RPC):
    # over the L2 contract only, so the core, the server and the CLI share it
    "ops": ["common", "key", "policy", "proto", "l2-contract", "l2-kit-leaf"],
    # the one road into the tiers: owns L1, the L2 set, the controllers
    "core": ["common", "key", "io", "policy", "l1", "l2-contract", "l2-kit-leaf", "evict", "ctrl",
             "ops"],
    # src/front/front.h: what a front end is and what the server hands it
    "front-contract": ["common"],
    # src/front/<protocol>/: protocol translation into core calls; never
    # l1/, ctrl/ or evict/ (and no call of their functions, see CALLS), never
    # another front end, of the server only the leaf server/auth.h
    "front": ["common", "key", "io", "proto", "ops", "core", "front-contract", "server-leaf"],
    # server/auth.h: the authorized-clients table and ZAP (libzmq, jansson)
    "server-leaf": ["common"],
    "server": ["common", "key", "io", "policy", "serde", "l1", "proto", "l2-contract",
               "l2-kit-leaf", "evict", "ctrl", "ops", "core", "front-contract", "front",
               "server-leaf"],
    # the kvtier binary's subcommands: a server only through the protocol
    "cli": ["common", "key", "policy", "proto", "l2-contract", "l2-kit-leaf", "ops"],
    "client": ["common", "key", "proto"],
}
# kit headers that are leaves (libc, jansson): usable above L2 too
KIT_LEAVES = {"l2/kit/tmpguard.h", "l2/kit/dirlock.h", "l2/kit/quota.h"}
CONTRACT = {"l2/l2.h", "l2/evict.h", "l2/adapters.h"}
SERVER_LEAVES = {"server/auth.h"}
# functions a part may not call although a header it includes declares
# them: a front end reaches L1, L2 and the controllers through the core
CALLS = {"front": re.compile(r"\bkvt_(l1|l2|store_ctrl|prefetch|evictor|tpool)_\w+\s*\(")}
# the one header of an adapter family another family may include, and who:
# nixl_store's object backends (OBJ, AZURE_BLOB) are the s3 engine
FAMILY_EDGES = {("l2-adapter:nixl", "l2/s3/s3_nixl.h")}


def part_of(rel):
    """rel: a path relative to src/ ("l2/fs/fs.c")."""
    top = rel.split("/")[0]
    if rel in SERVER_LEAVES:
        return "server-leaf"
    if top == "front":
        parts = rel.split("/")
        return "front-contract" if len(parts) == 2 else "front:" + parts[1]
    if top != "l2":
        return top
    if rel in CONTRACT:
        return "l2-contract"
    if rel in KIT_LEAVES:
        return "l2-kit-leaf"
    parts = rel.split("/")
    if len(parts) == 2:
        return "l2-engine"
    if parts[1] == "kit":
        return "l2-kit"
    return "l2-adapter:" + parts[1]


def allowed(src_part, dst_part, inc):
    if src_part == dst_part:
        return True
    base = src_part.split(":")[0]
    dst = dst_part.split(":")[0]
    if base in ("l2-adapter", "front") and dst == base:
        if base == "l2-adapter":  # another family: its edge header only
            return (src_part, inc) in FAMILY_EDGES
        return False  # another front end
    ok = RULES[base]
    if dst == "l2-kit-leaf" and "l2-kit" in ok:
        return True
    return dst in ok


def main():
    bad = []
    nfiles = 0
    for d, _, files in os.walk(ROOT):
        for f in sorted(files):
            if not f.endswith((".c", ".h")):
                continue
            path = os.path.join(d, f)
            rel = os.path.relpath(path, ROOT)
            nfiles += 1
            src = part_of(rel)
            calls = CALLS.get(src.split(":")[0])
            with open(path, encoding="utf-8") as fh:
                for n, line in enumerate(fh, 1):
                    hit = calls.search(line) if calls else None
                    if hit:
                        bad.append(f"src/{rel}:{n}: {src} calls {hit.group(0).rstrip('( ')} "
                                   "(through the core, core/core.h)")
                    m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
                    if not m:
                        continue
                    inc = m.group(1)
                    if inc.startswith("kvtier/"):
                        continue
                    if not os.path.exists(os.path.join(ROOT, inc)):
                        if os.path.exists(os.path.join(d, inc)):
                            continue  # a sibling, same part
                        bad.append(f"src/{rel}:{n}: includes \"{inc}\", which is not under src/")
                        continue
                    dst = part_of(inc)
                    if not allowed(src, dst, inc):
                        bad.append(f"src/{rel}:{n}: {src} may not include {inc} ({dst})")
    for b in bad:
        print(b, file=sys.stderr)
    if bad:
        print(f"check-layers: {len(bad)} include(s) or call(s) against the layer order "
              f"(scripts/check-layers.py, docs/architecture.md)", file=sys.stderr)
        return 1
    print(f"check-layers: {nfiles} files, every include follows the layer order")
    return 0


if __name__ == "__main__":
    sys.exit(main())
