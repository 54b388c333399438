"""A chat-template render worker: a process of its own, so a template that runs too long can be killed.

Run as `python -m services.tokenizer.render_worker`; RenderPool (render_pool.py)
starts and feeds it. The protocol is frames on stdin/stdout, each an 8-byte
big-endian length and that many bytes of JSON (never pickle: the worker runs
client code, the service must not unpickle what it sends):

    service -> worker   {"memory_bytes": N}                       once, first
    worker  -> service  {"ready": true}
    service -> worker   {"template": …, "messages": […], …}      one render (chat_sandbox.render's arguments)
    worker  -> service  {"text": "…"} or {"error": "…"}

The worker exits when stdin closes (its service is gone). Its address space is
capped, so a template that builds a huge string fails with MemoryError rather
than taking the machine's memory.
"""

from __future__ import annotations

import json
import resource
import struct
import sys
from typing import Any, BinaryIO

from services.tokenizer.chat_sandbox import TemplateFailed, render

_HEADER = struct.Struct(">Q")


def read_frame(stream: BinaryIO) -> Any:
    """The next frame's JSON value; None when the stream ended."""
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None
    (size,) = _HEADER.unpack(header)
    body = stream.read(size)
    if len(body) < size:
        return None
    return json.loads(body)


def encode_frame(value: Any) -> bytes:
    # ensure_ascii: lone surrogates (valid in a Python str, not in UTF-8) travel as \\ud800 escapes.
    body = json.dumps(value, ensure_ascii=True).encode("ascii")
    return _HEADER.pack(len(body)) + body


def handle(request: dict[str, Any]) -> dict[str, Any]:
    try:
        return {"text": render(**request)}
    except TemplateFailed as exc:
        return {"error": str(exc)}
    except MemoryError:
        return {"error": "chat template ran out of memory (the render worker's memory is capped)"}
    except RecursionError:
        return {"error": "chat template recursed too deeply"}


def main() -> None:
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    setup = read_frame(stdin)
    if setup is None:
        return
    memory = int(setup["memory_bytes"])
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    stdout.write(encode_frame({"ready": True}))
    stdout.flush()
    while (request := read_frame(stdin)) is not None:
        reply = handle(request)
        try:
            frame = encode_frame(reply)
        except MemoryError:
            frame = encode_frame({"error": "chat template output did not fit the render worker's memory"})
        stdout.write(frame)
        stdout.flush()


if __name__ == "__main__":
    main()
