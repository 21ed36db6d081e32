"""The Redis limiter's settlements, sent without waiting (`app.access.redis_limiter`), against the
real Redis on this machine: the reservation becomes the real cost and tokens; after Redis lost its
scripts (`SCRIPT FLUSH`, as after a restart) the settlement loads the script and goes through; a
settlement Redis cannot take reaches the gate's `failed` callback."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable

import pytest
from redis import Redis

from app.access import redis_limiter
from app.access.limiter import Ask, LimiterDown
from app.access.redis_limiter import LAZY_S, RedisLimiter
from app.access.resp import encode
from app.settings import RedisSettings

URL = "redis://127.0.0.1:6379/0"


@pytest.fixture
async def limiter() -> AsyncIterator[tuple[RedisLimiter, list[tuple[str, str]], str]]:
    prefix = f"switchyard-test-{uuid.uuid4().hex[:12]}"
    failures: list[tuple[str, str]] = []
    settings = RedisSettings(url=URL, key_prefix=prefix)
    limiter = RedisLimiter(settings, lambda key, reason: failures.append((key, reason)))
    yield limiter, failures, prefix
    await limiter.close()
    _forget(prefix)


def _forget(prefix: str) -> None:
    """Delete every Redis key a test's limiter made (its own prefix)."""
    client = Redis.from_url(URL)
    keys = list(client.scan_iter(match=f"{prefix}:*"))
    if keys:
        client.delete(*keys)
    client.close()


def _ask(request_id: str) -> Ask:
    limits = {"rpm": 100, "tpm": 10_000, "tokens": 500, "budget": 10**9, "cost": 7000}
    return Ask(key_id="k1", request_id=request_id, period="total", **limits)


async def _spend(limiter: RedisLimiter) -> tuple[int, int] | None:
    return await limiter.spend("k1", "total")


async def test_admissions_and_settlements_go_through_a_script_flush(
    limiter: tuple[RedisLimiter, list[tuple[str, str]], str],
) -> None:
    redis, failures, prefix = limiter
    await redis.redis.call("SCRIPT", "FLUSH")  # the admission meets NOSCRIPT too, and loads its script
    await redis.load_spend(_ask("r0"), 0, 0)
    first = await redis.admit(_ask("r1"))
    second = await redis.admit(_ask("r2"))
    assert (first.refused, second.refused) == (None, None)
    assert await _spend(redis) == (0, 14_000)  # two reservations of 7,000 nano-dollars

    redis.settle(_ask("r1"), first.second, tokens=40, cost=1234)  # meets NOSCRIPT: resent once loaded
    await redis.drain()
    assert await _spend(redis) == (1234, 7000)

    await redis.redis.call("SCRIPT", "FLUSH")  # as after a Redis restart: the next EVALSHA meets NOSCRIPT
    redis.settle(_ask("r2"), second.second, tokens=60, cost=766)
    for _ in range(100):
        if await _spend(redis) == (2000, 0):
            break
        await asyncio.sleep(0.01)
    assert await _spend(redis) == (2000, 0)
    rate = await redis.redis.post(encode(("HGET", f"{prefix}:lim:{{k1}}:window", f"t{first.second}")))
    assert int(rate) == 100 if first.second == second.second else int(rate) in (40, 60)
    assert failures == []


async def test_a_settlement_redis_cannot_take_is_reported(
    limiter: tuple[RedisLimiter, list[tuple[str, str]], str],
) -> None:
    redis, failures, _prefix = limiter
    await redis.load_spend(_ask("r0"), 0, 0)
    verdict = await redis.admit(_ask("r1"))
    wrong = Ask(key_id="k1", request_id="r1", period="total", budget=10**9, cost=7000, tokens=500, tpm=10_000)
    await redis.redis.call("SET", f"{redis.prefix}:lim:{{k1}}:window", "not a hash")  # HEXISTS fails on it
    redis.settle(wrong, verdict.second, tokens=1, cost=1)
    for _ in range(100):
        if failures:
            break
        await asyncio.sleep(0.01)
    assert [key for key, _reason in failures] == ["k1"]
    assert "WRONGTYPE" in failures[0][1]


