"""The SQL a usage report writes differently on PostgreSQL and SQLite: time buckets, money sums,
the final statement that prints and orders the groups, and latency percentiles.

`Dialect.money(cost, authoritative)` is one source's money as (expression, name) pairs, `final`
the statement over the sources' sums and `printed(rows)` its rows as the report prints them
(group values, the `COUNTS` as integers, the two money sums as exact decimal text) in cost.md's
order. PostgreSQL sums NUMERIC, and its final statement does the printing and the sorting
(`Postgres`): the Python work left per group is building its row, which matters at thousands of
groups (hour x model: 5,768 in the bench; the same work in Python — `Decimal` decoding, 1e-18
integers, text, a sort key — cost more than the statement, bench/RESULTS.md). SQLite's costs
are decimal text with exactly `COST_SCALE` decimals, cut here in SQL into whole dollars, the next
nine decimals (nano-dollars) and the last nine (1e-18 dollars), three integers that SQLite sums
exactly: no piece is multiplied in SQL (SQLite turns an integer product past 2^63 into a float,
silently), and its integer SUM raises on overflow instead of rounding, which whole dollars reach
only past 9.2e18 USD and the other two pieces only past 9.2e9 rows. They are joined, printed and
sorted in Python (`SQLite.printed`), as SQLite has no exact decimal to do it with.

Time buckets are UTC: `day` is `YYYY-MM-DD`, `hour` is `YYYY-MM-DDTHH:00Z` (cost.md). SQLite
stores times as UTC text (`2026-11-30 09:15:00.000000`), so a bucket is a slice of it; PostgreSQL
groups by `date_trunc(…, 'UTC')` and prints each group's bucket with `to_char`; a roll-up's own
time column is already its bucket when the report groups by that level (`bucket(hour, "hour")`
on `usage_hourly` is `hour`: no function call per row).

Percentiles (`percentiles`): the nearest-rank p50 and p95 of `latency_ms`, the ⌈p·n⌉-th smallest
of a group's n values. SQLite numbers the rows of each group with a window (`ROW_NUMBER`) and picks
rank (n + 1) / 2 and (95n + 99) / 100 in integer arithmetic. PostgreSQL uses the ordered-set
aggregate `percentile_disc(ARRAY[0.5, 0.95])`, which returns the first value whose cumulative
distribution is ≥ p: the K-th smallest with K = max(1, ⌈p·n⌉) (`orderedsetaggs.c` computes
`ceil(p * n)` in double precision). That is the same rank: 0.5·n is exact, and 0.95 as a double
is slightly below 0.95, so p·n never rounds above an integer 0.95n (whose ceiling it then is)
and is never off by the 0.05 that separates a fractional 0.95n from the next integer. One sort
per group instead of a window over all rows: about twice as fast (bench/RESULTS.md). The totals'
percentiles come from the same statement (`GROUPING SETS`), which reads the period's rows once
instead of twice: 5.2 s instead of 4.6 + 2.1 s over 10 million rows.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from catalog.rollup import TOKENS, atto_text
from catalog.tables import COST_SCALE

COUNTS = ("requests", "errors", "cancelled", "unpriced_requests", *TOKENS)  # a report row's integer sums, in order
_NANO = 10**9


def hour_floor(moment: datetime) -> datetime:
    return moment.replace(minute=0, second=0, microsecond=0)


def hour_ceiling(moment: datetime) -> datetime:
    floor = hour_floor(moment)
    return floor if floor == moment else floor + timedelta(hours=1)


def day_floor(moment: datetime) -> datetime:
    """Midnight UTC of `moment`'s day (`moment` is aware UTC, as every report bound is)."""
    return moment.replace(hour=0, minute=0, second=0, microsecond=0)


def day_ceiling(moment: datetime) -> datetime:
    floor = day_floor(moment)
    return floor if floor == moment else floor + timedelta(days=1)


