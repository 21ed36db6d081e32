"""Leases: a block of admissions one process takes from Redis in one admission, and spends alone.

Why. Asking Redis for every request cost keys mode about a fifth of the gateway's throughput: an
event-loop turn, the task's wake-up and the reply's parse per request (bench/RESULTS.md, issue 11).
A lease turns that into one round trip per block of requests.

What a lease is. When an admission passes, the script may also reserve a block of `n` admissions
for the asking process: `n` requests counted in the admission's second of the sliding minute,
`n` times its tokens, and `n` times its worst-case cost reserved against the budget — exactly as `n`
admissions in a row would count. The process then admits requests of the same key (and limits,
and budget period) from the block without asking Redis, each drawing its own tokens and cost, as
long as the block holds them and the lease has not ended. Each such request settles as any other
(its reservation becomes its real cost). What the block still holds when the lease ends is given
back (`Lease.unused`: the settlement script subtracts it from the second's bucket and from the
reservation). So the limits are never exceeded, by any number of processes: Redis always counts a
lease in full until its unused part comes back.

Why they stay exact near a limit:
- a lease is at most a quarter of what is left of every limit (rpm, tpm, budget) when it is
  granted, and at least `LEASE_MIN` admissions or none: within 4 x `LEASE_MIN` of a limit (32
  requests of rpm, 32 requests' tokens or worst-case cost) every admission is Redis's own, so a
  small limit (say `rpm` 10) is counted and reported exactly as without leases;
- a lease ends at the latest `LEASE_S` after its grant and at the end of its second of the
  sliding minute (Redis's clock): its requests are counted in the second they were admitted in, as
  an admission's are, and a lease never spans a budget period;
- an admission Redis would refuse, but would pass if the other processes' leases were given back,
  is not refused: the script answers "wait" (code 6) with when the soonest lease ends, and the
  limiter asks again then. A lease not given back `GRACE_S` after its end (its process died) counts
  as spent, as a dead process's own reservations do.

Renewal: while the admission asking for a key's next lease is on its way, the key's other
requests in this process wait for it once and take from the lease it brings, instead of each
asking Redis alone (`RedisLimiter.admit`: under load that was about twenty admissions a renewal);
one the new lease cannot hold (none granted: near a limit) asks Redis for itself only. None
granted only because Redis's second was ending (a lease cut short by its second is renewed as the
second ends, and Redis may still be in it) is asked for again, by the first waiter to go on, and
the others wait for that one too (they used to go to Redis one by one: about thirty admissions
at each second's end under load).

What is not leased: keys with `max_concurrency` (a request's end must free its slot for every
process at once), and admissions of a limiter built with `lease_max` ≤ 1.

`x-ratelimit-remaining-*` of a request admitted from a lease are Redis's at the grant plus what the
block still holds, and its resets are the grant's: stale by at most the lease's life (≤ `LEASE_S`),
and they do not count other processes' admissions meanwhile (two processes may tell the same
remaining). Near a limit, where the numbers matter, there are no leases (above).
"""

from __future__ import annotations

from app.access.limiter import Ask, Verdict

LEASE_S = 0.25  # the longest a lease lasts (it also ends with its second of the sliding minute)
GRACE_S = 0.25  # after its end, how long an unreturned lease is waited for before it counts as spent
LEASE_MIN = 8  # the fewest admissions a lease holds (fewer save too little: module doc)
LEASE_MAX = 1024  # the most admissions one lease holds


class Lease:
    """One process's block of one key's admissions (module doc)."""

    __slots__ = (
        "cost",
        "deadline",
        "granted",
        "lease_id",
        "left_requests",
        "left_tokens",
        "requests",
        "reset_s",
        "second",
        "tokens",
    )

    def __init__(self, ask: Ask, granted: int, window: Verdict, deadline: float) -> None:
        """`ask`: the admission that took it (its request id names the lease, and its tokens and
        cost are what each of its admissions reserves); `window`: Redis's answer to it, the lease
        counted; `deadline`: the loop's time at which it ends."""
        self.lease_id, self.granted, self.deadline = ask.request_id.encode(), granted, deadline
        self.second = window.second
        self.requests, self.tokens, self.cost = granted - 1, (granted - 1) * ask.tokens, (granted - 1) * ask.cost
        self.left_requests, self.left_tokens = window.remaining_requests, window.remaining_tokens
        self.reset_s = window.reset_requests_s

    def take(self, tokens: int, cost: int, now: float) -> bool:
        """One admission of `tokens` and `cost` from the block at the loop's time `now`; False when
        it cannot hold them or has ended."""
        if self.requests < 1 or self.tokens < tokens or self.cost < cost or now >= self.deadline:
            return False
        self.requests -= 1
        self.tokens -= tokens
        self.cost -= cost
        return True

    def verdict(self) -> Verdict:
        """An admission's verdict from this process's view: Redis's remaining at the grant plus
        what the block still holds (module doc)."""
        return Verdict(
            second=self.second,
            remaining_requests=self.left_requests + self.requests,
            reset_requests_s=self.reset_s,
            remaining_tokens=self.left_tokens + self.tokens,
            reset_tokens_s=self.reset_s,
        )

    def unused(self, budget: bool) -> tuple[bytes, bytes, bytes, bytes, bytes, bytes]:
        """The settlement script's arguments that give the block's remainder back: lease id,
        second, -tokens, cost reserved (-1 without a budget), 0 spent, requests."""
        cost = b"%d" % self.cost if budget else b"-1"
        return self.lease_id, b"%d" % self.second, b"%d" % -self.tokens, cost, b"0", b"%d" % self.requests

    def next_size(self, most: int) -> int:
        """What the key's next lease should ask for: twice this one's when it ran out, twice what
        it served when it ended with some left (at least `LEASE_MIN`: a key with traffic keeps
        leasing)."""
        if self.requests < 1:
            return min(most, 2 * self.granted)
        return max(LEASE_MIN, min(most, 2 * (self.granted - self.requests)))  # served: the rest was taken