class _Tap:
    """A loopback proxy in front of the real Redis that keeps every chunk the client wrote (`written`
    is set at each), and holds Redis's answers back while `answering` is cleared."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.answering = asyncio.Event()
        self.answering.set()
        self.written = asyncio.Event()  # set at each chunk the client writes

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", 6379)

        async def answers() -> None:
            while data := await upstream_reader.read(65536):
                await self.answering.wait()
                writer.write(data)
                await writer.drain()

        relay = asyncio.create_task(answers())
        try:
            while data := await reader.read(65536):
                self.writes.append(data)
                self.written.set()
                upstream_writer.write(data)
                await upstream_writer.drain()
        finally:
            relay.cancel()
            upstream_writer.close()
            writer.close()


async def test_a_settlement_in_flight_is_written_before_settle_returns() -> None:
    """A request in flight's settlement (a key with `max_concurrency`) leaves before its answer:
    written by `settle` itself, ahead of anything the same turn of the loop sends after it. It used
    to wait for the next admission or 2 ms, and a client sending its requests one after the other to
    two replicas met its own finished request's slot still taken (429)."""
    tap = _Tap()
    server = await asyncio.start_server(tap.serve, "127.0.0.1", 0)
    prefix = f"switchyard-test-{uuid.uuid4().hex[:12]}"
    port = server.sockets[0].getsockname()[1]
    failures: list[tuple[str, str]] = []
    limiter = RedisLimiter(RedisSettings(url=f"redis://127.0.0.1:{port}/0", key_prefix=prefix), _failed(failures))
    direct = Redis.from_url(URL)
    spend_key = f"{prefix}:lim:{{k1}}:spend:total"

    def ask(request_id: str) -> Ask:
        return Ask(key_id="k1", request_id=request_id, period="total", max_concurrency=3, budget=10**9, cost=7000)

    try:
        await limiter.load_spend(ask("r0"), 0, 0)
        seconds = {}  # each settlement names its admission's second (its reservation's minute)
        for request_id in ("r1", "r2", "r3"):
            verdict = await limiter.admit(ask(request_id))
            assert verdict.refused is None
            seconds[request_id] = verdict.second
        assert (await limiter.admit(ask("r4"))).refused == "max_concurrency"
        other = Ask(key_id="k2", request_id="x", period="total", rpm=100)  # summed: waits up to 20 ms
        limiter.settle(other, seconds["r1"], tokens=0, cost=0)
        limiter.settle(ask("r1"), seconds["r1"], tokens=0, cost=1000)
        limiter.settle(ask("r2"), seconds["r2"], tokens=0, cost=2000)
        assert await limiter.redis.post(encode(("PING",))) == b"PONG"  # queued after both, in the same turn
        sent = b"".join(tap.writes)
        assert b"{k2}" not in sent  # another key's settlements still wait to leave together
        settlements = sent[sent.index(limiter.settle_script.sha.encode()) :]  # no settlement before these
        assert settlements.index(b"$2\r\nr1\r\n") < settlements.index(b"$2\r\nr2\r\n") < settlements.index(b"PING")
        assert direct.hmget(spend_key, "s", "r") == [b"3000", b"7000"]  # r3's reservation left
        assert (await limiter.admit(ask("r4"))).refused is None  # the two slots are free

        limiter.settle(ask("r3"), seconds["r3"], tokens=0, cost=500)
        await limiter.drain()
        assert direct.hmget(spend_key, "s", "r") == [b"3500", b"7000"]
        assert failures == []
    finally:
        await limiter.close()
        server.close()
        await server.wait_closed()
        direct.close()
        _forget(prefix)


def _failed(failures: list[tuple[str, str]]) -> Callable[[str, str], None]:
    return lambda key, reason: failures.append((key, reason))


async def test_a_budget_refusal_tells_the_window_as_it_stands(
    limiter: tuple[RedisLimiter, list[tuple[str, str]], str],
) -> None:
    """Its `x-ratelimit-*` headers come from the verdict: the window's requests and tokens, not
    zeros; the spend is the settled part; no Retry-After of its own (the gate gives the period's)."""
    redis, _failures, _prefix = limiter
    await redis.load_spend(_ask("r0"), 10**9 - 10_000, 0)  # room for one reservation of 7,000
    first = await redis.admit(_ask("r1"))
    assert first.refused is None
    refused = await redis.admit(_ask("r2"))
    assert (refused.refused, refused.retry_after, refused.spent) == ("budget", None, 10**9 - 10_000)
    assert (refused.remaining_requests, refused.remaining_tokens) == (99, 9_500)
    assert 59 < refused.reset_requests_s == refused.reset_tokens_s <= 60


