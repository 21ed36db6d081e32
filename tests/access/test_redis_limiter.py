"""The Redis limiter's settlements, sent without waiting (`app.access.redis_limiter`), against the
real Redis on this machine: the reservation becomes the real cost and tokens; after Redis lost its
scripts (`SCRIPT FLUSH`, as after a restart) the settlement loads the script and goes through; a
settlement Redis cannot take reaches the gate's `failed` callback."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable

import pytest
from redis import Redis

from app.access.limiter import Ask
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


async def test_settlements_wait_for_the_next_admission_and_leave_before_it_as_one_command() -> None:
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
        for request_id in ("r1", "r2", "r3"):
            assert (await limiter.admit(ask(request_id))).refused is None
        assert (await limiter.admit(ask("r4"))).refused == "max_concurrency"
        limiter.settle(ask("r1"), 0, tokens=0, cost=1000)
        limiter.settle(ask("r2"), 0, tokens=0, cost=2000)
        # The loop is blocked in this synchronous call: nothing has left yet.
        assert direct.hmget(spend_key, "s", "r") == [b"0", b"21000"]

        # Three in flight and a limit of three: admitted only because both settlements go first.
        assert (await limiter.admit(ask("r4"))).refused is None
        write = next(chunk for chunk in tap.writes if b"$2\r\nr4\r\n" in chunk and b"r1" in chunk)
        settle = limiter.settle_script
        assert write.startswith(settle.head(12)), "one settlement command for both, before the admission"
        assert write.count(settle.sha.encode()) == 1
        assert write.index(b"r2") < write.index(b"r4")
        assert direct.hmget(spend_key, "s", "r") == [b"3000", b"14000"]

        limiter.settle(ask("r3"), 0, tokens=0, cost=500)  # no admission follows: the timer sends it
        await asyncio.sleep(LAZY_S * 10)
        assert direct.hmget(spend_key, "s", "r") == [b"3500", b"7000"]
        assert failures == []
    finally:
        await limiter.close()
        server.close()
        await server.wait_closed()
        keys = list(direct.scan_iter(match=f"{prefix}:*"))
        if keys:
            direct.delete(*keys)
        direct.close()


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
