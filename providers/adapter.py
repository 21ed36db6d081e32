"""One configured provider, reached over HTTP: request out, canonical events back.

`Provider` is the one provider class and `batches` (or `events`, one at a time) its one streaming
method; every kind of provider is this class with different `ProviderConfig` data (the module's
other class, `UpstreamClient`, is the process-wide HTTP client all providers share). It joins the
pure pieces (`build_body` and the request's `Dialect`: chat or text completions, `SSEParser`,
`classify_*`) to one HTTP exchange.

One path, one seam. Every completion goes out through `Provider._send`, which picks the
transport once per provider: a plain-`http://` upstream (a local server, the mock) goes straight
to `H1Transport.exchange` with a request head encoded once here (only `content-length` and the
body change per request); an `https://` upstream goes through httpx and its aiohttp transport.
Whatever answered, the whole exchange (send, body reads, close) runs inside one
`upstream_errors()` block, the only place a library's or a socket's exception becomes an
`UpstreamError` (providers/errors.py draws the tree); nothing in between catches one. Probes use
the same block and answer False/None instead of raising.

Timeouts. httpx-aiohttp hands httpx's `read` timeout to aiohttp as one socket-read timeout that
covers the header wait and every body read, fixed when the request is sent. A whole answer comes
after the generation, so its read timeout is `first_byte`; a streamed answer's headers come at once
and what matters is the gap between chunks, so its read timeout is `idle`. On the https path the
header wait is also bounded by one deadline (`first_byte`, never spanning a `yield`); the
plain-HTTP transport keeps the same bounds with its own; both on coarse timers (`providers.timers`).
`total` bounds every read too: the plain-HTTP transport cuts each read's wait to what is left of it
(one subtraction, no timer of its own), the https path bounds each read with a deadline (~5 µs, on
the path to hosted upstreams only); a stream that stalls, or an error body that never ends, fails
at `total`, not at the end of an `idle` or `first_byte` wait longer than it.

Closing the `events` generator (`aclose`, or a client that went away) closes the upstream response
at once, and with it the connection: neither transport returns a half-read connection to its pool,
nor one whose answer was malformed.

`make_client` builds the shared client: `H1Transport` over `httpx_aiohttp.AiohttpTransport`
(measured ~3x faster than httpx's own transport here), with no retries and no proxy from the
environment: the app's failover loop is the only retry. Its `ssl_context` replaces the default
certificate verification (the system's CAs) with another, e.g. one that trusts a private CA;
verification is never switched off.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import httpx
from httpx_aiohttp import AiohttpTransport

from providers.config import ProviderConfig
from providers.dialect import DIALECTS, Dialect, build_body
from providers.errors import Failure, UpstreamError, classify_response, transport_error, upstream_errors
from providers.events import Event
from providers.openai_stream import OpenAIStreamParser
from providers.server_metrics import queue_depth as server_queue_depth
from providers.sse import SSEParser
from providers.timers import deadline_at
from providers.transport import H1Transport, RawResponse
from providers.types import AnyRequest

_ERROR_BODY_LIMIT = 64 * 1024
_PROBE_READ_TIMEOUT = 10.0
FAILED_GRACE_S = 1.0  # after a failed finish, how long its usage chunk is waited for (`_after_failed_finish`)


class UpstreamClient(httpx.AsyncClient):
    """httpx's client over `H1Transport` (aiohttp behind it for https), plus `send_direct`: one
    request straight through the transport, without the client's per-request layers (auth flow,
    redirects, cookie jar, URL merging) that an upstream call never uses. Those layers cost about
    a quarter of the gateway's CPU per request under load (py-spy, bench/RESULTS.md)."""

    def __init__(self, transport: httpx.AsyncBaseTransport) -> None:
        super().__init__(transport=transport, trust_env=False)
        self.transport = transport

    async def send_direct(self, request: httpx.Request) -> httpx.Response:
        return await self.transport.handle_async_request(request)


def make_client(max_connections: int = 1000, *, ssl_context: ssl.SSLContext | None = None) -> UpstreamClient:
    """The process-wide upstream client; build it in the app's lifespan and `aclose` it there.
    `ssl_context` verifies https upstreams instead of the default context (the system's CAs)."""
    limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
    verify: ssl.SSLContext | bool = True if ssl_context is None else ssl_context
    return UpstreamClient(H1Transport(fallback=AiohttpTransport(verify=verify, limits=limits, retries=0)))


Answer = httpx.Response | RawResponse


