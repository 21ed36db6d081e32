"""Several workers share routing state and metrics through the real Redis on this machine.

Two (or three) gateways started in one test with the same `[redis] key_prefix` stand for the
workers of one deployment: what one learns from an upstream (a 429's Retry-After, a refused key,
an open breaker, a probe that brings a provider back) the others apply without asking the
upstream, a gateway started later learns it on start, and `/metrics` on any of them sums the
counters of all. Every test uses its own key prefix and deletes its keys afterwards; Redis must
be running (a connection error fails the test).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
from redis.asyncio import Redis

from app.metrics import Metrics
from app.routing.cluster import ClusterLink
from app.routing.cluster_events import CoolEvent, DisabledEvent
from app.settings import RedisSettings
from tests.routing.conftest import PROBE_PATH, launch
from tests.routing.test_metrics import DURATION, FIRST_TOKEN, REQUESTS, SPEED, buckets, cumulative, finish_all
from tests.support.client import Held, complete
from tests.support.gateway import GatewayHandle, StartGateway
from tests.support.observe import completions, deployments, metric, row_view, scrape, seconds_until
from tests.support.ports import free_port
from tests.support.replies import answer, error, models_reply, stalled_stream
from tests.support.tcp_proxy import TcpProxy
from tests.support.upstream import ReplayUpstream
from tests.support.waiting import wait_until

REDIS_URL = "redis://127.0.0.1:6379/0"
ALPHA_CHAT = "alpha:chat-1:alpha/chat-1"  # provider:model:upstream_model in a backend's keys
PENDING = b'["switchyard_ledger_rows_pending",[]]'


class Store:
    """The Redis the gateways share, under this test's own key prefix."""

    def __init__(self, client: Redis, prefix: str) -> None:
        self.client = client
        self.prefix = prefix
        self.config = {"url": REDIS_URL, "key_prefix": prefix}

    async def keys(self, kind: str) -> list[str]:
        found = [key.decode() async for key in self.client.scan_iter(match=f"{self.prefix}:{kind}:*")]
        return sorted(key.removeprefix(f"{self.prefix}:{kind}:") for key in found)

    async def value(self, kind: str, name: str) -> dict[str, Any]:
        raw = await self.client.get(f"{self.prefix}:{kind}:{name}")
        assert raw is not None, (kind, name)
        decoded: dict[str, Any] = msgspec.json.decode(raw)
        return decoded

    async def ttl_ms(self, kind: str, name: str) -> int:
        ttl: int = await self.client.pttl(f"{self.prefix}:{kind}:{name}")
        return ttl


@pytest.fixture
async def store() -> AsyncIterator[Store]:
    """Listed first in a test's arguments, so it is torn down after the gateways."""
    client = Redis.from_url(REDIS_URL)
    assert await client.ping()
    store = Store(client, f"switchyard-test-{uuid.uuid4().hex[:12]}")
    yield store
    keys = [key async for key in client.scan_iter(match=f"{store.prefix}:*")]
    if keys:
        await client.delete(*keys)
    await client.aclose()


