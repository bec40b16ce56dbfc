"""Fixtures of the real-vLLM tests: the kvtier server of tests/integration
(its Server class), a tiny random model built once per session, and one
no-connector baseline engine per session."""

import importlib.util
import os
import random
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "python"))
os.environ.setdefault("KVTIER_LIB", os.path.join(ROOT, "build", "libkvtier_client.so"))

_spec = importlib.util.spec_from_file_location(
    "kvt_integration_conftest", os.path.join(ROOT, "tests", "integration", "conftest.py"))
_itg = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_itg)
Server = _itg.Server
wait_for = _itg.wait_for
SANITIZER_MARKERS = _itg.SANITIZER_MARKERS

import harness  # noqa: E402

CHUNK = 64        # kvtier --chunk-size: two vLLM CPU blocks of 32 tokens
BLOCK = 32


def tokens(n, seed):
    r = random.Random(seed)
    return [r.randrange(3, 2000) for _ in range(n)]


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    return harness.make_tiny_model(str(tmp_path_factory.mktemp("model") / "tiny-llama"))


@pytest.fixture(scope="module")
def kvt_server(tmp_path_factory):
    d = tmp_path_factory.mktemp("kvtier")
    s = Server(["--chunk-size", str(CHUNK)], d, data_dir=str(d / "data"))
    s.start()
    yield s
    s.kill()
    log = s.read_log()
    for m in SANITIZER_MARKERS:
        assert m not in log, log


def stored_keys(server, keys):
    """How many of `keys` the server holds (lookup from a test client)."""
    try:
        with server.client(timeout_ms=2000) as c:
            n = c.lookup(keys)
            c.free_locks()
            return n
    except Exception:  # noqa: BLE001 - server down: nothing held
        return 0


# Every prompt a test module uses is registered at import time (collection),
# so one no-connector engine computes the reference outputs of all of them.
PROMPTS = {}
MAX_TOKENS = 16


def prompt(name, toks):
    PROMPTS[name] = list(toks)
    return PROMPTS[name]


@pytest.fixture(scope="session")
def baseline(tiny_model, tmp_path_factory):
    """name -> greedy output tokens of a run without any connector."""
    log = str(tmp_path_factory.mktemp("logs") / "baseline-engine.log")
    names = sorted(PROMPTS)
    with harness.Engine(tiny_model, log=log) as eng:
        r = eng.generate([{"tokens": PROMPTS[n]} for n in names], max_tokens=MAX_TOKENS)
    return {n: o["tokens"] for n, o in zip(names, r["outputs"])}
