"""JSON request models -> `inference_pb2.GenerateRequest`: where the HTTP API meets the proto
(the sampling and logprob fields through `sampling`).

Only parameters the client set are set on the proto (every sampling field is
`optional`; unset means the model's default), except the per-endpoint
`max_new_tokens` defaults: 16 for `/v1/completions` (OpenAI), 128 for
`/generate` (SGLang), none for chat (what is left of the context). An
explicit `null` for `max_tokens` / `max_new_tokens` leaves it unset, as in
vLLM and SGLang.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from gateway.errors import invalid_request, unsupported
from gateway.protocol import (
    ChatCompletionRequest,
    ChatMessageIn,
    CompletionRequest,
    NativeGenerateRequest,
    NativeSamplingParams,
    OpenAIRequest,
)
from gateway.sampling import logprob_count, native_logprobs, openai_logprobs, sampling_params
from gateway.structured_outputs import native_structured_output, openai_structured_output
from gateway.thinking import apply_thinking, thinking_budget
from gateway.tool_calling import apply_tools
from turnout.v1 import common_pb2, inference_pb2

COMPLETIONS_DEFAULT_MAX_TOKENS = 16
GENERATE_DEFAULT_MAX_NEW_TOKENS = 128


def completion_requests(req: CompletionRequest, request_id: str) -> list[inference_pb2.GenerateRequest]:
    """One GenerateRequest per prompt of a (possibly batched) completions request."""
    _refuse_openai(req)
    if req.suffix:
        raise unsupported("suffix")
    # Beam search streams: its choices arrive whole when the search ends (as vLLM's).
    if req.stream and req.best_of is not None and req.best_of > (req.n or 1) and not req.use_beam_search:
        raise invalid_request("'best_of' greater than 'n' cannot be streamed", "best_of")
    max_tokens = req.max_tokens if "max_tokens" in req.model_fields_set else COMPLETIONS_DEFAULT_MAX_TOKENS
    logprobs = openai_logprobs(
        sampled=req.logprobs is not None,
        top_n=logprob_count(req.logprobs),
        prompt_top_n=logprob_count(req.prompt_logprobs),
        echo=bool(req.echo),
        as_token_ids=bool(req.return_tokens_as_token_ids),
    )

    prompts: Sequence[str | list[int]]
    if isinstance(req.prompt, str):
        prompts = [req.prompt]
    elif not req.prompt:
        raise invalid_request("'prompt' must not be empty", "prompt")
    elif isinstance(req.prompt[0], int):
        prompts = [req.prompt]  # type: ignore[list-item]  # a list of token ids is one prompt
    else:
        prompts = req.prompt  # type: ignore[assignment]
    custom_params = _per_prompt(req.custom_params, len(prompts), "custom_params")
    out = []
    for i, prompt in enumerate(prompts):
        rid = request_id if len(prompts) == 1 else f"{request_id}-{i}"
        sampling = _openai_sampling(req, max_tokens, thinking_budget(req, custom_params[i]), custom_params[i])
        if req.best_of is not None:
            sampling.best_of = req.best_of
        msg = _base_request(rid, req.model, req.add_special_tokens, req.priority, sampling, logprobs)
        if isinstance(prompt, str):
            msg.text = prompt
        elif not prompt:
            raise invalid_request(f"'prompt[{i}]' must not be empty", "prompt")
        else:
            msg.input_ids.ids.extend(prompt)
        msg.return_prompt_token_ids = bool(req.return_token_ids)
        msg.return_hidden_states = bool(req.return_hidden_states)
        out.append(msg)
    return out


def chat_request(req: ChatCompletionRequest, request_id: str) -> inference_pb2.GenerateRequest:
    _refuse_openai(req)
    if req.top_logprobs is not None and not req.logprobs:
        raise invalid_request("'top_logprobs' requires 'logprobs' to be true", "top_logprobs")
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    logprobs = openai_logprobs(
        sampled=bool(req.logprobs),
        top_n=logprob_count(req.top_logprobs),
        prompt_top_n=logprob_count(req.prompt_logprobs),
        echo=False,
        as_token_ids=bool(req.return_tokens_as_token_ids),
    )
    [custom_params] = _per_prompt(req.custom_params, 1, "custom_params")
    budget = thinking_budget(req, custom_params, req.reasoning_effort)
    sampling = _openai_sampling(req, max_tokens, budget, custom_params)
    msg = _base_request(request_id, req.model, req.add_special_tokens, req.priority, sampling, logprobs)
    msg.separate_reasoning = req.separate_reasoning is not False
    msg.return_prompt_token_ids = bool(req.return_token_ids)
    msg.return_hidden_states = bool(req.return_hidden_states)
    fill_chat_input(msg.chat, req.messages, req)
    for document in req.documents or []:
        msg.chat.options.documents.add().update(document)
    apply_tools(req, msg)
    return msg


def native_requests(req: NativeGenerateRequest) -> tuple[list[inference_pb2.GenerateRequest], bool]:
    """The GenerateRequests of a `/generate` body, and whether it was a batch."""
    prompts: list[str] | list[list[int]]
    if req.prompt is not None:  # the older name of `text`: folded into it, so later reads see `text`
        if req.text is not None:
            raise invalid_request("give 'text' or 'prompt' (its older name), not both", "prompt")
        req.text, req.prompt = req.prompt, None
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
    if req.return_routed_experts:
        raise unsupported("return_routed_experts", _NO_EXPERTS)
    if req.routed_experts_start_len:
        raise unsupported("routed_experts_start_len", _NO_EXPERTS)

    count = len(prompts)
    params = _per_prompt(req.sampling_params, count, "sampling_params")
    if isinstance(req.rid, str) and is_batch:
        raise invalid_request("'rid' must be a list with one id per prompt for batch input", "rid")
    rids = _per_prompt(req.rid, count, "rid")
    token_ids = req.token_ids_logprob
    # A flat list of ids (or none) is for every prompt; a list of lists has one per prompt.
    flat = token_ids is None or not token_ids or isinstance(token_ids[0], int)
    logprobs = zip(
        _per_prompt(req.return_logprob, count, "return_logprob"),
        _per_prompt(req.logprob_start_len, count, "logprob_start_len"),
        _per_prompt(req.top_logprobs_num, count, "top_logprobs_num"),
        [token_ids] * count if flat else _per_prompt(token_ids, count, "token_ids_logprob"),
        _per_prompt(req.return_text_in_logprobs, count, "return_text_in_logprobs"),
        strict=True,
    )

    hidden = _per_prompt(req.return_hidden_states, count, "return_hidden_states")
    processors = _per_prompt(req.custom_logit_processor, count, "custom_logit_processor")
    adapters = _per_prompt(req.lora_path, count, "lora_path")
    out = []
    for i, (prompt, sp, rid, options, processor, adapter) in enumerate(
        zip(prompts, params, rids, logprobs, processors, adapters, strict=True)
    ):
        add_special_tokens = sp.add_special_tokens if sp is not None else None
        custom_params = None if sp is None else _per_prompt(sp.custom_params, count, "sampling_params.custom_params")[i]
        sampling = _native_sampling(sp, processor, custom_params)
        msg = _base_request(rid or "", req.model, add_special_tokens, req.priority, sampling, native_logprobs(*options))
        msg.lora_name = adapter or ""
        msg.return_hidden_states = bool(hidden[i])
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


# Why each peer field we know but do not honour is refused (any value but its "off" one).
_NO_EXPERTS = "is not supported: no served model is a mixture of experts"


def _refuse_openai(req: OpenAIRequest) -> None:
    # The engine takes 0 as prefill only (SGLang /generate); vLLM's /v1 routes refuse it.
    for name in ("max_tokens", "max_completion_tokens"):
        if getattr(req, name, None) == 0:
            raise invalid_request(f"{name} must be at least 1, got 0", name)
    if req.prompt_logprobs_temperature not in (None, 1.0):
        raise unsupported(
            "prompt_logprobs_temperature", "is not supported: prompt logprobs are taken at temperature 1.0"
        )
    if req.return_hidden_states and req.stream:
        raise unsupported("return_hidden_states", "is not supported with 'stream' on this route (use /generate)")
    if req.return_routed_experts:
        raise unsupported("return_routed_experts", _NO_EXPERTS)
    if req.stream_options is not None and not req.stream:
        raise invalid_request("'stream_options' is only allowed when 'stream' is true", "stream_options")
    # The prompt's logprobs come with the end of a sample; vLLM has no streamed form for them either.
    if req.stream and req.prompt_logprobs is not None:
        raise invalid_request("'prompt_logprobs' is not available when 'stream' is true", "prompt_logprobs")
    if (
        req.include_stop_str_in_output is not None
        and req.no_stop_trim is not None
        and req.include_stop_str_in_output != req.no_stop_trim
    ):
        raise invalid_request(
            "'include_stop_str_in_output' and 'no_stop_trim' are the same switch and disagree",
            "include_stop_str_in_output",
        )


def _base_request(
    request_id: str,
    model: str | None,
    add_special_tokens: bool | None,
    priority: int | None,
    sampling: common_pb2.SamplingParams,
    logprobs: common_pb2.LogprobOptions,
) -> inference_pb2.GenerateRequest:
    msg = inference_pb2.GenerateRequest(request_id=request_id, model=model or "")
    msg.sampling_params.CopyFrom(sampling)
    if logprobs.ListFields():
        msg.logprob_options.CopyFrom(logprobs)
    if add_special_tokens is not None:
        msg.add_special_tokens = add_special_tokens
    if priority is not None:
        msg.priority = priority
    return msg


def _openai_sampling(
    req: OpenAIRequest, max_tokens: int | None, budget: int | None, custom_params: dict[str, Any] | None
) -> common_pb2.SamplingParams:
    no_stop_trim = req.include_stop_str_in_output if req.include_stop_str_in_output is not None else req.no_stop_trim
    sp = sampling_params(
        req,
        max_new_tokens=max_tokens,
        min_new_tokens=req.min_tokens,
        no_stop_trim=no_stop_trim,
        use_beam_search=req.use_beam_search,
        length_penalty=req.length_penalty,
        # The proto spells it as text: "true", "false" or "never" (the engine refuses anything else).
        early_stopping=str(req.early_stopping).lower() if isinstance(req.early_stopping, bool) else req.early_stopping,
    )
    openai_structured_output(req).apply(sp)
    apply_thinking(sp, budget, req.custom_logit_processor, custom_params)
    return sp


def _native_sampling(
    params: NativeSamplingParams | None, processor: str | None, custom_params: dict[str, Any] | None
) -> common_pb2.SamplingParams:
    if params is None:
        sp = common_pb2.SamplingParams(max_new_tokens=GENERATE_DEFAULT_MAX_NEW_TOKENS)
        apply_thinking(sp, None, processor, None)
        return sp
    max_new_tokens = (
        params.max_new_tokens if "max_new_tokens" in params.model_fields_set else GENERATE_DEFAULT_MAX_NEW_TOKENS
    )
    sp = sampling_params(
        params, "sampling_params.", max_new_tokens=max_new_tokens, min_new_tokens=params.min_new_tokens
    )
    native_structured_output(params).apply(sp)
    budget = thinking_budget(params, custom_params, prefix="sampling_params.")
    apply_thinking(sp, budget, processor, custom_params)
    return sp


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


class ChatTemplateFields(Protocol):
    """The chat template options `/v1/chat/completions` and `/tokenize` share."""

    add_generation_prompt: bool | None
    continue_final_message: bool | None
    chat_template: str | None
    chat_template_kwargs: dict[str, Any] | None


def fill_chat_input(chat: common_pb2.ChatInput, messages: Sequence[ChatMessageIn], body: ChatTemplateFields) -> None:
    """Messages and template options onto `chat`; 400 for a message without content, or for
    continue_final_message together with add_generation_prompt. Unset options keep the tokenizer's
    defaults (add_generation_prompt true)."""
    chat.messages.extend(_chat_message(m, i) for i, m in enumerate(messages))
    options = chat.options
    if body.continue_final_message:
        if body.add_generation_prompt:
            raise invalid_request(
                "'continue_final_message' and 'add_generation_prompt' cannot both be true", "continue_final_message"
            )
        options.continue_final_message = True
        options.add_generation_prompt = False
    elif body.add_generation_prompt is not None:
        options.add_generation_prompt = body.add_generation_prompt
    if body.chat_template is not None:
        options.chat_template = body.chat_template
    if body.chat_template_kwargs:
        options.chat_template_kwargs.update(body.chat_template_kwargs)


def chat_echo(req: ChatCompletionRequest) -> str:
    """What chat `echo` puts before the reply (vLLM): the final message's content when the assistant
    wrote it (a reply being continued), else nothing."""
    last = req.messages[-1]
    if not req.echo or last.role != "assistant" or last.content is None:
        return ""
    if isinstance(last.content, str):
        return last.content
    return "".join(part.text for part in last.content)
