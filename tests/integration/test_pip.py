"""Description: `pip install ./python` installs the kvtier module (client,
kvcopy, the vLLM connector, `python3 -m kvtier`), which finds the C library
through pkg-config after `make install`, and `python3 -m kvtier status`
reports a running server.
"""

import os
import shutil
import subprocess
import sys

import pytest

from conftest import BIN, ROOT
from test_install import needs_build_tree


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """A virtual environment with kvtier pip-installed from a copy of
    python/ (pip builds in the source folder; the tree stays clean), offline:
    the system's setuptools builds it."""
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
    r = subprocess.run([py, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                        "--no-build-isolation", "--disable-pip-version-check", str(src)],
                       capture_output=True, text=True)
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
