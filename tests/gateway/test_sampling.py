"""Every sampling and logprob parameter reaches the router as exactly its proto field, on every endpoint."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.gateway.conftest import FakeRouter
from turnout.v1 import common_pb2

CHAT = [{"role": "user", "content": "Hi"}]
BASE: dict[str, dict[str, Any]] = {
    "/v1/completions": {"prompt": "x"},
    "/v1/chat/completions": {"messages": CHAT},
    "/generate": {"text": "x"},
}

# (body field, value, proto field, proto value), spelled the same in OpenAI bodies and `sampling_params`.
# Floats are exact in float32 so that the proto value compares equal.
SHARED = [
    ("n", 2, "n", 2),
    ("temperature", 0.5, "temperature", 0.5),
    ("temperature", 0, "temperature", 0.0),
    ("top_p", 0.75, "top_p", 0.75),
    ("top_k", -1, "top_k", -1),
    ("min_p", 0.25, "min_p", 0.25),
    ("seed", -3, "seed", -3),
    ("frequency_penalty", 0.5, "frequency_penalty", 0.5),
    ("presence_penalty", -0.5, "presence_penalty", -0.5),
    ("repetition_penalty", 1.25, "repetition_penalty", 1.25),
    ("logit_bias", {"50256": -100, "7": 2.5}, "logit_bias", {50256: -100.0, 7: 2.5}),
    ("allowed_token_ids", [3, 4], "allowed_token_ids", [3, 4]),
    ("bad_words", ["foo", "bar baz"], "bad_words", ["foo", "bar baz"]),
    ("stop", "END", "stop", ["END"]),
    ("stop", ["A", "B"], "stop", ["A", "B"]),
    ("stop_token_ids", [7, 9], "stop_token_ids", [7, 9]),
    ("stop_regex", "x+", "stop_regex", ["x+"]),
    ("stop_regex", ["a+", "b+"], "stop_regex", ["a+", "b+"]),
    ("ignore_eos", True, "ignore_eos", True),
    ("no_stop_trim", True, "no_stop_trim", True),
    ("skip_special_tokens", False, "skip_special_tokens", False),
    ("spaces_between_special_tokens", False, "spaces_between_special_tokens", False),
    ("truncate_prompt_tokens", 8, "truncate_prompt_tokens", 8),
    ("typical_p", 0.5, "typical_p", 0.5),
    ("tfs", 0.75, "tfs", 0.75),
    ("top_a", 0.25, "top_a", 0.25),
    ("eta_cutoff", 3.0, "eta_cutoff", 3.0),
    ("epsilon_cutoff", 2, "epsilon_cutoff", 2.0),
    ("smoothing_factor", 0.5, "smoothing_factor", 0.5),
    ("smoothing_curve", 1.5, "smoothing_curve", 1.5),
    ("dynatemp_min", 0.5, "dynatemp_min", 0.5),
    ("dynatemp_max", 1.5, "dynatemp_max", 1.5),
    ("dynatemp_exponent", 2.0, "dynatemp_exponent", 2.0),
    ("xtc_threshold", 0.125, "xtc_threshold", 0.125),
    ("xtc_probability", 0.5, "xtc_probability", 0.5),
    ("dry_multiplier", 0.75, "dry_multiplier", 0.75),
    ("dry_base", 1.75, "dry_base", 1.75),
    ("dry_allowed_length", 3, "dry_allowed_length", 3),
    ("dry_sequence_breakers", ["\n", ":"], "dry_sequence_breakers", ["\n", ":"]),
    ("no_repeat_ngram_size", 3, "no_repeat_ngram_size", 3),
    ("nsigma", 1.5, "nsigma", 1.5),
]
OPENAI = [
    ("max_tokens", 7, "max_new_tokens", 7),
    ("min_tokens", 2, "min_new_tokens", 2),
    ("include_stop_str_in_output", True, "no_stop_trim", True),
    ("include_stop_str_in_output", False, "no_stop_trim", False),
]
NATIVE = [
    ("max_new_tokens", 7, "max_new_tokens", 7),
    ("min_new_tokens", 2, "min_new_tokens", 2),
    ("regex", "a+", "regex", "a+"),
]


def _body(path: str, field: str, value: Any) -> dict[str, Any]:
    if path == "/generate":
        return {**BASE[path], "sampling_params": {field: value}}
    return {**BASE[path], field: value}


def _set_fields(message: Any) -> set[str]:
    return {descriptor.name for descriptor, _ in message.ListFields()}


def _proto_value(sp: common_pb2.SamplingParams, name: str) -> Any:
    value = getattr(sp, name)
    if name == "logit_bias":
        return dict(value)
    if isinstance(value, (bool, int, float, str)):
        return value
    return list(value)


# The per-endpoint max_new_tokens default is the only field set besides the one sent.
DEFAULTS = {"/v1/completions": {"max_new_tokens"}, "/v1/chat/completions": set(), "/generate": {"max_new_tokens"}}
CASES = [
    *((path, *case) for path in DEFAULTS for case in SHARED),
    *((path, *case) for path in ("/v1/completions", "/v1/chat/completions") for case in OPENAI),
    ("/v1/completions", "best_of", 3, "best_of", 3),
    ("/v1/chat/completions", "max_completion_tokens", 9, "max_new_tokens", 9),
    *(("/generate", *case) for case in NATIVE),
]


@pytest.mark.parametrize(("path", "field", "value", "proto_field", "expected"), CASES)
async def test_parameter_sets_exactly_its_field(
    client: httpx.AsyncClient,
    fake_router: FakeRouter,
    path: str,
    field: str,
    value: Any,
    proto_field: str,
    expected: Any,
) -> None:
    response = await client.post(path, json=_body(path, field, value))
    assert response.status_code == 200, response.text
    [sent] = fake_router.requests
    sp = sent.sampling_params
    assert _set_fields(sp) == DEFAULTS[path] | {proto_field}
    assert _proto_value(sp, proto_field) == expected
    assert not sent.HasField("logprob_options")
    assert not sent.HasField("add_special_tokens")


@pytest.mark.parametrize("path", list(DEFAULTS))
async def test_add_special_tokens_goes_on_the_request(
    client: httpx.AsyncClient, fake_router: FakeRouter, path: str
) -> None:
    assert (await client.post(path, json=_body(path, "add_special_tokens", False))).status_code == 200
    [sent] = fake_router.requests
    assert sent.HasField("add_special_tokens") and not sent.add_special_tokens
    assert _set_fields(sent.sampling_params) == DEFAULTS[path]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"temperature": -1}),
        ("/v1/completions", {"top_p": 0}),
        ("/v1/completions", {"top_p": 1.5}),
        ("/v1/completions", {"n": 0}),
        ("/v1/completions", {"max_tokens": 4, "min_tokens": 5}),
        ("/v1/completions", {"presence_penalty": 3}),
        ("/v1/completions", {"top_k": -2}),
        ("/v1/completions", {"logit_bias": {"1": 101}}),
        ("/v1/completions", {"best_of": 1, "n": 2}),
        ("/v1/completions", {"logprobs": 1000}),
        ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 1000}),
        ("/v1/chat/completions", {"repetition_penalty": 0}),
        ("/generate", {"sampling_params": {"max_new_tokens": 0}}),
        ("/generate", {"sampling_params": {"dry_base": 0.5, "typical_p": 7}}),
        ("/generate", {"return_logprob": True, "logprob_start_len": 10**6}),
    ],
)
async def test_value_ranges_are_left_to_the_engine(
    client: httpx.AsyncClient, fake_router: FakeRouter, path: str, body: dict[str, Any]
) -> None:
    response = await client.post(path, json={**BASE[path], **body})
    assert response.status_code == 200, response.text
    assert len(fake_router.requests) == 1


async def test_out_of_range_values_travel_as_given(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    body = {"prompt": "x", "temperature": -1, "n": 0, "max_tokens": 3, "min_tokens": 5, "logit_bias": {"1": 101}}
    assert (await client.post("/v1/completions", json=body)).status_code == 200
    sp = fake_router.requests[0].sampling_params
    assert (sp.temperature, sp.n, sp.max_new_tokens, sp.min_new_tokens) == (-1.0, 0, 3, 5)
    assert sp.HasField("n") and dict(sp.logit_bias) == {1: 101.0}


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("/v1/completions", "max_tokens"),
        ("/v1/chat/completions", "max_tokens"),
        ("/v1/chat/completions", "max_completion_tokens"),
    ],
)
async def test_openai_routes_refuse_zero_max_tokens_as_vllm(
    client: httpx.AsyncClient, fake_router: FakeRouter, path: str, field: str
) -> None:
    """The engine takes 0 as prefill only (SGLang /generate); vLLM's /v1 routes refuse it."""
    response = await client.post(path, json={**BASE[path], field: 0})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == field and not fake_router.requests