class Relay:
    """A TCP relay to the real Redis on a port of its own, which a test starts late and cuts, so
    a gateway pointed at it sees Redis come back and go away."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in self._writers:
            writer.close()
        self._writers.clear()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", 6379)
        self._writers += [writer, upstream_writer]
        await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    writer.close()


async def _pair(
    start_gateway: StartGateway, store: Store, upstreams: dict[str, ReplayUpstream], **options: Any
) -> tuple[GatewayHandle, GatewayHandle]:
    first = await launch(start_gateway, upstreams, redis=store.config, **options)
    second = await launch(start_gateway, upstreams, redis=store.config, **options)
    return first, second


async def test_a_429_on_one_worker_cools_the_backend_on_the_other(
    store: Store, start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream
) -> None:
    a, b = await _pair(start_gateway, store, {"alpha": alpha, "beta": beta})
    alpha.enqueue(error(429, "rate_limit_error", {"retry-after": "30"}))
    beta.enqueue(answer("from beta"), repeat=2)
    assert (await complete(a)).json()["provider"] == "beta"

    async def cooling_on_b() -> bool:
        return "cooling_until" in (await deployments(b))["alpha"]

    await wait_until(cooling_on_b)
    state = (await deployments(b))["alpha"]
    assert (state["ready"], state["cooling_reason"], state.get("disabled_reason")) == (False, "capacity", None)
    assert 29.0 < seconds_until(state["cooling_until"]) <= 30.0
    assert "cooling_until" not in (await deployments(b, "even-1"))["alpha"]  # only that backend
    assert await store.keys("cool") == [ALPHA_CHAT]
    assert 29_000 < await store.ttl_ms("cool", ALPHA_CHAT) <= 30_000
    value = await store.value("cool", ALPHA_CHAT)
    assert (value["type"], value["provider"], value["model"], value["reason"]) == (
        "cool",
        "alpha",
        "chat-1",
        "capacity",
    )

    response = await complete(b)
    assert response.status_code == 200, response.text
    assert response.json()["provider"] == "beta"
    assert len(completions(alpha)) == 1  # b never asked alpha
    await a.ledger_rows()  # flushes a's writer: both gateways write one database
    first, second = await b.ledger_rows()
    assert row_view(first) == ("ok", None, None, 2, "beta")
    assert row_view(second) == ("ok", None, None, 1, "beta")

    assert a.service.cluster is not None

    async def a_shared_its_metrics() -> bool:
        return bool(await store.client.exists(f"{store.prefix}:metrics:{a.service.cluster.worker_id}"))

    await wait_until(a_shared_its_metrics)
    samples = await scrape(b)  # a's cool-down counted once: b applied it without counting it
    assert metric(samples, "switchyard_cooldowns_total", provider="alpha", reason="capacity") == 1


async def test_a_401_on_one_worker_disables_the_provider_on_the_other(
    store: Store, start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream
) -> None:
    a, b = await _pair(start_gateway, store, {"alpha": alpha, "beta": beta})
    alpha.enqueue(error(401, "authentication_error"))
    beta.enqueue(answer("from beta"), repeat=2)
    assert (await complete(a)).json()["provider"] == "beta"

    async def disabled_on_b() -> bool:
        return "disabled_reason" in (await deployments(b))["alpha"]

    await wait_until(disabled_on_b)
    for model in ("chat-1", "even-1"):
        state = (await deployments(b, model))["alpha"]
        assert (state["ready"], state["disabled_reason"]) == (False, "auth: upstream returned 401")
        assert "cooling_until" not in state
    assert await store.keys("disabled") == ["alpha"]
    assert 3_590_000 < await store.ttl_ms("disabled", "alpha") <= 3_600_000
    value = await store.value("disabled", "alpha")
    assert (value["reason"], value["quota"]) == ("auth: upstream returned 401", False)
    assert (await complete(b)).json()["provider"] == "beta"
    assert len(completions(alpha)) == 1


async def test_a_probe_that_re_enables_a_provider_re_enables_it_everywhere(
    store: Store, start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream
) -> None:
    b = await launch(
        start_gateway, {"alpha": alpha, "beta": beta}, redis=store.config, routing={"probe_interval_s": 60}
    )
    alpha.enqueue(models_reply(first_byte_delay_s=1.5), path=PROBE_PATH)  # a's first probe, answered late
    a = await launch(
        start_gateway, {"alpha": alpha, "beta": beta}, redis=store.config, routing={"probe_interval_s": 0.1}
    )
    alpha.enqueue(error(401, "authentication_error"))
    alpha.enqueue(answer("alpha is back"))
    beta.enqueue(answer("from beta"))
    assert (await complete(a)).json()["provider"] == "beta"

    async def alpha_state_on_b() -> str | None:
        reason: str | None = (await deployments(b))["alpha"].get("disabled_reason")
        return reason

    async def disabled_on_b() -> bool:
        return await alpha_state_on_b() == "auth: upstream returned 401"

    await wait_until(disabled_on_b, within=1.0)  # before a's probe answers

    async def enabled_on_b() -> bool:
        return await alpha_state_on_b() is None

    await wait_until(enabled_on_b, within=3.0)
    assert await store.keys("disabled") == []
    response = await complete(b)
    assert response.json()["provider"] == "alpha"
    assert response.json()["message"]["content"] == [{"kind": "text", "data": "alpha is back"}]


async def test_a_worker_started_later_learns_cool_downs_breakers_and_disabled_providers(
    store: Store, start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream, gamma: ReplayUpstream
) -> None:
    upstreams = {"alpha": alpha, "beta": beta, "gamma": gamma}
    one_strike = {"breaker_window": 1, "breaker_min_samples": 1, "failure_cooldown_s": 20}
    a, b = await _pair(start_gateway, store, upstreams, gamma=one_strike)
    alpha.enqueue(error(429, "rate_limit_error", {"retry-after": "30"}))
    beta.enqueue(error(401, "authentication_error"))
    gamma.enqueue(error(500))
    refused = await complete(a)
    assert refused.status_code == 502, refused.text

    async def recorded() -> bool:
        keys = (await store.keys("cool"), await store.keys("breaker"), await store.keys("disabled"))
        return keys == (
            [ALPHA_CHAT, "gamma:chat-1:gamma/chat-1"],
            ["gamma:chat-1:gamma/chat-1"],
            ["beta"],
        )

    await wait_until(recorded)
    c = await launch(start_gateway, upstreams, redis=store.config, gamma=one_strike)
    for gw in (b, c):
        state = await deployments(gw)
        assert {name: (d["ready"], d.get("cooling_reason"), d["breaker_open"]) for name, d in state.items()} == {
            "alpha": (False, "capacity", False),
            "beta": (False, None, False),
            "gamma": (False, "failure", True),
        }
        assert 28.0 < seconds_until(state["alpha"]["cooling_until"]) <= 30.0
        assert 18.0 < seconds_until(state["gamma"]["cooling_until"]) <= 20.0
        assert state["beta"]["disabled_reason"] == "auth: upstream returned 401"
        unavailable = await complete(gw)
        assert unavailable.status_code == 429, unavailable.text  # alpha's 429 is the soonest way back
    assert (len(completions(alpha)), len(completions(beta)), len(completions(gamma))) == (1, 1, 1)


async def test_metrics_on_any_worker_sum_every_live_worker(
    store: Store, start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream
) -> None:
    a, b = await _pair(start_gateway, store, {"alpha": alpha, "beta": beta})
    alpha.enqueue(answer(), repeat=3)
    for gw in (a, a, b):
        assert (await complete(gw)).json()["provider"] == "alpha"
    alpha.enqueue(stalled_stream())
    held = Held(a)
    try:
        assert await held.started() == "alpha"

        async def summed(gw: GatewayHandle) -> bool:
            samples = await scrape(gw)
            total = metric(samples, "switchyard_requests_total", model="chat-1", provider="alpha", status="ok")
            in_flight = metric(samples, "switchyard_backend_in_flight", provider="alpha", model="chat-1")
            return (total, in_flight) == (3, 1)

        for gw in (a, b):
            await wait_until(functools.partial(summed, gw), within=3.0)
        samples = await scrape(b)
        assert metric(samples, "switchyard_attempts_total", provider="alpha", outcome="ok") == 3
        assert metric(samples, "switchyard_backend_in_flight", provider="alpha", model="even-1") == 0
        assert metric(samples, "switchyard_backend_limit", provider="alpha", model="chat-1") == 64  # not summed
    finally:
        await held.release()
    assert len(await store.keys("metrics")) == 2


async def test_counters_do_not_fall_while_redis_is_away(
    store: Store, start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream
) -> None:
    """Redis gone, a worker showed its own numbers alone: the sums fell and rose from one scrape
    to the next (whichever worker answered), which Prometheus reads as counter resets. It keeps
    the others' counters as last read (not their gauges: those would stand still)."""
    relay = Relay()
    await relay.start()
    upstreams = {"alpha": alpha, "beta": beta}
    a = await launch(start_gateway, upstreams, redis={**store.config, "url": relay.url})
    b = await launch(start_gateway, upstreams, redis=store.config)
    alpha.enqueue(answer(), repeat=3)
    for gw in (a, b, b):
        assert (await complete(gw)).json()["provider"] == "alpha"
    alpha.enqueue(stalled_stream())
    held = Held(b)

    async def seen() -> tuple[float | None, float | None]:
        samples = await scrape(a)
        total = metric(samples, "switchyard_requests_total", model="chat-1", provider="alpha", status="ok")
        return total, metric(samples, "switchyard_backend_in_flight", provider="alpha", model="chat-1")

    async def summed() -> bool:
        return await seen() == (3, 1)

    try:
        assert await held.started() == "alpha"
        await wait_until(summed, within=3.0)
        await relay.stop()
        for _ in range(3):  # b's requests stay in the sum; its request in flight, a gauge, does not
            assert await seen() == (3, 0)
    finally:
        await held.release()
        await relay.stop()


