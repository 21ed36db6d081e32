"""Migrations 0005 (hourly roll-up), 0006 (daily roll-up), 0007 (hourly roll-up per model) and 0008
(hourly roll-up per model and status) on a ledger that already has rows: the roll-ups they build
hold exactly the rows' sums, so reports over the old rows are right from the first request after
the upgrade."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import msgspec
from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from catalog import migrate
from catalog.rollup import KEY, SUMS
from catalog.tables import LedgerRow, UsageDaily, UsageHourly, UsageHourlyModels
from catalog.usage_query import parse_query
from catalog.usage_report import usage_report
from tests.catalog.usage_oracle import LEVELS, expected, expected_rollup, ledger_rows, rollup_rows, seeded_records


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
        await engine.dispose()  # stopped first: the upgrade refuses while another session is connected
        await migrate.upgrade_async(url)
        ledger = await ledger_rows(engine)
        for level in LEVELS:
            assert await rollup_rows(engine, level) == expected_rollup(ledger, level), level
        for params in ({"group_by": "hour,model"}, {"group_by": "key,status"}, {"group_by": "owner,api"}):
            query = parse_query({"from": "2026-11-27T21:00:00Z", "to": "2026-12-01", **params}, datetime.now(UTC))
            answer = msgspec.to_builtins(await usage_report(engine, query))
            assert {k: answer[k] for k in ("group_by", "rows", "totals")} == expected(ledger, query)
            assert answer["totals"]["requests"] == 300
    finally:
        await engine.dispose()


async def test_the_daily_upgrade_sums_the_hourly_roll_up(fresh_url: Callable[[], Awaitable[str]]) -> None:
    """A database at 0005 whose ledger and hourly roll-up the stores kept (owners included): after
    0006, every day group of `usage_daily` is the sum of the ledger rows of that UTC day."""
    url = await fresh_url()
    await migrate.upgrade_async(url, "0005")
    engine = create_async_engine(url)
    try:
        async with engine.begin() as connection:
            records = seeded_records(400, seed=11)
            busy = {"model": "gemma", "provider": "local", "api_key_id": "key-a", "owner": "team-x", "api": "unified"}
            records[::2] = [msgspec.structs.replace(record, **busy) for record in records[::2]]  # groups of many rows
            await connection.execute(insert(LedgerRow.__table__), [msgspec.structs.asdict(r) for r in records])
        ledger = await ledger_rows(engine)
        hourly = [
            dict(zip((*KEY, *SUMS), (*key, *sums), strict=True))
            for key, sums in expected_rollup(ledger, "hour").items()
        ]
        async with engine.begin() as connection:
            await connection.execute(insert(UsageHourly.__table__), hourly)
        await engine.dispose()  # stopped first: the upgrade refuses while another session is connected
        await migrate.upgrade_async(url)
        daily = await rollup_rows(engine, "day")
        assert daily == expected_rollup(ledger, "day")
        assert sum(sums[0] for sums in daily.values()) == 400
        assert max(sums[0] for sums in daily.values()) > 20
        for group_by in ("", "day,owner", "key,api,status"):
            query = parse_query({"from": "2026-11-28", "to": "2026-11-30", "group_by": group_by}, datetime.now(UTC))
            answer = msgspec.to_builtins(await usage_report(engine, query))
            assert {k: answer[k] for k in ("group_by", "rows", "totals")} == expected(ledger, query)
    finally:
        await engine.dispose()


async def test_the_model_upgrade_sums_the_hourly_roll_up(fresh_url: Callable[[], Awaitable[str]]) -> None:
    """A database at 0006 whose ledger and roll-ups the stores kept: after 0007, every group of
    `usage_hourly_models` is the sum of the ledger rows of that hour, model, provider and status,
    over all keys, owners and apis; reports grouped by hour read it at once."""
    url = await fresh_url()
    await migrate.upgrade_async(url, "0006")
    engine = create_async_engine(url)
    try:
        records = seeded_records(400, seed=13)
        busy = {"model": "llama", "provider": "fastrun", "api": "openai_chat", "status": "ok"}
        records[::2] = [msgspec.structs.replace(record, **busy) for record in records[::2]]  # many keys a group
        async with engine.begin() as connection:
            await connection.execute(insert(LedgerRow.__table__), [msgspec.structs.asdict(r) for r in records])
        ledger = await ledger_rows(engine)
        await seed_levels(engine, ledger, ((UsageHourly, "hour"), (UsageDaily, "day")))
        await engine.dispose()  # stopped first: the upgrade refuses while another session is connected
        await migrate.upgrade_async(url)
        models = await rollup_rows(engine, "hour_models")
        assert models == expected_rollup(ledger, "hour_models")
        assert sum(sums[0] for sums in models.values()) == 400
        assert len(models) < len(expected_rollup(ledger, "hour"))
        await assert_reports(engine, ledger, ("hour", "hour,model,api", "hour,key", ""))
    finally:
        await engine.dispose()


async def test_the_model_status_upgrade_sums_the_hourly_roll_up(fresh_url: Callable[[], Awaitable[str]]) -> None:
    """A database at 0007 whose ledger and roll-ups the stores kept: after 0008, every group of
    `usage_hourly_model_status` is the sum of the ledger rows of that hour, model and status, over
    all providers, keys, owners and apis — negative and 18-decimal costs and groups without a cost
    included, exactly —; reports that need no provider read it at once."""
    url = await fresh_url()
    await migrate.upgrade_async(url, "0007")
    engine = create_async_engine(url)
    try:
        records = seeded_records(400, seed=17)
        busy = {"model": "qwen", "api_key_id": "key-b", "status": "ok"}  # every provider, many a group
        records[::2] = [msgspec.structs.replace(record, **busy) for record in records[::2]]
        refunds = {"cost_usd": Decimal("-0.000000000000000007"), "cost_source": "authoritative"}
        records[1::9] = [msgspec.structs.replace(record, **refunds) for record in records[1::9]]
        async with engine.begin() as connection:
            await connection.execute(insert(LedgerRow.__table__), [msgspec.structs.asdict(r) for r in records])
        ledger = await ledger_rows(engine)
        await seed_levels(
            engine, ledger, ((UsageHourly, "hour"), (UsageHourlyModels, "hour_models"), (UsageDaily, "day"))
        )
        await engine.dispose()  # stopped first: the upgrade refuses while another session is connected
        await migrate.upgrade_async(url)
        statuses = await rollup_rows(engine, "hour_model_status")
        assert statuses == expected_rollup(ledger, "hour_model_status")
        assert sum(sums[0] for sums in statuses.values()) == 400
        assert len(statuses) < len(expected_rollup(ledger, "hour_models"))
        assert any(sums[-1] is not None and sums[-1] < 0 for sums in statuses.values())  # refunds only
        await assert_reports(engine, ledger, ("hour", "hour,model,status", "hour,provider", "hour,key", ""))
    finally:
        await engine.dispose()


async def seed_levels(engine: AsyncEngine, ledger: list[dict[str, Any]], levels: tuple[tuple[Any, str], ...]) -> None:
    """The roll-up levels as the stores kept them before the upgrade: each holds the oracle's sums."""
    for table, level in levels:
        rolled = [
            dict(zip(table.__table__.c.keys(), (*k, *s), strict=True))
            for k, s in expected_rollup(ledger, level).items()
        ]
        async with engine.begin() as connection:
            await connection.execute(insert(table.__table__), rolled)


async def assert_reports(engine: AsyncEngine, ledger: list[dict[str, Any]], group_bys: tuple[str, ...]) -> None:
    """Each report over [2026-11-28T01:30Z, 2026-11-30) equals the oracle's aggregate of `ledger`."""
    for group_by in group_bys:
        query = parse_query(
            {"from": "2026-11-28T01:30:00Z", "to": "2026-11-30", "group_by": group_by}, datetime.now(UTC)
        )
        answer = msgspec.to_builtins(await usage_report(engine, query))
        assert {k: answer[k] for k in ("group_by", "rows", "totals")} == expected(ledger, query), group_by
