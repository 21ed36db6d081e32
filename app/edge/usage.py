"""The usage report over HTTP: `GET /api/v1/usage` (JSON), the spend page `GET /usage` (HTML) and
the chart library the page loads, `GET /usage/plotly/<version>/plotly.min.js`.

Parameters are parsed once (`catalog.usage_query.parse_query`); a bad one is a 400 in api.md's
error shape with `param` naming it (the page shows the same message in its own HTML, status 400).
A parameter given twice (`model=a&model=b`) means both, like `model=a,b`.

A report served here has at most `MAX_REPORT_ROWS` rows (about 16 MB of JSON); one with more is a
400 naming `group_by` and saying to narrow the period, the filters or the groups (the database
counts them before any is read). Unbounded, a decade grouped by hour x model x key was 644,091
rows, 206 MB, took the process from 136 to 676 MB and stalled the requests it served for seconds.
`switchyard usage` has no bound: it runs in its own process.

Who sees what (access.md): with `[auth] mode = "keys"` every route here needs a key
(`app.edge.key_guard`; the page asks a browser for it with HTTP Basic authentication), and a
non-admin key's reports hold its own rows only (`visible_key`: None, everything, for the admin
key and without keys).

The chart library is the `plotly` package's own offline bundle (`plotly/package_data`), read from
the installed package on first use and served with the package's version in its URL, so browsers
may cache it for good (`immutable`); gzip-compressed when the browser accepts it (4.8 → 1.4 MB).
Reports and the page are gzip-compressed likewise when they are larger than a packet (`_packed`).
Nothing is copied into this repository and nothing is fetched from the internet.
"""

from __future__ import annotations

import asyncio
import gzip
from datetime import UTC, datetime
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

import msgspec
from litestar import Request, route
from litestar.datastructures import State
from litestar.params import FromPath
from litestar.response import Response

from app.edge.key_guard import GET_HEAD, rate_window, require_key, require_page_key, visible_key
from app.edge.spend_page import PAGE_HEADERS, render_page
from app.errors import DatabaseUnavailable, InvalidRequest, NotFound
from app.service import Service
from catalog.database import database_unreachable
from catalog.report_period import QueryError
from catalog.usage_query import UNREADABLE, UsageQuery, parse_query, undecodable
from catalog.usage_report import usage_report

_encoder = msgspec.json.Encoder()
MAX_REPORT_ROWS = 50_000  # the most rows of a report served here (module doc)
PAGE_TOO_LARGE = "narrow the period (from, to) or the filters"
_PACK_FROM = 1400  # bytes: a smaller answer fits one packet as it is
_JS_CACHE = "public, max-age=31536000, immutable"


def _params(request: Request[Any, Any, Any]) -> dict[str, str]:
    query = request.query_params
    return {name: _joined(query.getall(name)) for name in query}


def _joined(values: list[str]) -> str:
    """A repeated parameter's values as one comma list. A value that ends in an unpaired backslash
    (itself, alone) gets it doubled, which means the same, so that it does not escape the comma
    joining it to the next (`owner=a\\&owner=b` is `a\\` and `b`, in either order)."""
    if len(values) == 1:
        return values[0]
    return ",".join(value + "\\" if (len(value) - len(value.rstrip("\\"))) % 2 else value for value in values)


def _accepts_gzip(header: str) -> bool:
    """Whether `Accept-Encoding` allows gzip: named (or `*`) without `q=0` (RFC 9110)."""
    weights: dict[str, float] = {}
    for item in header.split(","):
        coding, *params = (part.strip() for part in item.split(";"))
        weight = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    weight = float(value)
                except ValueError:
                    weight = 0.0
        weights[coding.lower()] = weight
    weight = weights.get("gzip", weights.get("x-gzip", weights.get("*", 0.0)))
    return weight > 0


def _query(request: Request[Any, Any, Any], **changes: Any) -> UsageQuery:
    bad = undecodable(request.scope.get("query_string", b""))
    if bad is not None:
        raise InvalidRequest(f"{bad}: {UNREADABLE}", param=bad)
    try:
        query = parse_query(_params(request), datetime.now(UTC), only_key=visible_key(request))
    except QueryError as exc:
        raise InvalidRequest(exc.message, param=exc.param) from None
    return msgspec.structs.replace(query, **changes) if changes else query


def _service(state: State) -> Service:
    service: Service = state.service
    return service


