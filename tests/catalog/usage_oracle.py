"""The usage report computed the slow, obvious way, for the report tests to compare against.

`seeded_records()` is a deterministic ledger over four UTC days: every group value (nulls
included), unknown token buckets, exact 18-decimal costs, authoritative and unpriced rows, and
several rows in most hours. `expected(rows, query)` aggregates the raw ledger rows (read back with
plain SQL, `ledger_rows`) in Python with exact integers: no roll-up, no report code.
`expected_rollup(rows, level)` is what a roll-up level (`LEVELS`) must hold for those rows —
`usage_hourly` ('hour'), `usage_hourly_models` ('hour_models': no key, owner, api),
`usage_hourly_model_status` ('hour_model_status': no provider either) or `usage_daily` ('day') —
and `rollup_rows(engine, level)` what it does hold, both as {key: sums} with exact Decimals.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from catalog.records import LedgerRecord
from catalog.tables import UsageDaily, UsageHourly, UsageHourlyModels, UsageHourlyModelStatus
from catalog.usage_query import UsageQuery

START = datetime(2026, 11, 27, 21, 0, tzinfo=UTC)
TOKENS = ("input_tokens", "output_tokens", "reasoning_tokens", "cache_read_tokens", "cache_write_tokens")
_COLUMN = {"key": "api_key_id"}


def seeded_records(count: int = 600, seed: int = 12) -> list[LedgerRecord]:
    rng = random.Random(seed)  # noqa: S311  # a reproducible ledger, not a secret
    return [_record(rng, n) for n in range(count)]


# Rows exactly on the bounds of the tests' periods: `from` includes them, `to` does not.
ON_BOUNDS = (
    "2026-11-28T05:00:00",
    "2026-11-28T06:00:00",
    "2026-11-29T07:00:00",
    "2026-11-28T05:10:00",
    "2026-11-28T06:20:00",
)


def _record(rng: random.Random, n: int) -> LedgerRecord:
    started = START + timedelta(seconds=rng.randrange(0, 3 * 86400 + 7200), microseconds=rng.randrange(10**6))
    if n < len(ON_BOUNDS):
        started = datetime.fromisoformat(ON_BOUNDS[n]).replace(tzinfo=UTC)
    status = rng.choice(["ok", "ok", "ok", "error", "cancelled"])
    usage = status == "ok" or rng.random() < 0.5
    tokens = {name: rng.randrange(0, 5000) for name in TOKENS} if usage else {}
    cost = (
        Decimal(rng.randrange(0, 10**15)).scaleb(-18) + rng.randrange(0, 3) if usage and rng.random() < 0.85 else None
    )
    source = rng.choice(["estimated", "authoritative"]) if cost is not None else None
    return LedgerRecord(
        request_id=f"req-{n:05d}",
        started_at=started,
        finished_at=started + timedelta(seconds=1),
        status=status,  # type: ignore[arg-type]
        streamed=bool(n % 2),
        latency_ms=rng.choice([12.5, 40.0, 99.125, 250.0, 1200.75]) + rng.randrange(0, 50),
        api_key_id=rng.choice(["key-a", "key-b", "key-c", None]),
        owner=rng.choice(["team-x", "team-y", None]),
        api=rng.choice(["unified", "openai_chat", "anthropic_messages", None]),
        model=rng.choice(["gemma", "llama", "qwen", None]),
        provider=rng.choice(["local", "fastrun", "primalabs"]),
        cost_usd=cost,
        estimated_cost_usd=cost,
        cost_source=source,  # type: ignore[arg-type]
        **tokens,
    )


async def ledger_rows(engine: AsyncEngine) -> list[dict[str, Any]]:
    """Every ledger row as the database returns it (costs as stored: exact)."""
    columns = "started_at, model, provider, api_key_id, owner, api, status, latency_ms, cost_usd, cost_source, "
    async with engine.connect() as connection:
        result = await connection.execute(text(f"SELECT {columns}{', '.join(TOKENS)} FROM ledger"))  # noqa: S608
        rows = [dict(row._mapping) for row in result]
    for row in rows:
        moment = row["started_at"]
        if isinstance(moment, str):
            moment = datetime.fromisoformat(moment)
        row["started_at"] = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
        row["cost_usd"] = None if row["cost_usd"] is None else Decimal(str(row["cost_usd"]))
    return rows


def _value(row: dict[str, Any], group: str) -> str | None:
    moment: datetime = row["started_at"]
    if group == "day":
        return moment.strftime("%Y-%m-%d")
    if group == "hour":
        return moment.strftime("%Y-%m-%dT%H:00Z")
    return row[_COLUMN.get(group, group)] or None


def _selected(row: dict[str, Any], query: UsageQuery) -> bool:
    if not query.start <= row["started_at"] < query.end:
        return False
    if query.only_key is not None and row["api_key_id"] != query.only_key:
        return False
    for name in ("model", "provider", "key", "owner", "api", "status"):
        wanted = getattr(query, name)
        if wanted and row[_COLUMN.get(name, name)] not in wanted:
            return False
    return True


def _nearest_rank(values: list[float], percent: int) -> float:
    ordered = sorted(values)
    return ordered[(percent * len(ordered) + 99) // 100 - 1]


def _money(value: Decimal | None) -> str | None:
    if value is None:
        return None
    text_ = format(value, "f")
    return text_.rstrip("0").rstrip(".") if "." in text_ else text_


def _figures(rows: Sequence[dict[str, Any]], percentiles: bool) -> dict[str, Any]:
    costs = [row["cost_usd"] for row in rows if row["cost_usd"] is not None]
    billed = [row["cost_usd"] for row in rows if row["cost_source"] == "authoritative"]
    unpriced = [r for r in rows if r["cost_usd"] is None and (r["status"] != "error" or r["input_tokens"] is not None)]
    figures: dict[str, Any] = {
        "requests": len(rows),
        "errors": sum(1 for row in rows if row["status"] == "error"),
        "cancelled": sum(1 for row in rows if row["status"] == "cancelled"),
        **{name: sum(row[name] or 0 for row in rows) for name in TOKENS},
        "cost_usd": _money(_exact_sum(costs)) if costs else None,
        "unpriced_requests": len(unpriced),
        "authoritative_cost_usd": _money(_exact_sum(billed)) or "0",
    }
    if percentiles:
        latencies = [row["latency_ms"] for row in rows]
        figures["p50_ms"] = _nearest_rank(latencies, 50) if latencies else None
        figures["p95_ms"] = _nearest_rank(latencies, 95) if latencies else None
    return figures


def _exact_sum(values: Sequence[Decimal]) -> Decimal:
    return sum((Decimal(int(value.scaleb(18))) for value in values), Decimal(0)).scaleb(-18)


def expected(rows: Sequence[dict[str, Any]], query: UsageQuery) -> dict[str, Any]:
    """The report `query` asks for, as JSON would carry it (rows in cost.md's order)."""
    chosen = [row for row in rows if _selected(row, query)]
    groups: dict[tuple[str | None, ...], list[dict[str, Any]]] = defaultdict(list)
    for row in chosen:
        groups[tuple(_value(row, name) for name in query.group_by)].append(row)
    answer = [
        {**_figures(members, query.percentiles), **dict(zip(query.group_by, key, strict=True))}
        for key, members in groups.items()
    ]

    def order(row: dict[str, Any]) -> tuple[Any, ...]:
        cost = row["cost_usd"]
        values = tuple((row[name] is None, row[name] or "") for name in query.group_by)
        return (cost is None, -Decimal(cost or 0), *values)

    return {
        "group_by": list(query.group_by),
        "rows": sorted(answer, key=order),
        "totals": _figures(chosen, query.percentiles),
    }


RollupKey = tuple[Any, ...]  # (hour or day, the level's dimensions …, status)
_KEYED = ("model", "provider", "api_key_id", "owner", "api")
_LEVELS = {
    "hour": (UsageHourly, _KEYED),
    "day": (UsageDaily, _KEYED),
    "hour_models": (UsageHourlyModels, ("model", "provider")),
    "hour_model_status": (UsageHourlyModelStatus, ("model",)),
}
LEVELS = tuple(_LEVELS)  # every roll-up level, by its name here


def _bucket(moment: datetime, level: str) -> datetime:
    hour = moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    return hour.replace(hour=0) if level == "day" else hour


def expected_rollup(rows: Sequence[dict[str, Any]], level: str) -> dict[RollupKey, tuple[Any, ...]]:
    """Per (UTC hour or day of `started_at`, model, provider, key, owner, api — 'hour_models':
    model, provider; 'hour_model_status': model —, status; '' for a null): requests, unpriced, the five token sums, the
    cost and its authoritative part (exact Decimals; None when no row had one) — summed here, from
    the ledger rows alone."""
    groups: dict[RollupKey, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        dims = tuple(row[name] or "" for name in _LEVELS[level][1])
        groups[(_bucket(row["started_at"], level), *dims, row["status"])].append(row)
    answer = {}
    for key, members in groups.items():
        figures = _figures(members, percentiles=False)
        costs = [row["cost_usd"] for row in members if row["cost_usd"] is not None]
        billed = [row["cost_usd"] for row in members if row["cost_source"] == "authoritative"]
        answer[key] = (
            len(members),
            figures["unpriced_requests"],
            *(figures[name] for name in TOKENS),
            _exact_sum(costs) if costs else None,
            _exact_sum(billed) if billed else None,
        )
    return answer


async def rollup_rows(engine: AsyncEngine, level: str) -> dict[RollupKey, tuple[Any, ...]]:
    """The rows of the roll-up `level` (one of `LEVELS`), as stored."""
    table, dimensions = _LEVELS[level]
    width = len(dimensions) + 2
    async with engine.connect() as connection:
        result = await connection.execute(select(table.__table__))
        return {tuple(row[:width]): tuple(row[width:]) for row in result}
