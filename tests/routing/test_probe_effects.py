"""What a probe round does besides up or down: a hosted provider's model list takes the backends it
leaves out out of rotation, a failed probe empties its backends' queues at once, and readiness
checks share the first round and wait a second at most."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest

from devtools.mock_http import Reply
from tests.routing.conftest import PROBE_PATH, launch
from tests.support.client import Held, complete, holding
from tests.support.gateway import GatewayHandle, StartGateway
from tests.support.logs import Logs
from tests.support.observe import completions, deployments, metric, scrape
from tests.support.replies import answer, error, stalled_stream
from tests.support.upstream import ReplayUpstream, reply_json
from tests.support.waiting import wait_until


def listing(*ids: str) -> Reply:
    return reply_json(200, {"object": "list", "data": [{"id": name, "object": "model"} for name in ids]})


ListingAlpha = Callable[[Reply, Reply], Awaitable[GatewayHandle]]


@pytest.fixture
def listing_alpha(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream, monkeypatch: pytest.MonkeyPatch
) -> ListingAlpha:
    """A gateway over alpha, a fastrun provider whose `/models` answers `first` three times, then
    `then`, and beta."""

    async def start(first: Reply, then: Reply) -> GatewayHandle:
        monkeypatch.setenv("ROUTING_TEST_ALPHA_KEY", "fr-test-key")
        alpha.enqueue(first, repeat=3, path=PROBE_PATH)
        alpha.enqueue(then, repeat=1000, path=PROBE_PATH)
        alpha_config = {"kind": "fastrun", "api_key_env": "ROUTING_TEST_ALPHA_KEY"}
        routing = {"probe_interval_s": 0.2}
        return await launch(start_gateway, {"alpha": alpha, "beta": beta}, alpha=alpha_config, routing=routing)

    return start


async def test_a_model_the_hosted_list_leaves_out_is_not_routed_to(
    listing_alpha: ListingAlpha, alpha: ReplayUpstream, beta: ReplayUpstream, logs: Logs
) -> None:
    """fastrun's `/models` lists the models that can serve right now (providers.md). alpha's list
    left chat-1's upstream model out, its answer to a request was 404 "model does not exist", and
    that is the client's 400 with no failover: every request failed while beta could serve."""
    lists = (listing("someone/else", "alpha/even-1"), listing("alpha/chat-1", "alpha/even-1"))
    gw = await listing_alpha(*lists)

    async def unlisted() -> bool:
        return bool((await deployments(gw))["alpha"]["unlisted"])

    await wait_until(unlisted)
    assert (await deployments(gw))["alpha"]["ready"] is False
    assert (await deployments(gw, "even-1"))["alpha"]["unlisted"] is False  # its other model is listed
    beta.enqueue(answer("from beta"))
    response = await complete(gw)
    assert (response.status_code, response.json()["provider"]) == (200, "beta")
    assert completions(alpha) == []

    async def listed_again() -> bool:
        return not (await deployments(gw))["alpha"]["unlisted"]

    await wait_until(listed_again)
    alpha.enqueue(answer("from alpha"))
    assert (await complete(gw)).json()["provider"] == "alpha"
    names = {"provider": "alpha", "model": "chat-1", "upstream_model": "alpha/chat-1", "source": "probe"}
    assert logs.lines("backend_unlisted", gw) == [{**names, "event": "backend_unlisted", "level": "warning"}]
    assert logs.lines("backend_listed") == [{**names, "event": "backend_listed", "level": "info"}]


