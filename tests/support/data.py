"""Keys, payloads, adapter specs and file helpers of the tests."""

import hashlib
import json
import os
import random

import kvtier
from support.paths import ROOT

LOCK = ".kvtier.lock"  # the owner's lock in a directory a server uses


def mooncake_trace():
    """The Mooncake trace: KVT_TRACE, the shared data set beside the repo,
    or the first 600 requests of it kept in tests/data (so a clean checkout
    runs the replay tests too)."""
    for p in (os.environ.get("KVT_TRACE"),
              os.path.join(ROOT, "..", "shared", "data", "mooncake_synthetic_trace.jsonl"),
              os.path.join(ROOT, "tests", "data", "mooncake_head600.jsonl")):
        if p and os.path.exists(p):
            return os.path.abspath(p)
    raise FileNotFoundError("no Mooncake trace (tests/data/mooncake_head600.jsonl is missing)")


def random_payloads(n, size, seed=0):
    r = random.Random(seed)
    return [r.randbytes(size) for _ in range(n)]


def keys_for(model, n, chunk=16, seed=0, **kw):
    """n chunk keys from a deterministic token stream."""
    toks = [(seed * 7919 + i) % 50000 for i in range(n * chunk)]
    return kvtier.chunk_keys(model, toks, chunk_size=chunk, **kw)


def fs_files(d, suffix=".data"):
    return sorted(f for f in os.listdir(d) if f.endswith(suffix))


def du_bytes(d):
    total = 0
    for root, _, files in os.walk(d):
        for f in files:
            total += os.path.getsize(os.path.join(root, f))
    return total


def adapter_json(**kw):
    return json.dumps(kw)


def snapshot(d):
    """relative path -> sha256 of every file under d but the owner's lock."""
    out = {}
    for root, _, files in os.walk(d):
        for f in files:
            if f == LOCK:
                continue
            p = os.path.join(root, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, d)] = hashlib.sha256(fh.read()).hexdigest()
    return out


def fill(s, model, n=6, size=30000, seed=3):
    """n keys of model stored through server s and flushed: (keys, payloads)."""
    keys, pay = keys_for(model, n, seed=seed), random_payloads(n, size, seed=seed)
    with s.client() as c:
        assert c.store(keys, pay) == n
        c.flush()
    return keys, pay
