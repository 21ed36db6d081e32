"""Wall clocks that step (NTP) or disagree between replicas (a clock audit). Spec: access.md, "rpm
counts admitted requests in a sliding minute" and `Retry-After` is "seconds until a request would
pass"; a minute is a minute of elapsed time, whatever the wall clock does meanwhile."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from app.access import limiter as limiter_module
from app.access.limiter import Ask, LocalLimiter


class _Clocks:
    """A wall clock that can be stepped, and a monotonic one that only moves forward."""

    def __init__(self) -> None:
        self.wall, self.mono = 1_796_400_000.0, 5_000.0

    def elapse(self, seconds: float) -> None:
        self.wall += seconds
        self.mono += seconds


@pytest.fixture
def clocks(monkeypatch: pytest.MonkeyPatch) -> _Clocks:
    clocks = _Clocks()
    fake = SimpleNamespace(time=lambda: clocks.wall, monotonic=lambda: clocks.mono, time_ns=time.time_ns)
    monkeypatch.setattr(limiter_module, "time", fake)
    return clocks


def _ask(n: int) -> Ask:
    return Ask(key_id="k", request_id=f"r{n}", period="total", rpm=3)


async def test_a_wall_clock_stepped_back_an_hour_does_not_lock_the_key_out_for_an_hour(clocks: _Clocks) -> None:
    local = LocalLimiter()
    for n in range(3):
        assert (await local.admit(_ask(n))).refused is None
    clocks.wall -= 3600  # NTP steps the clock back; no time passes
    refused = await local.admit(_ask(3))
    assert refused.refused == "rpm"
    assert refused.retry_after is not None
    assert refused.retry_after <= 60  # was 3660
    assert refused.reset_requests_s <= 60
    clocks.elapse(61)  # a minute later the window is empty again
    assert (await local.admit(_ask(4))).refused is None  # was refused for an hour


async def test_a_wall_clock_stepped_forward_does_not_empty_the_minute(clocks: _Clocks) -> None:
    local = LocalLimiter()
    for n in range(3):
        assert (await local.admit(_ask(n))).refused is None
    clocks.wall += 120  # stepped forward: only a second of real time passes
    clocks.elapse(1)
    assert (await local.admit(_ask(3))).refused == "rpm"  # was admitted: 6 requests in one real minute
