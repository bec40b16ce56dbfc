"""LMCache's MP protocol as kvtier serves it (src/front/lmcache/) against the
installed lmcache package: a drift fails here, naming the installed version,
before an engine run fails in a less obvious way.

One source of truth: tests/data/lmcache-mp-protocol.json, a snapshot that
`describe()` below wrote from the pinned lmcache (0.5.6):

- every operation of LMCache's RequestClient (lmcache/v1/multiprocess/rpc.py
  discovers them from the @rpc_method methods of transport/base.py): its
  frozen legacy integer id (transport/zmq_impl/wire.py) and its number of
  payload frames; for the operations kvtier serves (every row of procs[] in
  src/front/lmcache/lmc_handlers.c except the lmcache_driven refusals) also
  the argument names and types, the response type and whether it streams;
- every message type those served operations carry (IPCCacheServerKey,
  RegisterEngineDrivenContextPayload, the responses, ...) and the slot of a
  prepare_* response's `context` (ShmSlotDescriptor): dataclass or msgspec
  Struct, the fields in order with their wire names, types and whether they
  have a default, and a Struct's encoding options;
- the keys LMCache's server puts into those untyped `context` dicts.

test_c_tables_match_snapshot checks kvtier against the snapshot (lmc_ops[] in
src/proto/lmc_wire.c, procs[], the fields its decoders read, the version in
its messages and docs/lmcache-protocol.md's table); it needs no lmcache.
test_installed_lmcache_matches_snapshot describes the installed lmcache the
same way and compares. After moving the pin (docs/lmcache-protocol.md,
"Moving the lmcache pin"), write the snapshot again with

    build/venv/bin/python tests/vllm/test_lmcache_protocol.py --write

and follow what the C test then reports.
"""

import dataclasses
import enum
import json
import os
import re
import sys
import types
import typing

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SNAPSHOT = os.path.join(ROOT, "tests", "data", "lmcache-mp-protocol.json")
WIRE_C = os.path.join(ROOT, "src", "proto", "lmc_wire.c")
HANDLERS_C = os.path.join(ROOT, "src", "front", "lmcache", "lmc_handlers.c")
EVENTS_C = os.path.join(ROOT, "src", "front", "lmcache", "lmc_events.c")
LMC_C = os.path.join(ROOT, "src", "front", "lmcache", "lmc.c")
DOC = os.path.join(ROOT, "docs", "lmcache-protocol.md")
REQS = os.path.join(ROOT, "python", "requirements-vllm.txt")


def _read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


# ------------------------------------------------------- kvtier's C tables


def c_ops():
    """lmc_ops[] of lmc_wire.c: enum name -> (RPC name, legacy id or None, nargs)."""
    src = _read(WIRE_C)
    body = src[src.index("const struct lmc_opinfo lmc_ops[LMC_OP_COUNT] = {"):]
    body = body[:body.index("};")]
    rows = re.findall(r'\[(LMC_\w+)\]\s*=\s*\{"(\w+)",\s*(\d+),\s*(\d+)\}', body)
    assert rows, "no rows found in lmc_ops[] of " + WIRE_C
    return {e: (name, int(lid) or None, int(n)) for e, name, lid, n in rows
            if e != "LMC_OP_UNKNOWN"}


def c_served():
    """The RPC names procs[] of lmc_handlers.c serves (every row but the
    lmcache_driven refusals), and the names it refuses that way."""
    src = _read(HANDLERS_C)
    body = src[src.index("static const struct lmc_proc procs[LMC_OP_COUNT] = {"):]
    body = body[:body.index("};")]
    rows = re.findall(r"\[(LMC_\w+)\]\s*=\s*\{\.fn\s*=\s*(\w+)", body)
    assert rows, "no rows found in procs[] of " + HANDLERS_C
    ops = c_ops()
    served = {ops[e][0] for e, fn in rows if fn != "h_lmc_driven"}
    refused = {ops[e][0] for e, fn in rows if fn == "h_lmc_driven"}
    return served, refused


def c_decoded_fields(func):
    """The map keys a decoder of lmc_wire.c reads (string literals passed to
    req_str / req_uint / kvt_mp_get in that function)."""
    src = _read(WIRE_C)
    i = src.index("\nint %s(" % func)
    body = src[i:src.index("\n}\n", i)]
    return set(re.findall(r'(?:req_str|req_uint|req_int|kvt_mp_get)\(\s*o,\s*"(\w+)"', body))


