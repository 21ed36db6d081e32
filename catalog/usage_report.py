"""The usage report (cost.md "Reporting"): the ledger aggregated in SQL, whole days and hours from
roll-ups.

A report over [from, to) is cut at whole UTC hours and, inside those, at whole UTC days
(`_bounds`): the days wholly inside it are read from `usage_daily`, the remaining whole hours at
its edges from an hourly level (all four levels kept by the ledger stores, `catalog.rollup`),
and the raw ledger rows only for the partial hours at its edges (each its own source, `_RAW`).
Each source is summed per group by the database, and one `UNION ALL` of them is summed again per
group (not when grouped by hour, below). So the rows a report touches grow with days x groups
(plus at most 46 hours and 2 partial hours at the edges), not with requests, and its memory
with the number of groups only: no Python loop over ledger rows.
Grouped by `hour`, no day is read whole (a day row has no hours): such a report sums the period's
hourly rows, grouped by `hour` itself — no function per row — which PostgreSQL does in parallel.

The hours come from the smallest level that holds every dimension the report groups by or
filters on (`_hourly`): `usage_hourly_model_status` (model and status: 2.7 times fewer rows than
the next level in the bench, whose every model is served by every provider) unless the report
groups by or filters on `provider`; then `usage_hourly_models` (model, provider and status: 4.9
times fewer rows than `usage_hourly` in the bench, and the 30-day hour report from 96 to 48-67 ms)
unless it groups by or filters on `key`, `owner` or `api`, or is restricted to one key
(`only_key`), which need `usage_hourly`.
Days have one level, with every dimension: a 30-day day x model report spends 5 ms of its 26 in
the server on the month's 7,200 day rows, most of the rest on the raw rows of the partial hours
(bench/RESULTS.md), so a day level without the key would save little.

Grouped by hour, the sources' groups are already the report's (no hour is in two sources), so
they are not summed again: hour x model in the bench, one hash aggregate of 5,768 groups less.

Money is exact on both databases. PostgreSQL sums NUMERIC. SQLite keeps costs as decimal text
(`catalog.tables.ExactDecimal`) and has no exact decimal SUM, so each cost is cut in SQL into three
signed integers — whole dollars, the next nine decimals (nano-dollars) and the last nine (1e-18
dollars, the ledger's scale) — each summed exactly as an integer and joined again
(`catalog.usage_sql._split`). Each group's sums are printed as the
exact decimal without trailing zeros (`0.0000166`) — by PostgreSQL itself, which also sorts the
groups, or in Python for SQLite (`Dialect.printed`) — and the totals are the printed rows'
sums, money added as `Decimal`s in a context that cannot round (`_totals`).

Latency percentiles (`p50_ms`, `p95_ms`, only when grouped by something other than time): the
nearest-rank percentile of `latency_ms` — the ⌈p·n⌉-th smallest of the group's n values, a value
that was measured, never interpolated — computed in SQL over the raw rows of the whole period
(`Dialect.percentiles`: `percentile_disc` on PostgreSQL, a window on SQLite). A roll-up cannot
hold an exact percentile (a sum of counts is not a percentile of the union), so such a report
reads and sorts every row of the period (on PostgreSQL the groups' and the totals' percentiles in
one statement): 5 to 6 s for 10 million rows (bench/RESULTS.md; a covering index for an
index-only scan did not help: the sort, not the read, is most of it). Reports grouped by time, or not grouped, and
`UsageQuery(latency=False)` never read them.
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Context, Decimal, Inexact, Rounded, localcontext
from typing import Any, NamedTuple

import msgspec
from sqlalchemy import bindparam, select, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from catalog.exact_sum import decimal_text
from catalog.report_period import QueryError
from catalog.rollup import TOKENS, UNPRICED
from catalog.tables import ModelAlias, UTCDateTime
from catalog.usage_query import FILTERS, UsageFigures, UsageQuery, UsageReport, UsageRow, iso
from catalog.usage_sql import COUNTS, Dialect, day_ceiling, day_floor, dialect_for, hour_ceiling, hour_floor

COLUMNS = {"model": "model", "provider": "provider", "key": "api_key_id", "owner": "owner", "api": "api"}
_NARROW = "narrow the period, the filters or the groups"
_EXACT = Context(prec=80, traps=[Inexact, Rounded])  # a total of costs is exact or an error


async def usage_report(engine: AsyncEngine, query: UsageQuery, *, max_rows: int | None = None) -> UsageReport:
    """The report; with `max_rows`, QueryError (`group_by`) for one that would have more rows, its
    groups counted by the database (`LIMIT`) before any is read: the HTTP report's bound, where an
    answer of 644,091 rows (a decade by hour x model x key) was 206 MB, took the process from 136 to
    676 MB and stalled every request it served for seconds. The CLI has none."""
    dialect = dialect_for(engine.dialect.name)
    async with engine.connect() as connection:
        if query.model:
            query = msgspec.structs.replace(query, model=await _canonical_models(connection, query.model))
        limit = None if max_rows is None else max_rows + 1
        found = (await connection.execute(_sums_statement(dialect, query, limit), _bounds(query))).all()
        if max_rows is not None and len(found) > max_rows:
            raise QueryError("group_by", f"the report has more than {max_rows} rows: {_NARROW}")
        printed = dialect.printed(found, len(query.group_by))
        latency: dict[tuple[Any, ...], tuple[Any, Any]] | None = None
        if query.percentiles:
            latency = {}
            for statement in _latency_statements(dialect, query):
                result = await connection.execute(statement, {"start": query.start, "end": query.end})
                latency.update((() if row[0] else tuple(row[1:-2]), (row[-2], row[-1])) for row in result)
    rows = [_row(query, values, latency) for values in printed]
    return UsageReport(
        start=iso(query.start),
        end=iso(query.end),
        group_by=list(query.group_by),
        rows=rows,
        totals=_totals(printed, len(query.group_by), None if latency is None else latency.get(())),
    )


async def _canonical_models(connection: AsyncConnection, models: tuple[str, ...]) -> tuple[str, ...]:
    """The `model` filter in the ledger's terms: a catalog alias (`mock`) stands for its model
    (`mock-model`), as it does in a request; any other name is kept as given (a model no longer in
    the catalog still has its rows)."""
    table = ModelAlias.__table__
    found = await connection.execute(select(table.c.alias, table.c.model_id).where(table.c.alias.in_(models)))
    canonical: dict[str, str] = dict(found.all())  # rows of (alias, model)
    return tuple(dict.fromkeys(canonical.get(model, model) for model in models))


def _bounds(query: UsageQuery) -> dict[str, Any]:
    """The period cut into its sources: raw rows in [start, first) and [last, end), each inside one
    hour (that of `start`, that of `last`), hourly roll-ups (`_hourly`'s level) in
    [first, day_first) and [day_last, last), daily roll-ups in [day_first, day_last). An empty
    piece has equal bounds. Grouped by hour, no day is read whole."""
    first, last = hour_ceiling(query.start), hour_floor(query.end)
    if first >= last:  # no whole hour inside: every row is read raw, cut at the hour between
        first = last = min(first, query.end)
    day_first, day_last = day_ceiling(first), day_floor(last)
    if day_first >= day_last or "hour" in query.group_by:
        day_first = day_last = last
    return {
        "start": query.start,
        "end": query.end,
        "first": first,
        "last": last,
        "day_first": day_first,
        "day_last": day_last,
    }


def _filters(query: UsageQuery) -> tuple[str, list[Any]]:
    """`AND …` conditions for every source, with their expanding bind parameters."""
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


def _group_columns(dialect: Dialect, groups: Sequence[str], moment: str, grain: str | None = None) -> list[str]:
    """The select list naming each group value, as `g0`, `g1` …, from one source."""
    columns = []
    for index, name in enumerate(groups):
        if name in ("day", "hour"):
            expression = dialect.bucket(moment, name, grain)
        elif name == "status":
            expression = "status"
        else:
            expression = f"NULLIF({COLUMNS[name]}, '')"
        columns.append(f"{expression} AS g{index}")
    return columns


class _Source(NamedTuple):
    """One table a report sums: its time column and level (ledger rows: a bound in their one
    hour, `_RAW`), which of its rows are in the period, and what one of its rows counts (a
    roll-up row: its sums; a ledger row: one request)."""

    table: str
    moment: str
    grain: str | None
    period: str
    requests: str
    unpriced: str
    tokens: tuple[str, ...]
    cost: str
    authoritative: str


def _rolled(table: str, moment: str, period: str) -> _Source:
    return _Source(table, moment, moment, period, "requests", "unpriced_requests", TOKENS, *_ROLLED_MONEY)


_ROLLED_MONEY = ("cost_usd", "authoritative_cost_usd")
_HOURS = "((hour >= :first AND hour < :day_first) OR (hour >= :day_last AND hour < :last))"
_DAILY = _rolled("usage_daily", "day", "day >= :day_first AND day < :day_last")
_CALLER = frozenset({"key", "owner", "api"})  # the dimensions `usage_hourly_models` does not hold
_HOURLY_LEVELS: tuple[tuple[frozenset[str], _Source], ...] = (  # (what it lacks, the level), smallest first
    (_CALLER | {"provider"}, _rolled("usage_hourly_model_status", "hour", _HOURS)),
    (_CALLER, _rolled("usage_hourly_models", "hour", _HOURS)),
    (frozenset(), _rolled("usage_hourly", "hour", _HOURS)),
)


def _raw(moment: str, period: str) -> _Source:
    unpriced = f"CASE WHEN {UNPRICED} THEN 1 ELSE 0 END"
    tokens = tuple(f"COALESCE({name}, 0)" for name in TOKENS)
    authoritative = "CASE WHEN cost_source = 'authoritative' THEN cost_usd END"
    return _Source("ledger", moment, None, period, "1", unpriced, tokens, "cost_usd", authoritative)


# The raw rows of the two partial hours, each piece a source of its own whose time buckets are
# those of a bound inside its hour (`_bounds`): one value per piece, no function per row, so
# PostgreSQL hashes each piece's few groups instead of sorting its rows by a bucket whose groups
# it cannot estimate (it assumed one per row).
_RAW = (
    _raw(":start", "started_at >= :start AND started_at < :first"),
    _raw(":last", "started_at >= :last AND started_at < :end"),
)


def _hourly(query: UsageQuery) -> _Source:
    """The smallest hourly level holding every dimension `query` groups by or filters on (a
    restriction to one key, `only_key`, is a filter on `key`)."""
    used = {*query.group_by, *(name for name in FILTERS if getattr(query, name))}
    if query.only_key is not None:
        used.add("key")
    return next(level for lacks, level in _HOURLY_LEVELS if not lacks & used)


def _summed(dialect: Dialect, groups: Sequence[str], source: _Source, where: str) -> str:
    """One source's rows in the period, summed per group by the database (in parallel where
    PostgreSQL can), so the UNION ALL of the sources holds a few rows per group, not per row."""
    n = source.requests
    columns = [
        *_group_columns(dialect, groups, source.moment, source.grain),
        f"SUM({n}) AS requests",
        f"SUM(CASE WHEN status = 'error' THEN {n} ELSE 0 END) AS errors",
        f"SUM(CASE WHEN status = 'cancelled' THEN {n} ELSE 0 END) AS cancelled",
        f"SUM({source.unpriced}) AS unpriced_requests",
        *(f"SUM({expression}) AS {name}" for expression, name in zip(source.tokens, TOKENS, strict=True)),
        *(f"SUM({expression}) AS {name}" for expression, name in dialect.money(source.cost, source.authoritative)),
    ]
    grouped = f" GROUP BY {', '.join(str(index + 1) for index in range(len(groups)))}" if groups else ""
    return f"SELECT {', '.join(columns)} FROM {source.table} WHERE {source.period}{where}{grouped}"  # noqa: S608


def _sums_statement(dialect: Dialect, query: UsageQuery, limit: int | None = None) -> Any:
    """Each source summed per group, then summed again per group — unless the report groups by
    hour: no hour is in two sources (`_bounds`), so each source's groups are already the report's.
    `limit`: at most that many groups (which ones, unordered on SQLite: only their number is used)."""
    where, params = _filters(query)
    sources = (_DAILY, _hourly(query), *_RAW)
    union = " UNION ALL ".join(_summed(dialect, query.group_by, source, where) for source in sources)
    sql = dialect.final(query.group_by, union, regroup="hour" not in query.group_by)
    sql += "" if limit is None else f" LIMIT {int(limit)}"
    return text(sql).bindparams(*_times("start", "end", "first", "last", "day_first", "day_last"), *params)


def _latency_statements(dialect: Dialect, query: UsageQuery) -> list[Any]:
    """Nearest-rank p50 and p95 of `latency_ms` per group and over the whole period, from its raw
    rows: rows of a flag (1: the totals), the group values, the two percentiles."""
    where, params = _filters(query)
    columns = _group_columns(dialect, query.group_by, "started_at")
    keys = [f"g{index}" for index in range(len(query.group_by))]
    period = f"started_at >= :start AND started_at < :end{where}"
    source = f"SELECT {', '.join([*columns, 'latency_ms'])} FROM ledger WHERE {period}"  # noqa: S608
    return [text(sql).bindparams(*_times("start", "end"), *params) for sql in dialect.percentiles(keys, source)]


def _row(query: UsageQuery, values: Sequence[Any], latency: dict[tuple[Any, ...], tuple[Any, Any]] | None) -> UsageRow:
    """A printed row (`Dialect.printed`) as the report's row, with its percentiles when `latency`
    holds them; built with the fields named, not from a mapping, as a report may have thousands
    of rows (hour x model: 5,768 in the bench)."""
    width = len(query.group_by)
    requests, errors, cancelled, unpriced, input_, output, reasoning, read, write, cost, paid = values[width:]
    row = UsageRow(
        requests=requests,
        errors=errors,
        cancelled=cancelled,
        unpriced_requests=unpriced,
        input_tokens=input_,
        output_tokens=output,
        reasoning_tokens=reasoning,
        cache_read_tokens=read,
        cache_write_tokens=write,
        cost_usd=cost,
        authoritative_cost_usd=paid,
    )
    group = tuple(values[:width])
    for name, value in zip(query.group_by, group, strict=True):
        setattr(row, name, value)
    if latency is not None:
        row.p50_ms, row.p95_ms = latency.get(group, (None, None))
    return row


def _totals(printed: Sequence[Sequence[Any]], width: int, latency: tuple[Any, Any] | None) -> UsageFigures:
    """The figures of every printed row summed: integers, and money exactly (`_EXACT` rounds nothing)."""
    columns = list(zip(*printed, strict=True)) or [()] * (width + len(COUNTS) + 2)
    counts: dict[str, Any] = dict(zip(COUNTS, map(sum, columns[width:-2]), strict=True))
    costs = [Decimal(value) for value in columns[-2] if value is not None]
    with localcontext(_EXACT):
        cost = decimal_text(sum(costs, Decimal(0))) if costs else None
        authoritative = decimal_text(sum(map(Decimal, columns[-1]), Decimal(0)))
    totals = UsageFigures(**counts, cost_usd=cost, authoritative_cost_usd=authoritative)
    if latency is not None:
        totals.p50_ms, totals.p95_ms = latency
    return totals
