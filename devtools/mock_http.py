"""A minimal HTTP/1.1 server for scripted upstreams: the tests' replay server and `mock-upstream`.

`MockUpstreamServer` runs on a bare `asyncio.Protocol` (keep-alive, Content-Length and chunked
request bodies, pipelined requests answered in order). It asks a `Responder` for a `Reply` per
request and plays it back, including faults: a delay before the first byte, slow chunks, a TCP
reset after N chunks (`SO_LINGER` 0, then `abort()`), a stall after N chunks that holds the
connection until the client goes away, or raw bytes in place of an answer (a malformed one). With
an `ssl.SSLContext` it serves HTTPS (`url` says `https://`). What to answer is the responder's business:
`devtools.mock_upstream.ScriptedResponder` for the command, a queue of transcripts in `tests/support/upstream.py`.

No framework: it has to answer many times faster than the gateway it stands behind, so the hot
path (a reply with no delays) is written synchronously from `data_received`, without a task.
"""

from __future__ import annotations

import asyncio
import functools
import http
import socket
import ssl
import struct
from collections.abc import Sequence
from typing import Any, Literal, Protocol, cast

import msgspec
from msgspec import Struct

_MAX_HEAD = 64 * 1024
_SERVER_OWNED = frozenset({"content-length", "transfer-encoding", "connection"})


class ReceivedRequest(Struct):
    method: str
    path: str  # the request target as sent, query string included
    headers: dict[str, str]  # names lowercased
    body: bytes

    def json(self) -> Any:
        return msgspec.json.decode(self.body)


class Reply(Struct):
    """What to send for one request. Head and first chunk leave together, so a reset or stall
    after 0 chunks happens before the status line; an empty chunk sends just the head. `raw`, when
    set, is written at once instead of all that (status, headers, chunks, timing and faults are
    ignored), and the connection stays open for the next request as after any answer."""

    status: int = 200
    headers: list[tuple[str, str]] = []
    chunks: list[bytes] = []
    chunk_delay_s: float = 0.0
    first_byte_delay_s: float = 0.0
    reset_after: int | None = None
    stall_after: int | None = None
    chunked: bool = False  # Transfer-Encoding: chunked, else Content-Length
    raw: bytes | None = None
    close_after: bool = False  # close the connection after the answer, without `Connection: close`


class Responder(Protocol):
    def respond(self, request: ReceivedRequest) -> Reply: ...


class _BadRequest(Exception):
    pass


# --- HTTP/1.1 framing ---------------------------------------------------------------------------


def _dechunk(buf: bytearray, pos: int) -> tuple[bytes, int] | None:
    body = bytearray()
    while True:
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            return None
        size = int(bytes(buf[pos:eol]).split(b";", 1)[0], 16)
        pos = eol + 2
        if size == 0:
            end = buf.find(b"\r\n\r\n", pos - 2)
            return None if end < 0 else (bytes(body), end + 4)
        if len(buf) < pos + size + 2:
            return None
        body += buf[pos : pos + size]
        pos += size + 2


