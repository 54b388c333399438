"""The JSON body of `POST /v1/responses` (OpenAI's Responses API), in `protocol`'s style.

Types are strict and unknown fields are ignored with a warning, as on every
route (docs/api.md). `input` items and `tools` are kept as plain objects here
and read one by one in `responses_input`, so that an unsupported kind is a
400 naming exactly which item (`input[2].type`, `tools[0].type`) rather than
a pydantic union error. The sampling extras of vLLM, SGLang and Aphrodite
(`top_k`, `seed`, `stop`, ...) are the same `SamplingFields` chat takes.

OpenAI fields we know but cannot honour are declared, and `REFUSED` names the
values that still pass (their "off" value); any other is a 400 naming the
field, with the reason.
"""

from __future__ import annotations

from typing import Any, Literal

from gateway.protocol import I32, U32, SamplingFields, _Body


class ResponsesStreamOptions(_Body):
    # OpenAI pads stream events with random characters against side channels; our events are not
    # padded (a client's parse is the same either way).
    include_obfuscation: bool | None = None


class ResponsesTextConfig(_Body):
    # {"type": "text"} | {"type": "json_object"} | {"type": "json_schema", "name", "schema", "strict", "description"}
    format: dict[str, Any] | None = None
    verbosity: str | None = None


class ResponsesReasoning(_Body):
    # OpenAI's effort levels, mapped onto a thinking budget (gateway/thinking.py).
    effort: str | None = None
    summary: str | None = None
    generate_summary: str | None = None


class ResponsesRequest(SamplingFields):
    """`POST /v1/responses`."""

    model: str | None = None
    # A user message, or a list of input items (messages, function calls and their outputs, reasoning).
    input: str | list[dict[str, Any]]
    # A system message put before the conversation; not carried over by previous_response_id.
    instructions: str | None = None
    max_output_tokens: U32 | None = None
    stream: bool | None = False
    stream_options: ResponsesStreamOptions | None = None
    # Function tools: {"type": "function", "name", "description", "parameters", "strict"}.
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: ResponsesTextConfig | None = None
    reasoning: ResponsesReasoning | None = None
    # Keep the response for GET /v1/responses/{id} and previous_response_id (default true, as OpenAI).
    store: bool | None = None
    previous_response_id: str | None = None
    # vLLM: the id the router, tokenizer and engine log (the response's own id is always new).
    request_id: str | None = None
    priority: I32 | None = None

    # Accepted because they never change the output (metadata is echoed on the response).
    metadata: dict[str, str] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    service_tier: str | None = None

    # Known but not honoured: see REFUSED.
    background: bool | None = None
    conversation: str | dict[str, Any] | None = None
    prompt: dict[str, Any] | None = None
    include: list[str] | None = None
    top_logprobs: U32 | None = None
    truncation: str | None = None
    max_tool_calls: U32 | None = None
    context_management: list[Any] | None = None
    background_options: dict[str, Any] | None = None
    moderation: dict[str, Any] | None = None
    image: dict[str, Any] | None = None
    access_programs: dict[str, Any] | None = None


# Field -> (the values that pass, why any other is refused). One table: `responses_input` checks it
# and docs/api.md lists it.
REFUSED: dict[str, tuple[tuple[Any, ...], str]] = {
    "background": ((None, False), "is not supported: responses are generated while the request waits"),
    "conversation": ((None,), "is not supported: there is no Conversations API; use 'previous_response_id'"),
    "prompt": ((None,), "is not supported: there are no stored prompt templates"),
    "include": ((None, []), "is not supported: there is no extra output to include"),
    "top_logprobs": ((None, 0), "is not supported on /v1/responses; use /v1/chat/completions for logprobs"),
    "truncation": ((None, "disabled"), "is not supported: an input longer than the context is a 400, never cut"),
    "max_tool_calls": ((None,), "is not supported: the number of tool calls is not bounded"),
    "context_management": ((None, []), "is not supported: the context is never compacted"),
    "background_options": ((None,), "is not supported: there are no background responses"),
    "moderation": ((None,), "is not supported: there is no moderation"),
    "image": ((None,), "is not supported: no served model generates images"),
    "access_programs": ((None,), "is not supported"),
    "n": ((None, 1), "is not supported on /v1/responses: a response has one output"),
}
