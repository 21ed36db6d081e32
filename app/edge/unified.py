"""`POST /api/v1/completions` as a raw ASGI route: the service's hot path.

Litestar's regular handler machinery (signature model, dependency resolution, response objects)
costs about a sixth of the CPU of a whole proxied request (py-spy, bench/RESULTS.md), and this
endpoint needs none of it: it reads bytes, decodes them with a prebuilt msgspec decoder, and
writes bytes. So it is mounted with `@asgi` and speaks ASGI directly; the rest of the app (routing,
the exception handler that renders every error, lifespan) is still Litestar's.

Streaming: the response starts with the first frame (see `app.edge.relay.Relay`); while frames are
sent, a watcher awaits `http.disconnect` and cancels the sending task, which closes the relay and,
through it, the upstream request — the client that goes away stops the upstream within a second.
"""

from __future__ import annotations

import asyncio
import contextlib

from litestar import asgi
from litestar.types import Receive, Scope, Send

from app.edge import unified_format as wire
from app.edge.guards import check_json_headers
from app.edge.relay import Relay
from app.edge.validation import decode_request
from app.errors import MethodNotAllowed, PayloadTooLarge
from app.ids import uuid7
from app.pipeline.pipeline import Exchange
from app.service import Service

_JSON_HEADERS = [(b"content-type", b"application/json")]
_SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


@asgi("/api/v1/completions", copy_scope=False)
async def completions(scope: Scope, receive: Receive, send: Send) -> None:
    request_id = uuid7()
    scope.setdefault("state", {})["request_id"] = request_id
    if scope.get("method") != "POST":
        raise MethodNotAllowed("method not allowed", allow="POST")
    check_json_headers(scope["headers"])
    service: Service = scope["litestar_app"].state.service
    assert service.pipeline is not None
    assert service.router is not None
    body = await _read_body(receive, service.settings.server.max_body_bytes)
    if body is None:
        return  # the client went away before sending its body: nobody to answer
    exchange = Exchange(request_id, decode_request(body, service.router.providers))
    id_header = (b"x-request-id", request_id.encode())
    if not exchange.stream:
        payload = wire.encode_response(await service.pipeline.complete(exchange))
        headers = [*_JSON_HEADERS, id_header, (b"content-length", str(len(payload)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": payload, "more_body": False})
        return
    relay = Relay(service.pipeline.stream(exchange), service.settings.server.sse_keepalive_s)
    first = await relay.first()
    await send({"type": "http.response.start", "status": 200, "headers": [*_SSE_HEADERS, id_header]})
    await _send_stream(relay, first, receive, send)


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge("request body too large")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def _send_stream(relay: Relay, first: bytes, receive: Receive, send: Send) -> None:
    sender = asyncio.current_task()
    assert sender is not None
    disconnected = False

    async def watch() -> None:
        nonlocal disconnected
        while (await receive())["type"] != "http.disconnect":
            pass
        disconnected = True
        sender.cancel()

    watcher = asyncio.create_task(watch())
    try:
        async with contextlib.aclosing(relay.frames(first)) as frames:
            async for chunk in frames:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    except asyncio.CancelledError:
        if not disconnected:
            raise
        sender.uncancel()
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
