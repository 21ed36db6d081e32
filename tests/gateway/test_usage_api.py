"""`GET /api/v1/usage` and the spend page over HTTP: a real completion shows up in the report,
a seeded ledger reports exactly what the raw rows add up to, bad parameters are 400s naming
themselves, and the page's chart library is the installed `plotly` package's own bundle."""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import pytest

from app.edge import usage as usage_routes
from catalog.database import open_engine
from catalog.ledger_write import write_records
from catalog.usage_query import parse_query
from tests.catalog.usage_oracle import expected, ledger_rows, seeded_records
from tests.support.client import post, user
from tests.support.gateway import GatewayHandle
from tests.support.ports import free_port
from tests.support.upstream import ReplayUpstream, reply_json

USAGE = "/api/v1/usage"
NOW = datetime(2026, 12, 1, tzinfo=UTC)  # unused: every request here gives both ends of its period
PERIOD = {"from": "2026-11-28T03:17:42.5Z", "to": "2026-11-30T16:45:00Z"}


async def seed(gw: GatewayHandle) -> list[dict[str, Any]]:
    assert gw.service.engine is not None
    await write_records(gw.service.engine, seeded_records())
    return await ledger_rows(gw.service.engine)


async def test_a_completion_is_in_the_report(gw: GatewayHandle, primary: ReplayUpstream) -> None:
    usage = {"prompt_tokens": 12, "completion_tokens": 3}
    primary.enqueue(
        reply_json(200, {"choices": [{"message": {"content": "Paris."}, "finish_reason": "stop"}], "usage": usage})
    )
    response = await post(gw, {"model": "chat", "messages": [user("Capital of France?")]})
    assert response.status_code == 200
    await gw.ledger_rows()

    answer = (await gw.client.get(USAGE, params={"group_by": "model,provider,owner,api,status"})).json()
    figures = {
        "requests": 1, "errors": 0, "cancelled": 0, "input_tokens": 12, "output_tokens": 3, "reasoning_tokens": 0,
        "cache_read_tokens": 0, "cache_write_tokens": 0, "cost_usd": "0.0000024", "unpriced_requests": 0,
        "authoritative_cost_usd": "0",
    }  # fmt: skip
    assert answer["group_by"] == ["model", "provider", "owner", "api", "status"]
    (row,) = answer["rows"]
    latency = row.pop("p50_ms"), row.pop("p95_ms")
    assert row == {"model": "chat-1", "provider": "primary", "owner": None, "api": "unified", "status": "ok", **figures}
    assert latency[0] == latency[1] > 0
    assert answer["totals"] == {**figures, "p50_ms": latency[0], "p95_ms": latency[0]}
    # a model filter takes the catalog's alias (`chat`) as a request does; an unknown name is kept
    by_alias = (await gw.client.get(USAGE, params={"group_by": "model", "model": "chat,gone"})).json()
    by_id = (await gw.client.get(USAGE, params={"group_by": "model", "model": "chat-1"})).json()
    assert by_alias["rows"] == by_id["rows"]
    assert [row["model"] for row in by_alias["rows"]] == ["chat-1"]


@pytest.mark.parametrize(
    "params",
    [
        {**PERIOD, "group_by": "model,day"},
        {**PERIOD, "group_by": "key,owner", "status": "ok,cancelled"},
        {**PERIOD, "group_by": "hour", "provider": "local", "api": "unified"},
        {**PERIOD, "model": "gemma"},
        {**PERIOD, "group_by": "model,key", "latency": "false"},  # every figure but p50/p95
    ],
)
async def test_the_report_is_the_ledgers_aggregate(gw: GatewayHandle, params: dict[str, str]) -> None:
    rows = await seed(gw)
    response = await gw.client.get(USAGE, params=params)
    assert response.status_code == 200
    answer = response.json()
    assert (answer["from"], answer["to"]) == ("2026-11-28T03:17:42.500000Z", "2026-11-30T16:45:00Z")
    assert {k: answer[k] for k in ("group_by", "rows", "totals")} == expected(rows, parse_query(params, NOW))
    if params.get("latency") == "false":  # grouped by model and key, which would have them
        assert not any("p50_ms" in row or "p95_ms" in row for row in [*answer["rows"], answer["totals"]])


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ("group_by=model,colour", "group_by"),
        ("from=yesterday", "from"),
        ("status=fine", "status"),
        ("api=foo", "api"),
        ("mdoel=x", "mdoel"),
        ("group_by=model&latency=maybe", "latency"),
        ("to=0001-01-01", "to"),  # the default `from`, 30 days before, is before the year 1
        ("from=0001-01-01T00:00:00%2B14:00", "from"),  # in UTC, the year 0
        ("to=9999-12-31T23:59:59-12:00", "to"),  # in UTC, the year 10000
        ("from=2026-01-01&to=9999-12-31", "to"),  # the report's day and hour rounding would overflow
        # filters that name nothing a ledger can hold: they answered an empty report
        ("owner=%FF", "owner"),  # not UTF-8 (the parsed query has U+FFFD there)
        ("model=%ED%A0%80", "model"),  # a surrogate's encoding, not UTF-8 either
        ("model=a%7Fb", "model"),  # DEL
        ("key=a%C2%85b", "key"),  # a C1 control (NEL)
        ("=x", ""),  # a parameter without a name: its message says so
    ],
)
async def test_a_bad_parameter_is_a_400_naming_it(gw: GatewayHandle, query: str, param: str) -> None:
    response = await gw.client.get(f"{USAGE}?{query}")
    assert response.status_code == 400, response.text
    body = response.json()
    error = body["error"]
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", 400, param)
    assert error["message"].startswith(f"{param}: ")
    assert not error["message"].startswith(": unknown parameter")
    assert body["errors"][0]["status"] == "400"
    assert body["errors"][0]["detail"] == error["message"]
    assert response.headers["x-request-id"] == body["request_id"]