async def test_a_free_request_of_a_budgeted_key_settles(
    limiter: tuple[RedisLimiter, list[tuple[str, str]], str],
) -> None:
    """A worst case of $0 (a model priced at zero) reserves 0: its settlement must not send Redis
    `HINCRBY r -0`, which Redis refuses (not an integer), leaving the settlement undone."""
    redis, failures, _prefix = limiter
    free = Ask(key_id="k1", request_id="r1", period="total", max_concurrency=5, budget=10**9, cost=0)
    await redis.load_spend(free, 0, 0)
    verdict = await redis.admit(free)
    assert verdict.refused is None
    redis.settle(free, verdict.second, tokens=0, cost=0)
    await redis.drain()
    assert await _spend(redis) == (0, 0)
    flight = await redis.redis.call("ZCARD", f"{redis.prefix}:lim:{{k1}}:flight")
    assert (flight, failures) == (0, [])


@pytest.mark.parametrize(
    "reply",
    [
        b":1\r\n",
        b"+OK\r\n",
        b"$-1\r\n",
        b"*0\r\n",
        b"*1\r\n:6\r\n",
        b"*2\r\n:8\r\n:0\r\n",  # 7: a record of another generation (`app.access.restore`)
        b"$3\r\nabc\r\n",
        b"*1\r\n:1\r\n",
    ],
    ids=["integer", "status", "nil", "empty", "wait-alone", "unknown-code", "not-numbers", "budget-alone"],
)
async def test_a_reply_not_of_the_scripts_shape_is_limits_down_not_a_crash(reply: bytes) -> None:
    """A proxy's, a failover's or a wrong database's answer used to raise TypeError, IndexError or
    KeyError out of the limiter (a 500 with a traceback, `fail_open` bypassed) or, for `*1 :1`, a
    budget refusal of a key without a budget; the one boundary makes it `LimiterDown` (503)."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while line := await reader.readline():
            parts = []
            for _ in range(int(line[1:])):
                size = int((await reader.readline())[1:])
                parts.append((await reader.readexactly(size + 2))[:-2])
            writer.write(reply if parts[0] in (b"EVALSHA", b"HMGET") else b"+OK\r\n")
            await writer.drain()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    limiter = RedisLimiter(RedisSettings(url=f"redis://127.0.0.1:{port}/0", key_prefix="t"), _failed([]))
    try:
        with pytest.raises(LimiterDown, match="malformed reply from Redis"):
            await limiter.admit(Ask(key_id="k1", request_id="r1", period="total", rpm=5))
        with pytest.raises(LimiterDown, match="malformed reply from Redis"):
            await limiter.spend("k1", "total")
    finally:
        await limiter.close()
        server.close()
        await server.wait_closed()


async def test_a_spend_record_loaded_again_while_requests_run_holds_their_reservations_again(
    limiter: tuple[RedisLimiter, list[tuple[str, str]], str],
) -> None:
    """Redis lost the record (a restart, an operator's recount) while r1 ran. The record loaded
    again from the ledger held none of r1's reservation: r2 was admitted as if r1 cost nothing (a
    key overspent by what was in flight), and r1's settlement once left `r` at -7,000 for good.
    The next admission finds a record of another generation and restores r1's reservation into
    its minute first (`app.access.restore`), which r1's settlement then takes off."""
    redis, failures, prefix = limiter
    await redis.load_spend(_ask("r0"), 0, 0)
    first = await redis.admit(_ask("r1"))
    await redis.redis.call("DEL", f"{prefix}:lim:{{k1}}:spend:total")
    await redis.load_spend(_ask("r0"), 0, 0)  # the ledger has no row of r1 yet
    second = await redis.admit(_ask("r2"))
    assert await _spend(redis) == (0, 14000)
    redis.settle(_ask("r1"), first.second, tokens=0, cost=1000)
    redis.settle(_ask("r2"), second.second, tokens=0, cost=500)
    await redis.drain()
    assert await _spend(redis) == (1500, 0)  # both costs counted (neither row was in the ledger read)
    assert failures == []


async def test_a_request_admitted_without_a_budget_adds_its_cost_to_the_record_when_there_is_one(
    limiter: tuple[RedisLimiter, list[tuple[str, str]], str],
) -> None:
    """The key got a budget while r1 ran (admitted without one): the record was loaded from a ledger
    without r1's row, so r1's cost belongs in it. It used to be left out."""
    redis, failures, _prefix = limiter
    unbudgeted = Ask(key_id="k1", request_id="r1", period="total", rpm=100)
    verdict = await redis.admit(unbudgeted)
    await redis.load_spend(_ask("r0"), 100, 0)
    redis.settle(unbudgeted, verdict.second, tokens=0, cost=2000)
    await redis.drain()
    assert await _spend(redis) == (2100, 0)
    assert failures == []


