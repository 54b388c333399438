"""OpenAI response bodies and stream chunks, built from generation samples.

Streams follow OpenAI's rules: text deltas as they come (empty ones, while the
router holds text back for stop-string matching, are not sent); exactly one
chunk per choice with a non-null `finish_reason`, the chunk of its last token
(as vLLM and SGLang: `max_tokens=50` gives 50 chunks), or a chunk of its own
only when the sample ended without a last token to carry it; chat's first delta of every
choice is `{"role": "assistant", "content": ""}`; with
`stream_options.include_usage` every chunk has `"usage": null` and one last
chunk has `"choices": []` and the usage; with `continuous_usage_stats` as well,
every chunk with a choice carries that choice's usage so far (vLLM). With logprobs, a chunk whose tokens
have no text yet (held back) is sent anyway, for their logprobs. Completions
`echo` puts the prompt before each choice's text (and, with logprobs, the
prompt's positions before its tokens); chat `echo` (vLLM) puts the last
message's content before each choice's when that message is the assistant's.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.assistant_output import DeltaBuilder, assistant_message
from gateway.chunk_json import TextChunk
from gateway.generation import Generation, Sample
from gateway.hidden_states import last_hidden_state
from gateway.logprobs_format import chat_logprobs, completion_logprobs, prompt_logprobs
from gateway.prompts import Prompt
from turnout.v1.common_pb2 import PositionLogprobs, TokenLogprob


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


@dataclass(frozen=True)
class View:
    """What a response shows besides the text, as the request asked."""

    # Alternatives per token when logprobs were asked for (chat: top_logprobs, else 0); None: no logprobs.
    logprobs: int | None = None
    # vLLM `return_tokens_as_token_ids`: tokens shown as "token_id:{id}".
    as_token_ids: bool = False
    # vLLM `prompt_logprobs`: alternatives per prompt position; None: not asked for.
    prompt_logprobs: int | None = None
    # Completions `echo`: one per prompt, in prompt order; chat `echo`: the one prompt, its text the
    # final assistant message's content. Empty without echo.
    echoes: Sequence[Prompt] = ()
    # Chat streams: reasoning deltas as they come; False sends it in one piece when it ends.
    stream_reasoning: bool = True
    # Chat: a named tool_choice, whose calls end with finish_reason "stop" (as OpenAI's do).
    named_tool: bool = False
    # stream_options.continuous_usage_stats: every chunk with a choice carries that choice's usage.
    continuous_usage: bool = False
    # Chat: the role of the reply message (--response-role).
    role: str = "assistant"
    # vLLM return_token_ids: the prompt's and the choices' token ids.
    token_ids: bool = False
    # SGLang return_hidden_states: each choice's last decode step's hidden state.
    hidden_states: bool = False

    @property
    def plain(self) -> bool:
        """Whether a running choice's stream chunks carry nothing but their text (no logprobs, token ids
        or usage)."""
        return self.logprobs is None and not self.token_ids and not self.continuous_usage

    def body_token_ids(self, sample: Sample) -> dict[str, Any]:
        """A whole choice's `token_ids` (null unless asked for, as vLLM's bodies show it)."""
        return {"token_ids": list(sample.token_ids) if self.token_ids else None}

    def chunk_usage(self, sample: Sample) -> dict[str, Any]:
        """The `usage` field of a chunk about `sample`: nothing unless continuous usage was asked for."""
        return {"usage": usage([sample])} if self.continuous_usage else {}

    def completion_logprobs(
        self, positions: Sequence[PositionLogprobs], offset: int = 0, first: TokenLogprob | None = None
    ) -> dict[str, Any] | None:
        if self.logprobs is None:
            return None
        return completion_logprobs(
            positions, top_n=self.logprobs, as_token_ids=self.as_token_ids, offset=offset, first=first
        )

    def chat_logprobs(self, positions: Sequence[PositionLogprobs]) -> dict[str, Any] | None:
        if self.logprobs is None:
            return None
        return chat_logprobs(positions, top_n=self.logprobs, as_token_ids=self.as_token_ids)

    def whole_choice(self, sample: Sample) -> tuple[str, dict[str, Any] | None]:
        """A finished completions choice's text and logprobs, the prompt's leading them with echo."""
        if not self.echoes:
            return sample.text, self.completion_logprobs(sample.logprobs)
        echo = self.echoes[sample.prompt]
        logprobs = self.completion_logprobs([*sample.input_logprobs, *sample.logprobs], first=echo.first)
        return echo.text + sample.text, logprobs


class _TextChunks:
    """One `TextChunk` per choice of a stream: `build(sample, text)` is a running choice's chunk."""

    def __init__(self, build: Callable[[Sample, str], dict[str, Any]]) -> None:
        self._build = build
        self._chunks: dict[int, TextChunk] = {}

    def encode(self, sample: Sample, text: str) -> str:
        chunk = self._chunks.get(sample.index)
        if chunk is None:
            # The closure holds `build`, not `self`: through self its TextChunk would hold itself, a cycle
            # only the garbage collector frees (one per streamed request).
            build = self._build
            chunk = self._chunks[sample.index] = TextChunk(lambda text: build(sample, text))
        return chunk.encode(text)


