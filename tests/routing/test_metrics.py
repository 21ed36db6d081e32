"""`/metrics` histograms and the token and cost counters, as `Metrics.request_done` fills them.

The pipeline calls `request_done(ctx, outcome)` once per finished request; here a running gateway's
`Metrics` gets requests with known timings, usage and cost straight through that call, and the
test reads them back through `GET /metrics` (the service's own registry, prometheus_client's
text, parsed by prometheus_client's parser). Times are `perf_counter` values picked away from
bucket bounds, except where a bound itself is the point (`le` is inclusive).
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from decimal import Decimal

import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.context import RequestContext
from app.errors import AllBackendsFailed
from app.metrics import Metrics
from app.pipeline.events import UNPRICED, Cost, Outcome
from catalog.records import LedgerStatus
from providers.events import Usage
from providers.types import Message, TextPart
from tests.routing.conftest import launch
from tests.support.client import complete, stream
from tests.support.gateway import GatewayHandle, StartGateway
from tests.support.observe import Sample, metric, scrape
from tests.support.replies import answer, error, stream_answer
from tests.support.upstream import ReplayUpstream

T0 = 100.0  # every request starts here
DURATION = "switchyard_request_duration_seconds"
FIRST_TOKEN = "switchyard_time_to_first_token_seconds"
SPEED = "switchyard_output_tokens_per_second"
SECONDS_LE = ("0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1.0", "2.5", "5.0", "10.0", "30.0", "60.0")
SECONDS_LE += ("120.0", "300.0", "+Inf")
SPEED_LE = ("1.0", "5.0", "10.0", "25.0", "50.0", "100.0", "250.0", "500.0", "1000.0", "2500.0", "5000.0", "+Inf")


def context() -> RequestContext:
    return RequestContext(
        request_id="r", ingress="unified", stream=True, deadline=0.0, started_at=datetime.now(UTC), started=T0
    )


def outcome(
    provider: str | None,
    finished: float,
    first: float | None = None,
    usage: Usage | None = None,
    cost: Cost = UNPRICED,
    status: LedgerStatus = "ok",
) -> Outcome:
    """A finished `chat-1` request; times in seconds after T0."""
    first_content = None if first is None else T0 + first
    return Outcome(
        status=status,
        finished=T0 + finished,
        model="chat-1",
        provider=provider,
        first_content=first_content,
        usage=usage,
        cost=cost,
    )


REQUESTS = [
    # 0.4 s, first content at 0.2 s: (20 + 4) tokens over 0.2 s, 120/s
    outcome("alpha", 0.4, 0.2, Usage(10, 20, 4, 3, 2), Cost(usd=Decimal("0.00042"), source="estimated")),
    # first content at exactly 1 s (counted in the `1.0` bucket: `le` is inclusive); 6 tokens over 1 s
    outcome("alpha", 2.0, 1.0, Usage(5, 6), Cost(usd=Decimal("0.001"), source="authoritative")),
    # no output tokens: no speed
    outcome("alpha", 0.2, 0.2, Usage(7), Cost(usd=Decimal("0.00001"), source="estimated")),
    # usage unknown: no tokens, no speed; unpriced: no cost
    outcome("beta", 0.5, 0.015),
    # failed before any backend answered: no provider, no first content
    outcome(None, 0.03, status="error"),
]


def finish_all(gw: GatewayHandle, requests: list[Outcome]) -> None:
    ctx = context()
    for done in requests:
        gw.service.metrics.request_done(ctx, done)


def buckets(samples: dict[Sample, float], name: str, **labels: str) -> dict[str, float]:
    """A histogram's non-empty buckets ({le: cumulative count}, from the first that counts)."""
    found = {le: metric(samples, f"{name}_bucket", le=le, **labels) for le in _les(name)}
    assert None not in found.values(), found
    return {le: value for le, value in found.items() if value}


def _les(name: str) -> tuple[str, ...]:
    return SPEED_LE if name == SPEED else SECONDS_LE


def cumulative(name: str, *counts: tuple[str, int]) -> dict[str, float]:
    """{le: cumulative count} from (le, count) pairs, up to +Inf."""
    les = _les(name)
    per = dict(counts)
    out: dict[str, float] = {}
    total = 0
    for le in les[les.index(counts[0][0]) :]:
        total += per.get(le, 0)
        out[le] = total
    return out


@pytest.fixture
async def gw(start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream) -> GatewayHandle:
    return await launch(start_gateway, {"alpha": alpha, "beta": beta})


