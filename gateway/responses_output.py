"""A Responses API `Response` and its typed stream events, built from the events of one sample.

One builder makes both forms: a streamed response is the events it emits, a
whole one is what it holds after the same events (so the two always agree).
Output items are opened as their first text arrives and closed when the next
one opens or the sample ends, in the order of the sample's output:

- thinking text (with a reasoning parser): a `reasoning` item whose content is
  one `reasoning_text` part (`response.reasoning_text.delta` events);
- answer text: a `message` item with one `output_text` part
  (`response.output_text.delta`);
- each tool call: a `function_call` item (`response.function_call_arguments.delta`).

Each item goes `response.output_item.added` -> (`response.content_part.added`)
-> deltas -> `….done` -> (`response.content_part.done`) -> `response.output_item.done`;
the stream opens with `response.created` and `response.in_progress` and ends
with `response.completed`, or `response.incomplete` when the output stopped at
`max_output_tokens` (status "incomplete", `incomplete_details.reason`
"max_output_tokens"). Every event carries the next `sequence_number`.
"""

from __future__ import annotations

import copy
import uuid
from dataclasses import dataclass, field
from typing import Any

from gateway.errors import HTTPError
from gateway.generation import Event, Sample
from gateway.growing_text import GrowingText
from turnout.v1 import common_pb2


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


@dataclass
class _Item:
    kind: str  # "reasoning", "message" or "function_call"
    id: str
    output_index: int
    call_id: str = ""
    name: str = ""
    status: str = "in_progress"
    # The reasoning text, the message text, or the call's arguments.
    text_so_far: GrowingText = field(default_factory=GrowingText)

    @property
    def text(self) -> str:
        return self.text_so_far.value()

    def part(self) -> dict[str, Any]:
        """The item's one content part (reasoning and message items)."""
        if self.kind == "reasoning":
            return {"type": "reasoning_text", "text": self.text}
        return {"type": "output_text", "text": self.text, "annotations": [], "logprobs": []}

    def json(self) -> dict[str, Any]:
        """The item as `output` lists it; an open item has no content part yet (OpenAI's added form)."""
        done = self.status != "in_progress"
        if self.kind == "function_call":
            return {
                "id": self.id,
                "type": "function_call",
                "call_id": self.call_id,
                "name": self.name,
                "arguments": self.text if done else "",
                "status": self.status,
            }
        content = [self.part()] if done else []
        if self.kind == "reasoning":
            return {
                "id": self.id,
                "type": "reasoning",
                "summary": [],
                "content": content,
                "encrypted_content": None,
                "status": self.status,
            }
        return {"id": self.id, "type": "message", "role": "assistant", "status": self.status, "content": content}


