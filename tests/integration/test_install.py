"""Description: `make install` (CMake's install rules) into a DESTDIR works
from there: the installed binary serves, the installed client library talks
to it, and `pkg-config --cflags --libs kvtier` builds a C program against the
installed headers and library.
"""

import re
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from support.install import BUILD, ROUND_TRIP_C, InstalledServer, needs_build_tree
from support.paths import BIN, ROOT


def install(tmp_path, prefix):
    dest = tmp_path / "root"
    env = dict(os.environ, DESTDIR=str(dest))
    subprocess.run(["cmake", "--install", BUILD, "--prefix", prefix], env=env, check=True,
                   stdout=subprocess.DEVNULL)
    return dest


def round_trip(lib, url):
    """A store, lookup and retrieve in a fresh interpreter loading lib (the
    installed libkvtier_client), over ZeroMQ only."""
    code = textwrap.dedent("""
        import sys, kvtier
        c = kvtier.Client(sys.argv[1], shm=False, local=False)
        keys = kvtier.chunk_keys("install-test", list(range(512)), chunk_size=256)
        assert c.store(keys, [b"a" * 4096, b"b" * 4096]) == 2
        assert c.lookup(keys) == 2
        got = [bytes(v) for v in c.retrieve(keys)]
        assert got == [b"a" * 4096, b"b" * 4096], got
        print("round trip ok", kvtier._find_library())
        """)
    # the tree's module (never one installed with pip), with lib
    env = dict(os.environ, KVTIER_LIB=lib, PYTHONPATH=os.path.join(ROOT, "python"))
    r = subprocess.run([sys.executable, "-c", code, url], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


@needs_build_tree
def test_destdir_install_layout_and_run(tmp_path):
    root = install(tmp_path, "/usr")
    # prefix /usr is a system install: /etc/kvtier and /lib/systemd/system
    for rel in ("usr/bin/kvtier", "usr/lib/libkvtier_client.so.0", "usr/lib/libkvtier_client.so",
                "usr/include/kvtier/client.h", "usr/include/kvtier/error.h",
                "usr/lib/pkgconfig/kvtier.pc", "usr/share/man/man1/kvtier.1.gz",
                "usr/share/man/man5/kvtier-cache.env.5.gz", "etc/kvtier/cache.env",
                "etc/kvtier/quotas.json", "lib/systemd/system/kvtier.service",
                "usr/lib/sysusers.d/kvtier.conf"):
        assert (root / rel).exists(), rel
    unit = (root / "lib/systemd/system/kvtier.service").read_text()
    assert "ExecStart=/usr/bin/kvtier server --config /etc/kvtier/cache.env" in unit
    assert "Type=notify" in unit
    pc = (root / "usr/lib/pkgconfig/kvtier.pc").read_text()
    assert "prefix=/usr\n" in pc

    kv = str(root / "usr/bin/kvtier")
    v = subprocess.run([kv, "--version"], capture_output=True, text=True, check=True)
    assert v.stdout.startswith("kvtier ")
    # the installed example config is valid as shipped (a dry run, no storage)
    d = subprocess.run([kv, "server", "--config", str(root / "etc/kvtier/cache.env"), "--dry-run",
                        "--no-storage-check"], capture_output=True, text=True)
    assert d.returncode == 0, d.stderr

    s = InstalledServer(kv, [], tmp_path, data_dir=str(tmp_path / "data"))
    s.start()
    try:
        out = round_trip(str(root / "usr/lib/libkvtier_client.so.0"), s.url)
        assert str(root) in out
    finally:
        s.kill()


@needs_build_tree
@pytest.mark.skipif(not shutil.which("pkg-config") or not shutil.which("cc"),
                    reason="pkg-config or cc missing")
def test_pkg_config_builds_against_installed_library(make_server, tmp_path):
    root = install(tmp_path, "/opt/kvt")
    assert "prefix=/opt/kvt\n" in (root / "opt/kvt/lib/pkgconfig/kvtier.pc").read_text()
    unit = (root / "opt/kvt/lib/systemd/system/kvtier.service").read_text()
    assert "--config /opt/kvt/etc/kvtier/cache.env" in unit
    env = dict(os.environ, PKG_CONFIG_PATH=str(root / "opt/kvt/lib/pkgconfig"),
               PKG_CONFIG_SYSROOT_DIR=str(root))
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "kvtier"], env=env,
                           capture_output=True, text=True, check=True).stdout.split()
    assert "-I%s/opt/kvt/include" % root in flags and "-lkvtier_client" in flags, flags
    src = tmp_path / "rt.c"
    src.write_text(ROUND_TRIP_C)
    exe = tmp_path / "rt"
    cc = subprocess.run(["cc", "-std=c11", "-Wall", "-Werror", "-o", str(exe), str(src)] + flags,
                        capture_output=True, text=True)
    assert cc.returncode == 0, cc.stderr
    s = make_server()
    r = subprocess.run([str(exe), s.url], capture_output=True, text=True, timeout=30,
                       env=dict(os.environ, LD_LIBRARY_PATH=str(root / "opt/kvt/lib")))
    assert r.returncode == 0, r.stderr
    assert r.stdout == "hello from the C API\n"
    # the program records the soname, and the installed copy is the one loaded
    ldd = subprocess.run(["ldd", str(exe)], capture_output=True, text=True,
                         env=dict(os.environ, LD_LIBRARY_PATH=str(root / "opt/kvt/lib"))).stdout
    assert "libkvtier_client.so.0 => %s/opt/kvt/lib/libkvtier_client.so.0" % root in ldd, ldd


@pytest.mark.skipif(not shutil.which("man"), reason="man missing (Debian's man-db)")
def test_man_pages_render_and_cover_every_command():
    """kvtier(1) documents every command `kvtier help` lists and both pages
    format without groff warnings."""
    usage = subprocess.run([BIN, "help"], capture_output=True, text=True, check=True).stdout
    commands = re.findall(r"^  (\w+)\s", usage, re.M)
    assert {"server", "status", "purge", "replay", "version"} <= set(commands), usage
    pages = {}
    for page in ("kvtier.1", "kvtier-cache.env.5"):
        r = subprocess.run(["man", "--warnings", "-l", os.path.join(ROOT, "man", page)],
                           capture_output=True, text=True, env=dict(os.environ, MANWIDTH="100"))
        assert r.returncode == 0 and r.stderr == "", r.stderr
        pages[page] = r.stdout
    text = pages["kvtier.1"]
    body = text[text.index("COMMANDS"):text.index("EXIT STATUS")]
    for cmd in commands:
        assert re.search(r"^\s+%s\b" % cmd, body, re.M), cmd
    # kvtier-cache.env(5) names every variable the config parser knows
    env = pages["kvtier-cache.env.5"]
    with open(os.path.join(ROOT, "src", "ops", "envcfg.c")) as f:
        known = set(re.findall(r'\{"(KVP_[A-Z_]+)", V_', f.read()))
    assert len(known) >= 10
    for v in known:
        assert v in env, v
