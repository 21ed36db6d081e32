"""One configured provider, reached over HTTP: request out, canonical events back.

`Provider` is the one provider class and `batches` (or `events`, one at a time) its one streaming
method; every kind of provider is this class with different `ProviderConfig` data (the module's
other class, `UpstreamClient`, is the process-wide HTTP client all providers share). It joins the
pure pieces (`build_body` and the request's `Dialect`: chat or text completions, `SSEParser`,
`classify_*`) to one HTTP exchange.

One path, one seam. Every completion goes out through `Provider._send` to `H1Transport.exchange`
(plain HTTP or TLS, `providers.transport`) with a request head encoded once here (only
`content-length` and the body change per request). The whole exchange (send, body reads, close)
runs inside one `upstream_errors()` block, the only place a library's or a socket's exception
becomes an `UpstreamError` (providers/errors.py draws the tree); nothing in between catches one.
Probes go through httpx's client to the same transport, in the same block, and answer False/None
instead of raising.

Timeouts: `connect` (the TLS handshake included), then the whole head within min(`first_byte`,
`total`), then each body read within `idle` (a stream: the gap between chunks) or `first_byte` (a
whole answer, which comes after the generation), each read's wait cut to what is left of `total`;
a stream that stalls, or an error body that never ends, fails at `total`, not at the end of an
`idle` or `first_byte` wait longer than it. The transport keeps them on coarse timers
(`providers.timers`), with no asyncio deadline per request.

Closing the `events` generator (`aclose`, or a client that went away) closes the upstream response
at once, and with it the connection: the transport never returns a half-read connection to its
pool, nor one whose answer was malformed.

`make_client` builds the shared client: httpx's `AsyncClient` (for probes) over `H1Transport`, with
no retries and no proxy from the environment: the app's failover loop is the only retry. Its
`ssl_context` replaces the default certificate verification (certifi's CAs, as httpx) with another, e.g.
one that trusts a private CA; verification is never switched off.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import httpx
import msgspec

from providers.config import ProviderConfig
from providers.dialect import DIALECTS, Dialect, build_body
from providers.dialing import Lookup
from providers.errors import Failure, UpstreamError, classify_response, transport_error, upstream_errors
from providers.events import Event
from providers.model_prices import listed_ids
from providers.openai_stream import OpenAIStreamParser
from providers.server_metrics import queue_depth as server_queue_depth
from providers.sse import EventTooLarge, SSEParser
from providers.transport import H1Transport, RawResponse, key_of
from providers.types import AnyRequest

_ERROR_BODY_LIMIT = 64 * 1024
_JOIN_BELOW = 64 * 1024  # a request body this small leaves in one buffer with its head (`_send`)
_PROBE_READ_TIMEOUT = 10.0
PROBE_BODY_MAX = 16 << 20  # a probe's answer (`/health`, `/models` with prices, `/metrics`) past this is malformed
USER_AGENT = "switchyard"
FAILED_GRACE_S = 1.0  # after a failed finish, how long its usage chunk is waited for (`_after_failed_finish`)


class UpstreamClient(httpx.AsyncClient):
    """httpx's client over `H1Transport`, which completions call directly (`Provider._send`)."""

    def __init__(self, transport: H1Transport) -> None:
        super().__init__(transport=transport, trust_env=False)
        self.transport = transport


def make_client(*, ssl_context: ssl.SSLContext | None = None, lookup: Lookup | None = None) -> UpstreamClient:
    """The process-wide upstream client; build it in the app's lifespan and `aclose` it there.
    `ssl_context` verifies https upstreams instead of the default context (certifi's CAs, as httpx);
    `lookup` resolves host names instead of `getaddrinfo` (`providers.dialing`)."""
    return UpstreamClient(H1Transport(ssl_context, lookup))


