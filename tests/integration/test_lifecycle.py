"""A server's start and stop: one owner per directory (a second server,
a rerun on a busy port, a directory shared only when every server says
so, two adapters on one directory), storage problems that --dry-run and
the start both refuse with exit 2, and SIGTERM draining the stores still
pending before it exits 0."""

import os
import subprocess

import pytest

from support.data import adapter_json, fill, fs_files, keys_for, random_payloads, snapshot
from support.faultio import FAULTIO, needs_faultio
from support.paths import BIN
from support.ports import free_port
from support.server import run_kvtier

MiB = 1 << 20


def second(args, cwd, port=None, env=None, timeout=20):
    """Start another server in the foreground. Returns (exit status, output);
    status None when it was still running after timeout (then killed)."""
    cmd = [BIN, "server", "--port", str(port or free_port()), "--http-port", "0",
           "--l1-size-gb", "0.1", "--l1-init-size-gb", "0.1"] + list(args)
    p = subprocess.Popen(cmd, cwd=str(cwd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, env=env)
    try:
        out, _ = p.communicate(timeout=timeout)
        return p.returncode, out
    except subprocess.TimeoutExpired:
        p.kill()
        out, _ = p.communicate()
        return None, out


def nd_spec(d, **kw):
    return adapter_json(type="nixl_store_dynamic", backend="POSIX",
                        backend_params={"file_path": str(d), "max_capacity_gb": 1}, **kw)


def dir_args(kind, d, **kw):
    """Server args for an adapter on directory d: the embedded default
    (--data-dir) or nixl_store_dynamic; with kw, an explicit fs spec."""
    if kind == "nixl_store_dynamic":
        return ["--l2-adapter", nd_spec(d, **kw)]
    if kw:
        return ["--l2-adapter", adapter_json(type="fs", base_path=str(d), **kw)]
    return ["--data-dir", str(d)]


def write_config(path, root, url=None):
    lines = ["KVP_CACHE_ROOT=%s" % root, "KVP_CACHE_BUDGET_GB=1"]
    if url:
        lines.append("KVP_SERVER_URL=%s" % url)
    path.write_text("\n".join(lines) + "\n")
    return str(path)


# --------------------------------------------------- one owner per directory

@pytest.mark.parametrize("kind", ["fs", "nixl_store_dynamic"])
def test_second_server_on_the_same_directory_is_refused(make_server, tmp_path, kind):
    """A second server on a directory in use (as typed, or with
    persist_enabled false) exits at once naming the directory and the first
    server's pid; the first one's files are intact after it exits, and after
    the first one stops."""
    d = tmp_path / "cache"
    a = make_server(dir_args(kind, d))
    keys, pay = fill(a, "org/model")
    before = snapshot(d)
    assert len(before) == 6
    for args in (dir_args(kind, d), dir_args(kind, d, persist_enabled=False)):
        rc, out = second(args, tmp_path)
        assert rc == 1, out
        assert "in use by another kvtier server (pid %d)" % a.proc.pid in out, out
        assert str(d) in out, out
        assert snapshot(d) == before
    with a.client() as c:
        assert c.lookup(keys) == 6
        assert c.retrieve(keys) == pay
    assert a.stop() == 0
    assert snapshot(d) == before


def test_rerun_on_a_busy_port_touches_no_storage(make_server, tmp_path):
    """Listeners come first: a rerun that fails on its port has not created,
    scanned or cleaned any directory (a persist_enabled false one included)."""
    d = tmp_path / "cache"
    a = make_server(dir_args("fs", d))
    fill(a, "m")
    before = snapshot(d)
    fresh = tmp_path / "fresh"
    for args in (["--data-dir", str(fresh)], dir_args("fs", d, persist_enabled=False)):
        rc, out = second(args, tmp_path, port=a.port)
        assert rc == 1 and "Address already in use" in out, out
        assert not fresh.exists()
        assert snapshot(d) == before
        assert "in use by another kvtier server" not in out  # refused before any adapter


def test_shared_directory_needs_every_server_to_say_so(make_server, tmp_path):
    """"shared": true lets servers use one directory together (each serves
    the others' objects); an exclusive server is refused there, and a shared
    one where an exclusive one runs; shared with persist_enabled false is a
    config error (it would remove the others' files)."""
    d = tmp_path / "hf3fs"
    shared = nd_spec(d, shared=True)
    a = make_server(["--l2-adapter", shared])
    keys, pay = fill(a, "shared/model")
    before = snapshot(d)
    b = make_server(["--l2-adapter", shared])
    with b.client() as c:
        assert c.lookup(keys) == 6
        assert c.retrieve(keys) == pay
        assert c.status()["l2"][0]["shared"] is True
    rc, out = second(["--l2-adapter", nd_spec(d)], tmp_path)
    assert rc == 1 and "share it" in out and "\"shared\": true" in out, out
    assert b.stop() == 0 and a.stop() == 0
    assert snapshot(d) == before
    # the other way round: an exclusive owner refuses shared newcomers
    e = make_server(["--l2-adapter", nd_spec(d)])
    rc, out = second(["--l2-adapter", shared], tmp_path)
    assert rc == 1 and "(pid %d) that owns it alone" % e.proc.pid in out, out
    e.stop()
    for spec in (nd_spec(d, shared=True, persist_enabled=False),
                 adapter_json(type="fs", base_path=str(d), shared=True, persist_enabled="false")):
        r = run_kvtier("server", "--dry-run", "--l2-adapter", spec)
        assert r.returncode == 2 and '"shared"' in r.stderr and "persist_enabled" in r.stderr, \
            r.stderr
    assert snapshot(d) == before


# ------------------------------------------- two adapters on one directory

def _pairs(tmp_path):
    (tmp_path / "x").mkdir()
    os.symlink(tmp_path / "x", tmp_path / "link")
    fs = lambda p: adapter_json(type="fs", base_path=p)  # noqa: E731
    return {
        "relative-and-absolute": (fs("./x"), fs(str(tmp_path / "x"))),
        "trailing-slash-and-dotdot": (fs(str(tmp_path / "x") + "/"), fs(str(tmp_path / "x" / ".." / "x"))),
        "symlink": (fs(str(tmp_path / "link")), fs("x")),
        "fs-and-nixl_store_dynamic": (fs("x"), nd_spec(tmp_path / "x")),
        "not-created-yet": (fs("new"), nd_spec(tmp_path / "new")),
    }


@pytest.mark.parametrize("case", ["relative-and-absolute", "trailing-slash-and-dotdot", "symlink",
                                  "fs-and-nixl_store_dynamic", "not-created-yet"])
def test_two_adapters_on_one_directory_are_refused(tmp_path, case):
    a, b = _pairs(tmp_path)[case]
    r = run_kvtier("server", "--dry-run", "--l2-adapter", a, "--l2-adapter", b, cwd=str(tmp_path))
    assert r.returncode == 2, r.stderr
    assert "--l2-adapter #0" in r.stderr and "--l2-adapter #1" in r.stderr, r.stderr
    assert "same directory" in r.stderr, r.stderr
    assert not (tmp_path / "new").exists()


def test_two_adapters_on_one_directory_refused_at_start_and_with_config(tmp_path):
    root = tmp_path / "kv"
    spec = adapter_json(type="fs", base_path=str(root))
    rc, out = second(["--l2-adapter", spec, "--l2-adapter", nd_spec(root)], tmp_path)
    assert rc == 2 and "same directory" in out, out
    assert not root.exists()
    cfg = write_config(tmp_path / "cache.env", root)
    r = run_kvtier("server", "--config", cfg, "--l2-adapter", spec, "--dry-run")
    assert r.returncode == 2, r.stderr
    assert "--config %s" % cfg in r.stderr and "--l2-adapter #1 (fs)" in r.stderr, r.stderr


# ------------------------------------ storage problems: --dry-run, exit 2

def _storage_cases(tmp_path):
    f = tmp_path / "afile"
    f.write_text("x")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["HOME"] = str(tmp_path)
    s3 = adapter_json(type="s3", s3_endpoint="127.0.0.1:9", s3_bucket="kv", s3_addressing="path",
                      s3_region="us-east-1", disable_tls=True)
    return {
        "data-dir-is-a-file": (["--data-dir", str(f)], None, ["--data-dir", "is not a directory"]),
        "data-dir-parent-missing": (["--data-dir", str(tmp_path / "no" / "such")], None,
                                    ["--data-dir", "cannot be created"]),
        "raw_block-device-missing": (["--l2-adapter", adapter_json(
            type="raw_block", device_path=str(tmp_path / "nvme0n1"), slot_bytes=MiB)], None,
            ["--l2-adapter #0 (raw_block)", '"device_path"', "does not exist"]),
        "s3-without-credentials": (["--l2-adapter", s3], env,
                                   ["--l2-adapter #0 (s3)", "no AWS credentials"]),
    }


@pytest.mark.parametrize("case", ["data-dir-is-a-file", "data-dir-parent-missing",
                                  "raw_block-device-missing", "s3-without-credentials"])
def test_storage_problems_exit_2_in_dry_run_and_at_start(tmp_path, case):
    args, env, msgs = _storage_cases(tmp_path)[case]
    r = run_kvtier("server", "--dry-run", *args, env=env)
    assert r.returncode == 2, r.stdout + r.stderr
    for m in msgs:
        assert m in r.stderr, (m, r.stderr)
    rc, out = second(args, tmp_path, env=env)
    assert rc == 2 and msgs[-1] in out, out
    r = run_kvtier("server", "--dry-run", "--no-storage-check", *args, env=env)
    assert r.returncode == 0, r.stderr  # a config meant for another machine


def test_not_writable_directory_exits_2(tmp_path):
    d = tmp_path / "ro"
    d.mkdir()
    if os.geteuid() != 0:
        os.chmod(d, 0o555)
    elif subprocess.run(["chattr", "+i", str(d)], capture_output=True).returncode != 0:
        pytest.skip("root without chattr +i: no way to make a directory read-only here")
    try:
        r = run_kvtier("server", "--dry-run", "--data-dir", str(d))
        assert r.returncode == 2 and "--data-dir" in r.stderr and "not writable" in r.stderr, \
            r.stderr
    finally:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(d)])
        else:
            os.chmod(d, 0o755)


