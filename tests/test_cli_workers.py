"""`switchyard serve --workers 2` with `[redis]`: real uvicorn worker processes share one Redis.

Each worker enforces its share of `max_concurrency` (`--workers` reaches the worker processes),
and `/metrics`, whichever worker the scrape reaches, counts the requests every worker served.
Uses the real Redis on this machine under a key prefix of its own, deleted afterwards.
"""

from __future__ import annotations

import functools
import json
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from redis import Redis

from tests.support.cli import Process, cli_env, complete, processes, start_mock, write_config
from tests.support.ports import free_port
from tests.support.tcp_proxy import TcpProxy
from tests.support.waiting import wait_until_sync

SECRET = "sk-test-SECRET-123"
SERVED = ("switchyard_requests_total", {"model": "hosted-model", "provider": "hosted", "status": "ok"})


@pytest.fixture
def prefix() -> Iterator[str]:
    client = Redis.from_url("redis://127.0.0.1:6379/0")
    assert client.ping()
    prefix = f"switchyard-test-{uuid.uuid4().hex[:12]}"
    try:
        yield prefix
    finally:
        keys = list(client.scan_iter(match=f"{prefix}:*"))
        if keys:
            client.delete(*keys)
        client.close()


def _served(text: str) -> float | None:
    """The value of the `SERVED` sample in a `/metrics` text, None when absent."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (sample.name, sample.labels) == SERVED:
                return sample.value
    return None


def test_two_workers_split_the_limit_and_sum_their_metrics(tmp_path: Path, prefix: str) -> None:
    client = Redis.from_url("redis://127.0.0.1:6379/0")
    extra = f'max_concurrency = 4\n\n[redis]\nurl = "redis://127.0.0.1:6379/0"\nkey_prefix = "{prefix}"\n'
    with processes() as started:
        config = write_config(tmp_path, start_mock(tmp_path, started), extra)
        port = free_port()
        args = ["serve", "--config", str(config), "--port", str(port), "--workers", "2"]
        started.append(serve := Process(tmp_path, "serve", args, cli_env(SWITCHYARD_TEST_HOSTED_KEY=SECRET)))
        base = f"http://127.0.0.1:{port}"
        serve.wait_http(f"{base}/healthz")
        wait_until_sync(
            lambda: len(list(client.scan_iter(match=f"{prefix}:metrics:*"))) == 2, what="2 workers' metrics"
        )
        models = {m["id"]: m for m in httpx.get(f"{base}/api/v1/models").json()["data"]}
        assert [d["limit"] for d in models["hosted-model"]["deployments"]] == [2]  # 4 over 2 workers
        assert [d["limit"] for d in models["tiny"]["deployments"]] == [32]  # the default 64 over 2
        for _ in range(6):
            complete(base, "hosted-model", "hello")
        scrapes: list[float | None] = []

        def every_scrape_counts_six() -> bool:
            scrapes.append(_served(httpx.get(f"{base}/metrics").text))
            return scrapes[-8:] == [6] * 8  # eight in a row, from whichever worker answered

        wait_until_sync(every_scrape_counts_six, what=lambda: f"summed metrics, last scrapes {scrapes[-3:]}")
    client.close()


def _count(process: Process, event: str, expected: int) -> bool:
    return process.output()[0].count(f'"event":"{event}"') == expected


def test_connections_redis_reset_are_an_outage_not_a_bug(tmp_path: Path, prefix: str) -> None:
    """uvloop's RuntimeError for a write on a connection Redis reset (redis-py does not wrap it)
    is Redis lost, once per outage, then reconnected; not `redis_listener_failed` and a traceback."""
    with processes() as started, TcpProxy(6379) as proxy:
        extra = f'[redis]\nurl = "redis://127.0.0.1:{proxy.port}/0"\nkey_prefix = "{prefix}"\n'
        config = write_config(tmp_path, start_mock(tmp_path, started), extra)
        port = free_port()
        args = ["serve", "--config", str(config), "--port", str(port)]
        started.append(serve := Process(tmp_path, "serve", args, cli_env(SWITCHYARD_TEST_HOSTED_KEY=SECRET)))
        serve.wait_http(f"http://127.0.0.1:{port}/healthz")
        for outage in range(1, 3):
            proxy.cut()
            proxy.restore()
            reconnects = functools.partial(_count, serve, "redis_reconnected", outage)
            wait_until_sync(reconnects, 10, what="a reconnect")
        assert serve.stop(signal.SIGTERM) in (0, -signal.SIGTERM)
    events = [json.loads(line)["event"] for line in serve.output()[0].splitlines() if line.startswith("{")]
    assert "redis_listener_failed" not in events
    assert (events.count("redis_unavailable"), events.count("redis_reconnected")) == (2, 2)