async def test_a_scrape_waits_a_second_at_most_for_a_stalled_redis(
    store: Store, start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream
) -> None:
    """A Redis that stops answering held `/metrics` for its 5 s socket timeout; the scrape takes
    the other workers' numbers as last read after a second."""
    upstreams = {"alpha": alpha, "beta": beta}
    with TcpProxy(6379) as proxy:
        a = await launch(start_gateway, upstreams, redis={**store.config, "url": f"redis://127.0.0.1:{proxy.port}/0"})
        b = await launch(start_gateway, upstreams, redis=store.config)
        alpha.enqueue(answer(), repeat=2)
        for gw in (b, b):
            assert (await complete(gw)).json()["provider"] == "alpha"

        async def total() -> float | None:
            samples = await scrape(a)
            return metric(samples, "switchyard_requests_total", model="chat-1", provider="alpha", status="ok")

        async def summed() -> bool:
            return await total() == 2

        await wait_until(summed, within=3.0)
        proxy.stall()  # a's pooled connections: no byte again
        started = time.monotonic()
        assert await total() == 2
        assert time.monotonic() - started < 2.0


async def test_a_metrics_hash_redis_lost_is_written_whole_again(
    store: Store, start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream
) -> None:
    """A worker writes only the fields that changed since its last write; a hash that is gone
    (expired, or lost with Redis's data) gets every field again at the next writes, not only the
    few that changed, and a quiet worker keeps its hash alive."""
    a, b = await _pair(start_gateway, store, {"alpha": alpha, "beta": beta})
    alpha.enqueue(answer(), repeat=2)
    assert (await complete(a)).json()["provider"] == "alpha"
    assert a.service.cluster is not None
    key = f"{store.prefix}:metrics:{a.service.cluster.worker_id}"

    async def fields() -> dict[bytes, bytes]:
        found: dict[bytes, bytes] = await store.client.hgetall(key)
        return found

    async def shared_once() -> bool:
        now = await fields()  # the request counted, and its ledger row written (the ledger's gauges are shared too)
        return b'["switchyard_requests_total",["chat-1","alpha","ok"]]' in now and now.get(PENDING) == b"0"

    await wait_until(shared_once, within=3.0)
    whole = await fields()
    assert len(whole) > 20  # counters, every histogram bucket, gauges
    await asyncio.sleep(2.5)  # quiet: nothing changes, yet the hash lives on
    assert await fields() == whole
    assert 0 < await store.client.pttl(key) <= 10_000

    await store.client.delete(key)  # lost
    assert (await complete(a)).json()["provider"] == "alpha"  # a few fields change meanwhile

    async def whole_again() -> bool:
        now = await fields()
        return set(now) == set(whole) and float(now[b'["switchyard_requests_total",["chat-1","alpha","ok"]]']) == 2

    await wait_until(whole_again, within=3.5)

    async def summed() -> bool:
        samples = await scrape(b)
        return metric(samples, "switchyard_requests_total", model="chat-1", provider="alpha", status="ok") == 2

    await wait_until(summed, within=3.0)


