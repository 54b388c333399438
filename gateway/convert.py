"""JSON request models -> `inference_pb2.GenerateRequest`: the one place the HTTP API meets the proto.

Only parameters the client set are set on the proto (every sampling field is
`optional`; unset means the model's default), except the per-endpoint
`max_new_tokens` defaults: 16 for `/v1/completions` (OpenAI), 128 for
`/generate` (SGLang), none for chat (what is left of the context). An
explicit `null` for `max_tokens` / `max_new_tokens` leaves it unset, as in
vLLM and SGLang.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.errors import invalid_request, unsupported
from gateway.protocol import (
    ChatCompletionRequest,
    ChatMessageIn,
    CompletionRequest,
    NativeGenerateRequest,
    NativeSamplingParams,
    OpenAIRequest,
)
from turnout.v1 import common_pb2, inference_pb2

COMPLETIONS_DEFAULT_MAX_TOKENS = 16
GENERATE_DEFAULT_MAX_NEW_TOKENS = 128

# SamplingParams scalar fields by proto name; None means the client did not set it.
_PlainFields = dict[str, Any]


def completion_requests(req: CompletionRequest, request_id: str) -> list[inference_pb2.GenerateRequest]:
    """One GenerateRequest per prompt of a (possibly batched) completions request."""
    _refuse_openai(req)
    if req.suffix:
        raise unsupported("suffix")
    if req.logprobs is not None:
        raise unsupported("logprobs")
    if req.best_of is not None and req.best_of != (req.n or 1):
        raise unsupported("best_of", "other than n is not supported yet")
    max_tokens = req.max_tokens if "max_tokens" in req.model_fields_set else COMPLETIONS_DEFAULT_MAX_TOKENS
    sampling = _openai_sampling(req, max_tokens)

    prompts: Sequence[str | list[int]]
    if isinstance(req.prompt, str):
        prompts = [req.prompt]
    elif not req.prompt:
        raise invalid_request("'prompt' must not be empty", "prompt")
    elif isinstance(req.prompt[0], int):
        prompts = [req.prompt]  # type: ignore[list-item]  # a list of token ids is one prompt
    else:
        prompts = req.prompt  # type: ignore[assignment]
    out = []
    for i, prompt in enumerate(prompts):
        rid = request_id if len(prompts) == 1 else f"{request_id}-{i}"
        msg = _base_request(rid, req.model, req.add_special_tokens, req.priority, sampling)
        if isinstance(prompt, str):
            msg.text = prompt
        elif not prompt:
            raise invalid_request(f"'prompt[{i}]' must not be empty", "prompt")
        else:
            msg.input_ids.ids.extend(prompt)
        out.append(msg)
    return out


def chat_request(req: ChatCompletionRequest, request_id: str) -> inference_pb2.GenerateRequest:
    _refuse_openai(req)
    if req.logprobs:
        raise unsupported("logprobs")
    if req.top_logprobs is not None:
        raise unsupported("top_logprobs")
    if req.tools:
        raise unsupported("tools")
    if req.tool_choice not in (None, "none"):
        raise unsupported("tool_choice", "other than 'none' is not supported yet")
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    msg = _base_request(request_id, req.model, req.add_special_tokens, req.priority, _openai_sampling(req, max_tokens))
    msg.chat.messages.extend(_chat_message(m, i) for i, m in enumerate(req.messages))
    options = msg.chat.options
    if req.continue_final_message:
        if req.add_generation_prompt:
            raise invalid_request(
                "'continue_final_message' and 'add_generation_prompt' cannot both be true", "continue_final_message"
            )
        options.continue_final_message = True
        options.add_generation_prompt = False
    elif req.add_generation_prompt is not None:
        options.add_generation_prompt = req.add_generation_prompt
    if req.chat_template is not None:
        options.chat_template = req.chat_template
    if req.chat_template_kwargs:
        options.chat_template_kwargs.update(req.chat_template_kwargs)
    for document in req.documents or []:
        options.documents.add().update(document)
    return msg


def native_requests(req: NativeGenerateRequest) -> tuple[list[inference_pb2.GenerateRequest], bool]:
    """The GenerateRequests of a `/generate` body, and whether it was a batch."""
    if req.return_logprob is True or (isinstance(req.return_logprob, list) and any(req.return_logprob)):
        raise unsupported("return_logprob")
    prompts: list[str] | list[list[int]]
    if (req.text is None) == (req.input_ids is None):
        raise invalid_request("exactly one of 'text' and 'input_ids' must be given", "text")
    if req.text is not None:
        is_batch = isinstance(req.text, list)
        prompts = req.text if isinstance(req.text, list) else [req.text]
    else:
        assert req.input_ids is not None
        is_batch = bool(req.input_ids) and isinstance(req.input_ids[0], list)
        prompts = req.input_ids if is_batch else [req.input_ids]  # type: ignore[assignment,list-item]
        if any(not ids for ids in prompts):
            raise invalid_request("'input_ids' must not be empty", "input_ids")
    if not prompts:
        raise invalid_request("the batch of prompts must not be empty", "text" if req.text is not None else "input_ids")

    params = _per_prompt(req.sampling_params, len(prompts), "sampling_params")
    if isinstance(req.rid, str) and is_batch:
        raise invalid_request("'rid' must be a list with one id per prompt for batch input", "rid")
    rids = _per_prompt(req.rid, len(prompts), "rid")

    out = []
    for prompt, sp, rid in zip(prompts, params, rids, strict=True):
        msg = _base_request(rid or "", req.model, None, req.priority, _native_sampling(sp))
        if isinstance(prompt, str):
            msg.text = prompt
        else:
            msg.input_ids.ids.extend(prompt)
        out.append(msg)
    return out, is_batch


def _per_prompt(value: Any, count: int, name: str) -> list[Any]:
    if not isinstance(value, list):
        return [value] * count
    if len(value) != count:
        raise invalid_request(f"'{name}' has {len(value)} entries but there are {count} prompts", name)
    return value


def _refuse_openai(req: OpenAIRequest) -> None:
    if req.echo:
        raise unsupported("echo")
    if req.response_format is not None and req.response_format.get("type") != "text":
        raise unsupported("response_format", "other than {'type': 'text'} is not supported yet")
    if req.use_beam_search:
        raise unsupported("use_beam_search")
    if req.truncate_prompt_tokens is not None:
        raise unsupported("truncate_prompt_tokens")
    if req.prompt_logprobs is not None:
        raise unsupported("prompt_logprobs")
    if req.stream_options is not None:
        if not req.stream:
            raise invalid_request("'stream_options' is only allowed when 'stream' is true", "stream_options")
        if req.stream_options.continuous_usage_stats:
            raise unsupported("stream_options.continuous_usage_stats")


def _base_request(
    request_id: str,
    model: str | None,
    add_special_tokens: bool | None,
    priority: int | None,
    sampling: common_pb2.SamplingParams,
) -> inference_pb2.GenerateRequest:
    msg = inference_pb2.GenerateRequest(request_id=request_id, model=model or "")
    msg.sampling_params.CopyFrom(sampling)
    if add_special_tokens is not None:
        msg.add_special_tokens = add_special_tokens
    if priority is not None:
        msg.priority = priority
    return msg


def _openai_sampling(req: OpenAIRequest, max_tokens: int | None) -> common_pb2.SamplingParams:
    plain: _PlainFields = {
        "max_new_tokens": max_tokens,
        "min_new_tokens": req.min_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "top_k": req.top_k,
        "min_p": req.min_p,
        "frequency_penalty": req.frequency_penalty,
        "presence_penalty": req.presence_penalty,
        "repetition_penalty": req.repetition_penalty,
        "ignore_eos": req.ignore_eos,
        "skip_special_tokens": req.skip_special_tokens,
        "spaces_between_special_tokens": req.spaces_between_special_tokens,
        "no_stop_trim": req.include_stop_str_in_output,
        "n": req.n,
        "seed": req.seed,
    }
    sp = _sampling(plain, ("max_tokens", "min_tokens"))
    _set_lists(sp, req.stop, req.stop_token_ids, req.logit_bias)
    return sp


def _native_sampling(params: NativeSamplingParams | None) -> common_pb2.SamplingParams:
    if params is None:
        return common_pb2.SamplingParams(max_new_tokens=GENERATE_DEFAULT_MAX_NEW_TOKENS)
    plain: _PlainFields = {
        name: getattr(params, name)
        for name in (
            "max_new_tokens",
            "min_new_tokens",
            "temperature",
            "top_p",
            "top_k",
            "min_p",
            "frequency_penalty",
            "presence_penalty",
            "repetition_penalty",
            "ignore_eos",
            "skip_special_tokens",
            "spaces_between_special_tokens",
            "no_stop_trim",
            "n",
            "seed",
        )
    }
    if "max_new_tokens" not in params.model_fields_set:
        plain["max_new_tokens"] = GENERATE_DEFAULT_MAX_NEW_TOKENS
    sp = _sampling(plain, ("sampling_params.max_new_tokens", "sampling_params.min_new_tokens"))
    _set_lists(sp, params.stop, params.stop_token_ids, params.logit_bias)
    if params.stop_regex is not None:
        sp.stop_regex.extend(_strings(params.stop_regex, "sampling_params.stop_regex"))
    constraints = {
        name: getattr(params, name)
        for name in ("json_schema", "regex", "ebnf", "structural_tag")
        if getattr(params, name) is not None
    }
    if len(constraints) > 1:
        names = ", ".join(sorted(constraints))
        raise invalid_request(f"at most one structured-output constraint may be given, got {names}", "sampling_params")
    for name, value in constraints.items():
        setattr(sp, name, value)
    if params.custom_params:
        sp.custom_params.update(params.custom_params)
    return sp


def _sampling(plain: _PlainFields, length_names: tuple[str, str]) -> common_pb2.SamplingParams:
    max_new, min_new = plain["max_new_tokens"], plain["min_new_tokens"]
    if max_new is not None and min_new is not None and min_new > max_new:
        raise invalid_request(
            f"'{length_names[1]}' ({min_new}) must not exceed '{length_names[0]}' ({max_new})", length_names[1]
        )
    return common_pb2.SamplingParams(**{name: value for name, value in plain.items() if value is not None})


def _set_lists(
    sp: common_pb2.SamplingParams,
    stop: str | list[str] | None,
    stop_token_ids: list[int] | None,
    logit_bias: dict[str, float] | None,
) -> None:
    if stop is not None:
        sp.stop.extend(_strings(stop, "stop"))
    if stop_token_ids:
        sp.stop_token_ids.extend(stop_token_ids)
    for key, bias in (logit_bias or {}).items():
        try:
            token_id = int(key)
        except ValueError:
            raise invalid_request(f"'logit_bias' keys must be token ids, got {key!r}", "logit_bias") from None
        if not 0 <= token_id < 2**32:
            raise invalid_request(f"'logit_bias' token id {token_id} is out of range", "logit_bias")
        sp.logit_bias[token_id] = bias


def _strings(value: str | list[str], name: str) -> list[str]:
    values = [value] if isinstance(value, str) else value
    if any(not v for v in values):
        raise invalid_request(f"'{name}' must not contain empty strings", name)
    return values


def _chat_message(message: ChatMessageIn, index: int) -> common_pb2.ChatMessage:
    out = common_pb2.ChatMessage(role=message.role)
    if isinstance(message.content, str):
        out.content = message.content
    elif message.content is not None:
        out.content_parts.extend(common_pb2.ContentPart(type=part.type, text=part.text) for part in message.content)
    elif message.role != "assistant":
        param = f"messages[{index}].content"
        raise invalid_request(f"'{param}' is required for role {message.role}", param)
    if message.name is not None:
        out.name = message.name
    for call in message.tool_calls or []:
        out.tool_calls.add(id=call.id, type=call.type, name=call.function.name, arguments=call.function.arguments)
    if message.tool_call_id is not None:
        out.tool_call_id = message.tool_call_id
    if message.reasoning_content is not None:
        out.reasoning_content = message.reasoning_content
    return out
