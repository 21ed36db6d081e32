"""GPU time: each request's share of a self-hosted provider's busy time, for `cost_source: amortized`.

cost.md: a provider with `gpu_hour_usd` prices its requests by their share of the server's busy
time — each second with requests in flight is divided among the requests in flight in that second,
at `gpu_hour_usd / 3600` per second. Busy time that nobody shares is charged whole; idle time is
charged to nobody; every busy nanosecond is charged exactly once, to the requests then in flight.

How the share is kept (one `BusyTimeTracker` per provider, O(1) per event). Between two events
(a request starting or ending on the provider) the number in flight `n` is constant, so the
timeline is piecewise constant. The tracker keeps one running total, the *virtual time*
`V = Σ segment_ns / n` over the busy segments so far: the time one in-flight request has been
allotted. A request notes `V` when it starts (its ticket's mark) and its share is `V_end - mark`
when it ends — exactly the sum of `segment / n` over the segments it was in flight for, with no
per-request work at other requests' events. `V` is a `Fraction`, so nothing is rounded until the
cost is turned into a `Decimal`, once, at the ledger's 18 decimal places (half-even), which is the
only precision the figures are stated to. `V` returns to 0 whenever the provider is idle, so the
fraction stays small.

The approximation (token weights). The spec weights a second's split by the requests' tokens, but
a request's token count is known only when it ends; weighting one segment by the tokens of every
request in it would leave a short request's price unknown until the longest request overlapping it
ended, so rows could not be written when a request finishes. Within one segment the tracker splits
equally instead: a continuous-batching server (vLLM, SGLang, TGI, `transformers serve`) advances
every in-flight sequence by one token per forward step, so the in-flight requests' tokens within a
segment are (prefill apart) equal, and equal shares are the token weighting. Across the request, its
token count still decides its cost: a request that generates more stays in flight longer and
collects more segments. Prompt-heavy requests are under-charged during their prefill by that
approximation.

What counts as in flight: an attempt holding a concurrency slot on the provider, from the slot's
acquisition to its release (`app.pipeline.pipeline`). The ledger row of a request whose final
attempt was on the provider carries that attempt's share; the share of a failed attempt that
failed over to another provider is charged to nobody (it still divides the time of the requests
it overlapped). The tracker is per process: with several workers or replicas in front of one GPU
server, each process divides only the busy time of its own requests, so requests that overlap
across processes are each charged as if alone (an over-count, at most workers x replicas).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from decimal import Decimal
from fractions import Fraction

COST_PLACES = 18  # the ledger's scale (catalog.tables.COST_SCALE)
_NS_PER_HOUR = 3_600 * 1_000_000_000


class GpuTicket:
    """One attempt in flight on a tracked provider: its virtual-time mark, then its share."""

    __slots__ = ("mark", "share_ns", "tracker")

    def __init__(self, tracker: BusyTimeTracker, mark: Fraction | int) -> None:
        self.tracker = tracker
        self.mark = mark
        self.share_ns: Fraction | int | None = None  # set once, when the attempt ends

    def stop(self) -> None:
        """The attempt ended: take its share. Idempotent."""
        if self.share_ns is None:
            self.tracker.stop(self)

    def cost_usd(self) -> Decimal | None:
        """The share's cost at the provider's rate, rounded to the ledger's 18 decimal places;
        None while the attempt is still in flight."""
        if self.share_ns is None:
            return None
        return to_decimal(self.share_ns * Fraction(self.tracker.gpu_hour_usd) / _NS_PER_HOUR)


class BusyTimeTracker:
    """One provider's busy time, divided among its in-flight attempts (see the module docstring).

    `clock` returns integer nanoseconds from any fixed origin (`time.monotonic_ns` by default);
    tests pass their own to lay out a timeline exactly."""

    __slots__ = ("_clock", "_in_flight", "_last", "_virtual", "gpu_hour_usd")

    def __init__(self, gpu_hour_usd: Decimal, clock: Callable[[], int] = time.monotonic_ns) -> None:
        if not gpu_hour_usd.is_finite() or gpu_hour_usd < 0:
            raise ValueError(f"gpu_hour_usd must be a non-negative decimal, not {gpu_hour_usd}")
        self.gpu_hour_usd = gpu_hour_usd
        self._clock = clock
        self._in_flight = 0
        self._last = 0
        self._virtual: Fraction | int = 0

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def _advance(self) -> None:
        now = self._clock()
        if self._in_flight:
            self._virtual += Fraction(now - self._last, self._in_flight)
        self._last = now

    def start(self) -> GpuTicket:
        self._advance()
        self._in_flight += 1
        return GpuTicket(self, self._virtual)

    def stop(self, ticket: GpuTicket) -> None:
        self._advance()
        self._in_flight -= 1
        ticket.share_ns = self._virtual - ticket.mark
        if not self._in_flight:
            self._virtual = 0  # idle: no ticket is outstanding, so the origin can move


class GpuTime:
    """The trackers of every provider with `gpu_hour_usd`, by provider name (built from Settings)."""

    __slots__ = ("_trackers",)

    def __init__(self, rates: Mapping[str, Decimal], clock: Callable[[], int] = time.monotonic_ns) -> None:
        self._trackers = {name: BusyTimeTracker(rate, clock) for name, rate in rates.items()}

    def start(self, provider: str) -> GpuTicket | None:
        """A ticket for an attempt that just took a slot on `provider`; None when it is not tracked."""
        tracker = self._trackers.get(provider)
        return tracker.start() if tracker is not None else None


def to_decimal(value: Fraction, places: int = COST_PLACES) -> Decimal:
    """`value` rounded half-even to `places` decimal places (`round` on a Fraction is half-even)."""
    return Decimal(f"{round(value * 10**places)}E-{places}")  # from text: exact whatever the context
