"""The PostgreSQL store's batch document built from the rows' journal lines: byte for byte the
document of the records themselves, and rows in the database equal to a SQLAlchemy Core insert of
the same records — costs that need rounding, other zones, None columns included."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path

import msgspec
import pytest
from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from catalog.journal import Journal
from catalog.ledger import LedgerWriter
from catalog.ledger_store import PostgresStore
from catalog.records import RECORD_JSON, LedgerRecord
from catalog.tables import ExactDecimal, LedgerRow
from tests.catalog.test_ledger_writer import FAILED, FULL, START, ledger, record

MONEY = ExactDecimal(30, 18)  # the ledger's cost columns
COLUMNS = tuple(LedgerRecord.__struct_fields__)
INDIA = timezone(timedelta(hours=5, minutes=30))
TIES = Decimal("12.3456789012345678905")  # a tie at the 19th decimal: half-even rounds it down
ROWS = [
    FULL,  # cost and estimate one object, exact at the column's scale
    FAILED,  # every optional column None
    record(3, cost_usd=TIES, estimated_cost_usd=TIES),  # one object, rounded once
    record(4, cost_usd=Decimal("0.0000166"), estimated_cost_usd=Decimal("0.00001666666666666666666")),
    record(5, cost_usd=Decimal("2.5000000000000000015"), estimated_cost_usd=Decimal("7E-7")),
    record(6, cost_usd=Decimal("1E-7"), cost_source="authoritative"),  # exponent form, no estimate
    record(7, estimated_cost_usd=Decimal("-0.0000000000000000005")),  # rounds to -0E-18
    record(8, cost_usd=Decimal("0.000016600000000000000"), estimated_cost_usd=Decimal("0")),  # trailing zeros
    record(9, started_at=datetime(2026, 11, 30, 14, 30, 5, 7, tzinfo=INDIA), finished_at=START),  # whole second
    record(10, finished_at=START.astimezone(timezone(timedelta(hours=-7))), usage_estimated=True, input_tokens=0),
    record(11, model="modèle-✓", upstream_request_id='req-"é😀\\n', ttft_ms=0.1 + 0.2),  # UTF-8, escapes, a float
]


def lines(records: list[LedgerRecord]) -> list[bytes]:
    return [RECORD_JSON.encode(item) for item in records]


@pytest.fixture
def store() -> PostgresStore:
    """Only the encoding is used: the engine never connects."""
    return PostgresStore(create_async_engine("postgresql+asyncpg://postgres@127.0.0.1:5432/test"), COLUMNS)


def test_the_document_from_lines_is_the_document_of_the_records(store: PostgresStore) -> None:
    assert store.document(ROWS, lines(ROWS)) == store.document(ROWS, None)
    assert store.document(ROWS[:1], lines(ROWS[:1])) == b"[" + RECORD_JSON.encode(FULL) + b"]"


def test_a_row_the_column_keeps_goes_as_the_very_line_handed_over(store: PostgresStore) -> None:
    """The lines are used, not encoded again: each given a leading space (the same JSON, bytes no
    encoder writes), the kept rows carry it into the document; the rows whose costs the column
    rounds are encoded again from their rounded copy."""
    spaced = [b" " + line for line in lines(ROWS)]
    rounded = {2, 3, 4, 6}
    expected = [
        RECORD_JSON.encode(store.encode(item)) if index in rounded else spaced[index] for index, item in enumerate(ROWS)
    ]
    assert store.document(ROWS, spaced) == b"[" + b",".join(expected) + b"]"


def test_only_costs_the_column_would_round_are_replaced(store: PostgresStore) -> None:
    """`encode` keeps the very record (so its line goes as it is) unless a cost changes at the
    column's scale; then exactly the changed costs are replaced by their half-even rounding."""
    exact = [store.encode(item) for item in ROWS]
    kept = [item for item, encoded in zip(ROWS, exact, strict=True) if encoded is item]
    assert [item.request_id for item in ROWS if item not in kept] == [ROWS[i].request_id for i in (2, 3, 4, 6)]
    documented = msgspec.json.decode(store.document(ROWS, lines(ROWS)), type=list[LedgerRecord])
    for item, stored in zip(ROWS, documented, strict=True):
        for name in ("cost_usd", "estimated_cost_usd"):
            value = getattr(item, name)
            expected = None if value is None else MONEY.quantize(value)
            assert getattr(stored, name) == expected
            if expected is not None and expected == value:
                assert str(getattr(stored, name)) == str(value)  # not rewritten
    assert documented[2].cost_usd == documented[2].estimated_cost_usd == Decimal("12.345678901234567890")


