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
import time
import uuid
from collections.abc import AsyncIterator

import pytest
import structlog
from redis import Redis

from app.access.limiter import Ask, Verdict
from app.access.redis_limiter import RedisLimiter
from app.access.restore import RESTORE_WAIT_S
from app.settings import RedisSettings
from tests.access.conftest import PrivateRedis

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
    empty), after the generation is read and the wait for other processes' restores, and the
    admission asked again."""
    verdict = await limiter.admit(_ask(request_id))
    if verdict.refused == "budget_missing":
        await limiter.restorer.check()
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


async def test_a_process_restores_once_per_generation(two: tuple[RedisLimiter, RedisLimiter]) -> None:
    """The watch (or a new connection's greeting) and the admission's code 7 may all restore one
    record, each before the others' answers came back: it counts once."""
    a, b = two
    assert (await _admit(a, "a0")).refused is None
    lane = a.lane(_ask("a1"))
    old = lane.generation
    await b.redis.call("FLUSHALL")
    assert (await _admit(b, "b0")).refused is None  # meanwhile A's watch restored a0's reservation
    for _ in range(2):
        lane.generation = old  # as if that restore's answer had not come back yet
        await a.restorer.restore(lane)
    assert await b.spend("k1", "total") == (0, 2 * COST)


@pytest.mark.parametrize("age_s", [0.0, 5.0])
async def test_a_process_started_just_after_a_loss_waits_too(private_redis: PrivateRedis, age_s: float) -> None:
    """A process whose first reading of the generation finds it younger than the wait (it started
    just after a loss, or with the first process of a new Redis) waits the rest of it before it
    loads a record (the others may be restoring theirs); an older one loads at once."""
    made = int(time.time() * 1000 - age_s * 1000)
    Redis.from_url(private_redis.url).set("fresh:gen", f"someone:{made}")
    limiter = RedisLimiter(RedisSettings(url=private_redis.url, key_prefix="fresh"), lambda key, reason: None)
    try:
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert (await _admit(limiter, "r0")).refused is None
        waited = loop.time() - started
        assert waited >= RESTORE_WAIT_S - 0.1 if age_s == 0 else waited < RESTORE_WAIT_S / 2
    finally:
        await limiter.close()


async def test_a_flush_on_live_connections_is_restored_by_a_process_that_admits_nothing_more(
    two: tuple[RedisLimiter, RedisLimiter],
) -> None:
    """No connection drops, and A, holding 6 reservations, asks nothing more: it reads the
    generation while it holds reservations, and B, finding the record missing, reads it before
    loading (both see the flush), so A restores before B loads. B admitted all 10 (review)."""
    a, b = two
    await b.redis.call("PING")  # up and connected before the flush
    assert [(await _admit(a, f"a{i}")).refused for i in range(6)] == [None] * 6
    await b.redis.call("FLUSHALL")
    assert [(await _admit(b, f"b{i}")).refused for i in range(10)] == [None] * 4 + ["budget"] * 6


async def test_a_new_lane_of_a_record_knows_its_generation(
    two: tuple[RedisLimiter, RedisLimiter],
) -> None:
    """The record alone was lost (evicted, or deleted for a recount; `{prefix}:gen` stays) and the
    key's limits changed (a new lane of the same record): the new lane knows the record's
    generation from the old one, so its admission after the load finds a record of another
    generation and A's 6 reservations are restored first (review: the new lane knew none, skipped
    the check, and admitted 10 more)."""
    a, _b = two
    assert [(await _admit(a, f"a{i}")).refused for i in range(6)] == [None] * 6
    spend = [key async for key in _keys(a, "*:spend:*")]
    await a.redis.call("DEL", *spend)

    def changed(request_id: str) -> Ask:  # the key's rpm set since: a lane of other limits
        return Ask(key_id="k1", request_id=request_id, period="total", budget=BUDGET, cost=COST, rpm=1000)

    assert (await a.admit(changed("n0"))).refused == "budget_missing"
    await a.restorer.check()
    assert a.restorer.reload_wait() == 0  # nothing says Redis lost its data: loaded at once
    await a.load_spend(changed("n0"), 0, 0)
    after = [(await a.admit(changed(f"n{i}"))).refused for i in range(10)]
    assert after == [None] * 4 + ["budget"] * 6


async def _keys(limiter: RedisLimiter, pattern: str) -> AsyncIterator[bytes]:
    for key in await limiter.redis.call("KEYS", f"{limiter.prefix}{pattern}"):
        yield key


async def test_a_release_into_a_lane_made_again_leaves_nothing_held(two: tuple[RedisLimiter, RedisLimiter]) -> None:
    """A lane dropped with a request in flight (more than 10,000 lanes, a revoked key): the
    settlement releases into a new lane that held nothing, which stays empty (review: -7,000 for
    good, and the watch never stopped)."""
    a, _b = two
    first = await _admit(a, "a0")
    a.forget(())
    a.settle(_ask("a0"), first.second, 0, 1000)
    await a.drain()
    assert [lane.held for lane in a.lanes()] == [{}]


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


async def test_a_settlement_written_before_a_restore_on_the_same_connection_is_not_restored(
    two: tuple[RedisLimiter, RedisLimiter],
) -> None:
    """A's a0 ends, its settlement written on the live connection, just before A restores the
    record (A learns late: B loaded it again at once). The settlement runs first, into a record
    that no longer holds a0's reservation, so the restore must not put it back: nothing would take
    it off again, and it stayed reserved until its minute passed (second review)."""
    a, b = two
    a0 = await _admit(a, "a0")
    assert (await _admit(a, "a1")).refused is None
    await b.redis.call("FLUSHALL")
    await b.load_spend(_ask("b0"), 0, 0)
    a.settle(_ask("a0"), a0.second, 0, 0)
    a._send_settlements()  # written now, before the restore below
    await a.restorer.restore(a.lane(_ask("a1")))
    await a.drain()
    assert await b.spend("k1", "total") == (0, COST)  # a1's reservation only


async def test_a_loss_is_said_in_the_log_once_by_each_process_that_sees_it(
    two: tuple[RedisLimiter, RedisLimiter],
) -> None:
    """A Redis that lost its data restarted every key's rpm and tpm windows with nothing in the
    log (the operator audit): each process that knew the data says `redis_data_lost` once per loss."""
    a, b = two
    assert (await _admit(a, "a0")).refused is None
    assert (await _admit(b, "b0")).refused is None
    with structlog.testing.capture_logs() as captured:
        await b.redis.call("FLUSHALL")
        for limiter in (a, b, a):  # A twice: one loss, said once
            await limiter.restorer.check()
    assert [(line["event"], line["prefix"], line["log_level"]) for line in captured] == [
        ("redis_data_lost", a.prefix, "warning")
    ] * 2
