"""Description: the wheel (`make wheel`: scripts/build-wheel.sh; the backend
python/_backend/kvtier_build.py runs scikit-build-core then auditwheel repair) carries the server binary, libkvtier_client, the
Python client, kvtier.kvcopy, the vLLM connector and every shared library
they need but glibc's (and the manylinux policy's libstdc++, libgcc_s, libz),
and runs where none of those libraries is installed: it is pip-installed into
a fresh venv inside a Debian 12 minbase root that has only python3 and
python3-venv added (`scripts/make-debroot.sh --python`, built here when
missing), and there `kvtier server` starts on its embedded default (./kvtier-data),
the wheel's Python client stores and retrieves through the bundled library,
`kvtier status` reports the server, and ldd resolves nothing outside the
wheel but glibc's libraries. The wheel is built once per session (an
incremental CMake build under build/wheel/cmake after the first). The sdist
carries the C sources, and a build without the -dev packages names them.
`import kvtier.vllm` with vLLM in that venv is not tried (vLLM and torch are
gigabytes; tests/vllm covers the connector).
"""

import glob
import os
import re
import shutil
import subprocess
import tarfile
import time
import zipfile

import pytest

from support.paths import BIN, ROOT, SANITIZER
from support.ports import free_port

BUILD = os.path.dirname(os.path.abspath(BIN))
PYROOT = os.environ.get("KVT_DEBROOT_PYTHON", os.path.join(BUILD, "debroot-python"))
VENV = "/opt/kvtier-wheel-test"  # inside PYROOT
SITE = VENV + "/lib/python3.11/site-packages"
# what may resolve outside the wheel: glibc's own libraries, and what the
# manylinux policies list as always there (auditwheel leaves them out)
GLIBC = ("linux-vdso.so.1", "libc.so.6", "libm.so.6", "libpthread.so.0", "libdl.so.2",
         "librt.so.1", "libresolv.so.2", "ld-linux-x86-64.so.2")
POLICY = ("libstdc++.so.6", "libgcc_s.so.1", "libz.so.1")

pytestmark = pytest.mark.skipif(
    bool(SANITIZER),
    reason="the wheel is checked in the plain suite (it builds its own Release binary)")


def cmake_version():
    cm = open(os.path.join(ROOT, "CMakeLists.txt")).read()
    return re.search(r"project\(kvtier VERSION ([0-9.]+)", cm).group(1)


@pytest.fixture(scope="session")
def wheel():
    """build/wheel/dist/kvtier-<v>-py3-none-manylinux_*.whl, built from this tree."""
    t0 = time.monotonic()
    r = subprocess.run([os.path.join(ROOT, "scripts", "build-wheel.sh")], capture_output=True,
                       text=True, env=dict(os.environ, BUILD=BUILD))
    assert r.returncode == 0, r.stdout + r.stderr
    path = r.stdout.strip().splitlines()[-1]
    print("wheel: %s, %.1f MB, built in %.0f s" % (os.path.basename(path),
                                                  os.path.getsize(path) / 1e6,
                                                  time.monotonic() - t0))
    return path


@pytest.fixture(scope="session")
def pyroot():
    """The minbase + python3 root, with /proc mounted (the dynamic linker
    reads /proc/self/exe to expand the binary's $ORIGIN RPATH)."""
    if os.geteuid() != 0:
        pytest.skip("chroot, mount and debootstrap need root")
    if not os.path.exists(os.path.join(PYROOT, "usr/bin/python3")):
        r = subprocess.run([os.path.join(ROOT, "scripts", "make-debroot.sh"), "--python", PYROOT],
                           capture_output=True, text=True, env=dict(os.environ, BUILD=BUILD))
        if r.returncode:
            pytest.skip("no Debian root with python3 at %s (scripts/make-debroot.sh --python "
                        "failed: %s)" % (PYROOT, (r.stderr.strip().splitlines() or ["?"])[-1]))
    proc = os.path.join(PYROOT, "proc")
    mounted = os.path.exists(os.path.join(proc, "self"))
    if not mounted:
        r = subprocess.run(["mount", "-t", "proc", "proc", proc], capture_output=True, text=True)
        if r.returncode:
            pytest.skip("cannot mount /proc in %s (%s): the binary's $ORIGIN RPATH needs it"
                        % (PYROOT, r.stderr.strip()))
    yield PYROOT
    if not mounted:
        subprocess.run(["umount", "-l", proc])


def ch(root, *cmd, **kw):
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    kw.setdefault("timeout", 120)
    env = kw.pop("env", {})
    base = ["env", "-i", "PATH=%s/bin:/usr/bin:/bin" % VENV, "HOME=/root", "LANG=C.UTF-8"]
    base += ["%s=%s" % kv for kv in env.items()]
    return subprocess.run(["chroot", root] + base + list(cmd), **kw)