async def test_a_list_in_another_form_than_the_catalogs_takes_nothing_out(
    listing_alpha: ListingAlpha, alpha: ReplayUpstream, beta: ReplayUpstream, logs: Logs
) -> None:
    """Ids compared case aside and without a `models/` prefix; a list naming none of the
    provider's upstream models (another naming) says nothing, logged once: an exact comparison
    took every backend of the provider out, and `/readyz` with it."""
    lists = (listing("models/Alpha/Chat-1"), listing("acme-chat", "acme-even"))  # even-1 left out, then no match
    gw = await listing_alpha(*lists)

    async def even_unlisted() -> bool:
        return bool((await deployments(gw, "even-1"))["alpha"]["unlisted"])

    await wait_until(even_unlisted)
    assert (await deployments(gw))["alpha"]["unlisted"] is False  # `models/Alpha/Chat-1` is alpha/chat-1

    async def nothing_unlisted() -> bool:
        return not (await deployments(gw, "even-1"))["alpha"]["unlisted"]

    await wait_until(nothing_unlisted)
    await asyncio.sleep(0.5)  # more rounds of the unmatched list: one line
    assert logs.lines("model_list_unmatched", gw) == [
        {
            "event": "model_list_unmatched",
            "level": "error",
            "provider": "alpha",
            "listed": ["acme-chat", "acme-even"],
            "source": "probe",
        }
    ]
    assert (await gw.client.get("/readyz")).status_code == 200


