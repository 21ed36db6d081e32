"""Concurrency limits, bounded queues, least-loaded choice and cancellation, with requests held open
on the upstreams (`Held`: one content chunk, then a stall) to fill the backends' slots."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from devtools.mock_http import Reply
from tests.routing.conftest import launch
from tests.support.client import COMPLETIONS, Held, body, complete, holding
from tests.support.gateway import GatewayHandle, StartGateway
from tests.support.observe import completions, deployments, metric, row_view, rows_when, scrape
from tests.support.replies import answer, chunk, error, metrics_reply, stalled_stream, stream_answer
from tests.support.upstream import ReplayUpstream, played, reply_sse
from tests.support.waiting import wait_until

ONE_SLOT = {"max_concurrency": 1, "max_queue": 0}


async def test_full_backends_without_a_queue_answer_429_without_upstream_request(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream
) -> None:
    gw = await launch(start_gateway, {"alpha": alpha, "beta": beta}, common=ONE_SLOT)
    alpha.enqueue(stalled_stream())
    beta.enqueue(stalled_stream())
    async with holding() as held:
        held.append(Held(gw))
        assert await held[0].started() == "alpha"
        held.append(Held(gw))
        assert await held[1].started() == "beta"  # alpha is full: the next backend takes it
        state = await deployments(gw)
        assert {name: (d["in_flight"], d["queued"], d["limit"], d["ready"]) for name, d in state.items()} == {
            "alpha": (1, 0, 1, True),
            "beta": (1, 0, 1, True),
        }
        started = time.monotonic()
        response = await complete(gw)
        assert time.monotonic() - started < 0.5  # no queue: refused at once
        assert response.status_code == 429, response.text
        assert response.json()["error"]["type"] == "rate_limit_error"
        assert response.json()["error"]["message"] == "all backends for this model are at capacity"
        assert response.headers["retry-after"] == "1"
        assert (len(completions(alpha)), len(completions(beta))) == (1, 1)
        (row,) = await gw.ledger_rows()  # the held streams have no row yet
        assert row_view(row) == ("error", "rate_limit_error", 429, 0, None)
    rows = await rows_when(gw, 3)
    assert sorted(row_view(r) for r in rows if r["status"] == "cancelled") == [
        ("cancelled", None, None, 1, "alpha"),
        ("cancelled", None, None, 1, "beta"),
    ]
    await wait_until(_all_idle(gw))


def _all_idle(gw: GatewayHandle) -> Callable[[], Awaitable[bool]]:
    """Nothing in flight or queued on any backend of `chat-1`."""

    async def check() -> bool:
        state = await deployments(gw)
        return all(d["in_flight"] == 0 and d["queued"] == 0 for d in state.values())

    return check


async def test_a_queued_request_is_served_as_soon_as_a_slot_frees(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream
) -> None:
    gw = await launch(
        start_gateway,
        {"alpha": alpha, "beta": beta},
        common={"max_concurrency": 1, "max_queue": 1, "queue_timeout_s": 2},
    )
    alpha.enqueue(stalled_stream())
    alpha.enqueue(answer("after the wait"))
    beta.enqueue(stalled_stream())
    async with holding() as held:
        held.append(Held(gw))
        assert await held[0].started() == "alpha"
        held.append(Held(gw))
        assert await held[1].started() == "beta"
        waiting = asyncio.create_task(complete(gw))

        async def queued() -> bool:
            waiting_on_alpha: int = (await deployments(gw))["alpha"]["queued"]
            return waiting_on_alpha == 1

        await wait_until(queued)
        state = await deployments(gw)
        assert {name: (d["in_flight"], d["queued"]) for name, d in state.items()} == {
            "alpha": (1, 1),
            "beta": (1, 0),
        }
        samples = await scrape(gw)
        assert metric(samples, "switchyard_backend_queued", provider="alpha", model="chat-1") == 1
        assert metric(samples, "switchyard_backend_in_flight", provider="beta", model="chat-1") == 1
        assert len(completions(alpha)) == 1  # the waiter has not been sent anywhere yet
        assert not waiting.done()

        freed = time.monotonic()
        await held[0].release()
        response = await asyncio.wait_for(waiting, 1.5)
        assert time.monotonic() - freed < 1.0  # served on release, not after queue_timeout_s
        assert response.status_code == 200, response.text
        assert response.json()["provider"] == "alpha"
        assert response.json()["message"]["content"] == [{"kind": "text", "data": "after the wait"}]

        async def settled() -> bool:
            state = await deployments(gw)
            return (state["alpha"]["in_flight"], state["alpha"]["queued"], state["beta"]["in_flight"]) == (0, 0, 1)

        await wait_until(settled)
    rows = await rows_when(gw, 3)
    assert sorted(row_view(r) for r in rows) == [
        ("cancelled", None, None, 1, "alpha"),
        ("cancelled", None, None, 1, "beta"),
        ("ok", None, None, 1, "alpha"),
    ]
    await wait_until(_all_idle(gw))


async def test_a_queued_request_takes_a_slot_freed_on_another_backend(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream
) -> None:
    """The waiter queues on alpha (the preferred backend); beta's slot frees first. Serving it
    then, not after alpha's `queue_timeout_s`, is what "served as soon as a slot frees" means."""
    gw = await launch(
        start_gateway,
        {"alpha": alpha, "beta": beta},
        common={"max_concurrency": 1, "max_queue": 1, "queue_timeout_s": 2},
    )
    alpha.enqueue(stalled_stream())
    beta.enqueue(stalled_stream())
    beta.enqueue(answer("beta was free"))
    async with holding() as held:
        held.append(Held(gw))
        assert await held[0].started() == "alpha"
        held.append(Held(gw))
        assert await held[1].started() == "beta"
        waiting = asyncio.create_task(complete(gw))

        async def queued() -> bool:
            state = await deployments(gw)
            total: int = sum(d["queued"] for d in state.values())
            return total == 1

        await wait_until(queued)
        freed = time.monotonic()
        await held[1].release()
        response = await asyncio.wait_for(waiting, 3)
        assert response.status_code == 200, response.text
        assert response.json()["provider"] == "beta"
        assert time.monotonic() - freed < 1.0, "the waiter sat in alpha's queue while beta was idle"
    await wait_until(_all_idle(gw))