async def test_histograms_tokens_and_cost_sum_over_workers(
    store: Store, start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream
) -> None:
    a, b = await _pair(start_gateway, store, {"alpha": alpha, "beta": beta})
    finish_all(a, REQUESTS)
    finish_all(b, REQUESTS[:2])
    pair = {"model": "chat-1", "provider": "alpha"}

    async def summed(gw: GatewayHandle) -> bool:
        return metric(await scrape(gw), f"{DURATION}_count", **pair) == 5

    for gw in (a, b):
        await wait_until(functools.partial(summed, gw), within=3.0)
        samples = await scrape(gw)
        assert buckets(samples, DURATION, **pair) == cumulative(DURATION, ("0.25", 1), ("0.5", 2), ("2.5", 2))
        assert metric(samples, f"{DURATION}_sum", **pair) == pytest.approx(5.0, rel=1e-9)
        assert buckets(samples, FIRST_TOKEN, **pair) == cumulative(FIRST_TOKEN, ("0.25", 3), ("1.0", 2))
        assert buckets(samples, SPEED, **pair) == cumulative(SPEED, ("10.0", 2), ("250.0", 2))
        assert metric(samples, f"{DURATION}_count", model="chat-1", provider="beta") == 1  # one worker's only
        assert metric(samples, "switchyard_tokens_total", bucket="input", **pair) == 22 + 15
        assert metric(samples, "switchyard_tokens_total", bucket="output", **pair) == 26 + 26
        assert metric(samples, "switchyard_cost_usd_total", source="authoritative", **pair) == 0.002
        estimated = metric(samples, "switchyard_cost_usd_total", source="estimated", **pair)
        assert estimated == pytest.approx(0.00043 + 0.00042, rel=1e-12)  # floats across workers
        assert metric(samples, "switchyard_requests_total", status="ok", **pair) == 5


