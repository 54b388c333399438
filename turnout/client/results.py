"""The client's typed results and its one exception, converted from the Inference protos."""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from turnout.v1 import common_pb2, inference_pb2


class TurnoutError(Exception):
    """A call failed; `code` is the gRPC status (INVALID_ARGUMENT for a bad parameter,
    NOT_FOUND for an unknown model, RESOURCE_EXHAUSTED when overloaded, UNAVAILABLE when
    no engine is healthy, CANCELLED after `cancel()`)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details

    @classmethod
    def of(cls, exc: grpc.RpcError) -> TurnoutError:
        code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
        details = exc.details() if hasattr(exc, "details") else str(exc)
        return cls(code or grpc.StatusCode.UNKNOWN, details or "")


@dataclass(frozen=True)
class Delta:
    """New output of sample `index`: final text (never retracted) and the token ids behind it."""

    index: int
    text: str
    token_ids: tuple[int, ...]
    # Cumulative counts of the sample.
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    logprobs: tuple[common_pb2.PositionLogprobs, ...] = ()


@dataclass(frozen=True)
class Completion:
    """The end of sample `index`, with all of its text and token ids (in the non-streaming
    `generate`; a stream's Completion has them empty: they came in its Deltas).

    `finish_reason` is "stop", "length" or "abort"; `stop_reason` is what matched (a token id,
    a stop string or a regex pattern; None for the model's EOS), or the abort's message.
    """

    index: int
    finish_reason: str
    stop_reason: int | str | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    text: str = ""
    token_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class ModelInfo:
    name: str
    path: str
    max_model_len: int


@dataclass(frozen=True)
class Tokenized:
    ids: tuple[int, ...]
    # The text that was encoded: the chat template's rendering for messages.
    prompt_text: str
    max_model_len: int
    # Each token decoded alone; empty unless asked for.
    token_strs: tuple[str, ...] = ()


def delta(chunk: inference_pb2.GenerateChunk) -> Delta:
    return Delta(
        index=chunk.index,
        text=chunk.text,
        token_ids=tuple(chunk.token_ids),
        prompt_tokens=chunk.prompt_tokens,
        completion_tokens=chunk.completion_tokens,
        cached_tokens=chunk.cached_tokens,
        logprobs=tuple(chunk.logprobs),
    )


def completion(done: inference_pb2.GenerateComplete, text: str = "", token_ids: tuple[int, ...] = ()) -> Completion:
    reason = done.finish_reason
    kind = reason.WhichOneof("kind") or "stop"
    stop_reason: int | str | None = None
    if kind == "stop":
        matched = reason.stop.WhichOneof("matched")
        stop_reason = getattr(reason.stop, matched) if matched and matched != "eos_token_id" else None
    elif kind == "abort":
        stop_reason = reason.abort.message
    return Completion(
        index=done.index,
        finish_reason=kind,
        stop_reason=stop_reason,
        prompt_tokens=done.usage.prompt_tokens,
        completion_tokens=done.usage.completion_tokens,
        cached_tokens=done.usage.cached_tokens,
        text=text,
        token_ids=token_ids,
    )


def unbatched(message: inference_pb2.GenerateResponse) -> tuple[inference_pb2.GenerateResponse, ...]:
    """The responses one message holds: itself, then what the router batched after it (`accept_batches`)."""
    return (message, *message.batch) if message.batch else (message,)


def event(response: inference_pb2.GenerateResponse) -> Delta | Completion:
    if response.WhichOneof("kind") == "chunk":
        return delta(response.chunk)
    return completion(response.complete)


class Collector:
    """Joins a stream's events into one Completion per sample, in index order."""

    def __init__(self) -> None:
        self._text: dict[int, list[str]] = {}
        self._ids: dict[int, list[int]] = {}
        self._done: dict[int, Completion] = {}

    def add(self, response: inference_pb2.GenerateResponse) -> None:
        if response.WhichOneof("kind") == "chunk":
            chunk = response.chunk
            self._text.setdefault(chunk.index, []).append(chunk.text)
            self._ids.setdefault(chunk.index, []).extend(chunk.token_ids)
            return
        index = response.complete.index
        text = "".join(self._text.get(index, []))
        self._done[index] = completion(response.complete, text, tuple(self._ids.get(index, [])))

    def results(self) -> list[Completion]:
        return [self._done[i] for i in sorted(self._done)]


def model_info(info: common_pb2.ModelInfo) -> ModelInfo:
    return ModelInfo(name=info.name, path=info.path, max_model_len=info.max_context_length)


def tokenized(reply: inference_pb2.TokenizeResponse) -> Tokenized:
    return Tokenized(
        ids=tuple(reply.input_ids),
        prompt_text=reply.prompt_text,
        max_model_len=reply.max_model_len,
        token_strs=tuple(reply.token_strs),
    )
