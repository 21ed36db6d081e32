"""Where ledger rows go: one store per database, each writing a batch in one transaction.

The gateway process runs the ledger writer on the core that serves requests, so what a row costs
on its way out of the process is what the ledger costs the serving process (bench/RESULTS.md:
`bash bench/instructions.sh` counts it; the database's own work is counted apart, a PostgreSQL
server's or the SQLite writer process's). Each store encodes a batch's records in one loop
(`encode`, which raises `ValueError` for a record the database would refuse: a naive datetime, a
cost that does not fit) and hands the batch over once:

- `SQLiteProcessStore` (a database file, the embedded default; the ledger writer's store): the
  batch is one JSON document, the rows' journal lines joined as for PostgreSQL, written to a pipe
  of the SQLite writer's own process (`catalog.sqlite_child`), which decodes it and inserts the
  rows with the stdlib `sqlite3` driver's `executemany` (`catalog.sqlite_rows`). SQLite's own
  work (binding, the INSERT, the roll-ups, the commit) then runs beside the gateway, as a
  PostgreSQL server's does, not on the core and the interpreter that serve requests.
- `SQLiteStore`: the same rows on a thread of the calling process, for one-off writes
  (`catalog.ledger_write.write_records`: tools, tests) that would not pay for a process's start.
- `PostgresStore`: the batch is one JSON document — the rows' journal lines joined, the pipeline
  having encoded each record once already — that PostgreSQL turns into rows with
  `json_populate_recordset`, one statement sent by asyncpg itself on a connection the store keeps
  from the engine's pool, outside a transaction (a statement is its own transaction); the
  parsing happens in the database server, not in the gateway. The document goes as `bytea`
  (`convert_from` makes it text there): bytes as they are, where a `json` parameter is a `str`
  that the gateway would decode and the driver encode again. Costs are rounded here first
  (PostgreSQL would round ties away from zero, the column type rounds half-even).
- `EngineStore`: SQLite databases that are not a plain file (`:memory:`, URI filenames), which a
  second connection could not reach: the same rows as `SQLiteStore` through the engine.

All of them store exactly what the table's types store (tests/catalog compare every column with a
SQLAlchemy Core insert of the same record) and skip a request id already there: a replay is
harmless. Each adds the rows it inserted, only those, to the four roll-up levels (hourly, per
model, per model and status, daily) in the same transaction (`catalog.rollup`).
"""

from __future__ import annotations

import asyncio
import contextlib
import decimal
import operator
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC
from decimal import Decimal
from pathlib import Path
from subprocess import PIPE
from typing import Any, Protocol

import msgspec
from sqlalchemy import Boolean, Double
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from catalog.outages import LedgerUnavailable, postgres_outages
from catalog.records import RECORD_JSON, LedgerRecord
from catalog.rollup import decimal_add, postgres_statement
from catalog.sqlite_child import HEAD, OUTAGE, REFUSED, WRITTEN, Setup, frame
from catalog.sqlite_rows import RowPlan, SQLiteBatches, SQLiteRows
from catalog.tables import ExactDecimal, LedgerRow, UTCDateTime

_CONFLICT = "ON CONFLICT (request_id) DO NOTHING"
WRITE_TIMEOUT_S = 15.0  # then an outage (`PostgresStore.write`)


class LedgerStore(Protocol):
    async def write(self, records: Sequence[LedgerRecord], lines: Sequence[bytes] | None = None) -> None:
        """Insert `records` in one transaction, skipping request ids already present; ValueError
        (nothing written) when one of them is a record the database would refuse. `lines`, when
        given: each record's `RECORD_JSON.encode(record)` (its journal line), in order."""

    async def open(self) -> None:
        """Get ready before the first batch (the writer's task calls it once, first)."""

    async def close(self) -> None: ...


def store_for(engine: AsyncEngine, columns: Sequence[str], *, own_process: bool = False) -> LedgerStore:
    """The store for `engine`'s database; `columns` are `LedgerRecord`'s fields, in order.
    `own_process`: a SQLite file is written by a process of its own (the ledger writer's case).
    """
    if engine.dialect.name == "postgresql":
        return PostgresStore(engine, columns)
    if engine.dialect.name == "sqlite":
        path = engine.url.database
        if path and path != ":memory:" and not path.startswith("file:") and not engine.url.query:
            return SQLiteProcessStore(path, columns) if own_process else SQLiteStore(path, columns)
        return EngineStore(engine, columns)
    raise ValueError(f"the ledger supports SQLite and PostgreSQL, not {engine.dialect.name}")


