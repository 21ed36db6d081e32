"""Coarse timers: the request path's timeouts on one event-loop timer.

A timeout that almost never fires still costs its event-loop timer. Under uvloop a `call_later`
and its `cancel` make, start, stop and close a libuv timer handle (≈ 2.5 µs), and an
`asyncio.timeout` block costs ≈ 7 µs; a proxied request armed three of them (its deadline, the
wait for the upstream's head, the wait for its body). `Timers` keeps such timers in a set instead,
with one loop timer that ticks every `RESOLUTION` seconds while any is pending and fires those
whose time has come: ≈ 0.3 µs to arm and cancel one, ≈ 2 µs for a `deadline_at` block (measured
in a loop under uvloop).

The price is precision: a timer fires up to one tick late, never early. Every timeout on the
request path is configured in seconds (config.md), so 20 ms is well below what a client or an
operator can tell. The loop's own periodic work (keep-alive pings, probes, back-off) keeps its
ordinary timers.

    timers_of(loop).call_later(delay, callback, arg)  -> a handle with cancel()
    async with deadline_at(when): ...                  asyncio.timeout_at's contract: TimeoutError
                                                       when `when` (loop time) passed inside the block
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from types import TracebackType
from typing import Any

RESOLUTION = 0.02  # seconds between two ticks: how late a timer may fire

_by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Timers] = weakref.WeakKeyDictionary()


class Handle:
    """One pending timer; `cancel()` before it fires and it never does."""

    __slots__ = ("_arg", "_callback", "_timers", "when")

    def __init__(self, timers: Timers, when: float, callback: Callable[[Any], object], arg: object) -> None:
        self._timers = timers
        self.when = when
        self._callback = callback
        self._arg = arg

    def cancel(self) -> None:
        self._timers.pending.discard(self)

    def fire(self) -> None:
        self._callback(self._arg)


class Timers:
    """The coarse timers of one event loop (`timers_of`)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = weakref.ref(loop)  # weak: the registry's value must not keep its key alive
        self.pending: set[Handle] = set()
        self._tick_handle: asyncio.TimerHandle | None = None

    def call_later(self, delay: float, callback: Callable[[Any], object], arg: object) -> Handle:
        return self.call_at(self._running().time() + delay, callback, arg)

    def call_at(self, when: float, callback: Callable[[Any], object], arg: object) -> Handle:
        """`callback(arg)` at `when` (loop time) or up to `RESOLUTION` later, unless cancelled."""
        handle = Handle(self, when, callback, arg)
        self.pending.add(handle)
        if self._tick_handle is None:
            self._tick_handle = self._running().call_later(RESOLUTION, self._tick)
        return handle

    def _running(self) -> asyncio.AbstractEventLoop:
        loop = self._loop()
        assert loop is not None, "the loop of these timers is gone"
        return loop

    def _tick(self) -> None:
        self._tick_handle = None
        loop = self._running()
        now = loop.time()
        due = [handle for handle in self.pending if handle.when <= now]
        for handle in sorted(due, key=_when):
            if handle in self.pending:  # a callback before it may have cancelled it
                self.pending.discard(handle)
                handle.fire()
        if self.pending and self._tick_handle is None:
            self._tick_handle = loop.call_later(RESOLUTION, self._tick)


def _when(handle: Handle) -> float:
    return handle.when


def timers_of(loop: asyncio.AbstractEventLoop) -> Timers:
    timers = _by_loop.get(loop)
    if timers is None:
        timers = _by_loop[loop] = Timers(loop)
    return timers


def deadline_at(when: float | None) -> Deadline:
    """`asyncio.timeout_at(when)` on the coarse timers: the task is cancelled once `when` (loop
    time) passed, and that cancellation leaves the block as `TimeoutError`; a cancellation from
    elsewhere (the client went away) stays a `CancelledError`, as with asyncio's. `when=None`
    never expires."""
    return Deadline(when)


class Deadline:
    """The async context manager `deadline_at` returns."""

    __slots__ = ("_cancelling", "_expired", "_handle", "_task", "_when")

    def __init__(self, when: float | None) -> None:
        self._when = when
        self._expired = False
        self._handle: Handle | None = None

    async def __aenter__(self) -> Deadline:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task(loop)
        if task is None:
            raise RuntimeError("deadline_at must be used inside a task")
        self._task = task
        self._cancelling = task.cancelling()
        if self._when is not None:
            self._handle = timers_of(loop).call_at(self._when, Deadline.expire, self)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._expired and self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
            raise TimeoutError from exc

    def expire(self) -> None:
        """The timer's callback: cancel the task, so that the block ends in `TimeoutError`."""
        self._expired = True
        self._handle = None
        self._task.cancel()
