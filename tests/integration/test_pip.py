"""Description: `KVTIER_PURE_PYTHON=1 pip install ./python` installs the
kvtier module alone (client, kvcopy, the vLLM connector, `python3 -m
kvtier`), which finds the C library through pkg-config after `make
install`, and `python3 -m kvtier status` reports a running server. (Without
KVTIER_PURE_PYTHON, pip builds the wheel with the server and the library:
test_wheel.py.)
"""

import os
import shutil
import subprocess
import sys

import pytest

from support.install import needs_build_tree
from support.paths import BIN, ROOT


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """A virtual environment with the kvtier module pip-installed from a copy
    of python/ (pip builds in the source folder; the tree stays clean),
    offline and pure Python (KVTIER_PURE_PYTHON=1: no C build, no bundled
    library, as a system install with `make install` or the Debian package
    has it; the wheel with the library is test_wheel.py's). The build
    backend, scikit-build-core, comes from build/wheel-venv
    (scripts/build-wheel.sh --tools, pinned in python/requirements-wheel.txt)."""
    r = subprocess.run([os.path.join(ROOT, "scripts", "build-wheel.sh"), "--tools"],
                       capture_output=True, text=True,
                       env=dict(os.environ, BUILD=os.path.dirname(os.path.abspath(BIN))))
    assert r.returncode == 0, r.stdout + r.stderr
    tools_site = r.stdout.strip().splitlines()[-1]
    d = tmp_path_factory.mktemp("pip")
    src = d / "src"
    shutil.copytree(os.path.join(ROOT, "python"), src,
                    ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    v = d / "venv"
    # --without-pip: the system's pip (Debian's python3-pip) installs into
    # the venv it runs in, and seeding one takes seconds
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages",
                    str(v)], check=True)
    py = str(v / "bin" / "python")
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    os.makedirs(site, exist_ok=True)
    with open(os.path.join(site, "kvtier-build-tools.pth"), "w") as f:
        f.write(tools_site + "\n")
    r = subprocess.run([py, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                        "--no-build-isolation", "--disable-pip-version-check", str(src)],
                       capture_output=True, text=True, env=dict(os.environ, KVTIER_PURE_PYTHON="1"))
    if r.returncode and "No module named pip" in r.stderr:
        pytest.skip("no pip for %s (Debian's python3-pip)" % sys.executable)
    assert r.returncode == 0, r.stdout + r.stderr
    return py


def clean_env(**kw):
    env = {k: v for k, v in os.environ.items() if k not in ("KVTIER_LIB", "PYTHONPATH")}
    env.update(kw)
    return env