async def test_histograms_count_duration_first_token_and_speed_per_model_and_provider(gw: GatewayHandle) -> None:
    finish_all(gw, REQUESTS)
    samples = await scrape(gw)
    alpha = {"model": "chat-1", "provider": "alpha"}
    beta = {"model": "chat-1", "provider": "beta"}
    nobody = {"model": "chat-1", "provider": ""}
    assert buckets(samples, DURATION, **alpha) == cumulative(DURATION, ("0.25", 1), ("0.5", 1), ("2.5", 1))
    assert buckets(samples, DURATION, **beta) == cumulative(DURATION, ("0.5", 1))  # 0.5 s exactly: `le` is inclusive
    assert buckets(samples, DURATION, **nobody) == cumulative(DURATION, ("0.05", 1))
    assert buckets(samples, FIRST_TOKEN, **alpha) == cumulative(FIRST_TOKEN, ("0.25", 2), ("1.0", 1))
    assert buckets(samples, FIRST_TOKEN, **beta) == cumulative(FIRST_TOKEN, ("0.025", 1))
    assert metric(samples, f"{FIRST_TOKEN}_count", **nobody) is None
    assert buckets(samples, SPEED, **alpha) == cumulative(SPEED, ("10.0", 1), ("250.0", 1))
    assert metric(samples, f"{SPEED}_count", **beta) is None
    expected_sums = [
        (DURATION, alpha, 2.6, 3),
        (DURATION, beta, 0.5, 1),
        (DURATION, nobody, 0.03, 1),
        (FIRST_TOKEN, alpha, 1.4, 3),
        (FIRST_TOKEN, beta, 0.015, 1),
        (SPEED, alpha, 126.0, 2),
    ]
    for name, labels, total, count in expected_sums:
        assert metric(samples, f"{name}_sum", **labels) == pytest.approx(total, rel=1e-9), (name, labels)
        assert metric(samples, f"{name}_count", **labels) == count, (name, labels)
    assert metric(samples, "switchyard_requests_total", status="ok", **alpha) == 3
    assert metric(samples, "switchyard_requests_total", status="ok", **beta) == 1
    assert metric(samples, "switchyard_requests_total", status="error", **nobody) == 1


async def test_tokens_by_bucket_and_cost_by_source_count_only_what_is_known(gw: GatewayHandle) -> None:
    finish_all(gw, REQUESTS)
    samples = await scrape(gw)
    tokens = {
        (labels["provider"], labels["bucket"]): value
        for (name, frozen), value in samples.items()
        if name == "switchyard_tokens_total"
        for labels in [dict(frozen)]
    }
    assert tokens == {
        ("alpha", "input"): 22,
        ("alpha", "output"): 26,
        ("alpha", "reasoning"): 4,
        ("alpha", "cache_read"): 3,
        ("alpha", "cache_write"): 2,
    }
    costs = {
        (dict(frozen)["provider"], dict(frozen)["source"]): value
        for (name, frozen), value in samples.items()
        if name == "switchyard_cost_usd_total"
    }
    assert costs == {("alpha", "estimated"): 0.00043, ("alpha", "authoritative"): 0.001}


async def test_exposition_declares_every_family_with_its_type(gw: GatewayHandle) -> None:
    finish_all(gw, REQUESTS[:1])
    response = await gw.client.get("/metrics")
    types = {family.name: family.type for family in text_string_to_metric_families(response.text)}
    assert types == {
        "switchyard_requests": "counter",
        "switchyard_attempts": "counter",
        "switchyard_retries": "counter",
        "switchyard_failovers": "counter",
        "switchyard_cooldowns": "counter",
        "switchyard_breaker_trips": "counter",
        "switchyard_probes": "counter",
        "switchyard_provider_disabled": "counter",
        "switchyard_tokens": "counter",
        "switchyard_cost_usd": "counter",
        "switchyard_limits_local": "counter",
        "switchyard_responses": "counter",
        DURATION: "histogram",
        FIRST_TOKEN: "histogram",
        SPEED: "histogram",
        "switchyard_backend_ready": "gauge",
        "switchyard_backend_in_flight": "gauge",
        "switchyard_backend_queued": "gauge",
        "switchyard_backend_limit": "gauge",
        "switchyard_backend_cooling_seconds": "gauge",
        "switchyard_backend_breaker_open": "gauge",
        "switchyard_backend_probe_failed": "gauge",
        "switchyard_backend_provider_disabled": "gauge",
        "switchyard_backend_upstream_queue_depth": "gauge",
        "switchyard_ledger_rows_pending": "gauge",
        "switchyard_ledger_oldest_pending_seconds": "gauge",
        "switchyard_ledger_journal_writable": "gauge",
    }
    assert "# TYPE switchyard_request_duration_seconds histogram\n" in response.text
    assert 'switchyard_tokens_total{bucket="output",model="chat-1",provider="alpha"} 20.0\n' in response.text


