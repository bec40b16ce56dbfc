#!/usr/bin/env bash
# Install what kvtier needs from Debian's packages (and npm for the S3 test
# server), only what is missing. Runs apt-get as root (or through sudo).
set -euo pipefail
PKGS=(
  build-essential cmake pkg-config clang
  libzmq3-dev libmsgpack-dev libjansson-dev libssl-dev libxxhash-dev libmicrohttpd-dev
  liburing-dev libhiredis-dev libcurl4-openssl-dev liblz4-dev libzstd-dev
  python3 python3-pytest python3-zmq
  redis-server redis-tools fio
)
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