async def test_a_finished_requests_concurrency_slot_is_free_to_another_process_at_once() -> None:
    """A client that sends its requests one after the other to two replicas, with a key of
    `max_concurrency` 1: the slot used to be given back up to `LAZY_S` (2 ms) after the answer,
    and the next request, at the other process, got a 429."""
    prefix = f"switchyard-test-{uuid.uuid4().hex[:12]}"
    settings = RedisSettings(url=URL, key_prefix=prefix)
    first, second = (RedisLimiter(settings, _failed([])) for _ in range(2))

    def ask(request_id: str) -> Ask:
        return Ask(key_id="k1", request_id=request_id, period="total", max_concurrency=1)

    try:
        for index in range(20):
            this = first if index % 2 == 0 else second
            verdict = await this.admit(ask(f"r{index}"))
            assert verdict.refused is None, index
            this.settle(ask(f"r{index}"), verdict.second, tokens=0, cost=0)
            await asyncio.sleep(LAZY_S / 2)  # the answer's way to the client and its next request's back
    finally:
        await first.close()
        await second.close()
        _forget(prefix)


async def test_a_reservation_never_settled_is_given_back_once_no_request_of_its_minute_can_run() -> None:
    """A process killed with requests in flight, a settlement Redis refused, an admission whose
    reply was lost: their reservations used to stay counted for good (a `total` budget refused for
    ever). Each is kept per minute of admission; once that minute's requests are all past their
    hold (the deadline plus the longest upstream timeout) the rest is given back. A settlement
    that comes after that takes nothing more off."""
    prefix = f"switchyard-test-{uuid.uuid4().hex[:12]}"
    now_us = [1_800_000_000 * 10**6 + 5 * 10**6]  # 5 s into a minute (Redis's clock replaced)
    limiter = RedisLimiter(RedisSettings(url=URL, key_prefix=prefix), _failed([]), clock=lambda: now_us[0], lease_max=1)

    def ask(request_id: str) -> Ask:
        return Ask(key_id="k1", request_id=request_id, period="total", hold_ms=30_000, budget=20_000, cost=7000)

    try:
        await limiter.load_spend(ask("r0"), 0, 0)
        lost = [await limiter.admit(ask(request_id)) for request_id in ("r1", "r2")]  # never settled
        assert [verdict.refused for verdict in lost] == [None, None]
        assert (await limiter.admit(ask("r3"))).refused == "budget"  # 14,000 reserved + 7,000 > 20,000
        now_us[0] += 84 * 10**6  # 89 s: within the minute's end (60 s) plus the hold (30 s)
        assert (await limiter.admit(ask("r3"))).refused == "budget"
        now_us[0] += 2 * 10**6  # 91 s: past it
        third = await limiter.admit(ask("r3"))
        assert third.refused is None
        assert await limiter.spend("k1", "total") == (0, 7000)  # r1 and r2 given back, r3 held
        limiter.settle(ask("r1"), lost[0].second, tokens=0, cost=1000)  # late: its reservation is gone
        await limiter.drain()
        assert await limiter.spend("k1", "total") == (1000, 7000)  # its cost counted, r3's reservation kept
        limiter.settle(ask("r3"), third.second, tokens=0, cost=500)
        await limiter.drain()
        assert await limiter.spend("k1", "total") == (1500, 0)
        assert (await limiter.admit(ask("r4"))).refused is None  # never settled either
        now_us[0] += 3600 * 10**6  # an hour later: the minutes between are not walked one by one
        assert (await limiter.admit(ask("r5"))).refused is None
        assert await limiter.spend("k1", "total") == (1500, 7000)
    finally:
        await limiter.close()
        _forget(prefix)


