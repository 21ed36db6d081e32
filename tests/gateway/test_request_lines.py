"""Every request leaves one canonical `request` log line: routed ones from the pipeline, and those
rejected before routing (bad body, unknown path, wrong method, too large) from the error renderer."""

from __future__ import annotations

import io
import json
import time
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
import structlog

from app.logging import LineWriter
from app.pipeline.accounting import log_line
from catalog.records import RECORD_JSON, LedgerRecord
from tests.gateway.conftest import CATALOG, providers_for
from tests.support.client import USER, post
from tests.support.gateway import GatewayHandle, StartGateway
from tests.support.logs import Logs
from tests.support.replies import answer
from tests.support.upstream import ReplayUpstream


def view(line: dict[str, Any]) -> tuple[Any, ...]:
    return line.get("method"), line.get("path"), line["status"], line["error_status"], line.get("error_type")


async def started(start_gateway: StartGateway, primary: ReplayUpstream, secondary: ReplayUpstream) -> GatewayHandle:
    """A gateway started inside the test, after `logs` began capturing what it writes."""
    return await start_gateway(providers=providers_for(primary, secondary), catalog=CATALOG)


async def test_rejected_requests_each_get_one_request_line(
    logs: Logs, start_gateway: StartGateway, primary: ReplayUpstream, secondary: ReplayUpstream
) -> None:
    gw = await started(start_gateway, primary, secondary)
    not_json = await gw.client.post("/api/v1/completions", content=b"{", headers={"content-type": "application/json"})
    unknown_path = await gw.client.get("/api/v1/nothing-here")
    wrong_method = await gw.client.get("/api/v1/completions")
    too_large = await gw.client.post(
        "/api/v1/completions", content=b"x" * (11 * 1024 * 1024), headers={"content-type": "application/json"}
    )
    responses = [not_json, unknown_path, wrong_method, too_large]
    assert [r.status_code for r in responses] == [400, 404, 405, 413]
    lines = logs.lines("request", gw)
    assert [view(line) for line in lines] == [
        ("POST", "/api/v1/completions", "rejected", 400, "invalid_request_error"),
        ("GET", "/api/v1/nothing-here", "rejected", 404, "not_found_error"),
        ("GET", "/api/v1/completions", "rejected", 405, "invalid_request_error"),
        ("POST", "/api/v1/completions", "rejected", 413, "invalid_request_error"),
    ]
    assert [line["request_id"] for line in lines] == [r.headers["x-request-id"] for r in responses]


async def test_a_routed_request_gets_exactly_one_line_from_the_pipeline(
    logs: Logs, start_gateway: StartGateway, primary: ReplayUpstream, secondary: ReplayUpstream
) -> None:
    gw = await started(start_gateway, primary, secondary)
    primary.enqueue(answer("hi"))
    unknown_model = await post(gw, {"model": "no-such-model", "messages": [USER]})
    ok = await post(gw, {"messages": [USER]})
    assert (unknown_model.status_code, ok.status_code) == (400, 200)
    lines = logs.lines("request", gw)
    assert [(line["api"], line["model"], line["status"], line["error_status"]) for line in lines] == [
        ("unified", None, "error", 400),
        ("unified", "chat-1", "ok", None),
    ]
    assert [line["request_id"] for line in lines] == [unknown_model.headers["x-request-id"], ok.headers["x-request-id"]]


async def test_a_routed_request_line_is_its_ledger_row(
    logs: Logs, start_gateway: StartGateway, primary: ReplayUpstream, secondary: ReplayUpstream
) -> None:
    """The line is written from the ledger record's JSON (encoded once for the journal and the log):
    every ledger column, with the row's values, and nothing of the request's content."""
    gw = await started(start_gateway, primary, secondary)
    primary.enqueue(answer("hi"))
    assert (await post(gw, {"messages": [USER]})).status_code == 200
    [line] = logs.lines("request", gw)
    [row] = await gw.ledger_rows()
    assert set(line) == {"event", "level", *LedgerRecord.__struct_fields__}
    assert line["level"] == "info"
    for name in ("started_at", "finished_at"):
        assert datetime.fromisoformat(line[name]) == datetime.fromisoformat(row[name]).replace(tzinfo=UTC)
    assert Decimal(line["cost_usd"]) == Decimal(row["cost_usd"]) > 0
    assert Decimal(line["estimated_cost_usd"]) == Decimal(row["estimated_cost_usd"])
    plain = set(LedgerRecord.__struct_fields__) - {"started_at", "finished_at", "cost_usd", "estimated_cost_usd"}
    assert {name: line[name] for name in plain} == {name: row[name] for name in plain}
    assert "hi" not in json.dumps(line)


def test_request_lines_follow_the_log_level() -> None:
    quiet, chatty = io.BytesIO(), io.BytesIO()
    for out, level in ((quiet, "warning"), (chatty, "info")):
        writer = LineWriter(out, level=level)
        writer.request_line(b'{"request_id":"r-1","status":"ok"}')
        writer.flush()
    assert quiet.getvalue() == b""
    line = json.loads(chatty.getvalue())
    assert chatty.getvalue().endswith(b"}\n")
    assert line.pop("timestamp").endswith("Z")
    assert line == {"event": "request", "level": "info", "request_id": "r-1", "status": "ok"}


def test_without_the_services_writer_the_line_goes_through_structlog_with_the_same_fields() -> None:
    """An embedding application's pipeline (no `LineWriter`) logs the same fields as the direct line."""
    record = LedgerRecord(
        request_id="r-2",
        started_at=datetime(2026, 12, 1, 10, tzinfo=UTC),
        finished_at=datetime(2026, 12, 1, 10, 0, 1, tzinfo=UTC),
        status="ok",
        streamed=False,
        latency_ms=12.5,
        model="chat-1",
        cost_usd=Decimal("0.000108"),
    )
    with structlog.testing.capture_logs() as captured:
        log_line(structlog.get_logger(), record)
    direct = io.BytesIO()
    writer = LineWriter(direct)
    writer.request_line(RECORD_JSON.encode(record))
    writer.flush()
    [event] = captured
    assert event.pop("log_level") == "info"
    expected = json.loads(direct.getvalue())
    del expected["timestamp"], expected["level"]
    assert event == expected


def test_a_lines_timestamp_is_utc_to_the_millisecond(monkeypatch: pytest.MonkeyPatch) -> None:
    """`2026-12-01T10:00:05.045Z`: the second from `time.gmtime`, the milliseconds truncated and
    zero-padded, both ends of the second included."""
    writer = LineWriter(io.BytesIO())
    second = datetime(2026, 12, 1, 10, 0, 5, tzinfo=UTC).timestamp()
    cases = [(0.0, "000"), (0.0456, "045"), (0.5, "500"), (0.9995, "999")]
    for fraction, millis in cases:
        monkeypatch.setattr(time, "time", lambda fraction=fraction: second + fraction)
        assert writer.stamp.text() == f"2026-12-01T10:00:05.{millis}Z"
    monkeypatch.setattr(time, "time", lambda: second + 61.25)  # a new second: a new prefix
    assert writer.stamp.text() == "2026-12-01T10:01:06.250Z"
