"""Ledger rows into a SQLite file with the stdlib driver: what the SQLite ledger writer runs, in
the gateway's process (`catalog.ledger_store`) or in a process of its own (`catalog.sqlite_child`).

No SQLAlchemy here: the shape of a row (`RowPlan`: which columns are timestamps, costs, booleans)
is read from the schema by `catalog.ledger_store.sqlite_plan` and handed over, so the writer's
own process imports only the driver, msgspec and the roll-up sums, and starts in about 0.1 s.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Sequence
from datetime import UTC
from pathlib import Path
from typing import Any

import msgspec

from catalog.exact import Money, utc_sqlite_text
from catalog.records import LedgerRecord
from catalog.rollup import SQLiteRollup, decimal_add

# Write-ahead logging, so readers never block the ledger writer and a commit is one append instead
# of a rollback journal created, synced and deleted; `synchronous=NORMAL`, which in WAL mode never
# corrupts the file and loses nothing on a process crash; and a busy timeout, so several processes
# share the file by waiting instead of failing with "database is locked" (`catalog.database`).
SQLITE_PRAGMAS = ("PRAGMA journal_mode=WAL", "PRAGMA synchronous=NORMAL", "PRAGMA busy_timeout=10000")
_CONFLICT = "ON CONFLICT (request_id) DO NOTHING"


def is_sqlite_outage(exc: BaseException) -> bool:
    """The database failing (locked past the busy timeout, I/O, no such table yet, not a database
    file), not the rows: the same batch may succeed later."""
    return isinstance(exc, sqlite3.OperationalError | OSError) or type(exc) is sqlite3.DatabaseError


class RowPlan(msgspec.Struct, frozen=True):
    """Where a ledger row's converted values sit (`LedgerRecord`'s fields, in order): the two UTC
    timestamps, the two costs (of one precision and scale) and the booleans; the rest bind as
    they are."""

    columns: tuple[str, ...]
    started: int
    finished: int
    cost: int
    estimate: int
    bools: tuple[int, ...]
    precision: int
    scale: int


class SQLiteRows:
    """A record as the list of parameters SQLite's driver binds, and the INSERT they go to.

    `encode` is one straight run per row: msgspec turns the record's tuple into builtins in one C
    call — the timestamps into RFC 3339 text that a slice and a `replace` make SQLite's stored
    form, the costs into text that the column's exact form replaces — and the rest is a few
    assignments by position (callgrind, the bench's row: 25,700 → 23,900 instructions).
    """

    def __init__(self, plan: RowPlan) -> None:
        self._started, self._finished = plan.started, plan.finished
        self._cost, self._estimate, self._bools = plan.cost, plan.estimate, plan.bools
        self._money = Money(plan.precision, plan.scale)
        marks = ", ".join("?" * len(plan.columns))
        self.sql = f"INSERT INTO ledger ({', '.join(plan.columns)}) VALUES ({marks}) {_CONFLICT}"  # noqa: S608
        self.rollup = SQLiteRollup(plan.columns)
        _bind_directly()

    def insert(self, cursor: Any, records: Sequence[LedgerRecord]) -> bool:
        """Insert `records` and add them to the roll-ups, inside the caller's open transaction.

        False, with nothing added to the roll-ups, when some request id was skipped: the caller
        rolls back and calls `insert_each` instead."""
        rows = [self.encode(record) for record in records]
        cursor.executemany(self.sql, rows)
        if cursor.rowcount != len(rows):
            return False
        self.rollup.add(cursor, rows)
        return True

    def insert_each(self, cursor: Any, records: Sequence[LedgerRecord]) -> None:
        """Insert `records` one by one, adding to the roll-ups only those the database took."""
        inserted = []
        for record in records:
            row = self.encode(record)
            cursor.execute(self.sql, row)
            if cursor.rowcount == 1:
                inserted.append(row)
        self.rollup.add(cursor, inserted)

    def encode(self, record: LedgerRecord) -> list[Any]:
        values = _astuple(record)
        row = list(_to_builtins(values))
        for index in (self._started, self._finished):
            text = row[index]
            if len(text) == 27 and values[index].tzinfo is UTC:  # 2026-11-30T03:04:05.000123Z
                row[index] = text[:26].replace("T", " ")
            else:  # a whole second, or another zone (the same instant is stored)
                row[index] = utc_sqlite_text(values[index])
        cost, estimate = values[self._cost], values[self._estimate]
        if cost is not None:
            row[self._cost] = self._money.sqlite_text(cost)
        if estimate is not None:  # usually the very object `cost` is (or an equal one): encoded once
            row[self._estimate] = row[self._cost] if estimate is cost else self._money.sqlite_text(estimate)
        for index in self._bools:  # an int binds directly; a bool goes through the adapter registry
            row[index] = 1 if row[index] else 0
        return row


_astuple = msgspec.structs.astuple
_to_builtins = msgspec.to_builtins


def _bind_directly() -> None:
    """Let the `sqlite3` driver bind None without its adapter search.

    The driver binds int, float and str directly but sends every other value through the
    adapter registry, and a miss looks up `__adapt__`/`__conform__` attributes that do not exist,
    raising and clearing an AttributeError each time: ≈ 3,300 instructions per value (callgrind).
    A registered adapter is found at once (≈ 1,300): None stays None (NULL). A ledger row's
    booleans never get here: `encode` makes them ints. Process-wide and idempotent; what every
    connection stores is unchanged.
    """
    sqlite3.register_adapter(type(None), _NONE.get)


_NONE: dict[object, None] = {}  # `_NONE.get(value)` is None for every value, in one C call


class SQLiteBatches(SQLiteRows):
    """Batches into the file at `path` on one connection of their own, opened on first use and
    again after an outage; each batch one transaction. Not thread-safe: one caller at a time.

    The file is the one at `path` now: one deleted or replaced while the connection is open (an
    operator's `rm`, a backup restored with `mv`), or its `-wal` deleted, is opened again before
    the next batch (two `stat`s), or rows would be committed to a file no path reaches (and
    released from the journal), or to a log no other connection reads.
    The file is opened read-write, never made: with none there the batch is an outage and waits
    (an empty file would have no table anyway)."""

    def __init__(self, plan: RowPlan, path: str) -> None:
        super().__init__(plan)
        self._path = path
        self._uri = f"{Path(os.path.abspath(path)).as_uri()}?mode=rw"
        self._connection: sqlite3.Connection | None = None
        self._files: tuple[tuple[int, int] | None, ...] = ()  # the files the connection opened (`_identity`)

    def write(self, records: Sequence[LedgerRecord]) -> None:
        """Insert `records` in one transaction, skipping request ids already present (the rest
        are then inserted one by one); the roll-ups in the same transaction."""
        if self._connection is not None and self._identity() != self._files:
            self._reopen()  # the file or its log deleted or replaced under the connection
        connection = self._connection or self._connect()
        try:
            cursor = connection.cursor()
            connection.execute("BEGIN")
            if not self.insert(cursor, records):
                connection.rollback()
                connection.execute("BEGIN")
                self.insert_each(cursor, records)
            connection.execute("COMMIT")
        except BaseException as exc:
            if connection.in_transaction:
                connection.rollback()
            if is_sqlite_outage(exc):
                self.disconnect()  # the next attempt opens the file again
            raise

    def _identity(self) -> tuple[tuple[int, int] | None, ...]:
        """(device, inode) of the file at `path` and of its write-ahead log (None: not there)."""
        return tuple(_file_id(name) for name in (self._path, f"{self._path}-wal"))

    def _connect(self) -> sqlite3.Connection:
        connection = sqlite3.connect(self._uri, isolation_level=None, uri=True)
        for pragma in SQLITE_PRAGMAS:
            connection.execute(pragma)
        self._files = self._identity()  # the log too: WAL mode opened it, and it stays while this connection does
        connection.create_function("decimal_add", 2, decimal_add, deterministic=True)
        self._connection = connection
        return connection

    def _reopen(self) -> None:
        """Close the connection to files moved away, its log's rows checkpointed into the file
        first: a close checkpoints only when no other connection has the file open, and the
        rows committed to a deleted log were in no other."""
        assert self._connection is not None
        with contextlib.suppress(sqlite3.Error):
            self._connection.execute("PRAGMA wal_checkpoint(PASSIVE)")
        self.disconnect()

    def disconnect(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


def _file_id(name: str) -> tuple[int, int] | None:
    try:
        stat = os.stat(name)
    except OSError:
        return None
    return stat.st_dev, stat.st_ino
