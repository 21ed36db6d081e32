"""A refused key or an exhausted balance: the whole provider leaves rotation (every backend of it),
the request fails over, later requests skip it, and only a successful health probe brings it back
(a probe that itself gets 401 keeps it disabled). A 403 (the key may not use that model) takes
out that backend only.

Probe timing is made deterministic with the upstream: the first probe answer is delayed, so every
request before it runs against the state the test set up, and the health loop (one round at a
time) cannot re-enable anything early.
"""

from __future__ import annotations

import pytest

from devtools.mock_http import Reply
from tests.routing.conftest import PROBE_PATH, launch
from tests.support.client import complete
from tests.support.gateway import StartGateway
from tests.support.observe import completions, deployments, metric, probes_at, row_view, scrape
from tests.support.replies import answer, error, models_reply
from tests.support.transcripts import load_transcript
from tests.support.upstream import ReplayUpstream
from tests.support.waiting import wait_until

PROBING = {"probe_interval_s": 0.1}
FIRST_PROBE_DELAY = 0.5


async def test_401_disables_the_provider_and_fails_over(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream
) -> None:
    gw = await launch(start_gateway, {"alpha": alpha, "beta": beta})
    alpha.enqueue(error(401, "authentication_error"))
    beta.enqueue(answer("from beta"), repeat=3)
    response = await complete(gw)
    assert response.status_code == 200, response.text
    assert response.json()["provider"] == "beta"
    for model in ("chat-1", "even-1"):  # a refused key takes out every backend of the provider
        state = (await deployments(gw, model))["alpha"]
        assert state["ready"] is False
        assert state["disabled_reason"] == "auth: upstream returned 401"
        assert "cooling_until" not in state
    for _ in range(2):
        again = await complete(gw)
        assert again.json()["provider"] == "beta"
    assert len(completions(alpha)) == 1
    first, *rest = await gw.ledger_rows()
    assert row_view(first) == ("ok", None, None, 2, "beta")
    assert [row_view(row) for row in rest] == [("ok", None, None, 1, "beta")] * 2
    samples = await scrape(gw)
    assert metric(samples, "switchyard_provider_disabled_total", provider="alpha", reason="auth") == 1
    assert metric(samples, "switchyard_attempts_total", provider="alpha", outcome="auth") == 1
    assert metric(samples, "switchyard_backend_ready", provider="alpha", model="even-1") == 0


async def test_every_provider_disabled_is_502_then_503_with_the_probe_interval_as_retry_after(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream
) -> None:
    gw = await launch(start_gateway, {"alpha": alpha, "beta": beta}, routing={"probe_interval_s": 30})
    alpha.enqueue(error(401, "authentication_error"))
    beta.enqueue(load_transcript("primalabs_422_budget_exceeded"))
    refused = await complete(gw)
    assert refused.status_code == 502, refused.text
    assert refused.json()["error"]["message"] == "all backends refused the request (alpha: 401; beta: 422)"
    state = await deployments(gw)
    assert {name: (d["ready"], d.get("disabled_reason")) for name, d in state.items()} == {
        "alpha": (False, "auth: upstream returned 401"),
        "beta": (False, "quota: upstream returned 422"),
    }
    samples = await scrape(gw)  # the same state in /metrics
    for provider in ("alpha", "beta"):
        assert metric(samples, "switchyard_backend_provider_disabled", provider=provider, model="chat-1") == 1
        assert metric(samples, "switchyard_backend_probe_failed", provider=provider, model="chat-1") == 0
    response = await complete(gw)
    assert response.status_code == 503, response.text
    assert response.json()["error"]["type"] == "unavailable"
    assert response.headers["retry-after"] == "30"  # the next probe round
    assert (len(completions(alpha)), len(completions(beta))) == (1, 1)
    first, second = await gw.ledger_rows()
    assert row_view(first) == ("error", "upstream_error", 502, 2, "beta")
    assert row_view(second) == ("error", "unavailable", 503, 0, None)


async def test_a_successful_probe_re_enables_a_disabled_provider(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream
) -> None:
    alpha.enqueue(models_reply(first_byte_delay_s=FIRST_PROBE_DELAY), path=PROBE_PATH)
    gw = await launch(start_gateway, {"alpha": alpha, "beta": beta}, routing=PROBING)
    alpha.enqueue(error(401, "authentication_error"))
    alpha.enqueue(answer("alpha is back"))
    beta.enqueue(answer("from beta"), repeat=2)
    assert (await complete(gw)).json()["provider"] == "beta"
    assert (await deployments(gw))["alpha"]["disabled_reason"] == "auth: upstream returned 401"
    assert (await complete(gw)).json()["provider"] == "beta"
    assert len(completions(alpha)) == 1

    async def enabled() -> bool:
        state = (await deployments(gw))["alpha"]
        return bool(state["ready"]) and "disabled_reason" not in state

    await wait_until(enabled, within=3.0)
    response = await complete(gw)
    assert response.json()["provider"] == "alpha"
    assert response.json()["message"]["content"] == [{"kind": "text", "data": "alpha is back"}]
    assert [row_view(row)[3:] for row in await gw.ledger_rows()] == [(2, "beta"), (1, "beta"), (1, "alpha")]


