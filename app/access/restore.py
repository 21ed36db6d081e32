"""Putting back what a Redis that lost its data no longer holds of this process's budgets.

A Redis restarted without persistence (or flushed, or failed over to a replica without the data)
loses every spend record. The next admission of a budgeted key finds none and the gate loads the
period's spend from the ledger (`app.access.gate`): the reservations of the requests then running
in every process, and the cost of answers whose ledger rows are still on their way to the
database, were in the lost record only. Counted from the ledger alone, a key overspent by what was
in flight (an audit: $0.075 of a $0.05 budget, 30 requests in flight over two processes).

So each process keeps what Redis holds reserved for it, per key lane and minute of admission
(`Lane.hold`: its requests in flight and the unused part of its leases), and puts it back with the
`RESTORE` script (`app.access.redis_scripts`) when the record it reserved into is gone: as
reservations of their minutes (each request's settlement then takes its own off, as before), and
the key's rows its ledger writer has not written yet as spend (`u`, counted with `s`). A restore
counts once per process and generation of the record (a marker in the record), so the two ways a
process learns of the loss may both run:

- on every new connection (a restart drops them all) the client reads `{prefix}:gen`, made by the
  first process that finds it missing (`GENERATION`): a value other than the one it knew means Redis
  lost its data, and the restores leave before any other command on that connection. A process
  with reservations reconnects by itself within `RECONNECT_S` of losing its connection, instead
  of at its next request;
- each spend record carries its own generation (a new one per load from the ledger), which the
  admission script compares with the lane's: another answers code 7, and the process restores that
  record, then asks again (a flush without a restart, an evicted record).

A process that learns of a loss on reconnecting waits until the new generation is `RESTORE_WAIT_S`
old before it loads a missing record from the ledger itself (`reload_wait`), so that processes
still reconnecting have restored theirs first. What is not covered: a process that never
reconnects in time (stalled longer than that), reservations of a process started after the
loss's generation was made before it (none: it has none), and ledger rows waiting in the journal
through a database outage (they count once written). Counting in doubt errs towards refusing:
a row written between a restore and the ledger read is counted twice, until the period ends or
the record is loaded again.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable
from decimal import Decimal
from typing import Any, Protocol

from app.access.lane import Lane
from app.access.limiter import LimiterDown
from app.access.redis_scripts import GENERATION
from app.access.resp import Handler, RespClient, RespError, Script, bulk, encode
from app.access.worstcase import to_nano

RESTORE_WAIT_S = 1.0  # how old a new generation gets before a process that saw it change loads from the ledger
RECONNECT_S = 0.25  # how often a process holding reservations tries to reconnect after losing Redis


class Limiter(Protocol):
    """What a `Restorer` reads of its `RedisLimiter`."""

    prefix: str
    redis: RespClient
    failed: Callable[[str, str], None]

    def lanes(self) -> list[Lane]: ...


class Restorer:
    """One `RedisLimiter`'s side of a lost Redis (module doc): the greeting each new connection sends
    (`command`, `heard`), the reconnection after a loss (`lost`), and `restore` of one record."""

    def __init__(self, limiter: Limiter, script: Script) -> None:
        self.limiter, self.script = limiter, script
        self.process_id = secrets.token_hex(8).encode()
        self.generation: bytes | None = None  # Redis's data, as last read on connecting
        self.reload_at = 0.0  # the loop's time until which a missing record waits for restores
        self.unlogged: Callable[[str], Decimal] = lambda _key_id: Decimal(0)  # the ledger's rows not written yet
        self.closed = False
        self._reconnecting: asyncio.Task[None] | None = None
        self._loop = asyncio.get_running_loop()
        self._greeting = encode(("EVAL", GENERATION, 1, f"{limiter.prefix}:gen", secrets.token_hex(8)))

    def command(self) -> bytes:
        return self._greeting

    def heard(self, reply: Any) -> list[tuple[bytes, Handler]]:
        """The greeting's answer on a new connection: the restores to send first, when the
        generation changed since the last connection."""
        try:
            generation, now = reply[0], int(reply[1])
            made = int(generation.rsplit(b":", 1)[1])
        except (TypeError, ValueError, IndexError, KeyError, AttributeError):
            return []  # an error reply (a `NOPERM` for EVAL): each record's own generation still tells
        known, self.generation = self.generation, generation
        if known is None or known == generation:
            return []
        self.reload_at = self._loop.time() + max(0.0, RESTORE_WAIT_S - (now - made) / 1000)
        commands: list[tuple[bytes, Handler]] = []
        for lanes in self._by_record(self.limiter.lanes()).values():
            command = self._command(lanes)
            if command is not None:
                commands.append((command, _Restored(self, lanes)))
        return commands

    def reload_wait(self) -> float:
        """Seconds to wait before loading a missing record from the ledger (module doc)."""
        return max(0.0, self.reload_at - self._loop.time())

    def lost(self) -> None:
        """The connection is gone: reconnect soon while this process holds reservations."""
        if self.closed or self._reconnecting is not None:
            return
        if any(lane.held for lane in self.limiter.lanes()):
            self._reconnecting = self._loop.create_task(self._reconnect())

    async def _reconnect(self) -> None:
        redis = self.limiter.redis
        try:
            while not self.closed and not redis.connected and any(lane.held for lane in self.limiter.lanes()):
                await asyncio.sleep(RECONNECT_S)
                try:
                    await redis.call("PING")
                except RespError:
                    continue
        finally:
            self._reconnecting = None

    async def restore(self, lane: Lane) -> None:
        """Restore the record of `lane` (the admission script answered code 7), once."""
        lanes = self._by_record(self.limiter.lanes()).get(lane.spend_keys, [lane])
        command = self._command(lanes, always=True)
        assert command is not None
        try:
            reply = await self.limiter.redis.evalsha(self.script, command)
        except RespError as exc:
            raise LimiterDown(f"{type(exc).__name__}: {exc}") from None
        _Restored(self, lanes)(reply)

    def close(self) -> None:
        self.closed = True
        if self._reconnecting is not None:
            self._reconnecting.cancel()

    @staticmethod
    def _by_record(lanes: list[Lane]) -> dict[bytes, list[Lane]]:
        """Budgeted lanes by their spend record (a key's lanes of other limits share one)."""
        records: dict[bytes, list[Lane]] = {}
        for lane in lanes:
            if lane.budgeted:
                records.setdefault(lane.spend_keys, []).append(lane)
        return records

    def _command(self, lanes: list[Lane], always: bool = False) -> bytes | None:
        """The `RESTORE` of one record for `lanes`; None when there is nothing to put back and
        not `always` (the record's own generation tells such a lane later)."""
        known = next((lane.generation for lane in lanes if lane.generation), b"")
        held: dict[int, int] = {}
        for lane in lanes:
            for minute, cost in lane.held.items():
                held[minute] = held.get(minute, 0) + cost
        unlogged = to_nano(self.unlogged(lanes[0].key_id)) if known else 0
        if not always and not (known and (held or unlogged)):
            return None
        return self._args(lanes[0], known, unlogged, held)

    def _args(self, lane: Lane, known: bytes, unlogged: int, held: dict[int, int]) -> bytes:
        args = [self.process_id, known, secrets.token_hex(8).encode(), b"%d" % unlogged]
        for minute, cost in sorted(held.items()):
            if cost > 0:
                args += [b"%d" % minute, b"%d" % cost]
        return b"".join((self.script.head(len(args)), lane.spend_keys, *(bulk(arg) for arg in args)))


class _Restored:
    """A restore's answer: the record's generation, which the lanes now know."""

    __slots__ = ("lanes", "restorer")

    def __init__(self, restorer: Restorer, lanes: list[Lane]) -> None:
        self.restorer, self.lanes = restorer, lanes

    def __call__(self, reply: Any) -> None:
        if type(reply) is bytes and reply:
            for lane in self.lanes:
                lane.generation = reply
        elif isinstance(reply, RespError):
            self.restorer.limiter.failed(self.lanes[0].key_id, f"restore: {type(reply).__name__}: {reply}")
