"""The daily roll-up (`usage_daily`, migration 0006), on SQLite and PostgreSQL: the ledger stores
keep it — and the hourly one — exactly equal to the sums of the ledger rows, money to the last
decimal, a row counted in the UTC day its request started (also when it finished after midnight,
or was stamped in another time zone); and the usage report reads whole days from it.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import asyncpg
import msgspec
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from catalog.database import open_engine
from catalog.ledger_write import write_records
from catalog.migrate import upgrade_async
from catalog.records import LedgerRecord
from catalog.usage_query import parse_query
from catalog.usage_report import usage_report
from tests.catalog.conftest import PG_ADMIN_DSN, NewDatabase
from tests.catalog.usage_oracle import expected, expected_rollup, ledger_rows, rollup_rows, seeded_records

NOW = datetime(2026, 12, 1, tzinfo=UTC)
MIDNIGHT = datetime(2026, 11, 29, tzinfo=UTC)


def _record(n: int, started: datetime, cost: str | None, **fields: Any) -> LedgerRecord:
    price = None if cost is None else Decimal(cost)
    return LedgerRecord(
        request_id=f"night-{n}",
        started_at=started,
        finished_at=started + timedelta(seconds=2),
        status="ok",
        streamed=False,
        latency_ms=2000.0,
        api_key_id="key-n",
        model="gemma",
        provider="local",
        input_tokens=10 + n,
        output_tokens=n,
        cost_usd=price,
        estimated_cost_usd=price,
        cost_source=None if price is None else "authoritative" if n % 2 else "estimated",
        **fields,
    )


def _around_midnight() -> list[LedgerRecord]:
    """Rows in the last hour of Nov 28 (one finishing on Nov 29) and the first of Nov 29 (UTC)."""
    late = MIDNIGHT - timedelta(microseconds=1)
    return [
        _record(0, late, "0.000000000000000001"),  # 23:59:59.999999, finished 00:00:01.999999
        _record(1, MIDNIGHT - timedelta(minutes=30), "1.999999999999999999"),
        _record(2, MIDNIGHT, "0.5"),  # exactly midnight: the new day
        _record(3, MIDNIGHT + timedelta(minutes=59, seconds=59), None),
        # 00:30 at +02:00 is 22:30 UTC the day before: the UTC day counts, not the stamp's zone
        _record(4, datetime(2026, 11, 29, 0, 30, tzinfo=timezone(timedelta(hours=2))), "0.25"),
        _record(5, MIDNIGHT + timedelta(hours=1), "3", api="openai_chat"),
    ]


async def test_rows_around_midnight_are_counted_in_their_utc_day(engine: AsyncEngine) -> None:
    records = _around_midnight()
    await write_records(engine, records[:3])
    await write_records(engine, [records[2], *records[2:]])  # a replay and a request id twice
    rows = await ledger_rows(engine)
    assert len(rows) == 6
    daily = await rollup_rows(engine, "day")
    assert daily == expected_rollup(rows, "day")
    assert await rollup_rows(engine, "hour") == expected_rollup(rows, "hour")
    assert await rollup_rows(engine, "hour_models") == expected_rollup(rows, "hour_models")
    nov28 = daily[(MIDNIGHT - timedelta(days=1), "gemma", "local", "key-n", "", "", "ok")]
    nov29 = daily[(MIDNIGHT, "gemma", "local", "key-n", "", "", "ok")]
    # requests, unpriced, input … cache_write, cost, authoritative (rows 1 and 5 of the night)
    assert nov28 == (3, 0, 10 + 11 + 14, 0 + 1 + 4, 0, 0, 0, Decimal("2.25"), Decimal("1.999999999999999999"))
    assert nov29 == (2, 1, 12 + 13, 2 + 3, 0, 0, 0, Decimal("0.5"), None)


async def test_both_roll_ups_hold_exactly_the_ledgers_sums(engine: AsyncEngine) -> None:
    """Every group of every level, every column, after replays and batches holding an id twice."""
    records = seeded_records()
    await write_records(engine, records[:250])
    await write_records(engine, records[200:450])
    await write_records(engine, [records[450], *records[450:]])
    rows = await ledger_rows(engine)
    assert len(rows) == 600
    daily, hourly = await rollup_rows(engine, "day"), await rollup_rows(engine, "hour")
    assert daily == expected_rollup(rows, "day")
    assert hourly == expected_rollup(rows, "hour")
    assert len({key[0] for key in daily}) == 4  # Nov 27 … Nov 30
    assert sum(sums[0] for sums in daily.values()) == 600
    assert len(daily) < len(hourly)  # some day groups sum rows of several hours
    assert await rollup_rows(engine, "hour_models") == expected_rollup(rows, "hour_models")


async def test_a_report_reads_whole_days_from_the_daily_roll_up(engine: AsyncEngine) -> None:
    """Add a request to one day's roll-up row only: a report covering that day whole sees it, one
    reading the same day by hours (grouped by hour, or not covering it whole) does not."""
    await write_records(engine, seeded_records())
    rows = await ledger_rows(engine)
    async with engine.begin() as connection:
        changed = await connection.execute(
            text(
                "UPDATE usage_daily SET requests = requests + 1 WHERE day = :day AND model = 'gemma' AND status = 'ok'"
            ),
            {"day": "2026-11-29 00:00:00.000000" if engine.dialect.name == "sqlite" else MIDNIGHT},
        )
        assert changed.rowcount > 0
    whole = {"from": "2026-11-28T07:00:00Z", "to": "2026-11-30T05:00:00Z"}
    for params in ({**whole, "group_by": "hour"}, {"from": "2026-11-29T00:00:01Z", "to": "2026-11-30"}):
        query = parse_query(params, NOW)
        assert msgspec.to_builtins(await usage_report(engine, query))["totals"] == expected(rows, query)["totals"]
    query = parse_query({**whole, "group_by": "model"}, NOW)
    answer = msgspec.to_builtins(await usage_report(engine, query))
    assert answer["totals"]["requests"] == expected(rows, query)["totals"]["requests"] + changed.rowcount


@pytest.mark.parametrize(
    "period",
    [
        {"from": "2026-11-28", "to": "2026-11-30"},  # whole days only
        {"from": "2026-11-27T22:00:00Z", "to": "2026-11-30T05:00:00Z"},  # whole hours, then whole days
        {"from": "2026-11-27T21:13:14.5Z", "to": "2026-11-30T22:59:59.999999Z"},  # all three sources
        {"from": "2026-11-28", "to": "2026-11-29T03:30:00Z"},  # a whole day from midnight, then hours
        {"from": "2026-11-28T01:30:00Z", "to": "2026-11-28T23:30:00Z"},  # a day's hours, no whole day
        {"from": "2026-11-27T23:59:59Z", "to": "2026-11-29T00:00:01Z"},  # a day between two seconds
    ],
)
async def test_periods_made_of_days_hours_and_partial_hours(engine: AsyncEngine, period: dict[str, str]) -> None:
    records = [*seeded_records(), *_around_midnight()]
    await write_records(engine, records[:300])
    await write_records(engine, records[250:])
    rows = await ledger_rows(engine)
    for group_by in ("", "day", "day,model", "hour", "key,api,status", "owner,provider"):
        query = parse_query({**period, "group_by": group_by}, NOW)
        answer = msgspec.to_builtins(await usage_report(engine, query))
        assert {k: answer[k] for k in ("group_by", "rows", "totals")} == expected(rows, query), (period, group_by)


async def test_buckets_are_utc_whatever_the_sessions_time_zone(fresh_url: NewDatabase) -> None:
    """PostgreSQL sessions in Pacific/Chatham (UTC+13:45, so its hours and days start elsewhere):
    the roll-ups' hours and days, and the report's, are still UTC."""
    url = await fresh_url()
    if url.startswith("postgresql"):
        admin = await asyncpg.connect(PG_ADMIN_DSN)
        try:
            await admin.execute(f"ALTER DATABASE \"{url.rsplit('/', 1)[1]}\" SET timezone TO 'Pacific/Chatham'")
        finally:
            await admin.close()
    await upgrade_async(url)
    engine = open_engine(url)
    try:
        await write_records(engine, [*seeded_records(300, seed=7), *_around_midnight()])
        rows = await ledger_rows(engine)
        assert await rollup_rows(engine, "day") == expected_rollup(rows, "day")
        assert await rollup_rows(engine, "hour") == expected_rollup(rows, "hour")
        assert await rollup_rows(engine, "hour_models") == expected_rollup(rows, "hour_models")
        for group_by in ("day,model", "hour", "provider", "hour,key"):
            query = parse_query(
                {"from": "2026-11-27T21:40:00Z", "to": "2026-11-30T20:20:00Z", "group_by": group_by}, NOW
            )
            answer = msgspec.to_builtins(await usage_report(engine, query))
            assert {k: answer[k] for k in ("group_by", "rows", "totals")} == expected(rows, query), group_by
    finally:
        await engine.dispose()