class Dialect(ABC):
    """What the two databases share; each says how it buckets time (`bucket`)."""

    @abstractmethod
    def bucket(self, moment: str, group: str, grain: str | None = None) -> str:
        """The SQL expression of `moment`'s `day` or `hour` bucket; `grain` is the level `moment`
        is already truncated to (a roll-up's `hour` or `day`), None for a raw timestamp."""

    @abstractmethod
    def final(self, groups: Sequence[str], union: str, regroup: bool) -> str:
        """The report's statement over `union` (each source's sums per group `g0`, `g1` …, as
        `_summed` selects them), summed again per group unless `regroup` is False (no group is in
        two sources): one row per group, `printed` turns its rows into the report's."""

    @abstractmethod
    def printed(self, rows: Sequence[Sequence[Any]], width: int) -> Sequence[Sequence[Any]]:
        """The rows of `final` (`width` group values first) as the report prints them, in its
        order: the group values (text or None), the `COUNTS` (int), `cost_usd` (text or None)
        and `authoritative_cost_usd` (text)."""

    def money(self, cost: str, authoritative: str) -> list[tuple[str, str]]:
        return [(cost, "cost_usd"), (authoritative, "authoritative_cost_usd")]

    def percentiles(self, keys: Sequence[str], source: str) -> list[str]:
        """The statements of the p50 and p95 of `latency_ms` per group `keys` (at least one) of
        `source` (a subquery selecting the keys and `latency_ms`) and over all its rows: rows of
        a flag (1 for the totals, whose keys are NULL; 0 for a group), the keys, then the two
        values. The window form: one statement per grouping, each numbering its rows."""
        return [self._ranked(keys, source), self._ranked([], source, len(keys))]

    @staticmethod
    def _ranked(keys: Sequence[str], source: str, hidden: int = 0) -> str:
        """p50 and p95 per group `keys` of `source` by numbering each group's rows; with no keys,
        of all rows, printed as the totals (flag 1, `hidden` NULL keys)."""
        partition = f"PARTITION BY {', '.join(keys)}" if keys else ""
        ranked = ", ".join(
            [*keys, "latency_ms", "ROW_NUMBER() OVER (w ORDER BY latency_ms) AS rn", "COUNT(*) OVER w AS n"]
        )
        head = ", ".join(["0", *keys] if keys else ["1", *["NULL"] * hidden])
        return (
            f"SELECT {head}, "  # noqa: S608
            "MAX(CASE WHEN rn = (n + 1) / 2 THEN latency_ms END), "
            "MAX(CASE WHEN rn = (95 * n + 99) / 100 THEN latency_ms END) "
            f"FROM (SELECT {ranked} FROM ({source}) AS s WINDOW w AS ({partition})) AS r"
            + (f" GROUP BY {', '.join(keys)}" if keys else "")
        )


class Postgres(Dialect):
    """Buckets are truncated timestamps, grouped as such. The final statement prints each group's
    figures and sorts the groups (`final`), so no Python work per group is left but building its
    row: buckets by `to_char` (once per group, not per row), the integer sums as `bigint`
    (asyncpg decodes a NUMERIC into a `Decimal`), money as `trim_scale(SUM(…))::text` — the exact
    sum without trailing zeros, PostgreSQL 13 and later — and the order of cost.md: cost
    descending (nulls last), then the group values ascending (nulls last), compared as Python
    compares the printed values (text by code point, `COLLATE "C"`; a bucket by its time)."""

    _FORMATS = {"day": "YYYY-MM-DD", "hour": 'YYYY-MM-DD"T"HH24"\\:00Z"'}  # `\:`: not a bind

    def bucket(self, moment: str, group: str, grain: str | None = None) -> str:
        return moment if grain == group else f"date_trunc('{group}', {moment}, 'UTC')"

    def final(self, groups: Sequence[str], union: str, regroup: bool) -> str:
        keys = [f"u.g{index}" for index in range(len(groups))]
        printed = [self._printed(key, group) for key, group in zip(keys, groups, strict=True)]
        counts = [f"COALESCE({_again(f'u.{name}', regroup)}, 0)::bigint" for name in COUNTS]
        cost, authoritative = (_again(f"u.{name}", regroup) for _, name in self.money("", ""))
        money = [f"trim_scale({cost})::text", f"COALESCE(trim_scale({authoritative})::text, '0')"]
        sql = f"SELECT {', '.join([*printed, *counts, *money])} FROM ({union}) AS u"  # noqa: S608
        if not keys:
            return sql
        pairs = zip(keys, groups, strict=True)
        order = (key if group in self._FORMATS else f'{key} COLLATE "C"' for key, group in pairs)
        grouped = f" GROUP BY {', '.join(keys)}" if regroup else ""
        return f"{sql}{grouped} ORDER BY {cost} DESC NULLS LAST, {', '.join(order)}"

    def _printed(self, key: str, group: str) -> str:
        return f"to_char({key} AT TIME ZONE 'UTC', '{self._FORMATS[group]}')" if group in self._FORMATS else key

    def printed(self, rows: Sequence[Sequence[Any]], width: int) -> Sequence[Sequence[Any]]:
        return rows

    def percentiles(self, keys: Sequence[str], source: str) -> list[str]:
        """`percentile_disc`: the same nearest rank (module docstring), one sort per group; the
        groups and the totals in one statement (`GROUPING SETS`), so the rows are read once."""
        percentiles = "percentile_disc(ARRAY[0.5, 0.95]) WITHIN GROUP (ORDER BY latency_ms) AS p"
        names = ", ".join(keys)
        return [
            f"SELECT t, {names}, p[1], p[2] FROM (SELECT {names}, GROUPING({names}) AS t, {percentiles} "  # noqa: S608
            f"FROM ({source}) AS s GROUP BY GROUPING SETS (({names}), ())) AS r"
        ]


