"""Reading the JSON the engine was constrained to for tool_choice "required" and a named function.

- NAMED: the whole output is the arguments object of that function: one call,
  index 0, its id and name with the first text, then the text as argument
  fragments as they come (the engine's grammar keeps them valid JSON).
- REQUIRED: the output is `[{"name": ..., "parameters": {...}}, ...]` (vLLM's
  form): each call is reported as soon as its object is complete.
"""

from __future__ import annotations

from services.tokenizer.tool_parsers.base import ToolCallPiece, ToolParse, ToolParser, new_call_id
from services.tokenizer.tool_parsers.regions import CallArrayReader


class NamedCallParser(ToolParser):
    def __init__(self, function_name: str) -> None:
        super().__init__()
        self._name = function_name
        self._opened = False

    def feed(self, text: str, *, last: bool = False) -> ToolParse:
        if not text:
            return ToolParse()
        if self._opened:
            return ToolParse(calls=[ToolCallPiece(0, arguments=text)])
        self._opened = True
        return ToolParse(calls=[ToolCallPiece(0, new_call_id(), self._name, text)])


class RequiredCallsParser(ToolParser):
    def __init__(self) -> None:
        super().__init__()
        self._buf = ""
        self._reader: CallArrayReader | None = CallArrayReader(0)

    def feed(self, text: str, *, last: bool = False) -> ToolParse:
        self._buf += text
        out = ToolParse()
        if self._reader is not None:
            step = self._reader.read(self._buf, last)
            out.calls.extend(self._whole_call(*call) for call in step.calls)
            if step.end is None:
                return out
            out.content = step.released
            self._buf, self._reader = self._buf[step.end :], None
        # The grammar ends the output with the array; whitespace after it is dropped, other text kept.
        if self._buf.strip():
            out.content += self._buf
            self._buf = ""
        elif last:
            self._buf = ""
        return out