async def test_a_provider_disabled_by_a_requests_401_empties_the_queues_of_all_its_models(
    start_gateway: StartGateway, alpha: ReplayUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """even-1's requests queued on alpha (pinned) behind a held stream, when a chat-1 request
    got 401: only chat-1's queue was woken, even-1's waited its queue timeout out and answered 429."""
    monkeypatch.setenv("ROUTING_TEST_ALPHA_KEY", "fr-test-key")
    policy = {"max_concurrency": 1, "max_queue": 8, "queue_timeout_s": 8}
    alpha_config = {"kind": "fastrun", "api_key_env": "ROUTING_TEST_ALPHA_KEY"}
    gw = await launch(
        start_gateway, {"alpha": alpha}, common=policy, alpha=alpha_config, routing={"probe_interval_s": 60}
    )
    alpha.enqueue(stalled_stream())
    async with holding() as held:
        held.append(Held(gw, "even-1"))
        assert await held[0].started() == "alpha"
        queued = [asyncio.create_task(complete(gw, "even-1", provider="alpha")) for _ in range(2)]

        async def two_queued() -> bool:
            return bool((await deployments(gw, "even-1"))["alpha"]["queued"] == 2)

        await wait_until(two_queued)
        alpha.enqueue(error(401, "authentication_error"))
        refused = time.monotonic()
        assert (await complete(gw)).status_code == 502
        responses = await asyncio.gather(*queued)
        assert time.monotonic() - refused < 2.0
        assert [response.status_code for response in responses] == [503, 503]


async def test_a_failed_probe_sends_the_queued_requests_away_at_once(
    start_gateway: StartGateway, alpha: ReplayUpstream
) -> None:
    """Requests queued on a backend whose probe then failed waited their queue timeout out (8 s)
    for a slot, then answered 429 "at capacity"; a health problem is a 503, now."""
    policy = {"kind": "local", "max_concurrency": 1, "max_queue": 8, "queue_timeout_s": 8}
    gw = await launch(start_gateway, {"alpha": alpha}, common=policy, routing={"probe_interval_s": 0.2})
    alpha.enqueue(stalled_stream())
    async with holding() as held:
        held.append(Held(gw))
        assert await held[0].started() == "alpha"
        queued = [asyncio.create_task(complete(gw)) for _ in range(3)]

        async def three_queued() -> bool:
            return bool((await deployments(gw))["alpha"]["queued"] == 3)

        await wait_until(three_queued)
        alpha.enqueue(error(503, "loading"), repeat=1000, path="/health")
        failing = time.monotonic()
        responses = await asyncio.gather(*queued)
        assert time.monotonic() - failing < 2.0
        assert [response.status_code for response in responses] == [503] * 3


async def test_readiness_checks_share_the_first_round_and_wait_a_second_at_most(
    start_gateway: StartGateway, alpha: ReplayUpstream
) -> None:
    """A probe that hangs held every readiness check before the first round for its 10 s, and each
    check started a round of its own against the upstream."""
    alpha.enqueue(reply_json(200, {"data": []}, first_byte_delay_s=30), path=PROBE_PATH)  # the first probe hangs
    alpha.enqueue(listing(), repeat=1000, path=PROBE_PATH)
    gw = await launch(start_gateway, {"alpha": alpha}, routing={"probe_interval_s": 60})
    started = time.monotonic()
    answers = await asyncio.gather(*(gw.client.get("/readyz") for _ in range(3)))
    assert time.monotonic() - started < 2.0
    assert [response.status_code for response in answers] == [200] * 3  # no probe has said otherwise
    assert len(alpha.probes) + len([r for r in alpha.requests if r.path.endswith("/models")]) == 1


async def test_a_probe_answered_401_disables_the_provider_as_a_requests_401_does(
    listing_alpha: ListingAlpha, alpha: ReplayUpstream, beta: ReplayUpstream, logs: Logs
) -> None:
    """A key revoked while traffic is quiet: the probe's 401 showed as a failed probe, with no
    `provider_disabled` line and no count, unlike the same 401 to a request."""
    gw = await listing_alpha(Reply(401), listing())

    async def disabled() -> bool:
        return (await deployments(gw))["alpha"].get("disabled_reason") == "auth: probe got 401"

    await wait_until(disabled)
    assert logs.lines("provider_disabled", gw) == [
        {
            "event": "provider_disabled",
            "level": "error",
            "provider": "alpha",
            "reason": "auth: probe got 401",
            "status": 401,
            "source": "probe",
        }
    ]
    samples = await scrape(gw)
    assert metric(samples, "switchyard_provider_disabled_total", provider="alpha", reason="auth") == 1
    assert metric(samples, "switchyard_probes_total", provider="alpha", outcome="failed") >= 1

    async def enabled() -> bool:  # the keyed probe that passes brings it back
        return "disabled_reason" not in (await deployments(gw))["alpha"]

    await wait_until(enabled)
    assert metric(await scrape(gw), "switchyard_probes_total", provider="alpha", outcome="ok") >= 1


async def test_a_backend_cooling_down_after_a_429_keeps_the_replica_ready(
    start_gateway: StartGateway, alpha: ReplayUpstream
) -> None:
    """Every replica shares the upstreams: one 429 that cooled the only backend made `/readyz` 503
    on every replica at once, for a balancer's 503 instead of the gateway's own 429 with
    `Retry-After`. A cool-down ends by itself; a failed probe does not, and is not ready."""
    gw = await launch(start_gateway, {"alpha": alpha}, common={"kind": "local"}, routing={"probe_interval_s": 0.2})
    alpha.enqueue(error(429, "rate_limit_error", headers={"retry-after": "60"}), repeat=2)
    for model in ("chat-1", "even-1"):  # both of alpha's upstream models
        assert (await complete(gw, model)).status_code == 429
        assert (await deployments(gw, model))["alpha"]["ready"] is False  # out of rotation, cooling
    assert (await gw.client.get("/readyz")).json()["backends"] is True
    alpha.enqueue(error(503, "loading"), repeat=1000, path="/health")

    async def unready() -> bool:
        return bool((await gw.client.get("/readyz")).status_code == 503)

    await wait_until(unready)


ECHOED_KEY = "fr_live_0123456789abcdefghijklmnopqrstuv"


async def test_a_model_list_that_echoes_the_key_is_not_logged_whole(
    start_gateway: StartGateway,
    alpha: ReplayUpstream,
    beta: ReplayUpstream,
    monkeypatch: pytest.MonkeyPatch,
    logs: Logs,
) -> None:
    """fastrun's `/models` ids, when none matches the catalog, are logged (`model_list_unmatched`)
    as the upstream wrote them: its echo of the probe's `authorization` header, at any length."""
    monkeypatch.setenv("ROUTING_TEST_ALPHA_KEY", ECHOED_KEY)
    listing = reply_json(
        200,
        {
            "object": "list",
            "data": [{"id": f"Bearer {ECHOED_KEY}", "object": "model"}, {"id": "Z" * 1_000_000, "object": "model"}],
        },
    )
    alpha.enqueue(listing, repeat=1000, path=PROBE_PATH)
    alpha_config = {"kind": "fastrun", "api_key_env": "ROUTING_TEST_ALPHA_KEY"}
    gw = await launch(
        start_gateway, {"alpha": alpha, "beta": beta}, alpha=alpha_config, routing={"probe_interval_s": 0.2}
    )

    await wait_until(lambda: bool(logs.lines("model_list_unmatched", gw)), within=5.0)
    assert ECHOED_KEY not in logs.raw
    assert max(len(line) for line in logs.raw.splitlines()) < 4096