async def test_a_probe_answered_401_keeps_the_provider_disabled(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream
) -> None:
    refused = error(401, "authentication_error")
    alpha.enqueue(error(401, "authentication_error", first_byte_delay_s=FIRST_PROBE_DELAY), path=PROBE_PATH)
    alpha.enqueue(refused, repeat=1000, path=PROBE_PATH)
    gw = await launch(start_gateway, {"alpha": alpha, "beta": beta}, routing=PROBING)
    alpha.enqueue(refused)
    beta.enqueue(answer("from beta"), repeat=2)
    assert (await complete(gw)).json()["provider"] == "beta"
    await wait_until(lambda: len(probes_at(alpha, PROBE_PATH)) >= 4, within=3.0)
    state = (await deployments(gw))["alpha"]
    assert (state["ready"], state["probe_failed"]) == (False, True)
    assert state["disabled_reason"] == "auth: upstream returned 401"
    assert (await complete(gw)).json()["provider"] == "beta"
    assert len(completions(alpha)) == 1
    assert probes_at(beta, PROBE_PATH) == []  # beta's probes got the built-in 200
    assert len(beta.probes) >= 3


async def test_a_local_server_refusing_its_key_stays_disabled_while_health_answers(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream
) -> None:
    """A vLLM started with `--api-key` answers `/health` to anyone: the probe of a provider
    disabled for its key asks `/v1/models` with the key, so a wrong key keeps it out."""
    refused = error(401, "authentication_error")
    alpha.enqueue(error(401, "authentication_error", first_byte_delay_s=FIRST_PROBE_DELAY), path=PROBE_PATH)
    alpha.enqueue(refused, repeat=1000, path=PROBE_PATH)
    alpha.enqueue(Reply(status=200, chunks=[b"{}"]), repeat=1000, path="/health")
    gw = await launch(start_gateway, {"alpha": alpha, "beta": beta}, routing=PROBING, alpha={"kind": "local"})
    alpha.enqueue(refused)
    beta.enqueue(answer("from beta"), repeat=3)
    assert (await complete(gw)).json()["provider"] == "beta"
    await wait_until(lambda: len(probes_at(alpha, PROBE_PATH)) + len(probes_at(alpha, "/health")) >= 4, within=3.0)
    assert (await deployments(gw))["alpha"]["disabled_reason"] == "auth: upstream returned 401"
    assert (await complete(gw)).json()["provider"] == "beta"
    assert len(completions(alpha)) == 1


@pytest.mark.parametrize(
    ("kind", "reply", "reason"),
    [
        pytest.param(
            "primalabs",
            load_transcript("primalabs_422_budget_exceeded"),
            "quota: upstream returned 422",
            id="primalabs-422-budget",
        ),
        pytest.param(
            "openai_compatible",
            load_transcript("openai_429_insufficient_quota"),
            "quota: upstream returned 429",
            id="429-insufficient-quota",
        ),
        pytest.param("fastrun", error(402, "billing_error"), "quota: upstream returned 402", id="402"),
    ],
)
async def test_refused_key_or_exhausted_balance_disables_and_fails_over(
    start_gateway: StartGateway,
    alpha: ReplayUpstream,
    beta: ReplayUpstream,
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
    reply: Reply,
    reason: str,
) -> None:
    monkeypatch.setenv("ROUTING_TEST_ALPHA_KEY", "pl-test-key")
    gw = await launch(
        start_gateway, {"alpha": alpha, "beta": beta}, alpha={"kind": kind, "api_key_env": "ROUTING_TEST_ALPHA_KEY"}
    )
    alpha.enqueue(reply)
    beta.enqueue(answer("from beta"), repeat=2)
    response = await complete(gw)
    assert response.status_code == 200, response.text
    assert response.json()["provider"] == "beta"
    (sent,) = completions(alpha)
    assert sent.headers["authorization"] == "Bearer pl-test-key"
    state = (await deployments(gw))["alpha"]
    assert (state["ready"], state["disabled_reason"]) == (False, reason)
    assert "cooling_until" not in state
    assert (await complete(gw)).json()["provider"] == "beta"
    assert len(completions(alpha)) == 1
    first, second = await gw.ledger_rows()
    assert row_view(first) == ("ok", None, None, 2, "beta")
    assert row_view(second) == ("ok", None, None, 1, "beta")
    samples = await scrape(gw)
    label = reason.partition(":")[0]
    assert metric(samples, "switchyard_provider_disabled_total", provider="alpha", reason=label) == 1


