"""`catalog.exact_sum.ExactSum`: SQL sums of money columns, exact on SQLite and PostgreSQL alike —
signs, 30 significant digits, and values a float cannot hold — against Python's own Decimal sum."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from sqlalchemy import select

from catalog.database import open_engine
from catalog.exact_sum import ExactSum, decimal_text
from catalog.ledger_write import write_records
from catalog.records import LedgerRecord
from catalog.tables import LedgerRow

VALUES = [
    "123456789012.123456789012345678",
    "-0.000000000000000001",
    "0.1",
    "0.2",
    "-123456789011.999999999999999999",
    "0.000000000000000007",
    "999999999999.999999999999999999",
]


async def test_sums_are_exact_with_signs_and_thirty_digits(report_db: str) -> None:
    at = datetime(2026, 4, 1, tzinfo=UTC)
    records = [
        LedgerRecord(
            request_id=f"r{n}",
            started_at=at + timedelta(seconds=n),
            finished_at=at + timedelta(seconds=n + 1),
            status="ok",
            streamed=False,
            latency_ms=1.0,
            provider="p" if n % 2 else "q",
            cost_usd=Decimal(value),
            estimated_cost_usd=None,
        )
        for n, value in enumerate(VALUES)
    ]
    engine = open_engine(report_db)
    try:
        await write_records(engine, records)
        cost = ExactSum(LedgerRow.cost_usd, "cost", engine.dialect.name)
        nothing = ExactSum(LedgerRow.estimated_cost_usd, "nothing", engine.dialect.name)
        query = select(LedgerRow.provider, *cost.columns, *nothing.columns).group_by(LedgerRow.provider)
        async with engine.connect() as connection:
            sums = {row.provider: (cost.read(row), nothing.read(row)) for row in await connection.execute(query)}
    finally:
        await engine.dispose()
    # q: 123456789012.123456789012345678 - 123456789011.999999999999999999 + 0.1
    #    + 999999999999.999999999999999999; p: -1e-18 + 0.2 + 7e-18 (31 digits: beyond a default
    #    Decimal context, let alone a float)
    expected = {"p": Decimal("0.200000000000000006"), "q": Decimal("1000000000000.223456789012345678")}
    assert sums == {"p": (expected["p"], None), "q": (expected["q"], None)}
    assert decimal_text(expected["q"]) == "1000000000000.223456789012345678"
    assert [decimal_text(Decimal(v)) for v in ("1.500", "-0.000", "100", "0E-18")] == ["1.5", "0", "100", "0"]