def sqlite_plan(columns: Sequence[str]) -> RowPlan:
    """Where `columns` (the ledger's, in `LedgerRecord`'s order) need converting for SQLite, read
    from the table's column types: two UTC timestamps, two costs of one type, booleans, and
    columns bound as they are. Another shape is refused here, not mis-stored later."""
    table, dialect = LedgerRow.__table__, sqlite_dialect.dialect()
    times: list[int] = []
    decimals: list[tuple[int, ExactDecimal]] = []
    bools: list[int] = []
    for index, name in enumerate(columns):
        column_type = table.c[name].type
        if isinstance(column_type, UTCDateTime):
            times.append(index)
        elif isinstance(column_type, ExactDecimal):
            decimals.append((index, column_type))
        elif isinstance(column_type, Boolean):
            bools.append(index)  # stored as 1 or 0, as SQLAlchemy's processor stores it
        elif isinstance(column_type, Double):
            continue  # a float (or an int: the column's REAL affinity stores it as a float), bound as is
        elif column_type.dialect_impl(dialect).bind_processor(dialect) is not None:
            raise ValueError(f"the SQLite ledger encoder does not convert column {name} ({column_type})")
    if len(times) != 2 or len({(money.precision, money.scale) for _, money in decimals}) != 1 or len(decimals) != 2:
        raise ValueError("the SQLite ledger encoder expects two UTC timestamps and two costs of one type")
    (started, finished), ((cost, money), (estimate, _)) = times, decimals
    return RowPlan(tuple(columns), started, finished, cost, estimate, tuple(bools), money.precision, money.scale)


class SQLiteStore:
    """Batches through the stdlib driver on one thread that owns its connection (tools, replays:
    `write_records`; the writer's own batches go to `SQLiteProcessStore`)."""

    def __init__(self, path: str, columns: Sequence[str]) -> None:
        self._batches = SQLiteBatches(sqlite_plan(columns), path)
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="ledger-sqlite")
        self._closed = False

    async def open(self) -> None:
        return None

    async def write(self, records: Sequence[LedgerRecord], lines: Sequence[bytes] | None = None) -> None:
        await asyncio.get_running_loop().run_in_executor(self._thread, self._batches.write, records)

    async def close(self) -> None:
        """Close the connection on its thread and stop the thread; a second call does nothing."""
        if self._closed:
            return
        self._closed = True
        await asyncio.get_running_loop().run_in_executor(self._thread, self._batches.disconnect)
        self._thread.shutdown(wait=True)


class SQLiteProcessStore:
    """The ledger writer's SQLite batches, written by a process of its own (`catalog.sqlite_child`
    says why), started with the writer (`open`) and again after it failed.

    A batch goes as the JSON array of its records: the rows' journal lines joined, as the
    PostgreSQL store sends them (rows read back from the journal are encoded here). The child's
    answer is sorted as the thread's store sorted its exceptions: an outage (`LedgerUnavailable`,
    retried), or the rows' own fault (`RowsRefused`, a `ValueError`: the writer sets them aside
    one by one). A child that dies, or a pipe that breaks, is an outage: the child is killed and
    the next batch starts a new one, so a batch is never half-answered."""

    def __init__(self, path: str, columns: Sequence[str]) -> None:
        self._setup = frame(msgspec.json.encode(Setup(path, sqlite_plan(columns))))
        self._process: asyncio.subprocess.Process | None = None

    async def open(self) -> None:
        """Start the child with the writer, not with its first batch: the gateway's memory and
        processes are then what they will be from the start (bench/run.py measures RSS growth over
        the process tree), and a child that cannot start is met here first, then by every batch."""
        if self._process is None:
            with contextlib.suppress(LedgerUnavailable):
                await self._start()

    async def write(self, records: Sequence[LedgerRecord], lines: Sequence[bytes] | None = None) -> None:
        document = RECORD_JSON.encode(records) if lines is None else json_array(lines)
        process = self._process or await self._start()
        assert process.stdin is not None
        assert process.stdout is not None
        try:
            process.stdin.write(HEAD.pack(len(document)))
            process.stdin.write(document)
            await process.stdin.drain()
            kind = await process.stdout.readexactly(1 + HEAD.size)
            message = (await process.stdout.readexactly(HEAD.unpack(kind[1:])[0])).decode()
        except BaseException as exc:
            await self._stop(process)
            if isinstance(exc, Exception):
                raise LedgerUnavailable(f"the SQLite writer process failed: {type(exc).__name__}") from exc
            raise
        if kind[:1] == WRITTEN:
            return
        if kind[:1] == REFUSED:
            raise RowsRefused(message)
        if kind[:1] != OUTAGE:  # not an answer the child gives: the conversation is lost, start again
            await self._stop(process)
        raise LedgerUnavailable(message)

    async def _start(self) -> asyncio.subprocess.Process:
        try:
            process = await asyncio.create_subprocess_exec(sys.executable, "-c", _CHILD, stdin=PIPE, stdout=PIPE)
        except OSError as exc:
            raise LedgerUnavailable(f"cannot start the SQLite writer process: {exc}") from exc
        assert process.stdin is not None
        process.stdin.write(self._setup)
        self._process = process
        return process

    async def _stop(self, process: asyncio.subprocess.Process) -> None:
        if self._process is process:
            self._process = None
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()

    async def close(self) -> None:
        """End the child's input and wait for it to finish the batch in hand and exit; killed if
        the wait is cancelled (the writer bounds it). A second call does nothing."""
        process, self._process = self._process, None
        if process is None:
            return
        assert process.stdin is not None
        process.stdin.close()
        try:
            await process.wait()
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            raise


