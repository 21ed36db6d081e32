"""429s: the backend that said it is out of rotation for its Retry-After (seconds, HTTP-date or
`x-ratelimit-reset*`), the request fails over, and when every backend is cooling after a 429 the
client gets 429 with the soonest Retry-After, without the gateway asking any upstream."""

from __future__ import annotations

import email.utils
import time
from collections.abc import Callable

import pytest

from devtools.mock_http import Reply
from tests.routing.conftest import launch
from tests.support.client import complete
from tests.support.gateway import GatewayHandle, StartGateway
from tests.support.observe import completions, deployments, metric, row_view, scrape, seconds_until
from tests.support.replies import answer, error
from tests.support.transcripts import load_transcript
from tests.support.upstream import ReplayUpstream

AT_CAPACITY = "all backends for this model are at capacity"


async def _fail_over_after_429(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream
) -> GatewayHandle:
    """Scenario (1): alpha says 429 with `Retry-After: 7`, beta answers; then a second request."""
    gw = await launch(start_gateway, {"alpha": alpha, "beta": beta}, common={"max_concurrency": 8})
    alpha.enqueue("fastrun_429_retry_after")
    beta.enqueue(answer("from beta"), repeat=2)
    first = await complete(gw)
    assert first.status_code == 200, first.text
    assert first.json()["provider"] == "beta"
    assert first.json()["message"]["content"] == [{"kind": "text", "data": "from beta"}]
    assert "retry-after" not in first.headers
    second = await complete(gw)
    assert second.status_code == 200, second.text
    assert second.json()["provider"] == "beta"
    return gw


async def test_429_with_retry_after_seconds_cools_the_backend_and_fails_over(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream
) -> None:
    gw = await _fail_over_after_429(start_gateway, alpha, beta)
    assert len(completions(alpha)) == 1  # the second request went straight to beta
    assert len(completions(beta)) == 2
    assert completions(beta)[0].json()["model"] == "beta/chat-1"
    state = await deployments(gw)
    assert state["alpha"]["ready"] is False
    assert state["alpha"]["cooling_reason"] == "capacity"
    assert 6.0 < seconds_until(state["alpha"]["cooling_until"]) <= 7.0
    assert (state["alpha"]["breaker_open"], state["alpha"].get("disabled_reason")) == (False, None)
    assert state["beta"]["ready"] is True
    assert "cooling_until" not in state["beta"]
    assert "cooling_reason" not in state["beta"]
    first, second = await gw.ledger_rows()
    assert row_view(first) == ("ok", None, None, 2, "beta")
    assert row_view(second) == ("ok", None, None, 1, "beta")


async def test_metrics_count_retries_failovers_cooldowns_and_show_backend_gauges(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream
) -> None:
    gw = await _fail_over_after_429(start_gateway, alpha, beta)
    samples = await scrape(gw)
    assert metric(samples, "switchyard_requests_total", model="chat-1", provider="beta", status="ok") == 2
    assert metric(samples, "switchyard_attempts_total", provider="alpha", outcome="capacity") == 1
    assert metric(samples, "switchyard_attempts_total", provider="beta", outcome="ok") == 2
    assert metric(samples, "switchyard_attempts_total", provider="alpha", outcome="ok") is None
    assert metric(samples, "switchyard_retries_total", model="chat-1") == 1
    assert metric(samples, "switchyard_failovers_total", model="chat-1", provider="beta") == 1
    assert metric(samples, "switchyard_cooldowns_total", provider="alpha", reason="capacity") == 1
    assert metric(samples, "switchyard_cooldowns_total", provider="alpha", reason="failure") is None
    assert metric(samples, "switchyard_cooldowns_total", provider="beta", reason="capacity") is None
    assert metric(samples, "switchyard_breaker_trips_total", provider="alpha") is None
    assert metric(samples, "switchyard_provider_disabled_total", provider="alpha", reason="auth") is None
    gauges = {
        "switchyard_backend_ready": (0, 1),
        "switchyard_backend_in_flight": (0, 0),
        "switchyard_backend_queued": (0, 0),
        "switchyard_backend_limit": (8, 8),
        "switchyard_backend_breaker_open": (0, 0),
        "switchyard_backend_upstream_queue_depth": (0, 0),
    }
    for name, (for_alpha, for_beta) in gauges.items():
        labels = {"model": "chat-1", "upstream_model": "alpha/chat-1"}
        assert metric(samples, name, provider="alpha", **labels) == for_alpha, name
        labels = {"model": "chat-1", "upstream_model": "beta/chat-1"}
        assert metric(samples, name, provider="beta", **labels) == for_beta, name
    cooling = metric(samples, "switchyard_backend_cooling_seconds", provider="alpha", model="chat-1")
    assert cooling is not None
    assert 6.0 < cooling <= 7.0
    assert metric(samples, "switchyard_backend_cooling_seconds", provider="beta", model="chat-1") == 0


