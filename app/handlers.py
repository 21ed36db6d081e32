"""HTTP handlers: `/api/v1/completions`, `/api/v1/models`, `/healthz`, `/readyz`.

Handlers take the raw body and decode it themselves with a prebuilt msgspec decoder, so
validation messages carry api.md's `param` paths and no framework-level parsing runs twice.
Every response carries `x-request-id`; errors are raised as `GatewayError` and rendered by the
one exception handler in `app.application`.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import msgspec
from litestar import Request, get, post
from litestar.datastructures import State
from litestar.response import Response, Stream

from app import wire
from app.gateway import Gateway
from app.ids import uuid7
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


class ModelDeploymentView(msgspec.Struct):
    provider: str
    upstream_model: str
    priority: int
    ready: bool


class ModelPriceView(msgspec.Struct, omit_defaults=True):
    provider: str
    effective_from: str
    input: str | None = None
    output: str | None = None
    cache_read: str | None = None
    cache_write: str | None = None
    reasoning: str | None = None


class ModelView(msgspec.Struct):
    id: str
    aliases: list[str]
    context_window: int | None
    max_output: int | None
    capabilities: list[str]
    default: bool
    ready: bool
    deployments: list[ModelDeploymentView]
    prices: list[ModelPriceView]
    object: str = "model"


class ModelList(msgspec.Struct):
    data: list[ModelView]
    object: str = "list"


@get("/api/v1/models")
async def list_models(state: State) -> Response[bytes]:
    router = _gateway(state).router
    assert router is not None
    views = []
    for entry in router.snapshot.models:
        deployments = [
            ModelDeploymentView(b.name, b.upstream_model, b.priority, b.provider.ready) for b in router.backends(entry)
        ]
        prices = [
            ModelPriceView(
                provider=p.provider,
                effective_from=p.effective_from.isoformat(),
                input=_money(p.input),
                output=_money(p.output),
                cache_read=_money(p.cache_read),
                cache_write=_money(p.cache_write),
                reasoning=_money(p.reasoning),
            )
            for p in router.snapshot.prices_for(entry.id).values()
        ]
        views.append(
            ModelView(
                id=entry.id,
                aliases=list(entry.aliases),
                context_window=entry.context_window,
                max_output=entry.max_output,
                capabilities=sorted(entry.capabilities),
                default=entry.is_default,
                ready=any(d.ready for d in deployments),
                deployments=deployments,
                prices=prices,
            )
        )
    return Response(_plain_encoder.encode(ModelList(views)), media_type=_JSON)


def _money(value: Decimal | None) -> str | None:
    """Exact, without the storage scale's trailing zeros: Decimal("0.1000000000") → "0.1"."""
    return None if value is None else format(value.normalize(), "f")


@get("/healthz")
async def healthz() -> Response[bytes]:
    return Response(b'{"status":"ok"}', media_type=_JSON)


@get("/readyz")
async def readyz(state: State) -> Response[bytes]:
    gateway = _gateway(state)
    database = await gateway.database_ready()
    router = gateway.router
    backends = router is not None and any(p.ready for p in router.providers.values())
    ok = database and backends
    body = _plain_encoder.encode({"status": "ok" if ok else "unavailable", "database": database, "backends": backends})
    return Response(body, media_type=_JSON, status_code=200 if ok else 503)
