"""A section of tagged calls, each reported as soon as its own end tag arrives (deepseek_v3, kimi_k2):

    SECTION_BEGIN  CALL_BEGIN body CALL_END  CALL_BEGIN body CALL_END ...  SECTION_END

The parser found SECTION_BEGIN; this reader takes the text from there. Whitespace
between calls is dropped. A call body `parse_one` refuses, or text that breaks the
form, is released as content from the end of the last reported call (with the
section tag when no call was reported) up to where it broke, and the section ends
there; the parser reads on from that point. At the end of
the output, a section whose end tag never came keeps its complete calls, and a
last call cut before its end tag still counts when its body parses.
"""

from __future__ import annotations

from collections.abc import Callable

from services.tokenizer.tool_parsers.base import FoundCall
from services.tokenizer.tool_parsers.json_text import skip_whitespace
from services.tokenizer.tool_parsers.regions import RegionStep


class SectionReader:
    def __init__(
        self,
        start: int,
        *,
        section_tag: str,
        section_end: str,
        call_begin: str,
        call_end: str,
        parse_one: Callable[[str], FoundCall | None],
    ) -> None:
        self._pos = start
        self._section_tag = section_tag
        self._section_end = section_end
        self._call_begin = call_begin
        self._call_end = call_end
        self._parse_one = parse_one
        self._reported = 0
        self._unreported_from = start

    def read(self, buf: str, last: bool) -> RegionStep:
        step = RegionStep()
        while step.end is None and self._advance(buf, last, step):
            pass
        self._reported += len(step.calls)
        return step

    def _advance(self, buf: str, last: bool, step: RegionStep) -> bool:
        """Read the next call or the section's end; False when more text is needed."""
        pos = skip_whitespace(buf, self._pos)
        rest = buf[pos:]
        if rest.startswith(self._section_end):
            step.end = pos + len(self._section_end)
            return True
        if rest.startswith(self._call_begin):
            body_start = pos + len(self._call_begin)
            index = buf.find(self._call_end, body_start)
            if index < 0 and not last:
                return False
            body_end = len(buf) if index < 0 else index
            call = self._parse_one(buf[body_start:body_end])
            if call is None:
                self._release(buf, step, len(buf) if index < 0 else index + len(self._call_end))
                return True
            step.calls.append(call)
            self._pos = self._unreported_from = len(buf) if index < 0 else index + len(self._call_end)
            return True
        if not rest or self._section_end.startswith(rest) or self._call_begin.startswith(rest):
            if last:  # only whitespace (dropped) or a cut-off tag (released) is left
                if rest:
                    self._release(buf, step, len(buf))
                else:
                    step.end = len(buf)
                return True
            return False
        self._release(buf, step, pos)
        return True

    def _release(self, buf: str, step: RegionStep, upto: int) -> None:
        prefix = "" if self._reported + len(step.calls) else self._section_tag
        step.end, step.released = upto, prefix + buf[self._unreported_from : upto]