@needs_build_tree
@pytest.mark.skipif(not shutil.which("pkg-config"), reason="pkg-config missing")
def test_pip_install_finds_library_by_pkg_config_and_reports_status(venv, make_server, tmp_path):
    prefix = tmp_path / "prefix"
    subprocess.run(["cmake", "--install", os.path.dirname(BIN), "--prefix", str(prefix)],
                   check=True, stdout=subprocess.DEVNULL, env=dict(os.environ, DESTDIR=""))
    env = clean_env(PKG_CONFIG_PATH=str(prefix / "lib" / "pkgconfig"))
    cwd = str(tmp_path)  # not the tree: the installed module is the one imported
    files = subprocess.run([venv, "-c", "import kvtier, os; d = os.path.dirname(kvtier.__file__); "
                            "print(d); print(sorted(os.listdir(d)))"], env=env, cwd=cwd,
                           capture_output=True, text=True, check=True).stdout
    assert "site-packages" in files.splitlines()[0], files
    for f in ("__init__.py", "__main__.py", "kvcopy.py", "vllm.py"):
        assert f in files, files
    lib = subprocess.run([venv, "-m", "kvtier", "library"], env=env, cwd=cwd, capture_output=True,
                         text=True, check=True).stdout.strip()
    assert lib == str(prefix / "lib" / "libkvtier_client.so.0"), lib

    s = make_server()
    r = subprocess.run([venv, "-m", "kvtier", "status", "--url", s.url], env=env, cwd=cwd,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("kvtier ") and "healthy" in r.stdout and "L2 fs[0]" in r.stdout, r.stdout
    r = subprocess.run([venv, "-m", "kvtier", "status", "--url", s.url, "--json"], env=env, cwd=cwd,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and '"is_healthy": true' in r.stdout, r.stdout + r.stderr
    # nobody there: exit 1 with the reason
    s.kill()
    r = subprocess.run([venv, "-m", "kvtier", "status", "--url", s.url, "--timeout-ms", "500"],
                       env=env, cwd=cwd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and s.url in r.stderr, r.stdout + r.stderr


def test_pyproject_version_matches_cmake():
    import re
    cm = open(os.path.join(ROOT, "CMakeLists.txt")).read()
    pp = open(os.path.join(ROOT, "python", "pyproject.toml")).read()
    v1 = re.search(r"project\(kvtier VERSION ([0-9.]+)", cm).group(1)
    v2 = re.search(r'^version = "([0-9.]+)"', pp, re.M).group(1)
    assert v1 == v2


def test_without_the_c_library_one_line_naming_the_fix(venv, tmp_path):
    """A pure-Python install alone: the module is there, the C library is
    not (no KVTIER_LIB, no kvtier.pc, nothing on the linker's path).
    `python3 -m kvtier status` and `library` print one line that names the
    fix and exit 1, never a traceback."""
    import ctypes.util
    if ctypes.util.find_library("kvtier_client"):
        pytest.skip("libkvtier_client is installed on this machine")
    empty = tmp_path / "no-pc"
    empty.mkdir()
    env = clean_env(PKG_CONFIG_PATH=str(empty), PKG_CONFIG_LIBDIR=str(empty))
    for args in (["status"], ["library"], ["status", "--json"]):
        r = subprocess.run([venv, "-m", "kvtier"] + args, env=env, cwd=str(tmp_path),
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 1, (args, r.stdout, r.stderr)
        assert r.stdout == ""
        assert "Traceback" not in r.stderr, r.stderr
        lines = r.stderr.splitlines()
        assert len(lines) == 1, r.stderr
        assert "libkvtier_client.so not found" in lines[0] and "KVTIER_LIB" in lines[0], lines
    # a KVTIER_LIB that is not a library: one line too
    env["KVTIER_LIB"] = str(tmp_path / "missing.so")
    r = subprocess.run([venv, "-m", "kvtier", "library"], env=env, cwd=str(tmp_path),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and len(r.stderr.splitlines()) == 1, r.stderr
    assert "cannot load the kvtier C library" in r.stderr and "Traceback" not in r.stderr


@needs_build_tree
def test_a_client_error_is_reported_once(tmp_path):
    """The C library prints nothing: the caller reports its error once (the
    Python exception, `python3 -m kvtier`'s one line), instead of the
    library's own line on stderr and then the exception."""
    env = clean_env(KVTIER_LIB=os.path.join(os.path.dirname(BIN), "libkvtier_client.so"),
                    PYTHONPATH=os.path.join(ROOT, "python"))
    code = ("import kvtier\n"
            "for url in ('tcp://127.0.0.1:1', 'foo://x'):\n"
            "    try:\n"
            "        kvtier.Client(url, connect_timeout_ms=500)\n"
            "    except kvtier.KvtierError as e:\n"
            "        print(e.name, e)\n")
    r = subprocess.run([sys.executable, "-c", code], env=env, cwd=str(tmp_path),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stderr == "", r.stderr
    assert "ECONNREFUSED" in r.stdout and "EINVAL" in r.stdout, r.stdout
    r = subprocess.run([sys.executable, "-m", "kvtier", "status", "--url", "tcp://127.0.0.1:1"],
                       env=env, cwd=str(tmp_path), capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stderr
    assert r.stderr.splitlines() == [
        "kvtier: tcp://127.0.0.1:1: ECONNREFUSED (-111): no server at tcp://127.0.0.1:1: "
        "connection refused (nothing listens on port 1 of 127.0.0.1)"], r.stderr
