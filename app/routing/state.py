"""Per-backend and per-provider state: capacity, cool-downs, the error-rate breaker, disablement.

A backend is one deployment (provider x upstream model). What routing needs to know about it:

- **capacity**: at most `limit` requests in flight; up to `max_queue` more wait (FIFO, each with
  its own deadline) and are handed a slot directly when one is released, so a waiter is never
  overtaken by a newcomer; a waiter also watches the request's other full backends, and a slot
  freed there with nobody queued for it wakes the waiter to take it;
- **cool-down**: out of rotation until a time, after the upstream said 429 (`capacity`, honouring
  its Retry-After, capped) or after backend trouble (`failure`: 5xx, connection errors, timeouts);
- **breaker**: over the last `window` outcomes, an error ratio of at least `ratio` (with at least
  `min_samples` outcomes) opens the breaker: the backend leaves rotation until a health probe
  succeeds;
- **provider disablement** (on the provider, shared by all its backends): a refused key or an
  exhausted balance disables every backend of that provider until a probe with the key succeeds.

All of it is plain in-process state touched only from the event loop (no locks needed); times
are `loop.time()` (monotonic) seconds. Callers decide what a failure means (providers.errors).
With several workers or replicas, `app.routing.cluster` copies cool-downs, breakers and disablement
between processes; capacity stays per process (each enforces its share of the limit).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Sequence
from typing import Literal

CoolReason = Literal["capacity", "failure"]
WaitResult = Literal["slot", "moved", "timeout", "full"]


class ProviderState:
    __slots__ = ("disabled_at", "disabled_reason", "key_missing", "name", "quota_exhausted")

    def __init__(self, name: str, *, key_missing: bool = False) -> None:
        self.name = name
        self.key_missing = key_missing  # fixed for the process's life: no probe can change it
        self.disabled_reason: str | None = "key variable is unset" if key_missing else None
        self.disabled_at = 0.0
        self.quota_exhausted = False

    def disable(self, reason: str, now: float, *, quota: bool) -> None:
        self.disabled_reason = reason
        self.disabled_at = now
        self.quota_exhausted = quota

    def enable(self) -> None:
        self.disabled_reason = None
        self.quota_exhausted = False

    def may_reenable(self, now: float, quota_recheck_s: float) -> bool:
        """A refused key comes back on the next good probe; an exhausted balance only after
        `quota_recheck_s`, since `/models` answers 200 with an empty balance too."""
        return not self.quota_exhausted or now - self.disabled_at >= quota_recheck_s

    @property
    def ready(self) -> bool:
        return self.disabled_reason is None


class BackendState:
    __slots__ = (
        "_outcomes",
        "_waiters",
        "_watchers",
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
        "unlisted",
    )

    def __init__(
        self, *, limit: int, max_queue: int, window: int = 20, min_samples: int = 5, ratio: float = 0.5
    ) -> None:
        self.limit = limit
        self.max_queue = max_queue
        self.in_flight = 0
        self._waiters: deque[asyncio.Future[bool]] = deque()
        self._watchers: deque[asyncio.Future[bool]] = deque()  # requests queued on another backend
        self.cooling_until = 0.0
        self.cool_reason: CoolReason | None = None
        self._outcomes: deque[bool] = deque(maxlen=window)
        self.min_samples = min_samples
        self.ratio = ratio
        self.breaker_open = False
        self.probe_failed = False
        self.queue_depth = 0.0  # the upstream's own queue, from its /metrics (local servers)
        self.unlisted = False  # its provider's `/models` (fastrun, primalabs) leaves its upstream model out

    # -- rotation -------------------------------------------------------------------------------

    def cooling(self, now: float) -> bool:
        return now < self.cooling_until

    @property
    def broken(self) -> bool:
        """Out of rotation with no known end: a breaker, a failed probe, a model its provider does
        not list (a probe brings it back; a cool-down ends by itself)."""
        return self.breaker_open or self.probe_failed or self.unlisted

    def healthy(self, now: float) -> bool:
        """In rotation as far as health goes (capacity aside)."""
        return not self.broken and not self.cooling(now)

    def cool_down(self, now: float, seconds: float, reason: CoolReason) -> bool:
        """Out of rotation for `seconds` unless already out for longer; True when extended."""
        until = now + seconds
        if until > self.cooling_until:
            self.cooling_until = until
            self.cool_reason = reason
            return True
        return False

    @property
    def queued(self) -> int:
        return len(self._waiters)

    @property
    def load(self) -> float:
        return self.in_flight + len(self._waiters) + self.queue_depth

    # -- capacity -------------------------------------------------------------------------------

    def try_acquire(self) -> bool:
        if self.in_flight < self.limit and not self._waiters:
            self.in_flight += 1
            return True
        return False

    async def acquire(self, max_wait: float, watch: Sequence[BackendState] = ()) -> WaitResult:
        """Wait in this backend's queue for at most `max_wait` seconds.

        "slot": a slot here is held. "moved": a backend in `watch` freed a slot with nobody queued
        on it, so the caller should try that one rather than keep waiting here. "timeout": the wait
        ran out. "full": the queue was full (or `max_wait` was 0), no wait at all.
        """
        if self.try_acquire():
            return "slot"
        if len(self._waiters) >= self.max_queue or max_wait <= 0:
            return "full"
        waiter: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        for other in watch:
            other._watchers.append(waiter)
        try:
            async with asyncio.timeout(max_wait):
                handed = await waiter
        except (TimeoutError, asyncio.CancelledError) as exc:
            handed = self._abandon(waiter)
            if isinstance(exc, asyncio.CancelledError):
                if handed:
                    self.release()
                raise
            return "slot" if handed else "timeout"
        finally:
            for other in watch:
                with contextlib.suppress(ValueError):
                    other._watchers.remove(waiter)
        if handed:
            return "slot"
        with contextlib.suppress(ValueError):
            self._waiters.remove(waiter)
        return "moved"

    def _abandon(self, waiter: asyncio.Future[bool]) -> bool:
        """A waiter gives up; True when a slot here was handed to it meanwhile (it holds it)."""
        if waiter.done() and not waiter.cancelled():
            handed = waiter.result()
            if not handed:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
            return handed
        waiter.cancel()
        with contextlib.suppress(ValueError):
            self._waiters.remove(waiter)
        return False

    def evict(self) -> None:
        """Out of rotation with no known end (a failed probe, an open breaker, a disabled provider):
        every queued request is woken to look at its backends again, now, instead of waiting its
        queue timeout out for a slot and answering 429 as if capacity were the trouble."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(False)
        self._watchers.clear()  # a slot freed here serves nobody queued elsewhere while it is out

    def release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(True)  # the slot passes straight to the waiter
                return
        self.in_flight -= 1
        while self._watchers:
            watcher = self._watchers.popleft()
            if not watcher.done():
                watcher.set_result(False)  # a request queued elsewhere may take this slot
                return

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
            self.close_breaker()

    def close_breaker(self) -> None:
        """Back in rotation with a clean window (a probe here, or another worker's, succeeded)."""
        self.breaker_open = False
        self._outcomes.clear()
