"""The access gate: what the pipeline asks about a key once its request's route is known.

    permit(ctx, model)          the key's entry, or 403 when the key may not use the model (401:
                                revoked since the edge authenticated it)
    reserve(entry, ctx, request, model, providers, snapshot)
                                a limited key's `Ticket` from this process's lease, or the request's
                                `Reservation` (tokens, worst-case cost, the route's plan) for `admit`
    admit(entry, ctx, reservation)   the key's limiter's `Ticket`, or a 429/503
    settle(ticket, cost, tokens)     the reservation becomes the real cost and tokens

`permit` runs as soon as the model is resolved, before routing: a model the key may not use is a
403 whether or not a backend could serve it now (a 503 would tell the caller which forbidden
models have backends, and invite a retry). `reserve` runs after routing decided which backends may
serve the request and before any of them is tried, so the reservation covers the most expensive
of them (`app.access.worstcase`). It is not a coroutine: a busy key's request is admitted from the
lease without an await, and only the others go on to `admit` (Redis, or this process's limiter).
`settle` runs from the pipeline's `_close`, which every request passes once (success, failure, client
cancellation): a failure without usage settles to 0. Settling is one Redis command sent without
waiting for its answer (the pipeline closes synchronously; no task per request). A settlement
Redis could not take is logged (`limits_settle_failed`) and its reservation stays held until its
minute of admission is past the hold (`app.access.redis_scripts`): the budget errs on the side of
refusing, for that long.

Limiter choice: Redis when `[redis]` is configured (several processes share it); in-process when
this is the only process. Several processes without Redis (a key with limits created after
start-up: the CLI refuses to start that way) are treated like Redis being down. Redis down:
`LimitsUnavailable` (503, `limits cannot be checked`), or with `[auth] fail_open` this process's
share of every limit (`LocalLimiter(share=processes)`), logged once per outage and counted in
`switchyard_limits_local_total`; the budget reservations Redis granted this process's requests
still running count in that share (`app.access.open_holds`). The 429s: `app.access.refusals`.

Response headers (OpenAI's): `x-ratelimit-{limit,remaining,reset}-requests` when the key has
`rpm`, and `-tokens` when it has `tpm`; a key with only a budget or a concurrency cap gets none
(no request or token window to describe); made in `app.access.rate_headers`. They come with every
answer the limiter gave: an admission and each of its 429s, the budget's included (the window as
it stands); every other response to the key reads the window without admitting anything
(`window_headers`, `app.access.window_view`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from msgspec import Struct
from sqlalchemy.ext.asyncio import AsyncEngine

from app.access.keyring import INVALID, Entry, KeyRing
from app.access.lane import Lane
from app.access.limiter import Ask, Limiter, LimiterDown, LocalLimiter, Verdict
from app.access.open_holds import OpenHolds
from app.access.rate_headers import admission_headers, rate_headers, reset_bytes
from app.access.redis_limiter import RedisLimiter
from app.access.refusals import refusal
from app.access.window_view import window_now
from app.access.worstcase import (
    WorstRates,
    from_nano,
    input_bounds,
    output_bound,
    period_bounds,
    seconds_until,
    time_bound_nano,
    to_nano,
    worst_cost_nano,
    worst_rates,
)
from app.context import RequestContext
from app.errors import (
    AuthenticationFailed,
    LimitsUnavailable,
    PermissionDenied,
    clip,
)
from app.metrics import Counter
from app.pipeline.events import RateHeaders
from app.settings import Settings
from catalog.keys import KeyRecord, spent_since
from catalog.snapshot import CatalogSnapshot, ModelEntry
from providers.types import AnyRequest

DAY_S = 86_400
SPEND_READ_S = 30.0
"""How long an admission waits for the ledger's spend of a key with a budget (read once a period,
and again when Redis lost its record): a database that stops answering without closing its
connection would otherwise hold the request for good. TimeoutError is a database out of reach:
503 `unavailable` (`app.errors`), as a refused connection is."""
SAY_EVERY_S = 10.0  # `limits_unavailable` at most this often: a Redis answering now and then said it 58 times in 10 s
_DAWN = datetime.min.replace(tzinfo=UTC)  # a span's start or end that has none
_FOREVER = datetime.max.replace(tzinfo=UTC)


class Ticket(Struct):
    """One admitted request's reservation, until it is settled (a Struct: made per request without
    a Python `__init__`): its `ask`, or for an admission from a lease (`AccessGate.admit`) the
    lane it came from and the `tokens` and `cost` it reserved."""

    limiter: Limiter
    second: int
    headers: RateHeaders
    ask: Ask | None = None
    lane: Lane | None = None
    tokens: int = 0
    cost: int = 0
    open: tuple[str, str] | None = None  # (key id, period) while Redis's reservation of a budget is open here


class Reservation(Struct):
    """What `reserve` worked out for a request the lease could not hold, for `admit`: its tokens,
    its worst-case cost (nano-dollars) and its route's `Plan`."""

    tokens: int
    cost: int
    plan: Plan


