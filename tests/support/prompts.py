"""The prompts of the real-vLLM tests and the keys kvtier holds of them.

Every prompt a test module uses is registered at import time (collection,
with prompt()), so that one no-connector engine computes the reference
outputs of all of them (tests/vllm/conftest.py's baseline fixture)."""

import random

import kvtier

CHUNK = 64        # kvtier --chunk-size: two vLLM CPU blocks of 32 tokens
BLOCK = 32
MAX_TOKENS = 16
PROMPTS = {}


def tokens(n, seed):
    r = random.Random(seed)
    return [r.randrange(3, 2000) for _ in range(n)]


def prompt(name, toks):
    PROMPTS[name] = list(toks)
    return PROMPTS[name]


def keys_of(model, toks, salt=""):
    """The connector's keys: kv_rank of tensor-parallel rank 0 of 1."""
    return kvtier.chunk_keys(model, toks, chunk_size=CHUNK, salt=salt,
                             kv_rank=kvtier.kv_rank(1, 0, 1, 0))


def stored_keys(server, keys):
    """How many of `keys` the server holds (lookup from a test client)."""
    try:
        with server.client(timeout_ms=2000) as c:
            n = c.lookup(keys)
            c.free_locks()
            return n
    except Exception:  # noqa: BLE001 - server down: nothing held
        return 0
