"""Test models: a tiny random Llama checkpoint with a real tokenizer, and the default model.

The tiny checkpoint borrows the default model's tokenizer (SmolLM2's, with its
ChatML template), so chat, special tokens and byte-level BPE behave as in
production while the network is small enough to run hundreds of tokens per second.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")


def build_tiny_llama(out: Path, tokenizer_source: Path, *, seed: int = 0, max_positions: int = 4096) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (tokenizer_source / name).is_file():
            shutil.copy(tokenizer_source / name, out / name)
    vocab = json.loads((tokenizer_source / "config.json").read_text())["vocab_size"]
    return _save_random_llama(out, vocab, seed=seed, max_positions=max_positions)


def _save_random_llama(out: Path, vocab: int, *, seed: int, max_positions: int) -> Path:
    """2 layers, hidden 64, GQA 4/2 heads, tied embeddings, seeded random weights; SmolLM2's special ids."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # GQA
        max_position_embeddings=max_positions,
        rope_theta=10000.0,  # type: ignore[call-arg]  # taken through **kwargs (transformers 5 folds it into rope_parameters)
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    torch.manual_seed(seed)
    LlamaForCausalLM(config).save_pretrained(out)
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}))
    return out


THINK_START, THINK_END = "<think>", "</think>"


def build_tiny_thinking_llama(out: Path, tokenizer_source: Path, *, seed: int = 0, pad_vocab: bool = True) -> Path:
    """The tiny random Llama with `<think>` / `</think>` added as whole tokens, its vocabulary grown
    past the tokenizer's (to a multiple of 64, as real checkpoints pad it, unless `pad_vocab` is
    False), and a chat template that pre-fills `<think>\\n` after the assistant header (as Qwen3 /
    DeepSeek-R1 templates do).

    The tags are added tokens that are not special, as in Qwen3 and DeepSeek-R1: decoding keeps
    them in the text (skip_special_tokens drops only special ones), where reasoning parsers look.
    Without padding a random model can only sample ids the tokenizer can decode."""
    from tokenizers import AddedToken
    from transformers import AutoTokenizer

    out.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_source)
    tokenizer.add_tokens([AddedToken(tag, special=False, normalized=False) for tag in (THINK_START, THINK_END)])
    template = (tokenizer_source / "chat_template.jinja").read_text()
    header = "{{ '<|im_start|>assistant\n' }}"
    assert header in template, "the default model's chat template changed"
    tokenizer.chat_template = template.replace(header, "{{ '<|im_start|>assistant\n<think>\n' }}")
    tokenizer.save_pretrained(out)
    vocab = (len(tokenizer) + 63) // 64 * 64 if pad_vocab else len(tokenizer)
    return _save_random_llama(out, vocab, seed=seed, max_positions=2048)


def build_tiny_gguf(out: Path, source_gguf: Path, *, seed: int = 0, vocab: int = 1024) -> Path:
    """A GGUF file of a 2-layer random Llama (hidden 64, GQA 4/2 heads, tied embeddings, float32)
    with the first `vocab` tokens of `source_gguf`'s byte-level BPE tokenizer and the merges among
    them: a GGUF that converts in seconds (reading 49k tokens and merges takes transformers ~30 s)."""
    import numpy as np
    from gguf import GGUFReader, GGUFWriter

    fields = GGUFReader(source_gguf).fields
    tokens = fields["tokenizer.ggml.tokens"].contents()[:vocab]
    kept = set(tokens)
    merges = [m for m in fields["tokenizer.ggml.merges"].contents() if {*m.split(" "), m.replace(" ", "")} <= kept]
    hidden, ffn, heads, kv_heads, layers = 64, 128, 4, 2, 2
    writer = GGUFWriter(out, "llama")
    writer.add_name("tiny-llama")
    writer.add_block_count(layers)
    writer.add_context_length(2048)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model(fields["tokenizer.ggml.model"].contents())
    writer.add_tokenizer_pre(fields["tokenizer.ggml.pre"].contents())
    writer.add_token_list(tokens)
    writer.add_token_types(fields["tokenizer.ggml.token_type"].contents()[:vocab])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(2)
    writer.add_chat_template(fields["tokenizer.chat_template"].contents())
    rng = np.random.default_rng(seed)

    def weight(*shape: int) -> np.ndarray:  # numpy order: (out_features, in_features)
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    kv = hidden // heads * kv_heads
    writer.add_tensor("token_embd.weight", weight(len(tokens), hidden))
    writer.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    for i in range(layers):
        for name, shape in (
            ("attn_q", (hidden, hidden)),
            ("attn_k", (kv, hidden)),
            ("attn_v", (kv, hidden)),
            ("attn_output", (hidden, hidden)),
            ("ffn_gate", (ffn, hidden)),
            ("ffn_up", (ffn, hidden)),
            ("ffn_down", (hidden, ffn)),
        ):
            writer.add_tensor(f"blk.{i}.{name}.weight", weight(*shape))
        for norm in ("attn_norm", "ffn_norm"):
            writer.add_tensor(f"blk.{i}.{norm}.weight", np.ones(hidden, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
