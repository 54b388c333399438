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
        rope_theta=10000.0,
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
