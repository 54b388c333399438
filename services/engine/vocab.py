"""The served model's own tokenizer files, read for the few things the engine needs from them.

The engine is otherwise tokenizer-free (token ids in, token ids out). Structured outputs need
xgrammar's `TokenizerInfo` (every token's bytes), and the thinking budget needs the think
tags' ids and which tokens end in a newline. The tokenizer is loaded on first use, once, so an
engine that never sees such a request never pays for it.

Ids the tokenizer does not know but the model's embedding has (`vocab_size` can exceed the
tokenizer's length, padded for efficiency) decode to nothing: a grammar never allows them.
"""

from __future__ import annotations

import threading
from functools import cached_property
from pathlib import Path
from typing import Any

from turnout.errors import InvalidArgument


class ModelVocab:
    def __init__(self, model_dir: Path, vocab_size: int, eos_token_ids: frozenset[int]) -> None:
        self.model_dir = model_dir
        # The model's vocabulary size (logits width): bitmasks are this wide.
        self.vocab_size = vocab_size
        self.eos_token_ids = eos_token_ids
        self._lock = threading.Lock()

    @cached_property
    def tokenizer(self) -> Any:
        with self._lock:
            if (
                not (self.model_dir / "tokenizer.json").is_file()
                and not (self.model_dir / "tokenizer_config.json").is_file()
            ):
                raise InvalidArgument(
                    f"the served model's folder {self.model_dir} has no tokenizer files, which this feature needs"
                )
            from transformers import AutoTokenizer

            return AutoTokenizer.from_pretrained(self.model_dir)

    @cached_property
    def tokenizer_info(self) -> Any:
        """xgrammar.TokenizerInfo over the model's vocab_size, with the EOS ids as stop tokens."""
        import xgrammar as xgr

        return xgr.TokenizerInfo.from_huggingface(
            self.tokenizer, vocab_size=self.vocab_size, stop_token_ids=sorted(self.eos_token_ids) or None
        )

    def token_id(self, text: str) -> int | None:
        """The id of a token spelled exactly `text` (special or added tokens, e.g. `<think>`), else None."""
        vocab: dict[str, int] = self.tokenizer.get_vocab()
        token_id = vocab.get(text)
        return token_id if token_id is not None and token_id < self.vocab_size else None

    @cached_property
    def newline_ending_ids(self) -> frozenset[int]:
        """Ids of the tokens whose text ends in a newline."""
        decoded: list[bytes] = self.tokenizer_info.decoded_vocab
        return frozenset(i for i, text in enumerate(decoded) if text.endswith(b"\n"))

    @cached_property
    def newline_id(self) -> int:
        """The token for a lone newline."""
        ids = self.tokenizer.encode("\n", add_special_tokens=False)
        if len(ids) == 1:
            return int(ids[0])
        decoded: list[bytes] = self.tokenizer_info.decoded_vocab
        for i, text in enumerate(decoded):
            if text == b"\n":
                return i
        raise InvalidArgument("the served model's vocabulary has no newline token")
