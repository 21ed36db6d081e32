"""Litestar guards for the routes that are not completion doors (those authenticate in
`app.edge.asgi.serve`): `require_key` on every route but `/healthz`, `/readyz` and `/metrics`,
`require_admin` on the key-management API and the fleet-wide cost reports (drift, GPU cost),
`require_page_key` on the spend page: a browser cannot send a bearer header, so a refusal there
asks for the key with HTTP Basic authentication (`WWW-Authenticate`; the key is the password, and
the browser sends it again with the page's script). Basic is taken there only: a browser would
send the cached credential with another site's form POST to any route.

With `[auth] mode = "none"` both let everything through. The authenticated key is kept in the
request's state (`caller`), for handlers that show a key only what it may see (`/v1/models`,
`/api/v1/models`, `/api/v1/keys/me`). A refusal raises from the one error tree, so each door's
own exception handler renders it in its shape.

A key with `rpm` or `tpm` gets its window's `x-ratelimit-*` headers on these routes' responses,
errors included (access.md: every response to a key with limits): the guard reads the window
(`AccessGate.window_headers`) and `rate_window`, the routes' middleware, adds them to the head.
Route middleware, not the app's: the completion doors stay direct (`app.edge.direct`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from litestar import HttpMethod
from litestar.connection import ASGIConnection
from litestar.handlers.base import BaseRouteHandler
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from app.access.keyring import Entry
from app.access.worstcase import budget_priced
from app.errors import AuthenticationFailed, PermissionDenied
from app.pipeline.events import header_pairs
from app.service import Service
from catalog.snapshot import CatalogSnapshot, ModelEntry

_STATE = "api_key"
_RATE = "api_key_rate_headers"

GET_HEAD = [HttpMethod.GET, HttpMethod.HEAD]  # every read route's: RFC 9110 has a GET route answer HEAD too


async def require_key(connection: ASGIConnection[Any, Any, Any, Any], _handler: BaseRouteHandler) -> None:
    await _authenticate(connection, basic=False)


async def _authenticate(connection: ASGIConnection[Any, Any, Any, Any], *, basic: bool) -> None:
    service: Service = connection.app.state.service
    if service.access is not None:
        state = connection.scope.setdefault("state", {})
        entry = state[_STATE] = service.access.keyring.authenticate(connection.scope["headers"], basic=basic)
        state[_RATE] = await service.access.window_headers(entry)  # b"" for a key without a window


def rate_window(app: ASGIApp) -> ASGIApp:
    """Route middleware: the authenticated key's window headers (module doc) on the response head."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_window(message: Message) -> None:
            if message["type"] == "http.response.start":
                block = scope.get("state", {}).get(_RATE)
                if block:
                    message["headers"] = [*message.get("headers", ()), *header_pairs(block)]
            await send(message)

        await app(scope, receive, send_with_window)

    return middleware


async def require_admin(connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler) -> None:
    await require_key(connection, handler)
    entry = caller(connection)
    if entry is not None and not entry.admin:
        what = "manage keys" if connection.scope["path"].startswith("/api/v1/keys") else "read this report"
        raise PermissionDenied(f"this API key may not {what}: use the admin key")


async def require_page_key(connection: ASGIConnection[Any, Any, Any, Any], _handler: BaseRouteHandler) -> None:
    """`require_key` that also takes an HTTP Basic password: only on the page's own routes (GET),
    never on a route that changes or spends anything (`KeyRing.authenticate` says why)."""
    try:
        await _authenticate(connection, basic=True)
    except AuthenticationFailed as exc:
        exc.extra_headers = {"www-authenticate": 'Basic realm="switchyard usage", charset="UTF-8"'}
        raise


def visible_key(connection: ASGIConnection[Any, Any, Any, Any]) -> str | None:
    """The key id whose usage this caller may see, or None for all of it (no keys, or the admin key)."""
    entry = caller(connection)
    return None if entry is None or entry.admin else entry.record.id


def caller(connection: ASGIConnection[Any, Any, Any, Any]) -> Entry | None:
    """The authenticated key (None with `[auth] mode = "none"`)."""
    entry: Entry | None = connection.scope.get("state", {}).get(_STATE)
    return entry


def visible(connection: ASGIConnection[Any, Any, Any, Any], model: ModelEntry, snapshot: CatalogSnapshot) -> bool:
    """Whether the caller may see (and use) `model`: one of its key's models, and for a key with a
    budget one with a price on some backend (access.md: a budget needs a price; pinned to a
    priced backend, a model priced on some backends only can still be used)."""
    entry = caller(connection)
    if entry is None:
        return True
    if entry.record.models is not None and model.id not in entry.record.models:
        return False
    if entry.record.budget_usd is None:
        return True
    now = datetime.now(UTC)
    return any(budget_priced(snapshot, deployment.provider, model.id, now) for deployment in model.deployments)
