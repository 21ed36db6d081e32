"""Direct routes: the completion doors reached without Litestar's router and middleware.

The completion ingresses are raw ASGI routes (`app.edge.asgi`). Litestar still put three layers
in front of each: the router (path normalisation, the `Host` check, the routing trie, two
`ScopeState` look-ups, a scope copy) and the exception middleware, which wraps `send` in a
closure awaited once per response message — once per SSE frame. Together about 40,000
instructions of a proxied request (callgrind, `bench/instructions.sh`). `DirectRoutes` takes the
app's place as its `asgi_handler` (inside `Litestar.__call__`, which still sets the scope up) and
calls a door's handler itself when the request is one Litestar would route there unchanged:
`http`, no `root_path`, the exact path, a `Host` Litestar accepts. Anything else — another path,
a trailing slash, an odd `Host` — goes through Litestar as before, so every answer is the same.

Errors: an exception from the handler is rendered by Litestar's own exception middleware code with
the route's resolved exception handlers, as the router would have arranged; after the response
has started (the door says so in `scope["state"]`, `RESPONSE_STARTED`), it is Litestar's "caught
after response started" error, left to the server. A door is taken directly only when nothing
else would have run around it (no guards, route middleware, CORS, CSRF, compression, allowed
hosts, `before_send` or `after_exception` hooks): otherwise Litestar serves it.
"""

from __future__ import annotations

from collections.abc import Iterable

from litestar import Litestar
from litestar._asgi.utils import is_valid_host
from litestar.enums import ScopeType
from litestar.exceptions import LitestarException
from litestar.handlers import ASGIRouteHandler
from litestar.middleware._internal.exceptions.middleware import ExceptionHandlerMiddleware
from litestar.routes import ASGIRoute
from litestar.types import ASGIApp, Receive, Scope, Send
from litestar.utils.scope.state import ScopeState

RESPONSE_STARTED = "response_started"  # set in `scope["state"]` by a door that sent its response head
_HOSTS_KEPT = 64


class DirectRoutes:
    """The app's `asgi_handler` with a shortcut to the given route handlers (see the module doc)."""

    __slots__ = ("_app", "_errors", "_hosts", "_routes", "_slow")

    def __init__(self, app: Litestar, handlers: Iterable[ASGIRouteHandler]) -> None:
        self._app = app
        self._slow: ASGIApp = app.asgi_handler
        self._errors = ExceptionHandlerMiddleware(app=self._slow, debug=None)
        self._hosts: set[bytes] = set()  # `Host` values found valid (a few per deployment)
        wanted = {handler.fn for handler in handlers}  # Litestar registers copies of the handlers
        self._routes: dict[str, ASGIRouteHandler] = {}
        if _app_wraps_routes(app):
            return
        for route in app.routes:
            if isinstance(route, ASGIRoute) and route.route_handler.fn in wanted and _bare(route.route_handler):
                self._routes[route.path] = route.route_handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        handler = self._routes.get(scope["path"])
        if handler is None or scope["type"] != ScopeType.HTTP or scope.get("root_path") or not self._host_ok(scope):
            await self._slow(scope, receive, send)
            return
        try:
            await handler.fn(scope, receive, send)
        except Exception as exc:
            if scope["state"].get(RESPONSE_STARTED):
                raise LitestarException("Exception caught after response started") from exc
            scope.setdefault("path_params", {})
            scope["route_handler"] = handler
            scope["path_template"] = scope["path"]
            ScopeState.from_scope(scope).exception_handlers = handler.resolve_exception_handlers()
            await self._errors.handle_request_exception(self._app, scope, receive, send, exc)

    def _host_ok(self, scope: Scope) -> bool:
        for name, value in scope["headers"]:
            if name == b"host":
                return value in self._hosts or self._check_host(value)
        return True

    def _check_host(self, host: bytes) -> bool:
        if not is_valid_host(host):
            return False  # Litestar's 400
        if len(self._hosts) < _HOSTS_KEPT:
            self._hosts.add(host)
        return True


def _app_wraps_routes(app: Litestar) -> bool:
    """Whether the app runs something around every route that the shortcut would skip."""
    return bool(
        app.cors_config
        or app.csrf_config
        or app.compression_config
        or app.allowed_hosts
        or app.before_send
        or app.after_exception
        or app.pdb_on_exception
        or app.logging_config
    )


def _bare(handler: ASGIRouteHandler) -> bool:
    return not handler.resolve_guards() and not handler.resolve_middleware() and handler.copy_scope is False


def direct_routes(app: Litestar, handlers: Iterable[ASGIRouteHandler]) -> Litestar:
    """Install `DirectRoutes` for `handlers` as `app`'s ASGI handler; returns `app`."""
    app.asgi_handler = DirectRoutes(app, handlers)
    return app
