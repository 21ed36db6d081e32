"""PostgreSQL out of reach (a `TcpProxy` the test cuts): the service serves on, starts, stops and
is killed without losing a row; the rows reach the database once it is back."""

from __future__ import annotations

import json
import signal
import time
from decimal import Decimal
from pathlib import Path

import httpx

from app.service import ENGINE_DISPOSE_S, LEDGER_CLOSE_S
from tests.ledger_journal.conftest import ServeGateway, ledger_ids, ledger_query, with_port
from tests.support.cli import Process, run_cli
from tests.support.tcp_proxy import TcpProxy
from tests.support.waiting import wait_until_sync


def wait_for_rows(url: str, expected: set[str]) -> None:
    def written() -> bool:
        return expected <= set(ledger_ids(url))

    wait_until_sync(written, 30.0, what=lambda: f"{len(expected - set(ledger_ids(url)))} rows still missing")
    ids = ledger_ids(url)
    assert len(ids) == len(set(ids))


def lines(process: Process, event: str) -> list[dict[str, object]]:
    stdout, _ = process.output()
    return [
        line for text in stdout.splitlines() if text.startswith("{") and (line := json.loads(text))["event"] == event
    ]


def events(process: Process) -> list[str]:
    stdout, _ = process.output()
    return [json.loads(line)["event"] for line in stdout.splitlines() if line.startswith("{")]


def test_kill_9_during_an_outage_loses_no_row(
    tmp_path: Path, mock_upstream: tuple[int, list[Process]], pg_url: str
) -> None:
    port, started = mock_upstream
    with TcpProxy(5432) as proxy:
        gateway = ServeGateway(tmp_path, started, port, with_port(pg_url, proxy.port))
        first = gateway.start()
        before = {gateway.complete(stream=n % 2 == 0) for n in range(20)}
        proxy.cut()
        during = {gateway.complete(stream=n % 2 == 0) for n in range(200)}  # served: rows wait on disk
        ready = httpx.get(f"{gateway.base}/readyz")
        assert (ready.status_code, ready.json()["database"]) == (503, False)
        wait_until_sync(lambda: httpx.get(f"{gateway.base}/readyz").json()["ledger"] == "behind", 10.0)
        first.kill()
        proxy.restore()
        gateway.start()
        wait_for_rows(pg_url, before | during)


def test_start_with_the_database_down_serves_and_writes_once_it_returns(
    tmp_path: Path, mock_upstream: tuple[int, list[Process]], pg_url: str
) -> None:
    port, started = mock_upstream
    with TcpProxy(5432) as proxy:
        gateway = ServeGateway(tmp_path, started, port, with_port(pg_url, proxy.port))
        first = gateway.start()  # migrates, syncs, saves the catalog beside the journal
        earlier = gateway.complete()
        assert first.stop(signal.SIGTERM) in (0, -signal.SIGTERM)
        proxy.cut()
        second = gateway.start()
        streamed = {gateway.complete(stream=True) for _ in range(15)}
        whole = {gateway.complete() for _ in range(15)}
        answered = streamed | whole
        assert ledger_ids(pg_url) == [earlier]
        metrics = httpx.get(f"{gateway.base}/metrics").text
        assert "switchyard_ledger_rows_pending 30.0" in metrics
        proxy.restore()
        wait_for_rows(pg_url, answered | {earlier})
        costs = dict(ledger_query(pg_url, "SELECT request_id, cost_usd FROM ledger"))
        assert costs[earlier] == Decimal("0.0000435")  # 21 input tokens at 1.5/M, 4 output at 3/M
        assert {costs[request_id] for request_id in whole} == {costs[earlier]}  # priced by the saved catalog
        assert {costs[request_id] for request_id in streamed} == {Decimal("0.000057")}  # the mock streams more usage
        wait_until_sync(lambda: httpx.get(f"{gateway.base}/readyz").json()["ledger"] == "ok", 10.0)
        assert "switchyard_ledger_rows_pending 0.0" in httpx.get(f"{gateway.base}/metrics").text
    seen = events(second)
    assert {"database_unreachable", "catalog_from_saved_snapshot", "ledger_outage_started"} <= set(seen)
    assert "ledger_outage_ended" in seen


def test_sigterm_with_the_database_down_exits_promptly_and_loses_nothing(
    tmp_path: Path, mock_upstream: tuple[int, list[Process]], pg_url: str
) -> None:
    port, started = mock_upstream
    with TcpProxy(5432) as proxy:
        gateway = ServeGateway(tmp_path, started, port, with_port(pg_url, proxy.port))
        first = gateway.start()
        proxy.cut()
        answered = {gateway.complete(stream=n % 2 == 0) for n in range(40)}
        began = time.monotonic()
        assert first.stop(signal.SIGTERM) in (0, -signal.SIGTERM)
        assert time.monotonic() - began < LEDGER_CLOSE_S + ENGINE_DISPOSE_S
        assert gateway.segments()  # the rows stayed in the journal
        # said in the log: the shutdown's warnings were dropped, the log writer stopped first
        assert [line["rows"] for line in lines(first, "ledger_closed_with_rows_pending")] == [40]
        assert ledger_ids(pg_url) == []
        proxy.restore()
        gateway.start()
        wait_for_rows(pg_url, answered)


def test_no_database_and_no_saved_catalog_is_a_failed_start_that_says_why(
    tmp_path: Path, mock_upstream: tuple[int, list[Process]], pg_url: str
) -> None:
    port, started = mock_upstream
    with TcpProxy(5432) as proxy:
        proxy.cut()
        gateway = ServeGateway(tmp_path, started, port, with_port(pg_url, proxy.port))
        result = run_cli(tmp_path, "serve", "--config", str(gateway.config), "--port", str(gateway.port))
    assert result.returncode == 1
    assert "the database is unreachable and no catalog snapshot was saved in" in result.stderr
    assert len(result.stderr.splitlines()) == 1  # said once, not under a traceback
