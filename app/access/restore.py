"""Putting back what a Redis that lost its data no longer holds of this process's budgets.

A Redis restarted without persistence (or flushed, or failed over to a replica without the data)
loses every spend record. The next admission of a budgeted key finds none and the gate loads the
period's spend from the ledger (`app.access.gate`): the reservations of the requests then running
in every process were in the lost record only. Counted from the ledger alone, a key overspent by
what was in flight (an audit: $0.075 of a $0.05 budget, 30 requests in flight over two processes).

So each process keeps what Redis holds reserved for it, per key lane and minute of admission
(`Lane.hold`: its requests in flight and the unused part of its leases, until Redis answers the
settlement that gives them back: one sent after the restore takes off what the restore put back),
and puts it back with the `RESTORE` script (`app.access.redis_scripts`) when the record it
reserved into is gone, as reservations of their minutes. A restore counts once per process and
generation of the record it knew (a marker in the record), so the ways a process learns of the
loss may all run:

- `{prefix}:gen`, made by the first process that finds it missing (`GENERATION`), read on every
  new connection (a restart drops them all; the restores then leave before any other command), every
  `RECONNECT_S` while the process holds reservations (a flush on live connections; reconnecting by
  itself when the connection is gone), and by the gate before it loads a missing record: a value
  other than the one last read means Redis lost its data;
- each spend record carries its own generation (a new one per load from the ledger), which the
  admission script compares with the lane's: another answers code 7, and the process restores that
  record, then asks again (a record evicted alone).

A process that saw the generation change, or first read one younger than `RESTORE_WAIT_S`, waits
until it is that old before it loads a missing record from the ledger (`reload_wait`), so that
the others, reading it within `RECONNECT_S`, have restored theirs. The spend of answers whose rows
its ledger writer has not written yet is left to the ledger: the load reads it after that second
(restored as well, it was counted twice whenever the rows were written by then, the usual case).
What is not covered (README): a process stalled longer than the wait, rows still unwritten when
the load reads the ledger (as in any reload), a record evicted alone until each process's next
admission of its key, and an older version's settlement into a restored record during an upgrade.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable
from typing import Any, Protocol

from app.access.lane import Lane
from app.access.limiter import LimiterDown
from app.access.redis_scripts import GENERATION
from app.access.resp import Handler, RespClient, RespError, Script, bulk, encode
from app.logging import get_logger

LOST = (
    "Redis lost the limiter's data (a restart without persistence, a flush, a failover): budgets are"
    " restored from each process's reservations and the ledger; rpm and tpm windows start again"
)
RESTORE_WAIT_S = 1.0  # how old a new generation gets before a process that saw it change loads from the ledger
RECONNECT_S = 0.25  # how often a process holding reservations reads the generation (reconnecting if need be)


class Limiter(Protocol):
    """What a `Restorer` reads of its `RedisLimiter`."""

    prefix: str
    redis: RespClient
    failed: Callable[[str, str], None]

    def lanes(self) -> list[Lane]: ...


class Restorer:
    """One `RedisLimiter`'s side of a lost Redis (module doc): the greeting each new connection sends
    (`command`, `heard`), the watch while this process holds reservations (`watch`, `check`), and
    `restore` of one record."""

    def __init__(self, limiter: Limiter, script: Script) -> None:
        self.limiter, self.script = limiter, script
        self.process_id = secrets.token_hex(8).encode()
        self.generation: bytes | None = None  # Redis's data, as last read
        self.unanswered = False  # a restore of the last change was lost: the next reading sends them again
        self.reload_at = 0.0  # the loop's time until which a missing record waits for restores
        self.closed = False
        self._watching: asyncio.Task[None] | None = None
        self._loop = asyncio.get_running_loop()
        self._greeting = encode(("EVAL", GENERATION, 1, f"{limiter.prefix}:gen", secrets.token_hex(8)))

    def command(self) -> bytes:
        return self._greeting

    def heard(self, reply: Any) -> list[tuple[bytes, Handler]]:
        """The answer to the greeting (on a new connection, or `check`): the restores to send,
        when the generation changed since it was last read. A generation younger than
        `RESTORE_WAIT_S` makes a missing record wait, read for the first time too (a process
        started just after a loss)."""
        try:
            generation, now = reply[0], int(reply[1])
            made = int(generation.rsplit(b":", 1)[1])
        except (TypeError, ValueError, IndexError, KeyError, AttributeError):
            return []  # an error reply (a `NOPERM` for EVAL): each record's own generation still tells
        known, self.generation = self.generation, generation
        if known != generation:
            self.reload_at = max(self.reload_at, self._loop.time() + RESTORE_WAIT_S - (now - made) / 1000)
            if known is not None:  # nothing said it before (the operator audit): windows started again silently
                get_logger("switchyard").warning("redis_data_lost", prefix=self.limiter.prefix, detail=LOST)
        if known is None or (known == generation and not self.unanswered):
            return []
        self.unanswered = False
        return [
            (command, _Restored(self, lanes))
            for lanes in self._groups(self.limiter.lanes())
            if (command := self._command(lanes)) is not None
        ]

    def reload_wait(self) -> float:
        """Seconds to wait before loading a missing record from the ledger (module doc)."""
        return max(0.0, self.reload_at - self._loop.time())

    def watch(self, holding: bool = False) -> None:
        """While this process holds reservations (`holding`: it just took one), read the generation
        every `RECONNECT_S` (a flush on live connections changes it too), and reconnect when the
        connection is gone."""
        if self.closed or self._watching is not None:
            return
        if holding or any(lane.held for lane in self.limiter.lanes()):
            self._watching = self._loop.create_task(self._watch())

    lost = watch  # the connection is gone (`Greeting.lost`)

    async def _watch(self) -> None:
        try:
            while not self.closed and any(lane.held for lane in self.limiter.lanes()):
                await asyncio.sleep(RECONNECT_S)
                await self.check()
        finally:
            self._watching = None

    async def check(self) -> None:
        """Read the generation now (`watch`; the gate, before it loads a missing record); a new
        connection's greeting does, else the greeting is sent alone. Redis down: nothing to do."""
        redis = self.limiter.redis
        try:
            if not redis.connected:
                await redis.call("PING")
                return
            reply = await redis.post(self._greeting)
        except RespError:
            return
        for command, handler in self.heard(reply):
            redis.post_to(command, handler)

    async def restore(self, lane: Lane) -> None:
        """Restore the record of `lane` (the admission script answered code 7), once."""
        lanes = [other for other in self.limiter.lanes() if other.record is lane.record] or [lane]
        command = self._command(lanes, always=True)
        assert command is not None
        try:
            reply = await self.limiter.redis.evalsha(self.script, command)
        except RespError as exc:
            raise LimiterDown(f"{type(exc).__name__}: {exc}") from None
        _Restored(self, lanes)(reply)

    def close(self) -> None:
        self.closed = True
        if self._watching is not None:
            self._watching.cancel()

    @staticmethod
    def _groups(lanes: list[Lane]) -> list[list[Lane]]:
        """Budgeted lanes by their spend record (a key's lanes of other limits share one), of
        records this process has seen."""
        groups: dict[int, list[Lane]] = {}
        for lane in lanes:
            if lane.budgeted and lane.generation:
                groups.setdefault(id(lane.record), []).append(lane)
        return list(groups.values())

    def _command(self, lanes: list[Lane], always: bool = False) -> bytes | None:
        """The `RESTORE` of one record for `lanes` (all of that record); None when
        there is nothing to put back and not `always` (the record's own generation tells them later)."""
        held: dict[int, int] = {}
        for lane in lanes:
            for minute, cost in lane.held.items():
                held[minute] = held.get(minute, 0) + cost
        if not (always or held):
            return None
        args = [self.process_id, lanes[0].generation, secrets.token_hex(8).encode()]
        for minute, cost in sorted(held.items()):
            args += [b"%d" % minute, b"%d" % cost]
        return b"".join((self.script.head(len(args)), lanes[0].spend_keys, *(bulk(arg) for arg in args)))


class _Restored:
    """A restore's answer: the record's generation, which its lanes now know."""

    __slots__ = ("lanes", "restorer")

    def __init__(self, restorer: Restorer, lanes: list[Lane]) -> None:
        self.restorer, self.lanes = restorer, lanes

    def __call__(self, reply: Any) -> None:
        if type(reply) is bytes and reply:
            self.lanes[0].generation = reply  # the lanes' one `Record`
        elif isinstance(reply, RespError):
            self.restorer.unanswered = True
            self.restorer.limiter.failed(self.lanes[0].key_id, f"restore: {type(reply).__name__}: {reply}")