@route("/api/v1/usage", http_method=GET_HEAD, middleware=[rate_window], guards=[require_key])
async def usage(request: Request[Any, Any, Any], state: State) -> Response[bytes]:
    engine = _service(state).engine
    assert engine is not None
    try:
        report = await usage_report(engine, _query(request), max_rows=MAX_REPORT_ROWS)
    except QueryError as exc:
        raise InvalidRequest(exc.message, param=exc.param) from None
    return await _packed(request, _encoder.encode(report), "application/json", {})


@route("/usage", http_method=GET_HEAD, middleware=[rate_window], guards=[require_page_key])
async def spend_page(request: Request[Any, Any, Any], state: State) -> Response[Any]:
    engine = _service(state).engine
    assert engine is not None
    params = _params(request)
    try:
        base = _query(request, latency=False)
    except InvalidRequest as exc:
        page = render_page(params, None, error=exc.message)
        return Response(page, status_code=400, media_type="text/html", headers=PAGE_HEADERS)
    try:
        reports = {
            name: await usage_report(engine, msgspec.structs.replace(base, group_by=groups), max_rows=MAX_REPORT_ROWS)
            for name, groups in (("daily", ("day", "model")), ("keys", ("key",)), ("models", ("model",)))
        }
    except QueryError:  # the page has no `group_by` to name: what to change instead
        page = render_page(params, None, error=f"more than {MAX_REPORT_ROWS} rows: {PAGE_TOO_LARGE}")
        return Response(page, status_code=400, media_type="text/html", headers=PAGE_HEADERS)
    except Exception as exc:
        if not database_unreachable(exc):
            raise
        page = render_page(params, None, error=DatabaseUnavailable.MESSAGE)
        return Response(page, status_code=503, media_type="text/html", headers=PAGE_HEADERS)
    page = render_page(params, reports, script=plotly_path(request.scope.get("raw_path", b"").decode("latin-1")))
    return await _packed(request, page.encode(), "text/html", PAGE_HEADERS)


async def _packed(
    request: Request[Any, Any, Any], body: bytes, media_type: str, headers: dict[str, str]
) -> Response[bytes]:
    """A report or page, gzip-compressed (on a thread: megabytes) when the client accepts it and
    it is over `_PACK_FROM` bytes: 16 MB of JSON at most (`MAX_REPORT_ROWS`) is ~1.5 MB packed."""
    headers = {**headers, "vary": "accept-encoding"}
    if len(body) < _PACK_FROM or not _accepts_gzip(request.headers.get("accept-encoding", "")):
        return Response(body, media_type=media_type, headers=headers)
    packed = await asyncio.to_thread(gzip.compress, body, 6, mtime=0)
    return Response(packed, media_type=media_type, headers={**headers, "content-encoding": "gzip"})


def plotly_path(page: str) -> str:
    """The bundle's URL relative to the page's path (`/usage`, or `/usage/`, which is served too):
    behind a reverse proxy that serves the gateway under a prefix (`/switchyard/usage`) the browser
    asks for it under that prefix, where an absolute `/usage/…` missed the gateway."""
    return f"{'' if page.endswith('/') else 'usage/'}plotly/{metadata.version('plotly')}/plotly.min.js"


@cache
def _plotly_bundle() -> tuple[bytes, bytes]:
    """The installed `plotly` package's offline bundle, plain and gzip-compressed (read once)."""
    located = metadata.distribution("plotly").locate_file("plotly/package_data/plotly.min.js")
    plain = Path(str(located)).read_bytes()
    return plain, gzip.compress(plain, compresslevel=6, mtime=0)


@route(
    "/usage/plotly/{version:str}/plotly.min.js",
    http_method=GET_HEAD,
    middleware=[rate_window],
    guards=[require_page_key],
)
async def plotly_script(request: Request[Any, Any, Any], version: FromPath[str]) -> Response[bytes]:
    if version != metadata.version("plotly"):
        raise NotFound(f"no chart library version {version[:32]!r} here")
    plain, packed = await asyncio.to_thread(_plotly_bundle)  # the first call reads and compresses 4.8 MB
    headers = {"cache-control": _JS_CACHE, "vary": "accept-encoding"}
    if _accepts_gzip(request.headers.get("accept-encoding", "")):
        return Response(packed, media_type="text/javascript", headers={**headers, "content-encoding": "gzip"})
    return Response(plain, media_type="text/javascript", headers=headers)