# The ending fields of a choice that has not finished.
RUNNING: dict[str, Any] = {"finish_reason": None, "stop_reason": None, "matched_stop": None}


def finish(sample: Sample, named_tool: bool = False) -> dict[str, Any]:
    """The ending fields of a finished choice: OpenAI `finish_reason`; vLLM `stop_reason`, the
    matched stop token id, string or regex pattern (null for the model's EOS, for length and for a
    finished grammar); SGLang `matched_stop`, the same but the EOS id too. A sample that stopped
    after calling tools says "tool_calls", unless the request named the function."""
    reason = sample.finish_reason
    assert reason is not None, "only finished samples have a finish reason"
    if reason.WhichOneof("kind") == "length":
        return {**RUNNING, "finish_reason": "length"}
    stopped = "tool_calls" if sample.tool_calls and not named_tool else "stop"
    kind = reason.stop.WhichOneof("matched")
    matched = getattr(reason.stop, kind) if kind is not None else None
    stop_reason = None if kind == "eos_token_id" else matched
    return {"finish_reason": stopped, "stop_reason": stop_reason, "matched_stop": matched}


def usage(samples: Sequence[Sample], *, chat: bool = False) -> dict[str, Any]:
    """Token counts of a whole response: each prompt counted once, every sample's completion.
    Chat also counts the completion tokens spent thinking: where OpenAI puts them
    (`completion_tokens_details.reasoning_tokens`) and where SGLang does (`reasoning_tokens`)."""
    prompt_tokens: dict[int, int] = {}
    cached_tokens: dict[int, int] = {}
    for s in samples:
        # All samples of a prompt share it; take the largest count any of them reports.
        prompt_tokens[s.prompt] = max(prompt_tokens.get(s.prompt, 0), s.prompt_tokens)
        cached_tokens[s.prompt] = max(cached_tokens.get(s.prompt, 0), s.cached_tokens)
    prompt = sum(prompt_tokens.values())
    completion = sum(s.completion_tokens for s in samples)
    counts: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": sum(cached_tokens.values())},
    }
    if chat:
        reasoning = sum(s.reasoning_tokens for s in samples)
        counts["reasoning_tokens"] = reasoning
        counts["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    return counts


def completion_body(head: Head, view: View, samples: Sequence[Sample]) -> dict[str, Any]:
    choices = []
    for s in samples:
        text, logprobs = view.whole_choice(s)
        choice = {"index": s.index, "text": text, "logprobs": logprobs, **finish(s), "prompt_logprobs": None}
        # vLLM puts the prompt's ids on each completions choice (a choice's prompt is its own).
        choice["prompt_token_ids"] = s.prompt_token_ids if view.token_ids else None
        choice.update(view.body_token_ids(s))
        if view.prompt_logprobs is not None:
            choice["prompt_logprobs"] = prompt_logprobs(s.input_logprobs, view.prompt_logprobs)
        if view.hidden_states:
            choice["hidden_states"] = last_hidden_state(s.hidden_states, s.prompt_tokens)
        choices.append(choice)
    return {**head.fields("text_completion"), "choices": choices, "usage": usage(samples)}


def chat_body(head: Head, view: View, samples: Sequence[Sample]) -> dict[str, Any]:
    choices = []
    for s in samples:
        choices.append(
            {
                "index": s.index,
                "message": assistant_message(
                    s, view.echoes[0].text if view.echoes else "", view.role, named_tool=view.named_tool
                ),
                "logprobs": view.chat_logprobs(s.logprobs),
                **finish(s, view.named_tool),
                **view.body_token_ids(s),
                **(
                    {"hidden_states": last_hidden_state(s.hidden_states, s.prompt_tokens)} if view.hidden_states else {}
                ),
            }
        )
    body = {**head.fields("chat.completion"), "choices": choices, "usage": usage(samples, chat=True)}
    # One prompt: vLLM puts its logprobs and token ids beside the choices (null when not asked for).
    body["prompt_logprobs"] = None
    body["prompt_token_ids"] = samples[0].prompt_token_ids if view.token_ids else None
    if view.prompt_logprobs is not None:
        # One prompt: vLLM puts its logprobs beside the choices.
        body["prompt_logprobs"] = prompt_logprobs(samples[0].input_logprobs, view.prompt_logprobs)
    return body


async def completion_chunks(
    head: Head, view: View, generation: Generation, include_usage: bool
) -> AsyncGenerator[dict[str, Any] | str, None]:
    """With echo the prompt leads each choice's first chunk. With echo and logprobs the prompt's
    logprobs come only with the end of the sample, so such a choice is sent whole at its end."""
    base = head.fields("text_completion")
    if include_usage:
        base["usage"] = None
    whole = bool(view.echoes) and view.logprobs is not None
    unechoed = {s.index for s in generation.samples} if view.echoes else set()
    # Characters of each choice's text sent so far: where the next chunk's text_offset starts.
    sent = {s.index: 0 for s in generation.samples}

    # With return_token_ids (vLLM): a choice's first chunk has the prompt's ids, every chunk its own ids.
    without_prompt_ids = {s.index for s in generation.samples} if view.token_ids else set()

    def chunk(
        sample: Sample,
        text: str,
        logprobs: dict[str, Any] | None,
        token_ids: Sequence[int],
        ending: dict[str, Any] = RUNNING,
    ) -> dict[str, Any]:
        choice = {"index": sample.index, "text": text, "logprobs": logprobs, **ending}
        if view.token_ids:
            if sample.index in without_prompt_ids:
                without_prompt_ids.discard(sample.index)
                choice["prompt_token_ids"] = sample.prompt_token_ids
            choice["token_ids"] = list(token_ids)
        return {**base, "choices": [choice], **view.chunk_usage(sample)}

    # Without logprobs, token ids or usage, a choice's chunks before its last differ only in their text.
    text_chunks = _TextChunks(lambda sample, text: chunk(sample, text, None, ())) if view.plain else None

    async with contextlib.aclosing(generation.events()) as events:
        async for event in events:
            s = event.sample
            if whole:
                if event.done:
                    yield chunk(s, *view.whole_choice(s), s.token_ids, finish(s))
                continue
            prefix = view.echoes[s.prompt].text if s.index in unechoed else ""
            unechoed.discard(s.index)
            positions = event.logprobs if view.logprobs is not None else ()
            shows = bool(prefix or event.text or positions or (view.token_ids and event.token_ids))
            if text_chunks is not None and shows and not event.done:
                yield text_chunks.encode(s, prefix + event.text)
                sent[s.index] += len(prefix) + len(event.text)
            elif shows or event.done:
                # The last token's chunk carries the finish reason (as in vLLM and SGLang); only a
                # sample that ended without a last chunk gets one of its own, with no logprobs.
                logprobs = view.completion_logprobs(positions, offset=sent[s.index] + len(prefix)) if shows else None
                yield chunk(s, prefix + event.text, logprobs, event.token_ids, finish(s) if event.done else RUNNING)
                sent[s.index] += len(prefix) + len(event.text)
    if include_usage:
        yield {**base, "choices": [], "usage": usage(generation.samples)}


async def chat_chunks(
    head: Head, view: View, generation: Generation, include_usage: bool
) -> AsyncGenerator[dict[str, Any] | str, None]:
    base = head.fields("chat.completion.chunk")
    if include_usage:
        base["usage"] = None

    def chunk(
        index: int,
        delta: dict[str, Any],
        logprobs: dict[str, Any] | None = None,
        ending: dict[str, Any] = RUNNING,
        token_ids: Sequence[int] | None = None,
    ) -> dict[str, Any]:
        choice = {
            "index": index,
            # SGLang's deltas always carry the reasoning_content key (null when there is none); vLLM's
            # omit it, which no client needs: every delta has it (docs/api.md).
            "delta": {"reasoning_content": None, **delta},
            "logprobs": logprobs,
            **ending,
        }
        if view.token_ids and token_ids is not None:
            choice["token_ids"] = list(token_ids)
        return {**base, "choices": [choice], **view.chunk_usage(generation.samples[index])}

    echo = view.echoes[0].text if view.echoes else ""
    for sample in generation.samples:
        role = chunk(sample.index, {"role": view.role, "content": ""})
        if view.token_ids and sample.index == 0:
            # vLLM: the response's first chunk has the prompt's ids, beside the choices.
            role["prompt_token_ids"] = sample.prompt_token_ids
        yield role
        if echo:
            yield chunk(sample.index, {"content": echo})
    deltas = DeltaBuilder(stream_reasoning=view.stream_reasoning)
    # Without logprobs, token ids or usage, a choice's content deltas before its last differ only in their text.
    contents = _TextChunks(lambda sample, text: chunk(sample.index, {"content": text})) if view.plain else None
    async with contextlib.aclosing(generation.events()) as events:
        async for event in events:
            delta = deltas.of(event)
            index = event.sample.index
            if contents is not None and not event.done and delta.keys() == {"content"}:
                yield contents.encode(event.sample, delta["content"])
                continue
            logprobs = view.chat_logprobs(event.logprobs)
            if event.done:
                # The last token's chunk carries the finish reason; only a sample that ended without a
                # last chunk gets one of its own, with no logprobs.
                if not (delta or event.token_ids):
                    logprobs = None
                empty = {"content": ""} if event.token_ids else {}
                yield chunk(index, delta or empty, logprobs, finish(event.sample, view.named_tool), event.token_ids)
            elif delta or ((logprobs is not None or view.token_ids) and event.token_ids):
                # Tokens whose text is held back (stop-string matching) still show their logprobs and ids.
                yield chunk(index, delta or {"content": ""}, logprobs, RUNNING, event.token_ids)
    if include_usage:
        yield {**base, "choices": [], "usage": usage(generation.samples, chat=True)}
