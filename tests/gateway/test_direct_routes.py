"""`app.edge.direct`: a door reached without Litestar's router answers exactly as through it — the
error renderer with the route's handlers, Litestar's 400 for a bad `Host`, Litestar's error for an
exception after the response started — and a path Litestar would normalise goes through Litestar."""

from __future__ import annotations

from typing import Any

import pytest
from litestar import Litestar, Request, asgi
from litestar.exceptions import LitestarException
from litestar.response import Response
from litestar.testing import AsyncTestClient
from litestar.types import Receive, Scope, Send

from app.application import create_app
from app.edge.direct import RESPONSE_STARTED, DirectRoutes, direct_routes
from app.settings import Settings

calls: list[str] = []


@asgi("/door", copy_scope=False)
async def door(scope: Scope, receive: Receive, send: Send) -> None:
    calls.append(scope["path"])
    if scope["method"] == "DELETE":
        raise ValueError("boom")
    if scope["method"] == "PUT":
        scope["state"][RESPONSE_STARTED] = True
        await send({"type": "http.response.start", "status": 200, "headers": []})
        raise ValueError("after the head")
    await send({"type": "http.response.start", "status": 201, "headers": [(b"x-door", b"1")]})
    await send({"type": "http.response.body", "body": b"ok", "more_body": False})


def _render(request: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
    return Response(f"{type(exc).__name__}: {exc}".encode(), status_code=418, headers={"x-rendered": "yes"})


def _app(*, direct: bool) -> Litestar:
    app = Litestar(route_handlers=[door], exception_handlers={Exception: _render}, logging_config=None)
    return direct_routes(app, [door]) if direct else app


@pytest.fixture(autouse=True)
def _clear() -> None:
    calls.clear()


def test_the_door_is_taken_directly() -> None:
    app = _app(direct=True)
    assert isinstance(app.asgi_handler, DirectRoutes)
    assert list(app.asgi_handler._routes) == ["/door"]


@pytest.mark.parametrize("method", ["POST", "DELETE"])
async def test_answers_match_litestar(method: str) -> None:
    answers = []
    for direct in (True, False):
        async with AsyncTestClient(_app(direct=direct)) as client:
            response = await client.request(method, "/door")
        answers.append((response.status_code, response.content, response.headers.get("x-rendered")))
    assert answers[0] == answers[1]
    assert answers[0][0] == (201 if method == "POST" else 418)


async def test_bad_host_and_trailing_slash_go_through_litestar() -> None:
    async with AsyncTestClient(_app(direct=True)) as client:
        bad = await client.post("/door", headers={"host": "bad host"})
        slash = await client.post("/door/")
    async with AsyncTestClient(_app(direct=False)) as client:
        expected = await client.post("/door", headers={"host": "bad host"})
    assert (bad.status_code, bad.content) == (expected.status_code, expected.content)
    assert bad.status_code == 418  # Litestar's "Invalid host header", through the app's renderer
    assert slash.status_code == 201
    assert calls == ["/door"]


async def test_an_error_after_the_head_is_litestars() -> None:
    with pytest.raises(LitestarException, match="after response started"):
        async with AsyncTestClient(_app(direct=True), raise_server_exceptions=True) as client:
            await client.put("/door")


def test_the_service_takes_its_four_completion_doors_directly() -> None:
    app = create_app(Settings(), prepare=False)
    assert isinstance(app.asgi_handler, DirectRoutes)
    assert sorted(app.asgi_handler._routes) == [
        "/api/v1/completions",
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/messages",
    ]
