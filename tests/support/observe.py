"""Reading state back through the public surface only: what an upstream received, the gateway's
`/api/v1/models` (live backend state) and `/metrics`, and the ledger's rows."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from devtools.mock_http import ReceivedRequest
from tests.support.gateway import GatewayHandle
from tests.support.upstream import ReplayUpstream
from tests.support.waiting import wait_until

Sample = tuple[str, frozenset[tuple[str, str]]]


def completions(upstream: ReplayUpstream) -> list[ReceivedRequest]:
    """Completion requests the upstream received (probes answered from a queue are in `.requests` too)."""
    return [r for r in upstream.requests if r.path.partition("?")[0].endswith("/chat/completions")]


def probes_at(upstream: ReplayUpstream, path: str) -> list[ReceivedRequest]:
    """Requests to `path` answered from replies queued for that path."""
    return [r for r in upstream.requests if r.path.partition("?")[0] == path]


async def deployments(gw: GatewayHandle, model: str = "chat-1") -> dict[str, dict[str, Any]]:
    """`GET /api/v1/models`: the model's deployments (live backend state) by provider."""
    response = await gw.client.get("/api/v1/models")
    assert response.status_code == 200, response.text
    (entry,) = [m for m in response.json()["data"] if m["id"] == model]
    return {d["provider"]: d for d in entry["deployments"]}


async def model_ready(gw: GatewayHandle, model: str) -> bool:
    response = await gw.client.get("/api/v1/models")
    (entry,) = [m for m in response.json()["data"] if m["id"] == model]
    ready: bool = entry["ready"]
    return ready


def seconds_until(iso: str) -> float:
    return (datetime.fromisoformat(iso) - datetime.now(UTC)).total_seconds()


async def scrape(gw: GatewayHandle) -> dict[Sample, float]:
    """`GET /metrics` as {(name, labels): value}."""
    response = await gw.client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    samples: dict[Sample, float] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            series = (sample.name, frozenset(sample.labels.items()))
            assert series not in samples, series
            samples[series] = sample.value
    return samples


def metric(samples: dict[Sample, float], name: str, **labels: str) -> float | None:
    """The sample with exactly these labels; for backend gauges `provider` (and `model`) suffice."""
    matches = [v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= ls]
    if not matches:
        return None
    assert len(matches) == 1, (name, labels, matches)
    return matches[0]


async def rows_when(gw: GatewayHandle, count: int) -> list[dict[str, Any]]:
    """The ledger rows, once there are `count` of them (a cancelled request's row comes late)."""
    rows: list[dict[str, Any]] = []

    async def enough() -> bool:
        nonlocal rows
        rows = await gw.ledger_rows()
        return len(rows) >= count

    await wait_until(enough, what=lambda: f"{count} ledger rows, have {len(rows)}")
    assert len(rows) == count, rows
    return rows


def row_view(row: dict[str, Any]) -> tuple[Any, ...]:
    """(status, error_type, error_status, attempts, provider): what routing decided for a request."""
    return row["status"], row["error_type"], row["error_status"], row["attempts"], row["provider"]