async def test_the_least_loaded_of_equal_priority_backends_is_chosen(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream
) -> None:
    gw = await launch(start_gateway, {"alpha": alpha, "beta": beta})
    alpha.enqueue(stalled_stream())
    beta.enqueue(stalled_stream())
    async with holding() as held:
        held.append(Held(gw, "even-1"))
        assert await held[0].started() == "alpha"  # a tie goes in catalog order
        held.append(Held(gw, "even-1"))
        assert await held[1].started() == "beta"  # alpha has one in flight, beta none
        assert [r.json()["model"] for r in completions(alpha) + completions(beta)] == ["alpha/even-1", "beta/even-1"]
        state = await deployments(gw, "even-1")
        assert (state["alpha"]["in_flight"], state["beta"]["in_flight"]) == (1, 1)
        assert (state["alpha"]["limit"], state["beta"]["limit"]) == (64, 64)  # neither was full
    await wait_until(_all_idle(gw))


async def test_a_local_servers_own_queue_depth_counts_as_load(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream
) -> None:
    alpha.enqueue(metrics_reply(50), repeat=1000, path="/metrics")
    gw = await launch(
        start_gateway,
        {"alpha": alpha, "beta": beta},
        common={"kind": "local"},
        routing={"probe_interval_s": 0.1},
    )

    async def scraped() -> bool:
        state = await deployments(gw, "even-1")
        return (state["alpha"]["upstream_queue_depth"], state["beta"]["upstream_queue_depth"]) == (50, 0)

    await wait_until(scraped)
    beta.enqueue(answer("from beta"), repeat=2)
    for _ in range(2):
        response = await complete(gw, "even-1")
        assert response.status_code == 200, response.text
        assert response.json()["provider"] == "beta"
    assert completions(alpha) == []
    samples = await scrape(gw)
    assert metric(samples, "switchyard_backend_upstream_queue_depth", provider="alpha", model="even-1") == 50
    assert metric(samples, "switchyard_backend_upstream_queue_depth", provider="beta", model="even-1") == 0
    assert [row_view(r) for r in await gw.ledger_rows()] == [("ok", None, None, 1, "beta")] * 2


async def test_a_cancelled_stream_leaves_no_upstream_request_and_frees_its_slot(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream
) -> None:
    gw = await launch(start_gateway, {"alpha": alpha, "beta": beta})
    alpha.enqueue(stalled_stream("partial"))
    held = Held(gw)
    try:
        assert await held.started() == "alpha"
        assert alpha.open_connections == 1
        assert (await deployments(gw))["alpha"]["in_flight"] == 1
    finally:
        await held.release()
    await wait_until(lambda: alpha.open_connections == 0, within=1.0)
    await wait_until(_all_idle(gw), within=1.0)
    (row,) = await rows_when(gw, 1)
    assert row_view(row) == ("cancelled", None, None, 1, "alpha")
    assert row["streamed"]
    assert completions(beta) == []
    state = (await deployments(gw))["alpha"]
    assert (state["ready"], state.get("cooling_reason")) == (True, None)  # a client leaving is not a failure
    samples = await scrape(gw)
    assert metric(samples, "switchyard_requests_total", model="chat-1", provider="alpha", status="cancelled") == 1
    assert metric(samples, "switchyard_attempts_total", provider="alpha", outcome="ok") is None