@pytest.mark.parametrize("caller_gone", [False, True], ids=["caller-waiting", "caller-gone"])
async def test_an_admission_whose_reply_is_lost_gives_its_concurrency_slot_back(caller_gone: bool) -> None:
    """Redis ran the admission but its reply came after the client's timeout (the request got a
    503, or its client had gone away meanwhile): the slot it took stayed held until its hold
    expired (15 minutes by default), and a key with `max_concurrency` 1 was refused all that time."""
    tap = _Tap()
    server = await asyncio.start_server(tap.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    prefix = f"switchyard-test-{uuid.uuid4().hex[:12]}"
    limiter = RedisLimiter(RedisSettings(url=f"redis://127.0.0.1:{port}/0", key_prefix=prefix), _failed([]))

    def ask(request_id: str) -> Ask:
        return Ask(key_id="k1", request_id=request_id, period="total", max_concurrency=1)

    try:
        assert await limiter.redis.call("PING") == b"PONG"  # connected (and SELECTed) before the replies stop
        tap.answering.clear()
        if caller_gone:
            caller = asyncio.create_task(limiter.admit(ask("r1")))
            await asyncio.sleep(0.1)
            caller.cancel()
            with pytest.raises(asyncio.CancelledError):
                await caller
            await asyncio.sleep(1.2)  # the admission's reply never came: the client's timeout is 1 s
        else:
            with pytest.raises(LimiterDown):
                await limiter.admit(ask("r1"))
        tap.answering.set()
        await asyncio.sleep(LAZY_S * 20)
        assert (await limiter.admit(ask("r2"))).refused is None
    finally:
        await limiter.close()
        server.close()
        await server.wait_closed()
        _forget(prefix)


class _Relay:
    """A relay to the real Redis whose mode the test sets: `normal`; `unanswered` (commands reach
    Redis, its replies are dropped: it ran them, the client cannot know); `lost` (commands are
    dropped: Redis never sees them)."""

    def __init__(self) -> None:
        self.mode = "normal"
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        redis_reader, redis_writer = await asyncio.open_connection("127.0.0.1", 6379)
        await asyncio.gather(self._pipe(reader, redis_writer, "lost"), self._pipe(redis_reader, writer, "unanswered"))

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, dropping: str) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await source.read(65536):
                if self.mode != dropping:
                    sink.write(data)
        sink.close()


async def test_a_slot_give_back_redis_never_got_goes_again() -> None:
    """An admission whose reply was lost took its `max_concurrency` slot in Redis; the give-back
    that followed was lost too (Redis still out of reach), and the slot stayed taken for the hold:
    a stall of a second held a key's slots for 15 minutes. It goes again until Redis takes it."""
    prefix = f"switchyard-test-{uuid.uuid4().hex[:12]}"
    relay = _Relay()
    port = await relay.start()
    limiter = RedisLimiter(RedisSettings(url=f"redis://127.0.0.1:{port}/0", key_prefix=prefix), lambda *_: None)
    ask = Ask(key_id="k1", request_id="r1", period="total", max_concurrency=1, hold_ms=600_000)
    flight = Redis.from_url(URL)
    try:
        await limiter.redis.call("PING")
        relay.mode = "unanswered"
        with pytest.raises(LimiterDown):
            await limiter.admit(ask)  # Redis took the slot; the reply never came (1 s)
        assert flight.zrange(f"{prefix}:lim:{{k1}}:flight", 0, -1) == [b"r1"]
        relay.mode = "lost"  # the give-back, sent at once, never reaches Redis
        await asyncio.sleep(1.5)
        assert flight.zcard(f"{prefix}:lim:{{k1}}:flight") == 1
        relay.mode = "normal"
        await asyncio.sleep(2.0)  # its next try
        assert flight.zcard(f"{prefix}:lim:{{k1}}:flight") == 0
        assert limiter.owed.resending == {}
    finally:
        flight.close()
        await limiter.close()
        assert relay.server is not None
        relay.server.close()
        _forget(prefix)


async def test_a_spend_redis_never_got_goes_again() -> None:
    """A settlement lost on its way (Redis out of reach): the request's reservation held until the
    hold, then went, and its spend was never counted: the budget overshot (by 16 % in the Redis
    chaos run). The spend goes again until Redis takes it; the reservation the hold ends."""
    prefix = f"switchyard-test-{uuid.uuid4().hex[:12]}"
    relay = _Relay()
    port = await relay.start()
    failures: list[tuple[str, str]] = []
    settings = RedisSettings(url=f"redis://127.0.0.1:{port}/0", key_prefix=prefix)
    limiter = RedisLimiter(settings, lambda key, reason: failures.append((key, reason)))
    ask = Ask(key_id="k1", request_id="r1", period="total", max_concurrency=5, budget=10**9, cost=7000)
    try:
        await limiter.load_spend(ask, 0, 0)
        verdict = await limiter.admit(ask)
        assert verdict.refused is None
        assert await _spend(limiter) == (0, 7000)
        relay.mode = "lost"
        limiter.settle(ask, verdict.second, ask.tokens, 5000)  # never reaches Redis
        await asyncio.sleep(1.3)
        relay.mode = "normal"
        await asyncio.sleep(1.5)  # its next try
        assert await _spend(limiter) == (5000, 7000)  # spent; reserved until the hold
        assert [key for key, _reason in failures] == ["k1"]  # the loss is reported once
        assert limiter.owed.resending == {}
    finally:
        await limiter.close()
        assert relay.server is not None
        relay.server.close()
        _forget(prefix)