@pytest.fixture(scope="session")
def venv(wheel, pyroot):
    """A fresh venv in the root with the wheel pip-installed (offline)."""
    shutil.rmtree(pyroot + VENV, ignore_errors=True)
    os.makedirs(os.path.join(pyroot, "tmp", "wheel"), exist_ok=True)
    for old in glob.glob(os.path.join(pyroot, "tmp", "wheel", "*.whl")):
        os.remove(old)
    shutil.copy(wheel, os.path.join(pyroot, "tmp", "wheel"))
    r = ch(pyroot, "python3", "-m", "venv", VENV)
    assert r.returncode == 0, r.stdout + r.stderr
    r = ch(pyroot, VENV + "/bin/pip", "install", "-q", "--no-index", "--no-deps",
           "--disable-pip-version-check", "/tmp/wheel/" + os.path.basename(wheel))
    assert r.returncode == 0, r.stdout + r.stderr
    yield pyroot
    shutil.rmtree(pyroot + VENV, ignore_errors=True)


def test_wheel_contents_and_manylinux_tag(wheel):
    name = os.path.basename(wheel)
    m = re.fullmatch(r"kvtier-([0-9.]+)-py3-none-(manylinux_2_\d+_x86_64)\.whl", name)
    assert m, name
    assert m.group(1) == cmake_version()
    aw = os.path.join(BUILD, "wheel-venv", "bin", "auditwheel")
    show = subprocess.run([aw, "show", wheel], capture_output=True, text=True, check=True).stdout
    assert 'consistent with the\nfollowing platform tag: "%s"' % m.group(2) in show, show
    names = zipfile.ZipFile(wheel).namelist()
    for f in ("kvtier/__init__.py", "kvtier/__main__.py", "kvtier/_cli.py", "kvtier/kvcopy.py",
              "kvtier/vllm.py", "kvtier/_bin/kvtier", "kvtier/libkvtier_client.so"):
        assert f in names, f
    libs = {re.sub(r"-[0-9a-f]{8}\..*", "", os.path.basename(n))
            for n in names if n.startswith("kvtier.libs/")}
    for lib in ("libzmq", "libmsgpackc", "libjansson", "libmicrohttpd", "liburing", "libssl",
                "libcrypto", "libcurl", "libhiredis", "liblz4", "libzstd", "libblkid"):
        assert lib in libs, (lib, sorted(libs))
    di = "kvtier-%s.dist-info/" % m.group(1)
    ep = zipfile.ZipFile(wheel).read(di + "entry_points.txt").decode()
    assert re.search(r"^kvtier = kvtier\._cli:main$", ep, re.M), ep
    # every Debian package a bundled library came from has its copyright file
    # in the wheel (python/_backend/wheel_licenses.py), and RECORD lists them
    import json
    sbom = json.loads(zipfile.ZipFile(wheel).read(di + "sboms/auditwheel.cdx.json"))
    debs = {c["name"] for c in sbom["components"] if c.get("purl", "").startswith("pkg:deb/")}
    assert {"libzmq5", "libssl3", "libcurl4"} <= debs, debs
    record = zipfile.ZipFile(wheel).read(di + "RECORD").decode()
    for d in debs:
        f = di + "licenses/debian/%s.copyright" % d
        assert f in names, f
        assert re.search("^%s,sha256=" % re.escape(f), record, re.M), f


def test_ldd_resolves_only_inside_the_wheel_and_glibc(venv):
    for f in ("kvtier/_bin/kvtier", "kvtier/libkvtier_client.so"):
        out = ch(venv, "ldd", SITE + "/" + f, check=True).stdout
        assert "not found" not in out, out
        for line in out.splitlines():
            line = line.strip()
            name = line.split()[0]
            target = line.split("=>")[1].split("(")[0].strip() if "=>" in line else name
            inside = os.path.normpath(target).startswith(SITE + "/kvtier.libs/")
            outside_ok = os.path.basename(name) in GLIBC + POLICY
            assert inside or outside_ok, (f, line)


