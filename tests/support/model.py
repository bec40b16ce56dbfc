"""Tiny models for the real-vLLM tests and benchmarks, built here: nothing
is downloaded. make_tiny_model() saves a small Llama-style model with
random weights (fixed seed) through transformers' from_config;
add_byte_tokenizer() gives it a byte-level tokenizer for tests that send
text."""

import os


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


def add_byte_tokenizer(path, vocab=2048):
    """Give the model at `path` a tokenizer (idempotent), built here without
    downloading anything: one token per byte of the text (GPT-2's byte-level
    alphabet, no merges), the rest of the model's vocabulary as named tokens
    so that every id it may generate decodes. For tests that send text, as a
    user's curl does."""
    if os.path.exists(os.path.join(path, "tokenizer.json")):
        return path
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    ids = {ch: i for i, ch in enumerate(alphabet)}
    for i in range(len(alphabet), vocab):
        ids["<|t%d|>" % i] = i
    tok = Tokenizer(models.BPE(vocab=ids, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    PreTrainedTokenizerFast(tokenizer_object=tok).save_pretrained(path)
    return path
