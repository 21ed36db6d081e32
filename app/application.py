"""`create_app(settings)`: the Litestar application, its lifespan and its one error renderer.

Every failure, whether ours (`GatewayError`), the framework's (404, 405, 413 from the body-size
limit) or unexpected, leaves through `_render_error` in api.md's two-view error format with the
`x-request-id` header. A request rejected before it reached the pipeline gets its canonical
`request` log line here (`status: rejected`); the pipeline writes every other request's.
Unexpected exceptions are logged with their traceback and answered with a generic 500: internal
paths and stack traces never reach a client.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import msgspec
from litestar import Litestar, Request
from litestar.exceptions import HTTPException
from litestar.response import Response

from app.edge import anthropic, handlers
from app.edge.unified import completions
from app.errors import (
    GatewayError,
    InternalError,
    InvalidRequest,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    error_body,
)
from app.ids import uuid7
from app.logging import configure_logging, get_logger
from app.service import Service
from app.settings import Settings, load_settings

_log = get_logger("switchyard.errors")


def create_app(settings: Settings, *, prepare: bool = True) -> Litestar:
    writer = configure_logging(settings.server.log_level)
    service = Service(settings, prepare=prepare, log_writer=writer)

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        await service.start()
        app.state.service = service
        try:
            yield
        finally:
            await service.stop()

    return Litestar(
        route_handlers=[
            completions,
            anthropic.router,
            handlers.list_models,
            handlers.healthz,
            handlers.readyz,
            handlers.metrics,
        ],
        lifespan=[lifespan],
        exception_handlers={Exception: _render_error},
        request_max_body_size=settings.server.max_body_bytes,
        openapi_config=None,
        logging_config=None,  # structlog owns logging; Litestar's default would print httpx's per-request lines
        debug=False,
    )


def create_app_from_env() -> Litestar:
    """Factory for uvicorn workers: the CLI has already migrated and synced the catalog, and says
    how many workers it started (`$SWITCHYARD_WORKERS`, which `--workers` may have set)."""
    settings = load_settings(os.environ.get("SWITCHYARD_CONFIG"))
    workers = os.environ.get("SWITCHYARD_WORKERS")
    if workers:
        server = msgspec.structs.replace(settings.server, workers=int(workers))
        settings = msgspec.structs.replace(settings, server=server)
    return create_app(settings, prepare=False)


def _render_error(request: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
    request_id = getattr(request.state, "request_id", None) or uuid7()
    error = _as_gateway_error(exc, request_id)
    if not getattr(request.state, "routed", False):
        # Rejected before the pipeline took it (bad body, 404, 405, 413): the pipeline's
        # canonical line was never written, so this is that request's line.
        _log.info(
            "request",
            request_id=request_id,
            method=request.method,
            path=request.url.path[:200],
            status="rejected",
            error_status=error.status_code,
            error_type=error.type,
        )
    headers = {"x-request-id": request_id, **error.headers()}
    return Response(
        error_body(error, request_id), status_code=error.status_code, media_type="application/json", headers=headers
    )


def _as_gateway_error(exc: Exception, request_id: str) -> GatewayError:
    if isinstance(exc, GatewayError):
        return exc
    if isinstance(exc, HTTPException):
        if exc.status_code == 413:
            return PayloadTooLarge("request body too large")
        if exc.status_code == 404:
            return NotFound("no such endpoint")
        if exc.status_code == 405:
            return MethodNotAllowed("method not allowed")
        if exc.status_code < 500:
            return InvalidRequest(str(exc.detail))
    _log.error("unhandled_exception", request_id=request_id, exc_info=exc)
    return InternalError("internal error")
