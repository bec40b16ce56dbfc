"""Harness for the real-vLLM tests and benchmarks.

Nothing is downloaded: `make_tiny_model` builds a small Llama-style model with
random weights (fixed seed) through transformers' `from_config` and saves it;
prompts are token ids, so no tokenizer is needed. `run_engine` starts one vLLM
engine in a fresh Python process (so two runs are two engine instances and
vLLM's own prefix cache cannot serve the second), generates greedily and
returns the output token ids with vLLM's prefix-cache statistics.
"""

import json
import os
import subprocess
import sys
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

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


def make_tiny_model(path, layers=2, hidden=128, heads=4, kv_heads=2, vocab=2048,
                    max_pos=8192, intermediate=None, seed=0, dtype="float32"):
    """A Llama-style model with random weights, saved to `path` (idempotent)."""
    cfg_file = os.path.join(path, "config.json")
    if os.path.exists(cfg_file):
        return path
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate or 2 * hidden,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        max_position_embeddings=max_pos, torch_dtype=dtype, tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=2,
    )
    model = LlamaForCausalLM(cfg).to(getattr(torch, dtype))
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    return path


_RUNNER = textwrap.dedent(r"""
    import json, os, sys, time
    spec = json.loads(sys.stdin.read())
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
    llm = LLM(**kw)
    sp = SamplingParams(temperature=0.0, max_tokens=spec["max_tokens"], ignore_eos=True)
    rounds = []
    for batch in spec["rounds"]:
        prompts = [{"prompt_token_ids": p["tokens"], **({"cache_salt": p["salt"]} if p.get("salt") else {})}
                   for p in batch]
        t0 = time.perf_counter()
        outs = llm.generate(prompts, sp, use_tqdm=False)
        dt = time.perf_counter() - t0
        res = []
        for o in outs:
            m = o.metrics
            res.append({"tokens": list(o.outputs[0].token_ids),
                        "num_cached_tokens": o.num_cached_tokens})
        rounds.append({"outputs": res, "seconds": dt})
    metrics = {}
    try:
        for m in llm.get_metrics():
            if "prefix_cache" in m.name or "connector" in m.name or "external" in m.name:
                metrics[m.name] = getattr(m, "value", None)
    except Exception as e:
        metrics["error"] = repr(e)
    print("KVT_RESULT " + json.dumps({"rounds": rounds, "metrics": metrics}), flush=True)
""")


def venv_python():
    return os.environ.get("KVT_VENV_PYTHON") or os.path.join(ROOT, "build", "venv", "bin", "python")


def run_engine(model, rounds, kv_transfer_config=None, max_tokens=8, block_size=32,
               max_model_len=4096, dtype="float32", env=None, timeout=900, log=None, **extra):
    """One vLLM engine instance in a fresh process. `rounds` is a list of batches,
    each a list of {"tokens": [...], "salt"?: str}; batches run one after the other.
    Returns {"rounds": [{"outputs": [{"tokens", "num_cached_tokens"}], "seconds"}],
    "metrics": {...}}."""
    spec = dict(model=model, rounds=rounds, kv_transfer_config=kv_transfer_config,
                max_tokens=max_tokens, block_size=block_size, max_model_len=max_model_len,
                dtype=dtype, **extra)
    e = dict(os.environ)
    e.update(ENGINE_ENV)
    e["PYTHONPATH"] = os.path.join(ROOT, "python") + os.pathsep + e.get("PYTHONPATH", "")
    if env:
        e.update(env)
    out = subprocess.run([venv_python(), "-c", _RUNNER], input=json.dumps(spec),
                         capture_output=True, text=True, timeout=timeout, env=e)
    if log:
        with open(log, "a") as f:
            f.write(out.stdout)
            f.write(out.stderr)
    for line in out.stdout.splitlines():
        if line.startswith("KVT_RESULT "):
            return json.loads(line[len("KVT_RESULT "):])
    raise RuntimeError("vLLM run failed (rc=%d):\n%s" % (out.returncode, out.stderr[-6000:]))
