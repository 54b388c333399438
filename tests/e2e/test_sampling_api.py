"""The sampling surface through all four real services: stop strings, regexes and ids with and
without trimming, n and best_of, seeds, logprobs, prompt handling, and validation errors."""

from __future__ import annotations

import concurrent.futures
from typing import Any

import httpx
import pytest

from tests.e2e.stack import Stack

pytestmark = pytest.mark.e2e

PROMPT = "The quick brown fox jumps over the lazy dog. Then"


@pytest.fixture(scope="module")
def http(tiny_stack: Stack) -> httpx.Client:
    return httpx.Client(base_url=tiny_stack.base_url, timeout=60)


def complete(http: httpx.Client, **body: Any) -> dict[str, Any]:
    reply = http.post("/v1/completions", json={"prompt": PROMPT, "temperature": 0, "max_tokens": 12, **body})
    assert reply.status_code == 200, reply.text
    return reply.json()  # type: ignore[no-any-return]


def generate(http: httpx.Client, **body: Any) -> dict[str, Any]:
    reply = http.post("/generate", json={"text": PROMPT, **body})
    assert reply.status_code == 200, reply.text
    return reply.json()  # type: ignore[no-any-return]


def greedy(http: httpx.Client, n: int = 12) -> tuple[str, list[int]]:
    out = generate(http, sampling_params={"temperature": 0, "max_new_tokens": n, "ignore_eos": True})
    return out["text"], out["output_ids"]


def test_stop_string_trimmed_and_kept(http: httpx.Client) -> None:
    text, _ = greedy(http)
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    assert stop.strip(), f"pick a visible stop string from {text!r}"
    trimmed = complete(http, stop=[stop], ignore_eos=True)["choices"][0]
    kept = complete(http, stop=[stop], ignore_eos=True, include_stop_str_in_output=True)["choices"][0]
    cut = text.index(stop)
    assert trimmed["text"] == text[:cut] and trimmed["finish_reason"] == "stop" and trimmed["stop_reason"] == stop
    assert kept["text"] == text[: cut + len(stop)]


def test_stop_regex_through_generate(http: httpx.Client) -> None:
    text, _ = greedy(http)
    word = next(w for w in text.split() if w.isalpha() and len(w) > 2)
    pattern = word[:2] + "[a-z]"
    out = generate(http, sampling_params={"temperature": 0, "max_new_tokens": 12, "stop_regex": pattern})
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": pattern}
    assert out["text"] == text[: text.index(word[:3])] or len(out["text"]) < len(text)


def test_stop_token_id_with_and_without_trim(http: httpx.Client) -> None:
    _, ids = greedy(http)
    stop = ids[3]
    out = generate(http, sampling_params={"temperature": 0, "max_new_tokens": 12, "stop_token_ids": [stop]})
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert out["output_ids"] == ids[: ids.index(stop) + 1]
    choice = complete(http, stop_token_ids=[stop])["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == stop


def test_n_samples_with_a_seed_repeat(http: httpx.Client) -> None:
    body = {"n": 3, "temperature": 1.0, "seed": 42, "max_tokens": 8, "ignore_eos": True}
    first = [c["text"] for c in complete(http, **body)["choices"]]
    again = [c["text"] for c in complete(http, **body)["choices"]]
    assert len(first) == 3 and first == again
    assert len(set(first)) > 1


def test_best_of_returns_the_most_likely_of_the_samples(http: httpx.Client) -> None:
    body = {"temperature": 1.0, "seed": 7, "max_tokens": 6, "ignore_eos": True}
    every = complete(http, n=3, logprobs=0, **body)["choices"]
    scores = [sum(c["logprobs"]["token_logprobs"]) for c in every]
    best = complete(http, n=1, best_of=3, **body)["choices"]
    assert len(best) == 1 and best[0]["text"] == every[scores.index(max(scores))]["text"]
    assert best[0]["logprobs"] is None


def test_seeded_requests_repeat_under_concurrency(http: httpx.Client) -> None:
    seeded = {"temperature": 0.8, "top_p": 0.95, "seed": 1234, "max_tokens": 10, "ignore_eos": True}
    alone = complete(http, **seeded)["choices"][0]["text"]
    noise = {"temperature": 1.2, "max_tokens": 10, "ignore_eos": True}
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(complete, http, **(seeded if i % 2 else noise)) for i in range(6)]
        texts = [f.result()["choices"][0]["text"] for f in futures]
    assert texts[1] == texts[3] == texts[5] == alone


def test_completion_logprobs_and_echo(http: httpx.Client) -> None:
    choice = complete(http, logprobs=2, max_tokens=4, ignore_eos=True)["choices"][0]
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == 4
    assert "".join(lp["tokens"]) == choice["text"]
    assert all(
        len(top) <= 2 and max(top.values()) >= lp["token_logprobs"][i] - 1e-5
        for i, top in enumerate(lp["top_logprobs"])
    )
    echoed = complete(http, logprobs=1, max_tokens=2, echo=True, ignore_eos=True)["choices"][0]
    assert echoed["text"].startswith(PROMPT)
    assert echoed["logprobs"]["token_logprobs"][0] is None
    assert all(v is not None for v in echoed["logprobs"]["token_logprobs"][1:])


