"""ASGI plumbing shared by every ingress: the body, the request id, the disconnect watch, sending.

The completion ingresses are raw ASGI routes (`@asgi`): Litestar's handler machinery (signature
model, dependency resolution, response objects) cost about a sixth of a proxied request's CPU
(py-spy, bench/RESULTS.md), and these endpoints need none of it. Each ingress module translates
its request into a `CompletionRequest`, hands it to the pipeline and renders what comes back;
everything about ASGI itself is here, once.

Unrecordable requests. A request whose ledger row could not be journaled is refused before
routing with 503 `unavailable` (`usage cannot be recorded`, cost.md), decided here once for every
door: `Service.recording` is false while the journal cannot be written and `[ledger] required`
holds. The check is per request, not per row, so a request already running when the journal
breaks is still answered; its row is kept in memory (`catalog.ledger`).

Disconnects. A client that goes away must cancel its upstream request (api.md), whether it waits
for a JSON answer or reads a stream, before the first token too. `DisconnectWatch` awaits
`http.disconnect` and cancels the handler's task; the cancellation lands in the pipeline, which
closes the upstream connection and records the request as `cancelled`. The watch starts
about `WATCH_AFTER_S` after the body was read (one sweeping timer for all requests, `_Sweeper`):
most answers from a local server take less, and a watcher task per request would cost more than
the sweep (the server keeps the disconnect, so a client gone before the watch starts is seen at
once when it does).

API keys. With `[auth] mode = "keys"` every door authenticates here, once its body is read (an
unread body would keep the connection busy) and before it is translated: a 401 costs no parsing.
The key becomes the context's `Principal`; its `x-ratelimit-*` headers come back from the pipeline
on the `Outcome` (JSON) or, for streams, on the `StreamHead` the pipeline fills once the request
is admitted (`relay.head.headers`, read when the response starts), and on errors.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any, Protocol

from litestar.types import Receive, Scope, Send

from app.access.keyring import Entry
from app.context import ANONYMOUS, Ingress, RequestContext, new_context
from app.edge.connection import declared_length
from app.edge.cycle import write_head
from app.edge.direct import RESPONSE_STARTED
from app.edge.guards import check_json_headers
from app.edge.relay import Relay, StreamRenderer
from app.errors import (
    AuthenticationFailed,
    DeclaredTooLarge,
    GatewayError,
    InvalidRequest,
    LimitsUnavailable,
    MethodNotAllowed,
    PayloadTooLarge,
    UsageNotRecordable,
    too_large,
)
from app.ids import uuid7
from app.pipeline.events import Outcome, RateHeaders, header_pairs, header_texts
from app.service import Service
from providers.types import AnyRequest

WATCH_AFTER_S = 0.05
JSON_HEADERS = [(b"content-type", b"application/json")]
SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


class Door(Protocol):
    """One request through one front door, its body translated: what the door asks of the
    pipeline (`request`, `stream`) and how it answers (the JSON body, or a stream renderer)."""

    @property
    def request(self) -> AnyRequest: ...

    @property
    def stream(self) -> bool: ...

    @property
    def id_header(self) -> bytes | None:
        """A second header carrying the request id, as the door's own API names it."""

    @property
    def renames(self) -> dict[str, str] | None:
        """Fields the pipeline's 400s name that this request spelt otherwise (the chat door's
        `max_completion_tokens`, which the canonical request calls `max_tokens`; its `system`, a
        message there); None: none."""

    def answer(self, ctx: RequestContext, outcome: Outcome) -> bytes: ...

    def renderer(self, ctx: RequestContext) -> StreamRenderer: ...


