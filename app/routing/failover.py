"""The retry loop's decisions: which backend next, what a failure does to it, what the client gets.

providers.md's table, as code:

    failure kind   backend / provider effect                           loop
    TRANSIENT      cool the backend down (Retry-After if sent, else    next backend
                   `failure_cooldown_s`); counts toward the breaker
    TIMEOUT        same as TRANSIENT                                   next backend
    CAPACITY       out of rotation for Retry-After (capped)            next backend
    QUOTA, AUTH    disable the whole provider until a probe succeeds   next backend
    CLIENT         none                                                stop: 400 to the client

`Candidates` walks a route's backends in order (priority, then least loaded) and hands out
backends with a slot taken; when every remaining eligible backend is full, it waits in the
least-queued one's bounded queue until the request's deadline. When the loop ends without an
answer, `exhausted` picks the status: 429 when capacity was all that stood in the way (with the
soonest Retry-After), 504 when every attempt timed out, 502 when attempts failed otherwise, 503
(with the soonest probe or cool-down end) when there was nothing to try.
"""

from __future__ import annotations

import asyncio
from typing import Any

from app.errors import AllBackendsFailed, AtCapacity, GatewayError, NoBackendAvailable, UpstreamTimeout
from app.metrics import Metrics
from app.routing.router import Backend
from providers.errors import MAX_RETRY_AFTER, Failure, UpstreamError


class Candidates:
    """The backends one request may still try, in order; tracks why others were passed over."""

    def __init__(self, backends: list[Backend], now: float, probe_interval: float) -> None:
        self.pending: list[Backend] = []
        self.capacity_waits: list[float] = []  # seconds until a capacity cool-down ends
        self.health_waits: list[float] = []  # seconds until a failure cool-down ends or a probe runs
        for backend in backends:
            state = backend.state
            if not backend.provider.state.ready or state.breaker_open or state.probe_failed:
                self.health_waits.append(probe_interval)
            elif state.cooling(now):
                wait = state.cooling_until - now
                (self.capacity_waits if state.cool_reason == "capacity" else self.health_waits).append(wait)
            else:
                self.pending.append(backend)
        self.pending.sort(key=lambda b: (-b.priority, -b.provider.config.priority, b.state.load))

    async def next(self, deadline: float) -> Backend | None:
        """The next backend, with a slot held; None when none is left or the deadline passed."""
        loop = asyncio.get_running_loop()
        queue_deadline: float | None = None
        while self.pending:
            for index, backend in enumerate(self.pending):
                if backend.state.try_acquire():
                    del self.pending[index]
                    return backend
            backend = min(self.pending, key=lambda b: b.state.queued)
            if queue_deadline is None:
                queue_deadline = min(loop.time() + backend.provider.policy.queue_timeout_s, deadline)
            others = [b.state for b in self.pending if b is not backend]
            outcome = await backend.state.acquire(queue_deadline - loop.time(), others)
            if outcome == "slot":
                self.pending.remove(backend)
                return backend
            if outcome != "moved":
                self.pending.remove(backend)
                self.capacity_waits.append(1.0)
        return None


def apply_failure(backend: Backend, exc: UpstreamError, now: float, metrics: Metrics, log: Any) -> None:
    """What one failed attempt does to its backend and provider (announced to the other workers
    through the provider's publisher, when there is one)."""
    config = backend.provider.policy
    state = backend.state
    publisher = backend.provider.publisher
    if exc.kind is Failure.CLIENT:
        return
    if exc.kind is Failure.CAPACITY:
        hint = exc.retry_after if exc.retry_after is not None else config.capacity_cooldown_s
        seconds = min(hint, config.max_cooldown_s, MAX_RETRY_AFTER)
        if state.cool_down(now, seconds, "capacity") and publisher is not None:
            publisher.cooled(backend)
        metrics.cooldowns.inc((backend.name, "capacity"))
        return
    if exc.kind in (Failure.QUOTA, Failure.AUTH):
        reason = "quota" if exc.kind is Failure.QUOTA else "auth"
        backend.provider.state.disable(f"{reason}: upstream returned {exc.status}", now, quota=reason == "quota")
        if publisher is not None:
            publisher.provider_disabled(backend.provider)
        metrics.disabled.inc((backend.name, reason))
        log.error("provider_disabled", provider=backend.name, reason=reason, status=exc.status, code=exc.code)
        return
    hint = exc.retry_after if exc.retry_after is not None else config.failure_cooldown_s
    if state.cool_down(now, min(hint, config.max_cooldown_s), "failure") and publisher is not None:
        publisher.cooled(backend)
    metrics.cooldowns.inc((backend.name, "failure"))
    if state.record(False):
        if publisher is not None:
            publisher.breaker_changed(backend)
        metrics.breaker_trips.inc((backend.name,))
        log.warning("breaker_open", provider=backend.name, upstream_model=backend.upstream_model)


def exhausted(failures: list[UpstreamError], candidates: Candidates) -> GatewayError:
    if not failures:
        if candidates.capacity_waits:
            return AtCapacity("all backends for this model are at capacity", retry_after=min(candidates.capacity_waits))
        return NoBackendAvailable(
            "no backend is available for this model", retry_after=min(candidates.health_waits, default=1.0)
        )
    if all(f.kind is Failure.CAPACITY for f in failures):
        hints = [f.retry_after for f in failures if f.retry_after is not None] + candidates.capacity_waits
        return AtCapacity("all backends for this model are at capacity", retry_after=min(hints, default=1.0))
    if all(f.kind is Failure.TIMEOUT for f in failures):
        return UpstreamTimeout("the upstream timed out before answering")
    return AllBackendsFailed("all backends refused the request")
