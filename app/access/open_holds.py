"""Redis's budget reservations this process's requests still hold, kept for `[auth] fail_open`.

When Redis cannot be reached and `fail_open` is set, this process enforces its share of each
budget alone (`app.access.gate`), from the ledger's spend. The requests Redis admitted here that
are still running are not in the ledger yet: without them, the share admitted a whole budget more
while they ran (an audit: two processes, a $0.05 budget, 20 requests in flight when Redis was cut,
$0.070 spent). So the gate notes each budget reservation Redis grants here (`opened`) until it
settles; when an outage loads a budget into the local limiter, what this process still holds of it
counts there once (`seed`), and each of those requests, ending during the outage, turns its
reservation into its real cost there (`settled`). Other processes' requests in flight are theirs
to count: each enforces its own share. Kept only with `fail_open` (an entry per request in flight).
"""

from __future__ import annotations

from app.access.limiter import LocalLimiter

BudgetKey = tuple[str, str]  # (key id, budget period)


class OpenHolds:
    __slots__ = ("_held", "_open", "_seeded")

    def __init__(self) -> None:
        self._open: dict[BudgetKey, dict[int, int]] = {}  # reservation (nano-dollars) by ticket id
        self._held: set[int] = set()  # tickets counted by the local limiter in this outage
        self._seeded: set[BudgetKey] = set()  # budgets loaded into the local limiter in this outage

    def opened(self, budget: BudgetKey, ticket: int, cost: int) -> None:
        self._open.setdefault(budget, {})[ticket] = cost

    def outage(self) -> None:
        """A new outage: the local limiter loads every budget afresh."""
        self._held.clear()
        self._seeded.clear()

    def seed(self, local: LocalLimiter, budget: BudgetKey) -> None:
        """The local limiter just loaded `budget`: what this process holds of it counts there, once."""
        if budget not in self._seeded:
            self._seeded.add(budget)
            held = self._open.get(budget, {})
            local.add_to_budget(budget[0], budget[1], sum(held.values()), 0)
            self._held.update(held)

    def settled(self, local: LocalLimiter, budget: BudgetKey, ticket: int, spent: int | None) -> None:
        """The request of `ticket` ended, having spent `spent` (None: its reservation stands)."""
        holds = self._open[budget]
        reserved = holds.pop(ticket)
        if not holds:
            del self._open[budget]
        if ticket in self._held:
            self._held.discard(ticket)
            local.add_to_budget(budget[0], budget[1], -reserved, spent if spent is not None else reserved)