async def serve(
    scope: Scope, receive: Receive, send: Send, ingress: Ingress, translate: Callable[[bytes, Service], Door]
) -> None:
    """A completion through one front door, from the request's bytes to the last byte of its
    answer: the same for every door but `translate` (body → `Door`) and what the `Door` renders."""
    request_id = begin(scope)
    service: Service = scope["litestar_app"].state["service"]  # by key: `.service` raises and catches (0.4 µs)
    assert service.pipeline is not None
    principal, entry = ANONYMOUS, None
    if service.access is not None:  # the key first: without one, a 401 whatever the body (access.md)
        entry = service.access.keyring.authenticate(scope["headers"])
        principal = entry.principal
    try:
        check_json_headers(scope["headers"])
        body = await read_body(receive, service.settings.server.max_body_bytes, scope["headers"])
    except GatewayError as exc:  # a 415 or a 413, with the key's window
        raise await _windowed(exc, entry, service) from None
    if body is None:
        return  # the client went away before sending its body: nobody to answer
    try:
        door = translate(body, service)
    except GatewayError as exc:
        raise await _windowed(exc, entry, service) from None
    if not service.recording:
        raise await _windowed(UsageNotRecordable("usage cannot be recorded"), entry, service)
    deadline = asyncio.get_running_loop().time() + service.settings.routing.request_deadline_s
    ctx = new_context(request_id, ingress, stream=door.stream, deadline=deadline, principal=principal)
    own = () if door.id_header is None else ((door.id_header, request_id.encode()),)  # the door's own id header
    mark_routed(scope)
    try:
        with DisconnectWatch(receive) as watch:
            if not ctx.stream:
                outcome = await service.pipeline.complete(ctx, door.request)
                watch.stop()
                payload = door.answer(ctx, outcome)
                scope["state"][RESPONSE_STARTED] = True
                await send_json(send, payload, request_id, extra=own, made=outcome.headers)
                return
            head, events = service.pipeline.stream(ctx, door.request)
            relay = Relay(events, door.renderer(ctx), service.settings.server.sse_keepalive_s, head)
            await send_stream(relay, send, request_id, watch, scope["state"], own)
    except GatewayError as exc:
        renames = door.renames
        if isinstance(exc, InvalidRequest) and renames is not None and exc.param in renames:
            raise await _windowed(exc.renamed(renames[exc.param]), entry, service) from None
        raise await _windowed(exc, entry, service)  # noqa: B904 (the same exception, its traceback kept)


async def _windowed(exc: GatewayError, entry: Entry | None, service: Service) -> GatewayError:
    """`exc` with the window headers of a key with `rpm` or `tpm` (access.md: every response),
    when it has none: a refusal before the request's admission (a 400 naming a field, a 403 for a
    model the key may not use); an admitted request's errors carry its admission's."""
    no_window = isinstance(exc, LimitsUnavailable | AuthenticationFailed)  # no window to read, or no key
    if entry is not None and exc.extra_headers is None and not no_window:
        assert service.access is not None
        headers = await service.access.window_headers(entry)  # b"" for a key without a window
        if headers:
            exc.extra_headers = header_texts(headers)
    return exc


def begin(scope: Scope, methods: tuple[str, ...] = ("POST",)) -> str:
    """A new request id, kept in the scope's state for the error renderer; 405 (with `Allow`) for
    other methods."""
    request_id = uuid7()
    state: dict[str, Any] = scope.setdefault("state", {})
    state["request_id"] = request_id
    if scope.get("method") not in methods:
        raise MethodNotAllowed("method not allowed", allow=", ".join(methods))
    return request_id


def mark_routed(scope: Scope) -> None:
    """From here on the pipeline accounts for the request (its ledger row and log line)."""
    scope["state"]["routed"] = True


async def read_body(receive: Receive, limit: int, headers: Iterable[tuple[bytes, bytes]]) -> bytes | None:
    """The whole body, or None when the client went away before sending it.

    A body declared over `limit` is refused once its first piece is in, not after `limit` bytes
    (nor, from a client that sends a few and then nothing, at the body deadline as a 408). That
    413 (`DeclaredTooLarge`) keeps the connection, which reads the rest and drops it for at most
    `app.edge.connection.DRAIN_S`, so a client still writing gets its answer instead of a reset
    (closing on unread data sends one). Looked at only for a body in pieces: the usual request
    arrives in one read. (A declared body of which nothing has arrived is not seen here: it meets
    the body deadline.)"""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(too_large(limit))
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
        if len(chunks) == 1 and declared_length(headers) > limit:
            raise DeclaredTooLarge(too_large(limit))


