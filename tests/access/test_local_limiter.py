"""The in-process limiter (`app.access.limiter.LocalLimiter`: one process, no Redis) over a walk
through several minutes of its clock: after every admission and settlement its window's
requests and tokens (`remaining_*` of each verdict) equal a plain recount of the admissions of
the last sixty seconds, settlements included. The limiter keeps the window's sums beside its
buckets rather than adding the buckets up per admission, and this checks the sums against the
slide of the window (buckets leaving it) and settlements of older seconds."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from app.access import limiter as limiter_module
from app.access.limiter import WINDOW_S, Ask, LocalLimiter, Verdict
from app.access.open_holds import OpenHolds

RPM, TPM = 10**6, 10**9


class _Clock:
    def __init__(self, start: float) -> None:
        self.now = start

    def time(self) -> float:
        return self.now


@dataclass
class _Admitted:
    """An admission as the recount sees it: its second, the tokens it counts now, settled or not."""

    second: int
    tokens: int
    ask: Ask
    settled: bool = False


async def test_the_window_sums_follow_every_admission_settlement_and_slide(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock(1_796_400_000.25)
    monkeypatch.setattr(limiter_module, "time", SimpleNamespace(monotonic=clock.time, time=time.time))  # its clock only
    rng = random.Random(11)  # noqa: S311 - a reproducible walk, not secrets
    local = LocalLimiter()
    admitted: list[_Admitted] = []
    for n in range(2_000):
        clock.now += rng.choice((0.01, 0.2, 0.9, 3.0, 17.0))
        unsettled = [entry for entry in admitted if not entry.settled]
        if unsettled and rng.random() < 0.5:  # some of them from seconds the window has left
            entry = rng.choice(unsettled)
            used = rng.randrange(0, entry.ask.tokens + 50)
            local.settle(entry.ask, entry.second, used, 0)
            entry.tokens, entry.settled = used, True
        ask = Ask(key_id="k", request_id=f"r{n}", period="total", rpm=RPM, tpm=TPM, tokens=rng.randrange(1, 500))
        verdict = await local.admit(ask)
        assert verdict.refused is None
        admitted.append(_Admitted(verdict.second, ask.tokens, ask))
        window = [entry for entry in admitted if entry.second > int(clock.now) - WINDOW_S]
        assert verdict.remaining_requests == RPM - len(window)
        assert verdict.remaining_tokens == TPM - sum(entry.tokens for entry in window)


async def test_an_rpm_refusal_waits_for_tpm_too_when_both_refuse(monkeypatch: pytest.MonkeyPatch) -> None:
    """Retry-After is "seconds until a request would pass" (access.md): at t+31 the second request
    leaves rpm room at t+60, but the 29 tokens of t+30 hold tpm until t+90. A client that waited
    29 s was refused again, for tpm."""
    clock = _Clock(1_796_400_000.0)
    monkeypatch.setattr(limiter_module, "time", SimpleNamespace(monotonic=clock.time, time=time.time))  # its clock only
    local = LocalLimiter()

    def ask(n: int, tokens: int) -> Ask:
        return Ask(key_id="k", request_id=f"r{n}", period="total", rpm=2, tpm=30, tokens=tokens)

    assert (await local.admit(ask(1, 1))).refused is None
    clock.now += 30
    assert (await local.admit(ask(2, 29))).refused is None
    clock.now += 1
    refused = await local.admit(ask(3, 10))
    assert (refused.refused, refused.retry_after) == ("rpm", 59.0)
    clock.now += 59
    assert (await local.admit(ask(4, 10))).refused is None


async def test_a_request_admitted_before_an_outage_began_again_keeps_its_reservation_in_the_reloaded_budget() -> None:
    """`fail_open`: each outage forgets the budgets' spend and loads it from the ledger again
    (`forget_spend`); a request this limiter admitted earlier and still running is not in the
    ledger, so its reservation is carried into the reload, and its settlement takes it off there."""
    local = LocalLimiter()
    first = Ask(key_id="k", request_id="r1", period="total", budget=100, cost=60)
    assert (await local.admit(first)).refused == "budget_missing"
    await local.load_spend(first, 0, 0)
    admitted = await local.admit(first)
    assert admitted.refused is None
    local.forget_spend()  # the next outage
    second = Ask(key_id="k", request_id="r2", period="total", budget=100, cost=60)
    assert (await local.admit(second)).refused == "budget_missing"
    await local.load_spend(second, 0, 0)  # the ledger has no row of r1: it is still running
    assert await local.spend("k", "total") == (0, 60)
    assert (await local.admit(second)).refused == "budget"  # 60 + 60 > 100
    local.settle(first, admitted.second, 0, 10)
    assert await local.spend("k", "total") == (10, 0)
    assert (await local.admit(second)).refused is None
    assert await local.spend("k", "total") == (10, 60)


async def test_a_request_settled_between_forgetting_and_reloading_is_not_carried() -> None:
    local = LocalLimiter()
    first = Ask(key_id="k", request_id="r1", period="total", budget=100, cost=60)
    await local.load_spend(first, 0, 0)
    admitted = await local.admit(first)
    local.forget_spend()
    local.settle(first, admitted.second, 0, 10)  # ended before any admission loaded the budget again
    await local.load_spend(first, 10, 0)  # its row is in the ledger by then
    assert await local.spend("k", "total") == (10, 0)
    assert (await local.admit(Ask(key_id="k", request_id="r2", period="total", budget=100, cost=90))).refused is None


async def test_a_key_keeps_the_budget_of_its_current_period_only() -> None:
    """A daily budget loads a period a day; none was ever dropped (365 a year per key, a state
    audit). A past period goes when the next is loaded, unless this limiter's own admissions of
    it are still running (they settle into it)."""
    local = LocalLimiter()
    running = None
    for day in range(365):
        ask = Ask(key_id="k", request_id=f"r{day}", period=f"d2026{day:04d}", budget=10**12, cost=10)
        await local.load_spend(ask, 0, 86_400)
        verdict = await local.admit(ask)
        assert verdict.refused is None
        if day == 100:
            running = (ask, verdict.second)  # still running when the next days begin
        else:
            local.settle(ask, verdict.second, 0, 5)
    assert await local.spend("k", "d20260364") == (5, 0)
    assert await local.spend("k", "d20260100") == (0, 10)
    assert await local.spend("k", "d20260363") is None
    assert running is not None
    local.settle(running[0], running[1], 0, 5)
    await local.load_spend(Ask(key_id="k", request_id="x", period="d20270001", budget=10**12), 0, 86_400)
    assert await local.spend("k", "d20260100") is None


async def test_a_request_of_the_past_period_admitted_late_keeps_the_current_periods_budget() -> None:
    """A request that started before midnight and reaches admission after it loads the old day's
    budget once the new day's is loaded. That load dropped the new day's, with the reservations
    `OpenHolds.seed` had put there (Redis's admissions still running here, not seeded again): a
    budget overspent (a review). Only earlier periods go."""
    local, holds = LocalLimiter(), OpenHolds()
    old, new = "d20261130", "d20261201"

    def ask(request_id: str, period: str, cost: int) -> Ask:
        return Ask(key_id="k", request_id=request_id, period=period, budget=1000, cost=cost)

    async def decide(admitted: Ask, ledger: int = 0) -> Verdict:  # `AccessGate._decide` in an outage
        verdict = await local.admit(admitted)
        if verdict.refused == "budget_missing":
            await local.load_spend(admitted, ledger, 86_400)
            holds.seed(local, (admitted.key_id, admitted.period))
            verdict = await local.admit(admitted)
        return verdict

    holds.opened(("k", new), ticket=1, cost=600)  # Redis admitted it here; still running
    local.forget_spend()  # the outage begins
    holds.outage()
    first = await decide(ask("n1", new, 300))
    assert await local.spend("k", new) == (0, 900)
    local.settle(ask("n1", new, 300), first.second, 0, 300)
    straggler = await decide(ask("o1", old, 10))
    assert straggler.refused is None
    local.settle(ask("o1", old, 10), straggler.second, 0, 10)
    assert (await decide(ask("n2", new, 300), ledger=300)).refused == "budget"  # 300 + 600 + 300 > 1000