async def test_the_page_and_its_script(gw: GatewayHandle) -> None:
    await seed(gw)
    page = await gw.client.get("/usage", params={**PERIOD, "model": "gemma<script>"})
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert "value='gemma&lt;script&gt;'" in page.text
    script = f"/usage/plotly/{metadata.version('plotly')}/plotly.min.js"
    assert f"src='{script[1:]}'" in page.text  # relative to the page (test_the_page_works_under_a_path_prefix)

    located = metadata.distribution("plotly").locate_file("plotly/package_data/plotly.min.js")
    bundle = await asyncio.to_thread(Path(str(located)).read_bytes)
    plain = await gw.client.get(script, headers={"accept-encoding": "identity"})
    assert plain.status_code == 200
    assert plain.content == bundle
    assert plain.headers["cache-control"] == "public, max-age=31536000, immutable"
    packed = await gw.client.get(script, headers={"accept-encoding": "gzip"})
    assert packed.headers["content-encoding"] == "gzip"
    for refused in ("gzip;q=0, identity", "br, *;q=0", "GZIP ; Q=0"):  # RFC 9110: q=0 is "not acceptable"
        assert "content-encoding" not in (await gw.client.get(script, headers={"accept-encoding": refused})).headers
    for accepted in ("deflate, gzip;q=0.5", "*", "x-gzip"):
        response = await gw.client.get(script, headers={"accept-encoding": accepted})
        assert response.headers["content-encoding"] == "gzip", accepted
    assert int(packed.headers["content-length"]) < len(bundle) / 2
    assert packed.content == bundle  # httpx undid the gzip
    assert (await gw.client.get("/usage/plotly/0.0.1/plotly.min.js")).status_code == 404


async def test_a_repeated_filter_means_each_value_in_any_order(gw: GatewayHandle) -> None:
    """Repeats were joined with commas before the `\\,` escapes were read: a first value ending in
    a backslash escaped the joining comma and swallowed the next value."""
    rows = await seed(gw)
    start, end = (datetime.fromisoformat(PERIOD[end]) for end in ("from", "to"))
    mine = sum(1 for row in rows if row["owner"] == "team-x" and start <= row["started_at"] < end)
    assert mine > 0
    for query in ("owner=team-x&owner=zz%5C", "owner=zz%5C&owner=team-x", "owner=zz%5C%5C%5C&owner=team-x"):
        answer = (await gw.client.get(f"{USAGE}?from={PERIOD['from']}&to={PERIOD['to']}&{query}")).json()
        assert answer["totals"]["requests"] == mine, query


async def test_the_page_is_private_and_runs_only_its_own_scripts(gw: GatewayHandle) -> None:
    page = await gw.client.get("/usage", params={"status": " ok,error"})
    assert page.status_code == 200
    assert page.headers["cache-control"] == "private, no-store"
    assert page.headers["x-content-type-options"] == "nosniff"
    policy = page.headers["content-security-policy"]
    assert "default-src 'none'" in policy
    assert "script-src 'self' 'sha256-" in policy
    # a filter of two statuses is shown (and sent again by Apply) as it is, not as "any"
    assert "<option value='ok,error' selected>ok,error</option>" in page.text
    # a period with no rows costs nothing known to be unknown
    empty = await gw.client.get("/usage", params={"from": "2020-01-01", "to": "2020-01-02"})
    assert "<tr><th>cost (USD)</th><td>0</td></tr>" in empty.text
    refused = await gw.client.get("/usage", params={"status": "fine"})
    assert refused.headers["cache-control"] == "private, no-store"


async def test_the_page_names_a_bad_filter(gw: GatewayHandle) -> None:
    page = await gw.client.get("/usage", params={"status": "fine"})
    assert page.status_code == 400
    assert "status: unknown status" in page.text
    assert "<form method='get'>" in page.text


