"""HTTP handlers for everything but the hot path: `/api/v1/models`, `/healthz`, `/readyz`, `/metrics`.

`/readyz` is ready with the database reachable, a backend ready and requests recordable; its
`ledger` says how the usage ledger stands (`Service.ledger_state`): `ok`, `behind` (the database
is failing or rows are waiting in the journal), `unwritable` (the journal cannot be written) or
`disabled`; with keys and Redis, `limits` says whether Redis's limiter answers (`Service.limits_state`).

(`POST /api/v1/completions` is a raw ASGI route in `app.edge.unified`.) Errors are raised as
`GatewayError` and rendered by the one exception handler in `app.application`.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
from litestar import Request, route
from litestar.datastructures import State
from litestar.response import Response

from app.edge.key_guard import GET_HEAD, rate_window, require_key, visible
from app.edge.models_view import model_list
from app.exposition import CONTENT_TYPE
from app.service import Service

_JSON = "application/json"
_SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
_plain_encoder = msgspec.json.Encoder()


def _service(state: State) -> Service:
    service: Service = state.service
    return service


@route("/api/v1/models", http_method=GET_HEAD, middleware=[rate_window], guards=[require_key])
async def list_models(state: State, request: Request[Any, Any, Any]) -> Response[bytes]:
    """Every model, or with API keys the models the caller's key may use."""
    router = _service(state).router
    assert router is not None
    now = asyncio.get_running_loop().time()
    models = model_list(router, now)
    snapshot = router.snapshot
    models.data = [
        view for view in models.data if (entry := snapshot.resolve(view.id)) and visible(request, entry, snapshot)
    ]
    return Response(_plain_encoder.encode(models), media_type=_JSON)


@route("/metrics", http_method=GET_HEAD)
async def metrics(state: State) -> Response[bytes]:
    # Set as a header: from `media_type` Litestar would append a second `charset` to it.
    return Response(await _service(state).render_metrics(), headers={"content-type": CONTENT_TYPE})


@route("/healthz", http_method=GET_HEAD)
async def healthz() -> Response[bytes]:
    return Response(b'{"status":"ok"}', media_type=_JSON)


@route("/readyz", http_method=GET_HEAD)
async def readyz(state: State) -> Response[bytes]:
    """api.md: ready when the database answers, a backend is ready and usage can be recorded. A
    backend counts as ready until a probe says otherwise, and while it only cools down
    (`Backend.up`), so a readiness check that comes before
    the first probe round (at `probe_interval_s`) runs that round now, one shared by every check
    and waited for at most a second: a server that is not running is not ready in the seconds
    after a start, and a probe that hangs does not hold the check."""
    service = _service(state)
    if service.health is not None:
        await service.health.first_round(1.0)
    database, limits = await asyncio.gather(service.database_ready(), service.limits_state())
    router = service.router
    backends = router is not None and any(b.up() for b in router.all_backends())
    ok = database and backends and service.recording
    status = "ok" if ok else "unavailable"
    view = {"status": status, "database": database, "backends": backends, "ledger": service.ledger_state}
    if limits is not None:
        view["limits"] = limits
    body = _plain_encoder.encode(view)
    return Response(body, media_type=_JSON, status_code=200 if ok else 503)
