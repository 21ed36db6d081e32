"""The limiter in Redis: one Lua script per admission, one per settlement (one round trip each),
and a lease of admissions (`app.access.lease`) that spares most requests of a busy key the first.

Keys of one API key share a hash tag, so the scripts also run on a Redis Cluster:

    {prefix}:lim:{<key id>}:window         hash  r<second> → requests, t<second> → tokens, and
                                                 R, T → their sums, o → the oldest second held (61 s TTL)
    {prefix}:lim:{<key id>}:flight         zset  request id → expiry (ms); in-flight requests
    {prefix}:lim:{<key id>}:spend:<period> hash  s → spent, r → reserved (nano-dollars), b<minute>
                                                 → reserved in that minute, ob → the oldest one
    {prefix}:lim:{<key id>}:lease          hash  lease id → "requests tokens cost end(ms)" unused
                                                 at the grant, until given back (`app.access.lease`)

The clock is Redis's (`TIME`), so replicas with skewed clocks share one sliding minute (tests may
pass their own, `clock`, in microseconds, to step through the minute without waiting for it). Amounts
are passed to `HINCRBY` as the strings Python wrote (Lua would print a large number in exponent
form); comparisons use Lua numbers, exact for integers below 2^53 (nano-dollars: $9 million).
The spend hash of a calendar period expires a day after the period, `total` never; a missing one
(first use in the period, or a Redis that lost its data) is loaded from the ledger by the gate.
What the admission script does per call, and why it stays cheap: `app.access.redis_scripts`.

A Redis that lost its data is given back this process's reservations (`app.access.restore`): each
lane keeps what Redis holds reserved for it (`Lane.hold`), and the client's greeting on every
new connection, or an admission's code 7, restores it.

Every Redis failure becomes `LimiterDown` here, the one boundary; the gate decides what follows;
it drops the lanes (`app.access.lane`) of revoked keys when it sweeps (`forget`). The client
(`app.access.resp`: one pipelined connection, not redis-py, whose per-call overhead halved keys-mode
throughput) has a 1 s timeout and no retries: a limited request waits about 2 s at most (a lease
another request asked for, then its own admission). A settlement is sent without waiting for it (no
task per request): its failure reaches the gate through the `failed` callback.

Settlements wait, briefly, to be sent together: the next admission (in the same write, before its
own command: they may free what it asks for) or a timer sends every waiting settlement as one script
call per key: under load one command and one reply for the requests that ended since the last
admission (on loopback every `send` also runs Redis's side of the TCP stack on the caller's CPU). A
key without `max_concurrency` has its settlements summed per second of the window, waiting up to
`SUMMED_S` (20 ms: a busy key admits from its lease, so the timer sends them); a request in flight's
own is written at once, with its key's waiting ones, before the last bytes of its answer (its slot
is free to other processes only once Redis has it: sent later, a client sending requests one after
the other to two replicas got 429s); a lease given back waits `LAZY_S`. Waiting only holds a
reservation longer.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable, Container
from functools import partial
from typing import Any

from app.access.lane import Lane, Record, settlement_item, spend_key, summed_item
from app.access.lease import GRACE_S, LEASE_MAX, LEASE_S, Lease
from app.access.limiter import Ask, LimiterDown, Verdict
from app.access.redis_scripts import ADMIT, LOAD, RESTORE, SETTLE, UNREADABLE_REPLY, malformed, refused
from app.access.resp import RespClient, RespError, Script, bulk
from app.access.restore import Restorer
from app.access.settlement import Owed, Settlement
from app.settings import RedisSettings

_BULK = {bytes, type(None)}
LAZY_S = 0.002  # the longest a lease given back, or a lost admission's slot, waits to be sent
SUMMED_S = 0.02  # the longest summed settlements wait to be sent (module doc)
WAIT_S = LEASE_S + GRACE_S + 0.1  # the longest an admission waits for other processes' leases
LANES_MAX = 10_000  # lanes kept before those holding nothing go (`lane`)
_THREE = b"$%d\r\n%s\r\n" * 3  # three arguments, each `bulk`


class RedisLimiter:
    def __init__(
        self,
        settings: RedisSettings,
        failed: Callable[[str, str], None],
        clock: Callable[[], int] | None = None,
        lease_max: int = LEASE_MAX,
    ) -> None:
        """`failed(key_id, reason)` hears of a settlement Redis did not take (nobody awaits one); `clock`
        (µs since the epoch) replaces Redis's `TIME` in admissions (tests, with `lease_max=1`: a lease
        lasts in the loop's time); `lease_max`: the most admissions a lease holds (`app.access.lease`)."""
        self.admit_script, self.settle_script, self._load = Script(ADMIT, 4), Script(SETTLE, 4), Script(LOAD, 1)
        restore = Script(RESTORE, 1)
        scripts = (self.admit_script, self.settle_script, self._load, restore)  # loaded on each connection
        self.prefix = settings.key_prefix
        self.restorer = Restorer(self, restore)  # a Redis that lost its data (`app.access.restore`)
        self.redis = RespClient(settings.url, 1.0, scripts, self.restorer)
        self.failed, self.clock, self.lease_max = failed, clock, lease_max
        self.retries: set[asyncio.Future[Any]] = set()
        self._lanes: dict[tuple[str, str, int, int, int, int, int], Lane] = {}
        self._records: dict[tuple[str, str], Record] = {}  # by key id and period: the lanes' spend records
        self._lanes_max = LANES_MAX
        self._unsent: dict[Lane, list[bytes]] = {}  # settlements waiting to be sent, by key
        self._unsent_timer: asyncio.TimerHandle | None = None
        self._unsent_due = 0.0  # when the timer fires (the loop's time)
        self._loop: asyncio.AbstractEventLoop = asyncio.get_running_loop()
        self.owed = Owed(self._queue, self._loop)  # what a lost settlement must still get into Redis

    def lane(self, ask: Ask) -> Lane:
        """The key's lane for `ask`'s period and limits (made again only once dropped idle: a caller
        may keep it for `take` and `settle_summed` while they hold)."""
        key = (ask.key_id, ask.period, ask.rpm, ask.tpm, ask.max_concurrency, ask.hold_ms, ask.budget)
        lane = self._lanes.get(key)
        if lane is None:
            if len(self._lanes) > self._lanes_max:
                self._drop_idle()
            record = self._records.setdefault(key[:2], Record())  # shared with the key's lanes of other limits
            lane = self._lanes[key] = Lane(self, ask.key_id, ask.period, key[2:], record)
        return lane

    def _drop_idle(self) -> None:
        """Past `LANES_MAX` lanes (a key makes one per change of its limits and per budget period),
        those holding nothing go: no lease, no admission on its way, no reservation a restore needs.
        (Every lane went, live keys' included: their leases ended and `Lane.held` was lost.)"""
        for key in [key for key, lane in self._lanes.items() if lane.idle]:
            del self._lanes[key]
        self._records = {key[:2]: lane.record for key, lane in self._lanes.items()}
        self._lanes_max = max(LANES_MAX, 2 * len(self._lanes))  # busy lanes beyond it: no scan per new lane

    def lanes(self) -> list[Lane]:
        return list(self._lanes.values())

    def forget(self, live: Container[str]) -> None:
        """Drop the lanes of keys not in `live`; their leases end (a lane a caller keeps stops leasing)."""
        for key, lane in [(key, lane) for key, lane in self._lanes.items() if lane.key_id not in live]:
            if lane.lease is not None:
                self._end(lane, lane.lease)
            del self._lanes[key]
        self._records = {key[:2]: lane.record for key, lane in self._lanes.items()}

    def take(self, lane: Lane, tokens: int, cost: int) -> Lease | None:
        """An admission of `tokens` and `cost` from this process's lease of the key, without Redis,
        while the lease lasts and the connection is not known lost (Redis down is a 503, lease or
        not): the lease (its numbers are the admission's view), or None (then `admit`)."""
        lease = lane.lease
        if lease is None or not self.redis.connected or not lease.take(tokens, cost, self._loop.time()):
            return None
        return lease

    async def admit(self, ask: Ask) -> Verdict:
        """Redis's verdict, or the lease's. While an admission asking for a lease is on its way,
        others of the key wait for it once and take from its lease, else ask for themselves only
        (alone they made ~20 single admissions per lease under load: bench/RESULTS.md). When it
        was answered too late in its second for a lease (a lease cut short by its second's end
        is renewed just as the second ends, and Redis may still be in it), the first of them to
        go on asks again and the others wait for that one too, instead of each asking alone
        (about thirty admissions at every second's end under load)."""
        lane = self.lane(ask)
        lease = lane.lease
        if lease is not None:
            if self.take(lane, ask.tokens, ask.cost) is not None:
                return lease.verdict()
            self._end(lane, lease)
        lane.admitting += 1  # not idle (`_drop_idle`) until its answer is in the lane
        try:
            want = lane.want
            waits = 0  # once; twice when the first was answered too late in its second (`late`)
            while lane.asking is not None and (waits == 0 or (lane.late and waits == 1)):
                waits += 1
                await asyncio.shield(lane.asking)  # shielded: this request's cancellation is its own
                lease = lane.lease
                if lease is not None and self.take(lane, ask.tokens, ask.cost) is not None:
                    return lease.verdict()
                want = lane.want if lane.late and lane.asking is None else 1  # the first to go on asks again
            if self._unsent:  # before this admission, in the same write: they may free what it asks for
                self._send_settlements()
            waited, restores = 0.0, 0
            while True:
                asking = None
                if want > 1:
                    asking = lane.asking = self._loop.create_future()
                sent_at = self._loop.time()
                admission = self._loop.create_task(self._admission(lane, ask, want if waited < WAIT_S else 0))
                try:
                    reply = await asyncio.shield(admission)
                except asyncio.CancelledError:  # the caller went away; Redis will count the admission
                    lane.admitting += 1  # until `_abandoned` has its answer
                    admission.add_done_callback(partial(self._abandoned, lane, ask, sent_at, asking))
                    raise
                except BaseException:
                    lane.answered(asking)
                    self._free_slot(lane, ask)
                    raise
                lane.answered(asking)
                try:  # 6: would pass once other processes' leases end; 7: Redis lost the record (restore)
                    if type(reply) is bytes or reply[0] not in (6, 7):
                        break
                    wait = int(reply[1]) / 1000 if reply[0] == 6 else None
                except UNREADABLE_REPLY:
                    raise malformed(reply) from None
                if wait is None:
                    restores += 1
                    if restores > 2:
                        raise LimiterDown("the spend record keeps changing generation")
                    await self.restorer.restore(lane)
                    continue
                waited += wait
                await asyncio.sleep(wait)
            try:
                if type(reply) is bytes:  # admitted: "second remaining-requests remaining-tokens reset lease life"
                    return self._admitted(lane, ask, reply, sent_at)
                lane.late = False  # refused: its waiters ask for themselves, as near any limit
                return refused(ask, reply)
            except UNREADABLE_REPLY:
                raise malformed(reply) from None
        finally:
            lane.admitting -= 1

    async def _admission(self, lane: Lane, ask: Ask, want: int) -> Any:
        """The admission script's reply (`want`: the lease asked for; 0: do not wait for leases)."""
        rid, tokens, cost = ask.request_id.encode(), b"%d" % ask.tokens, b"%d" % ask.cost
        own = _THREE % (len(rid), rid, len(tokens), tokens, len(cost), cost)
        tail = lane.admit_tail + bulk(b"%d" % want) + bulk(lane.generation)
        if self.clock is not None:
            tail += bulk(b"%d" % self.clock())
        command = b"".join((lane.admit_head, own, tail))
        try:  # `RespClient.evalsha`, unrolled
            reply = await self.redis.post(command)
            if isinstance(reply, RespError):
                reply = await self.redis.after_error(self.admit_script, command, reply)
        except RespError as exc:
            raise LimiterDown(f"{type(exc).__name__}: {exc}") from None
        return reply

    def _admitted(self, lane: Lane, ask: Ask, reply: bytes, sent_at: float) -> Verdict:
        fields = reply.split()
        second, left_r, left_t, reset, granted, life = map(int, fields[:6])
        lane.late = life < 0
        if lane.budgeted:
            lane.generation = fields[6]
            if ask.cost > 0:
                lane.hold(second, ask.cost * granted)  # the lease's block included
                self.restorer.watch(holding=True)
        verdict = Verdict(
            second=second,
            remaining_requests=max(0, left_r),
            reset_requests_s=reset / 1000,
            remaining_tokens=max(0, left_t),
            reset_tokens_s=reset / 1000,
        )
        if granted < 2:
            return verdict
        # it ends no later than Redis's end of it: the admission was sent before Redis read its clock
        lease = Lease(ask, granted, verdict, sent_at + life / 1000)
        if lane.lease is not None:
            self._end(lane, lane.lease)
        lane.lease = lease
        self._loop.call_at(lease.deadline, self._expire, lane, lease)
        return lease.verdict()

    def _abandoned(
        self, lane: Lane, ask: Ask, sent_at: float, asking: asyncio.Future[None] | None, admission: asyncio.Task[Any]
    ) -> None:
        """The answer to an admission whose caller went away: its lease is kept for the key's other
        requests, and its own admission settles to nothing (cancelled before its upstream answered)."""
        try:
            if not admission.cancelled() and admission.exception() is None:
                reply = admission.result()
                if type(reply) is bytes:
                    self.settle(ask, self._admitted(lane, ask, reply, sent_at).second, 0, 0)
            else:
                self._free_slot(lane, ask)
        finally:
            lane.admitting -= 1
            lane.answered(asking)

    def _free_slot(self, lane: Lane, ask: Ask) -> None:
        """An admission of unknown outcome (its reply lost, or not the script's): the concurrency
        slot Redis may have taken is given back (a `ZREM`, nothing if Redis never counted it),
        again while Redis cannot be reached (`Owed.after_loss`), as long as the slot could be held."""
        if ask.max_concurrency >= 0:
            free = settlement_item(ask.request_id.encode(), b"0", b"0", b"-1", b"0", b"-")
            self.owed.resending[free] = self._loop.time() + ask.hold_ms / 1000
            self._queue(lane, free, LAZY_S)

    def add_spend(self, ask: Ask, spent: int) -> None:
        """A spend counted here alone (`fail_open`), added to Redis's once it answers (`Owed.spend`)."""
        if ask.budget >= 0 and spent > 0:
            self.owed.spend(self.lane(ask), spent)

    def _expire(self, lane: Lane, lease: Lease) -> None:
        if lane.lease is lease:
            self._end(lane, lease)
            self._send_settlements()  # at once: another process may wait for it

    def _end(self, lane: Lane, lease: Lease) -> None:
        """The lease is over: what it still holds goes back with the next settlements."""
        if lane.lease is lease:
            lane.lease = None
            lane.want = lease.next_size(self.lease_max)
        if lane.budgeted and lease.cost > 0:
            lane.release(lease.second, lease.cost)
        self._queue(lane, settlement_item(*lease.unused(lane.budgeted)), LAZY_S)

    async def load_spend(self, ask: Ask, spent: int, ttl_s: int) -> None:
        """The period's spend from the ledger, as a record of a new generation (`app.access.restore`)."""
        args = (b"%d" % spent, b"%d" % ttl_s, secrets.token_hex(8).encode())
        await self._call(self._load, self._load.command(self.lane(ask).spend_keys, args))

    def settle(self, ask: Ask, second: int, tokens: int, cost: int) -> None:
        """Sent now, nobody waiting for it; without `max_concurrency` summed per second (module doc)."""
        lane = self.lane(ask)
        if ask.max_concurrency < 0:
            self.settle_summed(lane, second, tokens - ask.tokens, ask.cost, cost)
            return
        rid, at, delta = ask.request_id.encode(), b"%d" % second, b"%d" % (tokens - ask.tokens)
        reserved = ask.cost if lane.budgeted else -1
        if reserved > 0:
            lane.release(second, reserved)
        items = self._unsent.pop(lane, [])  # this key's only: other keys' keep waiting to be sent together
        items.append(settlement_item(rid, at, delta, b"%d" % reserved, b"%d" % cost, b"-"))
        command, releases = lane.outgoing(items, self.redis.connected)
        self.redis.post_to(command, Settlement(self, lane, command, items, releases))
        self.redis.flush()  # written now, before the answer's last bytes (module doc)

    def settle_summed(self, lane: Lane, second: int, tokens: int, reserved: int, cost: int) -> None:
        """A settlement of a key without `max_concurrency`, summed with the others of its second:
        `tokens` used minus reserved, the cost `reserved` and the `cost` spent (nano-dollars)."""
        if not lane.budgeted:
            reserved = -1
        summed = lane.summed
        if summed is not None and summed[0] == second:
            summed[1], summed[2], summed[3] = summed[1] + tokens, summed[2] + reserved, summed[3] + cost
            return
        if summed is not None:
            self._queue(lane, summed_item(lane), SUMMED_S)
        lane.summed = [second, tokens, reserved, cost]
        self._queue(lane, None, SUMMED_S)

    def _queue(self, lane: Lane, item: bytes | None, within: float) -> None:
        """`item` (None: the key's summed settlements) to leave with the next admission, or within
        `within` seconds."""
        unsent = self._unsent.get(lane)
        if unsent is None:
            unsent = self._unsent[lane] = []
        if item is not None:
            unsent.append(item)
        timer = self._unsent_timer
        if timer is not None and within >= SUMMED_S:
            return
        loop = self._loop
        due = loop.time() + within
        if timer is not None:
            if self._unsent_due <= due:
                return
            timer.cancel()
        self._unsent_due = due
        self._unsent_timer = loop.call_at(due, self._send_settlements)

    def _send_settlements(self) -> None:
        """Every waiting settlement, one command per key, queued to leave in this turn of the loop."""
        if self._unsent_timer is not None:
            self._unsent_timer.cancel()
            self._unsent_timer = None
        unsent, self._unsent = self._unsent, {}
        for lane in self.owed.alone:
            unsent.setdefault(lane, [])
        for lane, items in unsent.items():
            if lane.summed is not None:
                items.append(summed_item(lane))
            if self.owed.alone:
                self.owed.take(lane, items)
            if items:
                command, releases = lane.outgoing(items, self.redis.connected)
                self.redis.post_to(command, Settlement(self, lane, command, items, releases))

    async def spend(self, key_id: str, period: str) -> tuple[int, int] | None:
        try:
            reply = await self.redis.call("HMGET", spend_key(self.prefix, key_id, period), "s", "r")
        except RespError as exc:
            raise LimiterDown(str(exc)) from None
        try:  # two bulk strings or nils, as HMGET answers
            if type(reply) is not list or not {type(value) for value in reply} <= _BULK:
                raise TypeError
            spent, reserved = reply
            return None if spent is None else (int(spent), int(reserved or 0))
        except UNREADABLE_REPLY:
            raise malformed(reply) from None

    async def _call(self, script: Script, command: bytes) -> Any:
        try:
            return await self.redis.evalsha(script, command)
        except RespError as exc:
            raise LimiterDown(f"{type(exc).__name__}: {exc}") from None

    async def drain(self) -> None:
        """Give the leases back, send the settlements waiting, wait for every answer (≤ the timeout)."""
        for lane in list(self._lanes.values()):
            if lane.lease is not None:
                self._end(lane, lane.lease)
        if self._unsent:
            self._send_settlements()
        await self.redis.drain()
        if self.retries:  # settlements resent after NOSCRIPT
            await asyncio.wait(set(self.retries))

    async def close(self) -> None:
        self.restorer.close()
        if self._unsent_timer is not None:  # nothing is sent again once closed (resends went on)
            self._unsent_timer.cancel()
        await self.redis.close()