class Provider:
    """A configured upstream: `events` runs one completion attempt against it, `probe` and
    `queue_depth` ask it how it is."""

    def __init__(self, config: ProviderConfig, client: UpstreamClient) -> None:
        self.config = config
        self._client = client
        base = config.base_url.rstrip("/")
        chat_url = httpx.URL(f"{base}/chat/completions")
        transport = client.transport
        self._h1 = transport if chat_url.scheme == "http" and isinstance(transport, H1Transport) else None
        self._h1_key = (chat_url.host, chat_url.port or 80)
        self._models_url = f"{base}/models"
        self._root = base.removesuffix("/v1")
        headers = {**config.headers, "content-type": "application/json", "accept-encoding": "identity"}
        if config.api_key:
            headers["authorization"] = f"Bearer {config.api_key}"
        self._probe_headers = {key: value for key, value in headers.items() if key != "content-type"}
        self._json_headers = httpx.Headers({**headers, "accept": "application/json"})
        self._stream_headers = httpx.Headers({**headers, "accept": "text/event-stream"})
        # Per dialect path: its URL and the request heads (JSON, stream), encoded once.
        self._routes: dict[str, tuple[httpx.URL, bytes, bytes]] = {}
        for dialect in DIALECTS:
            url = httpx.URL(f"{base}{dialect.path}")
            heads = _request_head(url, self._json_headers), _request_head(url, self._stream_headers)
            self._routes[dialect.path] = (url, *heads)
        timeouts = config.timeouts
        self._head_s = min(timeouts.first_byte, timeouts.total)
        self._json_timeout = {"connect": timeouts.connect, "read": timeouts.first_byte, "write": None, "pool": None}
        # An https stream's client read timeout also bounds its head, so it is `first_byte` at least,
        # and each body read is held to `idle` by a deadline of its own (`_bounded`) when that
        # is shorter; the plain-HTTP transport keeps the two bounds apart itself.
        read_s = max(timeouts.idle, timeouts.first_byte)
        self._stream_timeout = {"connect": timeouts.connect, "read": read_s, "write": None, "pool": None}
        self._idle_s = timeouts.idle if self._h1 is None and timeouts.idle < read_s else None

    async def events(self, req: AnyRequest, upstream_model: str, *, stream: bool) -> AsyncGenerator[Event, None]:
        """The events of one attempt, one at a time (`batches`, flattened)."""
        async with contextlib.aclosing(self.batches(req, upstream_model, stream=stream)) as batches:
            async for batch in batches:
                for event in batch:
                    yield event

    async def batches(self, req: AnyRequest, upstream_model: str, *, stream: bool) -> AsyncGenerator[list[Event], None]:
        """The events of one attempt, in batches: a streamed answer's per body read (every event
        that read completed, never an empty list), a whole answer's at once. Raises `UpstreamError`
        for every failure, including a stream that ends without a finish reason; the events a read
        completed before its failure come first, as a batch of their own.

        Batches, not single events, because each event handed up through the async generators
        between here and the response (this one, the pipeline's, the relay's pump) costs a
        suspension and a resumption at every level: per read, a 64-chunk answer that arrives in
        a few reads crosses them a few times instead of 70 (bench/RESULTS.md, 2026-12-02)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.timeouts.total
        dialect, body = build_body(req, upstream_model, self.config, stream=stream)
        with upstream_errors():
            response = await self._send(dialect, body, stream)
            try:
                if not 200 <= response.status_code < 300:
                    body = await _error_body(response, deadline)
                    raise classify_response(response.status_code, response.headers, body)
                if stream:
                    parser = dialect.stream_parser()
                    batches_of = _stream_batches(response, loop, deadline, parser, self._idle_s)
                    async with contextlib.aclosing(batches_of) as batches:
                        async for batch in batches:
                            yield batch
                else:
                    if isinstance(response, RawResponse):  # its reads keep `total`: no coroutine more per request
                        whole = await response.aread(deadline)
                    else:
                        whole = await _whole(response, deadline)
                    parser = dialect.stream_parser()
                    try:
                        events = parser.parse_whole(whole)
                    except UpstreamError:
                        billed = parser.unreported()  # a failed answer's usage: those tokens were billed
                        if billed:
                            yield billed
                        raise
                    yield events
            except UpstreamError as exc:  # an error answer, or an error chunk in a stream
                self._scrub(exc)
                raise
            finally:
                await response.aclose()

    def _scrub(self, error: UpstreamError) -> None:
        """`error` without this provider's key in its message: the upstream's own words go to the
        client for a request it refused (400, 404, 413, 422), and a server may quote the header it
        got ("bad key Bearer …"). Its `code`, which the log keeps, likewise. Error path only."""
        key, message = self.config.api_key, error.message
        if not key:
            return
        if error.code is not None and key in error.code:
            error.code = error.code.replace(key, "***")
        message = message.replace(key, "***")
        cut = next((n for n in range(len(key) - 1, 3, -1) if message.endswith(key[:n])), 0)  # the 2,000-character cut
        if cut:
            message = message[:-cut] + "***"
        if message != error.message:
            error.message = message
            error.args = (message,)

    async def _send(self, dialect: Dialect, body: bytes, stream: bool) -> Answer:
        """The request out, the answer's head back: the one path to the upstream.

        Both transports keep the same bounds: connect, then the whole head within
        min(first_byte, total), then each body read (`idle` when streaming, else `first_byte`).
        The plain-HTTP transport keeps them with its own timers (no asyncio deadline per request)."""
        url, json_head, stream_head = self._routes[dialect.path]
        if self._h1 is not None:
            timeouts = self.config.timeouts
            head = stream_head if stream else json_head
            return await self._h1.exchange(
                self._h1_key,
                b"%s%d\r\n\r\n%s" % (head, len(body), body),
                connect_s=timeouts.connect,
                head_s=self._head_s,
                read_s=timeouts.idle if stream else timeouts.first_byte,
            )
        request = httpx.Request(
            "POST",
            url,
            content=body,
            headers=self._stream_headers if stream else self._json_headers,
            extensions={"timeout": self._stream_timeout if stream else self._json_timeout},
        )
        async with deadline_at(asyncio.get_running_loop().time() + self._head_s):
            return await self._client.send_direct(request)

    async def probe(self, *, keyed: bool = False) -> bool:
        """Is the upstream answering? (`probe_failure` is None.)"""
        return await self.probe_failure(keyed=keyed) is None

    async def probe_failure(self, *, keyed: bool = False) -> str | None:
        """None when the upstream is up; else why not: its status (`503`), or the class of the
        error that kept it from answering (`ConnectionRefusedError`). `health_path` other than `/models` is
        tried on the server root first (vLLM's `/health`); `{base_url}/models` is the fallback, for
        a server that has no such route (404, 405, 501: Ollama) or could not be reached on it, and
        the hosted probe. Any other answer is the server's own word that it is not up
        (providers.md: "`/health` is 200 when up"; llama.cpp answers 503 while it loads the model,
        vLLM 500 once its engine died) even when `/models` answers. `keyed`: only
        `{base_url}/models`, with the key, answers — the probe of a provider disabled for its key
        (a vLLM started with `--api-key` answers `/health` to anyone)."""
        health_path = self.config.wire.health_path
        if not keyed and health_path != "/models":
            answer = await self._get(f"{self._root}{health_path}")
            if not isinstance(answer, str) and answer.status_code not in _NO_HEALTH_ROUTE:
                return _failure(answer)
        answer = await self._get(self._models_url)
        return answer if isinstance(answer, str) else _failure(answer)

    async def queue_depth(self) -> float | None:
        """The server's own queue from `{root}/metrics` (vLLM, SGLang); None when it has none."""
        response = await self._get(f"{self._root}/metrics")
        if isinstance(response, str) or response.status_code != 200:
            return None
        return server_queue_depth(response.text)

    async def _get(self, url: str) -> httpx.Response | str:
        """A probe's GET, its body read; or why the upstream could not be reached (the class of the
        transport's error)."""
        timeout = httpx.Timeout(_PROBE_READ_TIMEOUT, connect=self.config.timeouts.connect)
        try:
            with upstream_errors():
                return await self._client.get(url, headers=self._probe_headers, timeout=timeout)
        except UpstreamError as exc:
            return transport_error(exc) or exc.kind.value  # the innermost cause: https wraps all in ConnectTimeout


def _failure(response: httpx.Response) -> str | None:
    return None if response.status_code == 200 else str(response.status_code)


_NO_HEALTH_ROUTE = frozenset({404, 405, 501})


def _request_head(url: httpx.URL, headers: httpx.Headers) -> bytes:
    """`POST` request line and headers up to an open `content-length: ` (the body's length follows)."""
    lines = [b"POST ", url.raw_path, b" HTTP/1.1\r\nhost: ", url.netloc, b"\r\n"]
    for name, value in headers.raw:
        lines += (name, b": ", value, b"\r\n")
    lines.append(b"content-length: ")
    return b"".join(lines)


async def _stream_batches(
    response: Answer,
    loop: asyncio.AbstractEventLoop,
    deadline: float,
    parser: OpenAIStreamParser[Any],
    idle: float | None,
) -> AsyncGenerator[list[Event], None]:
    """One list of events per body read that completed any (`Provider.batches`); `idle`: the
    longest wait for each read, when the transport does not keep it; none past `deadline`."""
    sse = SSEParser()
    batch: list[Event] = []  # empty at every await: the events of one read are handed out first
    if isinstance(response, RawResponse):
        reads = response.aiter_raw(deadline)
    else:
        reads = _bounded(response.aiter_raw(), loop, idle, deadline)
    try:
        try:
            async for data in reads:
                _check_deadline(loop, deadline)
                for payload in sse.feed(data):
                    batch += parser.feed(payload)
                    if payload == "[DONE]":
                        return
                if batch:
                    ready, batch = batch, []
                    yield ready
                if parser.failed:
                    await _after_failed_finish(reads, sse, parser, min(FAILED_GRACE_S, deadline - loop.time()))
                    break
        except (TimeoutError, httpx.TimeoutException):
            if not parser.done:
                raise
            # the answer had finished, then nothing (no `[DONE]`, no EOF): it ends as at EOF, whole;
            # a 504 threw the whole answer away
        for payload in sse.finish():  # an event the stream ended inside (no blank line after it)
            try:
                batch += parser.feed(payload)
            except UpstreamError as exc:
                if not parser.done or exc.answered:  # an error the upstream sent is one
                    raise
                break  # cut short after the finish reason: not dispatched (as the SSE standard says)
        batch += parser.finish()
    except Exception:
        batch += parser.unreported()
        raise
    finally:
        if batch:  # the last events, or those a read completed before its failure (raised next)
            yield batch


async def _after_failed_finish(
    reads: AsyncIterator[bytes], sse: SSEParser, parser: OpenAIStreamParser[Any], within: float
) -> None:
    """The reads after an answer's failed finish (vLLM's `abort`, OpenRouter's `error`), `within`
    seconds at most: the usage chunk that follows it, then the end (`[DONE]` raises the failure).
    An upstream that went quiet after it held the attempt until its idle timeout (60 s by default,
    `total` with keep-alive comments), then failed it as a timeout, not as the failure it said."""
    with contextlib.suppress(TimeoutError, httpx.TransportError):  # idle past, reset: as the end
        async with asyncio.timeout(within):
            async for data in reads:
                for payload in sse.feed(data):
                    parser.feed(payload)


async def _bounded(
    reads: AsyncIterator[bytes], loop: asyncio.AbstractEventLoop, idle: float | None, deadline: float
) -> AsyncGenerator[bytes, None]:
    """`reads`, each within `idle` seconds (when given) and by `deadline` (a `TimeoutError`, which
    `upstream_errors` makes a timeout)."""
    while True:
        async with deadline_at(deadline if idle is None else min(loop.time() + idle, deadline)):
            try:
                data = await anext(reads)
            except StopAsyncIteration:
                return
        yield data


async def _whole(response: httpx.Response, deadline: float) -> bytes:
    """A non-streamed answer's body over https, in by `deadline` (the attempt's `total`; the
    plain-HTTP body keeps it with its own read timers: `RawResponse.aread`). Each read keeps its
    `first_byte` bound too, so without this an upstream trickling a byte per read would hold the
    attempt until the request's deadline, with no failover and no cool-down (a timeout is backend
    trouble: providers.md)."""
    async with deadline_at(deadline):
        return await response.aread()


def _check_deadline(loop: asyncio.AbstractEventLoop, deadline: float) -> None:
    if loop.time() > deadline:
        raise UpstreamError(Failure.TIMEOUT, "upstream timed out")


async def _error_body(response: Answer, deadline: float) -> bytes:
    """At most `_ERROR_BODY_LIMIT` bytes of an error answer, read by `deadline`; a body that breaks
    off or is late is just short (the status and headers still classify it)."""
    body = bytearray()
    with contextlib.suppress(UpstreamError), upstream_errors():
        reads = response.aiter_raw(deadline) if isinstance(response, RawResponse) else response.aiter_bytes()
        async with deadline_at(deadline):
            async for data in reads:
                body += data
                if len(body) >= _ERROR_BODY_LIMIT:
                    break
    return bytes(body)