async def test_spends_counted_alone_while_redis_is_out_of_reach_wait_as_one_sum_per_key() -> None:
    """`fail_open`: each request the local limiter admits hands its spend to Redis (`add_spend`)
    for when it answers. They were kept one item per request (for a day), all sent again every
    second: 14,400 items after 72 s of an outage at 200 requests a second (a state audit). One sum
    per key waits now, sent again until Redis takes it, and all of it arrives."""
    prefix = f"switchyard-test-{uuid.uuid4().hex[:12]}"
    relay = _Relay()
    port = await relay.start()
    limiter = RedisLimiter(RedisSettings(url=f"redis://127.0.0.1:{port}/0", key_prefix=prefix), lambda *_: None)
    asks = [Ask(key_id="k1", request_id=f"r{n}", period="total", budget=10**9, cost=1000) for n in range(1000)]
    try:
        await limiter.load_spend(asks[0], 100, 0)
        relay.mode = "lost"
        for ask in asks:
            limiter.add_spend(ask, 7)
        assert list(limiter.owed.alone.values()) == [7000]
        assert limiter.owed.resending == {}
        await asyncio.sleep(2.5)  # sent after 1 s, lost (no answer) after 2 s: waiting again, as one sum
        assert list(limiter.owed.alone.values()) == [7000]
        relay.mode = "normal"
        await asyncio.sleep(1.5)  # its next try
        assert await _spend(limiter) == (7100, 0)
        assert limiter.owed.alone == {}
    finally:
        await limiter.close()
        assert relay.server is not None
        relay.server.close()
        _forget(prefix)


async def test_past_its_cap_of_lanes_the_limiter_drops_only_the_lanes_that_hold_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A key makes a lane per change of its limits and per budget period. Past 10,000 every lane
    went, live keys' included: their leases ended, and what Redis held reserved for this process
    (`Lane.held`, which a restore of a Redis that lost its data needs) was forgotten."""
    monkeypatch.setattr(redis_limiter, "LANES_MAX", 50)
    limiter = RedisLimiter(RedisSettings(url=URL, key_prefix="switchyard-test-lanes"), lambda *_: None)
    try:
        busy = limiter.lane(Ask(key_id="busy", request_id="r", period="total", budget=10**9))
        busy.hold(0, 500)  # a request of this process that Redis admitted is still running
        for n in range(120):  # 120 updates of one key's rpm
            limiter.lane(Ask(key_id="k", request_id="r", period="total", rpm=1000 + n, budget=10**9))
        lanes = limiter.lanes()
        assert busy in lanes
        assert len(lanes) <= 51
    finally:
        await limiter.close()


async def test_a_lane_whose_admission_is_on_its_way_is_not_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    """An admission that asks for no lease (a key with `max_concurrency`; a request that waited for
    another's lease and goes on alone) left its lane looking idle: dropped past the cap, Redis's
    answer put the reservation into a lane no restore sees, and the settlement released it from
    the key's new lane, which never held it (a review)."""
    monkeypatch.setattr(redis_limiter, "LANES_MAX", 50)
    prefix = f"switchyard-test-{uuid.uuid4().hex[:12]}"
    limiter = RedisLimiter(RedisSettings(url=URL, key_prefix=prefix), lambda *_: None)
    ask = Ask(key_id="k1", request_id="r1", period="total", max_concurrency=4, budget=10**9, cost=7000)
    try:
        await limiter.load_spend(ask, 0, 0)
        admission = asyncio.ensure_future(limiter.admit(ask))
        await asyncio.sleep(0)  # written; its answer not read yet
        assert limiter.lane(ask).asking is None  # it asks for no lease
        for n in range(120):  # meanwhile other keys' lanes are made, past the cap
            limiter.lane(Ask(key_id=f"other{n}", request_id="x", period="total", rpm=10))
        assert (await admission).refused is None
        assert await _spend(limiter) == (0, 7000)
        assert sum(sum(lane.held.values()) for lane in limiter.lanes() if lane.key_id == "k1") == 7000
    finally:
        await limiter.close()
        _forget(prefix)