def test_chat_logprobs(http: httpx.Client) -> None:
    reply = http.post(
        "/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 3,
            "temperature": 0,
            "logprobs": True,
            "top_logprobs": 2,
            "ignore_eos": True,
        },
    )
    assert reply.status_code == 200, reply.text
    content = reply.json()["choices"][0]["logprobs"]["content"]
    assert len(content) == 3
    for entry in content:
        assert entry["logprob"] <= 0 and isinstance(entry["bytes"], list) and len(entry["top_logprobs"]) == 2
        assert entry["top_logprobs"][0]["logprob"] >= entry["logprob"] - 1e-5  # greedy: the top one


def test_native_logprobs_and_prompt_logprobs(http: httpx.Client) -> None:
    out = generate(
        http,
        sampling_params={"temperature": 0, "max_new_tokens": 3, "ignore_eos": True},
        return_logprob=True,
        logprob_start_len=0,
        top_logprobs_num=2,
        return_text_in_logprobs=True,
    )
    meta = out["meta_info"]
    assert [entry[1] for entry in meta["output_token_logprobs"]] == out["output_ids"]
    assert meta["input_token_logprobs"][0][0] is None
    assert all(entry[0] is not None and entry[2] is not None for entry in meta["input_token_logprobs"][1:])
    assert len(meta["input_token_logprobs"]) == meta["prompt_tokens"]
    assert all(len(top) == 2 for top in meta["output_top_logprobs"])


def test_bad_words_are_not_generated(http: httpx.Client) -> None:
    text, _ = greedy(http, 16)
    word = next(w for w in text.split() if w.isalpha() and len(w) > 2)
    out = generate(
        http, sampling_params={"temperature": 0, "max_new_tokens": 16, "ignore_eos": True, "bad_words": [word]}
    )
    assert word not in out["text"].split()


def test_allowed_token_ids_and_logit_bias(http: httpx.Client) -> None:
    allowed = [262, 314, 1020]
    out = generate(http, sampling_params={"temperature": 1.0, "max_new_tokens": 8, "allowed_token_ids": allowed})
    assert out["output_ids"] and set(out["output_ids"]) <= set(allowed)
    forced = complete(http, logit_bias={"1020": 100}, max_tokens=3, ignore_eos=True)["choices"][0]
    assert forced["text"] and forced["finish_reason"] == "length"
    ids = generate(
        http, sampling_params={"temperature": 0, "max_new_tokens": 3, "ignore_eos": True, "logit_bias": {"1020": 100}}
    )
    assert ids["output_ids"] == [1020, 1020, 1020]


def test_no_repeat_ngram_and_repetition_penalty_change_the_output(http: httpx.Client) -> None:
    base = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}
    _, plain = greedy(http, 24)
    out = generate(http, sampling_params={**base, "no_repeat_ngram_size": 1})["output_ids"]
    assert len(set(out)) == len(out), "no token may repeat with no_repeat_ngram_size=1"
    penalised = generate(http, sampling_params={**base, "repetition_penalty": 1.9})["output_ids"]
    assert len(set(plain)) < len(plain) and penalised != plain


def test_truncate_prompt_tokens(http: httpx.Client) -> None:
    usage = complete(http, truncate_prompt_tokens=5, max_tokens=2)["usage"]
    assert usage["prompt_tokens"] == 5


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"temperature": -1}, "temperature must be a non-negative finite number, got -1"),
        ({"top_p": 1.5}, "top_p must be in (0, 1], got 1.5"),
        ({"top_k": -5}, "top_k must be -1 or 0 (disable) or at least 1, got -5"),
        ({"frequency_penalty": 3}, "frequency_penalty must be in [-2, 2], got 3"),
        ({"repetition_penalty": 0}, "repetition_penalty must be in (0, 2], got 0"),
        (
            {"min_tokens": 20, "max_tokens": 5},
            "min_new_tokens (min_tokens) must not exceed max_new_tokens (max_tokens)",
        ),
        ({"n": 2, "best_of": 1}, "best_of must be at least n (2), got 1"),
        ({"stop_token_ids": [10**8]}, "stop_token_ids: token id 100000000 is out of range"),
        ({"logit_bias": {"99999999": 1}}, "logit_bias: token id 99999999 is out of range"),
        ({"logprobs": 21}, "at most 20 (the server's --max-logprobs), got 21"),
        ({"max_tokens": 100000}, "This model's maximum context length is 4096 tokens. However, your request has"),
        ({"typical_p": 0}, "typical_p must be in (0, 1], got 0"),
        ({"dry_base": 0.5}, "dry_base must be in (1, inf), got 0.5"),
    ],
)
def test_bad_values_get_400_naming_the_parameter(http: httpx.Client, body: dict[str, Any], message: str) -> None:
    reply = http.post("/v1/completions", json={"prompt": PROMPT, **body})
    assert reply.status_code == 400, reply.text
    assert message in reply.json()["error"]["message"]
    assert complete(http, max_tokens=1)["choices"][0]["finish_reason"] == "length", "the stack keeps serving"
