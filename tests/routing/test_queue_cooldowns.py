"""Requests queued on a backend when a failure or a 429 cools it down: a cool-down that ends
before their queue deadline is waited out holding the slot (`Candidates._kept`), one past it, a
breaker or a disabled provider sends them away at once, and a cancelled one gives its slot back."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import httpx

from tests.routing.conftest import launch
from tests.support.client import Held, complete, holding
from tests.support.gateway import GatewayHandle, StartGateway
from tests.support.observe import completions, deployments, row_view, rows_when
from tests.support.replies import answer, error, stalled_stream
from tests.support.upstream import ReplayUpstream
from tests.support.waiting import wait_until


async def failing_first(
    start_gateway: StartGateway, alpha: ReplayUpstream
) -> tuple[GatewayHandle, asyncio.Task[httpx.Response]]:
    """alpha, one slot and a queue, a 1 s cool-down after a failure; a first request in flight
    that gets a 503 at 0.3 s; any later one answered."""
    policy = {"max_concurrency": 1, "max_queue": 8, "failure_cooldown_s": 1}
    gw = await launch(start_gateway, {"alpha": alpha}, common=policy)
    alpha.enqueue(error(503, "unavailable", first_byte_delay_s=0.3))
    alpha.set_default(answer("after the cool-down"))
    first = asyncio.create_task(complete(gw))
    await wait_until(lambda: len(completions(alpha)) == 1)
    return gw, first


async def test_requests_queued_behind_a_transient_failure_wait_out_its_cool_down(
    start_gateway: StartGateway, alpha: ReplayUpstream
) -> None:
    """alpha, one slot, three requests queued behind one that gets a 503 (a 1 s cool-down, well
    inside the 10 s queue timeout): the slot passed to the next in the queue, which used to find
    the backend out and answer 503, and so did every other, at once. They now hold their place
    through the cool-down (nothing reaches alpha meanwhile) and are served after it, in turn."""
    gw, first = await failing_first(start_gateway, alpha)
    queued = [asyncio.create_task(complete(gw)) for _ in range(3)]
    await wait_until(_alpha_is(gw, in_flight=1, queued=3))
    assert (await first).status_code == 502
    failed_at = time.monotonic()
    await wait_until(_alpha_is(gw, in_flight=1, queued=2))  # the head of the queue holds the slot
    await asyncio.sleep(0.5)
    assert len(completions(alpha)) == 1  # still cooling: nothing sent
    responses = await asyncio.gather(*queued)
    assert time.monotonic() - failed_at >= 0.9
    assert [(r.status_code, r.json()["provider"]) for r in responses] == [(200, "alpha")] * 3
    assert len(completions(alpha)) == 4
    await wait_until(_alpha_is(gw, in_flight=0, queued=0))


async def test_requests_queued_behind_a_failure_leave_when_its_cool_down_outlasts_their_wait(
    start_gateway: StartGateway, alpha: ReplayUpstream
) -> None:
    """The same queue, but the cool-down (5 s) ends after the queue timeout (1 s): waiting it out
    cannot serve them, so they answer 503 at once, as when nothing was there to try, and are not
    sent to the cooling backend (they once were: 4 upstream requests where 1 belonged)."""
    policy = {"max_concurrency": 1, "max_queue": 8, "failure_cooldown_s": 5, "queue_timeout_s": 1}
    gw = await launch(start_gateway, {"alpha": alpha}, common=policy)
    alpha.enqueue(error(503, "unavailable", first_byte_delay_s=0.3))
    alpha.set_default(answer("should not be asked"))
    started = time.monotonic()
    responses = await asyncio.gather(*(complete(gw) for _ in range(4)))
    assert time.monotonic() - started < 0.9
    assert len(completions(alpha)) == 1
    assert sorted(response.status_code for response in responses) == [502, 503, 503, 503]
    await wait_until(_alpha_is(gw, in_flight=0, queued=0))


async def test_a_request_cancelled_while_it_waits_out_a_cool_down_gives_its_slot_back(
    start_gateway: StartGateway, alpha: ReplayUpstream
) -> None:
    gw, first = await failing_first(start_gateway, alpha)
    waiter = asyncio.create_task(complete(gw))
    await wait_until(_alpha_is(gw, in_flight=1, queued=1))
    assert (await first).status_code == 502
    await wait_until(_alpha_is(gw, in_flight=1, queued=0))  # the waiter holds the slot, cooling
    waiter.cancel()
    await wait_until(_alpha_is(gw, in_flight=0, queued=0))
    await asyncio.sleep(1)
    response = await complete(gw)
    assert (response.status_code, response.json()["provider"]) == (200, "alpha")
    assert len(completions(alpha)) == 2
    rows = await rows_when(gw, 3)
    assert sorted(row_view(row) for row in rows) == [
        ("cancelled", None, None, 0, None),
        ("error", "upstream_error", 502, 1, "alpha"),
        ("ok", None, None, 1, "alpha"),
    ]


async def test_a_breaker_that_opens_during_the_wait_sends_the_request_away_at_once(
    start_gateway: StartGateway, alpha: ReplayUpstream
) -> None:
    """alpha, two slots: A fails at 0.3 s (a 3 s cool-down), C waits it out holding A's slot, B
    fails at 1 s and opens the breaker (2 of 2). C leaves then, not when the cool-down ends."""
    breaker = {"breaker_min_samples": 2, "breaker_error_ratio": 1.0}
    policy = {"max_concurrency": 2, "max_queue": 8, "failure_cooldown_s": 3, **breaker}
    gw = await launch(start_gateway, {"alpha": alpha}, common=policy, routing={"probe_interval_s": 60})
    alpha.enqueue(error(503, "unavailable", first_byte_delay_s=0.3))
    alpha.enqueue(error(503, "unavailable", first_byte_delay_s=1.0))
    alpha.set_default(answer("should not be asked"))
    first = asyncio.create_task(complete(gw))
    await wait_until(lambda: len(completions(alpha)) == 1)
    second = asyncio.create_task(complete(gw))
    await wait_until(lambda: len(completions(alpha)) == 2)
    third = asyncio.create_task(complete(gw))
    await wait_until(_alpha_is(gw, in_flight=2, queued=1))
    assert (await first).status_code == 502
    assert (await second).status_code == 502
    opened = time.monotonic()
    response = await third
    assert time.monotonic() - opened < 0.5  # within a step of the breaker, not at the cool-down's end
    assert response.status_code == 503
    assert len(completions(alpha)) == 2


async def test_a_cool_down_ending_just_before_the_requests_deadline_is_not_waited_out(
    start_gateway: StartGateway, alpha: ReplayUpstream
) -> None:
    """A 2 s cool-down and a request deadline 2.5 s away: waiting it out would leave the attempt
    half a second, so the queued request answers 503 with its Retry-After at once."""
    policy = {"max_concurrency": 1, "max_queue": 8, "failure_cooldown_s": 2}
    gw = await launch(start_gateway, {"alpha": alpha}, common=policy, routing={"request_deadline_s": 2.5})
    alpha.enqueue(error(503, "unavailable", first_byte_delay_s=0.3))
    alpha.set_default(answer("should not be asked"))
    first = asyncio.create_task(complete(gw))
    await wait_until(lambda: len(completions(alpha)) == 1)
    waiter = asyncio.create_task(complete(gw))
    assert (await first).status_code == 502
    failed = time.monotonic()
    response = await waiter
    assert time.monotonic() - failed < 0.5
    assert (response.status_code, response.headers["retry-after"]) == (503, "2")
    assert len(completions(alpha)) == 1


async def test_a_backend_that_left_rotation_meanwhile_does_not_keep_the_request_from_waiting(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream
) -> None:
    """A request queued on alpha could also have gone to beta, which then failed its probe: when
    alpha's slot came to it during alpha's 1 s cool-down, beta still counted as somewhere else to
    go, so it gave the slot back, queued on beta (held by a stalled stream) and answered 429
    after its queue timeout. Beta is out, so it now waits alpha's cool-down out and is served."""
    policy = {"max_concurrency": 1, "max_queue": 8, "failure_cooldown_s": 1, "queue_timeout_s": 5}
    gw = await launch(start_gateway, {"alpha": alpha, "beta": beta}, common=policy, routing={"probe_interval_s": 0.2})
    alpha.enqueue(error(503, "unavailable", first_byte_delay_s=1.5))
    alpha.set_default(answer("after the cool-down"))
    beta.enqueue(stalled_stream())
    async with holding() as held:
        first = asyncio.create_task(complete(gw))
        await wait_until(lambda: len(completions(alpha)) == 1)
        held.append(Held(gw))
        assert await held[0].started() == "beta"
        waiter = asyncio.create_task(complete(gw))
        await wait_until(_alpha_is(gw, in_flight=1, queued=1))
        beta.enqueue(error(500, "internal"), repeat=1000, path="/v1/models")  # beta's probes fail from now

        async def beta_out() -> bool:
            return not (await deployments(gw))["beta"]["ready"]

        await wait_until(beta_out)
        assert not first.done()
        assert (await first).status_code == 502
        response = await asyncio.wait_for(waiter, 3)
        assert (response.status_code, response.json()["provider"]) == (200, "alpha")


def _alpha_is(gw: GatewayHandle, *, in_flight: int, queued: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        state = (await deployments(gw))["alpha"]
        return (state["in_flight"], state["queued"]) == (in_flight, queued)

    return check
