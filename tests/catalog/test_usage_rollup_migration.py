"""Migration 0005 on a ledger that already has rows: the roll-up it builds holds exactly their sums,
so reports over the old rows are right from the first request after the upgrade."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

import msgspec
from sqlalchemy import insert
from sqlalchemy.ext.asyncio import create_async_engine

from catalog import migrate
from catalog.tables import LedgerRow
from catalog.usage_query import parse_query
from catalog.usage_report import usage_report
from tests.catalog.usage_oracle import expected, ledger_rows, seeded_records


async def test_the_upgrade_rolls_up_the_existing_rows(fresh_url: Callable[[], Awaitable[str]]) -> None:
    url = await fresh_url()
    await migrate.upgrade_async(url, "0003")
    rows = [msgspec.structs.asdict(record) for record in seeded_records(300, seed=5)]
    for row in rows:
        del row["owner"]  # not a column before 0005
    engine = create_async_engine(url)
    try:
        async with engine.begin() as connection:
            await connection.execute(insert(LedgerRow.__table__), rows)
        await migrate.upgrade_async(url)
        ledger = await ledger_rows(engine)
        for params in ({"group_by": "hour,model"}, {"group_by": "key,status"}, {"group_by": "owner,api"}):
            query = parse_query({"from": "2026-11-27T21:00:00Z", "to": "2026-12-01", **params}, datetime.now(UTC))
            answer = msgspec.to_builtins(await usage_report(engine, query))
            assert {k: answer[k] for k in ("group_by", "rows", "totals")} == expected(ledger, query)
            assert answer["totals"]["requests"] == 300
    finally:
        await engine.dispose()
