"""Each token id on its own: its decoded text and its true bytes, computed once per id.

The text is what `decode([id])` shows (special tokens visible); a token that is
part of a UTF-8 character shows as U+FFFD there. The bytes are the token's own:

- byte-level BPE (GPT-2 style ByteLevel decoder): the vocab string mapped back
  through the byte-to-unicode table, so half a character yields its real bytes;
- SentencePiece byte fallback: `<0xNN>` is the byte NN, other pieces are their
  text with the metaspace `▁` as a space (the leading space `decode` strips);
- anything else: the decoded text as UTF-8.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from tokenizers import Tokenizer

from turnout.errors import InvalidArgument

_BYTE_FALLBACK_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's table: every byte as a printable character (printable bytes map to themselves)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + shifted)
            shifted += 1
    return table


_UNICODE_TO_BYTE = {char: byte for byte, char in bytes_to_unicode().items()}


class TokenTable:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        self._added = {i: token.content for i, token in tokenizer.get_added_tokens_decoder().items()}
        # The decoder's own JSON (its pickle state), not the whole tokenizer's: that is megabytes.
        decoder = tokenizer.decoder
        steps = _decoder_steps(None if decoder is None else json.loads(decoder.__getstate__()))
        self._byte_level = any(step.get("type") == "ByteLevel" for step in steps)
        self._byte_fallback = any(step.get("type") == "ByteFallback" for step in steps)
        self._metaspace = _metaspace_char(steps)
        self._cache: dict[int, tuple[str, bytes]] = {}

    def lookup(self, ids: Sequence[int]) -> tuple[list[str], list[bytes]]:
        """The texts and bytes of `ids`, in order; InvalidArgument for an id outside the vocabulary."""
        for token_id in ids:
            if token_id >= self.vocab_size:
                raise InvalidArgument(f"token id {token_id} is out of range for a vocabulary of {self.vocab_size}")
        missing = [i for i in dict.fromkeys(ids) if i not in self._cache]
        if missing:
            texts = self._tokenizer.decode_batch([[i] for i in missing], skip_special_tokens=False)
            for token_id, text in zip(missing, texts, strict=True):
                self._cache[token_id] = (text, self._token_bytes(token_id, text))
        entries = [self._cache[i] for i in ids]
        return [text for text, _ in entries], [raw for _, raw in entries]

    def _token_bytes(self, token_id: int, text: str) -> bytes:
        if token_id in self._added:  # added tokens are stored as plain text in every vocabulary
            return self._added[token_id].encode()
        piece = self._tokenizer.id_to_token(token_id)
        if piece is None:
            return text.encode()
        if self._byte_level:
            try:
                return bytes(_UNICODE_TO_BYTE[char] for char in piece)
            except KeyError:  # not a byte-level piece after all
                return text.encode()
        if self._byte_fallback and (byte := _BYTE_FALLBACK_PIECE.fullmatch(piece)):
            return bytes([int(byte.group(1), 16)])
        if self._metaspace is not None:
            return piece.replace(self._metaspace, " ").encode()
        return text.encode()


def _decoder_steps(decoder: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The decoder's steps, with Sequence decoders flattened."""
    if decoder is None:
        return []
    if decoder.get("type") == "Sequence":
        return [step for inner in decoder.get("decoders", []) for step in _decoder_steps(inner)]
    return [decoder]


def _metaspace_char(steps: list[dict[str, Any]]) -> str | None:
    """The character that stands for a space in pieces (SentencePiece's `▁`), if the decoder maps one."""
    for step in steps:
        if step.get("type") == "Metaspace":
            return str(step.get("replacement", "▁"))
        if step.get("type") == "Replace" and step.get("content") == " ":
            pattern = step.get("pattern", {}).get("String")
            if pattern:
                return str(pattern)
    return None
