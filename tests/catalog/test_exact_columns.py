"""Money and time round-trip exactly through SQLite and PostgreSQL (`catalog.tables` types)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal

import pytest
from sqlalchemy import insert, select
from sqlalchemy.exc import StatementError
from sqlalchemy.ext.asyncio import AsyncEngine

from catalog.tables import LedgerRow, Price

START = datetime(2026, 5, 4, 3, 2, 1, 123456, tzinfo=UTC)


def ledger_row(request_id: str, cost: Decimal | None, started: datetime = START) -> dict[str, object]:
    return {
        "request_id": request_id,
        "started_at": started,
        "finished_at": started,
        "streamed": False,
        "status": "ok",
        "latency_ms": 1.5,
        "attempts": 1,
        "cost_usd": cost,
    }


async def roundtrip_cost(engine: AsyncEngine, cost: Decimal) -> Decimal | None:
    async with engine.begin() as connection:
        await connection.execute(insert(LedgerRow).values(ledger_row("r", cost)))
        return (await connection.execute(select(LedgerRow.cost_usd))).scalar_one()


@pytest.mark.parametrize(
    "cost",
    [
        Decimal("0.000000123456789012"),
        Decimal("123456789012.123456789012345678"),
        Decimal("0.0000262"),
        Decimal("0"),
        Decimal("1E-18"),
    ],
)
async def test_cost_round_trips_exactly(engine: AsyncEngine, cost: Decimal) -> None:
    back = await roundtrip_cost(engine, cost)
    assert isinstance(back, Decimal)
    assert back == cost
    assert back.as_tuple().exponent == -18  # the column's scale on both databases


async def test_digits_past_the_scale_round_half_even_on_both(engine: AsyncEngine) -> None:
    assert await roundtrip_cost(engine, Decimal("0.000000123456789012345678")) == Decimal("0.000000123456789012")


async def test_too_many_integer_digits_are_refused(engine: AsyncEngine) -> None:
    with pytest.raises(StatementError, match="more than 12 integer digits"):
        await roundtrip_cost(engine, Decimal("1234567890123"))


async def test_prices_round_trip_exactly(engine: AsyncEngine) -> None:
    amounts = {
        "input": Decimal("0.0000000001"),
        "output": Decimal("9999999999.9999999999"),
        "cache_read": Decimal("0.025"),
        "cache_write": None,
        "reasoning": Decimal("3"),
    }
    async with engine.begin() as connection:
        await connection.execute(insert(Price).values(provider="p", model_id="m", effective_from=START, **amounts))
        row = (await connection.execute(select(Price))).one()
    assert {key: getattr(row, key) for key in amounts} == amounts
    assert row.effective_from == START
    assert row.effective_from.tzinfo is not None


async def test_datetimes_are_stored_as_utc_and_come_back_aware(engine: AsyncEngine) -> None:
    paris = START.astimezone(timezone(timedelta(hours=2)))
    async with engine.begin() as connection:
        await connection.execute(insert(LedgerRow).values(ledger_row("r", None, paris)))
        back = (await connection.execute(select(LedgerRow.started_at))).scalar_one()
        later = (
            (
                await connection.execute(
                    select(LedgerRow.request_id).where(LedgerRow.started_at > START - timedelta(microseconds=1))
                )
            )
            .scalars()
            .all()
        )
    assert back == START
    assert back.utcoffset() == timedelta(0)
    assert later == ["r"]


async def test_naive_datetimes_are_refused(engine: AsyncEngine) -> None:
    with pytest.raises(StatementError, match="naive datetime"):
        async with engine.begin() as connection:
            await connection.execute(insert(LedgerRow).values(ledger_row("r", None, datetime(2026, 1, 1))))


@pytest.mark.parametrize("cost", [Decimal("123456789012.123456789012345678"), Decimal("0.123456789012345678")])
async def test_the_ledger_writers_path_keeps_every_digit(engine: AsyncEngine, cost: Decimal) -> None:
    """`write_records` (the batched writer's path: driver executemany on SQLite) stores the same
    exact text as the SQLAlchemy path; a float anywhere on the way would lose these digits."""
    from catalog.ledger_write import write_records
    from catalog.records import LedgerRecord

    record = LedgerRecord(
        request_id="exact-1",
        started_at=START,
        finished_at=START + timedelta(microseconds=7),
        status="ok",
        streamed=True,
        latency_ms=1.5,
        cost_usd=cost,
        estimated_cost_usd=cost,
        input_tokens=3,
    )
    await write_records(engine, [record, record])  # the second is a duplicate: skipped
    async with engine.connect() as connection:
        rows = (await connection.execute(select(LedgerRow))).all()
    (row,) = rows
    assert (row.cost_usd, row.estimated_cost_usd) == (cost, cost)
    assert (row.started_at, row.finished_at) == (START, START + timedelta(microseconds=7))
    assert (row.streamed, row.input_tokens, row.output_tokens) == (True, 3, None)