class DisconnectWatch:
    """Cancels the current task when the client disconnects, until `stop` or the end of its `with`
    block. A cancellation the disconnect caused ends the block quietly (there is nobody to
    answer); any other cancellation goes on. A class, not a generator: this runs per request."""

    __slots__ = ("_receive", "_task", "_watcher", "gone", "since")

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self._task = asyncio.current_task()
        self._watcher: asyncio.Task[None] | None = None
        self.gone = False
        self.since = _sweeper.add(self)

    def start(self) -> None:
        """Watch for the disconnect from now on (the sweeper calls this once)."""
        self._watcher = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        while (await self._receive())["type"] != "http.disconnect":
            pass
        if self._task is not None and not self.gone:
            self.gone = True
            self._task.cancel()

    def __enter__(self) -> DisconnectWatch:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> bool:
        self.stop()
        if kind is asyncio.CancelledError and self.gone:
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            return True
        return False

    def stop(self) -> None:
        """The answer is complete (or failed): a disconnect from now on changes nothing."""
        _sweeper.watches.discard(self)
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None
        self._task = None


class _Sweeper:
    """One timer for every watch of this process: each `WATCH_AFTER_S` it starts the watches of
    the requests that have run that long. A timer per request cost more than the whole watch."""

    def __init__(self) -> None:
        self.watches: set[DisconnectWatch] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def add(self, watch: DisconnectWatch) -> float:
        loop = asyncio.get_running_loop()
        if self._timer is None or self._loop is not loop:
            self._loop = loop
            self._timer = loop.call_later(WATCH_AFTER_S, self._sweep)
        self.watches.add(watch)
        return loop.time()

    def _sweep(self) -> None:
        assert self._loop is not None
        due = self._loop.time() - WATCH_AFTER_S
        for watch in [watch for watch in self.watches if watch.since <= due]:
            self.watches.discard(watch)
            watch.start()
        self._timer = self._loop.call_later(WATCH_AFTER_S, self._sweep) if self.watches else None


_sweeper = _Sweeper()


async def send_json(
    send: Send,
    payload: bytes,
    request_id: str,
    status: int = 200,
    extra: tuple[tuple[bytes, bytes], ...] = (),
    made: RateHeaders = b"",
) -> None:
    """The JSON response; `made`: an API key's rate-limit headers (`write_head`)."""
    headers = [*JSON_HEADERS, (b"x-request-id", request_id.encode()), (b"content-length", b"%d" % len(payload))]
    if extra:
        headers += extra
    if not write_head(send, status, headers, made):
        await send({"type": "http.response.start", "status": status, "headers": [*headers, *header_pairs(made)]})
    await send({"type": "http.response.body", "body": payload, "more_body": False})


async def send_stream(
    relay: Relay,
    send: Send,
    request_id: str,
    watch: DisconnectWatch,
    state: dict[str, Any] | None = None,
    extra: tuple[tuple[bytes, bytes], ...] = (),
) -> None:
    """The SSE response: started with the relay's first item (an error before it is raised, for
    the ingress's error renderer), then every frame as it comes; the head carries the API key's
    rate headers (`Relay.head`). The response is marked started in the scope's `state`
    (`app.edge.direct`)."""
    first = await relay.first()
    if state is not None:
        state[RESPONSE_STARTED] = True
    headers = [*SSE_HEADERS, (b"x-request-id", request_id.encode()), *extra]
    made = relay.head.headers
    if not write_head(send, 200, headers, made):
        await send({"type": "http.response.start", "status": 200, "headers": [*headers, *header_pairs(made)]})
    async with contextlib.aclosing(relay.frames(first)) as frames:
        async for chunk in frames:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
    watch.stop()
    await send({"type": "http.response.body", "body": b"", "more_body": False})
