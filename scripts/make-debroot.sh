#!/usr/bin/env bash
# A fresh Debian 12 root for tests/integration/test_package.py, which installs
# the kvtier package there with dpkg and runs it under chroot:
#   scripts/make-debroot.sh [DIR]        (default: build/debroot; `make debroot`)
# debootstrap's minbase from $KVT_DEBIAN_MIRROR (deb.debian.org), then, with
# apt-get inside the root, the packages kvtier's .deb Depends on (so the test's
# dpkg -i runs offline and proves those Depends are enough). A few minutes and
# about 250 MB the first time; needs root and the mirror.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
B="${BUILD:-build}"
[[ "$B" = /* ]] || B="$ROOT/$B"
DEST="${1:-$B/debroot}"
MIRROR="${KVT_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
DEB="$(ls "$B"/deb/kvtier_*.deb 2>/dev/null | tail -1 || true)"
if [ -z "$DEB" ]; then
  echo "kvtier: no package in $B/deb: run make deb first" >&2
  exit 1
fi
if [ ! -x "$DEST/usr/bin/apt-get" ]; then
  rm -rf "$DEST.tmp"
  echo "kvtier: debootstrap bookworm (minbase) from $MIRROR into $DEST" >&2
  debootstrap --variant=minbase bookworm "$DEST.tmp" "$MIRROR" >/dev/null
  mv "$DEST.tmp" "$DEST"
fi
# the names in Depends, without versions: "a (>= 1), b" -> "a b"
deps="$(dpkg-deb -f "$DEB" Depends | tr ',' '\n' | sed -e 's/(.*)//' -e 's/|.*//' | xargs)"
cp /etc/resolv.conf "$DEST/etc/resolv.conf"
echo "kvtier: installing the package's Depends into $DEST: $deps" >&2
chroot "$DEST" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
# shellcheck disable=SC2086
chroot "$DEST" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
  $deps >/dev/null
chroot "$DEST" apt-get clean
echo "kvtier: $DEST is ready" >&2
