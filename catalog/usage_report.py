"""The usage report (cost.md "Reporting"): the ledger aggregated in SQL, whole hours from roll-ups.

A report over [from, to) splits its period at whole UTC hours: the hours wholly inside it are read
from `usage_hourly` (kept by the ledger stores, `catalog.rollup`), and the raw ledger rows only for
the partial hours at its edges; one `UNION ALL` of the two is grouped by the database. So the rows
a report touches grow with hours x groups, not with requests, and its memory with the number of
groups only: no Python loop over ledger rows.

Money is exact on both databases. PostgreSQL sums NUMERIC. SQLite keeps costs as decimal text
(`catalog.tables.ExactDecimal`) and has no exact decimal SUM, so each cost is cut in SQL into two
integers — whole nano-dollars and the remaining 1e-18 dollars (the ledger's scale) — summed
exactly as integers and joined again here. Sums travel as integers of 1e-18 USD and are printed
as the exact decimal, without trailing zeros (`0.0000166`).

Latency percentiles (`p50_ms`, `p95_ms`, only when grouped by something other than time): the
nearest-rank percentile of `latency_ms` — the ⌈p·n⌉-th smallest of the group's n values, a value
that was measured, never interpolated — computed in SQL with window functions over the raw rows
of the whole period (roll-ups cannot hold an exact percentile). Such a report reads the period's
rows through the reporting index; reports grouped by time, or not grouped, never do.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import bindparam, text
from sqlalchemy.ext.asyncio import AsyncEngine

from catalog.rollup import TOKENS, UNPRICED, atto_text
from catalog.tables import COST_SCALE, UTCDateTime
from catalog.usage_query import UsageFigures, UsageQuery, UsageReport, UsageRow, iso
from catalog.usage_sql import Dialect, dialect_for, hour_ceiling, hour_floor

COLUMNS = {"model": "model", "provider": "provider", "key": "api_key_id", "owner": "owner", "api": "api"}
_FIGURES = ("requests", "errors", "cancelled", "unpriced_requests", *TOKENS)


async def usage_report(engine: AsyncEngine, query: UsageQuery) -> UsageReport:
    dialect = dialect_for(engine.dialect.name)
    async with engine.connect() as connection:
        result = await connection.execute(_sums_statement(dialect, query), _bounds(query))
        sums = [tuple(row) for row in result]
        latency: dict[tuple[Any, ...], tuple[Any, Any]] = {}
        if query.percentiles:
            groups = query.group_by
            for statement in (_latency_statement(query, groups), _latency_statement(query, ())):
                result = await connection.execute(statement, {"start": query.start, "end": query.end})
                latency.update((tuple(row[:-2]), (row[-2], row[-1])) for row in result)
    rows = sorted((_row(dialect, query, values, latency) for values in sums), key=_order(query))
    return UsageReport(
        start=iso(query.start),
        end=iso(query.end),
        group_by=list(query.group_by),
        rows=rows,
        totals=_totals(rows, latency.get(()) if query.percentiles else None),
    )


def _bounds(query: UsageQuery) -> dict[str, Any]:
    first, last = hour_ceiling(query.start), hour_floor(query.end)
    if first >= last:  # no whole hour inside: every row is read raw
        first = last = query.end
    return {"start": query.start, "end": query.end, "first": first, "last": last}


def _filters(query: UsageQuery) -> tuple[str, list[Any]]:
    """`AND …` conditions for both sources, with their expanding bind parameters."""
    conditions: list[str] = []
    params: list[Any] = []
    for name, column in (*COLUMNS.items(), ("status", "status")):
        if getattr(query, name):
            conditions.append(f" AND {column} IN :f_{name}")
            params.append(bindparam(f"f_{name}", list(getattr(query, name)), expanding=True))
    if query.only_key is not None:
        conditions.append(" AND api_key_id = :only_key")
        params.append(bindparam("only_key", query.only_key))
    return "".join(conditions), params


def _times(*names: str) -> list[Any]:
    return [bindparam(name, type_=UTCDateTime()) for name in names]


def _group_columns(dialect: Dialect, groups: Sequence[str], moment: str) -> list[str]:
    """The select list naming each group value, as `g0`, `g1` …, from one source."""
    columns = []
    for index, name in enumerate(groups):
        if name in ("day", "hour"):
            expression = dialect.bucket(moment, name)
        elif name == "status":
            expression = "status"
        else:
            expression = f"NULLIF({COLUMNS[name]}, '')"
        columns.append(f"{expression} AS g{index}")
    return columns


def _sums_statement(dialect: Dialect, query: UsageQuery) -> Any:
    where, params = _filters(query)
    groups = _group_columns(dialect, query.group_by, "hour")
    raw_groups = _group_columns(dialect, query.group_by, "started_at")
    tokens = ", ".join(TOKENS)
    money = dialect.money("cost_usd", "authoritative_cost_usd")
    rolled = ", ".join([*groups, "status", "requests", "unpriced_requests", tokens, *money])
    raw = ", ".join(
        [
            *raw_groups,
            "status",
            "1 AS requests",
            f"CASE WHEN {UNPRICED} THEN 1 ELSE 0 END AS unpriced_requests",
            *(f"COALESCE({name}, 0) AS {name}" for name in TOKENS),
            *dialect.money("cost_usd", "CASE WHEN cost_source = 'authoritative' THEN cost_usd END"),
        ]
    )
    keys = [f"g{index}" for index in range(len(query.group_by))]
    sums = ", ".join(
        [
            *keys,
            "SUM(requests)",
            "SUM(CASE WHEN status = 'error' THEN requests ELSE 0 END)",
            "SUM(CASE WHEN status = 'cancelled' THEN requests ELSE 0 END)",
            "SUM(unpriced_requests)",
            *(f"SUM({name})" for name in TOKENS),
            *dialect.money_sums(),
        ]
    )
    sql = (
        f"SELECT {sums} FROM ("  # noqa: S608
        f"SELECT {rolled} FROM usage_hourly WHERE hour >= :first AND hour < :last{where} "
        f"UNION ALL SELECT {raw} FROM ledger WHERE ((started_at >= :start AND started_at < :first) "
        f"OR (started_at >= :last AND started_at < :end)){where}) AS u"
        + (f" GROUP BY {', '.join(keys)}" if keys else "")
    )
    return text(sql).bindparams(*_times("start", "end", "first", "last"), *params)


def _latency_statement(query: UsageQuery, groups: Sequence[str]) -> Any:
    """Nearest-rank p50 and p95 of `latency_ms` per group, over the raw rows of the period."""
    where, params = _filters(query)
    columns = _group_columns(_NO_TIME, groups, "started_at")
    keys = [f"g{index}" for index in range(len(groups))]
    partition = f"PARTITION BY {', '.join(keys)} " if keys else ""
    ranked = ", ".join([*keys, "latency_ms", "ROW_NUMBER() OVER (w ORDER BY latency_ms) AS rn", "COUNT(*) OVER w AS n"])
    sql = (
        f"SELECT {', '.join([*keys, ''])}"  # noqa: S608
        "MAX(CASE WHEN rn = (n + 1) / 2 THEN latency_ms END), "
        "MAX(CASE WHEN rn = (95 * n + 99) / 100 THEN latency_ms END) "
        f"FROM (SELECT {ranked} FROM (SELECT {', '.join([*columns, 'latency_ms'])} FROM ledger "
        f"WHERE started_at >= :start AND started_at < :end{where}) AS s WINDOW w AS ({partition.strip()})) AS r"
        + (f" GROUP BY {', '.join(keys)}" if keys else "")
    )
    return text(sql).bindparams(*_times("start", "end"), *params)


class _NoTime(Dialect):
    """Percentiles are never grouped by time; their group columns need no time buckets."""

    def bucket(self, moment: str, group: str) -> str:
        raise AssertionError("latency percentiles are not grouped by time")


_NO_TIME = _NoTime()


def _row(
    dialect: Dialect, query: UsageQuery, values: Sequence[Any], latency: dict[tuple[Any, ...], tuple[Any, Any]]
) -> UsageRow:
    width = len(query.group_by)
    group, figures = tuple(values[:width]), values[width:]
    counts: dict[str, Any] = dict(zip(_FIGURES, (int(value or 0) for value in figures[: len(_FIGURES)]), strict=True))
    texts = (_text(dialect, value, name) for name, value in zip(query.group_by, group, strict=True))
    groups: dict[str, Any] = dict(zip(query.group_by, texts, strict=True))
    cost, authoritative = dialect.money_values(figures[len(_FIGURES) :])
    row = UsageRow(
        **counts,
        cost_usd=_money(cost),
        authoritative_cost_usd=_money(authoritative or 0) or "0",
        **groups,
    )
    if query.percentiles:
        row.p50_ms, row.p95_ms = latency.get(group, (None, None))
    return row


def _text(dialect: Dialect, value: Any, group: str) -> str | None:
    if value is None:
        return None
    return dialect.bucket_text(value, group) if group in ("day", "hour") else str(value)


def _money(value: int | None) -> str | None:
    """1e-18 USD as the exact decimal string, without trailing zeros."""
    if value is None:
        return None
    text = atto_text(value).rstrip("0").rstrip(".")
    return text if text not in ("", "-") else "0"


def _atto(value: str | None) -> int | None:
    if value is None:
        return None
    whole, _, fraction = value.partition(".")
    return int(whole + fraction.ljust(COST_SCALE, "0"))


def _order(query: UsageQuery) -> Any:
    """Cost descending (a null cost last), then the group values ascending (nulls last)."""

    def key(row: UsageRow) -> tuple[Any, ...]:
        cost = _atto(row.cost_usd)
        groups = tuple((value is None, value or "") for value in (getattr(row, name) for name in query.group_by))
        return (cost is None, -(cost or 0), *groups)

    return key


def _totals(rows: Iterable[UsageRow], latency: tuple[Any, Any] | None) -> UsageFigures:
    rows = list(rows)
    counts: dict[str, Any] = {name: sum(getattr(row, name) for row in rows) for name in _FIGURES}
    costs = [value for row in rows if (value := _atto(row.cost_usd)) is not None]
    authoritative = sum(_atto(row.authoritative_cost_usd) or 0 for row in rows)
    totals = UsageFigures(
        **counts,
        cost_usd=_money(sum(costs)) if costs else None,
        authoritative_cost_usd=_money(authoritative) or "0",
    )
    if latency is not None:
        totals.p50_ms, totals.p95_ms = latency
    return totals
