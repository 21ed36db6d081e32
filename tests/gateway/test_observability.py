"""What an operator's tooling receives: Prometheus counters that never fall between scrapes, log
lines a line-oriented shipper can read (one JSON object each, on stdout), and the request id on
every line about a request.

- Several workers share one port: a scrape reaches whichever answers, and each adds the others'
  numbers from Redis to its own. Those were written up to a second ago, so a scrape through the
  worker that had just served a request counted it, and the next, through the other worker, did
  not: the sum fell, which Prometheus takes for a counter reset (`rate()` spikes).
- `attempt_failed` is about one attempt of one request: without the request's id it cannot be
  joined to the 502 the client got, its `request` line or its ledger row.
- `switchyard serve` writes JSON lines (config.example.toml, `log_level`); uvicorn's own lines (a
  malformed request, an unsupported `Upgrade`, a traceback) and libraries' warnings were plain
  text on stderr, a traceback over many lines.
- `switchyard_responses_total` counts every request answered with an error, those the connection
  answers itself (unparsable, too slow, headers too large) too.
"""

from __future__ import annotations

import asyncio
import json
import socket
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from tests.gateway.conftest import CATALOG, providers_for
from tests.support.cli import Process, cli_env, processes, script_lines, start_mock, write_config
from tests.support.client import complete
from tests.support.gateway import GatewayHandle, StartGateway
from tests.support.logs import Logs
from tests.support.observe import metric, scrape
from tests.support.ports import free_port
from tests.support.replies import answer, error
from tests.support.upstream import ReplayUpstream
from tests.support.waiting import wait_until, wait_until_sync

REDIS_URL = "redis://127.0.0.1:6379/15"


@pytest.fixture
async def redis_prefix() -> AsyncIterator[str]:
    """A key prefix of this test's own in the real Redis, its keys deleted afterwards. Listed
    before `start_gateway` in a test's arguments, so it is torn down after the gateways."""
    client = Redis.from_url(REDIS_URL)
    assert await client.ping()
    prefix = f"obsaud-test-{uuid.uuid4().hex[:12]}"
    yield prefix
    keys = [key async for key in client.scan_iter(match=f"{prefix}:*")]
    if keys:
        await client.delete(*keys)
    await client.aclose()


def _served(samples: dict[Any, float]) -> float | None:
    return metric(samples, "switchyard_requests_total", model="chat-1", provider="primary", status="ok")


async def test_a_counter_never_falls_whichever_worker_answers_the_scrape(
    redis_prefix: str, start_gateway: StartGateway, primary: ReplayUpstream, secondary: ReplayUpstream
) -> None:
    config = {"url": REDIS_URL, "key_prefix": redis_prefix}
    a = await start_gateway(providers=providers_for(primary, secondary), catalog=CATALOG, redis=config)
    b = await start_gateway(providers=providers_for(primary, secondary), catalog=CATALOG, redis=config)
    client = Redis.from_url(REDIS_URL)
    try:

        async def both_shared() -> bool:
            return len([key async for key in client.scan_iter(match=f"{redis_prefix}:metrics:*")]) == 2

        await wait_until(both_shared, what="both workers' metrics in Redis")
    finally:
        await client.aclose()
    primary.enqueue(answer(), repeat=3)
    for served in range(1, 4):
        assert (await complete(a)).status_code == 200
        # Prometheus scrapes one after the other, through the shared port: a, then b
        assert [_served(await scrape(a)), _served(await scrape(b))] == [served, served]


async def test_an_attempt_failed_line_names_its_request(
    logs: Logs, start_gateway: StartGateway, primary: ReplayUpstream, secondary: ReplayUpstream
) -> None:
    gw = await start_gateway(providers=providers_for(primary, secondary), catalog=CATALOG)
    primary.enqueue(error(503, "unavailable"))
    secondary.enqueue(answer("from secondary"))
    response = await complete(gw)
    assert response.status_code == 200, response.text
    request_id = response.headers["x-request-id"]
    (row,) = await gw.ledger_rows()
    assert (row["request_id"], row["provider"], row["attempts"]) == (request_id, "secondary", 2)
    (line,) = logs.lines("attempt_failed", gw)
    assert (line["request_id"], line["provider"], line["status"]) == (request_id, "primary", 503)
    assert [line["request_id"] for line in logs.lines("request")] == [request_id]