async def test_a_stream_cancelled_before_its_first_token_cancels_the_upstream_request(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream
) -> None:
    gw = await launch(start_gateway, {"alpha": alpha, "beta": beta}, server={"sse_keepalive_s": 0.1})
    alpha.enqueue(played(stream_answer("too late"), first_byte_delay_s=5.0))
    async with gw.client.stream("POST", COMPLETIONS, json=body(stream=True)) as response:
        assert response.status_code == 200
        async for text in response.aiter_text():
            assert text.startswith("event: ping")  # the response started; no token yet
            break
        await wait_until(lambda: len(completions(alpha)) == 1)
        assert alpha.active_streams == 1  # the upstream is still holding back its first byte
    await wait_until(lambda: alpha.open_connections == 0, within=1.0)
    await wait_until(_all_idle(gw), within=1.0)
    (row,) = await rows_when(gw, 1)
    assert row_view(row) == ("cancelled", None, None, 1, "alpha")
    assert completions(beta) == []


async def test_request_deadline_bounds_the_wait_for_a_slot(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream
) -> None:
    gw = await launch(
        start_gateway,
        {"alpha": alpha, "beta": beta},
        common={"max_concurrency": 1, "max_queue": 1, "queue_timeout_s": 10},
        routing={"request_deadline_s": 0.5},
    )
    alpha.enqueue(reply_sse([chunk({"content": "held"})], stall_after=1))
    beta.enqueue(stalled_stream())
    async with holding() as held:
        held.append(Held(gw))
        held.append(Held(gw))
        assert sorted([await held[0].started(), await held[1].started()]) == ["alpha", "beta"]
        started = time.monotonic()
        response = await complete(gw)
        elapsed = time.monotonic() - started
        assert response.status_code == 429, response.text
        assert response.headers["retry-after"] == "1"
        assert 0.4 <= elapsed < 1.2  # the 0.5 s deadline, not the 10 s queue timeout
        assert (len(completions(alpha)), len(completions(beta))) == (1, 1)
    await wait_until(_all_idle(gw))


async def test_a_queue_depth_is_forgotten_when_metrics_stop_answering(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream
) -> None:
    """alpha's `/metrics` said 50 waiting three times, then answered 500 while `/health` stayed
    up: the last depth read was kept for ever, and every request went to beta."""
    alpha.enqueue(metrics_reply(50), repeat=3, path="/metrics")
    alpha.enqueue(error(500, "internal"), repeat=1000, path="/metrics")
    gw = await launch(
        start_gateway, {"alpha": alpha, "beta": beta}, common={"kind": "local"}, routing={"probe_interval_s": 0.1}
    )
    await wait_until(_depths(gw, alpha=50, beta=0))
    await wait_until(_depths(gw, alpha=0, beta=0))
    alpha.enqueue(answer("from alpha"))
    response = await complete(gw, "even-1")
    assert (response.status_code, response.json()["provider"]) == (200, "alpha")


async def test_llama_cpps_deferred_requests_count_as_its_queue(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream
) -> None:
    """`llama-server --metrics` reports the requests waiting for a slot as `llamacpp:requests_deferred`."""
    page = b"llamacpp:requests_processing 4\nllamacpp:requests_deferred 7\n"
    alpha.enqueue(Reply(headers=[("content-type", "text/plain")], chunks=[page]), repeat=1000, path="/metrics")
    gw = await launch(
        start_gateway, {"alpha": alpha, "beta": beta}, common={"kind": "local"}, routing={"probe_interval_s": 0.1}
    )
    await wait_until(_depths(gw, alpha=7, beta=0))
    beta.enqueue(answer("from beta"))
    response = await complete(gw, "even-1")
    assert (response.status_code, response.json()["provider"]) == (200, "beta")


def _depths(gw: GatewayHandle, **depths: float) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        state = await deployments(gw, "even-1")
        return {name: state[name]["upstream_queue_depth"] for name in depths} == depths

    return check


async def test_failover_passes_over_a_backend_another_request_took_out_meanwhile(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream, gamma: ReplayUpstream
) -> None:
    """The backends a request may try were decided once, when it started: its failover went to
    beta, which another request's 503 had cooled down meanwhile."""
    gw = await launch(start_gateway, {"alpha": alpha, "beta": beta, "gamma": gamma})
    alpha.enqueue(error(503, "unavailable", first_byte_delay_s=0.5))
    beta.enqueue(error(503, "unavailable"))
    beta.set_default(answer("should not be asked"))
    gamma.enqueue(answer("from gamma"))
    first = asyncio.create_task(complete(gw))
    await wait_until(lambda: len(completions(alpha)) == 1)
    assert (await complete(gw, provider="beta")).status_code == 502  # cools beta down
    response = await first
    assert (response.status_code, response.json()["provider"]) == (200, "gamma")
    assert len(completions(beta)) == 1
