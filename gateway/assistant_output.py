"""The assistant's side of a chat choice: content, `reasoning_content` and `tool_calls`,
whole (a response body) or as stream deltas.

The router sends the answer's text, the separated thinking text and tool-call
deltas apart (docs/reasoning.md, docs/structured-outputs.md). Bodies show
`content: null` when the answer is only tool calls, as OpenAI does (`""` when the
request named the function, as vLLM does), and `reasoning_content` null when there
was no thinking text. Stream
deltas carry each part as it comes; with `stream_reasoning: false` a choice's
thinking text is held and sent in one delta when its answer (or its end) begins.
"""

from __future__ import annotations

from typing import Any

from gateway.generation import Event, Sample
from turnout.v1 import common_pb2


def assistant_message(
    sample: Sample, echo: str = "", role: str = "assistant", named_tool: bool = False
) -> dict[str, Any]:
    """`echo`: vLLM's chat echo, the last (assistant) message's content leading the reply; `role`:
    the reply's (--response-role). `named_tool`: the request named the function, whose call vLLM
    answers with content "" (not null)."""
    text = echo + sample.text
    message: dict[str, Any] = {"role": role, "content": text, "reasoning_content": None}
    if sample.tool_calls:
        message["content"] = text or ("" if named_tool else None)
        message["tool_calls"] = [
            {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
            for call in sample.tool_calls
        ]
    if sample.reasoning_text:
        message["reasoning_content"] = sample.reasoning_text
    return message


def tool_call_delta(delta: common_pb2.ToolCallDelta) -> dict[str, Any]:
    if delta.id:
        return {
            "index": delta.index,
            "id": delta.id,
            "type": "function",
            "function": {"name": delta.name, "arguments": delta.arguments},
        }
    return {"index": delta.index, "function": {"arguments": delta.arguments}}


class DeltaBuilder:
    """Chat stream deltas of one response, holding reasoning text back when asked to."""

    def __init__(self, *, stream_reasoning: bool) -> None:
        self._stream_reasoning = stream_reasoning
        self._held: dict[int, str] = {}

    def of(self, event: Event) -> dict[str, Any]:
        """The delta of one event; empty when it carries nothing to show yet."""
        delta: dict[str, Any] = {}
        index = event.sample.index
        reasoning = event.reasoning_text
        if not self._stream_reasoning:
            self._held[index] = self._held.get(index, "") + reasoning
            answer_begins = bool(event.text or event.tool_calls or event.done)
            reasoning = self._held.pop(index, "") if answer_begins else ""
        if reasoning:
            delta["reasoning_content"] = reasoning
        if event.text:
            delta["content"] = event.text
        if event.tool_calls:
            delta["tool_calls"] = [tool_call_delta(d) for d in event.tool_calls]
        return delta