def json_array(items: Sequence[bytes]) -> bytes:
    """The JSON array of `items`, each already JSON (a batch's journal lines)."""
    return b"".join((b"[", b",".join(items), b"]"))


class RowsRefused(ValueError):
    """The SQLite writer process refused a batch for its rows (the message names the error)."""


# The child's program: this process's `catalog`, found where this process found it when the child's
# own path (the same environment) has none, without putting that directory before the standard library.
_CHILD = (
    f"import sys; sys.path.append({str(Path(__file__).resolve().parent.parent)!r}); "
    "from catalog.sqlite_child import main; main()"
)


class EngineStore(SQLiteRows):
    """`SQLiteRows` through the engine, for SQLite databases only the engine's connection reaches."""

    def __init__(self, engine: AsyncEngine, columns: Sequence[str]) -> None:
        super().__init__(sqlite_plan(columns))
        self._engine = engine

    async def open(self) -> None:
        return None

    async def write(self, records: Sequence[LedgerRecord], lines: Sequence[bytes] | None = None) -> None:
        try:
            async with self._engine.begin() as connection:
                await connection.run_sync(self._insert, records, False)
        except _Skipped:  # rolled back: insert them one by one
            async with self._engine.begin() as connection:
                await connection.run_sync(self._insert, records, True)

    def _insert(self, connection: Any, records: Sequence[LedgerRecord], each: bool) -> None:
        """On the engine's connection, inside its transaction."""
        driver = connection.connection.dbapi_connection
        driver.create_function("decimal_add", 2, decimal_add, deterministic=True)
        cursor = driver.cursor()
        if each:
            self.insert_each(cursor, records)
        elif not self.insert(cursor, records):
            raise _Skipped

    async def close(self) -> None:
        return None


class _Skipped(Exception):
    """A batch with a request id already present, or twice: `EngineStore` takes it row by row."""


