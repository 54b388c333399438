from __future__ import annotations

import random
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from services.tokenizer import detokenizer
from services.tokenizer.detokenizer import IncrementalDetokenizer, decode
from tests.tokenizer.toy_tokenizers import sentencepiece_style


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


# tokenizers' DecodeStream does the pushes where it can; the windows are the reference.


def _deltas(tokenizer: Tokenizer, ids: list[int], chunks: list[int], prompt: list[int], **kw: bool) -> list[str]:
    detok = IncrementalDetokenizer(tokenizer, prompt, **kw)
    deltas, at = [], 0
    for size in chunks:
        deltas.append(detok.push(ids[at : at + size]))
        at += size
    return [*deltas, detok.flush()]


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_decode_stream_gives_the_windows_deltas(tokenizer: Tokenizer, seed: int, skip_special_tokens: bool) -> None:
    """Delta for delta, not only the joined text: a held character is held by both, and so is its release."""
    rng = random.Random(seed)
    alphabet = ["ab", " xy", " 12", "é", " 中文", "😀", "👍🏽", "\n", " -", "<|im_end|>", "<|im_start|>"]
    for sp in (tokenizer, sentencepiece_style()):
        text = "".join(rng.choice(alphabet) for _ in range(60))
        ids = sp.encode(text, add_special_tokens=False).ids
        prompt = sp.encode("x y " + rng.choice(alphabet), add_special_tokens=False).ids
        chunks = []
        while sum(chunks) < len(ids):
            chunks.append(rng.choice([1, 1, 1, 2, 3, 0]))
        kw = {"skip_special_tokens": skip_special_tokens, "spaces_between_special_tokens": False}
        fast = _deltas(sp, ids, chunks, prompt, **kw)
        windows = _deltas(sp, ids, chunks, prompt, decode_stream=False, **kw)
        assert fast == windows
        assert "".join(fast) == sp.decode(ids, skip_special_tokens=skip_special_tokens)


def test_pushes_go_through_the_decode_stream(tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the end of the sequence decodes windows in Python: a push never does."""
    ids = tokenizer.encode("The capital of France is Paris. 🎉", add_special_tokens=False).ids
    detok = IncrementalDetokenizer(tokenizer, [1, 2, 3])

    def no_windows(*args: object, **kwargs: object) -> str:
        raise AssertionError("a push decoded a window in Python")

    monkeypatch.setattr(detokenizer, "decode", no_windows)
    text = "".join(detok.push([i]) for i in ids)
    monkeypatch.undo()
    assert text + detok.flush() == "The capital of France is Paris. 🎉"


def test_windows_take_over_when_the_decode_stream_fails(tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    """tokenizers raises (e.g. "Invalid prefix encountered") on a decoder whose shorter window's
    text is not a prefix of the longer one's; the sequence carries on, nothing lost or repeated."""
    real = detokenizer.DecodeStream

    class FailsOnTheFifthStep:
        def __init__(self, ids: list[int], skip_special_tokens: bool) -> None:
            self._inner, self._steps = real(ids, skip_special_tokens=skip_special_tokens), 0

        def step(self, tok: Tokenizer, ids: int | list[int]) -> str | None:
            self._steps += 1
            if self._steps == 5:
                raise Exception("Invalid prefix encountered")  # what tokenizers raises
            return self._inner.step(tok, ids)

    monkeypatch.setattr(detokenizer, "DecodeStream", FailsOnTheFifthStep)
    text = "naïve café 🎉 and more words after it"
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    assert "".join(stream(tokenizer, ids)) == text
