"""A Redis that loses its data while requests run (`app.access.restore`): each process puts back
the budget reservations Redis held for it, and the cost of its rows not yet in the ledger, before
the record loaded again from the ledger admits anyone else. Against a `redis-server` of the test's
own, restarted without persistence (as the chaos audit did), or a record deleted on a live
connection (a flush, an eviction). Two `RedisLimiter`s are two processes: each has its connection.

A budget of 10 requests' worst case (`COST` nano-dollars each); the ledger read is the test's
(`load_spend` with what the ledger would hold: nothing, none of the requests has ended).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from decimal import Decimal

import pytest

from app.access.limiter import Ask, Verdict
from app.access.redis_limiter import RedisLimiter
from app.access.restore import RESTORE_WAIT_S
from app.settings import RedisSettings
from tests.access.conftest import PrivateRedis
from tests.support.waiting import wait_until

COST = 7000
BUDGET = 10 * COST


def _ask(request_id: str) -> Ask:
    return Ask(key_id="k1", request_id=request_id, period="total", budget=BUDGET, cost=COST)


@pytest.fixture
async def two(private_redis: PrivateRedis) -> AsyncIterator[tuple[RedisLimiter, RedisLimiter]]:
    settings = RedisSettings(url=private_redis.url, key_prefix=f"t{uuid.uuid4().hex[:6]}")
    failures: list[tuple[str, str]] = []
    a, b = (RedisLimiter(settings, lambda key, reason: failures.append((key, reason))) for _ in range(2))
    yield a, b
    await a.close()
    await b.close()
    assert failures == []


async def _admit(limiter: RedisLimiter, request_id: str) -> Verdict:
    """As the gate does (`AccessGate._decide`): a missing record is loaded from the ledger (here
    empty), after the wait for other processes' restores, and the admission asked again."""
    verdict = await limiter.admit(_ask(request_id))
    if verdict.refused == "budget_missing":
        await asyncio.sleep(limiter.restorer.reload_wait())
        await limiter.load_spend(_ask(request_id), 0, 0)
        verdict = await limiter.admit(_ask(request_id))
    return verdict


async def test_after_a_restart_each_process_restores_its_reservations_before_the_record_is_loaded(
    two: tuple[RedisLimiter, RedisLimiter], private_redis: PrivateRedis
) -> None:
    """A holds 6 reservations and B 1 when Redis restarts empty. B's next admission finds no
    record; A, idle, reconnects by itself and restores its 6 while B waits for the generation to
    age, so B admits 3 more and no fourth. It used to admit 10 (the ledger has no row yet)."""
    a, b = two
    held = [await _admit(a, f"a{i}") for i in range(6)]
    assert [v.refused for v in held] == [None] * 6
    assert (await _admit(b, "b0")).refused is None
    assert await b.spend("k1", "total") == (0, 7 * COST)

    private_redis.restart()
    await asyncio.sleep(0.05)  # the event loop hears the connections close (a live process does at once)
    loop = asyncio.get_running_loop()
    started = loop.time()
    after = [(await _admit(b, f"b{i}")).refused for i in range(1, 5)]

    assert after == [None, None, None, "budget"]
    assert a.redis.connected  # reconnected without a request of its own
    assert loop.time() - started >= RESTORE_WAIT_S - 0.1  # B waited for the restores
    assert await b.spend("k1", "total") == (0, 10 * COST)
    for i, verdict in enumerate(held):
        a.settle(_ask(f"a{i}"), verdict.second, 0, 1000)
    await a.drain()
    assert await b.spend("k1", "total") == (6000, 4 * COST)  # each settlement took its own reservation off


async def test_a_record_lost_on_a_live_connection_is_restored_at_the_next_admission(
    two: tuple[RedisLimiter, RedisLimiter],
) -> None:
    """No restart (an operator's flush, an eviction): B loads the record again; A's next admission
    finds a record of another generation and restores its 6 reservations before it is counted."""
    a, b = two
    for i in range(6):
        assert (await _admit(a, f"a{i}")).refused is None
    await b.redis.call("FLUSHALL")
    assert [(await _admit(b, f"b{i}")).refused for i in range(2)] == [None, None]  # 2 of the new record's 10
    assert (await _admit(a, "a6")).refused is None
    assert await b.spend("k1", "total") == (0, 9 * COST)
    assert [(await _admit(b, f"b{i}")).refused for i in range(2, 4)] == [None, "budget"]


async def test_rows_not_yet_in_the_ledger_count_as_spent_after_a_loss(
    two: tuple[RedisLimiter, RedisLimiter],
) -> None:
    """A's answers whose rows wait for the database were in the lost record's spend only: A's
    restore adds them (the ledger writer's `unlogged`), once, however often A restores."""
    a, b = two
    a.restorer.unlogged = lambda key_id: Decimal("0.000021") if key_id == "k1" else Decimal(0)  # 21,000 nano
    first = await _admit(a, "a0")
    await b.redis.call("FLUSHALL")
    assert (await _admit(b, "b0")).refused is None
    await a.restorer.restore(a.lane(_ask("a1")))
    assert (await _admit(a, "a1")).refused is None  # restores again (code 7 never comes: it knows the record)
    assert await b.spend("k1", "total") == (21_000, 3 * COST)
    a.settle(_ask("a0"), first.second, 0, 5000)
    await a.drain()
    assert await b.spend("k1", "total") == (26_000, 2 * COST)


async def test_a_process_restores_once_per_generation(two: tuple[RedisLimiter, RedisLimiter]) -> None:
    """The greeting and the admission's code 7 may both restore one record: it counts once."""
    a, b = two
    assert (await _admit(a, "a0")).refused is None
    await b.redis.call("FLUSHALL")
    assert (await _admit(b, "b0")).refused is None
    lane = a.lane(_ask("a1"))
    old = lane.generation
    await a.restorer.restore(lane)
    lane.generation = old  # as if the first restore's answer had not come back yet
    await a.restorer.restore(lane)
    assert await b.spend("k1", "total") == (0, 2 * COST)


async def test_a_fresh_process_does_not_wait_to_load_a_record(private_redis: PrivateRedis) -> None:
    """Only a process that saw the generation change waits before loading (a first start has
    nobody's reservations to wait for)."""
    limiter = RedisLimiter(RedisSettings(url=private_redis.url, key_prefix="fresh"), lambda key, reason: None)
    try:
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert (await _admit(limiter, "r0")).refused is None
        assert loop.time() - started < RESTORE_WAIT_S / 2
        await wait_until(lambda: limiter.redis.connected, what="connected")
    finally:
        await limiter.close()


async def test_a_settlement_sent_after_the_restore_takes_off_only_what_the_restore_put_back(
    two: tuple[RedisLimiter, RedisLimiter], private_redis: PrivateRedis
) -> None:
    """A's a0 ends while Redis is down: its settlement waits for the new connection, behind the
    restore. Its reservation leaves A's count only once Redis answered that settlement, so the
    restore still puts it back and the settlement takes it off again: r is a1's and b0's. Taken
    off at once, it was neither restored nor left alone, and took a1's off too (B admitted 9)."""
    a, b = two
    a0, a1 = await _admit(a, "a0"), await _admit(a, "a1")
    assert (await _admit(b, "b0")).refused is None
    private_redis.restart()
    await asyncio.sleep(0.05)
    a.settle(_ask("a0"), a0.second, 0, 0)
    after = [(await _admit(b, f"b{i}")).refused for i in range(1, 10)]
    assert after == [None] * 8 + ["budget"]
    assert a1.refused is None
    assert await b.spend("k1", "total") == (0, 10 * COST)
