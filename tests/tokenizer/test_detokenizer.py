from __future__ import annotations

import random
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from services.tokenizer.detokenizer import IncrementalDetokenizer, decode


@pytest.fixture(scope="module")
def tokenizer(default_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(default_model_dir / "tokenizer.json"))


def stream(
    tokenizer: Tokenizer, ids: list[int], chunk: int = 1, prompt: list[int] | None = None, **kw: bool
) -> list[str]:
    detok = IncrementalDetokenizer(tokenizer, prompt or [], **kw)
    deltas = [detok.push(ids[i : i + chunk]) for i in range(0, len(ids), chunk)]
    deltas.append(detok.flush())
    return deltas


def test_multibyte_characters_split_across_tokens_are_never_broken(tokenizer: Tokenizer) -> None:
    text = "héllo 世界 🎉 naïve café 🇫🇷 done"
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    # The case under test must occur: some token alone is half a character.
    assert any("\ufffd" in tokenizer.decode([i]) for i in ids)
    deltas = stream(tokenizer, ids)
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == text


def test_spacing_across_tokens_matches_one_decode(tokenizer: Tokenizer) -> None:
    text = "The capital of France is Paris. It has 2,148,271 people!"
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    assert "".join(stream(tokenizer, ids)) == text


def test_prompt_context_does_not_leak_into_output(tokenizer: Tokenizer) -> None:
    prompt = tokenizer.encode("Question: where?", add_special_tokens=False).ids
    output = tokenizer.encode(" Over there.", add_special_tokens=False).ids
    assert "".join(stream(tokenizer, output, prompt=prompt)) == " Over there."


@pytest.mark.parametrize("seed", range(5))
def test_random_text_in_random_chunks_round_trips(tokenizer: Tokenizer, seed: int) -> None:
    rng = random.Random(seed)
    alphabet = "abc xyz 123 éü ñ 中文字 😀👍 \n\t ---"
    text = "".join(rng.choice(alphabet) for _ in range(200))
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    deltas = stream(tokenizer, ids, chunk=rng.randint(1, 4))
    assert "".join(deltas) == decode(tokenizer, ids)
    assert all("\ufffd" not in d for d in deltas)


def test_special_tokens_skipped_or_kept(tokenizer: Tokenizer) -> None:
    ids = [*tokenizer.encode("Hi", add_special_tokens=False).ids, 2, 1]  # <|im_end|>, <|im_start|>
    assert "".join(stream(tokenizer, ids)) == "Hi"
    kept = "".join(stream(tokenizer, ids, skip_special_tokens=False, spaces_between_special_tokens=False))
    assert kept == "Hi<|im_end|><|im_start|>"
    spaced = "".join(stream(tokenizer, ids, skip_special_tokens=False, spaces_between_special_tokens=True))
    assert spaced == "Hi <|im_end|> <|im_start|>"


def test_unfinished_character_is_released_at_the_end(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("🎉", add_special_tokens=False).ids
    assert len(ids) > 1
    detok = IncrementalDetokenizer(tokenizer)
    assert detok.push(ids[:1]) == ""  # held: half an emoji
    assert detok.flush() == "\ufffd"  # the sequence ended mid-character: show what there is
