#!/usr/bin/env bash
# Install what kvtier needs from Debian's packages, only what is missing
# (the object-store test servers: scripts/install-test-servers.sh). Runs apt-get as root (or through sudo).
set -euo pipefail
PKGS=(
  build-essential cmake pkg-config clang libclang-rt-14-dev clang-format
  libzmq3-dev libsodium-dev libmsgpack-dev libjansson-dev libssl-dev libxxhash-dev libmicrohttpd-dev
  liburing-dev libhiredis-dev libcurl4-openssl-dev liblz4-dev libzstd-dev libblkid-dev
  python3 python3-pytest python3-zmq
  # venvs: test_pip.py (a pure-Python pip install, offline), test_wheel.py, make wheel
  python3-venv python3-pip python3-setuptools python3-wheel
  redis-server redis-tools fio
  # packaging and service tests: dpkg-shlibdeps (make deb), lintian,
  # debootstrap (make debroot), systemd-analyze, promtool (from prometheus,
  # about 20 MB: a minute or two with its dependencies)
  dpkg-dev lintian debootstrap systemd prometheus
)
# Node.js runs the S3-compatible test server (tests/support/s3server);
# a nodejs already on PATH (e.g. NodeSource's) is used as it is.
command -v node >/dev/null 2>&1 || PKGS+=(nodejs npm)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "kvtier: installing ${missing[*]}" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq || true
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
