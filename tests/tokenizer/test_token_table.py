from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer, models

from services.tokenizer.token_table import TokenTable, bytes_to_unicode
from tests.tokenizer.toy_tokenizers import sentencepiece_style
from turnout.errors import InvalidArgument


@pytest.fixture(scope="module")
def byte_level(default_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(default_model_dir / "tokenizer.json"))


def test_byte_to_unicode_table_is_gpt2s() -> None:
    table = bytes_to_unicode()
    assert sorted(table) == list(range(256))
    assert len(set(table.values())) == 256
    assert (table[ord("a")], table[ord(" ")], table[ord("\n")], table[0xFF]) == ("a", "Ġ", "Ċ", "ÿ")


@pytest.mark.parametrize("text", ["🎉", "ÿé", "naïve 世界 🇫🇷"])
def test_byte_level_fragments_of_a_character_give_its_real_bytes(byte_level: Tokenizer, text: str) -> None:
    ids = byte_level.encode(text, add_special_tokens=False).ids
    texts, token_bytes = TokenTable(byte_level).lookup(ids)
    assert "\ufffd" in "".join(texts)  # the case under test: some token is part of a character
    assert b"".join(token_bytes) == text.encode()
    assert texts == [byte_level.decode([i], skip_special_tokens=False) for i in ids]


def test_special_tokens_stay_visible(byte_level: Tokenizer) -> None:
    texts, token_bytes = TokenTable(byte_level).lookup([1, 2])
    assert texts == ["<|im_start|>", "<|im_end|>"]
    assert token_bytes == [b"<|im_start|>", b"<|im_end|>"]


def test_sentencepiece_byte_fallback_and_metaspace() -> None:
    texts, token_bytes = TokenTable(sentencepiece_style()).lookup([1, 2, 3, 4, 5])
    assert token_bytes == [b"\xc3", b"\xa9", b" hi", b"caf", b"A"]
    assert texts == ["\ufffd", "\ufffd", "hi", "caf", "A"]  # decode([id]) alone strips the leading space


def test_plain_vocabulary_falls_back_to_the_text() -> None:
    tokenizer = Tokenizer(models.WordLevel(vocab={"[UNK]": 0, "hello": 1, "wörld": 2}, unk_token="[UNK]"))
    assert TokenTable(tokenizer).lookup([2, 1]) == (["wörld", "hello"], ["wörld".encode(), b"hello"])


def test_out_of_range_id_names_the_id_and_vocabulary_size(byte_level: Tokenizer) -> None:
    with pytest.raises(InvalidArgument, match="token id 49152 is out of range for a vocabulary of 49152"):
        TokenTable(byte_level).lookup([5, 49152])


class CountingTokenizer:
    """Forwards to a real tokenizer, counting the ids it decodes."""

    def __init__(self, inner: Tokenizer) -> None:
        self.inner = inner
        self.decoded = 0

    def decode_batch(self, batch: list[list[int]], **kwargs: Any) -> list[str]:
        self.decoded += len(batch)
        return self.inner.decode_batch(batch, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_each_id_is_decoded_once_across_calls(byte_level: Tokenizer) -> None:
    counting = CountingTokenizer(byte_level)
    table = TokenTable(counting)  # type: ignore[arg-type]
    first = table.lookup([*range(3000), 7, 7])
    assert counting.decoded == 3000  # a repeated id is decoded once
    second = table.lookup(list(range(2900, 3100)))
    assert counting.decoded == 3100  # only the 100 new ids
    assert second[0][:100] == first[0][2900:3000]
    assert second[0][100:] == [byte_level.decode([i], skip_special_tokens=False) for i in range(3000, 3100)]
