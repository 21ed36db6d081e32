"""The limiter's contract, and its in-process implementation (no Redis, or Redis down with fail_open).

An admission (`Ask`) is decided atomically against four counters of one key, and counted only if
every one of them lets it pass:

    budget            spent + reserved + cost ≤ budget, per UTC period (whole nano-dollars)
    rpm               admitted requests in the sliding minute ≤ rpm
    tpm               tokens reserved or used in the sliding minute + this request's ≤ tpm
    max_concurrency   requests of the key in flight < max_concurrency

The sliding minute is 60 one-second buckets (by admission second): exact to the second, and
bounded work per admission whatever the traffic. A settlement (`settle`) replaces the tokens and
the cost reserved by the real ones, in the admission's bucket and period, and ends the request's
concurrency entry. A concurrency entry also expires after `Ask.hold_ms`, so a process that died
mid-request does not hold a slot for ever.

`budget_missing` answers an admission whose period's spend is not loaded yet: the gate loads the
ledger's sum (`load_spend`, set only if still absent, so concurrent loaders agree) and asks again.

`LocalLimiter(share=n)` keeps the same state in this process; with `share` > 1 (fail-open with
several processes) it enforces 1/n of each limit and of the budget left when it took over.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Container
from typing import Literal, Protocol

from msgspec import Struct

Refusal = Literal["budget", "rpm", "tpm", "max_concurrency", "budget_missing"]
WINDOW_S = 60


class Ask(Struct, frozen=True, kw_only=True):
    """One admission: -1 (or None) where the key has no such limit."""

    key_id: str
    request_id: str
    period: str  # the budget period's tag (`d20261130`, `m202611`, `total`)
    rpm: int = -1
    tpm: int = -1
    tokens: int = 0
    max_concurrency: int = -1
    hold_ms: int = 600_000
    budget: int = -1  # nano-dollars
    cost: int = 0  # nano-dollars


class Verdict(Struct, frozen=True, kw_only=True):
    refused: Refusal | None = None
    retry_after: float | None = None
    second: int = 0  # the admission's bucket, for its settlement
    remaining_requests: int = 0
    reset_requests_s: float = 0.0
    remaining_tokens: int = 0
    reset_tokens_s: float = 0.0
    spent: int = 0  # nano-dollars settled this period, when refused for the budget


class LimiterDown(Exception):
    """The shared limiter could not be reached (Redis)."""


class Limiter(Protocol):
    async def admit(self, ask: Ask) -> Verdict: ...

    async def load_spend(self, ask: Ask, spent: int, ttl_s: int) -> None:
        """Set the period's spend if still absent, kept `ttl_s` seconds (0: for ever)."""

    def settle(self, ask: Ask, second: int, tokens: int, cost: int) -> None:
        """Taken without waiting: nobody awaits a settlement (Redis's failures are reported aside)."""

    async def spend(self, key_id: str, period: str) -> tuple[int, int] | None:
        """(spent, reserved) in nano-dollars, None when not loaded."""


class _KeyState:
    __slots__ = ("buckets", "budgets", "carried", "flight", "requests", "tokens")

    def __init__(self) -> None:
        self.buckets: deque[list[int]] = deque()  # [second, requests, tokens], oldest first
        self.requests = self.tokens = 0  # the buckets' sums, kept with them (no sum per admission)
        self.flight: dict[str, float] = {}  # request id → expiry (monotonic seconds)
        self.budgets: dict[str, list[int]] = {}  # period → [base, spent, reserved, of it reserved by `admit`]
        self.carried: dict[str, int] = {}  # period → reserved by `admit` when its spend was forgotten


