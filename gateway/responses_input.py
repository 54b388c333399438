"""A Responses API request -> the chat completions request it means, so that one conversion
(`convert.chat_request`: template, tools, structured outputs, thinking budget, sampling) serves both.

- `input` (a string: one user message; or items) becomes chat messages: a
  `message` item keeps its role (user, system, developer, assistant) and its
  text parts (`input_text` / `output_text`) joined in order; `function_call`
  items join the assistant message before them as `tool_calls` (or start one);
  `function_call_output` items become `tool` messages; a `reasoning` item's
  text becomes the next assistant message's `reasoning_content`.
- `instructions` is a system message before everything, the conversation of
  `previous_response_id` (its input and output, without its instructions)
  comes next, then `input`.
- Function `tools`, `tool_choice` and `text.format` become their chat spellings;
  `reasoning.effort` becomes `reasoning_effort`; `max_output_tokens` becomes
  `max_completion_tokens`.

Whatever cannot be honoured (images, built-in tools, encrypted reasoning, the
fields of `responses_protocol.REFUSED`) is a 400 naming where it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.errors import invalid_request, unsupported
from gateway.protocol import (
    ChatCompletionRequest,
    ChatMessageIn,
    FunctionCall,
    FunctionDefinition,
    NamedFunction,
    NamedToolChoice,
    SamplingFields,
    ToolCallIn,
    ToolDefinition,
)
from gateway.responses_protocol import REFUSED, ResponsesRequest
from gateway.thinking import EFFORT_BUDGETS

_ROLES = ("user", "system", "developer", "assistant")
# The text parts of a message, and of a reasoning item.
_TEXT_PARTS = ("input_text", "output_text")
_REASONING_PARTS = ("reasoning_text",)
_NO_MEDIA = "is not supported: the served models take text only"


def chat_completion(body: ResponsesRequest, history: Sequence[ChatMessageIn]) -> ChatCompletionRequest:
    """The chat request `body` means, after the conversation `history` (previous_response_id's)."""
    _refuse(body)
    messages = [ChatMessageIn(role="system", content=body.instructions)] if body.instructions is not None else []
    messages += [*history, *input_messages(body)]
    if not messages:
        raise invalid_request("'input' must not be empty", "input")
    sampling = {name: getattr(body, name) for name in SamplingFields.model_fields if name in body.model_fields_set}
    fields: dict[str, Any] = {
        **sampling,
        "model": body.model,
        "messages": messages,
        "stream": bool(body.stream),
        "max_completion_tokens": body.max_output_tokens,
        "parallel_tool_calls": body.parallel_tool_calls,
        "request_id": body.request_id,
        "priority": body.priority,
    }
    if body.tools is not None:
        fields["tools"] = [_tool(tool, i) for i, tool in enumerate(body.tools)]
    if body.tool_choice is not None:
        fields["tool_choice"] = _tool_choice(body.tool_choice)
    if body.text is not None:
        if body.text.verbosity not in (None, "medium"):
            raise unsupported("text.verbosity", "is not supported: the model's length is steered by the prompt only")
        if body.text.format is not None:
            fields["response_format"] = _response_format(body.text.format)
    if body.reasoning is not None:
        if body.reasoning.summary is not None or body.reasoning.generate_summary is not None:
            name = "reasoning.summary" if body.reasoning.summary is not None else "reasoning.generate_summary"
            raise unsupported(name, "is not supported: reasoning is returned as its text, never summarised")
        effort = body.reasoning.effort
        if effort is not None and effort not in EFFORT_BUDGETS:
            levels = ", ".join(f"'{level}'" for level in EFFORT_BUDGETS)
            raise invalid_request(f"'reasoning.effort' must be one of {levels}, got {effort!r}", "reasoning.effort")
        fields["reasoning_effort"] = effort
    return ChatCompletionRequest(**fields)


def input_messages(body: ResponsesRequest) -> list[ChatMessageIn]:
    """`input` as chat messages (without instructions or history): what a stored response keeps."""
    if isinstance(body.input, str):
        return [ChatMessageIn(role="user", content=body.input)]
    messages: list[ChatMessageIn] = []
    reasoning: str | None = None
    for i, item in enumerate(body.input):
        kind = item.get("type", "message")
        where = f"input[{i}]"
        if kind == "message":
            role = item.get("role")
            if role not in _ROLES:
                allowed = ", ".join(f"'{r}'" for r in _ROLES)
                raise invalid_request(f"'{where}.role' must be one of {allowed}, got {role!r}", f"{where}.role")
            message = ChatMessageIn(role=role, content=_text(item.get("content"), f"{where}.content"))
            if role == "assistant" and reasoning is not None:
                message.reasoning_content, reasoning = reasoning, None
            messages.append(message)
        elif kind == "function_call":
            call = ToolCallIn(
                id=_string(item, "call_id", where),
                function=FunctionCall(name=_string(item, "name", where), arguments=_string(item, "arguments", where)),
            )
            last = messages[-1] if messages else None
            if last is not None and last.role == "assistant" and reasoning is None:
                last.tool_calls = [*(last.tool_calls or []), call]
            else:
                messages.append(ChatMessageIn(role="assistant", tool_calls=[call], reasoning_content=reasoning))
                reasoning = None
        elif kind == "function_call_output":
            output = item.get("output")
            content = output if isinstance(output, str) else _text(output, f"{where}.output")
            messages.append(ChatMessageIn(role="tool", tool_call_id=_string(item, "call_id", where), content=content))
        elif kind == "reasoning":
            if item.get("encrypted_content") is not None:
                raise unsupported(f"{where}.encrypted_content", "is not supported: reasoning is never encrypted here")
            parts = item.get("content") or []
            reasoning = (reasoning or "") + _text(parts, f"{where}.content", _REASONING_PARTS)
        else:
            raise unsupported(
                f"{where}.type",
                f"'{kind}' is not supported: input items are messages, function_call, function_call_output "
                "and reasoning",
            )
    return messages


def _refuse(body: ResponsesRequest) -> None:
    for name, (passing, why) in REFUSED.items():
        if getattr(body, name) not in passing:
            raise unsupported(name, why)


def _text(content: Any, where: str, kinds: tuple[str, ...] = _TEXT_PARTS) -> str:
    """A message's content: a string, or its text parts (of `kinds`) joined in order."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid_request(f"'{where}' must be a string or a list of content parts", where)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in kinds:
            text = part.get("text")
            if not isinstance(text, str):
                raise invalid_request(f"'{where}[{j}].text' must be a string", f"{where}[{j}].text")
            texts.append(text)
        elif kind in ("input_image", "input_file", "input_audio"):
            raise unsupported(f"{where}[{j}]", f"of type '{kind}' {_NO_MEDIA}")
        else:
            expected = " or ".join(kinds)
            raise unsupported(f"{where}[{j}].type", f"{kind!r} is not supported: the parts here are {expected}")
    return "".join(texts)


def _string(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise invalid_request(f"'{where}.{key}' must be a string", f"{where}.{key}")
    return value


def _tool(tool: dict[str, Any], i: int) -> ToolDefinition:
    kind = tool.get("type")
    if kind != "function":
        raise unsupported(
            f"tools[{i}].type", f"'{kind}' is not supported: Turnout runs no built-in tools; declare function tools"
        )
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise invalid_request(f"'tools[{i}].name' must be a non-empty string", f"tools[{i}].name")
    definition = {k: tool[k] for k in ("description", "parameters", "strict") if tool.get(k) is not None}
    try:
        function = FunctionDefinition(name=name, **definition)
    except ValueError:
        raise invalid_request(
            f"'tools[{i}]' must have a string 'description', an object 'parameters' and a boolean 'strict'",
            f"tools[{i}]",
        ) from None
    return ToolDefinition(type="function", function=function)


def _tool_choice(choice: str | dict[str, Any]) -> str | NamedToolChoice:
    if isinstance(choice, str):
        return choice
    kind = choice.get("type")
    if kind == "function" and isinstance(choice.get("name"), str):
        return NamedToolChoice(type="function", function=NamedFunction(name=choice["name"]))
    raise unsupported(
        "tool_choice", f"of type {kind!r} is not supported: 'none', 'auto', 'required' or a named function"
    )


def _response_format(fmt: dict[str, Any]) -> dict[str, Any]:
    """`text.format` in chat's `response_format` spelling (its checks are structured_outputs')."""
    if fmt.get("type") != "json_schema":
        return fmt
    if "schema" not in fmt:
        raise invalid_request("'text.format' of type 'json_schema' needs 'schema'", "text.format.schema")
    spec = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
    return {"type": "json_schema", "json_schema": spec}


def output_messages(text: str, reasoning: str, calls: Sequence[tuple[str, str, str]]) -> list[ChatMessageIn]:
    """A response's output as the assistant message a later turn continues from; `calls` are
    (call_id, name, arguments)."""
    message = ChatMessageIn(role="assistant", content=text if text or not calls else None)
    if reasoning:
        message.reasoning_content = reasoning
    if calls:
        message.tool_calls = [
            ToolCallIn(id=call_id, function=FunctionCall(name=name, arguments=arguments))
            for call_id, name, arguments in calls
        ]
    return [message]
