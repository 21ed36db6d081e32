"""A key's spend (`catalog.keys.spent_since`: `GET /api/v1/keys/me`, a budget's first admission in
a period) is the usage report's total for the key, so whole days and hours come from the roll-ups:
the sum of its rows' known costs in a period, exactly, on both databases — other keys' rows and
unpriced rows left out. Without an end (a `total` budget) a row a replica's clock dated ahead
counts; a day's or month's spend leaves out the rows of the next period, which count in it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from sqlalchemy.ext.asyncio import AsyncEngine

from catalog.keys import spent_since
from catalog.ledger_write import write_records
from tests.catalog.test_ledger_writer import record

NOW = datetime.now(UTC).replace(microsecond=0)
COSTS = [
    (NOW - timedelta(days=400), Decimal("1.000000000000000001")),  # a year ago: a daily roll-up
    (NOW - timedelta(days=3, minutes=7), Decimal("0.25")),
    (NOW - timedelta(hours=5), Decimal("0.000000000000000003")),  # an hourly roll-up
    (NOW - timedelta(seconds=30), Decimal("2.5")),  # this hour's raw rows
    (NOW + timedelta(days=2), Decimal("0.125")),  # a clock ahead
]


async def test_a_keys_spend_is_the_exact_sum_of_its_known_costs(engine: AsyncEngine) -> None:
    rows = [
        record(n, api_key_id="key_a", started_at=at, finished_at=at, cost_usd=cost)
        for n, (at, cost) in enumerate(COSTS)
    ]
    rows += [
        record(10, api_key_id="key_a", started_at=NOW, finished_at=NOW),  # unpriced
        record(11, api_key_id="key_b", started_at=NOW, finished_at=NOW, cost_usd=Decimal(7)),
    ]
    await write_records(engine, rows)
    assert await spent_since(engine, "key_a", None) == Decimal("3.875000000000000004")
    assert await spent_since(engine, "key_a", NOW - timedelta(days=3)) == Decimal("2.625000000000000003")
    assert await spent_since(engine, "key_a", NOW - timedelta(minutes=1)) == Decimal("2.625")
    assert await spent_since(engine, "key_a", NOW - timedelta(minutes=1), NOW + timedelta(days=1)) == Decimal("2.5")
    assert await spent_since(engine, "key_a", NOW + timedelta(days=2), NOW + timedelta(days=3)) == Decimal("0.125")
    assert await spent_since(engine, "key_b", None) == Decimal(7)
    assert await spent_since(engine, "key_c", None) == Decimal(0)