async def test_requests_through_the_gateway_fill_histograms_and_token_counters(
    gw: GatewayHandle, alpha: ReplayUpstream
) -> None:
    """The pipeline reports every finished request once (`Metrics.request_done`), routed or not.
    First content and speed only for the streams: a whole answer's content came with its end (its
    speed read 1.46 million tokens a second)."""
    for _ in range(2):
        alpha.enqueue(answer())
        assert (await complete(gw)).status_code == 200
        alpha.enqueue(stream_answer())
        await stream(gw)
    assert (await complete(gw, "orphan-1")).status_code == 503
    samples = await scrape(gw)
    pair = {"model": "chat-1", "provider": "alpha"}
    for name, count in ((DURATION, 4), (FIRST_TOKEN, 2), (SPEED, 2)):
        assert metric(samples, f"{name}_count", **pair) == count, name
        assert metric(samples, f"{name}_bucket", le="+Inf", **pair) == count, name
    first_token, duration = metric(samples, f"{FIRST_TOKEN}_sum", **pair), metric(samples, f"{DURATION}_sum", **pair)
    assert first_token is not None
    assert duration is not None
    assert 0 < first_token <= duration < 5
    assert metric(samples, f"{DURATION}_count", model="orphan-1", provider="") == 1
    assert metric(samples, f"{FIRST_TOKEN}_count", model="orphan-1", provider="") is None
    tokens = {dict(labels)["bucket"]: v for (n, labels), v in samples.items() if n == "switchyard_tokens_total"}
    assert tokens == {"input": 12, "output": 4, "reasoning": 0, "cache_read": 0, "cache_write": 0}
    assert not [s for s in samples if s[0] == "switchyard_cost_usd_total"]  # this catalog has no prices


async def test_responses_are_counted_by_status_routed_or_refused_before_routing(
    gw: GatewayHandle, alpha: ReplayUpstream, beta: ReplayUpstream
) -> None:
    """`switchyard_requests_total{status="error"}` holds a client's 400 and an upstream's 502 alike,
    and requests refused before routing (a bad body, an unknown path) were in no counter: an error
    rate by status could not be written."""
    alpha.enqueue(answer())
    assert (await complete(gw)).status_code == 200
    assert (await gw.client.post("/api/v1/completions", content=b"{")).status_code == 400
    assert (await gw.client.get("/api/v1/nowhere")).status_code == 404
    alpha.enqueue(error(500))
    beta.enqueue(error(500))
    assert (await complete(gw)).status_code == 502
    assert (await complete(gw, "orphan-1")).status_code == 503
    samples = await scrape(gw)
    codes = {dict(labels)["code"]: v for (n, labels), v in samples.items() if n == "switchyard_responses_total"}
    assert codes == {"200": 1, "400": 1, "404": 1, "502": 1, "503": 1}


def test_a_finished_request_leaves_the_metrics_nothing_of_its_answer() -> None:
    """`request_done` keeps what it counts until the next scrape or the 256th request, not the
    Outcome: its message is the whole answer (an agent's tool call of megabytes), and 255 of them
    stayed alive in every worker between two scrapes."""
    answer_text = "x" * 1_000_000
    error = AllBackendsFailed("every backend failed")
    alive = sys.getrefcount(answer_text), sys.getrefcount(error)
    done = msgspec.structs.replace(
        outcome("alpha", 0.4, 0.2, Usage(10, 20), status="error"),
        message=Message(role="assistant", content=[TextPart(answer_text)]),
        error=error,
    )
    metrics = Metrics()
    metrics.request_done(context(), done)
    del done
    assert (sys.getrefcount(answer_text), sys.getrefcount(error)) == alive
    samples = metrics.samples()
    assert samples[("switchyard_requests_total", ("chat-1", "alpha", "error"))] == 1
    assert samples[("switchyard_responses_total", ("502",))] == 1