@pytest.mark.parametrize("path", ["/usage", "/usage/"])
async def test_the_page_works_under_a_path_prefix(gw: GatewayHandle, path: str) -> None:
    """Behind a reverse proxy serving the gateway under a prefix (nginx `location /switchyard/ {
    proxy_pass http://gateway/; }`), the page's script and its form resolve under that prefix:
    an absolute `/usage/plotly/...` left the page without charts and its form on a 404."""
    page = await gw.client.get(path, params=PERIOD)
    seen = f"https://proxy.example/switchyard{path}?from=x"  # the page's address in the browser
    script = re.search(r"<script src='([^']*)'>", page.text)
    form = re.search(r"<form method='get'( action='([^']*)')?>", page.text)
    assert script is not None
    assert form is not None
    version = metadata.version("plotly")
    assert urljoin(seen, script.group(1)) == f"https://proxy.example/switchyard/usage/plotly/{version}/plotly.min.js"
    assert urljoin(seen, form.group(2) or "").split("?")[0] == f"https://proxy.example/switchyard{path}"
    proxied = await gw.client.get(urljoin(seen, script.group(1)).removeprefix("https://proxy.example/switchyard"))
    assert proxied.status_code == 200
    assert proxied.headers["content-type"].startswith("text/javascript")


async def test_reports_while_the_database_is_unreachable_are_503_unavailable(gw: GatewayHandle) -> None:
    """The usage API, price drift and the spend page read the database: while it cannot be
    reached they answer 503 `unavailable` (the page as HTML), not a 500 with a traceback logged."""
    assert gw.service.engine is not None
    await gw.service.engine.dispose()
    gw.service.engine = open_engine(f"postgresql+asyncpg://postgres@127.0.0.1:{free_port()}/gone")
    for path in (USAGE, "/api/v1/catalog/drift"):
        response = await gw.client.get(path)
        assert response.status_code == 503, path
        error = response.json()["error"]
        assert (error["type"], error["message"]) == ("unavailable", "the database cannot be reached; try again shortly")
    page = await gw.client.get("/usage")
    assert page.status_code == 503
    assert page.headers["content-type"].startswith("text/html")
    assert "the database cannot be reached" in page.text


async def test_a_report_with_more_rows_than_served_is_a_400_naming_group_by(
    gw: GatewayHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A report's rows are bounded (`MAX_REPORT_ROWS`): a decade by hour x model x key was 644,091
    rows, 206 MB, the process at 676 MB and every request it served stalled for seconds. The
    bound lowered to this ledger's size: exactly as many rows are served, one more is a 400."""
    await seed(gw)
    params = {**PERIOD, "group_by": "hour,model,key", "latency": "false"}
    served = (await gw.client.get(USAGE, params=params)).json()["rows"]
    assert len(served) > 100
    monkeypatch.setattr(usage_routes, "MAX_REPORT_ROWS", len(served))
    assert (await gw.client.get(USAGE, params=params)).json()["rows"] == served
    monkeypatch.setattr(usage_routes, "MAX_REPORT_ROWS", len(served) - 1)
    response = await gw.client.get(USAGE, params=params)
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["param"], error["message"]) == (
        "group_by",
        f"group_by: the report has more than {len(served) - 1} rows: narrow the period, the filters or the groups",
    )
    monkeypatch.setattr(usage_routes, "MAX_REPORT_ROWS", 1)
    page = await gw.client.get("/usage", params=PERIOD)
    assert page.status_code == 400
    assert "more than 1 rows: narrow the period (from, to) or the filters" in page.text  # it has no group_by


async def test_reports_and_the_page_are_gzip_compressed_when_asked(gw: GatewayHandle) -> None:
    """Reports of megabytes went out as they were (44 MB of JSON for an hour x model report);
    compressed now when the client accepts gzip and the answer is larger than a packet."""
    await seed(gw)
    params = {**PERIOD, "group_by": "hour,model", "latency": "false"}
    plain = await gw.client.get(USAGE, params=params, headers={"accept-encoding": "identity"})
    packed = await gw.client.get(USAGE, params=params, headers={"accept-encoding": "gzip"})
    assert "content-encoding" not in plain.headers
    assert packed.headers["content-encoding"] == "gzip"
    assert packed.headers["vary"] == plain.headers["vary"] == "accept-encoding"
    assert int(packed.headers["content-length"]) < len(plain.content) // 3
    assert packed.json() == plain.json()  # httpx decodes it
    small = await gw.client.get(USAGE, params={**PERIOD, "model": "no-such"}, headers={"accept-encoding": "gzip"})
    assert "content-encoding" not in small.headers  # under a packet: as it is
    page = await gw.client.get("/usage", params=PERIOD, headers={"accept-encoding": "gzip"})
    assert page.headers["content-encoding"] == "gzip"
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    assert page.headers["content-security-policy"].startswith("default-src 'none'")
    assert "<form method='get'>" in page.text