@pytest.mark.parametrize(
    ("server", "configured", "limit"),
    [
        pytest.param({"workers": 2}, 4, 2, id="2-workers"),
        pytest.param({"workers": 2, "replicas": 3}, 13, 2, id="2-workers-3-replicas"),
        pytest.param({"workers": 4, "replicas": 2}, 4, 1, id="floor-of-one"),
        pytest.param({}, 4, 4, id="one-process"),
    ],
)
async def test_each_worker_enforces_its_share_of_max_concurrency(
    start_gateway: StartGateway,
    alpha: ReplayUpstream,
    beta: ReplayUpstream,
    server: dict[str, Any],
    configured: int,
    limit: int,
) -> None:
    gw = await launch(
        start_gateway, {"alpha": alpha, "beta": beta}, server=server, common={"max_concurrency": configured}
    )
    state = await deployments(gw)
    assert (state["alpha"]["limit"], state["beta"]["limit"]) == (limit, limit)


async def test_the_queue_is_split_too(start_gateway: StartGateway, alpha: ReplayUpstream) -> None:
    """max_concurrency 2 and max_queue 2 over 2 workers: one slot and one queue place here."""
    gw = await launch(
        start_gateway,
        {"alpha": alpha},
        server={"workers": 2},
        common={"max_concurrency": 2, "max_queue": 2, "queue_timeout_s": 10},
    )
    alpha.enqueue(stalled_stream(), repeat=2)
    holding, waiting = Held(gw), Held(gw)
    try:
        assert await holding.started() == "alpha"

        async def queued() -> bool:
            return (await deployments(gw))["alpha"]["queued"] == 1

        await wait_until(queued)
        refused = await complete(gw)
        assert refused.status_code == 429, refused.text
        state = (await deployments(gw))["alpha"]
        assert (state["in_flight"], state["queued"], state["limit"]) == (1, 1, 1)
        await holding.release()
        assert await waiting.started() == "alpha"  # the freed slot went to the waiter
    finally:
        await holding.release()
        await waiting.release()
    assert len(completions(alpha)) == 2


