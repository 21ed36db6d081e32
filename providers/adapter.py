"""One configured provider, reached over HTTP: request out, canonical events back.

`Provider` is the only class here and `events` its one streaming method; every kind of provider
is this class with different `ProviderConfig` data. It joins the pure pieces (`build_body` and
the request's dialect, `SSEParser`, `classify_*`) to one HTTP exchange, and
wraps the HTTP client's exceptions once, here, into `UpstreamError`.

Timeouts. httpx-aiohttp hands httpx's `read` timeout to aiohttp as one socket-read timeout that
covers the header wait and every body read, fixed when the request is sent. A whole answer comes
after the generation, so its read timeout is `first_byte`; a streamed answer's headers come at once
and what matters is the gap between chunks, so its read timeout is `idle`. The header wait is also
bounded by one asyncio deadline (`first_byte`, never spanning a `yield`), and `total` is checked at
every read (no timer per chunk: a per-read asyncio timeout costs ~5 µs).

Closing the `events` generator (`aclose`, or a client that went away) closes the upstream response
at once, and with it the connection: aiohttp never returns a half-read connection to its pool.

`make_client` builds the shared `httpx.AsyncClient` over `httpx_aiohttp.AiohttpTransport`
(measured ~3x faster than httpx's own transport here), with no retries and no proxy from the
environment: the app's failover loop is the only retry.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from typing import Any

import httpx
from httpx_aiohttp import AiohttpTransport

from providers.config import ProviderConfig
from providers.dialect import DIALECTS, build_body
from providers.errors import Failure, UpstreamError, classify_response, classify_transport
from providers.events import Event
from providers.openai_stream import OpenAIStreamParser
from providers.server_metrics import queue_depth as server_queue_depth
from providers.sse import SSEParser
from providers.transport import H1Transport, RawResponse
from providers.types import AnyRequest

_ERROR_BODY_LIMIT = 64 * 1024
_PROBE_READ_TIMEOUT = 10.0
_TRANSPORT_ERRORS = (httpx.HTTPError, OSError, TimeoutError)


class UpstreamClient(httpx.AsyncClient):
    """httpx's client over the aiohttp transport, plus `send_direct`: one request straight through
    the transport, without the client's per-request layers (auth flow, redirects, cookie jar, URL
    merging) that an upstream call never uses. Those layers cost about a quarter of the gateway's
    CPU per request under load (py-spy, bench/RESULTS.md); the transport call is the same."""

    def __init__(self, transport: httpx.AsyncBaseTransport) -> None:
        super().__init__(transport=transport, trust_env=False)
        self.transport = transport

    async def send_direct(self, request: httpx.Request) -> httpx.Response:
        return await self.transport.handle_async_request(request)


def make_client(max_connections: int = 1000) -> UpstreamClient:
    """The process-wide upstream client; build it in the app's lifespan and `aclose` it there."""
    limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
    return UpstreamClient(H1Transport(fallback=AiohttpTransport(limits=limits, retries=0)))


Answer = httpx.Response | RawResponse