def test_server_client_and_status_in_a_bare_root(venv):
    root = venv
    v = ch(root, "kvtier", "--version")
    assert v.returncode == 0 and v.stdout.strip() == "kvtier %s" % cmake_version(), v.stdout + v.stderr
    work = "/var/tmp/kvtier-wheel-%d" % os.getpid()
    shutil.rmtree(root + work, ignore_errors=True)
    os.makedirs(root + work)
    proc = None
    try:
        for _ in range(5):
            port = free_port()
            url = "tcp://127.0.0.1:%d" % port
            log = open(root + work + "/server.log", "w")
            # no --l2-adapter: the embedded default, fs under ./kvtier-data
            proc = subprocess.Popen(
                ["chroot", root, "/bin/sh", "-c", "cd %s && exec env -i PATH=%s/bin:/usr/bin:/bin "
                 "kvtier server --port %d --http-port 0" % (work, VENV, port)],
                stdout=log, stderr=subprocess.STDOUT)
            deadline = time.monotonic() + 30
            up = False
            while time.monotonic() < deadline and proc.poll() is None:
                if ch(root, "kvtier", "status", "--url", url, timeout=30).returncode == 0:
                    up = True
                    break
                time.sleep(0.3)
            if up:
                break
            text = open(root + work + "/server.log").read()
            proc.kill()
            proc.wait()
            assert "Address already in use" in text, text
        assert up, open(root + work + "/server.log").read()
        st = ch(root, "kvtier", "status", "--url", url)
        assert st.returncode == 0 and "healthy" in st.stdout and "fs" in st.stdout, st.stdout + st.stderr
        assert os.path.isdir(root + work + "/kvtier-data"), os.listdir(root + work)
        code = ("import kvtier, sys\n"
                "print(kvtier._find_library())\n"
                "c = kvtier.Client(sys.argv[1])\n"
                "keys = kvtier.chunk_keys('wheel-test', list(range(512)), chunk_size=256)\n"
                "data = [b'first chunk' * 100, b'second chunk' * 100]\n"
                "assert c.store(keys, data) == 2\n"
                "assert c.lookup(keys) == 2\n"
                "assert [bytes(b) for b in c.retrieve(keys)] == data\n"
                "print('round trip ok')\n")
        r = ch(root, VENV + "/bin/python", "-c", code, url)
        assert r.returncode == 0, r.stdout + r.stderr
        assert r.stdout.splitlines() == [SITE + "/kvtier/libkvtier_client.so", "round trip ok"], r.stdout
        # python3 -m kvtier status through the bundled library
        r = ch(root, VENV + "/bin/python", "-m", "kvtier", "status", "--url", url)
        assert r.returncode == 0 and "healthy" in r.stdout, r.stdout + r.stderr
        # KVTIER_LIB still comes first
        r = ch(root, VENV + "/bin/python", "-m", "kvtier", "library",
               env={"KVTIER_LIB": "/nonexistent/libkvtier_client.so"})
        assert r.returncode == 1 and "/nonexistent/libkvtier_client.so" in r.stderr, r.stderr
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(root + work, ignore_errors=True)


@pytest.fixture(scope="module")
def sdist():
    r = subprocess.run([os.path.join(ROOT, "scripts", "build-wheel.sh"), "--sdist"],
                       capture_output=True, text=True, env=dict(os.environ, BUILD=BUILD))
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout.strip().splitlines()[-1]


def test_sdist_carries_the_c_sources(sdist):
    v = cmake_version()
    assert os.path.basename(sdist) == "kvtier-%s.tar.gz" % v
    with tarfile.open(sdist) as t:
        names = set(t.getnames())
    top = "kvtier-%s/" % v
    for f in ("pyproject.toml", "PKG-INFO", "_backend/kvtier_build.py",
              "_backend/wheel_licenses.py", "CMakeLists.txt", "packaging/deps.cmake",
              "packaging/wheel.cmake", "src/cli/main.c", "include/kvtier/client.h",
              "kvtier/__init__.py", "kvtier/_cli.py"):
        assert top + f in names, f
    assert not any("/tests/" in n or "/build/" in n for n in names)


def test_source_build_names_the_missing_debian_packages(tmp_path):
    """What `pip install kvtier-<v>.tar.gz` says on a host without the -dev
    packages: CMake's configure stops with the apt-get line."""
    empty = tmp_path / "pc"
    empty.mkdir()
    env = dict(os.environ, PKG_CONFIG_PATH=str(empty), PKG_CONFIG_LIBDIR=str(empty))
    r = subprocess.run(["cmake", "-S", ROOT, "-B", str(tmp_path / "b"), "-DSKBUILD=ON"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode != 0
    out = r.stdout + r.stderr
    m = re.search(r"sudo apt-get install ([a-z0-9 .+-]+)", out)
    assert m, out
    named = m.group(1).split()
    for deb in ("libzmq3-dev", "libjansson-dev", "libssl-dev", "libcurl4-openssl-dev",
                "libmicrohttpd-dev", "liburing-dev", "libhiredis-dev", "libzstd-dev"):
        assert deb in named, (deb, named)
