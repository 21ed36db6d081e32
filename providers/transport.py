"""A lean HTTP/1.1 transport for every upstream, plain or over TLS, behind httpx's transport seam.

Local inference servers (vLLM, SGLang, llama.cpp, `transformers serve`) and the mock upstream speak
plain HTTP/1.1 on a private network; hosted providers speak it over TLS (`https://`). The aiohttp
transport spent about a fifth of the gateway's CPU per proxied request in its client machinery
(py-spy, bench/RESULTS.md); this one is an `asyncio.Protocol` per connection, a keep-alive pool per
(host, port, TLS), and a reader of what an answer needs: a status line, headers, a body framed by
`Content-Length`, `Transfer-Encoding: chunked` or the connection's end. TLS is asyncio's own
(`create_connection(ssl=...)`: the handshake is part of the connect and its timeout), verified
against certifi's CAs (as httpx) or the context the client was made with, never switched off. A
new connection is dialled by `providers.dialing` (a host's addresses kept 10 s, TCP connects raced a
quarter of a second apart: happy eyeballs), then TLS is made on the winner, all within one `connect`.

One transport for both schemes, so an answer means the same over either (https went to aiohttp,
which read eight kinds of answer otherwise: README, tests/providers/test_tls.py).

Two entrances: `handle_async_request` (httpx's seam: probes) and `exchange` (the adapter's calls: a
request it encoded itself in, a `RawResponse` out; bench/RESULTS.md, step 12).

The head (status line and headers, up to its blank line, at most 64 KiB) is checked by `httptools`
(llhttp, the C parser of uvicorn and Node.js): version, status, header syntax, `Content-Length`
digits, overflow, repeats and beside `Transfer-Encoding`, line folding (bench/parse_heads.py).
Interim `1xx` heads are skipped; a `101`, or a `Content-Encoding` but `identity` (the one the
adapter asks for), is malformed. A chunk-size line is one regular expression match.

Errors are httpx's: `ConnectError`/`ConnectTimeout` before the request is sent, `ReadTimeout` when
the upstream is silent past the read timeout (headers, or between body reads: `providers.timers`),
`ReadError` when the connection breaks, `RemoteProtocolError` for a malformed answer (mapped in
`providers.errors.upstream_errors`; a whole answer over `MAX_BODY_BYTES` too: 300 MB took 1 GB). A
connection that raised is closed, never pooled, and so is one whose body was not read to its end.

No retries (providers.md): a request failing on a reused connection fails, even if the server seems to
have dropped it unanswered (it may have billed it). Stale connections are avoided: one whose end was
seen is never taken, one idle `MAX_IDLE_S` is closed (under uvicorn's and llama.cpp's 5 s keep-alive),
and one the kernel has anything for (the server's close, a reset, stray bytes) is closed when taken.
That last check is a `poll` of the socket with no wait (about 0.5 µs a reused connection): a server
that closes after its answer without `Connection: close` sends its FIN just after the body, and the
answer's task ends and gives the connection back before the loop reads that FIN, so without it the
next request to that host and port (another provider's, possibly) failed every time (tests/providers).
"""

from __future__ import annotations

import asyncio
import re
import ssl
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import httpx

from providers.dialing import Dialer, Lookup
from providers.response_head import ResponseHead
from providers.upstream_connection import Connection

_MAX_HEAD = 64 * 1024
_CHUNK_LINE = re.compile(rb"([0-9A-Fa-f]{1,15})[ \t]*(?:;[^\r\n]*)?\r\n")  # size, then extensions
_NEXT_CHUNK_LINE = re.compile(rb"\r\n" + _CHUNK_LINE.pattern)  # after the CRLF that ends a chunk
_MAX_CHUNK_LINE = 4096
_MAX_IDLE_PER_HOST = 256
MAX_BODY_BYTES = 64 << 20  # a larger whole answer is malformed (module doc)
MAX_IDLE_S = 4.0  # a pooled connection idle this long is closed, not reused (module doc)
_CHUNKED_ENDINGS = (b"\r\n0\r\n\r\n", b"0\r\n\r\n")
LINGER_S = 0.1  # how long a stream's connection waits for its chunked terminator after the stream's end
_Key = tuple[str, int, bool]  # host, port, TLS