def _exchange(port: int, data: bytes) -> bytes:
    """`data` on a new connection; everything the gateway answers until it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(data)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    return received


MALFORMED = b"GET /healthz HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n"
H2C = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
H2C += b"HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\nConnection: close\r\n\r\n"


def test_serve_writes_only_json_lines_on_stdout_for_malformed_and_upgrade_requests(tmp_path: Path) -> None:
    with processes() as started:
        config = write_config(tmp_path, start_mock(tmp_path, started))
        port = free_port()
        args = ["serve", "--config", str(config), "--port", str(port)]
        env = cli_env(SWITCHYARD_TEST_HOSTED_KEY="sk-test-hosted")
        started.append(serve := Process(tmp_path, "serve", args, env))
        serve.wait_http(f"http://127.0.0.1:{port}/healthz")
        refused = _exchange(port, MALFORMED)
        assert refused.startswith(b"HTTP/1.1 400 Bad Request\r\n")
        refused_id = next(
            line.split(b": ", 1)[1].decode() for line in refused.split(b"\r\n") if line.startswith(b"x-request-id: ")
        )
        upgraded = _exchange(port, H2C)
        assert upgraded.startswith(b"HTTP/1.1 200 OK\r\n")

        def logged() -> bool:
            return f'"request_id":"{refused_id}"' in serve.output()[0]

        wait_until_sync(logged, 5, what="the refused request's line")
        out, err = serve.output()
    assert err == ""
    lines = [json.loads(line) for line in out.splitlines()]  # every line one JSON object
    assert all(isinstance(line, dict) and {"event", "level", "timestamp"} <= line.keys() for line in lines)
    (refusal,) = [line for line in lines if line.get("request_id") == refused_id]
    assert (refusal["event"], refusal["status"], refusal["error_status"]) == ("request", "rejected", 400)
    assert [line["event"] for line in lines if line["level"] != "info"] == []


async def test_a_request_the_connection_refuses_is_counted_by_its_status(gw: GatewayHandle) -> None:
    """`switchyard_responses_total` counts "every other request answered with an error" (its HELP):
    the 400 for a request httptools cannot parse is answered by the connection, not the app."""
    port = int(gw.url.rsplit(":", 1)[1])
    refused = await asyncio.to_thread(_exchange, port, MALFORMED)
    assert refused.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert (await gw.client.post("/api/v1/completions", content=b"{")).status_code == 400  # the app's own 400
    assert metric(await scrape(gw), "switchyard_responses_total", code="400") == 2


ESCAPED = """
import logging, sys, warnings
from app.cli import _uvicorn_config
from app.settings import load_settings

_uvicorn_config(load_settings(sys.argv[1]), "127.0.0.1", 0)  # what `serve` runs before uvicorn starts
warnings.warn("a library's warning", UserWarning)
try:
    raise RuntimeError("boom")
except RuntimeError as exc:  # uvicorn's words for an exception that escaped the app
    logging.getLogger("uvicorn.error").error("Exception in ASGI application\\n", exc_info=exc)
"""


def test_uvicorn_tracebacks_and_library_warnings_are_one_json_line_each(tmp_path: Path) -> None:
    lines = script_lines(tmp_path, ESCAPED)
    shown = [{k: v for k, v in line.items() if k not in ("timestamp", "exception")} for line in lines]
    assert shown == [
        {"logger": "py.warnings", "event": "<string>:7: UserWarning: a library's warning", "level": "warning"},
        {"logger": "uvicorn.error", "event": "Exception in ASGI application", "level": "error"},
    ]
    assert lines[1]["exception"].splitlines()[-1] == "RuntimeError: boom"