def _http_date_in(seconds: float) -> dict[str, str]:
    return {"retry-after": email.utils.formatdate(time.time() + seconds, usegmt=True)}


@pytest.mark.parametrize(
    ("make_reply", "low", "high"),
    [
        pytest.param(lambda: error(429, "rate_limit_error", _http_date_in(5)), 3.9, 5.0, id="retry-after-http-date"),
        pytest.param(
            lambda: error(429, "rate_limit_error", {"x-ratelimit-reset-requests": "2s"}),
            1.5,
            2.0,
            id="x-ratelimit-reset-requests",
        ),
        pytest.param(
            lambda: error(
                429,
                "rate_limit_error",
                {
                    "x-ratelimit-reset-requests": "1m0s",
                    "x-ratelimit-remaining-tokens": "0",
                    "x-ratelimit-reset-tokens": "3s",
                },
            ),
            2.5,
            3.0,
            id="x-ratelimit-exhausted-family-wins",
        ),
        pytest.param(lambda: load_transcript("primalabs_429_no_body"), 3.5, 4.0, id="no-hint-capacity-cooldown"),
        pytest.param(lambda: error(429, "rate_limit_error", {"retry-after": "-5"}), 3.5, 4.0, id="negative-is-no-hint"),
        pytest.param(lambda: error(429, "rate_limit_error", {"retry-after": "86400"}), 29.5, 30.0, id="capped"),
    ],
)
async def test_429_reset_hints_set_the_cool_down(
    start_gateway: StartGateway,
    alpha: ReplayUpstream,
    beta: ReplayUpstream,
    make_reply: Callable[[], Reply],
    low: float,
    high: float,
) -> None:
    gw = await launch(
        start_gateway, {"alpha": alpha, "beta": beta}, common={"capacity_cooldown_s": 4, "max_cooldown_s": 30}
    )
    alpha.enqueue(make_reply())
    beta.enqueue(answer(), repeat=2)
    response = await complete(gw)
    assert response.status_code == 200, response.text
    assert response.json()["provider"] == "beta"
    state = (await deployments(gw))["alpha"]
    assert (state["ready"], state["cooling_reason"]) == (False, "capacity")
    assert low < seconds_until(state["cooling_until"]) <= high
    again = await complete(gw)
    assert again.json()["provider"] == "beta"
    assert len(completions(alpha)) == 1
    first, second = await gw.ledger_rows()
    assert row_view(first) == ("ok", None, None, 2, "beta")
    assert row_view(second) == ("ok", None, None, 1, "beta")


@pytest.mark.parametrize(
    "headers", [{"retry-after": "900"}, {"x-ratelimit-reset-requests": "15m0s", "x-ratelimit-remaining-requests": "0"}]
)
async def test_a_hint_past_five_minutes_is_honoured_up_to_max_cooldown_s(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream, headers: dict[str, str]
) -> None:
    """`max_cooldown_s` is the cap (config.example.toml: "Retry-After included"): a fixed 300 s
    cap under it sent requests back to an upstream that had asked for 15 minutes after 5."""
    gw = await launch(start_gateway, {"alpha": alpha, "beta": beta}, common={"max_cooldown_s": 3600})
    alpha.enqueue(error(429, "rate_limit_error", headers))
    beta.enqueue(answer())
    assert (await complete(gw)).json()["provider"] == "beta"
    state = (await deployments(gw))["alpha"]
    assert (state["ready"], state["cooling_reason"]) == (False, "capacity")
    assert 899.0 < seconds_until(state["cooling_until"]) <= 900.0