class Plan:
    """What `reserve` needs of one key on one route, worked out once and kept by (key entry, model,
    pinned provider) while it holds: for one catalog snapshot, from `start` until `end` (the span
    in which the route's prices are the ones in effect, within the key's budget period). The
    route's worst-case rates (`worst_rates`, scaled to integers) when the key has a budget, the
    period, and Redis's lane of the key once an admission has made it (`admit`)."""

    __slots__ = ("end", "floor", "lane", "period", "rates", "snapshot", "start")

    def __init__(
        self, snapshot: CatalogSnapshot, start: datetime, end: datetime, period: str, rates: WorstRates | None
    ) -> None:
        self.snapshot, self.start, self.end, self.period, self.rates = snapshot, start, end, period, rates
        self.floor = 0  # nano-dollars: the route's GPU-time bound (`worstcase.time_bound_nano`)
        self.lane: Lane | None = None


class AccessGate:
    def __init__(self, settings: Settings, engine: AsyncEngine, keyring: KeyRing, log: Any, counter: Counter) -> None:
        self.keyring = keyring
        self._engine = engine
        self._log = log
        self._counter = counter
        self._fail_open = settings.auth.fail_open
        processes = settings.server.workers * settings.server.replicas
        shared = RedisLimiter(settings.redis, self._settle_failed) if settings.redis is not None else None
        self._shared: RedisLimiter | None = shared
        self._alone = processes == 1
        self._local = LocalLimiter(share=processes)
        self._outage = False
        self._refusing = False  # fail closed: said once per outage (`limits_unavailable`)
        self._said_at = -SAY_EVERY_S  # when `limits_unavailable` was last said (a flapping Redis)
        timeouts = [p.timeouts.total for p in settings.providers.values()] or [600.0]
        self._hold_ms = int((settings.routing.request_deadline_s + max(timeouts)) * 1000)
        self._gpu_bounds = {  # the worst a request can cost on each provider priced by GPU time
            name: time_bound_nano(Decimal(p.gpu_hour_usd), p.timeouts.total)
            for name, p in settings.providers.items()
            if p.gpu_hour_usd is not None
        }
        self._plans: dict[tuple[Entry, str, str | None], Plan] = {}
        self._holds = OpenHolds()  # with `fail_open`: Redis's reservations held here (`app.access.open_holds`)
        self._swept = keyring.version  # the ring's version when `_sweep` last ran

    @property
    def shared(self) -> RedisLimiter | None:
        return self._shared

    async def close(self) -> None:
        if self._shared is not None:
            await self._shared.drain()
            await self._shared.close()

    # -- permission ----------------------------------------------------------------------------

    def permit(self, ctx: RequestContext, model: ModelEntry) -> Entry | None:
        """The request's key's entry (None: no key); 403 for a model it may not use, 401 for a key
        revoked since the edge authenticated the request (it fails closed: a key no longer held
        has no limits left to apply)."""
        key_id = ctx.principal.key_id
        if key_id is None:
            return None
        entry = self.keyring.by_id.get(key_id)
        if entry is None:
            raise AuthenticationFailed(INVALID)
        if entry.record.models is not None and model.id not in entry.record.models:
            raise PermissionDenied(f"this API key may not use model '{clip(model.id)}'")
        return entry

    # -- admission -----------------------------------------------------------------------------

    def reserve(
        self,
        entry: Entry,
        ctx: RequestContext,
        request: AnyRequest,
        model: ModelEntry,
        providers: Sequence[str],
        snapshot: CatalogSnapshot,
    ) -> Ticket | Reservation:
        """A limited key's admission from this process's lease in the key's lane, with no Redis
        call and no coroutine (a `Ticket`), when the lease holds it; otherwise the request's
        `Reservation` for `admit`. `providers`: the route's (`Route.names`), which the router
        makes of the model and the pinned provider for one snapshot, so the route's `Plan` is kept
        by the two (keys mode's cost per request: bench/RESULTS.md)."""
        now = ctx.started_at
        budget, tpm = entry.budget_nano, entry.tpm
        tokens = tokens_in = priced_in = tokens_out = 0
        if budget >= 0 or tpm >= 0:
            tokens_in, priced_in = input_bounds(request, model.context_window)
            tokens_out = request.max_tokens or output_bound(request, model)
            if tpm >= 0:
                tokens = tokens_in + tokens_out
        plan = self._plans.get((entry, model.id, request.provider))
        if plan is None or plan.snapshot is not snapshot or not plan.start <= now < plan.end:
            plan = self._plan(entry, snapshot, model, request.provider, providers, now)
        cost = worst_cost_nano(priced_in, tokens_out, plan.rates) if plan.rates is not None else 0
        if cost < plan.floor:
            cost = plan.floor
        lane = plan.lane
        if lane is not None:
            shared = self._shared
            assert shared is not None  # a lane is Redis's
            lease = shared.take(lane, tokens, cost)
            if lease is not None:
                reset = reset_bytes(lease.reset_s)
                requests, left = lease.left_requests + lease.requests, lease.left_tokens + lease.tokens
                headers = admission_headers(entry, requests, reset, left, reset)
                ticket = Ticket(shared, lease.second, headers, None, lane, tokens, cost)
                if self._fail_open and budget >= 0 and cost > 0:
                    self._opened(ticket, (entry.record.id, plan.period), cost)
                return ticket
        return Reservation(tokens, cost, plan)

    def _plan(
        self,
        entry: Entry,
        snapshot: CatalogSnapshot,
        model: ModelEntry,
        pin: str | None,
        providers: Sequence[str],
        now: datetime,
    ) -> Plan:
        """The key's `Plan` for the route of (model, pinned provider) at `now` (`reserve`); it keeps
        the lane of the plan it replaces in the same period (a new catalog, a price change)."""
        period, start, end, rates = "total", _DAWN, _FOREVER, None
        if entry.budget_nano >= 0:
            period, period_start, period_end = period_bounds(entry.record.budget_period or "total", now)
            rates = worst_rates(snapshot, model, providers, now)
            start = max(period_start or _DAWN, rates.start or _DAWN)
            end = min(period_end or _FOREVER, rates.end or _FOREVER)
        plan = Plan(snapshot, start, end, period, rates)
        if rates is not None and self._gpu_bounds:
            plan.floor = max(self._gpu_bounds.get(name, 0) for name in providers)
        if self.keyring.version != self._swept:
            self._sweep()
        if len(self._plans) > 4096:
            self._plans.clear()
        old = self._plans.get((entry, model.id, pin))
        if old is not None and old.period == period:
            plan.lane = old.lane
        self._plans[(entry, model.id, pin)] = plan
        return plan

    def _sweep(self) -> None:
        """Drop what is kept of keys the ring no longer holds (revoked) or holds in a newer version:
        their plans, and this process's counters and Redis lanes of the revoked. Run when a plan is
        made after the ring changed: a process churning keys kept every one's state (7 KB a key)."""
        self._swept = self.keyring.version
        live = self.keyring.by_id
        self._plans = {key: plan for key, plan in self._plans.items() if live.get(key[0].record.id) is key[0]}
        self._local.forget(live)
        if self._shared is not None:
            self._shared.forget(live)

    async def admit(self, entry: Entry, ctx: RequestContext, reservation: Reservation) -> Ticket:
        """A limited key's admission by its limiter (Redis, or this process's), for `reservation`
        (what `reserve` computed when the lease could not hold it): a `Ticket`, or a 429/503."""
        now = ctx.started_at
        plan = reservation.plan
        ask = Ask(
            key_id=entry.record.id,
            request_id=ctx.request_id,
            period=plan.period,
            rpm=entry.rpm,
            tpm=entry.tpm,
            tokens=reservation.tokens,
            max_concurrency=entry.concurrency,
            hold_ms=self._hold_ms,
            budget=entry.budget_nano,
            cost=reservation.cost,
        )
        shared = self._shared
        if shared is not None and entry.concurrency < 0:  # a key with max_concurrency is not leased
            plan.lane = shared.lane(ask)
        try:
            limiter = shared if shared is not None else self._limiter()
            verdict = await limiter.admit(ask)  # `_decide`'s first step, without its coroutine
            if verdict.refused == "budget_missing":
                verdict = await self._decide(limiter, ask, now, verdict)
            self._outage = self._refusing = False
        except LimiterDown as exc:
            if not self._fail_open:
                # the cause in the log (a refused AUTH says nothing anywhere else), once a spell of
                # flapping; a spell not said yet (it began within `SAY_EVERY_S` of the last line) is
                # said at its first refusal past it, not marked said and never logged
                if not self._refusing and (moment := time.monotonic()) - self._said_at >= SAY_EVERY_S:
                    self._refusing, self._said_at = True, moment
                    self._log.error("limits_unavailable", reason=str(exc), detail="keys with limits get 503")
                raise LimitsUnavailable("limits cannot be checked") from None
            self._note_outage(exc)
            limiter = self._local
            verdict = await self._decide(limiter, ask, now)
        headers = rate_headers(entry, verdict)
        if verdict.refused is not None:
            raise refusal(entry, ask, verdict, headers, now)
        ticket = Ticket(limiter, verdict.second, headers, ask)
        if self._fail_open and limiter is shared and ask.budget >= 0 and ask.cost > 0:
            self._opened(ticket, (ask.key_id, ask.period), ask.cost)
        return ticket

    def _opened(self, ticket: Ticket, budget: tuple[str, str], cost: int) -> None:
        ticket.open = budget
        self._holds.opened(budget, id(ticket), cost)

    def _limiter(self) -> Limiter:
        if self._shared is not None:
            return self._shared
        if self._alone:
            return self._local
        raise LimiterDown("several processes share these limits, and [redis] is not configured")

    async def _decide(self, limiter: Limiter, ask: Ask, now: datetime, first: Verdict | None = None) -> Verdict:
        """The limiter's verdict (`first`, when the caller asked already); when it has no spend for
        the period yet, the ledger's is loaded and the admission asked again."""
        verdict = first if first is not None else await limiter.admit(ask)
        if verdict.refused == "budget_missing":
            record = self.keyring.by_id[ask.key_id].record
            _tag, start, end = period_bounds(record.budget_period or "total", now)
            ttl = int(seconds_until(end, now) or 0) + DAY_S if end is not None else 0  # kept a day after
            if limiter is self._shared:  # Redis lost its data? Then other processes restore theirs first
                await self._shared.restorer.check()
                await asyncio.sleep(self._shared.restorer.reload_wait())
            async with asyncio.timeout(SPEND_READ_S):
                spent = await spent_since(self._engine, ask.key_id, start, end)  # a period's rows only
            await limiter.load_spend(ask, to_nano(spent), ttl)
            if limiter is self._local and self._shared is not None:  # Redis's admissions still running here
                self._holds.seed(self._local, (ask.key_id, ask.period))
            verdict = await limiter.admit(ask)
        return verdict

    def _note_outage(self, exc: LimiterDown) -> None:
        self._counter.inc(())
        if not self._outage:
            self._outage = True
            self._local.forget_spend()  # each outage starts from the ledger's spend of then, not the last outage's
            self._holds.outage()
            self._log.error("limits_local", reason=str(exc), detail="[auth] fail_open: this process enforces its share")

    # -- settlement ----------------------------------------------------------------------------

    def settle(self, ticket: Ticket, cost: Decimal | None, tokens: int | None) -> None:
        """The request's real cost and tokens replace what it reserved; None where they are unknown
        (`app.pipeline.accounting.settlement`): the reservation, its worst case, stands for it."""
        lane, shared = ticket.lane, self._shared
        if ticket.open is not None:  # `fail_open`'s note of it (`app.access.open_holds`)
            self._holds.settled(self._local, ticket.open, id(ticket), to_nano(cost) if cost is not None else None)
        if lane is not None and shared is not None:  # leased: Redis's
            nano = to_nano(cost) if cost is not None else ticket.cost
            used = tokens if tokens is not None else ticket.tokens
            shared.settle_summed(lane, ticket.second, used - ticket.tokens, ticket.cost, nano)
        elif (ask := ticket.ask) is not None:
            nano = to_nano(cost) if cost is not None else ask.cost
            ticket.limiter.settle(ask, ticket.second, tokens if tokens is not None else ask.tokens, nano)
            if shared is not None and ticket.limiter is self._local:  # admitted alone (`fail_open`)
                shared.add_spend(ask, nano)

    def _settle_failed(self, key_id: str, reason: str) -> None:
        self._log.error("limits_settle_failed", key_id=key_id, reason=reason)

    # -- the key's own view --------------------------------------------------------------------

    async def window_headers(self, entry: Entry) -> RateHeaders:
        """The `x-ratelimit-*` headers of a response that is not an admission (`app.access.window_view`)."""
        if entry.rpm < 0 and entry.tpm < 0:
            return b""
        view = await window_now(entry, self._local, None if self._outage else self._shared)
        return rate_headers(entry, view) if view is not None else b""

    async def spend(self, record: KeyRecord, now: datetime) -> tuple[Decimal, datetime | None, datetime | None]:
        """Spent in the key's current budget period (all time without a budget), and the period."""
        tag, start, end = period_bounds(record.budget_period or "total", now)
        limiter = self._shared if self._shared is not None else self._local
        try:
            known = await limiter.spend(record.id, tag) if record.budget_usd is not None else None
        except LimiterDown:
            known = None
        if known is not None:
            return from_nano(known[0]), start, end
        return await spent_since(self._engine, record.id, start, end), start, end