def _take_request(buf: bytearray) -> tuple[ReceivedRequest, bool] | None:
    """Cut one complete request off the front of `buf`: (request, keep_alive), or None if partial."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        if len(buf) > _MAX_HEAD:
            raise _BadRequest("request head too large")
        return None
    request_line, *lines = buf[:end].decode("latin-1").split("\r\n")
    parts = request_line.split(" ")
    if len(parts) != 3:
        raise _BadRequest("malformed request line")
    headers: dict[str, str] = {}
    for line in lines:
        name, sep, value = line.partition(":")
        if not sep:
            raise _BadRequest("malformed header line")
        headers[name.strip().lower()] = value.strip()
    try:
        if "chunked" in headers.get("transfer-encoding", "").lower():
            parsed = _dechunk(buf, end + 4)
            if parsed is None:
                return None
            body, stop = parsed
        else:
            stop = end + 4 + int(headers.get("content-length", "0"))
            if len(buf) < stop:
                return None
            body = bytes(buf[end + 4 : stop])
    except ValueError as exc:
        raise _BadRequest("malformed body framing") from exc
    del buf[:stop]
    connection = headers.get("connection", "").lower()
    keep_alive = "keep-alive" in connection if parts[2] == "HTTP/1.0" else "close" not in connection
    return ReceivedRequest(parts[0], parts[1], headers, body), keep_alive


@functools.lru_cache(maxsize=128)
def _status_line(status: int) -> str:
    try:
        phrase = http.HTTPStatus(status).phrase
    except ValueError:
        phrase = "Unknown"
    return f"HTTP/1.1 {status} {phrase}\r\n"


def _encode_head(reply: Reply) -> bytes:
    lines = [_status_line(reply.status)]
    lines += [f"{k}: {v}\r\n" for k, v in reply.headers if k.lower() not in _SERVER_OWNED]
    if reply.chunked:
        lines.append("transfer-encoding: chunked\r\n\r\n")
    else:
        lines.append(f"content-length: {sum(map(len, reply.chunks))}\r\n\r\n")
    return "".join(lines).encode("latin-1")


def _frame(chunk: bytes, chunked: bool) -> bytes:
    return b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked and chunk else chunk


def _ending(reply: Reply) -> tuple[int, Literal["reset", "stall", "end"]]:
    """How many chunks go out, and what happens then (a reset or stall wins a tie with the end)."""
    ends: list[tuple[int, Literal["reset", "stall", "end"]]] = []
    if reply.reset_after is not None:
        ends.append((reply.reset_after, "reset"))
    if reply.stall_after is not None:
        ends.append((reply.stall_after, "stall"))
    ends.append((len(reply.chunks), "end"))
    return min(ends, key=lambda item: item[0])


def _is_immediate(reply: Reply) -> bool:
    return reply.raw is not None or (
        not reply.first_byte_delay_s
        and (not reply.chunk_delay_s or len(reply.chunks) < 2)
        and reply.reset_after is None
        and reply.stall_after is None
    )


def _encode_whole(reply: Reply) -> bytes:
    if reply.raw is not None:
        return reply.raw
    frames = [_frame(chunk, reply.chunked) for chunk in reply.chunks]
    tail = b"0\r\n\r\n" if reply.chunked else b""
    return b"".join([_encode_head(reply), *frames, tail])


def error_reply(status: int, message: str, headers: Sequence[tuple[str, str]] = ()) -> Reply:
    kind = {400: "invalid_request_error", 404: "invalid_request_error", 429: "rate_limit_error"}
    error = {"message": message, "type": kind.get(status, "upstream_error"), "code": status}
    body = msgspec.json.encode({"error": error})
    return Reply(status, [("content-type", "application/json"), *headers], [body])


# --- the server ---------------------------------------------------------------------------------


class _Connection(asyncio.Protocol):
    def __init__(self, server: MockUpstreamServer) -> None:
        self._server = server
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None
        self._task: asyncio.Task[None] | None = None
        self._writable = asyncio.Event()
        self._writable.set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        self._server._opened(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._server._lost(self)
        self._writable.set()
        if self._task is not None:
            self._task.cancel()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if self._task is None:
            self._serve_buffered()

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def _serve_buffered(self) -> None:
        transport = self._transport
        assert transport is not None
        while self._task is None and not transport.is_closing():
            try:
                parsed = _take_request(self._buffer)
            except _BadRequest as exc:
                transport.write(_encode_whole(error_reply(400, str(exc))))
                transport.close()
                return
            if parsed is None:
                return
            request, keep_alive = parsed
            reply = self._server.reply_for(request)
            if not _is_immediate(reply):
                self._task = asyncio.get_running_loop().create_task(self._play(reply, keep_alive))
                return
            transport.write(_encode_whole(reply))
            if not keep_alive or reply.close_after:
                transport.close()

    async def _play(self, reply: Reply, keep_alive: bool) -> None:
        transport = self._transport
        assert transport is not None
        self._server._count_streams(1)
        try:
            if reply.first_byte_delay_s:
                await asyncio.sleep(reply.first_byte_delay_s)
            count, then = _ending(reply)
            pending = _encode_head(reply)
            for index in range(count):
                if index and reply.chunk_delay_s:
                    await asyncio.sleep(reply.chunk_delay_s)
                transport.write(pending + _frame(reply.chunks[index], reply.chunked))
                pending = b""
                await self._writable.wait()
            if then == "reset":
                await self._reset(transport)
                return
            if then == "stall":
                await asyncio.get_running_loop().create_future()
            transport.write(pending + (b"0\r\n\r\n" if reply.chunked else b""))
        finally:
            self._server._count_streams(-1)
        self._task = None
        if not keep_alive or reply.close_after:
            transport.close()
        elif self._buffer:
            self._serve_buffered()

    async def _reset(self, transport: asyncio.Transport) -> None:
        """Flush what was written (the client should see those chunks), then close with RST."""
        if transport.get_write_buffer_size():
            transport.set_write_buffer_limits(high=0, low=0)  # paused until the buffer is empty
            await self._writable.wait()  # (a TLS transport pauses at 0 >= 0 and never resumes: not waited)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.abort()


class MockUpstreamServer:
    """Serves `responder`'s replies on loopback; `port=0` picks a free port; `ssl` serves HTTPS."""

    def __init__(
        self, responder: Responder, host: str = "127.0.0.1", port: int = 0, ssl: ssl.SSLContext | None = None
    ) -> None:
        self.responder = responder
        self.host = host
        self.port = port
        self.ssl = ssl
        self.active_streams = 0  # replies still being written by a task (delayed, slow, stalled)
        self._connections: set[_Connection] = set()
        self._server: asyncio.Server | None = None
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def url(self) -> str:
        return f"{'https' if self.ssl else 'http'}://{self.host}:{self.port}/v1"

    @property
    def open_connections(self) -> int:
        return len(self._connections)

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Connection(self), self.host, self.port, backlog=1024, reuse_address=True, ssl=self.ssl
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for connection in list(self._connections):
            connection.abort()
        await self._server.wait_closed()
        async with asyncio.timeout(5):
            await self.wait_idle()
        self._server = None

    async def wait_idle(self) -> None:
        """Wait until no connection is open and no reply is being written (wrap it in a timeout)."""
        await self._idle.wait()

    def _opened(self, connection: _Connection) -> None:
        self._connections.add(connection)
        self._idle.clear()

    def _lost(self, connection: _Connection) -> None:
        self._connections.discard(connection)
        self._count_streams(0)

    def _count_streams(self, change: int) -> None:
        self.active_streams += change
        if self._connections or self.active_streams:
            self._idle.clear()
        else:
            self._idle.set()

    async def __aenter__(self) -> MockUpstreamServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def reply_for(self, request: ReceivedRequest) -> Reply:
        try:
            return self.responder.respond(request)
        except Exception as exc:  # a broken responder answers 500 instead of hanging the client
            return error_reply(500, f"mock responder failed: {exc!r}")
