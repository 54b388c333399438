"""A bare HTTP/1.1 client for the gateway's SSE streams: the benchmarks' HTTP load.

It reads the response as bytes and leaves the events to its caller (which counts them, or finds the
last), so the client spends next to nothing per event: a client that parses every event in Python
(httpx did) spends about what the gateway does on the same cores.

A connection is kept open from one request to the next (`keep_alive`), as `vllm bench serve`'s aiohttp
session and the OpenAI SDK's httpx pool keep theirs; or, with `keep_alive=False`, each request opens its
own and asks the server to close it (`Connection: close`), as a client without a pool does. The gateway
spends about 0.5 ms of CPU on a connection's set-up and close (docs/benchmarks.md), which a kept
connection pays once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

# The end of a chunked body: the last chunk's CRLF, then the zero-length chunk. An SSE body cannot hold
# it otherwise: its events are JSON (no raw CR) and chunk-size lines are hex digits.
_LAST_CHUNK = b"\r\n0\r\n\r\n"
_READ = 1 << 16


def post(path: str, body: bytes, keep_alive: bool = True) -> bytes:
    """The request's bytes: a JSON POST to `path`."""
    connection = "" if keep_alive else "Connection: close\r\n"  # HTTP/1.1 keeps it open by default
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n{connection}\r\n"
    )
    return head.encode() + body


class HttpConnection:
    """Requests to 127.0.0.1:`port` one after another, on one kept connection or one each."""

    def __init__(self, port: int, keep_alive: bool = True) -> None:
        self._port = port
        self._keep_alive = keep_alive
        self._streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def exchange(self, path: str, body: bytes, on_body: Callable[[bytes], None]) -> None:
        """POST `body` to `path`; `on_body` gets the response body's bytes as they are read (a chunked
        body's framing included). A status other than 200 raises, with the body."""
        request = post(path, body, self._keep_alive)
        for attempt in range(2):
            reused = self._streams is not None
            reader, writer = self._streams or await asyncio.open_connection("127.0.0.1", self._port)
            self._streams = (reader, writer) if self._keep_alive else None
            try:
                writer.write(request)
                head = await _read_head(reader)
                if head is None and reused and attempt == 0:
                    # The server closed the idle connection (its keep-alive timeout): open another.
                    writer.close()
                    self._streams = None
                    continue
                if head is None:
                    raise ConnectionError("the server closed the connection before answering")
                status, headers, rest = head
                if status != 200:
                    body_read = await _whole_body(reader, headers, rest)
                    raise RuntimeError(f"HTTP {status}: {body_read.decode(errors='replace')[:500]}")
                await _body(reader, headers, rest, on_body)
            except BaseException:
                writer.close()
                self._streams = None
                raise
            if not self._keep_alive:
                writer.close()
            return

    def close(self) -> None:
        if self._streams is not None:
            self._streams[1].close()
            self._streams = None


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, bytes, bytes] | None:
    """The status, the header block (lower case) and what was read past it; None if the connection ended
    before any byte came."""
    data = b""
    while b"\r\n\r\n" not in data:
        more = await reader.read(_READ)
        if not more:
            if not data:
                return None
            raise ConnectionError("the server closed the connection inside the response head")
        data += more
    head, _, rest = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, head.lower(), rest


async def _body(reader: asyncio.StreamReader, headers: bytes, rest: bytes, on_body: Callable[[bytes], None]) -> None:
    if b"transfer-encoding: chunked" in headers:
        tail, data = b"", rest
        while True:
            if data:
                on_body(data)
                tail = (tail + data)[-len(_LAST_CHUNK) :]
                if tail == _LAST_CHUNK:
                    return
            data = await reader.read(_READ)
            if not data:
                raise ConnectionError("the server closed the connection inside a chunked body")
    if rest:
        on_body(rest)
    length = _content_length(headers)
    received = len(rest)
    while length is None or received < length:
        data = await reader.read(_READ)
        if not data:
            if length is None:  # the body ends with the connection
                return
            raise ConnectionError("the server closed the connection inside the body")
        received += len(data)
        on_body(data)


async def _whole_body(reader: asyncio.StreamReader, headers: bytes, rest: bytes) -> bytes:
    parts: list[bytes] = []
    await _body(reader, headers, rest, parts.append)
    return b"".join(parts)


def _content_length(headers: bytes) -> int | None:
    for line in headers.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name == b"content-length":
            return int(value)
    return None