@needs_faultio
def test_sigterm_drains_and_exits_0(make_server, tmp_path):
    """SIGTERM waits for the stores still pending in L2: on a slow disk
    (every write takes 30 ms) most of them have not reached the adapter when
    the signal comes, and all of them are on disk, intact, after exit 0."""
    d = tmp_path / "drain"
    d.mkdir()
    env = {"LD_PRELOAD": FAULTIO, "KVT_FAULTIO": "dir=%s,delay_ms=30" % d}
    s = make_server(["--l2-adapter", adapter_json(type="fs", base_path=str(d))], env=env)
    keys = keys_for("drain", 10)
    pay = random_payloads(10, MiB)
    with s.client() as c:
        assert c.store(keys, pay) == 10
        cnt = c.status()["l2"][0]["counters"]
    assert cnt["store_ok"] + cnt["store_failed"] < 10, cnt  # still pending at the signal
    assert s.stop() == 0
    assert "draining" in s.read_log()
    assert len(fs_files(d)) == 10
    s.env = None
    s.start()
    s.wait_recovered()
    with s.client() as c:
        assert c.retrieve(keys) == pay
        assert c.status()["l2"][0]["counters"]["load_ok"] == 10


def test_sigterm_with_mock_stores_pending_exits_0(make_server, tmp_path):
    """The shutdown path with stores pending in a slow mock adapter, where
    faultio cannot load (the sanitizer runs): exit 0, the fs copies on disk.
    (That the pending stores are not dropped is test_sigterm_drains_and_exits_0.)"""
    d = tmp_path / "drain"
    s = make_server(["--l2-adapter", adapter_json(type="mock", max_size_gb=1, mock_bandwidth_gb=0.05),
                     "--l2-adapter", adapter_json(type="fs", base_path=str(d))])
    keys = keys_for("drain", 10)
    with s.client() as c:
        assert c.store(keys, random_payloads(10, MiB)) == 10
    assert s.stop() == 0
    assert len(fs_files(d)) == 10
