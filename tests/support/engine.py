"""A vLLM engine in its own process, for the real-vLLM tests and
benchmarks. `Engine` starts one vLLM engine (LLM, offline; the pinned venv's
Python) in a fresh process, so two runs are two engine instances and
vLLM's own prefix cache cannot serve the second; it generates greedily from
token ids (no tokenizer needed) and returns the output token ids with
vLLM's prefix-cache statistics."""

import json
import os
import subprocess
import textwrap

from support.paths import ROOT

# vLLM's CPU build: a small KV cache, eager mode (no torch.compile on 2 cores),
# no usage reporting, nothing from a hub.
ENGINE_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_LOGGING_LEVEL": "INFO",
    "OMP_NUM_THREADS": "2",
    "TOKENIZERS_PARALLELISM": "false",
}

_RUNNER = textwrap.dedent(r"""
    import json, os, sys, time
    spec = json.loads(sys.stdin.readline())
    from vllm import LLM, SamplingParams
    kw = dict(model=spec["model"], skip_tokenizer_init=True, enforce_eager=True,
              max_model_len=spec["max_model_len"], block_size=spec["block_size"],
              dtype=spec["dtype"], seed=0, disable_log_stats=False,
              enable_prefix_caching=True, max_num_seqs=spec.get("max_num_seqs", 8),
              max_num_batched_tokens=spec.get("max_num_batched_tokens", spec["max_model_len"]))
    if spec.get("served_model_name"):
        kw["served_model_name"] = spec["served_model_name"]
    if spec.get("kv_transfer_config"):
        kw["kv_transfer_config"] = spec["kv_transfer_config"]
    if spec.get("kv_events_config"):  # vLLM's own KV events (docs/events.md's tests)
        from vllm.config.kv_events import KVEventsConfig
        kw["kv_events_config"] = KVEventsConfig(**spec["kv_events_config"])
    llm = LLM(**kw)

    def metrics():
        out = {}
        for m in llm.get_metrics():
            if "prefix_cache" in m.name or "kv_connector" in m.name:
                out[m.name] = getattr(m, "value", None)
        return out

    def reply(obj):
        sys.stdout.write("KVT_RESULT " + json.dumps(obj) + "\n")
        sys.stdout.flush()

    reply({"ready": True})
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        if op == "generate":
            sp = SamplingParams(temperature=0.0, max_tokens=cmd.get("max_tokens", 8), ignore_eos=True)
            prompts = [{"prompt_token_ids": p["tokens"], **({"cache_salt": p["salt"]} if p.get("salt") else {})}
                       for p in cmd["prompts"]]
            t0 = time.perf_counter()
            outs = llm.generate(prompts, sp, use_tqdm=False)
            dt = time.perf_counter() - t0
            res = [{"tokens": list(o.outputs[0].token_ids), "num_cached_tokens": o.num_cached_tokens}
                   for o in outs]
            reply({"outputs": res, "seconds": dt, "metrics": metrics()})
        elif op == "reset":
            # vLLM's own prefix cache forgets everything (blocks held by
            # unfinished stores make it refuse: try again until it agrees)
            t0 = time.monotonic()
            ok = llm.reset_prefix_cache()
            while not ok and time.monotonic() - t0 < 60:
                time.sleep(0.1)
                llm.generate([{"prompt_token_ids": [3]}], SamplingParams(max_tokens=1), use_tqdm=False)
                ok = llm.reset_prefix_cache()
            reply({"reset": bool(ok)})
        elif op == "metrics":
            reply({"metrics": metrics()})
        elif op == "quit":
            break
    # an orderly shutdown: the connector's workers finish their stores first
    llm.llm_engine.engine_core.shutdown()
    reply({"bye": True})
""")


def venv_python():
    return os.environ.get("KVT_VENV_PYTHON") or os.path.join(ROOT, "build", "venv", "bin", "python")


class Engine:
    """One vLLM engine instance (LLM, offline) in its own process, driven by
    JSON commands: generate, reset (vLLM's prefix cache), metrics."""

    def __init__(self, model, kv_transfer_config=None, block_size=32, max_model_len=4096,
                 dtype="float32", env=None, log=None, start_timeout=900, **extra):
        spec = dict(model=model, kv_transfer_config=kv_transfer_config, block_size=block_size,
                    max_model_len=max_model_len, dtype=dtype, **extra)
        e = dict(os.environ)
        e.update(ENGINE_ENV)
        e["PYTHONPATH"] = os.path.join(ROOT, "python") + os.pathsep + e.get("PYTHONPATH", "")
        if env:
            e.update(env)
        self.log_path = log or os.devnull
        self._log = open(self.log_path, "ab")
        self._buf = b""
        self.proc = subprocess.Popen([venv_python(), "-c", _RUNNER], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._log, env=e, bufsize=0)
        self._send(spec)
        self._read(start_timeout)

    def _read(self, timeout):
        """The next KVT_RESULT line; everything else (vLLM logs to stdout) goes
        to the log. Reads the pipe itself: a buffered reader could hold the
        line while select() says there is nothing to read."""
        import select
        import time as _t

        deadline = _t.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while True:
            while b"\n" in self._buf:
                line, self._buf = self._buf.split(b"\n", 1)
                if line.startswith(b"KVT_RESULT "):
                    return json.loads(line[len(b"KVT_RESULT "):])
                self._log.write(line + b"\n")
                self._log.flush()
            left = deadline - _t.monotonic()
            if left <= 0:
                self.close()
                raise TimeoutError("vLLM engine did not answer in %d s (log: %s)" % (timeout, self.log_path))
            r, _, _ = select.select([fd], [], [], min(left, 5))
            if not r:
                if self.proc.poll() is not None:
                    raise RuntimeError("vLLM engine exited with %s (log: %s):\n%s"
                                       % (self.proc.returncode, self.log_path, self._tail()))
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                self.proc.wait(timeout=30)
                raise RuntimeError("vLLM engine exited with %s (log: %s):\n%s"
                                   % (self.proc.returncode, self.log_path, self._tail()))
            self._buf += chunk

    def _tail(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-6000:].decode(errors="replace")
        except OSError:
            return ""

    def _send(self, obj):
        self.proc.stdin.write((json.dumps(obj) + "\n").encode())
        self.proc.stdin.flush()

    def call(self, timeout=600, **cmd):
        self._send(cmd)
        return self._read(timeout)

    def generate(self, prompts, max_tokens=8, timeout=600):
        """prompts: list of {"tokens": [...], "salt"?: str}."""
        return self.call(op="generate", prompts=prompts, max_tokens=max_tokens, timeout=timeout)

    def reset(self):
        r = self.call(op="reset")
        if not r.get("reset"):
            raise RuntimeError("vLLM refused to reset its prefix cache")

    def metrics(self):
        return self.call(op="metrics")["metrics"]

    def close(self):
        if self.proc.poll() is None:
            try:
                self._send({"op": "quit"})
                self._read(120)
                self.proc.wait(timeout=60)
            except Exception:  # noqa: BLE001
                self.proc.kill()
                self.proc.wait()
        self._log.close()

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()


def kvtier_connector_config(url, **extra):
    return {"kv_connector": "KvtierConnector", "kv_connector_module_path": "kvtier.vllm",
            "kv_role": "kv_both", "kv_connector_extra_config": dict(url=url, **extra)}