class H1Transport(httpx.AsyncBaseTransport):
    """The pool and the two entrances (module doc); `ssl_context` verifies `https://` upstreams
    (None: httpx's default, certifi's CAs unless `SSL_CERT_FILE` or `SSL_CERT_DIR` names others)."""

    def __init__(self, ssl_context: ssl.SSLContext | None = None, lookup: Lookup | None = None) -> None:
        self._ssl = ssl_context  # made at the first TLS connection when not given (loading the CAs)
        self._idle: dict[_Key, deque[Connection]] = {}
        self._lingering: set[asyncio.Task[None]] = set()  # `linger`
        self._dialer = Dialer(lookup)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        timeout: dict[str, Any] = request.extensions.get("timeout", {})
        answer = await self.exchange(
            key_of(url),
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
        body: bytes = b"",
    ) -> RawResponse:
        """Send `payload` (a whole encoded request, or the head of `body`) to `key` (`key_of`) and read the
        answer's head, without httpx's objects (a sixth of a proxied request's CPU: bench/RESULTS.md).
        `connect_s` bounds a new connection, `head_s` the wait for the whole head, `read_s` each body read."""
        conn = self._take(key) or await self._connect(key, connect_s)
        try:
            conn.send(payload, body)
            head = await _read_head(conn, head_s)
        except BaseException:
            conn.close()  # a connection that failed is never pooled, and the request not sent again
            raise
        answer = _Body(self, key, conn, head, read_s, head_only or head.status in (204, 304))
        return RawResponse(head.status, head.headers, answer)

    def _take(self, key: _Key) -> Connection | None:
        """The newest live pooled connection to `key`; those idle past `MAX_IDLE_S`, or with anything
        to read, are closed (module doc)."""
        idle = self._idle.get(key)
        if idle:
            oldest = idle[0].loop.time() - MAX_IDLE_S
            while idle and idle[0].idle_since < oldest:
                idle.popleft().close()
        while idle:
            conn = idle.pop()
            if not conn.closed and not conn.eof and not conn.buffer and not conn.poller.poll(0):
                return conn
            conn.close()  # its end seen or waiting unread in the kernel, or bytes nobody asked for
        return None

    def release(self, key: _Key, conn: Connection) -> None:
        idle = self._idle.setdefault(key, deque())
        if len(idle) >= _MAX_IDLE_PER_HOST:
            conn.close()
        else:
            conn.idle_since = conn.loop.time()
            idle.append(conn)

    async def _connect(self, key: _Key, connect_s: float | None) -> Connection:
        host, port, tls = key
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(connect_s):  # the lookup, the TCP connects and the TLS handshake
                sock = await self._dialer.dial(host, port)
                try:
                    _, conn = await loop.create_connection(
                        lambda: Connection(loop), sock=sock, **self._tls(host, tls, connect_s)
                    )
                except BaseException:
                    sock.close()  # the transport's own close, if it made one, closed this same object
                    raise
                return conn
        except TimeoutError as exc:
            raise httpx.ConnectTimeout("upstream connect timed out") from exc
        except OSError as exc:
            raise httpx.ConnectError(f"upstream connection failed: {exc.strerror or exc}") from exc

    def _tls(self, host: str, tls: bool, connect_s: float | None) -> dict[str, Any]:
        """TLS for the connected socket, its certificate checked for `host`, not the address dialled."""
        if not tls:
            return {}
        if self._ssl is None:  # certifi's CAs, or SSL_CERT_FILE / SSL_CERT_DIR's: as httpx
            self._ssl = httpx.create_ssl_context()
        # without `ssl_handshake_timeout`, asyncio's 60 s, whatever `connect` says
        return {"ssl": self._ssl, "server_hostname": host, "ssl_handshake_timeout": connect_s}

    def linger(self, key: _Key, conn: Connection) -> None:
        """Pool `conn` once the chunked terminator that ends its stream has come, within `LINGER_S`;
        close it otherwise. A stream's reader stops at the stream's own end (`data: [DONE]`); the
        terminator often comes in the next segment (uvicorn, vLLM's server, writes it apart), and
        the connection was closed: most streams opened a new one, a TLS handshake for a hosted
        provider. Waited for in the background: the answer ends without it."""
        task = asyncio.get_running_loop().create_task(self._await_ending(key, conn))
        self._lingering.add(task)
        task.add_done_callback(self._lingering.discard)

    async def _await_ending(self, key: _Key, conn: Connection) -> None:
        pooled = False
        try:
            while (rest := bytes(conn.buffer)) not in _CHUNKED_ENDINGS:
                if not ending_begun(rest):
                    return  # more than the terminator (trailers, a server going on): closed
                await conn.more(LINGER_S)
            pooled = True
        except httpx.HTTPError:  # closed, reset, or no terminator in time
            pass
        finally:
            if pooled:
                conn.buffer.clear()
                self.release(key, conn)
            else:
                conn.close()

    async def aclose(self) -> None:
        self._dialer.close()
        for task in list(self._lingering):
            task.cancel()
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()