class SQLite(Dialect):
    """Times are UTC text, roll-ups' included: a bucket is always a slice of it. Money is summed
    in pieces (`money`), joined and printed here, and the groups sorted here (by the exact
    integer cost, then the group values, nulls last): SQLite has no exact decimal to sort by."""

    def bucket(self, moment: str, group: str, grain: str | None = None) -> str:
        if group == "day":
            return f"substr({moment}, 1, 10)"
        return f"substr({moment}, 1, 10) || 'T' || substr({moment}, 12, 2) || '\\:00Z'"  # `\:`: not a bind

    def money(self, cost: str, authoritative: str) -> list[tuple[str, str]]:
        return [*_split(cost, "cost"), *_split(authoritative, "authoritative")]

    def final(self, groups: Sequence[str], union: str, regroup: bool) -> str:
        keys = [f"g{index}" for index in range(len(groups))]
        sums = (_again(name, regroup) for name in (*COUNTS, *(name for _, name in self.money("", ""))))
        sql = f"SELECT {', '.join([*keys, *sums])} FROM ({union}) AS u"  # noqa: S608
        return sql + (f" GROUP BY {', '.join(keys)}" if keys and regroup else "")

    def printed(self, rows: Sequence[Sequence[Any]], width: int) -> Sequence[Sequence[Any]]:
        money = width + len(COUNTS)
        sums = [
            (tuple(values[:width]), [int(value or 0) for value in values[width:money]], *_joined(values[money:]))
            for values in rows
        ]
        sums.sort(key=lambda row: (row[2] is None, -(row[2] or 0), *((v is None, v or "") for v in row[0])))
        return [
            (*groups, *counts, _money(cost), _money(authoritative or 0) or "0")
            for groups, counts, cost, authoritative in sums
        ]


def _again(column: str, regroup: bool) -> str:
    return f"SUM({column})" if regroup else column


def _split(value: str, name: str) -> list[tuple[str, str]]:
    """`value` (decimal text with `COST_SCALE` decimals, maybe NULL or negative) as `<name>_whole`
    (whole dollars), `<name>_nano` (the next nine decimals) and `<name>_atto` (the last nine), each
    signed: three integers whose sums fit SQLite's 64 bits (module docstring)."""
    digits = f"ltrim({value}, '-')"
    point = f"instr({digits}, '.')"
    sign = f"(CASE WHEN substr({value}, 1, 1) = '-' THEN -1 ELSE 1 END)"
    whole = f"CAST(substr({digits}, 1, {point} - 1) AS INTEGER)"
    nano = f"CAST(substr({digits}, {point} + 1, 9) AS INTEGER)"
    atto = f"CAST(substr({digits}, {point} + 10, {COST_SCALE - 9}) AS INTEGER)"
    return [
        (f"{sign} * {piece}", f"{name}_{part}") for piece, part in ((whole, "whole"), (nano, "nano"), (atto, "atto"))
    ]


def _joined(pieces: Sequence[Any]) -> tuple[int | None, int | None]:
    """The cost and authoritative sums, in 1e-18 USD, from their SQLite pieces (`_split`)."""
    return _join(*pieces[:3]), _join(*pieces[3:])


def _join(whole: int | None, nano: int | None, atto: int | None) -> int | None:
    return None if whole is None else (int(whole) * _NANO + int(nano or 0)) * _NANO + int(atto or 0)


def _money(value: int | None) -> str | None:
    """1e-18 USD as the exact decimal string, without trailing zeros."""
    if value is None:
        return None
    text = atto_text(value).rstrip("0").rstrip(".")
    return text if text not in ("", "-") else "0"


def dialect_for(name: str) -> Dialect:
    if name == "postgresql":
        return Postgres()
    if name == "sqlite":
        return SQLite()
    raise ValueError(f"usage reports support SQLite and PostgreSQL, not {name}")
