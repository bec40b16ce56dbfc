"""Fixtures of the real-vLLM tests (the harness is tests/support): a tiny
random model built once per session, a kvtier server per module, and one
no-connector baseline engine per session."""

import pytest

from support.engine import Engine
from support.model import make_tiny_model
from support.prompts import CHUNK, MAX_TOKENS, PROMPTS
from support.server import SANITIZER_MARKERS, Server


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    return make_tiny_model(str(tmp_path_factory.mktemp("model") / "tiny-llama"))


@pytest.fixture(scope="module")
def kvt_server(tmp_path_factory):
    d = tmp_path_factory.mktemp("kvtier")
    # retain: what a lookup pulls from L2 stays in L1 for the worker's load
    # (docs/vllm.md)
    s = Server(["--chunk-size", str(CHUNK), "--l2-prefetch-policy", "retain"], d,
               data_dir=str(d / "data"))
    s.start()
    yield s
    s.kill()
    log = s.read_log()
    for m in SANITIZER_MARKERS:
        assert m not in log, log


@pytest.fixture(scope="session")
def baseline(tiny_model, tmp_path_factory):
    """name -> greedy output tokens of a run without any connector."""
    log = str(tmp_path_factory.mktemp("logs") / "baseline-engine.log")
    names = sorted(PROMPTS)
    with Engine(tiny_model, log=log) as eng:
        r = eng.generate([{"tokens": PROMPTS[n]} for n in names], max_tokens=MAX_TOKENS)
    return {n: o["tokens"] for n, o in zip(names, r["outputs"])}
