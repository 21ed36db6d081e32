"""The coarse timers (`providers.timers`): never early, at most one tick late, and `deadline_at`
keeps `asyncio.timeout_at`'s contract (its own expiry is a TimeoutError, anyone else's cancel
stays a CancelledError, nested blocks each answer for their own deadline)."""

from __future__ import annotations

import asyncio

import pytest

from providers.timers import RESOLUTION, deadline_at, timers_of

SLACK = 0.05  # scheduling noise on a busy two-core machine, on top of one tick


async def test_a_timer_fires_in_order_never_early_and_a_cancelled_one_never() -> None:
    loop = asyncio.get_running_loop()
    timers = timers_of(loop)
    fired: list[tuple[str, float]] = []
    start = loop.time()
    handles = {
        name: timers.call_later(delay, lambda n: fired.append((n, loop.time() - start)), name)
        for name, delay in (("late", 0.12), ("early", 0.03), ("cancelled", 0.06), ("middle", 0.07))
    }
    handles["cancelled"].cancel()
    await asyncio.sleep(0.12 + RESOLUTION + SLACK)
    assert [name for name, _ in fired] == ["early", "middle", "late"]
    for name, at in fired:
        delay = handles[name].when - start
        assert delay <= at <= delay + RESOLUTION + SLACK, (name, at)
    assert not timers.pending


async def test_a_deadline_that_passes_is_a_timeout_error() -> None:
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(TimeoutError):
        async with deadline_at(start + 0.05):
            await asyncio.sleep(5)
    assert 0.05 <= loop.time() - start <= 0.05 + RESOLUTION + SLACK
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def test_a_block_that_ends_in_time_leaves_no_timer_and_no_error() -> None:
    loop = asyncio.get_running_loop()
    async with deadline_at(loop.time() + 0.05):
        await asyncio.sleep(0)
    async with deadline_at(None):
        await asyncio.sleep(0.01)
    assert not timers_of(loop).pending
    await asyncio.sleep(0.05 + RESOLUTION + SLACK)  # nothing fires into the task later
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def test_a_cancellation_from_outside_stays_a_cancelled_error() -> None:
    loop = asyncio.get_running_loop()
    entered = asyncio.Event()

    async def guarded() -> None:
        async with deadline_at(loop.time() + 10):
            entered.set()
            await asyncio.sleep(5)

    task = asyncio.create_task(guarded())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not timers_of(loop).pending


async def test_nested_deadlines_each_answer_for_their_own() -> None:
    loop = asyncio.get_running_loop()
    seen: list[str] = []

    async def nested() -> None:
        async with deadline_at(loop.time() + 0.1):
            try:
                async with deadline_at(loop.time() + 0.02):
                    await asyncio.sleep(5)
            except TimeoutError:
                seen.append("inner timed out")
            async with deadline_at(loop.time() + 10):  # the outer one expires inside this one
                await asyncio.sleep(5)

    with pytest.raises(TimeoutError):
        await nested()
    assert seen == ["inner timed out"]
    assert not timers_of(loop).pending
