"""Logprobs as OpenAI completions/chat, vLLM and SGLang show them, from the positions the fake router sends."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.gateway.conftest import BOS, FakeRouter, chunk, complete, fake_encode, pos, sse_events, tok

CHAT = [{"role": "user", "content": "Hi"}]
A, B = fake_encode("ab", add_special_tokens=False)

# "Hello world" in three tokens; the third one's text is held back for a chunk.
OUTPUT = [
    pos(tok(11, -0.5, "Hel"), top=[tok(11, -0.5, "Hel"), tok(99, -1.5, "Hi", rank=2)], requested=[tok(99, -1.5, "Hi")]),
    pos(tok(12, -0.25, "lo"), top=[tok(12, -0.25, "lo"), tok(98, -2.0, "p", rank=2)], requested=[tok(99, -4.0, "Hi")]),
    # Sampled but not the most likely.
    pos(
        tok(13, -1.0, " world", rank=2, raw=b" world"),
        top=[tok(14, -0.75, " there"), tok(13, -1.0, " world", rank=2)],
        requested=[tok(99, -8.0, "Hi")],
    ),
]
# Positions 1 and 2 of the prompt "ab" ([BOS, a, b]).
PROMPT = [
    pos(tok(A, -2.0, "a", rank=3), top=[tok(50, -0.5, "x"), tok(51, -1.0, "y", rank=2)], requested=[tok(99, -6.0)]),
    pos(tok(B, -3.0, "b", rank=1), top=[tok(B, -3.0, "b"), tok(50, -4.0, "x", rank=2)], requested=[tok(99, -7.0)]),
]


async def script(request, context):  # type: ignore[no-untyped-def]
    """One sample per `n`, with logprobs only as asked for: what the router does."""
    options = request.logprob_options
    n = request.sampling_params.n if request.sampling_params.HasField("n") else 1
    sampled = options.return_logprob
    prompt = options.HasField("logprob_start_len") and options.logprob_start_len >= 0
    for i in range(n):
        yield chunk(i, "Hello", (11, 12), completion=2, logprobs=OUTPUT[:2] if sampled else ())
        yield chunk(i, "", (13,), completion=3, logprobs=OUTPUT[2:] if sampled else ())
        yield chunk(i, " world", (), completion=3)
    for i in range(n):
        yield complete(i, eos_token_id=2, input_logprobs=PROMPT if prompt else ())


@pytest.fixture(autouse=True)
def _scripted(fake_router: FakeRouter) -> None:
    fake_router.script = script


OUTPUT_LOGPROBS_1 = {
    "tokens": ["Hel", "lo", " world"],
    "token_logprobs": [-0.5, -0.25, -1.0],
    # The top alternative plus the sampled token (first) when it is not among them.
    "top_logprobs": [{"Hel": -0.5}, {"lo": -0.25}, {" world": -1.0, " there": -0.75}],
    "text_offset": [0, 3, 5],
}


async def test_completion_logprobs(client: httpx.AsyncClient) -> None:
    body = (await client.post("/v1/completions", json={"prompt": "ab", "logprobs": 1})).json()
    [choice] = body["choices"]
    assert choice["text"] == "Hello world"
    assert choice["logprobs"] == OUTPUT_LOGPROBS_1
    assert choice["prompt_logprobs"] is None


async def test_completion_logprobs_zero_and_two(client: httpx.AsyncClient) -> None:
    zero = (await client.post("/v1/completions", json={"prompt": "ab", "logprobs": 0})).json()
    assert zero["choices"][0]["logprobs"]["top_logprobs"] == [{"Hel": -0.5}, {"lo": -0.25}, {" world": -1.0}]
    two = (await client.post("/v1/completions", json={"prompt": "ab", "logprobs": 2})).json()
    assert two["choices"][0]["logprobs"]["top_logprobs"][0] == {"Hel": -0.5, "Hi": -1.5}


async def test_completion_logprobs_as_token_ids(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    payload = {"prompt": "ab", "logprobs": 1, "return_tokens_as_token_ids": True}
    logprobs = (await client.post("/v1/completions", json=payload)).json()["choices"][0]["logprobs"]
    assert logprobs["tokens"] == ["token_id:11", "token_id:12", "token_id:13"]
    assert logprobs["top_logprobs"][2] == {"token_id:13": -1.0, "token_id:14": -0.75}
    # Offsets count the shown strings, as in vLLM.
    assert logprobs["text_offset"] == [0, 11, 22]


async def test_completion_stream_logprobs_and_offsets(client: httpx.AsyncClient) -> None:
    payload = {"prompt": "ab", "logprobs": 1, "stream": True}
    chunks = [e["choices"][0] for e in sse_events((await client.post("/v1/completions", json=payload)).text)]
    content = [c for c in chunks if c["finish_reason"] is None]
    # The held-back token's chunk is sent for its logprobs, with empty text.
    assert [c["text"] for c in content] == ["Hello", "", " world"]
    assert [c["logprobs"]["tokens"] for c in content] == [["Hel", "lo"], [" world"], []]
    # Offsets within the whole choice text.
    assert [c["logprobs"]["text_offset"] for c in content] == [[0, 3], [5], []]
    assert content[1]["logprobs"]["top_logprobs"] == [{" world": -1.0, " there": -0.75}]
    assert chunks[-1]["finish_reason"] == "stop" and chunks[-1]["logprobs"] is None


ECHO_LOGPROBS_1 = {
    "tokens": ["<s>", "a", "b", "Hel", "lo", " world"],
    "token_logprobs": [None, -2.0, -3.0, -0.5, -0.25, -1.0],
    "top_logprobs": [None, {"a": -2.0, "x": -0.5}, {"b": -3.0}, *OUTPUT_LOGPROBS_1["top_logprobs"]],
    "text_offset": [0, 3, 4, 5, 8, 10],
}


async def test_echo_text_prompt(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    body = (await client.post("/v1/completions", json={"prompt": "ab", "echo": True})).json()
    assert body["choices"][0]["text"] == "abHello world"
    assert body["choices"][0]["logprobs"] is None
    assert fake_router.tokenize_requests == [] and fake_router.detokenize_requests == []


async def test_echo_token_prompt_is_detokenized(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    payload = {"prompt": [[BOS, A, B], [B]], "echo": True, "skip_special_tokens": False}
    body = (await client.post("/v1/completions", json=payload)).json()
    assert [c["text"] for c in body["choices"]] == ["<s>abHello world", "bHello world"]
    asked = sorted((list(r.token_ids), r.skip_special_tokens) for r in fake_router.detokenize_requests)
    assert asked == [([BOS, A, B], False), ([B], False)]


async def test_echo_token_prompt_truncated(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    payload = {"prompt": [BOS, A, B], "echo": True, "truncate_prompt_tokens": 2}
    body = (await client.post("/v1/completions", json=payload)).json()
    assert body["choices"][0]["text"] == "abHello world"
    [asked] = fake_router.detokenize_requests
    # Special tokens shown, as the echoed logprob tokens show them (vLLM).
    assert list(asked.token_ids) == [A, B] and asked.HasField("skip_special_tokens")
    assert not asked.skip_special_tokens
    assert asked.HasField("spaces_between_special_tokens") and not asked.spaces_between_special_tokens
    body = (await client.post("/v1/completions", json={"prompt": [BOS, A, B], "echo": True})).json()
    assert body["choices"][0]["text"] == "<s>abHello world"


async def test_echo_with_logprobs(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    body = (await client.post("/v1/completions", json={"prompt": "ab", "echo": True, "logprobs": 1})).json()
    [choice] = body["choices"]
    assert choice["text"] == "abHello world"
    assert choice["logprobs"] == ECHO_LOGPROBS_1
    # The first prompt token: encoded as the router does, shown with its special-token text.
    [encoded] = fake_router.tokenize_requests
    assert encoded.text == "ab" and not encoded.HasField("add_special_tokens")
    [decoded] = fake_router.detokenize_requests
    assert list(decoded.token_ids) == [BOS] and decoded.HasField("skip_special_tokens")
    assert not decoded.skip_special_tokens


async def test_echo_with_logprobs_as_token_ids_needs_no_text(
    client: httpx.AsyncClient, fake_router: FakeRouter
) -> None:
    payload = {"prompt": "ab", "echo": True, "logprobs": 0, "return_tokens_as_token_ids": True}
    logprobs = (await client.post("/v1/completions", json=payload)).json()["choices"][0]["logprobs"]
    assert logprobs["tokens"][:3] == [f"token_id:{BOS}", f"token_id:{A}", f"token_id:{B}"]
    assert fake_router.detokenize_requests == []


async def test_echo_with_logprobs_first_token_after_truncation(
    client: httpx.AsyncClient, fake_router: FakeRouter
) -> None:
    payload = {"prompt": "ab", "echo": True, "logprobs": 0, "truncate_prompt_tokens": 2, "add_special_tokens": True}
    logprobs = (await client.post("/v1/completions", json=payload)).json()["choices"][0]["logprobs"]
    assert logprobs["tokens"][0] == "a"
    assert fake_router.tokenize_requests[0].add_special_tokens


async def test_echo_stream_prompt_leads_first_chunk(client: httpx.AsyncClient) -> None:
    payload = {"prompt": "ab", "echo": True, "stream": True, "n": 2}
    events = sse_events((await client.post("/v1/completions", json=payload)).text)
    for index in (0, 1):
        mine = [e["choices"][0] for e in events if e["choices"][0]["index"] == index]
        assert mine[0]["text"] == "abHello"
        assert "".join(c["text"] for c in mine) == "abHello world"


async def test_echo_stream_with_logprobs_sends_the_choice_whole(client: httpx.AsyncClient) -> None:
    payload = {"prompt": "ab", "echo": True, "logprobs": 1, "stream": True}
    events = sse_events((await client.post("/v1/completions", json=payload)).text)
    # One chunk: the whole choice, with its finish reason.
    [content] = (e["choices"][0] for e in events)
    assert content["text"] == "abHello world" and content["logprobs"] == ECHO_LOGPROBS_1
    assert content["finish_reason"] == "stop"


async def test_prompt_logprobs(client: httpx.AsyncClient) -> None:
    body = (await client.post("/v1/completions", json={"prompt": "ab", "prompt_logprobs": 1})).json()
    [choice] = body["choices"]
    assert choice["logprobs"] is None
    assert choice["prompt_logprobs"] == [
        None,
        {
            str(A): {"logprob": -2.0, "rank": 3, "decoded_token": "a"},
            "50": {"logprob": -0.5, "rank": 1, "decoded_token": "x"},
        },
        {str(B): {"logprob": -3.0, "rank": 1, "decoded_token": "b"}},
    ]


async def test_prompt_logprobs_for_every_choice(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    async def once(request, context):  # type: ignore[no-untyped-def]
        # The prompt's positions with one sample only.
        yield complete(0, input_logprobs=PROMPT)
        yield complete(1)

    fake_router.script = once
    body = (await client.post("/v1/completions", json={"prompt": "ab", "prompt_logprobs": 0, "n": 2})).json()
    assert [len(c["prompt_logprobs"]) for c in body["choices"]] == [3, 3]


async def test_chat_logprobs(client: httpx.AsyncClient) -> None:
    payload = {"messages": CHAT, "logprobs": True, "top_logprobs": 1}
    body = (await client.post("/v1/chat/completions", json=payload)).json()
    content = body["choices"][0]["logprobs"]["content"]
    assert content[0] == {
        "token": "Hel",
        "logprob": -0.5,
        "bytes": list(b"Hel"),
        "top_logprobs": [{"token": "Hel", "logprob": -0.5, "bytes": list(b"Hel")}],
    }
    assert [c["token"] for c in content] == ["Hel", "lo", " world"]
    assert content[2]["top_logprobs"] == [{"token": " there", "logprob": -0.75, "bytes": list(b" there")}]
    assert body["prompt_logprobs"] is None


async def test_chat_logprobs_without_top(client: httpx.AsyncClient) -> None:
    body = (await client.post("/v1/chat/completions", json={"messages": CHAT, "logprobs": True})).json()
    assert [c["top_logprobs"] for c in body["choices"][0]["logprobs"]["content"]] == [[], [], []]


async def test_chat_bytes_are_the_tokens_own(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    async def partial(request, context):  # type: ignore[no-untyped-def]
        # The first two bytes of "€": not a character by themselves.
        half = tok(7, -0.5, "\ufffd", raw=b"\xe2\x82")
        yield chunk(0, "", (7,), completion=1, logprobs=[pos(half, top=[half])])
        yield complete(0, length=1)

    fake_router.script = partial
    payload = {"messages": CHAT, "logprobs": True, "top_logprobs": 1}
    content = (await client.post("/v1/chat/completions", json=payload)).json()["choices"][0]["logprobs"]["content"]
    assert content[0]["token"] == "\ufffd" and content[0]["bytes"] == [0xE2, 0x82]
    assert content[0]["top_logprobs"][0]["bytes"] == [0xE2, 0x82]


async def test_chat_logprobs_as_token_ids(client: httpx.AsyncClient) -> None:
    payload = {"messages": CHAT, "logprobs": True, "return_tokens_as_token_ids": True}
    content = (await client.post("/v1/chat/completions", json=payload)).json()["choices"][0]["logprobs"]["content"]
    assert content[2]["token"] == "token_id:13" and content[2]["bytes"] == list(b"token_id:13")


async def test_chat_stream_logprobs_per_delta(client: httpx.AsyncClient) -> None:
    payload = {"messages": CHAT, "logprobs": True, "top_logprobs": 2, "stream": True}
    events = sse_events((await client.post("/v1/chat/completions", json=payload)).text)
    choices = [e["choices"][0] for e in events]
    assert choices[0]["logprobs"] is None  # the role delta
    with_logprobs = [c for c in choices if c["logprobs"] is not None]
    assert [c["delta"]["content"] for c in with_logprobs] == ["Hello", "", " world"]
    tokens = [[t["token"] for t in c["logprobs"]["content"]] for c in with_logprobs]
    assert tokens == [["Hel", "lo"], [" world"], []]
    assert [t["token"] for t in with_logprobs[1]["logprobs"]["content"][0]["top_logprobs"]] == [" there", " world"]


async def test_chat_stream_without_logprobs_has_none(client: httpx.AsyncClient) -> None:
    events = sse_events((await client.post("/v1/chat/completions", json={"messages": CHAT, "stream": True})).text)
    assert all(e["choices"][0]["logprobs"] is None for e in events)
    assert [e["choices"][0]["delta"].get("content") for e in events][1:3] == ["Hello", " world"]


async def test_chat_prompt_logprobs_beside_choices(client: httpx.AsyncClient) -> None:
    body = (await client.post("/v1/chat/completions", json={"messages": CHAT, "prompt_logprobs": 0})).json()
    assert body["choices"][0]["logprobs"] is None
    assert body["prompt_logprobs"][0] is None
    assert body["prompt_logprobs"][1] == {str(A): {"logprob": -2.0, "rank": 3, "decoded_token": "a"}}


async def test_minus_infinity_is_clamped_for_openai(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    async def banned(request, context):  # type: ignore[no-untyped-def]
        yield chunk(0, "x", (7,), completion=1, logprobs=[pos(tok(7, -0.5, "x"), top=[tok(8, float("-inf"), "y")])])
        yield complete(0, length=1)

    fake_router.script = banned
    payload = {"prompt": "ab", "logprobs": 1}
    body = (await client.post("/v1/completions", json=payload)).json()
    assert body["choices"][0]["logprobs"]["top_logprobs"] == [{"x": -0.5, "y": -9999.0}]


def _triples(positions: list[Any], with_text: bool, part: str = "token") -> list[Any]:
    def one(t: Any) -> list[Any]:
        return [t.logprob, t.token_id, t.text if with_text else None]

    if part == "token":
        return [one(p.token) for p in positions]
    return [[one(t) for t in getattr(p, part)] for p in positions]


async def test_native_logprobs_from_position_zero(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    payload = {
        "input_ids": [BOS, A, B],
        "return_logprob": True,
        "logprob_start_len": 0,
        "top_logprobs_num": 2,
        "token_ids_logprob": [99],
        "return_text_in_logprobs": True,
    }
    meta = (await client.post("/generate", json=payload)).json()["meta_info"]
    assert meta["input_token_logprobs"] == [[None, BOS, "<s>"], *_triples(PROMPT, True)]
    assert meta["output_token_logprobs"] == _triples(OUTPUT, True)
    assert meta["input_top_logprobs"] == [None, *_triples(PROMPT, True, "top")]
    assert meta["output_top_logprobs"] == _triples(OUTPUT, True, "top")
    assert meta["input_token_ids_logprobs"] == [None, [[-6.0, 99, None]], [[-7.0, 99, None]]]
    assert meta["output_token_ids_logprobs"] == _triples(OUTPUT, True, "requested")
    assert meta["finish_reason"] == {"type": "stop", "matched": 2}
    # Token ids given: nothing to encode; the first token's text decoded with special tokens.
    assert fake_router.tokenize_requests == []
    [decoded] = fake_router.detokenize_requests
    assert list(decoded.token_ids) == [BOS] and not decoded.skip_special_tokens


async def test_native_logprobs_without_text_or_extras(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    payload = {"text": "ab", "return_logprob": True, "logprob_start_len": 0}
    meta = (await client.post("/generate", json=payload)).json()["meta_info"]
    assert meta["input_token_logprobs"] == [[None, BOS, None], *_triples(PROMPT, False)]
    assert meta["output_token_logprobs"] == _triples(OUTPUT, False)
    assert not {"input_top_logprobs", "output_top_logprobs", "input_token_ids_logprobs"} & set(meta)
    [encoded] = fake_router.tokenize_requests
    assert encoded.text == "ab"
    assert fake_router.detokenize_requests == []


async def test_native_logprobs_output_only(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    meta = (await client.post("/generate", json={"text": "ab", "return_logprob": True})).json()["meta_info"]
    assert meta["input_token_logprobs"] == []
    assert len(meta["output_token_logprobs"]) == 3
    assert fake_router.tokenize_requests == [] and fake_router.detokenize_requests == []


async def test_native_without_return_logprob_has_no_logprob_keys(client: httpx.AsyncClient) -> None:
    meta = (await client.post("/generate", json={"text": "ab", "top_logprobs_num": 2})).json()["meta_info"]
    assert not [key for key in meta if "logprob" in key]


async def test_native_stream_logprobs_are_cumulative(client: httpx.AsyncClient) -> None:
    payload = {"text": "ab", "stream": True, "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 1}
    events = sse_events((await client.post("/generate", json=payload)).text)
    metas = [e["meta_info"] for e in events]
    assert [len(m["output_token_logprobs"]) for m in metas] == [2, 3, 3, 3]
    assert [len(m["output_top_logprobs"]) for m in metas] == [2, 3, 3, 3]
    # The prompt's positions come with the end of the sample.
    assert [len(m["input_token_logprobs"]) for m in metas] == [0, 0, 0, 3]
    assert metas[-1]["input_token_logprobs"][0] == [None, BOS, None]
    assert metas[-1]["input_top_logprobs"][0] is None


async def test_native_non_finite_logprob_is_null(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    async def banned(request, context):  # type: ignore[no-untyped-def]
        yield chunk(0, "x", (7,), completion=1, logprobs=[pos(tok(7, float("-inf")))])
        yield complete(0, length=1)

    fake_router.script = banned
    meta = (await client.post("/generate", json={"text": "ab", "return_logprob": True})).json()["meta_info"]
    assert meta["output_token_logprobs"] == [[None, 7, None]]


async def test_router_logprob_count_mismatch_is_502(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    async def broken(request, context):  # type: ignore[no-untyped-def]
        yield chunk(0, "x", (7, 8), completion=2, logprobs=[pos(tok(7, -1.0))])
        yield complete(0, length=2)

    fake_router.script = broken
    response = await client.post("/v1/completions", json={"prompt": "ab", "logprobs": 0})
    assert response.status_code == 502
