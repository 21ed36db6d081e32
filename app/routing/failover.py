"""The retry loop's decisions: which backend next, what a failure does to it, what the client gets.

providers.md's table, as code:

    failure kind   backend / provider effect                           loop
    TRANSIENT      cool the backend down (Retry-After if sent, else    next backend
                   `failure_cooldown_s`); counts toward the breaker
    TIMEOUT        same as TRANSIENT                                   next backend
    CAPACITY       out of rotation for Retry-After (capped)            next backend
    QUOTA, AUTH    disable the whole provider until a probe succeeds   next backend
    AUTH (403)     the key may not use this upstream model: that       next backend
                   backend only, out for `max_cooldown_s` (logged
                   `backend_forbidden`); a 401 is the refused key
    CLIENT         none                                                stop: 400 to the client

`Candidates` walks a route's backends in order (priority, then least loaded) and hands out
backends with a slot taken; when every remaining eligible backend is full, it waits in the
least-queued one's bounded queue until the request's deadline. When the loop ends without an
answer, `exhausted` picks the status: 429 when capacity was all that stood in the way (with the
soonest Retry-After), 504 when every attempt timed out, 502 when attempts failed otherwise (naming
each attempt's provider and cause: `all backends refused the request (local: connection refused;
fastrun: 503)`), 503 (with the soonest probe or cool-down end) when there was nothing to try.

Every failed attempt is one `attempt_failed` log line (provider, model, upstream model, failure
kind, status or transport error class, cause, cool-down applied); a provider disabled and a
breaker opened are a line each, when the state changes.
"""

from __future__ import annotations

import asyncio
from typing import Any

from app.errors import AllBackendsFailed, AtCapacity, GatewayError, GatewayShort, NoBackendAvailable, UpstreamTimeout
from app.metrics import Metrics
from app.routing.router import Backend, ProviderRuntime
from app.routing.state import CoolReason
from providers.errors import MALFORMED, Failure, UpstreamError, transport_error, wrapped

_ATTEMPT_ROOM_S = 1.0  # a cool-down is waited out only if it ends this long before the request's deadline
_HOLD_STEP_S = 0.1  # how often a request waiting out a cool-down looks at its backend again


