"""JSON request bodies of the HTTP API: OpenAI completions and chat, SGLang `/generate`.

Validation policy, chosen deliberately:

- Values are checked in one place, the engine: it knows the vocabulary, the
  context length and `--max-logprobs`, and its INVALID_ARGUMENT messages reach
  the client verbatim as 400s (see `errors`). So these models check types,
  never ranges: `"temperature": -1` goes to the engine, which refuses it.
- Models are strict: `"temperature": "0.7"` or `"max_tokens": 1.5` is a 400,
  never a silent coercion. An integer is bounded only by the width of the
  proto field it travels in (a token id or a count is a uint32): a value the
  proto cannot hold cannot reach the engine.
- Unknown fields are accepted and ignored, with one warning per request
  naming them (`unknown_fields`), as vLLM does: clients and harnesses built
  for other servers send fields of their own, and a drop-in server must not
  refuse them. The one exception is `/generate`'s `sampling_params`, where an
  unknown name is a 400 as in SGLang (its `SamplingParams(**params)` raises):
  a sampling parameter silently ignored gives output nobody asked for.
  Fields that never change the output (`user`, `metadata`, `store`, ...)
  are declared, so they are accepted without a warning. Peers' parameters
  that do steer the output and that we do not implement (`REFUSED_EXTRAS`:
  multimodal inputs, adapters, ...) stay a 400 naming them.
- Parameters we know but cannot honour yet (`suffix`, hidden states, ...) are
  declared so that their
  harmless values (null, false, "none") pass; any other value is refused by
  `convert` with a 400 naming the parameter. `convert` also makes the checks
  about the request's own shape (`stream_options` without `stream`, ...).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# Integers as wide as their proto fields.
U32 = Annotated[int, Field(ge=0, le=2**32 - 1)]
I32 = Annotated[int, Field(ge=-(2**31), le=2**31 - 1)]
I64 = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]
# A count of logprob alternatives; -1 (vLLM) is the whole vocabulary (see `sampling.logprob_count`).
LogprobCount = Annotated[int, Field(ge=-1, le=2**32 - 1)]


class _Body(BaseModel):
    # Unknown fields are kept in `model_extra` so that `unknown_fields` can name them.
    model_config = ConfigDict(strict=True, extra="allow")


# Undeclared fields that are still a 400: peers' parameters that change the output and that this
# gateway does not implement (a declared field never lands here, so declaring one lifts its entry).
REFUSED_EXTRAS = frozenset(
    {
        # Peers' constraint and processor spellings not taken in OpenAI bodies (most are declared, which lifts them).
        *("guided_json", "guided_regex", "guided_choice", "guided_grammar", "guided_whitespace_pattern"),
        *("guided_decoding_backend", "structured_outputs", "json_schema", "regex", "ebnf", "structural_tag"),
        *("separate_reasoning", "stream_reasoning", "reasoning_effort", "thinking_budget"),
        *("custom_logit_processor", "custom_params", "logits_processors"),
        # Inputs and adapters we cannot take.
        *("image_data", "audio_data", "video_data", "input_embeds", "lora_path", "lora_request"),
        *("mm_processor_kwargs", "multi_modal_data"),
        # Sampling we do not implement for this endpoint.
        "best_of",
    }
)


_PLAIN = frozenset({int, float, str, bool, type(None)})


def unknown_fields(body: BaseModel, prefix: str = "") -> list[str]:
    """Dotted paths of the fields `body` (and the models nested in it) did not declare, in declared order."""
    found = [f"{prefix}{name}" for name in body.model_extra or {}]
    declared = type(body).model_fields
    nested: list[tuple[int, list[str]]] = []
    # Only a field the body set can hold a model with extras: a default never has any.
    for name in body.model_fields_set:
        if name not in declared:
            continue  # an extra, named above
        value = getattr(body, name)
        if isinstance(value, list):
            if _PLAIN.issuperset(map(type, value)):
                continue  # token ids, strings: passed over in C
            paths = []
            for i, item in enumerate(value):
                if isinstance(item, BaseModel):
                    paths += unknown_fields(item, f"{prefix}{name}[{i}].")
        elif isinstance(value, BaseModel):
            paths = unknown_fields(value, f"{prefix}{name}.")
        else:
            continue
        if paths:
            nested.append((list(declared).index(name), paths))
    return found + [p for _, paths in sorted(nested) for p in paths]


class SamplingFields(_Body):
    """Sampling parameters spelled the same in OpenAI bodies (vLLM, Aphrodite and
    SGLang extras, sent as top-level fields) and in `/generate`'s `sampling_params`."""

    n: U32 | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: I32 | None = None
    min_p: float | None = None
    seed: I64 | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    # Token id (as a string: JSON keys are strings) -> bias.
    logit_bias: dict[str, float] | None = None
    allowed_token_ids: list[U32] | None = None
    bad_words: list[str] | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[U32] | None = None
    stop_regex: str | list[str] | None = None
    ignore_eos: bool | None = None
    # SGLang's name; vLLM's `include_stop_str_in_output` is the same switch.
    no_stop_trim: bool | None = None
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    truncate_prompt_tokens: U32 | None = None
    add_special_tokens: bool | None = None

    # Aphrodite's samplers.
    typical_p: float | None = None
    tfs: float | None = None
    top_a: float | None = None
    eta_cutoff: float | None = None
    epsilon_cutoff: float | None = None
    smoothing_factor: float | None = None
    smoothing_curve: float | None = None
    dynatemp_min: float | None = None
    dynatemp_max: float | None = None
    dynatemp_exponent: float | None = None
    xtc_threshold: float | None = None
    xtc_probability: float | None = None
    dry_multiplier: float | None = None
    dry_base: float | None = None
    dry_allowed_length: U32 | None = None
    dry_sequence_breakers: list[str] | None = None
    no_repeat_ngram_size: U32 | None = None
    nsigma: float | None = None

    # Thinking budget (docs/reasoning.md): Turnout's name and its aliases
    # (Aphrodite-style max_thinking_tokens, vLLM thinking_token_budget).
    thinking_budget: U32 | None = None
    max_thinking_tokens: U32 | None = None
    thinking_token_budget: U32 | None = None


