"""OpenAI response bodies and stream chunks, built from generation samples.

Streams follow OpenAI's rules: text deltas as they come (empty ones, while the
router holds text back for stop-string matching, are not sent); exactly one
chunk per choice with a non-null `finish_reason`; chat's first delta of every
choice is `{"role": "assistant", "content": ""}`; with
`stream_options.include_usage` every chunk has `"usage": null` and one last
chunk has `"choices": []` and the usage.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.generation import Generation, Sample


@dataclass(frozen=True)
class Head:
    """The fields every body and chunk of one response shares."""

    id: str
    created: int
    model: str

    def fields(self, object_: str) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": object_,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
        }


def finish(sample: Sample) -> tuple[str, int | str | None]:
    """OpenAI `finish_reason` and vLLM `stop_reason` (the matched token id, stop string or regex)."""
    reason = sample.finish_reason
    assert reason is not None, "only finished samples have a finish reason"
    if reason.WhichOneof("kind") == "length":
        return "length", None
    matched = reason.stop.WhichOneof("matched")
    return "stop", getattr(reason.stop, matched) if matched else None


def usage(samples: Sequence[Sample]) -> dict[str, Any]:
    """Token counts of a whole response: each prompt counted once, every sample's completion."""
    prompt_tokens: dict[int, int] = {}
    cached_tokens: dict[int, int] = {}
    for s in samples:
        # All samples of a prompt share it; take the largest count any of them reports.
        prompt_tokens[s.prompt] = max(prompt_tokens.get(s.prompt, 0), s.prompt_tokens)
        cached_tokens[s.prompt] = max(cached_tokens.get(s.prompt, 0), s.cached_tokens)
    prompt = sum(prompt_tokens.values())
    completion = sum(s.completion_tokens for s in samples)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": sum(cached_tokens.values())},
    }


def completion_body(head: Head, samples: Sequence[Sample]) -> dict[str, Any]:
    choices = []
    for s in samples:
        finish_reason, stop_reason = finish(s)
        choices.append(
            {
                "index": s.index,
                "text": s.text,
                "logprobs": None,
                "finish_reason": finish_reason,
                "stop_reason": stop_reason,
            }
        )
    return {**head.fields("text_completion"), "choices": choices, "usage": usage(samples)}


def chat_body(head: Head, samples: Sequence[Sample]) -> dict[str, Any]:
    choices = []
    for s in samples:
        finish_reason, stop_reason = finish(s)
        choices.append(
            {
                "index": s.index,
                "message": {"role": "assistant", "content": s.text},
                "logprobs": None,
                "finish_reason": finish_reason,
                "stop_reason": stop_reason,
            }
        )
    return {**head.fields("chat.completion"), "choices": choices, "usage": usage(samples)}


async def completion_chunks(
    head: Head, generation: Generation, include_usage: bool
) -> AsyncGenerator[dict[str, Any], None]:
    base = head.fields("text_completion")
    if include_usage:
        base["usage"] = None

    def chunk(index: int, text: str, finish_reason: str | None, stop_reason: int | str | None) -> dict[str, Any]:
        choice = {
            "index": index,
            "text": text,
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": stop_reason,
        }
        return {**base, "choices": [choice]}

    async with contextlib.aclosing(generation.events()) as events:
        async for event in events:
            if event.done:
                yield chunk(event.sample.index, "", *finish(event.sample))
            elif event.text:
                yield chunk(event.sample.index, event.text, None, None)
    if include_usage:
        yield {**base, "choices": [], "usage": usage(generation.samples)}


async def chat_chunks(head: Head, generation: Generation, include_usage: bool) -> AsyncGenerator[dict[str, Any], None]:
    base = head.fields("chat.completion.chunk")
    if include_usage:
        base["usage"] = None

    def chunk(
        index: int, delta: dict[str, str], finish_reason: str | None = None, stop_reason: int | str | None = None
    ) -> dict[str, Any]:
        choice = {
            "index": index,
            "delta": delta,
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": stop_reason,
        }
        return {**base, "choices": [choice]}

    for sample in generation.samples:
        yield chunk(sample.index, {"role": "assistant", "content": ""})
    async with contextlib.aclosing(generation.events()) as events:
        async for event in events:
            if event.done:
                yield chunk(event.sample.index, {}, *finish(event.sample))
            elif event.text:
                yield chunk(event.sample.index, {"content": event.text})
    if include_usage:
        yield {**base, "choices": [], "usage": usage(generation.samples)}
