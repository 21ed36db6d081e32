"""`LedgerWriter`: batched, idempotent, ordered, never dropping a row — asserted on real DB rows."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import asyncpg
import msgspec
import pytest
from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

import catalog.ledger_store
from catalog.ledger import LedgerWriter
from catalog.ledger_write import write_records
from catalog.migrate import upgrade_async
from catalog.records import LedgerRecord
from catalog.tables import ExactDecimal, LedgerRow
from tests.support.tcp_proxy import TcpProxy
from tests.support.waiting import wait_until

START = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)


def record(n: int, **changes: Any) -> LedgerRecord:
    fields: dict[str, Any] = {
        "request_id": f"019ad1c4-0000-7000-8000-{n:012d}",
        "started_at": START + timedelta(milliseconds=n),
        "finished_at": START + timedelta(milliseconds=n, seconds=2),
        "status": "ok",
        "streamed": True,
        "latency_ms": 2000.125,
        **changes,
    }
    return LedgerRecord(**fields)


FULL = record(
    1,
    api_key_id="key_1",
    model="gemma-4-31b",
    provider="fastrun",
    upstream_model="google/gemma-4-31b-it",
    upstream_request_id="chatcmpl-abc",
    stop_reason="tool_calls",
    input_tokens=42,
    output_tokens=17,
    reasoning_tokens=6,
    cache_read_tokens=128,
    cache_write_tokens=0,
    cost_usd=Decimal("0.0000166"),
    estimated_cost_usd=Decimal("0.0000166"),
    cost_source="estimated",
    price_id=3,
    ttft_ms=150.5,
    attempts=2,
)
FAILED = record(
    2, status="error", streamed=False, error_type="upstream_timeout", error_status=504, model="m", provider="p"
)


async def ledger(engine: AsyncEngine) -> list[LedgerRecord]:
    columns = [getattr(LedgerRow, name) for name in LedgerRecord.__struct_fields__]
    async with engine.connect() as connection:
        result = await connection.execute(select(*columns).order_by(LedgerRow.request_id))
        return [LedgerRecord(**row._asdict()) for row in result]


async def test_rows_are_written_with_every_column(engine: AsyncEngine) -> None:
    writer = LedgerWriter(engine)
    writer.start()
    writer.submit(FULL)
    writer.submit(FAILED)
    await writer.flush()
    assert await ledger(engine) == [FULL, FAILED]
    assert writer.pending == 0
    await writer.close()


async def test_unknown_usage_stays_null(engine: AsyncEngine) -> None:
    await write_records(engine, [FAILED])
    (row,) = await ledger(engine)
    assert (row.input_tokens, row.output_tokens, row.cost_usd, row.cost_source) == (None, None, None, None)


async def test_a_duplicate_request_id_is_written_once(engine: AsyncEngine) -> None:
    writer = LedgerWriter(engine)
    writer.start()
    writer.submit(FULL)
    writer.submit(record(1, status="cancelled"))
    await writer.flush()
    writer.submit(FULL)
    await writer.flush()
    await write_records(engine, [FULL, FAILED])
    assert await ledger(engine) == [FULL, FAILED]
    await writer.close()


@pytest.fixture
def batches(engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of every ledger INSERT transaction, as the database saw it: on PostgreSQL the rows
    in the statement's JSON document (asyncpg's `execute`, which the store calls), on SQLite the
    rows in each batch document written to the SQLite writer's process (its pipe: each document is
    one transaction there, `catalog.sqlite_child`)."""
    sizes: list[int] = []
    if engine.dialect.name == "postgresql":
        execute = asyncpg.Connection.execute

        async def count(self: asyncpg.Connection, query: str, *args: Any, **kwargs: Any) -> str:
            if "INSERT INTO ledger" in query:  # the roll-up upsert wraps it (catalog.rollup)
                sizes.append(len(msgspec.json.decode(args[0])))
            return await execute(self, query, *args, **kwargs)

        monkeypatch.setattr(asyncpg.Connection, "execute", count)
        return sizes
    write = asyncio.StreamWriter.write

    def traced(self: asyncio.StreamWriter, data: bytes) -> None:
        if data[:2] == b"[{":  # a batch document (the setup frame is an object, the heads are lengths)
            sizes.append(len(msgspec.json.decode(data)))
        write(self, data)

    monkeypatch.setattr(asyncio.StreamWriter, "write", traced)
    return sizes