class StreamOptions(_Body):
    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None


class OpenAIRequest(SamplingFields):
    """Fields shared by `/v1/completions` and `/v1/chat/completions`."""

    # Empty or missing: the router's default (only) model.
    model: str | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    max_tokens: U32 | None = None
    min_tokens: U32 | None = None
    include_stop_str_in_output: bool | None = None
    priority: I32 | None = None
    request_id: str | None = None

    # vLLM: the log-probabilities of the prompt's tokens, with this many alternatives.
    prompt_logprobs: LogprobCount | None = None
    # vLLM: show tokens as "token_id:{id}" in logprobs.
    return_tokens_as_token_ids: bool | None = None
    # vLLM: the prompt's and each choice's token ids in the response.
    return_token_ids: bool | None = None

    # Accepted because they never change the output.
    user: str | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    service_tier: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None

    # Structured outputs (docs/structured-outputs.md); at most one constraint per
    # request, checked by `structured_outputs`. OpenAI:
    response_format: dict[str, Any] | None = None
    # vLLM's current form: {json, regex, choice, grammar, json_object, structural_tag, ...}.
    structured_outputs: dict[str, Any] | None = None
    # The older vLLM / Aphrodite fields.
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_whitespace_pattern: str | None = None
    guided_decoding_backend: str | None = None
    # SGLang's top-level constraint fields in OpenAI bodies.
    regex: str | None = None
    ebnf: str | None = None
    # vLLM's extra field: a structural tag as JSON text (an object is taken too).
    structural_tag: str | dict[str, Any] | None = None

    # SGLang custom logit processor: a built-in name or CustomLogitProcessor.to_str(); its parameters,
    # for every prompt, or a list with one entry (or null) per prompt (SGLang types it List[Optional[Dict]]).
    custom_logit_processor: str | None = None
    custom_params: dict[str, Any] | list[dict[str, Any] | None] | None = None

    # Beam search (vLLM; docs/sampling.md): width best_of (else n); early_stopping true, false or
    # "never" (Aphrodite's is a bool). The engine checks the combinations.
    use_beam_search: bool | None = None
    length_penalty: float | None = None
    early_stopping: bool | str | None = None
    # Known but not honoured: only their "off" values pass (see convert), anything else is a 400 naming
    # the field.
    # vLLM: a temperature for the prompt's logprobs (ours are taken at 1.0).
    prompt_logprobs_temperature: float | None = None
    # SGLang: hidden states and MoE routing per token.
    return_hidden_states: bool | None = None
    return_routed_experts: bool | None = None