class PostgresStore:
    """Batches as one JSON document that PostgreSQL unpacks into ledger rows (and their roll-ups).

    The document is the records' `RECORD_JSON` encodings joined into one array. The writer hands
    the journal lines it already has (the pipeline encoded each record once, for the journal and
    the log line): a record that `encode` keeps as it is goes as its line, and only a record whose
    costs it rounds is encoded again — the same bytes, byte for byte, as encoding the batch
    (tests/catalog/test_ledger_document.py), without a second encoding of each row.
    """

    def __init__(self, engine: AsyncEngine, columns: Sequence[str]) -> None:
        self._engine = engine
        self._connection: AsyncConnection | None = None  # held between batches, out of any transaction
        self._driver: Any = None  # its asyncpg connection
        table = LedgerRow.__table__
        times = [name for name in columns if isinstance(table.c[name].type, UTCDateTime)]
        decimals = [(name, t) for name in columns if isinstance(t := table.c[name].type, ExactDecimal)]
        if len(times) != 2 or len(decimals) != 2 or len({(t.precision, t.scale) for _, t in decimals}) != 1:
            raise ValueError("the PostgreSQL ledger encoder expects two UTC timestamps and two costs of one type")
        (self._cost, column), (self._estimate, _) = decimals
        self._money = column.money
        self._checked = operator.attrgetter(*times, self._cost, self._estimate)
        self._quantum, self._context = self._money.quantum, self._money.context
        names = ", ".join(columns)
        self.sql = postgres_statement(
            f"INSERT INTO ledger ({names}) SELECT {names} "  # noqa: S608
            f"FROM json_populate_recordset(NULL::ledger, convert_from($1::bytea, 'UTF8')::json) {_CONFLICT}"
        )

    async def open(self) -> None:
        return None

    def encode(self, record: LedgerRecord) -> LedgerRecord:
        """The record itself, or a copy with its costs rounded half-even to the column's scale
        (PostgreSQL would round ties away from zero); ValueError for a cost that does not fit.

        Timestamps go as RFC 3339 with their offset (the same instant, whatever the zone); a naive
        one is refused, since PostgreSQL would read it in the session's time zone. One straight
        run: the four values in one C call, and a cost that is already exact at the column's scale
        (the usual case; the estimate is usually the very same object) costs one `quantize` and
        one comparison, in C; anything else takes `_rounded`."""
        started, finished, cost, estimate = self._checked(record)
        if started.tzinfo is not UTC or finished.tzinfo is not UTC:
            UTCDateTime.aware_utc(started)
            UTCDateTime.aware_utc(finished)
        quantum, context = self._quantum, self._context
        try:  # a quiet NaN quantizes to itself and is never equal to it
            if (cost is None or cost.quantize(quantum, context=context) == cost) and (
                estimate is None or estimate is cost or estimate.quantize(quantum, context=context) == estimate
            ):
                return record
        except decimal.InvalidOperation:  # too many digits, infinite or a signalling NaN
            pass
        return self._rounded(record, cost, estimate)

    def _rounded(self, record: LedgerRecord, cost: Decimal | None, estimate: Decimal | None) -> LedgerRecord:
        """A copy with the costs the column changes replaced by their rounded form; ValueError
        (from `ExactDecimal.quantize`) for one that does not fit or is not finite."""
        rounded: dict[str, Decimal] = {}
        for name, value in ((self._cost, cost), (self._estimate, estimate)):
            if value is not None and (exact := self._money.quantize(value)) != value:
                rounded[name] = exact
        return msgspec.structs.replace(record, **rounded) if rounded else record

    def document(self, records: Sequence[LedgerRecord], lines: Sequence[bytes] | None = None) -> bytes:
        """The batch's JSON array: `lines` (each record's `RECORD_JSON` encoding) joined, with
        the records `encode` rounds encoded again; without `lines`, the records encoded here."""
        encode = self.encode
        if lines is None:
            return RECORD_JSON.encode([encode(record) for record in records])
        parts = [
            line if (exact := encode(record)) is record else RECORD_JSON.encode(exact)
            for record, line in zip(records, lines, strict=True)
        ]
        return json_array(parts)

    async def write(self, records: Sequence[LedgerRecord], lines: Sequence[bytes] | None = None) -> None:
        """One statement through asyncpg itself, on a connection the store keeps from the engine's
        pool: outside a transaction PostgreSQL runs a statement as its own, so the rows and their
        roll-ups still commit together. Per batch that leaves out a pool checkout, BEGIN and
        COMMIT round trips and SQLAlchemy's execution of a statement (≈ 900,000 instructions of
        the gateway's per batch, callgrind: a third of a request's at 12 rows a batch).

        asyncpg's errors are sorted here as SQLAlchemy sorted them: the connection lost, a
        missing table (not migrated yet), an interface or internal server error are the database
        failing (`LedgerUnavailable`), as is no answer in `WRITE_TIMEOUT_S` (a connection that
        stopped answering unclosed held the writer for good); any other is about the rows and
        propagates as it is. A failed write drops the connection; the next takes a new one."""
        document = self.document(records, lines)
        try:  # no connection is never the rows' fault (a database renamed, dropped, out of connections)
            driver = self._driver or await self._connect()
        except Exception as exc:
            raise LedgerUnavailable(f"cannot connect: {type(exc).__name__}: {exc}") from exc
        try:
            await driver.execute(self.sql, document, timeout=WRITE_TIMEOUT_S)  # TimeoutError: an outage
        except Exception as exc:
            closed = driver.is_closed()
            await self._drop()
            if closed or isinstance(exc, postgres_outages()):
                raise LedgerUnavailable(f"{type(exc).__name__}: {exc}") from exc
            raise

    async def _connect(self) -> Any:
        connection = await self._engine.connect()
        try:
            driver = (await connection.get_raw_connection()).driver_connection
        except BaseException:
            await connection.close()
            raise
        self._connection, self._driver = connection, driver
        return driver

    async def _drop(self) -> None:
        """Give the connection up without a round trip to a server that may be gone."""
        connection, self._connection, self._driver = self._connection, None, None
        if connection is not None:
            with contextlib.suppress(Exception):
                await connection.invalidate()
            with contextlib.suppress(Exception):
                await connection.close()

    async def close(self) -> None:
        """Return the connection to the engine's pool; a second call does nothing."""
        connection, self._connection, self._driver = self._connection, None, None
        if connection is not None:
            await connection.close()
