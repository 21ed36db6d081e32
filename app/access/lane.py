"""A key's lane in the Redis limiter (`app.access.redis_limiter`): the commands of one key, period and
limits, encoded once, and what this process holds of that key (its lease, the settlements waiting).
The Redis keys of one API key share its id as their hash tag (`redis_limiter`'s module doc)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from app.access.lease import LEASE_MIN, Lease
from app.access.resp import Script, bulk


class Owner(Protocol):
    """What a lane reads of its limiter (`RedisLimiter`) when it is made."""

    prefix: str
    admit_script: Script
    settle_script: Script
    clock: Callable[[], int] | None
    lease_max: int


def _base(prefix: str, key_id: str) -> str:
    """The start of every Redis key of one API key (its id is the hash tag: module doc)."""
    return f"{prefix}:lim:{{{key_id}}}"


def window_key(prefix: str, key_id: str) -> str:
    return f"{_base(prefix, key_id)}:window"


def spend_key(prefix: str, key_id: str, period: str) -> str:
    return f"{_base(prefix, key_id)}:spend:{period}"


class Record:
    """What this process knows of one spend record (a key's budget in one period), shared by the
    key's lanes of that period (their limits may differ: changed while requests ran): its
    generation as last seen (`app.access.restore`; empty before a first admission)."""

    __slots__ = ("generation",)

    def __init__(self) -> None:
        self.generation = b""


class Lane:
    """A key's lane: its commands in one budget period, encoded but for their per-request arguments: the
    admission's head (`EVALSHA`, its keys) and tail (the key's limits), the settlement's head. Made
    once per key, period and limits (again only after it was dropped `idle`, or its key revoked), so
    a request only formats its own arguments. Also what this
    process holds of that key: its lease, the size of the next, the settlements summed (`summed`:
    second, tokens' difference, cost reserved, cost spent) that wait to be sent."""

    __slots__ = (
        "admit_head",
        "admit_tail",
        "admitting",
        "asking",
        "budgeted",
        "held",
        "key_id",
        "keys",
        "late",
        "lease",
        "record",
        "releasing",
        "settle_script",
        "spend_keys",
        "summed",
        "want",
    )

    def __init__(self, limiter: Owner, key_id: str, period: str, limits: tuple[int, ...], record: Record) -> None:
        base = _base(limiter.prefix, key_id)
        spend = spend_key(limiter.prefix, key_id, period)
        keys = Script.keys(window_key(limiter.prefix, key_id), f"{base}:flight", spend, f"{base}:lease")
        self.spend_keys = Script.keys(spend)
        self.admit_tail = b"".join(bulk(b"%d" % limit) for limit in limits)  # ARGV[4..8]
        count = 5 + len(limits) + (limiter.clock is not None)  # ARGV[9..11]: lease asked, generation, clock
        self.admit_head = limiter.admit_script.head(count) + keys
        self.key_id, self.keys, self.settle_script = key_id, keys, limiter.settle_script
        self.budgeted = limits[-1] >= 0
        self.lease: Lease | None = None
        self.want = LEASE_MIN if limiter.lease_max >= LEASE_MIN and limits[2] < 0 else 1  # none with max_concurrency
        self.asking: asyncio.Future[None] | None = None  # done when the admission asking for a lease is back
        self.admitting = 0  # this process's admissions on their way to Redis (`RedisLimiter.admit`)
        self.late = False  # its answer came too late in its second for a lease (`RedisLimiter.admit`)
        self.summed: list[int] | None = None
        self.record = record
        self.held: dict[int, int] = {}  # minute → nano-dollars Redis holds reserved for this process
        self.releasing: dict[int, int] = {}  # of it, given back by settlements not sent yet

    @property
    def idle(self) -> bool:
        """Nothing of it in use: no lease, no admission on its way, no reservation Redis holds for it
        (`Lane.held`, which a restore needs): `RedisLimiter` may drop it and make it again."""
        return self.lease is None and self.asking is None and not self.admitting and not self.held

    @property
    def generation(self) -> bytes:
        """The spend record's generation, as this process last saw it (`Record`)."""
        return self.record.generation

    @generation.setter
    def generation(self, value: bytes) -> None:
        self.record.generation = value

    def hold(self, second: int, cost: int) -> None:
        """`cost` more (less, when negative) reserved in the budget for this process's requests and
        leases admitted in `second` (Redis's), kept to restore a record Redis lost. Given back when
        the settlement that gives it back is written on a live connection, or else once it is
        answered (`release`, `outgoing`, `released`)."""
        minute = second // 60
        left = self.held.get(minute, 0) + cost
        if left > 0:  # never below 0: a release into a lane made again (`forget`, `idle`) that held nothing
            self.held[minute] = left
        else:
            self.held.pop(minute, None)

    def release(self, second: int, cost: int) -> None:
        """A settlement (to be sent) gives back `cost` reserved in `second`."""
        minute = second // 60
        self.releasing[minute] = self.releasing.get(minute, 0) + cost

    def outgoing(self, items: list[bytes], connected: bool) -> tuple[bytes, dict[int, int] | None]:
        """The settlement command of `items`, and what it gives back, to leave `held` once it is
        answered (`released`). Written on a live connection (`connected`), it runs before any
        restore sent after it (one connection's commands run in order), so that leaves `held` now:
        restored too, it stayed reserved until its minute passed. One waiting for a new connection
        runs after that connection's restores, which must put it back for it to take off."""
        releasing = self.releasing or None
        if releasing is not None:
            self.releasing = {}
            if connected:
                self.released(releasing)
                releasing = None
        return self.settlement(items), releasing

    def released(self, releases: dict[int, int]) -> None:
        for minute, cost in releases.items():
            self.hold(minute * 60, -cost)

    def settlement(self, items: list[bytes]) -> bytes:
        """One `EVALSHA` of the settlement script for `items` (each six encoded arguments)."""
        return b"".join((self.settle_script.head(6 * len(items)), self.keys, *items))

    def answered(self, asking: asyncio.Future[None] | None) -> None:
        """The admission that asked for a lease is back (or gone): the requests waiting for it go on."""
        if asking is not None:
            if self.asking is asking:
                self.asking = None
            asking.set_result(None)


_SIX = b"$%d\r\n%s\r\n" * 6


def settlement_item(rid: bytes, at: bytes, delta: bytes, reserved: bytes, spent: bytes, kind: bytes) -> bytes:
    """A settlement script's six arguments; `kind`: `-` a request in flight, `=` summed
    settlements, a number a lease's unused requests."""
    return _SIX % (
        len(rid),
        rid,
        len(at),
        at,
        len(delta),
        delta,
        len(reserved),
        reserved,
        len(spent),
        spent,
        len(kind),
        kind,
    )


def summed_item(lane: Lane) -> bytes:
    """The settlements summed in one second (`RedisLimiter.settle_summed`), which release their
    reservations together (`Lane.release`)."""
    second, delta, reserved, spent = lane.summed or (0, 0, -1, 0)
    lane.summed = None
    if reserved > 0:
        lane.release(second, reserved)
    return settlement_item(b"=", b"%d" % second, b"%d" % delta, b"%d" % reserved, b"%d" % spent, b"=")


_ALONE_HEAD = settlement_item(b"", b"0", b"0", b"0", b"", b"=")[: -len(bulk(b"") + bulk(b"="))]
_ALONE_TAIL = bulk(b"=")


def alone_item(spent: int) -> bytes:
    """The item of a lane's spends counted here alone (`RedisLimiter.add_spend`): no request's."""
    return settlement_item(b"", b"0", b"0", b"0", b"%d" % spent, b"=")


def alone_spent(item: bytes) -> int | None:
    """The spend an `alone_item` carries; None for any other item."""
    if item.startswith(_ALONE_HEAD) and item.endswith(_ALONE_TAIL):
        return int(item[len(_ALONE_HEAD) : -len(_ALONE_TAIL)].split(b"\r\n")[1])
    return None


def resent(item: bytes) -> tuple[bytes | None, bool]:
    """What of a settlement item Redis may not have run must go again, and whether the item only
    gave a slot back. A slot give-back goes again as it is (a `ZREM`: harmless twice); a request's
    spend goes again without the release of its reservation (which the hold ends) or its tokens'
    difference (the window's minute ends that); a lease's give-back does not (its lease ends)."""
    if item.endswith(_FREE):
        return item, True
    rid, at, _delta, _reserved, spent, kind = item.split(b"\r\n")[1:12:2]  # six bulk strings, no line break in any
    if kind in (b"-", b"=") and spent != b"0":
        return settlement_item(rid, at, b"0", b"0", spent, kind), False
    return None, False


_FREE = settlement_item(b"", b"0", b"0", b"-1", b"0", b"-")[len(bulk(b"")) :]  # after its id: only a slot freed
