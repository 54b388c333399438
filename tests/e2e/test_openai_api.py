"""The OpenAI-compatible API through all four real services, with the official client."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest

from tests.e2e.stack import Stack

pytestmark = pytest.mark.e2e

CHAT = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def client(tiny_stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{tiny_stack.base_url}/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def test_models_lists_the_served_model(client: openai.OpenAI, tiny_model_dir: object) -> None:
    models = client.models.list().data
    assert [m.id for m in models] == [tiny_model_dir.name]  # type: ignore[attr-defined]
    assert models[0].model_extra and models[0].model_extra["max_model_len"] == 4096


def test_completion_max_tokens_ends_with_length(client: openai.OpenAI, model: str) -> None:
    reply = client.completions.create(
        model=model, prompt="Hello there", max_tokens=5, temperature=0, extra_body={"ignore_eos": True}
    )
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None and reply.usage.completion_tokens == 5
    assert reply.id.startswith("cmpl-") and reply.model == model


def test_streamed_completion_equals_non_streamed(client: openai.OpenAI, model: str) -> None:
    kwargs = {
        "model": model,
        "prompt": "Once upon a time",
        "max_tokens": 24,
        "temperature": 0,
        "extra_body": {"ignore_eos": True},
    }
    whole = client.completions.create(**kwargs).choices[0].text  # type: ignore[call-overload]
    chunks = list(client.completions.create(stream=True, **kwargs))  # type: ignore[call-overload]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole
    assert finishes == ["length"]


def test_streamed_chat_equals_non_streamed(client: openai.OpenAI, model: str) -> None:
    kwargs = {"model": model, "messages": CHAT, "max_tokens": 20, "temperature": 0}
    whole = client.chat.completions.create(**kwargs)  # type: ignore[call-overload]
    assert whole.choices[0].message.role == "assistant" and whole.id.startswith("chatcmpl-")
    chunks = list(client.chat.completions.create(stream=True, **kwargs))  # type: ignore[call-overload]
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]


def test_stop_string_ends_with_stop_and_is_trimmed(client: openai.OpenAI, model: str) -> None:
    base = {"model": model, "prompt": "The weather today", "max_tokens": 30, "temperature": 0}
    full = client.completions.create(**base, extra_body={"ignore_eos": True}).choices[0].text  # type: ignore[call-overload]
    middle = len(full) // 2
    stop = next(full[i : i + 3] for i in range(middle, len(full) - 3) if full[i : i + 3].strip())
    for stream in (False, True):
        if stream:
            chunks = list(client.completions.create(**base, stop=[stop], stream=True, extra_body={"ignore_eos": True}))  # type: ignore[call-overload]
            text = "".join(c.choices[0].text for c in chunks if c.choices)
            finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        else:
            reply = client.completions.create(**base, stop=[stop], extra_body={"ignore_eos": True})  # type: ignore[call-overload]
            text, finish = reply.choices[0].text, [reply.choices[0].finish_reason]
        assert finish == ["stop"]
        assert text == full[: full.find(stop)]
        assert stop not in text


def test_bad_parameter_is_a_400_and_the_stack_keeps_serving(
    client: openai.OpenAI, model: str, tiny_stack: Stack
) -> None:
    for body in ({"temperature": -1}, {"top_p": 7}, {"max_tokens": "many"}, {"max_tokens": 10**7}):
        reply = httpx.post(f"{tiny_stack.base_url}/v1/completions", json={"model": model, "prompt": "hi", **body})
        assert reply.status_code == 400, (body, reply.text)
        error = reply.json()["error"]
        assert error["message"] and error["code"] == 400
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=model, messages=[], max_tokens=3)
    assert httpx.get(f"{tiny_stack.base_url}/health").status_code == 200
    assert client.completions.create(model=model, prompt="still here", max_tokens=2).choices[0].finish_reason


def test_unknown_model_is_a_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="hi", max_tokens=2)


def test_native_generate_shape(tiny_stack: Stack) -> None:
    body = {"text": "Hello", "sampling_params": {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}}
    reply = httpx.post(f"{tiny_stack.base_url}/generate", json=body, timeout=60).json()
    assert isinstance(reply["text"], str) and len(reply["output_ids"]) == 4
    meta = reply["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 4}
    assert meta["completion_tokens"] == 4 and meta["prompt_tokens"] > 0 and meta["cached_tokens"] == 0
    assert meta["id"] and meta["e2e_latency"] > 0
    with httpx.stream("POST", f"{tiny_stack.base_url}/generate", json={**body, "stream": True}, timeout=60) as events:
        lines = [line for line in events.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"


def test_cancelled_stream_frees_the_engine(client: openai.OpenAI, model: str, tiny_stack: Stack) -> None:
    stream = client.completions.create(
        model=model, prompt="Count forever", max_tokens=3000, stream=True, extra_body={"ignore_eos": True}
    )
    for received, _ in enumerate(stream, start=1):
        if received == 5:
            break
    assert tiny_stack.engine_load().running_requests == 1  # still generating: nobody told it yet
    stream.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and tiny_stack.engine_load().running_requests:
        time.sleep(0.1)
    load = tiny_stack.engine_load()
    assert (load.running_requests, load.waiting_requests) == (0, 0)


def test_many_concurrent_streams_each_equal_their_solo_result(
    client: openai.OpenAI, model: str, tiny_stack: Stack
) -> None:
    prompts = [f"Request number {i}: tell me about {'cats ' * (i % 5 + 1)}" for i in range(8)]
    # 64 tokens each: long enough that the streams overlap in the engine however fast it steps the tiny
    # model, short enough that the solo runs (one after another) stay quick on a busy machine.
    kwargs = {"model": model, "max_tokens": 64, "temperature": 0, "extra_body": {"ignore_eos": True}}
    solo = [client.completions.create(prompt=p, **kwargs).choices[0].text for p in prompts]  # type: ignore[call-overload]

    # When each stream got its first and its last token. A poll of the engine's GetLoad from a thread
    # here missed the batch on a busy machine (the eight streams can run in 0.3 s, and the thread waits
    # for the GIL); the streams' own clocks cannot miss it. Served one after another, no two windows
    # would overlap; batched, they share one stretch of time.
    windows: list[tuple[float, float]] = []

    async def stream_one(aclient: openai.AsyncOpenAI, prompt: str) -> str:
        chunks = await aclient.completions.create(prompt=prompt, stream=True, **kwargs)  # type: ignore[call-overload]
        texts, arrivals = [], []
        async for chunk in chunks:
            if chunk.choices and chunk.choices[0].text:
                texts.append(chunk.choices[0].text)
                arrivals.append(time.monotonic())
        windows.append((arrivals[0], arrivals[-1]))
        return "".join(texts)

    async def run_all() -> list[str]:
        aclient = openai.AsyncOpenAI(base_url=f"{tiny_stack.base_url}/v1", api_key="unused", max_retries=0)
        try:
            return list(await asyncio.gather(*(stream_one(aclient, p) for p in prompts)))
        finally:
            await aclient.close()

    streamed = asyncio.run(run_all())
    # The most streams receiving tokens at one instant (some window's start is such an instant).
    peak_running = max(sum(first <= start <= last for first, last in windows) for start, _ in windows)
    assert streamed == solo
    assert peak_running > 1, "the engine never batched the concurrent streams"


def test_repeated_prompt_reports_prefix_cache_hits(client: openai.OpenAI, model: str, tiny_stack: Stack) -> None:
    prompt = list(range(1000, 1040))  # 40 tokens: two full 16-token blocks can be reused
    body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 2, "temperature": 0}}
    first = httpx.post(f"{tiny_stack.base_url}/generate", json=body, timeout=60).json()
    second = httpx.post(f"{tiny_stack.base_url}/generate", json=body, timeout=60).json()
    assert first["meta_info"]["cached_tokens"] == 0
    assert second["meta_info"]["cached_tokens"] == 32
    assert second["output_ids"] == first["output_ids"]
    reply = client.completions.create(model=model, prompt=prompt, max_tokens=2, temperature=0)
    assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
    assert reply.usage.prompt_tokens_details.cached_tokens == 32
