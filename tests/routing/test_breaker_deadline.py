"""The error-rate breaker (opened by failures, closed only by a successful probe), models with no
configured backend, and the request deadline that bounds the whole failover loop."""

from __future__ import annotations

import time

from tests.routing.conftest import PROBE_PATH, launch
from tests.support.client import complete
from tests.support.gateway import StartGateway
from tests.support.logs import Logs
from tests.support.observe import completions, deployments, metric, model_ready, row_view, scrape
from tests.support.replies import answer, error, models_reply
from tests.support.upstream import ReplayUpstream, played
from tests.support.waiting import wait_until

BREAKER = {"breaker_min_samples": 2, "breaker_error_ratio": 0.5, "failure_cooldown_s": 0}


async def test_the_breaker_opens_after_failures_and_a_successful_probe_closes_it(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream
) -> None:
    # The first probe answer comes late: until then no probe round can close the breaker.
    alpha.enqueue(models_reply(first_byte_delay_s=0.6), path=PROBE_PATH)
    gw = await launch(start_gateway, {"alpha": alpha, "beta": beta}, common=BREAKER, routing={"probe_interval_s": 0.1})
    alpha.enqueue(error(502), repeat=2)
    alpha.enqueue(answer("alpha again"))
    beta.enqueue(answer("from beta"), repeat=3)

    assert (await complete(gw)).json()["provider"] == "beta"
    state = (await deployments(gw))["alpha"]
    assert (state["ready"], state["breaker_open"]) == (True, False)  # one sample; no cool-down configured
    assert (await complete(gw)).json()["provider"] == "beta"
    state = (await deployments(gw))["alpha"]
    assert (state["ready"], state["breaker_open"]) == (False, True)
    assert "cooling_until" not in state
    samples = await scrape(gw)
    assert metric(samples, "switchyard_breaker_trips_total", provider="alpha") == 1
    assert metric(samples, "switchyard_cooldowns_total", provider="alpha", reason="failure") is None  # 0 s: none
    assert metric(samples, "switchyard_backend_breaker_open", provider="alpha", model="chat-1") == 1
    assert metric(samples, "switchyard_backend_ready", provider="alpha", model="chat-1") == 0

    assert (await complete(gw)).json()["provider"] == "beta"  # no traffic to an open breaker
    assert len(completions(alpha)) == 2

    async def closed() -> bool:
        state = (await deployments(gw))["alpha"]
        return state["breaker_open"] is False and bool(state["ready"])

    await wait_until(closed, within=3.0)
    response = await complete(gw)
    assert response.json()["provider"] == "alpha"
    assert response.json()["message"]["content"] == [{"kind": "text", "data": "alpha again"}]
    assert [row_view(r)[3:] for r in await gw.ledger_rows()] == [(2, "beta"), (2, "beta"), (1, "beta"), (1, "alpha")]
    samples = await scrape(gw)
    assert metric(samples, "switchyard_breaker_trips_total", provider="alpha") == 1
    assert metric(samples, "switchyard_cooldowns_total", provider="alpha", reason="failure") is None  # 0 s: none
    assert metric(samples, "switchyard_backend_breaker_open", provider="alpha", model="chat-1") == 0


async def test_a_model_with_no_configured_backend_is_503(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream
) -> None:
    gw = await launch(start_gateway, {"alpha": alpha, "beta": beta})
    response = await complete(gw, "orphan-1")
    assert response.status_code == 503, response.text
    assert response.json()["error"]["type"] == "unavailable"
    assert response.json()["error"]["message"] == "no backend is available for this model"
    # api.md lists "none configured" under the 503 with `Retry-After`: the catalog watch's poll
    # (tests/gateway/test_errors.py), when a deployment synced into the catalog would be in use
    assert response.headers["retry-after"] == "5"
    assert alpha.requests == []
    assert beta.requests == []
    (row,) = await gw.ledger_rows()
    assert row_view(row) == ("error", "unavailable", 503, 0, None)
    assert row["model"] == "orphan-1"
    assert await model_ready(gw, "orphan-1") is False
    assert await deployments(gw, "orphan-1") == {}


async def test_the_request_deadline_bounds_the_whole_failover_loop(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream, logs: Logs
) -> None:
    gw = await launch(start_gateway, {"alpha": alpha, "beta": beta}, routing={"request_deadline_s": 0.5})
    alpha.enqueue(played(answer("late"), first_byte_delay_s=5.0))  # first_byte is the default 120 s
    beta.enqueue(answer("never asked"))
    started = time.monotonic()
    response = await complete(gw)
    elapsed = time.monotonic() - started
    assert response.status_code == 504, response.text
    assert response.json()["error"]["type"] == "upstream_error"
    assert 0.45 <= elapsed < 1.2
    assert completions(beta) == []  # the deadline passed during the first attempt
    (row,) = await gw.ledger_rows()
    assert row_view(row) == ("error", "upstream_error", 504, 1, "alpha")
    await wait_until(lambda: alpha.open_connections == 0, within=1.0)  # the stalled attempt was abandoned
    # The attempt the deadline cut is counted and logged like any other (the ledger counts it):
    # with a deadline under `first_byte`, a hung backend would otherwise show nowhere.
    assert metric(await scrape(gw), "switchyard_attempts_total", provider="alpha", outcome="timeout") == 1.0
    warned = logs.lines("request_deadline_before_timeouts", gw)  # at start-up, one per provider
    assert [(line["provider"], line["request_deadline_s"], line["first_byte"]) for line in warned] == [
        ("alpha", 0.5, 120.0),
        ("beta", 0.5, 120.0),
    ]
    (line,) = logs.lines("attempt_failed", gw)
    assert (line["provider"], line["kind"], line["cause"], line["cooldown_s"]) == (
        "alpha",
        "timeout",
        "timed out",
        None,
    )
