"""Parsers whose calls start at a tag anywhere in the answer: hermes / qwen (`<tool_call>`), mistral (`[TOOL_CALLS]`).

Content before the tag streams as it arrives, holding back only a possible
partial tag. After the tag a region reader takes over until the calls end;
then content resumes. Whitespace between and after calls is dropped (it only
separates them); any other text there is content.
"""

from __future__ import annotations

from abc import abstractmethod

from services.tokenizer.reasoning.think_tags import partial_suffix
from services.tokenizer.tool_parsers.base import ToolParse, ToolParser
from services.tokenizer.tool_parsers.regions import CallArrayReader, RegionReader, TaggedCallReader


class TagStartedParser(ToolParser):
    start_tag: str

    def __init__(self) -> None:
        super().__init__()
        self._buf = ""
        self._reader: RegionReader | None = None
        # Only whitespace since the last call: held, and dropped if another call or the end follows.
        self._after_call = False

    @abstractmethod
    def _reader_at(self, start: int) -> RegionReader:
        """The reader for the calls whose body starts at `start` (just past the tag)."""

    def feed(self, text: str, *, last: bool = False) -> ToolParse:
        self._buf += text
        out = ToolParse()
        content: list[str] = []
        while True:
            if self._reader is None:
                if not self._content(content, last):
                    break
                continue
            step = self._reader.read(self._buf, last)
            out.calls.extend(self._whole_call(*call) for call in step.calls)
            if step.end is None:
                break
            content.append(step.released)
            self._after_call = not step.released
            self._buf, self._reader = self._buf[step.end :], None
        out.content = "".join(content)
        return out

    def _content(self, content: list[str], last: bool) -> bool:
        """Emit the answer text before the next tag; True when a tag was found and a reader started."""
        buf = self._buf
        index = buf.find(self.start_tag)
        if index >= 0:
            before, self._buf = buf[:index], buf[index + len(self.start_tag) :]
            if not (self._after_call and before.isspace()):
                content.append(before)
            self._reader = self._reader_at(0)
            return True
        keep = 0 if last else partial_suffix(buf, self.start_tag)
        ready = buf[: len(buf) - keep]
        if self._after_call and (not ready or ready.isspace()):
            if last:
                self._buf = ""
            return False
        content.append(ready)
        self._buf, self._after_call = buf[len(ready) :], False
        return False


class HermesParser(TagStartedParser):
    """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, several in a row (Hermes, Qwen2.5)."""

    start_tag = "<tool_call>"
    end_tag = "</tool_call>"

    def _reader_at(self, start: int) -> RegionReader:
        return TaggedCallReader(start, self.start_tag, self.end_tag)


class MistralParser(TagStartedParser):
    """`[TOOL_CALLS]` then a JSON list of `{"name", "arguments"}` (needs skip_special_tokens false)."""

    start_tag = "[TOOL_CALLS]"

    def _reader_at(self, start: int) -> RegionReader:
        return CallArrayReader(start, prefix=self.start_tag)