async def test_every_backend_429_is_429_with_the_soonest_retry_after_then_no_upstream_request(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream
) -> None:
    gw = await launch(start_gateway, {"alpha": alpha, "beta": beta})
    alpha.enqueue("fastrun_429_retry_after")  # Retry-After: 7
    beta.enqueue("mock_rate_limited")  # Retry-After: 3
    response = await complete(gw)
    assert response.status_code == 429, response.text
    assert response.json()["error"] == {
        "message": AT_CAPACITY,
        "type": "rate_limit_error",
        "code": 429,
        "request_id": response.headers["x-request-id"],
    }
    assert response.headers["retry-after"] == "3"
    state = await deployments(gw)
    assert (state["alpha"]["ready"], state["alpha"]["cooling_reason"]) == (False, "capacity")
    assert (state["beta"]["ready"], state["beta"]["cooling_reason"]) == (False, "capacity")
    assert 6.0 < seconds_until(state["alpha"]["cooling_until"]) <= 7.0
    assert 2.0 < seconds_until(state["beta"]["cooling_until"]) <= 3.0

    again = await complete(gw)
    assert again.status_code == 429, again.text
    assert again.json()["error"]["message"] == AT_CAPACITY
    assert again.headers["retry-after"] == "3"  # beta's remaining cool-down, rounded up
    assert len(completions(alpha)) == 1
    assert len(completions(beta)) == 1
    first, second = await gw.ledger_rows()
    assert row_view(first) == ("error", "rate_limit_error", 429, 2, "beta")
    assert row_view(second) == ("error", "rate_limit_error", 429, 0, None)
    assert second["model"] == "chat-1"
    samples = await scrape(gw)
    assert metric(samples, "switchyard_requests_total", model="chat-1", provider="", status="error") == 1
    assert metric(samples, "switchyard_requests_total", model="chat-1", provider="beta", status="error") == 1
    assert metric(samples, "switchyard_cooldowns_total", provider="beta", reason="capacity") == 1


@pytest.mark.parametrize(
    ("reply", "policy", "told"),
    [
        (error(429, "rate_limit_error"), {"capacity_cooldown_s": 3.0}, "3"),  # no hint: the configured cool-down
        ("fastrun_429_retry_after", {"max_cooldown_s": 2.0}, "2"),  # Retry-After: 7, capped at 2
    ],
    ids=["no-hint", "capped-hint"],
)
async def test_the_429_retry_after_is_when_the_backend_is_back(
    start_gateway: StartGateway, alpha: ReplayUpstream, reply: Reply | str, policy: dict[str, float], told: str
) -> None:
    """A client that honours Retry-After finds the backend back, not still cooling (a bare 429 said
    1 with a 3 s cool-down; a hint above `max_cooldown_s` was passed on uncapped)."""
    gw = await launch(start_gateway, {"alpha": alpha}, alpha=policy)
    alpha.enqueue(reply)
    response = await complete(gw)
    assert response.status_code == 429, response.text
    assert response.headers["retry-after"] == told
    assert 0 < seconds_until((await deployments(gw))["alpha"]["cooling_until"]) <= float(told)


async def test_a_provider_whose_key_is_unset_counts_nothing_toward_retry_after(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream, gamma: ReplayUpstream
) -> None:
    """gamma's key variable is unset: it is out for the process's life, and no probe brings it
    back. It made every answer `Retry-After: 10` (the probe interval), the backends that would be
    back only in 30 s aside; a model served by it alone gets the probe interval (api.md: a 503
    for a disabled backend has one)."""
    unset = {"api_key_env": "SWITCHYARD_TEST_UNSET_KEY"}
    gw = await launch(start_gateway, {"alpha": alpha, "beta": beta, "gamma": gamma}, gamma=unset)
    for upstream in (alpha, beta):
        upstream.enqueue(error(429, "rate_limit_error", {"retry-after": "30"}))
    first, second = await complete(gw), await complete(gw)
    assert (first.status_code, second.status_code) == (429, 429)
    assert (first.headers["retry-after"], second.headers["retry-after"]) == ("30", "30")
    alone = await launch(start_gateway, {"gamma": gamma}, gamma=unset)
    refused = await complete(alone)
    assert refused.status_code == 503, refused.text
    assert refused.headers["retry-after"] == "10"
    assert completions(gamma) == []
