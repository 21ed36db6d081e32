"""A settlement command's answer (`app.access.redis_limiter` sends one per key's waiting settlements), and
what a lost one must still get into Redis (`Owed`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from msgspec import Struct

from app.access.lane import Lane, alone_item, alone_spent, resent
from app.access.resp import RespClient, RespError, RespLost, Script

REFREE_S = 1.0  # how soon what a lost settlement must not lose goes again (`Owed.after_loss`)
REFREE_FOR_S = 60.0  # for how long, when the hold is not known
Queue = Callable[[Lane, "bytes | None", float], None]  # `RedisLimiter._queue`: an item (None: the lane's sums) to send


class Owed:
    """What Redis must still be told after a settlement command was lost (`RespLost`: whether it
    ran is unknown), and the spends a process counted alone while Redis was out of reach."""

    __slots__ = ("_loop", "_queue", "alone", "resending")

    def __init__(self, queue: Queue, loop: asyncio.AbstractEventLoop) -> None:
        self._queue, self._loop = queue, loop
        self.resending: dict[bytes, float] = {}  # what goes again until Redis takes it (`after_loss`), until when
        self.alone: dict[Lane, int] = {}  # spend counted here alone (`spend`), not yet taken by Redis

    def spend(self, lane: Lane, spent: int) -> None:
        """A spend counted here alone (`fail_open`), added to Redis's once it answers (to a spend it
        holds only: one it lost is loaded from the ledger, which has this one). Summed per lane until
        Redis takes it: kept per request (for a day), an outage at 200 requests a second held 14,400
        items after 72 s, each sent again every second (an audit)."""
        self.alone[lane] = self.alone.get(lane, 0) + spent
        self._queue(lane, None, REFREE_S)

    def take(self, lane: Lane, items: list[bytes]) -> None:
        """The lane's spends counted alone, as one item of the settlement command being made."""
        alone = self.alone.pop(lane, 0)
        if alone:
            items.append(alone_item(alone))

    def after_loss(self, lane: Lane, items: list[bytes]) -> bool:
        """A settlement command lost (Redis gone or silent; whether it ran is unknown): what of it
        Redis must not miss (`app.access.lane.resent`) goes again every `REFREE_S` until Redis takes it;
        whether the command gave slots back alone (nothing to report). Lost, an admission a
        stalled Redis ran late held its slot for the hold, and a spend never counted let a budget
        overshoot once the hold ended; sent twice, a spend counts twice: on the side of refusing."""
        now, quiet = self._loop.time(), True
        for item in items:
            alone = alone_spent(item)
            if alone is not None:  # summed again with those counted since
                self.spend(lane, alone)
                continue
            again, free = resent(item)
            quiet = quiet and (free or item in self.resending)  # a resend lost again: said already
            if again is not None and now < self.resending.setdefault(again, now + REFREE_FOR_S):
                self._queue(lane, again, REFREE_S)
            elif again is not None:
                del self.resending[again]
        return quiet


class Limiter(Protocol):
    """What a `Settlement` reads of its `RedisLimiter`."""

    redis: RespClient
    settle_script: Script
    owed: Owed
    retries: set[asyncio.Future[Any]]
    failed: Callable[[str, str], None]


class Settlement(Struct):
    """A settlement command's answer (one key's settlements): the script loaded and the command
    resent on NOSCRIPT (Redis restarted); `Owed.after_loss` when lost; reported to the gate otherwise.
    Answered or lost, what it gives back of the budget leaves the lane's `held` (`Lane.hold`)."""

    limiter: Limiter
    lane: Lane
    command: bytes
    items: list[bytes]
    releases: dict[int, int] | None = None

    def __call__(self, reply: Any) -> None:
        limiter = self.limiter
        if self.releases is not None:
            self.lane.released(self.releases)
            self.releases = None
        if not isinstance(reply, RespError):
            if limiter.owed.resending:  # taken: no more tries
                for item in self.items:
                    limiter.owed.resending.pop(item, None)
            return
        if str(reply).startswith("NOSCRIPT"):
            retry = asyncio.ensure_future(limiter.redis.evalsha(limiter.settle_script, self.command))
            limiter.retries.add(retry)
            retry.add_done_callback(self._retried)
        elif not (isinstance(reply, RespLost) and limiter.owed.after_loss(self.lane, self.items)):  # slots alone: quiet
            limiter.failed(self.lane.key_id, f"{type(reply).__name__}: {reply}")

    def _retried(self, done: asyncio.Future[Any]) -> None:
        self.limiter.retries.discard(done)
        error = None if done.cancelled() else done.exception()
        if error is not None:
            self.limiter.failed(self.lane.key_id, f"{type(error).__name__}: {error}")
        else:  # went through: as an answer that did
            self(None)