class Candidates:
    """The backends one request may still try, in order; tracks why others were passed over."""

    def __init__(self, backends: list[Backend], now: float, probe_interval: float, quota_recheck: float = 0.0) -> None:
        """`quota_recheck`: how long a provider whose balance ran out stays out (`quota_recheck_s`)."""
        self.capacity_waits: list[float] = []  # seconds until a capacity cool-down ends
        self.health_waits: list[float] = []  # seconds until a failure cool-down ends or a probe runs
        self.unset = False  # a provider whose key variable is unset was passed over
        self.probe_interval, self._quota_recheck = probe_interval, quota_recheck
        self.pending = [backend for backend in backends if not self._out(backend, now)]
        self.pending.sort(key=lambda b: (-b.priority, -b.provider.config.priority, b.state.load))
        self._checked = True  # `pending` was just sorted out: the first `next` takes it as it is

    def _out(self, backend: Backend, now: float) -> bool:
        """Whether `backend` is out of rotation at `now`; when it comes back counts toward the
        answer's `Retry-After` (a provider whose key variable is unset never comes back by itself:
        it counts nothing)."""
        state = backend.state
        provider = backend.provider.state
        if provider.key_missing:  # out until a restart: it shortens no other backend's wait
            self.unset = True
            return True
        if not provider.ready and provider.quota_exhausted:  # out until the re-check, then a probe
            self.health_waits.append(max(self.probe_interval, provider.disabled_at + self._quota_recheck - now))
        elif not provider.ready or state.broken:
            self.health_waits.append(self.probe_interval)
        elif state.cooling(now):
            wait = state.cooling_until - now
            (self.capacity_waits if state.cool_reason == "capacity" else self.health_waits).append(wait)
        else:
            return False
        return True

    def failed(self, backend: Backend, now: float) -> None:
        """`backend`'s attempt failed and `apply_failure` took it out: when it is back counts
        toward the answer's `Retry-After`, as a backend that was already out does."""
        state = backend.state
        if state.cooling(now):
            wait = state.cooling_until - now
            (self.capacity_waits if state.cool_reason == "capacity" else self.health_waits).append(wait)

    async def next(self, deadline: float) -> Backend | None:
        """The next backend, with a slot held; None when none is left or the deadline passed.
        Each backend is looked at again as it comes up: one that left rotation since the request
        started (another request's failure cooled it down, disabled or broke it) is passed over,
        and so is a slot handed over in its queue after the failure that took it out, unless
        that is a short cool-down the request can wait out (`_kept`)."""
        loop = asyncio.get_running_loop()
        queue_deadline: float | None = None
        if not self._checked:
            now = loop.time()
            self.pending = [backend for backend in self.pending if not self._out(backend, now)]
        self._checked = False
        while self.pending:
            for index, backend in enumerate(self.pending):
                if backend.state.try_acquire():
                    del self.pending[index]
                    backend.held += 1
                    return backend
            backend = min(self.pending, key=lambda b: b.state.queued)
            if queue_deadline is None:
                queue_deadline = min(loop.time() + backend.provider.policy.queue_timeout_s, deadline)
            others = [b.state for b in self.pending if b is not backend]
            backend.waiting += 1
            try:
                outcome = await backend.state.acquire(queue_deadline - loop.time(), others)
            finally:
                backend.waiting -= 1
            if outcome == "slot":
                now = loop.time()  # the others again too: `_kept` waits only when none is left
                self.pending = [other for other in self.pending if other is not backend and not self._out(other, now)]
                backend.held += 1
                if await self._kept(backend, min(queue_deadline, deadline - _ATTEMPT_ROOM_S)):
                    return backend
                continue
            if outcome == "moved":  # a slot freed elsewhere: look at them all again
                now = loop.time()
                self.pending = [other for other in self.pending if not self._out(other, now)]
            else:
                self.pending.remove(backend)
                self.capacity_waits.append(1.0)
        return None

    async def _kept(self, backend: Backend, limit: float) -> bool:
        """A slot was handed over in `backend`'s queue: True when the request may take it, False
        when the backend left rotation while the request waited (the slot given back).

        A cool-down that ends by `limit` (the request's queue deadline, and a second before its
        own deadline, so that an attempt has time to run) on the last backend it has to try is
        waited out holding the slot: the queue is there to absorb a busy moment, so one transient
        failure (a 503 with a 2 s cool-down) or a short 429 no longer answers every request queued
        behind it 503 at once. A breaker, a failed probe or a disabled provider has no known end:
        those leave the queue at once, as a cool-down past `limit` does, and a request already
        waiting one out sees them within `_HOLD_STEP_S`."""
        loop = asyncio.get_running_loop()
        try:
            wait = 0.0 if self.pending else _cool_wait(backend, loop.time(), limit)
            while wait > 0:  # in steps: a breaker may open, or the cool-down grow, meanwhile
                await asyncio.sleep(min(wait, _HOLD_STEP_S))
                wait = _cool_wait(backend, loop.time(), limit)
        except BaseException:  # cancelled while it waited: the slot goes to the next in the queue
            backend.release()
            raise
        if self._out(backend, loop.time()):
            backend.release()
            return False
        return True


def _cool_wait(backend: Backend, now: float, limit: float) -> float:
    """Seconds until `backend` is back, when only a cool-down ending by `limit` keeps it out; else 0."""
    until = backend.state.cooling_until
    if not backend.up() or until > limit:  # out for more than a cool-down, or for a longer one
        return 0.0
    return max(0.0, until - now)