class Provider:
    """A configured upstream: `events` runs one completion attempt against it, `probe` and
    `queue_depth` ask it how it is."""

    def __init__(self, config: ProviderConfig, client: UpstreamClient) -> None:
        self.config = config
        self._client = client
        base = config.base_url.rstrip("/")
        self._transport = client.transport
        self._key = key_of(httpx.URL(f"{base}/chat/completions"))
        self._models_url = f"{base}/models"
        self._root = base.removesuffix("/v1")
        # a User-Agent (some front ends refuse a request without one; a provider's `headers` may set
        # another), JSON out, and no content coding back: a coded answer is malformed (README)
        headers = {"user-agent": USER_AGENT, **{name.lower(): value for name, value in config.headers.items()}}
        headers.update({"content-type": "application/json", "accept-encoding": "identity"})
        if config.api_key:
            headers["authorization"] = f"Bearer {config.api_key}"
        self._probe_headers = {key: value for key, value in headers.items() if key != "content-type"}
        json_headers = httpx.Headers({**headers, "accept": "application/json"})
        stream_headers = httpx.Headers({**headers, "accept": "text/event-stream"})
        # Per dialect path: the request heads (JSON, stream), encoded once.
        self._routes: dict[str, tuple[bytes, bytes]] = {}
        for dialect in DIALECTS:
            url = httpx.URL(f"{base}{dialect.path}")
            self._routes[dialect.path] = _request_head(url, json_headers), _request_head(url, stream_headers)
        self._head_s = min(config.timeouts.first_byte, config.timeouts.total)

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
                    parser = dialect.stream_parser(self.config.api_key)
                    batches_of = _stream_batches(response, loop, deadline, parser)
                    async with contextlib.aclosing(batches_of) as batches:
                        async for batch in batches:
                            yield batch
                else:
                    whole = await response.aread(deadline)  # its reads keep `total`: no coroutine more
                    parser = dialect.stream_parser(self.config.api_key)
                    try:
                        try:
                            events = parser.parse_whole(whole)
                        except UpstreamError:
                            if not _event_stream(response):
                                raise
                            parser = dialect.stream_parser(self.config.api_key)
                            events = _whole_stream(whole, parser)
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

    async def _send(self, dialect: Dialect, body: bytes, stream: bool) -> RawResponse:
        """The request out, the answer's head back: the one path to the upstream, with its bounds
        (module doc) kept by the transport's own timers."""
        json_head, stream_head = self._routes[dialect.path]
        timeouts = self.config.timeouts
        head = stream_head if stream else json_head
        if len(body) < _JOIN_BELOW:  # one buffer, head and body; a large body is not copied behind its head
            payload, body = b"%s%d\r\n\r\n%s" % (head, len(body), body), b""
        else:
            payload = b"%s%d\r\n\r\n" % (head, len(body))
        return await self._transport.exchange(
            self._key,
            payload,
            connect_s=timeouts.connect,
            head_s=self._head_s,
            read_s=timeouts.idle if stream else timeouts.first_byte,
            body=body,
        )

    async def probe(self, *, keyed: bool = False) -> bool:
        """Is the upstream answering? (`probe_failure` is None.)"""
        return await self.probe_failure(keyed=keyed) is None

    async def probe_failure(self, *, keyed: bool = False) -> str | None:
        """None when the upstream is up; else why not (`probe_report`)."""
        return (await self.probe_report(keyed=keyed))[0]

    async def probe_report(self, *, keyed: bool = False) -> tuple[str | None, frozenset[str] | None]:
        """(None when the upstream is up, else why not, the models it lists, when it says).

        Why not: its status (`503`), the class of the error that kept it from answering
        (`ConnectionRefusedError`, `TimeoutError`: each GET has `_PROBE_READ_TIMEOUT` in all, a
        trickling body too), `malformed response`, or `local`: the gateway itself could not
        connect for want of descriptors (`Failure.LOCAL`), which says nothing of the upstream.
        `health_path` other than `/models` is tried on the server root first (vLLM's `/health`);
        `{base_url}/models` is the fallback only for a server without such a route (404, 405, 501:
        Ollama). Any other answer, and no answer, is the server's own word that it is not up
        (providers.md: "`/health` is 200 when up"; llama.cpp answers 503 while it loads the model,
        vLLM 500 once its engine died, and a wedged engine's `/health` hangs while `/models` still
        answers). `keyed`: only
        `{base_url}/models`, with the key, answers — the probe of a provider disabled for its key
        (a vLLM started with `--api-key` answers `/health` to anyone).

        The models: fastrun's and primalabs' `/models` list what can serve right now / what the
        key may use (providers.md), so their ids are read (`data[].id`); a list that is not one is
        a malformed answer, an empty one says nothing. Other kinds: None."""
        health_path = self.config.wire.health_path
        if not keyed and health_path != "/models":
            answer = await self._get(f"{self._root}{health_path}")
            if isinstance(answer, str) or answer.status_code not in _NO_HEALTH_ROUTE:
                return _failure(answer), None
        answer = await self._get(self._models_url)
        if isinstance(answer, str) or answer.status_code != 200:
            return _failure(answer), None
        if self.config.kind not in _LISTING_KINDS:
            return None, None
        try:
            return None, listed_ids(answer.content) or None
        except msgspec.DecodeError:  # not JSON, or not a list (`ValidationError` is one)
            return "malformed response", None

    async def model_list(self) -> bytes:
        """`{base_url}/models` with the key, as the provider sent it (`switchyard catalog import`);
        `OSError` saying why when it could not be had."""
        answer = await self._get(self._models_url)
        if isinstance(answer, str):
            raise OSError(f"cannot reach {self.config.name}: {answer}")
        if answer.status_code != 200:
            raise OSError(f"{self.config.name} answered {answer.status_code} to GET {self._models_url}")
        return answer.content

    async def queue_depth(self) -> float | None:
        """The server's own queue from `{root}/metrics` (vLLM, SGLang); None when it has none."""
        response = await self._get(f"{self._root}/metrics")
        if isinstance(response, str) or response.status_code != 200:
            return None
        return server_queue_depth(response.text)

    async def _get(self, url: str) -> httpx.Response | str:
        """A probe's GET, its body read (`PROBE_BODY_MAX` at most: one that never ended filled the
        memory); or why the upstream could not be reached (the class of the transport's error)."""
        timeout = httpx.Timeout(_PROBE_READ_TIMEOUT, connect=self.config.timeouts.connect)
        try:
            async with asyncio.timeout(_PROBE_READ_TIMEOUT):  # the whole answer: a body may trickle
                with upstream_errors():
                    async with self._client.stream("GET", url, headers=self._probe_headers, timeout=timeout) as got:
                        body = bytearray()
                        async for data in got.aiter_raw():
                            if len(body) + len(data) > PROBE_BODY_MAX:
                                raise httpx.RemoteProtocolError("probe answer too large")
                            body += data
                        return httpx.Response(got.status_code, headers=got.headers, content=bytes(body))
        except UpstreamError as exc:  # the innermost cause (`ConnectionRefusedError`); `local`: the gateway's own
            return exc.kind.value if exc.kind is Failure.LOCAL else transport_error(exc) or exc.kind.value
        except TimeoutError:
            return "TimeoutError"


