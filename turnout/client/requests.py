"""Client arguments -> Inference request protos (shared by the sync and async clients)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from turnout.v1 import common_pb2, inference_pb2

# A prompt is text or token ids; chat goes through `messages`.
Prompt = str | Sequence[int] | None
Message = Mapping[str, Any]


def chat_input(messages: Sequence[Message], chat_options: Mapping[str, Any] | None) -> common_pb2.ChatInput:
    """`messages` as {"role", "content", ...} dicts (the ChatMessage fields); `chat_options` the
    ChatTemplateOptions fields (add_generation_prompt, chat_template, chat_template_kwargs, ...)."""
    try:
        chat = common_pb2.ChatInput(messages=[common_pb2.ChatMessage(**m) for m in messages])
        if chat_options:
            chat.options.CopyFrom(common_pb2.ChatTemplateOptions(**chat_options))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"invalid chat message or option: {exc}") from None
    return chat


def generate_request(
    prompt: Prompt,
    *,
    messages: Sequence[Message] | None,
    model: str,
    request_id: str,
    chat_options: Mapping[str, Any] | None,
    logprobs: Mapping[str, Any] | None,
    sampling: Mapping[str, Any],
) -> inference_pb2.GenerateRequest:
    """Exactly one of `prompt` and `messages`; `sampling` holds SamplingParams fields by name
    (max_new_tokens, temperature, n, stop, ...), `logprobs` LogprobOptions fields."""
    if (prompt is None) == (messages is None):
        raise ValueError("give exactly one of a prompt (text or token ids) and messages")
    request = inference_pb2.GenerateRequest(request_id=request_id, model=model)
    if isinstance(prompt, str):
        request.text = prompt
    elif prompt is not None:
        request.input_ids.ids.extend(prompt)
    else:
        assert messages is not None
        request.chat.CopyFrom(chat_input(messages, chat_options))
    try:
        request.sampling_params.CopyFrom(common_pb2.SamplingParams(**sampling))
        if logprobs:
            request.logprob_options.CopyFrom(common_pb2.LogprobOptions(**logprobs))
    except (TypeError, ValueError) as exc:
        # An unknown name or a wrong type: refused here, before any call.
        raise ValueError(f"invalid sampling or logprob parameter: {exc}") from None
    return request


def tokenize_request(
    prompt: str | None,
    messages: Sequence[Message] | None,
    model: str,
    add_special_tokens: bool | None,
    chat_options: Mapping[str, Any] | None,
    return_token_strs: bool,
) -> inference_pb2.TokenizeRequest:
    if (prompt is None) == (messages is None):
        raise ValueError("give exactly one of a text and messages")
    request = inference_pb2.TokenizeRequest(model=model, return_token_strs=return_token_strs)
    if prompt is not None:
        request.text = prompt
    else:
        assert messages is not None
        request.chat.CopyFrom(chat_input(messages, chat_options))
    if add_special_tokens is not None:
        request.add_special_tokens = add_special_tokens
    return request
