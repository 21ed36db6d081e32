"""From whatever a handler raised to one `GatewayError`, for every door's error renderer.

Each door renders errors in its own shape (api.md's two views for the native and OpenAI paths,
Anthropic's for `/v1/messages`); what an exception *means* is decided here, once: our own errors
as they are, the framework's 404/405/413 and other 4xx mapped onto the tree, a database that
cannot be reached (a report or a key read during an outage) a 503 `unavailable` logged in one
line, anything else an internal error logged with its traceback and said generically. A request
rejected before the pipeline took it gets its canonical `request` log line here (`status:
rejected`), since the pipeline never wrote one.
"""

from __future__ import annotations

import re
from typing import Any

from litestar import Litestar, Request
from litestar.exceptions import HTTPException

from app.errors import (
    DatabaseUnavailable,
    GatewayError,
    InternalError,
    InvalidRequest,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    clip,
    unsecret,
)
from app.ids import uuid7
from app.logging import get_logger
from app.metrics import refused
from catalog.database import database_unreachable

_log = get_logger("switchyard.errors")
ANSWERED = "answered_by_connection"
"""The scope state's mark of a request the connection answered itself mid-body (`app.edge.connection`):
counted and logged there; the app's own error for it (the client gone) is none the client got."""
_SECRET = re.compile(r"sy-[^/]*")


def as_gateway_error(request: Request[Any, Any, Any], exc: Exception) -> tuple[str, GatewayError]:
    """The request id and the `GatewayError` for any exception a handler raised, for every door's
    error renderer. A request rejected before the pipeline took it (bad body, 404, 405, 413) gets
    its canonical `request` line here: the pipeline never wrote one."""
    request_id = getattr(request.state, "request_id", None) or uuid7()
    log = _logger(request)
    if getattr(request.state, ANSWERED, False):
        return request_id, InvalidRequest("the connection answered this request")  # nobody reads it
    error = _as_gateway_error(exc, request_id, log)
    if not getattr(request.state, "routed", False):
        service = getattr(request.app.state, "service", None)
        if service is not None:
            refused(service.metrics, error.status_code)
        log.info(
            "request",
            request_id=request_id,
            method=request.method,
            path=_path_logged(request),
            status="rejected",
            error_status=error.status_code,
            error_type=error.type,
        )
    return request_id, error


def refused_by_connection(app: Any, status_code: int) -> None:
    """A request the connection answered itself (`app.edge.connection`: unparsable, too slow, its
    headers too large), counted as those the app refuses; `app` is uvicorn's: the Litestar app, or
    a middleware around it."""
    while app is not None and not isinstance(app, Litestar):
        app = getattr(app, "app", None)
    service = getattr(app.state, "service", None) if app is not None else None
    if service is not None:
        refused(service.metrics, status_code)


def answered_here(scope: Any) -> str | None:
    """Marks a request the connection answers mid-body (`ANSWERED`): the app, hearing the client
    gone, neither counts nor logs it again. The id the app gave it, if any."""
    state: dict[str, Any] = scope.setdefault("state", {})
    state[ANSWERED] = True
    request_id: str | None = state.get("request_id")
    return request_id


def _path_logged(request: Request[Any, Any, Any]) -> str:
    """The path without a secret pasted into it (for a key id, a model): a `sy-` key's by its
    prefix, the admin key's by its text (`app.errors.unsecret`: it has no prefix)."""
    return unsecret(_SECRET.sub("sy-…", request.url.path))[:200]


def _logger(request: Request[Any, Any, Any]) -> Any:
    """The running service's logger (bound to its log writer); the module's before start-up."""
    service = getattr(request.app.state, "service", None)
    return service.log if service is not None else _log


def _as_gateway_error(exc: Exception, request_id: str, log: Any) -> GatewayError:
    if isinstance(exc, GatewayError):
        return exc
    if isinstance(exc, HTTPException):
        if exc.status_code == 413:
            return PayloadTooLarge("request body too large")
        if exc.status_code == 404:
            return NotFound("no such endpoint")
        if exc.status_code == 405:
            listed = (exc.headers or {}).get("allow", "").split(",")  # Litestar's order is a set's: sorted here
            return MethodNotAllowed(
                "method not allowed", allow=", ".join(sorted(m.strip() for m in listed if m.strip()))
            )
        if exc.status_code < 500:
            return InvalidRequest(clip(str(exc.detail)))  # Litestar's details quote the request path
    if database_unreachable(exc):
        log.warning("database_unreachable", request_id=request_id, error=type(exc).__name__)
        return DatabaseUnavailable(DatabaseUnavailable.MESSAGE)
    log.error("unhandled_exception", request_id=request_id, exc_info=exc)
    return InternalError("internal error")
