"""Per-backend and per-provider state: capacity, cool-downs, the error-rate breaker, disablement.

A backend is one deployment (provider x upstream model). What routing needs to know about it:

- **capacity**: at most `limit` requests in flight; up to `max_queue` more wait (FIFO, each with
  its own deadline) and are handed a slot directly when one is released, so a waiter is never
  overtaken by a newcomer;
- **cool-down**: out of rotation until a time, after the upstream said 429 (`capacity`, honouring
  its Retry-After, capped) or after backend trouble (`failure`: 5xx, connection errors, timeouts);
- **breaker**: over the last `window` outcomes, an error ratio of at least `ratio` (with at least
  `min_samples` outcomes) opens the breaker: the backend leaves rotation until a health probe
  succeeds;
- **provider disablement** (on the provider, shared by all its backends): a refused key or an
  exhausted balance disables every backend of that provider until a probe with the key succeeds.

All of it is plain in-process state touched only from the event loop (no locks needed); times
are `loop.time()` (monotonic) seconds. Callers decide what a failure means (providers.errors).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from typing import Literal

CoolReason = Literal["capacity", "failure"]


class ProviderState:
    __slots__ = ("disabled_reason", "key_missing", "name")

    def __init__(self, name: str, *, key_missing: bool = False) -> None:
        self.name = name
        self.key_missing = key_missing  # fixed for the process's life: no probe can change it
        self.disabled_reason: str | None = "key variable is unset" if key_missing else None

    @property
    def ready(self) -> bool:
        return self.disabled_reason is None


class BackendState:
    __slots__ = (
        "_outcomes",
        "_waiters",
        "breaker_open",
        "cool_reason",
        "cooling_until",
        "in_flight",
        "limit",
        "max_queue",
        "min_samples",
        "probe_failed",
        "queue_depth",
        "ratio",
    )

    def __init__(
        self, *, limit: int, max_queue: int, window: int = 20, min_samples: int = 5, ratio: float = 0.5
    ) -> None:
        self.limit = limit
        self.max_queue = max_queue
        self.in_flight = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self.cooling_until = 0.0
        self.cool_reason: CoolReason | None = None
        self._outcomes: deque[bool] = deque(maxlen=window)
        self.min_samples = min_samples
        self.ratio = ratio
        self.breaker_open = False
        self.probe_failed = False
        self.queue_depth = 0.0  # the upstream's own queue, from its /metrics (local servers)

    # -- rotation -------------------------------------------------------------------------------

    def cooling(self, now: float) -> bool:
        return now < self.cooling_until

    def healthy(self, now: float) -> bool:
        """In rotation as far as health goes (capacity aside)."""
        return not self.breaker_open and not self.probe_failed and not self.cooling(now)

    def cool_down(self, now: float, seconds: float, reason: CoolReason) -> None:
        until = now + seconds
        if until > self.cooling_until:
            self.cooling_until = until
            self.cool_reason = reason

    @property
    def queued(self) -> int:
        return len(self._waiters)

    @property
    def load(self) -> float:
        return self.in_flight + len(self._waiters) + self.queue_depth

    @property
    def full(self) -> bool:
        return self.in_flight >= self.limit

    # -- capacity -------------------------------------------------------------------------------

    def try_acquire(self) -> bool:
        if self.in_flight < self.limit and not self._waiters:
            self.in_flight += 1
            return True
        return False

    async def acquire(self, max_wait: float) -> bool:
        """Wait for a slot for at most `max_wait` seconds; False when the queue is full or time ran out."""
        if self.try_acquire():
            return True
        if len(self._waiters) >= self.max_queue or max_wait <= 0:
            return False
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(max_wait):
                await waiter
        except TimeoutError:
            return self._abandon(waiter)
        except asyncio.CancelledError:
            self._abandon(waiter)
            raise
        return True

    def _abandon(self, waiter: asyncio.Future[None]) -> bool:
        """A waiter gives up; if a slot was handed to it meanwhile, it keeps it (returns True)."""
        if waiter.done() and not waiter.cancelled():
            return True
        waiter.cancel()
        with contextlib.suppress(ValueError):
            self._waiters.remove(waiter)
        return False

    def release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot passes straight to the waiter
                return
        self.in_flight -= 1

    # -- outcomes and the breaker ------------------------------------------------------------

    def record(self, ok: bool) -> bool:
        """Record an attempt's outcome; returns True when this outcome opened the breaker."""
        self._outcomes.append(ok)
        if ok or self.breaker_open or len(self._outcomes) < self.min_samples:
            return False
        errors = sum(1 for outcome in self._outcomes if not outcome)
        if errors / len(self._outcomes) >= self.ratio:
            self.breaker_open = True
            return True
        return False

    def probe_result(self, ok: bool) -> None:
        """A health probe closes an open breaker (with a clean window) or takes the backend out."""
        self.probe_failed = not ok
        if ok and self.breaker_open:
            self.breaker_open = False
            self._outcomes.clear()
