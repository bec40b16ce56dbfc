#!/usr/bin/env bash
# The object-store servers the integration tests start, into the ignored
# build tree ($BUILD, default build), only what is missing: s3rver and
# Azurite from npm (pinned by their package-lock.json), versitygw built with
# Go at a pinned version. `make test` runs it (not `make run`: the server
# needs none of them). Node.js and npm come from scripts/install-deps.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
B="${BUILD:-build}"
[[ "$B" = /* ]] || B="$ROOT/$B"

# The S3 test server's npm packages (s3rver, AWS's SigV4 signer), pinned by
# tests/support/s3server/package-lock.json, into the ignored build tree.
S3DIR="$B/s3server"
if command -v npm >/dev/null 2>&1 && [ ! -f "$S3DIR/node_modules/s3rver/package.json" ]; then
  echo "kvtier: installing the S3 test server (npm) into $S3DIR" >&2
  mkdir -p "$S3DIR"
  cp "$ROOT/tests/support/s3server/package.json" \
     "$ROOT/tests/support/s3server/package-lock.json" "$S3DIR/"
  (cd "$S3DIR" && npm ci --no-audit --no-fund --loglevel=error >/dev/null) ||
    echo "kvtier: npm could not install the S3 test server; the s3 tests will fail" >&2
fi

# Azurite (Microsoft's Azure Storage emulator, npm), pinned by
# tests/support/azurite/package-lock.json, for the AZURE_BLOB tests:
# about a minute and 360 MB the first time.
AZDIR="$B/azurite"
if command -v npm >/dev/null 2>&1 && [ ! -f "$AZDIR/node_modules/azurite/package.json" ]; then
  echo "kvtier: installing Azurite (npm) into $AZDIR" >&2
  mkdir -p "$AZDIR"
  cp "$ROOT/tests/support/azurite/package.json" \
     "$ROOT/tests/support/azurite/package-lock.json" "$AZDIR/"
  (cd "$AZDIR" && npm ci --no-audit --no-fund --loglevel=error >/dev/null) ||
    echo "kvtier: npm could not install Azurite; the Azure Blob tests will fail" >&2
fi

# A real S3 server for the s3 tests beside s3rver: versitygw (Apache-2.0, a
# production S3 gateway; its POSIX backend serves a directory), built from
# the Go module proxy at a pinned version (its own go.sum pins the rest):
# about 4 minutes on 2 cores and 300 MB of module downloads the first time.
VGW_VERSION=v1.8.0
VGW="$B/tools/bin/versitygw"
# Needs Go >= 1.25 on PATH (Debian 12's golang-go, 1.19, is too old).
if ! command -v go >/dev/null 2>&1; then
  [ -x "$VGW" ] || echo "kvtier: no go on PATH: cannot build versitygw; the s3 tests against it will be skipped (CI fails them)" >&2
elif [ ! -x "$VGW" ]; then
  echo "kvtier: building versitygw $VGW_VERSION (S3 test server) into $B/tools/bin" >&2
  mkdir -p "$B/tools/bin"
  GOBIN="$B/tools/bin" GOFLAGS=-trimpath go install \
    "github.com/versity/versitygw/cmd/versitygw@$VGW_VERSION" ||
    echo "kvtier: go could not build versitygw; the s3 tests against it will fail" >&2
fi