LOGPROB_CASES = [
    ("/v1/completions", {}, None),
    (
        "/v1/completions",
        {"logprobs": 2},
        common_pb2.LogprobOptions(return_logprob=True, top_logprobs_num=2, return_text_in_logprobs=True),
    ),
    (
        "/v1/completions",
        {"logprobs": 0},
        common_pb2.LogprobOptions(return_logprob=True, top_logprobs_num=0, return_text_in_logprobs=True),
    ),
    (
        "/v1/completions",
        {"logprobs": 1, "return_tokens_as_token_ids": True},
        common_pb2.LogprobOptions(return_logprob=True, top_logprobs_num=1),
    ),
    ("/v1/completions", {"echo": True}, None),
    (
        "/v1/completions",
        {"echo": True, "logprobs": 1},
        common_pb2.LogprobOptions(
            return_logprob=True, top_logprobs_num=1, logprob_start_len=0, return_text_in_logprobs=True
        ),
    ),
    (
        "/v1/completions",
        {"prompt_logprobs": 3},
        common_pb2.LogprobOptions(logprob_start_len=0, input_top_logprobs_num=3, return_text_in_logprobs=True),
    ),
    ("/v1/chat/completions", {"logprobs": False}, None),
    (
        "/v1/chat/completions",
        {"logprobs": True},
        common_pb2.LogprobOptions(return_logprob=True, return_text_in_logprobs=True),
    ),
    (
        "/v1/chat/completions",
        {"logprobs": True, "top_logprobs": 3},
        common_pb2.LogprobOptions(return_logprob=True, top_logprobs_num=3, return_text_in_logprobs=True),
    ),
    (
        "/v1/chat/completions",
        {"prompt_logprobs": 0},
        common_pb2.LogprobOptions(logprob_start_len=0, input_top_logprobs_num=0, return_text_in_logprobs=True),
    ),
    ("/generate", {"return_logprob": True}, common_pb2.LogprobOptions(return_logprob=True)),
    (
        "/generate",
        {
            "return_logprob": True,
            "logprob_start_len": 2,
            "top_logprobs_num": 3,
            "token_ids_logprob": [5, 6],
            "return_text_in_logprobs": True,
        },
        common_pb2.LogprobOptions(
            return_logprob=True,
            logprob_start_len=2,
            top_logprobs_num=3,
            token_ids_logprob=[5, 6],
            return_text_in_logprobs=True,
        ),
    ),
    # SGLang ignores the options unless return_logprob.
    ("/generate", {"return_logprob": False, "top_logprobs_num": 3}, common_pb2.LogprobOptions(return_logprob=False)),
    ("/generate", {"top_logprobs_num": 3, "logprob_start_len": 0}, None),
]


