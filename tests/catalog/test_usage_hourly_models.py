"""The hourly roll-ups per model (`usage_hourly_models`, migration 0007, and
`usage_hourly_model_status`, migration 0008), on SQLite and PostgreSQL: the ledger stores keep
them exactly equal to the sums of the ledger rows per hour x model x provider x status and per
hour x model x status — after replays, batches holding a request id twice and concurrent writers
— and a report reads its hours from the smallest of them holding what it groups by and filters
on: `usage_hourly_model_status` unless it needs the provider, `usage_hourly_models` unless it
needs a key, an owner or an api (or is restricted to a key), else `usage_hourly`.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest
from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncEngine

from catalog.ledger_write import write_records
from catalog.tables import UsageHourly, UsageHourlyModels, UsageHourlyModelStatus
from catalog.usage_query import parse_query
from catalog.usage_report import usage_report
from tests.catalog.usage_oracle import LEVELS, expected, expected_rollup, ledger_rows, rollup_rows, seeded_records

NOW = datetime(2026, 12, 1, tzinfo=UTC)
# Whole hours of Nov 28 (read from an hourly level), Nov 29 whole (daily), partial hours at both ends.
PERIOD = {"from": "2026-11-28T03:17:42.5Z", "to": "2026-11-30T16:45:00Z"}
TAMPERED_HOUR = datetime(2026, 11, 28, 10, tzinfo=UTC)


async def _levels_match_the_ledger(engine: AsyncEngine, count: int) -> dict[str, dict[Any, tuple[Any, ...]]]:
    rows = await ledger_rows(engine)
    assert len(rows) == count
    levels = {level: await rollup_rows(engine, level) for level in LEVELS}
    for level, held in levels.items():
        assert held == expected_rollup(rows, level), level
        assert sum(sums[0] for sums in held.values()) == count, level
    return levels


async def test_the_model_levels_hold_exactly_the_ledgers_sums(engine: AsyncEngine) -> None:
    """Every group, every column, money to the last decimal, after replays and a request id twice."""
    records = seeded_records()
    await write_records(engine, records[:250])
    await write_records(engine, records[200:450])
    await write_records(engine, [records[450], *records[450:]])
    await write_records(engine, records)
    levels = await _levels_match_the_ledger(engine, 600)
    models, statuses = levels["hour_models"], levels["hour_model_status"]
    assert len(statuses) < len(models) < len(levels["hour"])  # groups of several providers', keys' rows
    assert max(sums[0] for sums in models.values()) > 1
    assert max(sums[0] for sums in statuses.values()) > max(sums[0] for sums in models.values())


async def test_concurrent_writers_keep_every_level_exact(engine: AsyncEngine) -> None:
    """Six writers at once over the same hours and groups (with overlapping replays): every row is
    counted once at every level, and no writer fails (on PostgreSQL: no deadlock)."""
    records = seeded_records(720, seed=21)
    batches = [records[offset::6] for offset in range(6)]
    await asyncio.gather(*(write_records(engine, batch) for batch in batches))
    await asyncio.gather(
        *(write_records(engine, [*batch[:40], *batches[-1 - n][:40]]) for n, batch in enumerate(batches))
    )
    await _levels_match_the_ledger(engine, 720)


# Reports of hours without a provider, key, owner or api: they read `usage_hourly_model_status`.
STATUSES = [
    {"group_by": "hour"},
    {"group_by": "hour,model,status"},
    {"group_by": "hour", "model": "{model}"},
    {"group_by": "model,day", "status": "{status}"},
    {"status": "{status}", "model": "{model}"},
    {},
]
# Reports that need the provider but no key, owner or api: they read `usage_hourly_models`.
MODELS = [
    {"group_by": "hour,provider", "model": "{model}"},
    {"group_by": "hour,model", "provider": "{provider}"},
    {"group_by": "provider,day"},
    {"status": "{status}", "provider": "{provider}"},
]
# Reports that need the key, its owner or the api: they read `usage_hourly`.
CALLERS = [
    {"group_by": "hour,key"},
    {"group_by": "hour", "owner": "{owner}"},
    {"group_by": "hour,model", "key": "{key}"},
    {"group_by": "hour,api"},
    {"group_by": "model", "api": "{api}"},
    {"group_by": "owner"},
    {"key": "{key}", "api": "{api}"},
    {"group_by": "hour,provider", "owner": "{owner}"},
]
READS = {UsageHourlyModelStatus: STATUSES, UsageHourlyModels: MODELS, UsageHourly: CALLERS}
_LEVEL = {UsageHourly: "hour", UsageHourlyModels: "hour_models", UsageHourlyModelStatus: "hour_model_status"}
_NAMES = {
    UsageHourly: ("model", "provider", "key", "owner", "api"),
    UsageHourlyModels: ("model", "provider"),
    UsageHourlyModelStatus: ("model",),
}


async def _tamper(engine: AsyncEngine, table: Any) -> dict[str, str]:
    """Add one request to one group of `table` in `TAMPERED_HOUR` (a group with every dimension
    known), in no other table; its dimension values, named as the report's parameters."""
    groups = [key for key in await rollup_rows(engine, _LEVEL[table]) if key[0] == TAMPERED_HOUR and "" not in key]
    values = dict(zip(("hour", *_NAMES[table], "status"), groups[0], strict=True))
    columns = table.__table__.c
    where = [columns[{"key": "api_key_id"}.get(name, name)] == value for name, value in values.items()]
    async with engine.begin() as connection:
        changed = await connection.execute(update(table).where(*where).values(requests=columns.requests + 1))
        assert changed.rowcount == 1
    del values["hour"]
    return values


async def _requests(engine: AsyncEngine, rows: list[dict[str, Any]], params: dict[str, str], **kw: Any) -> int:
    """The report's total requests less the ledger's; every other figure must be the ledger's."""
    query = parse_query({**PERIOD, **params}, NOW, **kw)
    answer = msgspec.to_builtins(await usage_report(engine, query))["totals"]
    truth = expected(rows, query)["totals"]
    assert {**answer, "requests": 0} == {**truth, "requests": 0}, params
    return int(answer["requests"] - truth["requests"])


def _filled(params: dict[str, str], values: dict[str, str]) -> dict[str, str]:
    """`params` with the tampered group's values (`{model}` …) filled in: filters it passes."""
    return {name: value.format(**values) for name, value in params.items()}


@pytest.mark.parametrize("table", [UsageHourlyModelStatus, UsageHourlyModels, UsageHourly])
async def test_a_report_reads_hours_from_the_smallest_level_holding_its_dimensions(
    engine: AsyncEngine, table: Any
) -> None:
    """One request added to one group of one hourly level only: exactly the reports that should
    read that level see it — `usage_hourly_model_status` those without a provider or a caller's
    dimension, `usage_hourly_models` those with a provider but no caller's dimension, and
    `usage_hourly` those that group by, filter on or are restricted to a key, owner or api."""
    await write_records(engine, seeded_records())
    rows = await ledger_rows(engine)
    defaults = {"provider": "local", "key": "key-a", "owner": "team-x", "api": "unified"}
    values = {**defaults, **await _tamper(engine, table)}
    for level, reports in READS.items():
        for params in reports:
            seen = await _requests(engine, rows, _filled(params, values))
            assert seen == (1 if level is table else 0), (level.__tablename__, params)
    hourly = 1 if table is UsageHourly else 0
    assert await _requests(engine, rows, {"group_by": "hour"}, only_key=values["key"]) == hourly
