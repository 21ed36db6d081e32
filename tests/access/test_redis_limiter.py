"""The Redis limiter's settlements, sent without waiting (`app.access.redis_limiter`), against the
real Redis on this machine: the reservation becomes the real cost and tokens; after Redis lost its
scripts (`SCRIPT FLUSH`, as after a restart) the settlement loads the script and goes through; a
settlement Redis cannot take reaches the gate's `failed` callback."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
from redis import Redis

from app.access.limiter import Ask
from app.access.redis_limiter import RedisLimiter
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
    await redis.redis.call("SET", f"{redis.prefix}:lim:{{k1}}:flight", "not a sorted set")  # ZREM fails on it
    redis.settle(wrong, verdict.second, tokens=1, cost=1)
    for _ in range(100):
        if failures:
            break
        await asyncio.sleep(0.01)
    assert [key for key, _reason in failures] == ["k1"]
    assert "WRONGTYPE" in failures[0][1]