@pytest.mark.parametrize(("path", "body", "expected"), LOGPROB_CASES)
async def test_logprob_options(
    client: httpx.AsyncClient,
    fake_router: FakeRouter,
    path: str,
    body: dict[str, Any],
    expected: common_pb2.LogprobOptions | None,
) -> None:
    assert (await client.post(path, json={**BASE[path], **body})).status_code == 200
    [sent] = fake_router.requests
    if expected is None:
        assert not sent.HasField("logprob_options")
    else:
        assert _set_fields(sent.logprob_options) == _set_fields(expected)
        assert sent.logprob_options == expected


async def test_native_logprob_options_per_prompt(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    body = {
        "text": ["a", "b"],
        "return_logprob": [True, True],
        "top_logprobs_num": [2, 0],
        "logprob_start_len": [-1, 0],
        "token_ids_logprob": [[1], [2, 3]],
        "return_text_in_logprobs": [False, True],
    }
    assert (await client.post("/generate", json=body)).status_code == 200
    sent = {r.text: r.logprob_options for r in fake_router.requests}
    assert sent["a"] == common_pb2.LogprobOptions(
        return_logprob=True,
        top_logprobs_num=2,
        logprob_start_len=-1,
        token_ids_logprob=[1],
        return_text_in_logprobs=False,
    )
    assert sent["b"] == common_pb2.LogprobOptions(
        return_logprob=True,
        top_logprobs_num=0,
        logprob_start_len=0,
        token_ids_logprob=[2, 3],
        return_text_in_logprobs=True,
    )


async def test_native_flat_token_ids_are_for_every_prompt(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    body = {"input_ids": [[5], [6]], "return_logprob": True, "token_ids_logprob": [1, 2]}
    assert (await client.post("/generate", json=body)).status_code == 200
    assert [list(r.logprob_options.token_ids_logprob) for r in fake_router.requests] == [[1, 2], [1, 2]]


async def test_native_per_prompt_sampling_extras(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    body = {
        "text": ["a", "b"],
        "sampling_params": [{"add_special_tokens": False, "truncate_prompt_tokens": 4}, {"bad_words": ["x"]}],
    }
    assert (await client.post("/generate", json=body)).status_code == 200
    sent = {r.text: r for r in fake_router.requests}
    assert not sent["a"].add_special_tokens and sent["a"].sampling_params.truncate_prompt_tokens == 4
    assert not sent["b"].HasField("add_special_tokens") and list(sent["b"].sampling_params.bad_words) == ["x"]
    assert not sent["b"].sampling_params.HasField("truncate_prompt_tokens")