class Provider:
    """A configured upstream: `events` runs one completion attempt against it.

    A plain-`http://` upstream (a local server, the mock) is called through `H1Transport.exchange`
    with the request head encoded once here: only `content-length` and the body change per
    request. `https://` upstreams go through httpx and its aiohttp transport."""

    def __init__(self, config: ProviderConfig, client: UpstreamClient) -> None:
        self.config = config
        self._client = client
        base = config.base_url.rstrip("/")
        self._chat_url = httpx.URL(f"{base}/chat/completions")
        transport = client.transport
        self._h1 = transport if self._chat_url.scheme == "http" and isinstance(transport, H1Transport) else None
        self._h1_key = (self._chat_url.host, self._chat_url.port or 80)
        self._models_url = f"{base}/models"
        self._root = base.removesuffix("/v1")
        headers = {**config.headers, "content-type": "application/json"}
        if config.api_key:
            headers["authorization"] = f"Bearer {config.api_key}"
        self._probe_headers = {key: value for key, value in headers.items() if key != "content-type"}
        self._json_headers = httpx.Headers({**headers, "accept": "application/json"})
        self._stream_headers = httpx.Headers({**headers, "accept": "text/event-stream", "accept-encoding": "identity"})
        # endpoint path → (URL, JSON request head, streaming request head), one per dialect
        self._routes: dict[str, tuple[httpx.URL, bytes, bytes]] = {}
        for dialect in DIALECTS:
            url = httpx.URL(f"{base}{dialect.path}")
            self._routes[dialect.path] = (
                url,
                _request_head(url, self._json_headers),
                _request_head(url, self._stream_headers),
            )
        timeouts = config.timeouts
        self._json_timeout = {"connect": timeouts.connect, "read": timeouts.first_byte, "write": None, "pool": None}
        self._stream_timeout = {"connect": timeouts.connect, "read": timeouts.idle, "write": None, "pool": None}

    async def events(self, req: AnyRequest, upstream_model: str, *, stream: bool) -> AsyncGenerator[Event, None]:
        """The events of one attempt; raises `UpstreamError` for every failure, including a
        stream that ends without a finish reason. A chat request goes to `/chat/completions`, a
        raw-prompt one to `/completions` (`providers.dialect`)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.timeouts.total
        dialect, body = build_body(req, upstream_model, self.config, stream=stream)
        url, json_head, stream_head = self._routes[dialect.path]
        if self._h1 is not None:
            response: Answer = await self._send_h1(stream_head if stream else json_head, body, stream)
        else:
            response = await self._send(
                httpx.Request(
                    "POST",
                    url,
                    content=body,
                    headers=self._stream_headers if stream else self._json_headers,
                    extensions={"timeout": self._stream_timeout if stream else self._json_timeout},
                )
            )
        try:
            if not 200 <= response.status_code < 300:
                raise classify_response(response.status_code, response.headers, await _error_body(response))
            if stream:
                parser = dialect.stream_parser()
                async with contextlib.aclosing(_stream_events(response, loop, deadline, parser)) as events:
                    async for event in events:
                        yield event
            else:
                for event in dialect.parse_answer(await _read_body(response)):
                    yield event
        finally:
            await response.aclose()

    async def _send_h1(self, head: bytes, body: bytes, stream: bool) -> RawResponse:
        """The plain-HTTP path; the same timeouts as `_send`, kept by the transport's own timers
        (no asyncio deadline per request): connect, then the whole head within
        min(first_byte, total), then each body read (`idle` when streaming, else `first_byte`)."""
        assert self._h1 is not None
        timeouts = self.config.timeouts
        try:
            return await self._h1.exchange(
                self._h1_key,
                b"%s%d\r\n\r\n%s" % (head, len(body), body),
                connect_s=timeouts.connect,
                head_s=min(timeouts.first_byte, timeouts.total),
                read_s=timeouts.idle if stream else timeouts.first_byte,
            )
        except _TRANSPORT_ERRORS as exc:
            raise classify_transport(exc) from exc

    async def _send(self, request: httpx.Request) -> httpx.Response:
        timeouts = self.config.timeouts
        try:
            async with asyncio.timeout(min(timeouts.first_byte, timeouts.total)):
                return await self._client.send_direct(request)
        except _TRANSPORT_ERRORS as exc:
            raise classify_transport(exc) from exc

    async def probe(self) -> bool:
        """Is the upstream answering? `health_path` other than `/models` is tried on the server
        root first (vLLM's `/health`); `{base_url}/models` is the fallback and the hosted probe."""
        health_path = self.config.wire.health_path
        if health_path != "/models" and await self._probe_url(f"{self._root}{health_path}"):
            return True
        return await self._probe_url(self._models_url)

    async def queue_depth(self) -> float | None:
        """The server's own queue from `{root}/metrics` (vLLM, SGLang); None when it has none."""
        timeout = httpx.Timeout(_PROBE_READ_TIMEOUT, connect=self.config.timeouts.connect)
        try:
            response = await self._client.get(f"{self._root}/metrics", headers=self._probe_headers, timeout=timeout)
        except _TRANSPORT_ERRORS:
            return None
        if response.status_code != 200:
            return None
        return server_queue_depth(response.text)

    async def _probe_url(self, url: str) -> bool:
        timeout = httpx.Timeout(_PROBE_READ_TIMEOUT, connect=self.config.timeouts.connect)
        try:
            response = await self._client.get(url, headers=self._probe_headers, timeout=timeout)
        except _TRANSPORT_ERRORS:
            return False
        return response.status_code == 200


def _request_head(url: httpx.URL, headers: httpx.Headers) -> bytes:
    """`POST` request line and headers up to an open `content-length: ` (the body's length follows)."""
    lines = [b"POST ", url.raw_path, b" HTTP/1.1\r\nhost: ", url.netloc, b"\r\n"]
    for name, value in headers.raw:
        lines += (name, b": ", value, b"\r\n")
    lines.append(b"content-length: ")
    return b"".join(lines)


async def _stream_events(
    response: Answer, loop: asyncio.AbstractEventLoop, deadline: float, parser: OpenAIStreamParser[Any]
) -> AsyncGenerator[Event, None]:
    sse = SSEParser()
    try:
        async for data in response.aiter_raw():
            if loop.time() > deadline:
                raise UpstreamError(Failure.TIMEOUT, "upstream timed out")
            for payload in sse.feed(data):
                for event in parser.feed(payload):
                    yield event
                if payload == "[DONE]":
                    return
    except _TRANSPORT_ERRORS as exc:
        raise classify_transport(exc) from exc
    for payload in sse.finish():
        for event in parser.feed(payload):
            yield event
    for event in parser.finish():
        yield event


async def _read_body(response: Answer) -> bytes:
    try:
        return await response.aread()
    except _TRANSPORT_ERRORS as exc:
        raise classify_transport(exc) from exc


async def _error_body(response: Answer) -> bytes:
    """At most `_ERROR_BODY_LIMIT` bytes of an error answer; a body that breaks off is just short."""
    body = bytearray()
    try:
        async for data in response.aiter_bytes():
            body += data
            if len(body) >= _ERROR_BODY_LIMIT:
                break
    except _TRANSPORT_ERRORS:
        pass
    return bytes(body)
