"""A lean HTTP/1.1 transport for plain-HTTP upstreams, behind httpx's transport seam.

Local inference servers (vLLM, SGLang, llama.cpp, `transformers serve`) and the mock upstream
speak plain HTTP/1.1 on a private network, and a gateway's cost is what it adds per request. The
aiohttp transport (via httpx-aiohttp) spent about a fifth of the gateway's CPU per proxied
request in its client machinery (py-spy, bench/RESULTS.md); this transport is one
`asyncio.Protocol` per connection, a keep-alive pool per host, and a response parser that does
only what an upstream answer needs: a status line, headers, and a body framed by
`Content-Length`, `Transfer-Encoding: chunked` or the connection's end. `https://` URLs (hosted
providers) go to the fallback transport (aiohttp: TLS, proxies and the rest).

Two entrances: `handle_async_request` (httpx's seam: probes and anything else that uses the
client) and `exchange`, which the adapter's completion calls use with a request it encoded
itself and which answers a `RawResponse` instead of httpx's objects (bench/RESULTS.md, step 12).

Errors are httpx's: `ConnectError`/`ConnectTimeout` before the request is sent, `ReadTimeout` when
the upstream is silent past the read timeout (headers or the gap between body reads),
`ReadError` when the connection breaks, `RemoteProtocolError` for a malformed answer. No retries,
with one transport-level exception: a *reused* keep-alive connection that the server had already
closed (it answers nothing at all) is replaced by a fresh one once — the request never reached an
application, so this is not a retry of the request.

A response body that is not read to its end (a client that went away mid-stream) closes its
connection, so the upstream sees the disconnect and stops generating.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import httpx

_MAX_HEAD = 64 * 1024
_MAX_IDLE_PER_HOST = 256
_CHUNKED_ENDINGS = (b"\r\n0\r\n\r\n", b"0\r\n\r\n")
_Key = tuple[str, int]


class _Connection(asyncio.Protocol):
    __slots__ = ("buffer", "closed", "eof", "error", "loop", "transport", "waiter")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.waiter: asyncio.Future[None] | None = None
        self.closed = False
        self.eof = False
        self.error: BaseException | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self._wake()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.error = exc
        self._wake()

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def more(self, read_s: float | None) -> None:
        """Wait for more bytes (or the end); raises httpx.ReadTimeout after `read_s` seconds.

        One timer handle per wait, not `asyncio.timeout`: this runs for every body read."""
        if self.closed or self.eof:
            raise httpx.ReadError("upstream closed the connection") from self.error
        waiter = self.waiter = self.loop.create_future()
        timer = self.loop.call_later(read_s, _expire, waiter) if read_s is not None else None
        try:
            await waiter
        finally:
            self.waiter = None
            if timer is not None:
                timer.cancel()

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.abort()
        self.closed = True


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(httpx.ReadTimeout("upstream sent nothing within the read timeout"))


class H1Transport(httpx.AsyncBaseTransport):
    def __init__(self, fallback: httpx.AsyncBaseTransport) -> None:
        self._fallback = fallback
        self._idle: dict[_Key, deque[_Connection]] = {}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        if url.scheme != "http":
            return await self._fallback.handle_async_request(request)
        timeout: dict[str, Any] = request.extensions.get("timeout", {})
        answer = await self.exchange(
            (url.host, url.port or 80),
            _encode(request, await request.aread()),
            connect_s=timeout.get("connect"),
            head_s=timeout.get("read"),
            read_s=timeout.get("read"),
            head_only=request.method == "HEAD",
        )
        return httpx.Response(
            answer.status_code, headers=answer.raw_headers, stream=answer.body, extensions={"http_version": b"HTTP/1.1"}
        )

    async def exchange(
        self,
        key: _Key,
        payload: bytes,
        *,
        connect_s: float | None,
        head_s: float | None,
        read_s: float | None,
        head_only: bool = False,
    ) -> RawResponse:
        """Send `payload` (a whole encoded request) to `key` = (host, port) and read the answer's
        head: the plain-HTTP path without httpx's Request/Response objects, which cost about a
        sixth of a proxied request's CPU (py-spy, bench/RESULTS.md). `connect_s` bounds a new
        connection, `head_s` the wait for the whole status line and headers, `read_s` each body read."""
        conn, reused = self._take(key), True
        if conn is None:
            conn, reused = await self._connect(key, connect_s), False
        try:
            head = await self._exchange(conn, payload, head_s)
        except httpx.ReadError:
            conn.close()
            if not reused or conn.buffer:
                raise
            conn = await self._connect(key, connect_s)  # the server had dropped it
            head = await self._exchange(conn, payload, head_s)
        except BaseException:
            conn.close()
            raise
        status, headers = head
        body = _Body(self, key, conn, headers, read_s, head_only or status in (204, 304))
        return RawResponse(status, headers, body)

    async def _exchange(
        self, conn: _Connection, payload: bytes, head_s: float | None
    ) -> tuple[int, list[tuple[bytes, bytes]]]:
        assert conn.transport is not None
        conn.transport.write(payload)
        return await _read_head(conn, head_s)

    def _take(self, key: _Key) -> _Connection | None:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if not conn.closed and not conn.eof and not conn.buffer:
                return conn
            conn.close()
        return None

    def release(self, key: _Key, conn: _Connection) -> None:
        idle = self._idle.setdefault(key, deque())
        if len(idle) >= _MAX_IDLE_PER_HOST:
            conn.close()
        else:
            idle.append(conn)

    async def _connect(self, key: _Key, connect_s: float | None) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(connect_s):
                _, conn = await loop.create_connection(lambda: _Connection(loop), key[0], key[1])
        except TimeoutError as exc:
            raise httpx.ConnectTimeout("upstream connect timed out") from exc
        except OSError as exc:
            raise httpx.ConnectError(f"upstream connection failed: {exc.strerror or type(exc).__name__}") from exc
        return conn

    async def aclose(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()
        await self._fallback.aclose()


def _encode(request: httpx.Request, body: bytes) -> bytes:
    url = request.url
    target = url.raw_path  # path and query, already percent-encoded
    lines = [request.method.encode(), b" ", target, b" HTTP/1.1\r\n"]
    for name, value in request.headers.raw:
        lines += (name, b": ", value, b"\r\n")
    lines.append(b"\r\n")
    return b"".join(lines) + body


async def _read_head(conn: _Connection, head_s: float | None) -> tuple[int, list[tuple[bytes, bytes]]]:
    deadline = None if head_s is None else conn.loop.time() + head_s
    while (end := conn.buffer.find(b"\r\n\r\n")) < 0:
        if len(conn.buffer) > _MAX_HEAD:
            raise httpx.RemoteProtocolError("upstream response head too large")
        await conn.more(None if deadline is None else max(0.0, deadline - conn.loop.time()))
    head = bytes(conn.buffer[:end])
    del conn.buffer[: end + 4]
    status_line, *lines = head.split(b"\r\n")
    parts = status_line.split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise httpx.RemoteProtocolError("malformed upstream status line")
    headers = []
    for line in lines:
        name, sep, value = line.partition(b":")
        if not sep:
            raise httpx.RemoteProtocolError("malformed upstream header line")
        headers.append((name.strip(), value.strip()))
    return int(parts[1]), headers


class RawResponse:
    """An answer on the plain-HTTP path: status, raw headers and the body, read once.

    The same reading surface as `httpx.Response` where the adapter uses it (`status_code`,
    `headers`, `aread`, `aiter_raw`, `aiter_bytes`, `aclose`). Bodies are passed on as sent: the
    gateway never asks for a content encoding, so there is nothing to decode."""

    __slots__ = ("body", "raw_headers", "status_code")

    def __init__(self, status_code: int, raw_headers: list[tuple[bytes, bytes]], body: _Body) -> None:
        self.status_code = status_code
        self.raw_headers = raw_headers
        self.body = body

    @property
    def headers(self) -> dict[str, str]:
        """Header names lower-cased; a repeated header keeps its last value."""
        return {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in self.raw_headers}

    async def aread(self) -> bytes:
        return await self.body.read_all()

    def aiter_raw(self) -> AsyncIterator[bytes]:
        return self.body.__aiter__()

    aiter_bytes = aiter_raw

    async def aclose(self) -> None:
        await self.body.aclose()


class _Body(httpx.AsyncByteStream):
    """The response body, decoded from its framing; the connection goes back to the pool only
    when the body was read to its end and both sides keep the connection alive."""

    def __init__(
        self,
        owner: H1Transport,
        key: _Key,
        conn: _Connection,
        headers: list[tuple[bytes, bytes]],
        timeout: float | None,
        empty: bool,
    ) -> None:
        self._owner, self._key, self._conn, self._timeout = owner, key, conn, timeout
        self._length: int | None = 0 if empty else None
        self._chunked = False
        self._keep_alive = True
        for name, value in headers:
            lowered = name.lower()
            if lowered == b"content-length" and not empty:
                self._length = int(value)
            elif lowered == b"transfer-encoding" and b"chunked" in value.lower():
                self._chunked = True
            elif lowered == b"connection" and value.lower() == b"close":
                self._keep_alive = False
        if self._chunked:
            self._length = None
        elif self._length is None:
            self._keep_alive = False  # the body ends when the connection does
        self._done = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self._chunked:
            async for data in self._chunks():
                yield data
        elif self._length is not None:
            async for data in self._sized(self._length):
                yield data
        else:
            async for data in self._until_close():
                yield data
        self._done = True

    async def read_all(self) -> bytes:
        """The whole body; a `Content-Length` body is one slice of the connection's buffer."""
        length, conn = self._length, self._conn
        if self._chunked or length is None:
            return b"".join([data async for data in self])
        while len(conn.buffer) < length:
            await conn.more(self._timeout)
        data = bytes(conn.buffer[:length])
        del conn.buffer[:length]
        self._done = True
        return data

    async def _sized(self, remaining: int) -> AsyncIterator[bytes]:
        conn = self._conn
        while remaining:
            if not conn.buffer:
                await conn.more(self._timeout)
                continue
            data = bytes(conn.buffer[:remaining])
            del conn.buffer[: len(data)]
            remaining -= len(data)
            yield data

    async def _until_close(self) -> AsyncIterator[bytes]:
        conn = self._conn
        while True:
            if conn.buffer:
                data = bytes(conn.buffer)
                conn.buffer.clear()
                yield data
            elif conn.closed or conn.eof:
                return
            else:
                await conn.more(self._timeout)

    async def _chunks(self) -> AsyncIterator[bytes]:
        conn = self._conn
        while True:
            while (line_end := conn.buffer.find(b"\r\n")) < 0:
                await conn.more(self._timeout)
            size_text = bytes(conn.buffer[:line_end]).split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise httpx.RemoteProtocolError("malformed chunk size from upstream") from None
            del conn.buffer[: line_end + 2]
            if size == 0:
                while (trailer_end := conn.buffer.find(b"\r\n")) != 0:  # trailers, then the blank line
                    if trailer_end < 0:
                        await conn.more(self._timeout)
                    else:
                        del conn.buffer[: trailer_end + 2]
                del conn.buffer[:2]
                return
            async for data in self._sized(size):
                yield data
            while len(conn.buffer) < 2:
                await conn.more(self._timeout)
            del conn.buffer[:2]

    async def aclose(self) -> None:
        conn = self._conn
        if not self._done and self._chunked and bytes(conn.buffer) in _CHUNKED_ENDINGS:
            # The reader stopped at the stream's own end marker (`data: [DONE]`) and the chunked
            # terminator is already here: the body is complete, the connection reusable.
            conn.buffer.clear()
            self._done = True
        if self._done and self._keep_alive and not conn.closed and not conn.eof and not conn.buffer:
            self._owner.release(self._key, conn)
        else:
            conn.close()