def apply_failure(
    backend: Backend, exc: UpstreamError, now: float, metrics: Metrics, log: Any, request_id: str
) -> None:
    """What one failed attempt of request `request_id` does to its backend and provider (announced
    to the other workers through the provider's publisher, when there is one), logged as one
    `attempt_failed` line and, when they change, `provider_disabled` / `breaker_open`."""
    policy = backend.provider.policy
    if exc.kind in (Failure.CLIENT, Failure.LOCAL):  # the request's doing, or the gateway's own shortage
        log_attempt(log, backend, exc, None, request_id)
    elif exc.kind is Failure.CAPACITY:
        hint = exc.retry_after if exc.retry_after is not None else policy.capacity_cooldown_s
        cooled = _cool_down(backend, now, min(hint, policy.max_cooldown_s), "capacity", metrics)
        log_attempt(log, backend, exc, cooled, request_id)
    elif exc.kind is Failure.AUTH and exc.status == 403:
        _forbidden(backend, exc, now, metrics, log, request_id)
    elif exc.kind in (Failure.QUOTA, Failure.AUTH):
        _disable(backend, exc, now, metrics, log, request_id)
    else:
        hint = exc.retry_after if exc.retry_after is not None else policy.failure_cooldown_s
        cooled = _cool_down(backend, now, min(hint, policy.max_cooldown_s), "failure", metrics)
        log_attempt(log, backend, exc, cooled, request_id)
        if backend.state.record(False):
            _breaker_opened(backend, metrics, log)


def _cool_down(backend: Backend, now: float, seconds: float, reason: CoolReason, metrics: Metrics) -> float | None:
    """Cool the backend down; the seconds applied, or None when it was already out for longer."""
    extended = backend.state.cool_down(now, seconds, reason)
    if extended and backend.provider.publisher is not None:
        backend.provider.publisher.cooled(backend)
    if not extended or seconds <= 0:
        return None
    metrics.cooldowns.inc((backend.name, reason))  # one started: not a 0 s one, nor one already out longer
    return seconds


def _breaker_opened(backend: Backend, metrics: Metrics, log: Any) -> None:
    backend.state.evict()
    if backend.provider.publisher is not None:
        backend.provider.publisher.breaker_changed(backend)
    metrics.breaker_trips.inc((backend.name,))
    names = {"provider": backend.name, "model": backend.model_id, "upstream_model": backend.upstream_model}
    log.warning("breaker_open", **names, source="attempt")


def _forbidden(backend: Backend, exc: UpstreamError, now: float, metrics: Metrics, log: Any, request_id: str) -> None:
    """A 403: the key may not use this upstream model (primalabs' `model_not_allowed`). providers.md
    disables that backend, not the provider: its other models still serve. The backend is out of
    rotation for the longest cool-down (`max_cooldown_s`), then tried again; no breaker count."""
    seconds = backend.provider.policy.max_cooldown_s
    cooled = _cool_down(backend, now, seconds, "failure", metrics)
    log_attempt(log, backend, exc, cooled, request_id)
    if cooled is not None:
        names = {"provider": backend.name, "model": backend.model_id, "upstream_model": backend.upstream_model}
        log.error("backend_forbidden", **names, status=exc.status, code=exc.code, out_for_s=seconds)


def _disable(backend: Backend, exc: UpstreamError, now: float, metrics: Metrics, log: Any, request_id: str) -> None:
    """A refused key or an exhausted balance: the whole provider leaves rotation until a probe."""
    kind = "quota" if exc.kind is Failure.QUOTA else "auth"
    reason = f"{kind}: upstream returned {exc.status}"
    log_attempt(log, backend, exc, None, request_id)
    disable_provider(backend.provider, reason, now, metrics, log, status=exc.status, code=exc.code, source="attempt")