def ending_begun(rest: bytes) -> bool:
    """Whether `rest`, what a stream left after its end marker, is the chunked terminator so far."""
    return any(ending.startswith(rest) for ending in _CHUNKED_ENDINGS)


def key_of(url: httpx.URL) -> _Key:
    """The pool's key for `url`: its host, its port (80 or 443 when it names none), and whether
    it is `https://`. Any other scheme is not an upstream's (`ProviderConfig` takes these two)."""
    if url.scheme not in ("http", "https"):
        raise httpx.UnsupportedProtocol(f"unsupported upstream scheme {url.scheme!r}")
    tls = url.scheme == "https"
    return url.host, url.port or (443 if tls else 80), tls


def _encode(request: httpx.Request, body: bytes) -> bytes:
    lines = [request.method.encode(), b" ", request.url.raw_path, b" HTTP/1.1\r\n"]  # raw_path: percent-encoded
    for name, value in request.headers.raw:
        lines += (name, b": ", value, b"\r\n")
    return b"".join([*lines, b"\r\n", body])


async def _read_head(conn: Connection, head_s: float | None) -> ResponseHead:
    """The answer's head, read within `head_s` seconds; interim 1xx heads are skipped."""
    deadline = None if head_s is None else conn.loop.time() + head_s
    while True:
        while (end := conn.buffer.find(b"\r\n\r\n")) < 0:
            if len(conn.buffer) > _MAX_HEAD or conn.buffer.find(b"\n\n") >= 0:  # bare LFs: no CRLF end will come
                raise httpx.RemoteProtocolError("upstream response head too large or not ended by CRLF CRLF")
            await conn.more(None if deadline is None else max(0.0, deadline - conn.loop.time()))
        if end > _MAX_HEAD:
            raise httpx.RemoteProtocolError("upstream response head too large")
        head = ResponseHead(conn.buffer[: end + 4])
        del conn.buffer[: end + 4]
        if head.status >= 200:
            return head


class RawResponse:
    """An answer on the plain-HTTP path (status, raw headers, the body read once, as sent), with the
    surface of `httpx.Response` the adapter uses (`status_code`, `headers`, `aread`, `aiter_raw`, `aclose`)."""

    __slots__ = ("body", "raw_headers", "status_code")

    def __init__(self, status_code: int, raw_headers: list[tuple[bytes, bytes]], body: _Body) -> None:
        self.status_code = status_code
        self.raw_headers = raw_headers
        self.body = body

    @property
    def headers(self) -> dict[str, str]:
        """Header names lower-cased; a repeated header keeps its last value."""
        return {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in self.raw_headers}

    async def aread(self, deadline: float | None = None) -> bytes:  # the deadline: `_Body.read_all`
        return await self.body.read_all(deadline)

    def aiter_raw(self, deadline: float | None = None) -> AsyncIterator[bytes]:  # as `aread`'s
        self.body._deadline = deadline
        return self.body.__aiter__()

    async def aclose(self) -> None:
        await self.body.aclose()


