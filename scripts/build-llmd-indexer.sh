#!/bin/sh
# Builds BUILD/llmd-indexer (default build/): tests/llmd, a thin driver around
# llm-d's KV-cache indexer (the Go module and version pinned in
# tests/llmd/go.mod, every dependency pinned by tests/llmd/go.sum) that
# tests/vllm/test_llmd_indexer.py runs against kvtier's KV events
# (docs/events.md, Routers).
#
# Modules go to BUILD/gomod (GOMODCACHE): the first build downloads them from
# the Go module proxy (about 570 MB, Kubernetes' client among them; a few
# minutes to compile on 2 cores the first time), later builds need no network (-modcacherw:
# `make clean` can remove them as any user). -mod=readonly:
# go.mod and go.sum are never rewritten, a missing sum fails the build.
# Exit 3 when there is no Go on PATH (nor /usr/local/go/bin/go).
set -e
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=$(mkdir -p "${1:-$ROOT/build}" && cd "${1:-$ROOT/build}" && pwd)
GO=$(command -v go || true)
[ -n "$GO" ] || { [ -x /usr/local/go/bin/go ] && GO=/usr/local/go/bin/go; }
if [ -z "$GO" ]; then
  echo "kvtier: no go on PATH: cannot build the llm-d indexer driver (tests/llmd)" >&2
  exit 3
fi
cd "$ROOT/tests/llmd"
GOMODCACHE="$B/gomod" GOTOOLCHAIN=local GOFLAGS="-mod=readonly -modcacherw -trimpath" \
  "$GO" build -o "$B/llmd-indexer.tmp" .
mv "$B/llmd-indexer.tmp" "$B/llmd-indexer"