async def test_a_burst_of_state_changes_takes_one_connection_and_reaches_the_other_worker(
    store: Store, start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream
) -> None:
    """40 answers of 429 that land together are 40 cool-downs published at once: they go in one
    background write after another on one connection, not a connection each (the pool kept every
    connection a burst opened: 4 → 9 over a long run of failing upstreams). 40 scrapes at once
    share one read of the other workers' metrics."""
    a, b = await _pair(start_gateway, store, {"alpha": alpha, "beta": beta})
    alpha.enqueue(error(429, "rate_limit_error", {"retry-after": "30"}, first_byte_delay_s=0.5), repeat=40)
    beta.enqueue(answer("from beta"), repeat=40)
    responses = await asyncio.gather(*(complete(a) for _ in range(40)))
    assert {r.json()["provider"] for r in responses} == {"beta"}
    assert len(completions(alpha)) == 40  # every one was in flight when the first 429 came
    scrapes = await asyncio.gather(*(a.client.get("/metrics") for _ in range(40)))  # each reads b's hash
    assert {r.status_code for r in scrapes} == {200}
    assert a.service.cluster is not None
    name = f"switchyard:{a.service.cluster.worker_id}"
    connections = [c for c in await store.client.client_list() if c["name"] == name]
    assert 1 <= len(connections) <= 4, connections  # listener, state writer, metrics writer, a scrape
    assert await store.keys("cool") == [ALPHA_CHAT]
    state = (await deployments(b))["alpha"]
    assert state["cooling_reason"] == "capacity"
    assert 29.0 < seconds_until(state["cooling_until"]) <= 30.0


async def test_a_link_stopped_while_a_state_write_is_out_stops_cleanly(
    store: Store, start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream
) -> None:
    """`stop` waits for the write out (up to 2 s); the writer, once done, is None: cancelling it
    raised AttributeError, and the service's stop skipped the rest (the ledger's last flush)."""
    gw = await launch(start_gateway, {"alpha": alpha, "beta": beta})
    link = ClusterLink(RedisSettings(url=REDIS_URL, key_prefix=store.prefix), Metrics(), gw.service.log)
    await link.start(gw.service.router)
    link.provider_enabled(gw.service.router.providers["alpha"])  # a write out, in the background
    async with asyncio.timeout(5):
        await link.stop()  # raised AttributeError once the write was done


async def test_redis_unreachable_the_gateway_still_serves_on_its_own_state(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream
) -> None:
    redis = {"url": f"redis://127.0.0.1:{free_port()}/0", "key_prefix": f"switchyard-test-{uuid.uuid4().hex[:12]}"}
    gw = await launch(start_gateway, {"alpha": alpha, "beta": beta}, redis=redis)
    alpha.enqueue(error(429, "rate_limit_error", {"retry-after": "30"}))
    beta.enqueue(answer("from beta"), repeat=2)
    for _ in range(2):
        response = await complete(gw)
        assert response.status_code == 200, response.text
        assert response.json()["provider"] == "beta"
    assert len(completions(alpha)) == 1  # the cool-down still holds locally
    assert (await deployments(gw))["alpha"]["cooling_reason"] == "capacity"
    samples = await scrape(gw)
    assert metric(samples, "switchyard_requests_total", model="chat-1", provider="beta", status="ok") == 2


async def test_a_worker_reconnects_learns_what_it_missed_and_survives_losing_redis_again(
    store: Store, start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream, gamma: ReplayUpstream
) -> None:
    upstreams = {"alpha": alpha, "beta": beta, "gamma": gamma}
    relay = Relay()
    a = await launch(start_gateway, upstreams, redis={**store.config, "url": relay.url})  # Redis "down"
    b = await launch(start_gateway, upstreams, redis=store.config)
    alpha.enqueue(error(401, "authentication_error"))
    beta.enqueue(answer("from beta"))
    assert (await complete(b)).json()["provider"] == "beta"
    assert "disabled_reason" not in (await deployments(a))["alpha"]
    try:
        await relay.start()

        async def learned(provider: str, field: str) -> bool:
            return field in (await deployments(a))[provider]

        await wait_until(functools.partial(learned, "alpha", "disabled_reason"), within=3.0)  # loaded on reconnect
        beta.enqueue(error(429, "rate_limit_error", {"retry-after": "30"}))
        gamma.enqueue(answer("from gamma"), repeat=3)
        assert (await complete(b)).json()["provider"] == "gamma"
        await wait_until(functools.partial(learned, "beta", "cooling_until"))  # published while connected
        assert (await complete(a)).json()["provider"] == "gamma"
        await relay.stop()
        response = await complete(a)  # Redis gone again: a keeps routing on what it knows
        assert response.status_code == 200, response.text
        assert response.json()["provider"] == "gamma"
    finally:
        await relay.stop()
    assert (len(completions(alpha)), len(completions(beta)), len(completions(gamma))) == (1, 2, 3)