def disable_provider(
    provider: ProviderRuntime, reason: str, now: float, metrics: Metrics, log: Any, **fields: Any
) -> None:
    """The provider out of rotation for `reason` (`auth: …` or `quota: …`) until a probe brings it
    back: every upstream model's queue looks again, the other workers are told, it is counted, and
    logged (`provider_disabled` with `fields`) when it was in rotation. A request's failure and a
    probe's 401 (`app.routing.health`) both come here."""
    kind = reason.partition(":")[0]
    was_ready = provider.state.ready
    provider.state.disable(reason, now, quota=kind == "quota")
    for state in provider.backends:  # every upstream model of it is out: their queues look again
        state.evict()
    if provider.publisher is not None:
        provider.publisher.provider_disabled(provider)
    metrics.disabled.inc((provider.config.name, kind))
    if was_ready:
        log.error("provider_disabled", provider=provider.config.name, reason=reason, **fields)


def log_attempt(log: Any, backend: Backend, exc: UpstreamError, cooldown_s: float | None, request_id: str) -> None:
    """`attempt_failed`: the request it was an attempt of (its `request` line, its ledger row),
    which backend, what the upstream did (`status`, or the transport error's class in `error`), the
    short `cause` the client's 502 names, and the cool-down it got."""
    (log.info if exc.kind is Failure.CLIENT else log.warning)(
        "attempt_failed",
        request_id=request_id,
        provider=backend.name,
        model=backend.model_id,
        upstream_model=backend.upstream_model,
        kind=exc.kind.value,
        status=exc.status,
        error=transport_error(exc),
        cause=attempt_cause(exc),
        cooldown_s=cooldown_s,
    )


def attempt_cause(exc: UpstreamError) -> str:
    """A short, safe description of one failed attempt: the upstream's status (`503`), or what went
    wrong on the wire. Never the upstream's message, a URL or a key."""
    if exc.kind is Failure.TIMEOUT:
        return "timed out"
    if exc.kind is Failure.LOCAL:
        return "gateway out of descriptors"
    chain = wrapped(exc)
    if chain:
        phrases = (phrase for error in chain for kind, phrase in _TRANSPORT_PHRASES if isinstance(error, kind))
        return next(phrases, "connection failed")
    if exc.status is not None and (exc.kind is Failure.CLIENT or exc.answered):  # not one the adapter could not read
        return str(exc.status)
    return "malformed response"


_TRANSPORT_PHRASES: tuple[tuple[type[BaseException] | tuple[type[BaseException], ...], str], ...] = (
    (MALFORMED, "malformed response"),  # a `101`, `HTTP/2 200`, a broken chunk: not a connection failure
    (ConnectionRefusedError, "connection refused"),
    (ConnectionResetError, "connection reset"),
    (BrokenPipeError, "connection reset"),
    (ConnectionAbortedError, "connection reset"),
)


def exhausted(failures: list[tuple[str, UpstreamError]], candidates: Candidates) -> GatewayError:
    """What the client gets when the loop ends without an answer; `failures` are (provider, error)
    per attempt, in order."""
    if not failures:
        soonest = min(candidates.capacity_waits + candidates.health_waits, default=None)  # any backend back
        if soonest is None:  # only providers a restart brings back: a probe's interval, as for a disabled one
            soonest = candidates.probe_interval if candidates.unset else 1.0
        if candidates.capacity_waits:
            return AtCapacity("all backends for this model are at capacity", retry_after=soonest)
        return NoBackendAvailable("no backend is available for this model", retry_after=soonest)
    errors = [error for _, error in failures if error.kind is not Failure.LOCAL]  # the gateway's, not theirs
    if not errors:
        return GatewayShort("the gateway is short of file descriptors or memory; try again shortly", retry_after=1.0)
    if all(f.kind is Failure.CAPACITY for f in errors):  # each one's cool-down as applied (capped, or longer)
        return AtCapacity(
            "all backends for this model are at capacity", retry_after=min(candidates.capacity_waits, default=1.0)
        )
    if all(f.kind is Failure.TIMEOUT for f in errors):
        return UpstreamTimeout("the upstream timed out before answering")
    causes = "; ".join(f"{provider}: {attempt_cause(error)}" for provider, error in failures)
    return AllBackendsFailed(f"all backends refused the request ({causes})")
