"""Small tokenizers built in memory, for decoders the default model's byte-level BPE does not have."""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models


def sentencepiece_style() -> Tokenizer:
    """A Llama-2-like vocabulary: `▁` for spaces, `<0xNN>` byte-fallback pieces, the first space
    stripped by the decoder, and one special token."""
    vocab = {"<unk>": 0, "<0xC3>": 1, "<0xA9>": 2, "▁hi": 3, "caf": 4, "<0x41>": 5, "▁": 6, "<s>": 7}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tokenizer.add_special_tokens(["<s>"])
    return tokenizer