# ------------------------------------------------- lmcache, described


def _tname(t, seen):
    if t is type(None):
        return "None"
    if t is typing.Any:
        return "Any"
    if t is Ellipsis:
        return "..."
    origin = typing.get_origin(t)
    if origin is typing.Union or (hasattr(types, "UnionType") and origin is types.UnionType):
        return " | ".join(_tname(a, seen) for a in typing.get_args(t))
    if origin is not None:
        args = typing.get_args(t)
        name = getattr(origin, "__name__", str(origin))
        return "%s[%s]" % (name, ", ".join(_tname(a, seen) for a in args)) if args else name
    if isinstance(t, type):
        if t.__module__.startswith("lmcache"):
            seen.add(t)
        return t.__name__
    return repr(t)


def _describe_type(cls, seen):
    import msgspec

    if issubclass(cls, enum.Enum):
        return {"kind": "enum", "members": {m.name: m.value for m in cls}}
    if isinstance(cls, type) and issubclass(cls, msgspec.Struct):
        cfg = cls.__struct_config__
        return {"kind": "msgspec.Struct",
                "config": {k: getattr(cfg, k) for k in
                           ("array_like", "tag", "tag_field", "omit_defaults", "forbid_unknown_fields")},
                "fields": [[f.name, f.encode_name, _tname(f.type, seen), not f.required]
                           for f in msgspec.structs.fields(cls)]}
    if dataclasses.is_dataclass(cls):
        hints = typing.get_type_hints(cls)
        return {"kind": "dataclass",
                "fields": [[f.name, f.name, _tname(hints.get(f.name, f.type), seen),
                            f.default is not dataclasses.MISSING
                            or f.default_factory is not dataclasses.MISSING]
                           for f in dataclasses.fields(cls) if f.init]}
    return {"kind": "opaque"}  # never seen in 0.5.6's served operations