@pytest.mark.parametrize("skew_s", [-300.0, -30.0, 30.0, 300.0])
async def test_a_cool_down_from_a_replica_whose_clock_differs_lasts_as_the_upstream_asked(
    store: Store, start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream, skew_s: float
) -> None:
    """A cool-down one replica learns from an upstream lasts as long on the others, whatever their
    wall clocks say (a clock audit: replicas whose clocks disagreed by minutes). The event went with
    the publisher's wall-clock end (`until`) only, and a replica 300 s behind the publisher kept a
    healthy backend out for 305 s (past `max_cooldown_s`), one ahead of it ignored the upstream's
    Retry-After. Here a gateway on the real Redis hears, on its event channel, what a replica whose
    clock is off publishes (`CoolEvent` with `seconds`, the time left when published)."""
    gateway = await launch(start_gateway, {"alpha": alpha, "beta": beta}, redis=store.config)
    skewed = CoolEvent(
        "replica-with-a-skewed-clock", "alpha", "chat-1", "alpha/chat-1", until=time.time() + skew_s + 5.0,
        reason="capacity", seconds=5.0,
    )  # fmt: skip
    await store.client.publish(f"{store.prefix}:events", msgspec.json.encode(skewed))

    async def cooling() -> bool:
        return "cooling_until" in (await deployments(gateway))["alpha"]

    await wait_until(cooling, within=3.0)
    assert 3.5 < seconds_until((await deployments(gateway))["alpha"]["cooling_until"]) <= 5.0


@pytest.mark.parametrize("skew_s", [-300.0, 300.0])
async def test_a_provider_another_replica_disabled_is_rechecked_when_it_said_whatever_the_clocks(
    store: Store, start_gateway: StartGateway, alpha: ReplayUpstream, skew_s: float
) -> None:
    """A provider out of money on another replica 10 s ago is re-checked `quota_recheck_s` after
    that here too. The event said when by the publisher's wall clock only (`at`): a publisher 300 s
    ahead put the re-check 300 s later here, one behind 300 s sooner (the 503's Retry-After)."""
    gateway = await launch(
        start_gateway, {"alpha": alpha}, redis=store.config, routing={"probe_interval_s": 10, "quota_recheck_s": 60}
    )
    skewed = DisabledEvent(
        "replica-with-a-skewed-clock", "alpha", "budget_exceeded", True, at=time.time() + skew_s - 10.0, ago=10.0
    )
    await store.client.publish(f"{store.prefix}:events", msgspec.json.encode(skewed))

    async def disabled() -> bool:
        return (await complete(gateway)).status_code == 503

    await wait_until(disabled, within=3.0)
    refused = await complete(gateway)
    assert 48 <= int(refused.headers["retry-after"]) <= 50, refused.headers["retry-after"]


@pytest.mark.parametrize("skew_s", [-300.0, 300.0])
async def test_a_stored_cool_down_lasts_what_redis_holds_of_it_whatever_the_clocks(
    store: Store, start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream, skew_s: float
) -> None:
    """A gateway started after another replica cooled a backend reads the cool-down from Redis:
    timed by its key's time to live, which is what is left of it, not by the publisher's wall
    clock (a publisher 300 s behind this one: ignored; ahead: 300 s too long)."""
    skewed = CoolEvent(
        "replica-with-a-skewed-clock", "alpha", "chat-1", "alpha/chat-1", until=time.time() + skew_s + 20.0,
        reason="capacity", seconds=20.0,
    )  # fmt: skip
    await store.client.set(f"{store.prefix}:cool:{ALPHA_CHAT}", msgspec.json.encode(skewed), px=20_000)
    gateway = await launch(start_gateway, {"alpha": alpha, "beta": beta}, redis=store.config)
    state = (await deployments(gateway))["alpha"]
    assert "cooling_until" in state, state
    assert 15.0 < seconds_until(state["cooling_until"]) <= 20.0