async def test_many_rows_are_written_in_batches(engine: AsyncEngine, batches: list[int]) -> None:
    writer = LedgerWriter(engine, batch_size=100, flush_interval=10.0)
    writer.start()
    records = [record(n) for n in range(1000)]
    for item in records:
        writer.submit(item)
    await writer.flush()
    assert batches == [100] * 10
    assert await ledger(engine) == records
    await writer.close()


async def test_full_batches_leave_at_once_and_the_rest_waits_for_the_interval(
    engine: AsyncEngine, batches: list[int]
) -> None:
    """Rows that arrive while a batch is being written do not go out as a small batch of their
    own: they wait for a full batch, the flush interval, or `flush()`."""
    writer = LedgerWriter(engine, batch_size=100, flush_interval=0.5)
    writer.start()
    records = [record(n) for n in range(250)]
    for item in records:
        writer.submit(item)
    # the two full batches are written without waiting for the interval
    await wait_until(lambda: writer.pending == 50, within=1.0)
    assert (batches, writer.pending) == ([100, 100], 50)
    await asyncio.sleep(0.2)  # the behaviour under test: 0.2 s pass and the 50 do not leave
    assert writer.pending == 50  # not yet: neither a full batch nor the interval
    await wait_until(lambda: writer.pending == 0, within=0.6)  # the interval passes
    assert (batches, writer.pending) == ([100, 100, 50], 0)
    assert await ledger(engine) == records
    await writer.close()


async def test_a_full_queue_overflows_without_losing_or_reordering(engine: AsyncEngine) -> None:
    writer = LedgerWriter(engine, max_queue=5, batch_size=3)
    writer.start()
    records = [record(n) for n in range(23)]
    for item in records:
        writer.submit(item)
    assert writer.pending == 23
    await writer.flush()
    assert await ledger(engine) == records
    await writer.close()


async def test_close_drains_without_flush(engine: AsyncEngine) -> None:
    writer = LedgerWriter(engine, flush_interval=10.0)
    writer.start()
    writer.submit(FULL)
    await writer.close()
    assert await ledger(engine) == [FULL]
    with pytest.raises(RuntimeError, match="closed"):
        writer.submit(FAILED)
    await writer.close()  # a second close (a shutdown hook run twice) is harmless


class CountingFailures(LedgerWriter):
    """Counts failed writes through the writer's own hook for them."""

    failures = 0

    def _on_write_failure(self, batch: Sequence[LedgerRecord], exc: Exception, attempt: int) -> float:
        self.failures += 1
        return super()._on_write_failure(batch, exc, attempt)


async def test_rows_wait_out_a_database_that_is_not_ready(fresh_url: Callable[[], Awaitable[str]]) -> None:
    url = await fresh_url()
    engine = create_async_engine(url)
    writer = CountingFailures(engine, flush_interval=0.01)
    writer.start()
    writer.submit(FULL)
    await wait_until(lambda: writer.failures >= 2)  # the table does not exist yet: the batch fails, is retried
    assert writer.pending == 1
    await upgrade_async(url)
    await asyncio.wait_for(writer.flush(), timeout=10)
    assert await ledger(engine) == [FULL]
    await writer.close()
    await engine.dispose()


async def test_records_the_database_would_refuse_are_set_aside_at_write_time(engine: AsyncEngine) -> None:
    """Encoding happens per batch, so a bad record is found there: it is kept in `rejected`, not
    written, and the rows around it are written."""
    writer = LedgerWriter(engine)
    writer.start()
    naive = record(5, started_at=datetime(2026, 1, 1))
    too_large = record(6, cost_usd=Decimal("1E+20"))
    for item in (FULL, naive, too_large, FAILED):
        writer.submit(item)
    await asyncio.wait_for(writer.flush(), timeout=10)
    assert await ledger(engine) == [FULL, FAILED]
    assert writer.rejected == [naive, too_large]
    assert writer.pending == 0
    await writer.close()


async def test_close_without_start_still_writes(engine: AsyncEngine) -> None:
    writer = LedgerWriter(engine)
    writer.submit(FULL)
    with pytest.raises(RuntimeError, match="never started"):
        await writer.flush()
    await writer.close()
    assert await ledger(engine) == [FULL]


async def test_a_row_the_database_refuses_is_set_aside_not_retried_forever(engine: AsyncEngine) -> None:
    writer = LedgerWriter(engine)
    writer.start()
    bad = record(3, error_status=2**64)  # too large for the INTEGER column on both databases
    writer.submit(FULL)
    writer.submit(bad)
    writer.submit(FAILED)
    await asyncio.wait_for(writer.flush(), timeout=10)
    assert await ledger(engine) == [FULL, FAILED]
    assert writer.rejected == [bad]
    await writer.close()


