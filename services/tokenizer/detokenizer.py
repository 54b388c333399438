"""Incremental detokenization of one sequence.

Decoding token by token is wrong in two ways: byte-level BPE splits multi-byte
UTF-8 characters across tokens, and SentencePiece-style tokenizers decide a
token's leading space from its neighbour. So we decode a short window of
recent tokens and emit only the part of its text that is new:

    ids:  ... [prefix_offset ........ read_offset ........ len(ids))
              `---- already emitted ----'`-- new tokens --'

    text(prefix_offset:read_offset) was emitted; text(prefix_offset:) minus it is
    the delta. A delta that ends in U+FFFD is an unfinished character: hold it
    until the next token completes it (or the sequence ends).

`tokenizers`' own `DecodeStream` runs the same window algorithm in Rust, with one call per
push instead of two decodes: 2.1-2.4 against 4.7-5.0 µs per token with the default model's
tokenizer (docs/benchmarks.md, "tokenizers' DecodeStream"). It is used wherever its decode is ours (it
knows no spaces between special tokens), and this module's windows take over for the end of
the sequence (a held unfinished character is shown, not dropped) and if it ever fails.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

# Prompt tokens kept as left context, so the first output token gets its spacing right.
PROMPT_CONTEXT_TOKENS = 5
REPLACEMENT_CHAR = "\ufffd"


def decode(
    tokenizer: Tokenizer,
    ids: Sequence[int],
    *,
    skip_special_tokens: bool = True,
    spaces_between_special_tokens: bool = True,
) -> str:
    """Decode ids to text; with special tokens kept, optionally space them apart.

    `spaces_between_special_tokens` follows transformers' slow tokenizers: added
    tokens are decoded on their own and the pieces joined with a space.
    """
    if skip_special_tokens or not spaces_between_special_tokens:
        return tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)
    added = tokenizer.get_added_tokens_decoder()
    pieces: list[str] = []
    run: list[int] = []
    for token_id in ids:
        if token_id in added:
            if run:
                pieces.append(tokenizer.decode(run, skip_special_tokens=False))
                run = []
            pieces.append(added[token_id].content)
        else:
            run.append(token_id)
    if run:
        pieces.append(tokenizer.decode(run, skip_special_tokens=False))
    return " ".join(pieces)


class IncrementalDetokenizer:
    """Turns a stream of token ids into a stream of text deltas that are never retracted."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_ids: Sequence[int] = (),
        *,
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
        decode_stream: bool = True,
    ) -> None:
        """`decode_stream=False`: the windows alone (the reference the fast path is tested against)."""
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._spaces_between = spaces_between_special_tokens
        self._ids: list[int] = list(prompt_ids[-PROMPT_CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        # The fast path, started from the same context; None: the windows below do all the work.
        self._stream: DecodeStream | None = None
        if decode_stream and (skip_special_tokens or not spaces_between_special_tokens):
            self._stream = DecodeStream(list(self._ids), skip_special_tokens=skip_special_tokens)

    def _decode(self, start: int, end: int | None = None) -> str:
        return decode(
            self._tokenizer,
            self._ids[start:end],
            skip_special_tokens=self._skip_special,
            spaces_between_special_tokens=self._spaces_between,
        )

    def push(self, token_ids: Sequence[int]) -> str:
        """Add new token ids; return the text that is now final."""
        self._ids.extend(token_ids)
        if self._stream is None:
            return self._advance(final=False)
        try:
            # One id goes in as an int: tokenizers' list form costs ~0.7 µs more a call.
            text = self._stream.step(self._tokenizer, token_ids[0] if len(token_ids) == 1 else list(token_ids))
        except Exception:  # tokenizers raises a bare Exception (e.g. "Invalid prefix encountered")
            # Its window's text stopped being a prefix of the longer one's: the windows below
            # carry on from the same offsets, which the stream has kept in step with.
            self._stream = None
            return self._advance(final=False)
        if text is None:
            return ""  # held: an unfinished character, or nothing new (a skipped special token)
        # What the windows would do after emitting: the next window starts at this one's end.
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return text

    def flush(self) -> str:
        """The sequence ended: return whatever text is still held."""
        return self._advance(final=True)

    def _advance(self, *, final: bool) -> str:
        if self._read_offset == len(self._ids):
            return ""
        prefix_text = self._decode(self._prefix_offset, self._read_offset)
        full_text = self._decode(self._prefix_offset)
        if not final and full_text.endswith(REPLACEMENT_CHAR):
            return ""
        # A window that starts mid-character can decode its prefix longer than
        # the whole; emit nothing new rather than a negative slice.
        delta = full_text[len(prefix_text) :] if len(full_text) > len(prefix_text) else ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return delta