@pytest.mark.parametrize(
    "bad",
    [
        record(20, started_at=datetime(2026, 1, 1)),  # naive
        record(21, cost_usd=Decimal("1E+20")),  # more integer digits than the column holds
        record(22, estimated_cost_usd=Decimal("NaN")),
        record(23, cost_usd=Decimal("sNaN")),
        record(24, cost_usd=Decimal("-Infinity")),
    ],
)
def test_a_record_the_database_would_refuse_is_refused_from_lines_too(store: PostgresStore, bad: LedgerRecord) -> None:
    batch = [FULL, bad]
    with pytest.raises(ValueError):  # noqa: PT011 (the message names the value; the type is the contract)
        store.document(batch, lines(batch))
    with pytest.raises(ValueError):  # noqa: PT011
        store.document(batch, None)


async def test_rows_written_from_journal_lines_equal_a_core_insert_of_the_records(
    engine: AsyncEngine, tmp_path: Path
) -> None:
    """The writer's path with a journal (each row queued with its line, as the pipeline submits
    it) leaves, column for column, what SQLAlchemy's own insert of the same record leaves."""
    journal = Journal(tmp_path / "journal")
    journal.open()
    writer = LedgerWriter(engine, journal=journal, required=True)
    writer.start()
    for item in ROWS:
        writer.submit(item, RECORD_JSON.encode(item))
    await writer.flush()
    await writer.close()
    cores = [msgspec.structs.replace(item, request_id=f"core-{item.request_id}") for item in ROWS]
    async with engine.begin() as connection:
        await connection.execute(insert(LedgerRow), [msgspec.structs.asdict(item) for item in cores])
        result = await connection.exec_driver_sql("SELECT * FROM ledger")
        rows = {row[0]: row[1:] for row in result.all()}  # by request id: every other column
    assert len(rows) == 2 * len(ROWS)
    for item in ROWS:
        assert rows[item.request_id] == rows[f"core-{item.request_id}"]
    stored = {item.request_id: item for item in await ledger(engine)}
    assert stored[FAILED.request_id] == FAILED
    assert stored[ROWS[2].request_id].cost_usd == Decimal("12.345678901234567890")
    assert stored[ROWS[9].request_id].finished_at == START


async def test_records_refused_at_write_time_are_set_aside_from_the_journal_path(
    engine: AsyncEngine, tmp_path: Path
) -> None:
    """A batch holding a record the database would refuse is isolated row by row, each with its
    own line: only the bad ones are set aside."""
    journal = Journal(tmp_path / "journal")
    journal.open()
    writer = LedgerWriter(engine, journal=journal, required=True)
    writer.start()
    naive = record(5, started_at=datetime(2026, 1, 1))
    too_large = record(6, cost_usd=Decimal("1E+20"))
    rounded = ROWS[2]
    for item in (FULL, naive, rounded, too_large, FAILED):
        writer.submit(item, RECORD_JSON.encode(item))
    await writer.flush()
    exact = MONEY.quantize(TIES)
    assert await ledger(engine) == [
        FULL,
        FAILED,
        msgspec.structs.replace(rounded, cost_usd=exact, estimated_cost_usd=exact),
    ]
    assert writer.rejected == [naive, too_large]
    await writer.close()
    assert (tmp_path / "journal" / "rejected.jsonl").read_bytes().splitlines() == lines([naive, too_large])