@pytest.mark.parametrize(
    "reply",
    [
        pytest.param(load_transcript("primalabs_403_model_not_allowed"), id="primalabs-403-json"),
        pytest.param(
            Reply(403, [("content-type", "text/html")], [b"<html><body>403 Forbidden</body></html>"]), id="403-html"
        ),
    ],
)
async def test_a_403_takes_out_that_backend_only(
    start_gateway: StartGateway,
    alpha: ReplayUpstream,
    beta: ReplayUpstream,
    monkeypatch: pytest.MonkeyPatch,
    reply: Reply,
) -> None:
    """providers.md: a 403 (the key may not use this model) disables that backend; only a refused
    key (401) or an exhausted balance takes out every backend of the provider."""
    monkeypatch.setenv("ROUTING_TEST_ALPHA_KEY", "pl-test-key")
    gw = await launch(
        start_gateway,
        {"alpha": alpha, "beta": beta},
        alpha={"kind": "primalabs", "api_key_env": "ROUTING_TEST_ALPHA_KEY"},
    )
    alpha.enqueue(reply)
    beta.enqueue(answer("from beta"), repeat=2)
    assert (await complete(gw)).json()["provider"] == "beta"
    chat = (await deployments(gw))["alpha"]
    assert "disabled_reason" not in chat
    assert chat["ready"] is False
    assert "cooling_until" in chat
    even = (await deployments(gw, "even-1"))["alpha"]
    assert (even["ready"], "disabled_reason" in even, "cooling_until" in even) == (True, False, False)
    alpha.enqueue(answer("alpha serves its other model"))
    other = await complete(gw, "even-1")
    assert other.json()["provider"] == "alpha"
    assert (await complete(gw)).json()["provider"] == "beta"  # chat-1 stays off alpha
    assert len(completions(alpha)) == 2


@pytest.mark.parametrize(("recheck", "comes_back"), [(60.0, False), (0.3, True)])
async def test_an_exhausted_balance_stays_out_until_the_quota_recheck(
    start_gateway: StartGateway,
    alpha: ReplayUpstream,
    beta: ReplayUpstream,
    monkeypatch: pytest.MonkeyPatch,
    recheck: float,
    comes_back: bool,
) -> None:
    monkeypatch.setenv("ROUTING_TEST_ALPHA_KEY", "pl-test-key")
    gw = await launch(
        start_gateway,
        {"alpha": alpha, "beta": beta},
        routing={**PROBING, "quota_recheck_s": recheck},
        alpha={"kind": "primalabs", "api_key_env": "ROUTING_TEST_ALPHA_KEY"},
    )
    alpha.enqueue(load_transcript("primalabs_422_budget_exceeded"))
    beta.enqueue(answer("from beta"), repeat=1000)
    assert (await complete(gw)).json()["provider"] == "beta"
    probes_before = len(alpha.probes)
    await wait_until(lambda: len(alpha.probes) >= probes_before + 5, within=3.0)  # /models answers 200 meanwhile
    state = (await deployments(gw))["alpha"]
    assert state["probe_failed"] is False
    assert ("disabled_reason" not in state) is comes_back
    assert len(completions(alpha)) == 1


async def test_retry_after_of_an_exhausted_balance_is_its_recheck(
    start_gateway: StartGateway, alpha: ReplayUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing to try but a provider out of money: back no sooner than `quota_recheck_s` after it
    ran out, so that (not the probe interval) is the 503's Retry-After."""
    monkeypatch.setenv("ROUTING_TEST_ALPHA_KEY", "pl-test-key")
    gw = await launch(
        start_gateway,
        {"alpha": alpha},
        routing={"probe_interval_s": 10, "quota_recheck_s": 60},
        alpha={"kind": "primalabs", "api_key_env": "ROUTING_TEST_ALPHA_KEY"},
    )
    alpha.enqueue(load_transcript("primalabs_422_budget_exceeded"))
    assert (await complete(gw)).status_code == 502
    refused = await complete(gw)
    assert refused.status_code == 503, refused.text
    assert 58 <= int(refused.headers["retry-after"]) <= 60


async def test_retry_after_is_the_soonest_backend_back(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream
) -> None:
    """One backend out 30 s after a 429, the other 3 s after a 500: a request can pass in 3 s."""
    gw = await launch(start_gateway, {"alpha": alpha, "beta": beta}, common={"failure_cooldown_s": 3})
    alpha.enqueue(error(429, "rate_limit_error", {"retry-after": "30"}))
    beta.enqueue(error(500))
    assert (await complete(gw)).status_code == 502
    refused = await complete(gw)
    assert refused.status_code == 429, refused.text
    assert refused.headers["retry-after"] == "3"