def _failure(answer: httpx.Response | str) -> str | None:
    """Why a probe's GET says the upstream is not up (`_get`'s transport cause, or the status); None for a 200."""
    if isinstance(answer, str):
        return answer
    return None if answer.status_code == 200 else str(answer.status_code)


_NO_HEALTH_ROUTE = frozenset({404, 405, 501})
_LISTING_KINDS = frozenset({"fastrun", "primalabs"})  # whose `/models` is what can serve (providers.md)


def _request_head(url: httpx.URL, headers: httpx.Headers) -> bytes:
    """`POST` request line and headers up to an open `content-length: ` (the body's length follows)."""
    lines = [b"POST ", url.raw_path, b" HTTP/1.1\r\nhost: ", url.netloc, b"\r\n"]
    for name, value in headers.raw:
        lines += (name, b": ", value, b"\r\n")
    lines.append(b"content-length: ")
    return b"".join(lines)


async def _stream_batches(
    response: RawResponse, loop: asyncio.AbstractEventLoop, deadline: float, parser: OpenAIStreamParser[Any]
) -> AsyncGenerator[list[Event], None]:
    """One list of events per body read that completed any (`Provider.batches`); none past `deadline`."""
    sse = SSEParser()
    batch: list[Event] = []  # empty at every await: the events of one read are handed out first
    reads = response.aiter_raw(deadline)
    try:
        try:
            async for data in reads:
                _check_deadline(loop, deadline)
                try:
                    payloads = sse.feed(data)
                except EventTooLarge as exc:
                    raise httpx.RemoteProtocolError(str(exc)) from exc
                for payload in payloads:
                    batch += parser.feed(payload)
                    if payload == "[DONE]":
                        response.body.ended = True  # the connection may wait for its terminator (`linger`)
                        return
                if batch:
                    ready, batch = batch, []
                    yield ready
                if parser.failed:
                    await _after_failed_finish(reads, sse, parser, min(FAILED_GRACE_S, deadline - loop.time()))
                    break
        except httpx.TimeoutException:
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


def _event_stream(response: RawResponse | httpx.Response) -> bool:
    """The answer is an event stream: `transformers serve` (4.5x) streams `/chat/completions`
    whatever `stream` said; read as JSON, a valid answer was a malformed one (502, and a cool-down).
    Asked only of a whole answer that is no JSON answer (`Provider.batches`): the headers' dict is
    made per call, and a JSON answer labelled so is read as the JSON it is."""
    return response.headers.get("content-type", "").lstrip().lower().startswith("text/event-stream")


def _whole_stream(whole: bytes, parser: OpenAIStreamParser[Any]) -> list[Event]:
    """The events of an event stream read whole (`_event_stream`), as `_stream_batches` makes them."""
    sse = SSEParser()
    try:
        payloads = [*sse.feed(whole), *sse.finish()]
    except EventTooLarge as exc:
        raise httpx.RemoteProtocolError(str(exc)) from exc
    events: list[Event] = []
    for payload in payloads:
        events += parser.feed(payload)
        if payload == "[DONE]":
            break
    return events + parser.finish()


def _check_deadline(loop: asyncio.AbstractEventLoop, deadline: float) -> None:
    if loop.time() > deadline:
        raise UpstreamError(Failure.TIMEOUT, "upstream timed out")


async def _error_body(response: RawResponse, deadline: float) -> bytes:
    """At most `_ERROR_BODY_LIMIT` bytes of an error answer, read by `deadline`; a body that breaks
    off or is late is just short (the status and headers still classify it)."""
    body = bytearray()
    with contextlib.suppress(UpstreamError), upstream_errors():
        async for data in response.aiter_raw(deadline):
            body += data
            if len(body) >= _ERROR_BODY_LIMIT:
                break
    return bytes(body)