def describe(served=None):
    """The installed lmcache's MP protocol, as the snapshot holds it."""
    import importlib.metadata

    from lmcache.v1.multiprocess.rpc import get_rpc_specs
    from lmcache.v1.multiprocess.transport.zmq_impl.wire import LEGACY_OPERATION_IDS

    if served is None:
        served = c_served()[0]
    seen = set()
    ops = {}
    for name, spec in sorted(get_rpc_specs().items()):
        op = {"legacy_id": LEGACY_OPERATION_IDS.get(name), "nargs": len(spec.payload_types)}
        if name in served:
            op["args"] = [[p, _tname(t, seen)]
                          for p, t in zip(spec.signature.parameters, spec.payload_types)]
            op["response"] = _tname(spec.response_type, seen)
            op["streaming"] = spec.streaming
        ops[name] = op
    # the untyped `context` dicts of the prepare_* responses: the keys
    # LMCache's server puts there (modules/server_transfer.py) and the slot
    # schema its worker reads (transfer_context/shm.py)
    contexts = {}
    try:
        import ast
        import inspect

        from lmcache.v1.multiprocess.modules import server_transfer
        from lmcache.v1.multiprocess.transfer_context.shm import ShmSlotDescriptor
        seen.add(ShmSlotDescriptor)
        for node in ast.walk(ast.parse(inspect.getsource(server_transfer))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                for kw in node.keywords:
                    if kw.arg == "context" and isinstance(kw.value, ast.Dict):
                        contexts.setdefault(node.func.id, set()).update(
                            k.value for k in kw.value.keys if isinstance(k, ast.Constant))
        contexts = {k: sorted(v) for k, v in contexts.items()}
    except Exception as e:  # noqa: BLE001 - a drift too: the diff shows it
        contexts = {"error": "%s: %s" % (type(e).__name__, e)}
    described = {}
    while seen - set(described):
        for cls in sorted(seen - set(described), key=lambda c: c.__name__):
            described[cls] = _describe_type(cls, seen)
    return {
        "lmcache": importlib.metadata.version("lmcache"),
        "written_by": "tests/vllm/test_lmcache_protocol.py --write",
        "operations": ops,
        "context_keys": contexts,
        "types": {c.__name__: d for c, d in sorted(described.items(), key=lambda x: x[0].__name__)},
    }


def _diff(a, b, path=""):
    """Lines saying where the JSON-like values a (snapshot) and b differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b), key=str):
            p = "%s.%s" % (path, k) if path else str(k)
            if k not in b:
                out.append("%s: gone (was %s)" % (p, json.dumps(a[k])))
            elif k not in a:
                out.append("%s: new: %s" % (p, json.dumps(b[k])))
            else:
                out += _diff(a[k], b[k], p)
        return out
    named = lambda v: isinstance(v, list) and all(  # noqa: E731 - fields, args
        isinstance(x, list) and x and isinstance(x[0], str) for x in v)
    if named(a) and named(b) and a != b:
        out = _diff({x[0]: x[1:] for x in a}, {x[0]: x[1:] for x in b}, path)
        if [x[0] for x in a if x[0] in dict((y[0], 1) for y in b)] != \
                [x[0] for x in b if x[0] in dict((y[0], 1) for y in a)]:
            out.append("%s: order %s, now %s" % (path, [x[0] for x in a], [x[0] for x in b]))
        return out
    if a != b:
        return ["%s: %s, now %s" % (path, json.dumps(a), json.dumps(b))]
    return []


def _format(d):
    """The snapshot as JSON, one operation and one field a line (readable
    diffs)."""
    j = lambda v: json.dumps(v, sort_keys=True)  # noqa: E731
    out = ["{"]
    for k in ("lmcache", "written_by", "context_keys"):
        out.append(' "%s": %s,' % (k, j(d[k])))
    out.append(' "operations": {')
    ops = sorted(d["operations"].items())
    out += ['  %s: %s%s' % (j(n), j(op), "," if i < len(ops) - 1 else "")
            for i, (n, op) in enumerate(ops)]
    out.append(" },")
    out.append(' "types": {')
    tys = sorted(d["types"].items())
    for i, (n, t) in enumerate(tys):
        head = {k: v for k, v in t.items() if k != "fields"}
        if "fields" not in t:
            out.append("  %s: %s%s" % (j(n), j(head), "," if i < len(tys) - 1 else ""))
            continue
        out.append("  %s: %s, \"fields\": [" % (j(n), j(head)[:-1]))
        out += ["   %s%s" % (j(f), "," if k < len(t["fields"]) - 1 else "")
                for k, f in enumerate(t["fields"])]
        out.append("  ]}%s" % ("," if i < len(tys) - 1 else ""))
    out.append(" }")
    out.append("}")
    text = "\n".join(out) + "\n"
    assert json.loads(text) == json.loads(json.dumps(d))
    return text


def snapshot():
    with open(SNAPSHOT, encoding="utf-8") as f:
        return json.load(f)


# ---------------------------------------------------------------- tests


def test_c_tables_match_snapshot():
    """What kvtier's C code serves is what the snapshot says lmcache speaks."""
    snap = snapshot()
    ver = snap["lmcache"]
    sops = snap["operations"]
    errors = []

    ops = {name: (lid, n) for name, lid, n in c_ops().values()}
    for name, op in sorted(sops.items()):
        if name not in ops:
            errors.append("lmcache %s's operation %s has no row in lmc_ops[] (src/proto/lmc_wire.c)"
                          % (ver, name))
        elif ops[name] != (op["legacy_id"], op["nargs"]):
            errors.append("lmc_ops[] row %s: legacy id %s, %d payload frames; lmcache %s: %s, %d"
                          % (name, ops[name][0], ops[name][1], ver, op["legacy_id"], op["nargs"]))
    for name in sorted(set(ops) - set(sops)):
        errors.append("lmc_ops[] has %s, which lmcache %s does not have" % (name, ver))

    served, refused = c_served()
    described = {n for n, op in sops.items() if "args" in op}
    if served != described:
        errors.append("procs[] serves %s but the snapshot describes %s: write it again (--write)"
                      % (sorted(served), sorted(described)))

    # the fields kvtier's decoders read are the message's fields, and every
    # field without a default is read
    types_ = snap["types"]
    for func, tname in (("lmc_key_decode", "IPCCacheServerKey"),
                        ("lmc_register_decode", "RegisterEngineDrivenContextPayload")):
        fields = {f[1]: f[3] for f in types_[tname]["fields"]}
        got = c_decoded_fields(func)
        for f in sorted(got - set(fields)):
            errors.append("%s reads %r, which lmcache %s's %s does not have" % (func, f, ver, tname))
        for f in sorted(f for f, has_default in fields.items() if not has_default and f not in got):
            errors.append("lmcache %s's %s requires %r, which %s does not read"
                          % (ver, tname, f, func))

    # every field of what kvtier answers (the responses, the slots in their
    # `context`, the context's keys) is a key kvtier packs
    packed = set()
    for path in (LMC_C, HANDLERS_C, EVENTS_C):
        packed |= set(re.findall(r'kvt_mp_str0\(\s*[&\w.]+,\s*"(\w+)"\)', _read(path)))
    answers = {sops[n]["response"] for n in served} | {"ShmSlotDescriptor"}
    for tname in sorted(answers & set(types_)):
        for f in types_[tname].get("fields", []):
            if f[1] not in packed:
                errors.append("kvtier never packs %r (a field of lmcache %s's %s)" % (f[1], ver, tname))
    for tname, keys in sorted(snap["context_keys"].items()):
        for k in keys:
            if k not in packed:
                errors.append("kvtier never packs %r (a key of lmcache %s's %s.context)"
                              % (k, ver, tname))

    # the version kvtier names in its messages, the pin, the docs
    for path, pat in ((HANDLERS_C, r"kvtier speaks lmcache ([\d.]+)'s"),
                      (LMC_C, r'"lmcache ([\d.]+) multi-process'),
                      (REQS, r"^lmcache==([\d.]+)$"),
                      (DOC, r"Pinned version: \*\*lmcache ([\d.]+)\*\*")):
        found = set(re.findall(pat, _read(path), re.M))
        if found != {ver}:
            errors.append("%s names lmcache %s; the snapshot is of %s"
                          % (os.path.relpath(path, ROOT), sorted(found) or "no version", ver))

    doc = _read(DOC)
    table = doc[doc.index("## Operations"):]
    table = table[:table.index("\n## ")]
    for name in sorted(served | refused):
        lid = sops[name]["legacy_id"]
        want = "`%s` (%s)" % (name, lid) if lid else "`%s`" % name
        if want not in table:
            errors.append("docs/lmcache-protocol.md's operation table lacks %s" % want)

    assert not errors, "\n".join(errors)


def test_installed_lmcache_matches_snapshot():
    """The installed lmcache speaks the protocol kvtier serves."""
    import importlib.metadata
    try:
        installed = importlib.metadata.version("lmcache")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("no lmcache package here: run in the vLLM venv (make test-vllm)")
    snap = snapshot()
    try:
        now = describe()
    except Exception as e:  # noqa: BLE001 - modules moved or renamed: a drift
        pytest.fail("the installed lmcache %s does not define its MP protocol where lmcache %s "
                    "does (lmcache/v1/multiprocess/rpc.py get_rpc_specs, "
                    "transport/zmq_impl/wire.py LEGACY_OPERATION_IDS): %s: %s; kvtier serves "
                    "lmcache %s's protocol (see \"Moving the lmcache pin\" in "
                    "docs/lmcache-protocol.md)"
                    % (installed, snap["lmcache"], type(e).__name__, e, snap["lmcache"]))
    keys = ("operations", "context_keys", "types")
    diff = _diff({k: snap[k] for k in keys}, {k: now[k] for k in keys})
    assert not diff, (
        "the installed lmcache %s speaks another MP protocol than the one kvtier serves "
        "(lmcache %s, tests/data/lmcache-mp-protocol.json); see \"Moving the lmcache pin\" "
        "in docs/lmcache-protocol.md. Differences:\n  %s"
        % (installed, snap["lmcache"], "\n  ".join(diff)))


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/vllm/test_lmcache_protocol.py --write  "
                 "(in the venv with the lmcache to pin)")
    d = describe()
    with open(SNAPSHOT + ".tmp", "w", encoding="utf-8") as f:
        f.write(_format(d))
    os.replace(SNAPSHOT + ".tmp", SNAPSHOT)
    print("wrote %s (lmcache %s, %d operations, %d types)"
          % (SNAPSHOT, d["lmcache"], len(d["operations"]), len(d["types"])))
