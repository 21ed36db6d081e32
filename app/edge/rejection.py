"""From whatever a handler raised to one `GatewayError`, for every door's error renderer.

Each door renders errors in its own shape (api.md's two views for the native and OpenAI paths,
Anthropic's for `/v1/messages`); what an exception *means* is decided here, once: our own errors
as they are, the framework's 404/405/413 and other 4xx mapped onto the tree, a database that
cannot be reached (a report or a key read during an outage) a 503 `unavailable` logged in one
line, anything else an internal error logged with its traceback and said generically. A request
rejected before the pipeline took it gets its canonical `request` log line here (`status:
rejected`), since the pipeline never wrote one. `raw_response` is the same answer and line, as
bytes, for the refusals the connection writes itself, before any application code runs
(`app.edge.connection`).
"""

from __future__ import annotations

import re
from http import HTTPStatus
from typing import Any

from litestar import Litestar, Request
from litestar.exceptions import HTTPException
from litestar.handlers import HTTPRouteHandler

from app.edge.anthropic_format import error_document
from app.errors import (
    DatabaseUnavailable,
    GatewayError,
    InternalError,
    InvalidRequest,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    clip,
    error_body,
    too_large,
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
    error = _as_gateway_error(exc, request_id, log, request)
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


def _refused_by_connection(app: Any, status_code: int) -> None:
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


def _as_gateway_error(exc: Exception, request_id: str, log: Any, request: Request[Any, Any, Any]) -> GatewayError:
    if isinstance(exc, GatewayError):
        return exc
    if isinstance(exc, HTTPException):
        if exc.status_code == 413:
            return _too_large(request)
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


def _too_large(request: Request[Any, Any, Any]) -> PayloadTooLarge:
    """Litestar's 413 (a chunked body the app read past its route's limit) as the connection's:
    stating the limit it broke (`app.errors.too_large`)."""
    handler = request.scope.get("route_handler")
    limit = handler.resolve_request_max_body_size() if isinstance(handler, HTTPRouteHandler) else None
    return PayloadTooLarge(too_large(limit) if limit else "request body too large")


def raw_response(error: GatewayError, request_id: str, target: bytes, app: Any) -> bytes:
    """`error`'s response, closing the connection; in Anthropic's shape for its door. Logged and
    counted as `as_gateway_error` does a refusal: the request's `request` line, so the id the
    client got is in the log, with the path's route words only (`_route_words`)."""
    path = target.split(b"?", 1)[0]
    get_logger("switchyard.errors").info(
        "request",
        request_id=request_id,
        path=_route_words(path),
        status="rejected",
        error_status=error.status_code,
        error_type=error.type,
    )
    _refused_by_connection(app, error.status_code)
    own = b""
    if path == b"/v1/messages" or path.startswith(b"/v1/messages/"):
        body = error_document(error.status_code, error.message, error.param, request_id)
        own = b"request-id: %s\r\n" % request_id.encode()
    else:
        body = error_body(error, request_id)
    status = HTTPStatus(error.status_code)
    head = (
        f"HTTP/1.1 {status.value} {status.phrase}\r\n"
        "content-type: application/json\r\n"
        f"content-length: {len(body)}\r\n"
        f"x-request-id: {request_id}\r\n"
    )
    return head.encode("latin-1") + own + b"connection: close\r\n\r\n" + body


_ROUTE_WORDS = frozenset(
    b"api v1 completions chat messages keys me usage models catalog drift gpu-cost healthz readyz metrics".split()
)


def _route_words(path: bytes) -> str:
    """`path` up to its first segment that is not a word of the gateway's routes (`/…` then): a
    secret pasted into a path (a key, the admin's) is not the connection's to write, and it has
    no key ring to mask one with, as the app does (`app.edge.rejection`)."""
    segments = path.split(b"/")[1:]
    kept = 0
    while kept < len(segments) and segments[kept] in _ROUTE_WORDS:
        kept += 1
    if segments == [b""]:  # `/`
        return "/"
    shown = b"".join(b"/" + segment for segment in segments[:kept]).decode()
    return shown + "/…" if kept < len(segments) else shown
