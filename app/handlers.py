"""HTTP handlers: `/api/v1/completions`, `/api/v1/models`, `/healthz`, `/readyz`, `/metrics`.

Handlers take the raw body and decode it themselves with a prebuilt msgspec decoder, so
validation messages carry api.md's `param` paths and no framework-level parsing runs twice.
Every response carries `x-request-id`; errors are raised as `GatewayError` and rendered by the
one exception handler in `app.application`.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
from litestar import Request, get, post
from litestar.datastructures import State
from litestar.response import Response, Stream

from app import wire
from app.gateway import Gateway
from app.ids import uuid7
from app.models_view import model_list
from app.pipeline import Exchange
from app.sse import Relay
from app.validation import decode_request

_JSON = "application/json"
_SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
_plain_encoder = msgspec.json.Encoder()


def _gateway(state: State) -> Gateway:
    gateway: Gateway = state.gateway
    return gateway


@post("/api/v1/completions", status_code=200)
async def create_completion(request: Request[Any, Any, Any], state: State) -> Response[bytes] | Stream:
    request_id = uuid7()
    request.state.request_id = request_id
    gateway = _gateway(state)
    assert gateway.pipeline is not None
    assert gateway.router is not None
    body = await request.body()
    completion = decode_request(body, gateway.router.providers)
    exchange = Exchange(request_id, completion)
    headers = {"x-request-id": request_id}
    if not exchange.stream:
        response = await gateway.pipeline.complete(exchange)
        return Response(wire.encode_response(response), media_type=_JSON, headers=headers)
    relay = Relay(gateway.pipeline.stream(exchange), gateway.settings.server.sse_keepalive_s)
    first = await relay.first()
    return Stream(relay.frames(first), media_type="text/event-stream", headers={**headers, **_SSE_HEADERS})


@get("/api/v1/models")
async def list_models(state: State) -> Response[bytes]:
    router = _gateway(state).router
    assert router is not None
    now = asyncio.get_running_loop().time()
    return Response(_plain_encoder.encode(model_list(router, now)), media_type=_JSON)


@get("/metrics")
async def metrics(state: State) -> Response[bytes]:
    gateway = _gateway(state)
    assert gateway.router is not None
    text = gateway.metrics.render(gateway.router, asyncio.get_running_loop().time())
    return Response(text.encode(), media_type="text/plain; version=0.0.4; charset=utf-8")


@get("/healthz")
async def healthz() -> Response[bytes]:
    return Response(b'{"status":"ok"}', media_type=_JSON)


@get("/readyz")
async def readyz(state: State) -> Response[bytes]:
    gateway = _gateway(state)
    database = await gateway.database_ready()
    router = gateway.router
    now = asyncio.get_running_loop().time()
    backends = router is not None and any(b.ready(now) for b in router.all_backends())
    ok = database and backends
    body = _plain_encoder.encode({"status": "ok" if ok else "unavailable", "database": database, "backends": backends})
    return Response(body, media_type=_JSON, status_code=200 if ok else 503)
