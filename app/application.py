"""`create_app(settings)`: the Litestar application, its lifespan and the shared error renderer.

Every failure, whether ours (`GatewayError`), the framework's (404, 405 with its `Allow` header,
413 from the body-size limit) or unexpected, leaves through an error renderer with the
`x-request-id` header (as does every other answer: `_with_request_id`): `_render_error` here, in
api.md's two-view format, for the native and OpenAI-compatible paths; the Anthropic door's own
(`app.edge.anthropic`) under `/v1/messages`.
What an exception means, and the `request` log line of a request rejected before routing, is
decided once for both (`app.edge.rejection`). Unexpected exceptions are logged with their
traceback and answered with a generic 500: internal paths and stack traces never reach a client.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import msgspec
from litestar import Litestar, Request
from litestar.response import Response

from app.edge import anthropic, handlers, keys_api, usage
from app.edge.cost_reports import catalog_drift, catalog_gpu_cost
from app.edge.direct import direct_routes
from app.edge.openai_chat import chat_completions, openai_model, openai_models
from app.edge.openai_completions import text_completions
from app.edge.rejection import as_gateway_error
from app.edge.unified import completions
from app.errors import error_body
from app.ids import uuid7
from app.logging import configure_logging, route_stdlib_logging
from app.service import Service
from app.settings import Settings, load_settings


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

    app = Litestar(
        route_handlers=[
            completions,
            chat_completions,
            text_completions,
            openai_models,
            openai_model,
            anthropic.router,
            keys_api.router,
            handlers.list_models,
            handlers.healthz,
            handlers.readyz,
            handlers.metrics,
            catalog_drift,
            catalog_gpu_cost,
            usage.usage,
            usage.spend_page,
            usage.plotly_script,
        ],
        lifespan=[lifespan],
        after_request=_with_request_id,
        exception_handlers={Exception: _render_error},
        request_max_body_size=settings.server.max_body_bytes,
        openapi_config=None,
        logging_config=None,  # structlog owns logging; Litestar's default would print httpx's per-request lines
        debug=False,
    )
    return direct_routes(app, (completions, chat_completions, text_completions, anthropic.messages))


def create_app_from_env() -> Litestar:
    """Factory for uvicorn workers: the CLI has already migrated and synced the catalog, and says
    how many workers it started (`$SWITCHYARD_WORKERS`, which `--workers` may have set)."""
    settings = load_settings(os.environ.get("SWITCHYARD_CONFIG") or None)  # empty: unset, as `find_config` reads it
    workers = os.environ.get("SWITCHYARD_WORKERS")
    if workers:
        server = msgspec.structs.replace(settings.server, workers=int(workers))
        settings = msgspec.structs.replace(settings, server=server)
    app = create_app(settings, prepare=False)
    route_stdlib_logging(settings.server.log_level)  # a worker of `serve` (`app.cli`): its process
    return app


async def _with_request_id(response: Response[Any]) -> Response[Any]:
    """api.md: `x-request-id` on every response. The completion doors and the error renderers set
    their own (the request's id); the other routes' answers (health, metrics, models, keys, usage)
    get a fresh UUIDv7 here."""
    if "x-request-id" not in response.headers:
        response.headers["x-request-id"] = uuid7()
    return response


def _render_error(request: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
    """api.md's two-view error body: every door's but the Anthropic one (`app.edge.anthropic`)."""
    request_id, error = as_gateway_error(request, exc)
    headers = {"x-request-id": request_id, **error.headers()}
    return Response(
        error_body(error, request_id), status_code=error.status_code, media_type="application/json", headers=headers
    )