class ResponseBuilder:
    """`base`: the Response fields the request decides (id, model, instructions, tools, ...)."""

    def __init__(self, base: dict[str, Any]) -> None:
        self._base = base
        self._items: list[_Item] = []
        self._open: _Item | None = None
        # Tool call index (the router's) -> its item.
        self._calls: dict[int, _Item] = {}
        self._sequence = 0
        self._sample: Sample | None = None

    @property
    def id(self) -> str:
        response_id: str = self._base["id"]
        return response_id

    def start(self) -> list[dict[str, Any]]:
        shown = self.response("in_progress")
        return [
            self._event("response.created", response=shown),
            self._event("response.in_progress", response=copy.deepcopy(shown)),
        ]

    def feed(self, event: Event) -> list[dict[str, Any]]:
        """The stream events of one sample event."""
        self._sample = event.sample
        out: list[dict[str, Any]] = []
        if event.reasoning_text:
            out += self._append("reasoning", event.reasoning_text)
        if event.text:
            out += self._append("message", event.text)
        for delta in event.tool_calls:
            out += self._tool_call(delta)
        return out

    def finish(self) -> list[dict[str, Any]]:
        """Close the open item; the terminal event with the whole response. Call it once, after the
        sample's last event, before `response()`."""
        status = self.status()
        # An output with no text at all is still one (empty) message, as chat's content "" is.
        out = [] if self._items else self._opened(_Item("message", new_id("msg"), 0))
        out += self._close(status)
        terminal = "response.incomplete" if status == "incomplete" else "response.completed"
        return [*out, self._event(terminal, response=self.response())]

    def error(self, err: HTTPError) -> dict[str, Any]:
        """OpenAI's stream `error` event, for a failure after the stream began (its status is 200 by then)."""
        return self._event("error", code=err.type, message=err.message, param=err.param)

    def status(self) -> str:
        reason = self._sample.finish_reason if self._sample is not None else None
        if reason is not None and reason.WhichOneof("kind") == "length":
            return "incomplete"
        return "completed"

    def response(self, status: str | None = None) -> dict[str, Any]:
        """The Response object: in progress (no output yet) or, by default, as it ended."""
        body = copy.deepcopy(self._base)
        if status == "in_progress":
            return {**body, "status": status, "output": [], "usage": None, "incomplete_details": None}
        status = self.status()
        details = {"reason": "max_output_tokens"} if status == "incomplete" else None
        output = [item.json() for item in self._items]
        return {**body, "status": status, "output": output, "usage": self.usage(), "incomplete_details": details}

    def usage(self) -> dict[str, Any] | None:
        s = self._sample
        if s is None:
            return None
        return {
            "input_tokens": s.prompt_tokens,
            "input_tokens_details": {"cached_tokens": s.cached_tokens},
            "output_tokens": s.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": s.reasoning_tokens},
            "total_tokens": s.prompt_tokens + s.completion_tokens,
        }

    def output(self) -> tuple[str, str, list[tuple[str, str, str]]]:
        """The answer text, the reasoning text and the (call_id, name, arguments) of each call."""
        text = "".join(i.text for i in self._items if i.kind == "message")
        reasoning = "".join(i.text for i in self._items if i.kind == "reasoning")
        calls = [(i.call_id, i.name, i.text) for i in self._items if i.kind == "function_call"]
        return text, reasoning, calls

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event

    def _where(self, item: _Item) -> dict[str, Any]:
        return {"item_id": item.id, "output_index": item.output_index}

    def _opened(self, item: _Item) -> list[dict[str, Any]]:
        out = self._close("completed")
        self._items.append(item)
        self._open = item
        out.append(self._event("response.output_item.added", output_index=item.output_index, item=item.json()))
        if item.kind != "function_call":
            where = self._where(item)
            out.append(self._event("response.content_part.added", **where, content_index=0, part=item.part()))
        return out

    def _append(self, kind: str, text: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        item = self._open
        if item is None or item.kind != kind:
            item = _Item(kind, new_id("rs" if kind == "reasoning" else "msg"), len(self._items))
            out += self._opened(item)
        item.text_so_far.add(text)
        delta = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
        extra: dict[str, Any] = {} if kind == "reasoning" else {"logprobs": []}
        out.append(self._event(delta, **self._where(item), content_index=0, delta=text, **extra))
        return out

    def _tool_call(self, delta: common_pb2.ToolCallDelta) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        item = self._calls.get(delta.index)
        if item is None:
            item = _Item("function_call", new_id("fc"), len(self._items), call_id=delta.id, name=delta.name)
            self._calls[delta.index] = item
            out += self._opened(item)
        elif item is not self._open:
            raise HTTPError(502, f"the router sent arguments of tool call {delta.index} after a later output began")
        if delta.arguments:
            item.text_so_far.add(delta.arguments)
            where = self._where(item)
            out.append(self._event("response.function_call_arguments.delta", **where, delta=delta.arguments))
        return out

    def _close(self, status: str) -> list[dict[str, Any]]:
        item, self._open = self._open, None
        if item is None:
            return []
        item.status = status
        where = self._where(item)
        if item.kind == "function_call":
            out = [self._event("response.function_call_arguments.done", **where, name=item.name, arguments=item.text)]
        else:
            done = "response.reasoning_text.done" if item.kind == "reasoning" else "response.output_text.done"
            extra: dict[str, Any] = {} if item.kind == "reasoning" else {"logprobs": []}
            out = [
                self._event(done, **where, content_index=0, text=item.text, **extra),
                self._event("response.content_part.done", **where, content_index=0, part=item.part()),
            ]
        out.append(self._event("response.output_item.done", output_index=item.output_index, item=item.json()))
        return out