class CompletionRequest(OpenAIRequest):
    """`POST /v1/completions`."""

    # One prompt (text or token ids) or a batch of them.
    prompt: str | list[str] | list[U32] | list[list[U32]]
    best_of: U32 | None = None
    # Return the sampled tokens' log-probabilities with this many alternatives.
    logprobs: LogprobCount | None = None
    # Start the text (and the logprobs) with the prompt.
    echo: bool | None = None
    suffix: str | None = None


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


class FunctionDefinition(_Body):
    name: Annotated[str, Field(min_length=1)]
    description: str | None = None
    # The arguments' JSON schema.
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDefinition(_Body):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Body):
    name: str


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: NamedFunction


class ChatMessageIn(_Body):
    # system, developer, user, assistant, tool; any other role goes to the chat template as it is
    # (vLLM's custom roles), which renders it or raises.
    role: Annotated[str, Field(min_length=1)]
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
    max_completion_tokens: U32 | None = None
    # Lax, as in vLLM: clients send "true" as a string.
    logprobs: Annotated[bool, Field(strict=False)] | None = None
    top_logprobs: LogprobCount | None = None

    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    documents: list[dict[str, Any]] | None = None

    # Tool calling (docs/structured-outputs.md#tool-calling).
    tools: list[ToolDefinition] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    modalities: list[Literal["text"]] | None = None

    # Reasoning (docs/reasoning.md): split the thinking block out as
    # `reasoning_content` (SGLang; default true) and stream it as it comes
    # (default true; false sends it in one piece when it ends).
    separate_reasoning: bool | None = None
    stream_reasoning: bool | None = None
    # OpenAI's effort levels, mapped to a thinking budget when none is given.
    reasoning_effort: str | None = None

    # vLLM: start the reply with the last message's content when it is an assistant message.
    echo: bool | None = None


class NativeSamplingParams(SamplingFields):
    """SGLang `sampling_params`: unknown names are a 400 here, as in SGLang."""

    model_config = ConfigDict(strict=True, extra="forbid")

    # An explicit null means "no limit but the context" (as in SGLang); absent means 128.
    max_new_tokens: U32 | None = None
    min_new_tokens: U32 | None = None
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    structural_tag: str | None = None
    # For every prompt, or one entry (or null) per prompt of the batch.
    custom_params: dict[str, Any] | list[dict[str, Any] | None] | None = None
    # vLLM's name for the whitespace switch of JSON constraints.
    disable_any_whitespace: bool | None = None


class NativeGenerateRequest(_Body):
    """SGLang `POST /generate`: exactly one of `text` / `input_ids`, each a prompt or a batch.

    The sampling and logprob options take one value for all prompts, or a list
    with one per prompt.
    """

    text: str | list[str] | None = None
    # The name SGLang's older documents give `text`: the same field, folded into it.
    prompt: str | list[str] | None = None
    input_ids: list[U32] | list[list[U32]] | None = None
    sampling_params: NativeSamplingParams | list[NativeSamplingParams] | None = None
    rid: str | list[str] | None = None
    stream: bool | None = False
    # Turnout extension: the served model; empty means the default one.
    model: str | None = None
    priority: I32 | None = None
    # SGLang: the LoRA adapter (a loaded adapter's name, or the path it was loaded from), one for
    # all prompts or one per prompt (None: the base model).
    lora_path: str | list[str | None] | None = None

    return_logprob: bool | list[bool] | None = None
    # First prompt position with logprobs; -1 (SGLang's default): none of the prompt.
    logprob_start_len: I32 | list[I32] | None = None
    top_logprobs_num: U32 | list[U32] | None = None
    token_ids_logprob: list[U32] | list[list[U32]] | None = None
    return_text_in_logprobs: bool | list[bool] | None = None
    # SGLang: a built-in processor name or CustomLogitProcessor.to_str(), one for all or one per prompt.
    custom_logit_processor: str | list[str | None] | None = None
    # Known but not honoured: only "off" passes (see convert).
    return_hidden_states: bool | list[bool] | None = None
    return_routed_experts: bool | None = None
    routed_experts_start_len: U32 | None = None