@pytest.mark.parametrize(
    ("started_at", "cost"),
    [
        (START, Decimal("0.0000166")),  # a whole second: the fraction is still stored
        (datetime(2026, 11, 30, 14, 30, 5, 7, tzinfo=timezone(timedelta(hours=5, minutes=30))), Decimal("1E-7")),
        (START + timedelta(microseconds=999_999), Decimal("12.3456789012345678905")),  # rounded half-even
    ],
)
async def test_writer_rows_store_exactly_what_the_table_types_store(
    engine: AsyncEngine, started_at: datetime, cost: Decimal
) -> None:
    """The writer's driver-level rows and a SQLAlchemy Core insert of the same record leave the
    same values in every column, on SQLite (timestamps as UTC text, exact decimals in fixed
    notation) and on PostgreSQL (timestamptz, NUMERIC)."""
    fast = record(1, started_at=started_at, finished_at=started_at, cost_usd=cost, estimated_cost_usd=cost)
    core = msgspec.structs.replace(fast, request_id="core")
    await write_records(engine, [fast])
    async with engine.begin() as connection:
        await connection.execute(insert(LedgerRow), [msgspec.structs.asdict(core)])
        result = await connection.exec_driver_sql("SELECT * FROM ledger ORDER BY request_id = 'core'")
        written, expected = (row[1:] for row in result.all())
    assert written == expected
    exact = ExactDecimal(30, 18).quantize(cost)
    utc = started_at.astimezone(UTC)
    assert (await ledger(engine))[0] == msgspec.structs.replace(
        fast, started_at=utc, finished_at=utc, cost_usd=exact, estimated_cost_usd=exact
    )


@pytest.mark.parametrize("url", ["sqlite+aiosqlite://", "sqlite+aiosqlite:///:memory:"])
async def test_a_database_only_the_engine_reaches_is_written_through_the_engine(url: str) -> None:
    """An in-memory SQLite database exists only on the engine's connection: the writer uses it
    (a second connection of its own would write into a database nobody reads)."""
    engine = create_async_engine(url)
    async with engine.begin() as connection:
        await connection.run_sync(LedgerRow.metadata.create_all)
    writer = LedgerWriter(engine)
    writer.start()
    for item in (FULL, FAILED, FULL):
        writer.submit(item)
    await writer.close()
    assert await ledger(engine) == [FULL, FAILED]
    await engine.dispose()


@pytest.mark.parametrize("engine", ["postgresql"], indirect=True)  # SQLite's store opens its file per thread
async def test_a_postgresql_connection_closed_by_the_server_is_replaced_not_blamed_on_the_rows(
    engine: AsyncEngine,
) -> None:
    """The PostgreSQL store keeps one connection between batches; one the server ended meanwhile
    (a restart, an idle timeout, an administrator) is a passing outage: the next batch goes
    through a new connection, and no row is set aside."""
    assert engine.dialect.name == "postgresql"
    writer = LedgerWriter(engine, flush_interval=0.01)
    writer.start()
    writer.submit(FULL)
    await asyncio.wait_for(writer.flush(), timeout=10)
    async with engine.connect() as connection:
        ended = await connection.exec_driver_sql(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        assert ended.scalars().all() == [True]  # the writer's connection, the only other one
    writer.submit(FAILED)
    await asyncio.wait_for(writer.flush(), timeout=10)
    assert await ledger(engine) == [FULL, FAILED]
    assert writer.rejected == []
    await writer.close()


@pytest.mark.parametrize("engine", ["postgresql"], indirect=True)
async def test_a_postgresql_connection_that_stops_answering_is_an_outage_not_a_hang(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A connection that never answers again, though not closed (a flow a firewall forgot, a
    pooler holding the query), hung the writer for good: no outage logged, and no row written
    while every new connection reached the database. A statement has `WRITE_TIMEOUT_S` to
    answer; then the connection is dropped and the batch goes through a new one."""
    monkeypatch.setattr(catalog.ledger_store, "WRITE_TIMEOUT_S", 0.5)
    with TcpProxy(engine.url.port or 5432) as proxy:
        through = create_async_engine(engine.url.set(port=proxy.port))
        writer = LedgerWriter(through, flush_interval=0.01)
        writer.start()
        writer.submit(FULL)
        await asyncio.wait_for(writer.flush(), timeout=10)
        proxy.stall()  # the writer's connection: new connections flow
        writer.submit(FAILED)
        await asyncio.wait_for(writer.flush(), timeout=10)
        assert await ledger(engine) == [FULL, FAILED]
        assert writer.rejected == []
        await writer.close()
        await through.dispose()