class _Body(httpx.AsyncByteStream):
    """The response body, decoded from its framing; the connection goes back to the pool only
    when the body was read to its end and both sides keep the connection alive."""

    def __init__(
        self, owner: H1Transport, key: _Key, conn: Connection, head: ResponseHead, timeout: float | None, empty: bool
    ) -> None:
        self._owner, self._key, self._conn, self._timeout = owner, key, conn, timeout
        self._chunked = head.chunked and not empty
        self._length = 0 if empty else head.length
        # llhttp's answer: HTTP/1.0 rules, `Connection: close`, and a body that ends with the connection
        self._keep_alive = head.keep_alive
        self._done = False
        self._deadline: float | None = None  # the attempt's `total`, for every read
        self.ended = False  # the reader saw the stream's own end (`data: [DONE]`): only the terminator is left

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

    def _wait_s(self) -> float | None:
        """The read timeout, cut to what is left of `read_all`'s deadline (none left: ReadTimeout)."""
        if self._deadline is None:
            return self._timeout
        left = self._deadline - self._conn.loop.time()
        if left <= 0:
            raise httpx.ReadTimeout("upstream did not send its whole answer within the total timeout")
        return left if self._timeout is None else min(left, self._timeout)

    async def read_all(self, deadline: float | None = None) -> bytes:
        """The whole body, by the loop time `deadline` if given; a `Content-Length` body is one
        slice of the connection's buffer (one in the buffer already costs no timer)."""
        self._deadline = deadline
        length, conn = self._length, self._conn
        if self._chunked or length is None:
            parts, size = [], 0
            async for data in self:
                if (size := size + len(data)) > MAX_BODY_BYTES:
                    raise httpx.RemoteProtocolError("upstream answer too large")
                parts.append(data)
            return b"".join(parts)
        if length > MAX_BODY_BYTES:
            raise httpx.RemoteProtocolError("upstream answer too large")
        while len(conn.buffer) < length:
            await conn.more(self._wait_s())
        data = bytes(conn.buffer[:length])
        del conn.buffer[:length]
        self._done = True
        return data

    async def _sized(self, remaining: int) -> AsyncIterator[bytes]:
        conn = self._conn
        while remaining:
            if not conn.buffer:
                await conn.more(self._wait_s())
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
                await conn.more(self._wait_s())

    async def _chunks(self) -> AsyncIterator[bytes]:
        """Chunk data as it comes. The CRLF that ends a chunk is matched with the next size line
        (`_NEXT_CHUNK_LINE`), so a chunk longer than its size fails there, at no cost per chunk."""
        conn = self._conn
        pattern, skip = _CHUNK_LINE, 0
        while True:
            while (line := pattern.match(conn.buffer)) is None:
                if conn.buffer.find(b"\n", skip) >= 0 or len(conn.buffer) > _MAX_CHUNK_LINE:
                    raise httpx.RemoteProtocolError("malformed chunked body from upstream")
                await conn.more(self._wait_s())
            size = int(line[1], 16)
            del conn.buffer[: line.end()]
            if size == 0:
                await self._trailers()
                return
            async for data in self._sized(size):
                yield data
            pattern, skip = _NEXT_CHUNK_LINE, 2

    async def _trailers(self) -> None:
        """Skip the trailer fields, then the blank line that ends the body."""
        conn = self._conn
        while (end := conn.buffer.find(b"\r\n")) != 0:
            if end > 0:
                del conn.buffer[: end + 2]
            elif len(conn.buffer) > _MAX_HEAD:
                raise httpx.RemoteProtocolError("upstream chunked trailers too large")
            else:
                await conn.more(self._wait_s())
        del conn.buffer[:2]

    def _lingers(self) -> bool:
        conn = self._conn
        alive = self._keep_alive and not conn.closed and not conn.eof
        return alive and self._chunked and self.ended and not self._done and ending_begun(bytes(conn.buffer))

    async def aclose(self) -> None:
        conn = self._conn
        if not self._done and self._chunked and bytes(conn.buffer) in _CHUNKED_ENDINGS:
            # The reader stopped at the stream's own end marker (`data: [DONE]`) and the chunked
            # terminator is already here: the body is complete, the connection reusable.
            conn.buffer.clear()
            self._done = True
        elif self._lingers():  # the terminator is on its way (`H1Transport.linger`)
            self._owner.linger(self._key, conn)
            return
        if self._done and self._keep_alive and not conn.closed and not conn.eof and not conn.buffer:
            self._owner.release(self._key, conn)
        else:
            conn.close()