class LocalLimiter:
    """This process's counters; `share` divides every limit (module doc)."""

    def __init__(self, share: int = 1) -> None:
        self.share = share
        self._keys: dict[str, _KeyState] = {}

    def forget(self, live: Container[str]) -> None:
        """Drop the counters of keys not in `live` (revoked: none of their requests comes again)."""
        for key_id in [key_id for key_id in self._keys if key_id not in live]:
            del self._keys[key_id]

    async def admit(self, ask: Ask) -> Verdict:
        state = self._keys.get(ask.key_id) or self._keys.setdefault(ask.key_id, _KeyState())
        now = time.monotonic()  # a sliding minute of elapsed time: an NTP step of the wall clock moves no bucket
        second = int(now)
        buckets = state.buckets
        while buckets and buckets[0][0] <= second - WINDOW_S:
            _second, gone_requests, gone_tokens = buckets.popleft()
            state.requests -= gone_requests
            state.tokens -= gone_tokens
        requests, tokens = state.requests, state.tokens
        refused = self._refusal(ask, state, now, requests, tokens)
        if refused is not None:
            return refused
        if not buckets or buckets[-1][0] != second:
            buckets.append([second, 0, 0])
        buckets[-1][1] += 1
        buckets[-1][2] += ask.tokens
        state.requests += 1
        state.tokens += ask.tokens
        if ask.max_concurrency >= 0:
            state.flight[ask.request_id] = time.monotonic() + ask.hold_ms / 1000
        if ask.budget >= 0:
            budget = state.budgets[ask.period]
            budget[2] += ask.cost
            budget[3] += ask.cost
        rpm, tpm = self._limit(ask.rpm), self._limit(ask.tpm)
        return Verdict(
            second=second,
            remaining_requests=max(0, rpm - requests - 1),
            reset_requests_s=_reset(buckets, now),
            remaining_tokens=max(0, tpm - tokens - ask.tokens),
            reset_tokens_s=_reset(buckets, now),
        )

    def _limit(self, limit: int) -> int:
        return limit if limit < 0 else max(1, limit // self.share)

    def _refusal(self, ask: Ask, state: _KeyState, now: float, requests: int, tokens: int) -> Verdict | None:
        """A refusal, with the window as it stands (for the 429's `x-ratelimit-*` headers, the
        budget's included); None when `ask` may pass."""
        rpm, tpm = self._limit(ask.rpm), self._limit(ask.tpm)
        spent = 0
        refusal: tuple[Refusal, float | None] | None = None
        if ask.budget >= 0:
            budget = state.budgets.get(ask.period)
            if budget is None:
                return Verdict(refused="budget_missing")
            base, settled, reserved, _own = budget
            spent = base + settled
            if base + (settled + reserved + ask.cost) * self.share > ask.budget:
                refusal = ("budget", None)
        if refusal is None:
            refusal = self._window_refusal(ask, state, now, requests, tokens)
        if refusal is None:
            return None
        reset = _reset(state.buckets, now)
        return Verdict(
            refused=refusal[0],
            retry_after=refusal[1],
            remaining_requests=max(0, rpm - requests),
            reset_requests_s=reset,
            remaining_tokens=max(0, tpm - tokens),
            reset_tokens_s=reset,
            spent=spent,
        )

    def _window_refusal(
        self, ask: Ask, state: _KeyState, now: float, requests: int, tokens: int
    ) -> tuple[Refusal, float] | None:
        rpm, tpm = self._limit(ask.rpm), self._limit(ask.tpm)
        after = 0.0  # when both refuse, an rpm refusal's Retry-After waits for tpm too: until a request passes
        if ask.tpm >= 0 and tokens + ask.tokens > tpm:
            after = _wait(state.buckets, now, 2, tokens + ask.tokens - tpm)
        if ask.rpm >= 0 and requests + 1 > rpm:
            return "rpm", max(_wait(state.buckets, now, 1, requests + 1 - rpm), after)
        if after:
            return "tpm", after
        if ask.max_concurrency >= 0:
            clock = time.monotonic()
            for request_id in [r for r, expiry in state.flight.items() if expiry <= clock]:
                del state.flight[request_id]
            if len(state.flight) >= self._limit(ask.max_concurrency):
                return "max_concurrency", 1.0
        return None

    def window(self, key_id: str, rpm: int, tpm: int) -> Verdict:
        """The key's window as it stands, nothing admitted (`app.access.window_view`)."""
        state, now = self._keys.get(key_id), time.monotonic()
        live = [bucket for bucket in state.buckets if bucket[0] > int(now) - WINDOW_S] if state is not None else []
        requests, tokens, reset = sum(b[1] for b in live), sum(b[2] for b in live), _reset(deque(live), now)
        return Verdict(
            remaining_requests=max(0, self._limit(rpm) - requests),
            reset_requests_s=reset,
            remaining_tokens=max(0, self._limit(tpm) - tokens),
            reset_tokens_s=reset,
        )

    async def load_spend(self, ask: Ask, spent: int, ttl_s: int) -> None:
        """The period's spend, set if absent. The key's earlier periods go, but for those with this
        limiter's own admissions still running: a daily budget kept one more a day, for good (a
        state audit). A later one stays: a request that started before its period's end may load
        that period after the next one was loaded (`_past`)."""
        state = self._keys.setdefault(ask.key_id, _KeyState())
        if ask.period not in state.budgets:
            for period in [period for period, budget in state.budgets.items() if budget[3] <= 0]:
                if _past(period, ask.period):
                    del state.budgets[period]
            for period in [period for period, own in state.carried.items() if own <= 0]:
                if _past(period, ask.period):
                    del state.carried[period]
            own = state.carried.pop(ask.period, 0)  # its own admissions still running (`forget_spend`)
            state.budgets[ask.period] = [spent, 0, own, own]

    def add_to_budget(self, key_id: str, period: str, reserved: int, spent: int) -> None:
        """`reserved` and `spent` added to the period's loaded budget, if loaded (what Redis admitted
        here and still runs: `app.access.open_holds`)."""
        state = self._keys.get(key_id)
        budget = state.budgets.get(period) if state is not None else None
        if budget is not None:
            budget[1] += spent
            budget[2] += reserved

    def forget_spend(self) -> None:
        """Drop every budget's spend, to be loaded from the ledger again at the next admission (the
        gate, as Redis fails with `fail_open`: the spend of a last outage is long out of date).
        What this limiter's own admissions still running reserved is carried into the reload:
        they are not in the ledger yet, and each settles here (a request admitted in one outage
        and still running in the next gave its reservation back to a budget that never had it:
        that much more admitted)."""
        for state in self._keys.values():
            for period, budget in state.budgets.items():
                if budget[3] > 0:
                    state.carried[period] = budget[3]
            state.budgets.clear()

    def settle(self, ask: Ask, second: int, tokens: int, cost: int) -> None:
        state = self._keys.get(ask.key_id)
        if state is None:
            return
        state.flight.pop(ask.request_id, None)
        for bucket in reversed(state.buckets):  # its second is among the newest
            if bucket[0] == second:
                bucket[2] += tokens - ask.tokens
                state.tokens += tokens - ask.tokens
                break
        if ask.budget < 0:
            return
        budget = state.budgets.get(ask.period)
        if budget is not None:
            budget[2] -= ask.cost
            budget[3] -= ask.cost
            budget[1] += cost
        elif ask.period in state.carried:  # forgotten, not loaded again yet
            state.carried[ask.period] -= ask.cost

    async def spend(self, key_id: str, period: str) -> tuple[int, int] | None:
        state = self._keys.get(key_id)
        budget = state.budgets.get(period) if state is not None else None
        return (budget[0] + budget[1], budget[2]) if budget is not None else None


def _past(period: str, current: str) -> bool:
    """Whether `period` is before `current`, or of another kind (the key's budget period changed):
    tags of one kind (`d20261130`, `m202611`) sort as their periods."""
    return period[:1] != current[:1] or period < current


def _reset(buckets: deque[list[int]], now: float) -> float:
    """Seconds until the oldest bucket of the window leaves it (0 when the window is empty)."""
    return max(0.0, buckets[0][0] + WINDOW_S - now) if buckets else 0.0


def _wait(buckets: deque[list[int]], now: float, column: int, excess: int) -> float:
    """Seconds until enough of the oldest buckets leave the window to free `excess` (of requests,
    column 1, or tokens, column 2)."""
    freed = 0
    for bucket in buckets:
        freed += bucket[column]
        if freed >= excess:
            return max(1.0, math.ceil(bucket[0] + WINDOW_S - now))
    return float(WINDOW_S)
