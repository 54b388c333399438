"""JSON request bodies of the HTTP API: OpenAI completions and chat, SGLang `/generate`.

Validation policy, chosen deliberately:

- Models are strict: `"temperature": "0.7"` or `"max_tokens": 1.5` is a 400,
  never a silent coercion.
- Unknown fields are a 400 (`extra="forbid"`). vLLM ignores them with a
  warning; we refuse because a sampling parameter silently ignored (a typo, or
  one we do not implement) gives the client output it did not ask for. Fields
  that never change the output (`user`, `metadata`, `store`, ...) are declared
  and accepted.
- Parameters we know but cannot honour yet (`logprobs`, `tools`, ...) are
  declared so that their harmless values (null, false, "none") pass; any other
  value is refused by `convert` with a 400 naming the parameter.

Range checks live on the fields so that the error names the field.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

TokenId = Annotated[int, Field(ge=0, le=2**32 - 1)]
Seed = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]
Count = Annotated[int, Field(ge=1, le=2**32 - 1)]
NonNegativeCount = Annotated[int, Field(ge=0, le=2**32 - 1)]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class StreamOptions(_Body):
    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None


class OpenAIRequest(_Body):
    """Fields shared by `/v1/completions` and `/v1/chat/completions`."""

    # Empty or missing: the router's default (only) model.
    model: str | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    n: Count | None = None
    max_tokens: Count | None = None
    temperature: Annotated[float, Field(ge=0.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    seed: Seed | None = None
    stop: str | list[str] | None = None
    # Token id (as a string, JSON keys are strings) -> bias in [-100, 100].
    logit_bias: dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]] | None = None

    # vLLM / SGLang extra sampling parameters.
    top_k: Annotated[int, Field(ge=-1)] | None = None
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0.0)] | None = None
    min_tokens: NonNegativeCount | None = None
    stop_token_ids: list[TokenId] | None = None
    include_stop_str_in_output: bool | None = None
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    add_special_tokens: bool | None = None
    priority: Annotated[int, Field(ge=-(2**31), le=2**31 - 1)] | None = None
    request_id: str | None = None

    # Accepted because they never change the output.
    user: str | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    service_tier: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None

    # Known but not honoured yet: only their "off" values pass (see convert).
    echo: bool | None = None
    response_format: dict[str, Any] | None = None
    use_beam_search: bool | None = None
    truncate_prompt_tokens: int | None = None
    prompt_logprobs: int | None = None


class CompletionRequest(OpenAIRequest):
    """`POST /v1/completions`."""

    # One prompt (text or token ids) or a batch of them.
    prompt: str | list[str] | list[TokenId] | list[list[TokenId]]
    suffix: str | None = None
    best_of: Count | None = None
    logprobs: NonNegativeCount | None = None


class ContentPart(_Body):
    type: Literal["text"]
    text: str


class FunctionCall(_Body):
    name: str
    arguments: str


class ToolCallIn(_Body):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessageIn(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    # Clients echo earlier assistant messages back; these output-only fields pass when empty.
    refusal: None = None
    function_call: None = None
    audio: None = None
    annotations: list[Any] | None = None


class ChatCompletionRequest(OpenAIRequest):
    """`POST /v1/chat/completions`."""

    messages: Annotated[list[ChatMessageIn], Field(min_length=1)]
    # The newer name of max_tokens; wins when both are set.
    max_completion_tokens: Count | None = None

    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    documents: list[dict[str, Any]] | None = None

    parallel_tool_calls: bool | None = None
    modalities: list[Literal["text"]] | None = None

    # Known but not honoured yet.
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None


class NativeSamplingParams(_Body):
    """SGLang `sampling_params`."""

    # An explicit null means "no limit but the context" (as in SGLang); absent means 128.
    max_new_tokens: Count | None = None
    min_new_tokens: NonNegativeCount | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[TokenId] | None = None
    stop_regex: str | list[str] | None = None
    temperature: Annotated[float, Field(ge=0.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(ge=-1)] | None = None
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    repetition_penalty: Annotated[float, Field(gt=0.0)] | None = None
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    no_stop_trim: bool | None = None
    n: Count | None = None
    seed: Seed | None = None
    logit_bias: dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]] | None = None
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    structural_tag: str | None = None
    custom_params: dict[str, Any] | None = None


class NativeGenerateRequest(_Body):
    """SGLang `POST /generate`: exactly one of `text` / `input_ids`, each a prompt or a batch."""

    text: str | list[str] | None = None
    input_ids: list[TokenId] | list[list[TokenId]] | None = None
    # One dict for all prompts, or one per prompt.
    sampling_params: NativeSamplingParams | list[NativeSamplingParams] | None = None
    rid: str | list[str] | None = None
    stream: bool | None = False
    # Turnout extension: the served model; empty means the default one.
    model: str | None = None
    priority: Annotated[int, Field(ge=-(2**31), le=2**31 - 1)] | None = None

    # Logprobs are not returned yet: `return_logprob` must stay off, and the
    # options below only matter when it is on.
    return_logprob: bool | list[bool] | None = None
    logprob_start_len: int | list[int] | None = None
    top_logprobs_num: int | list[int] | None = None
    token_ids_logprob: list[int] | list[list[int]] | None = None
    return_text_in_logprobs: bool | None = None
