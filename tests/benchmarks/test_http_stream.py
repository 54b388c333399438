"""The benchmarks' bare HTTP client: kept connections, chunked bodies, errors."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from benchmarks.http_stream import HttpConnection


def _chunked(*pieces: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    return head + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(
        next(line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")).split(b":")[1]
    )
    return head + await reader.readexactly(length)


class Server:
    def __init__(self) -> None:
        self.connections = 0
        self.requests: list[bytes] = []


Handler = Callable[[Server, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def _serve(handler: Handler) -> AsyncIterator[tuple[Server, int]]:
    """A server answering each connection with `handler`; what it saw, and its port."""
    state = Server()

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        state.connections += 1
        try:
            await handler(state, reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(on_connection, "127.0.0.1", 0)
    async with server:
        yield state, server.sockets[0].getsockname()[1]


async def _sse_until_closed(state: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answers every request on the connection with two events, each in a chunk written on its own."""
    while not reader.at_eof():
        try:
            request = await _read_request(reader)
        except asyncio.IncompleteReadError:
            return
        state.requests.append(request)
        response = _chunked(b'data: {"n":1}\n\n', b'data: {"n":2}\n\ndata: [DONE]\n\n')
        for start in range(0, len(response), 7):  # cut anywhere, the last chunk's marker too
            writer.write(response[start : start + 7])
            await writer.drain()
        if b"connection: close" in request.lower():
            return


async def test_a_kept_connection_carries_one_request_after_another_and_reads_each_chunked_body_to_its_end() -> None:
    async with _serve(_sse_until_closed) as (state, port):
        connection = HttpConnection(port)
        bodies: list[bytes] = []
        for _ in range(3):
            parts: list[bytes] = []
            await asyncio.wait_for(connection.exchange("/generate", b"{}", parts.append), 10)
            bodies.append(b"".join(parts))
        connection.close()
        assert state.connections == 1 and len(state.requests) == 3
        assert all(b"connection: close" not in r.lower() for r in state.requests)
        assert all(body.count(b"data: {") == 2 and body.endswith(b"\r\n0\r\n\r\n") for body in bodies)


async def test_per_request_connections_ask_the_server_to_close_each() -> None:
    async with _serve(_sse_until_closed) as (state, port):
        connection = HttpConnection(port, keep_alive=False)
        for _ in range(2):
            await asyncio.wait_for(connection.exchange("/generate", b"{}", lambda _: None), 10)
        assert state.connections == 2
        assert all(b"connection: close" in r.lower() for r in state.requests)


async def test_a_connection_the_server_closed_while_idle_is_opened_again() -> None:
    async def one_request_then_close(state: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        state.requests.append(await _read_request(reader))
        writer.write(_chunked(b'data: {"n":1}\n\n'))
        await writer.drain()
        # As a keep-alive timeout does: the connection ends after its answer; the client finds out on its next write.

    async with _serve(one_request_then_close) as (state, port):
        connection = HttpConnection(port)
        for _ in range(2):
            await asyncio.wait_for(connection.exchange("/generate", b"{}", lambda _: None), 10)
        assert state.connections == 2 and len(state.requests) == 2


async def test_an_error_status_raises_with_its_body() -> None:
    async def refuse(state: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        body = b'{"error": {"message": "max_tokens must be at least 1"}}'
        writer.write(b"HTTP/1.1 400 Bad Request\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()

    async with _serve(refuse) as (_, port):
        with pytest.raises(RuntimeError, match=r"HTTP 400: .*max_tokens must be at least 1"):
            await asyncio.wait_for(HttpConnection(port).exchange("/generate", b"{}", lambda _: None), 10)
