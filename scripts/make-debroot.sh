#!/usr/bin/env bash
# A fresh Debian 12 root for tests/integration/test_package.py, which installs
# the kvtier package there with dpkg and runs it under chroot:
#   scripts/make-debroot.sh [DIR]        (default: build/debroot; `make debroot`)
# debootstrap's minbase from $KVT_DEBIAN_MIRROR (deb.debian.org), then, with
# apt-get inside the root, the packages kvtier's .deb Depends on (so the test's
# dpkg -i runs offline and proves those Depends are enough). A few minutes and
# about 250 MB the first time; needs root and the mirror.
#
#   scripts/make-debroot.sh --python [DIR]   (default: build/debroot-python)
# The root for tests/integration/test_wheel.py: minbase plus Debian's python3
# and python3-venv (pinned below) and nothing else, so none of the libraries
# kvtier links (libzmq, OpenSSL, libcurl, ...) is there: the wheel must bring
# them. No .deb needed. 1-2 minutes and 270 MB.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
B="${BUILD:-build}"
[[ "$B" = /* ]] || B="$ROOT/$B"
MIRROR="${KVT_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
# bookworm's versions (python3 3.11.2): what the wheel test's venv runs on
PYTHON_PKGS="python3=3.11.2-1+b1 python3-venv=3.11.2-1+b1"
MODE=deb
if [ "${1:-}" = "--python" ]; then
  MODE=python
  shift
fi
if [ "$MODE" = python ]; then
  DEST="${1:-$B/debroot-python}"
else
  DEST="${1:-$B/debroot}"
  DEB="$(ls "$B"/deb/kvtier_*.deb 2>/dev/null | tail -1 || true)"
  if [ -z "$DEB" ]; then
    echo "kvtier: no package in $B/deb: run make deb first" >&2
    exit 1
  fi
fi
if [ ! -x "$DEST/usr/bin/apt-get" ]; then
  rm -rf "$DEST.tmp"
  echo "kvtier: debootstrap bookworm (minbase) from $MIRROR into $DEST" >&2
  debootstrap --variant=minbase bookworm "$DEST.tmp" "$MIRROR" >/dev/null
  mv "$DEST.tmp" "$DEST"
fi
if [ "$MODE" = python ]; then
  deps="$PYTHON_PKGS"
  echo "kvtier: installing $deps into $DEST" >&2
else
  # the names in Depends, without versions: "a (>= 1), b" -> "a b"
  deps="$(dpkg-deb -f "$DEB" Depends | tr ',' '\n' | sed -e 's/(.*)//' -e 's/|.*//' | xargs)"
  echo "kvtier: installing the package's Depends into $DEST: $deps" >&2
fi
cp /etc/resolv.conf "$DEST/etc/resolv.conf"
chroot "$DEST" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
# shellcheck disable=SC2086
chroot "$DEST" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
  $deps >/dev/null
chroot "$DEST" apt-get clean
echo "kvtier: $DEST is ready" >&2
