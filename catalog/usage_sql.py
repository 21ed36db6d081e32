"""The SQL a usage report writes differently on PostgreSQL and SQLite: time buckets, money sums
and latency percentiles.

`Dialect.money(cost, authoritative)` is one source's money as (expression, name) pairs,
`money_sums()` the outer sums of those names and `money_values(sums)` the two sums as integers of
1e-18 USD (None: no value).
PostgreSQL sums NUMERIC and hands back a `Decimal`; SQLite's costs are decimal text with exactly
`COST_SCALE` decimals, cut here in SQL into whole nano-dollars and the remaining 1e-18 dollars,
two integers that SQLite sums exactly (its integer SUM raises on overflow instead of rounding:
nano-dollars overflow only past 9.2 billion USD).

Time buckets are UTC: `day` is `YYYY-MM-DD`, `hour` is `YYYY-MM-DDTHH:00Z` (cost.md). SQLite
stores times as UTC text (`2026-11-30 09:15:00.000000`), so a bucket is a slice of it; PostgreSQL
groups by `date_trunc(…, 'UTC')` and `bucket_text` prints each group's bucket; a roll-up's own
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
per group instead of a window over all rows: about twice as fast (bench/RESULTS.md).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from catalog.tables import COST_SCALE

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

    def bucket_text(self, value: Any, group: str) -> str:
        """A bucket as the report prints it (`YYYY-MM-DD`, `YYYY-MM-DDTHH:00Z`)."""
        return str(value)

    def money(self, cost: str, authoritative: str) -> list[tuple[str, str]]:
        return [(cost, "cost_usd"), (authoritative, "authoritative_cost_usd")]

    def money_sums(self) -> list[str]:
        return [f"SUM({name})" for _, name in self.money("", "")]

    def percentiles(self, keys: Sequence[str], source: str) -> str:
        """p50 and p95 of `latency_ms` per group `keys` of `source` (a subquery selecting the keys
        and `latency_ms`): one row per group, the keys then the two values. The window form."""
        partition = f"PARTITION BY {', '.join(keys)}" if keys else ""
        ranked = ", ".join(
            [*keys, "latency_ms", "ROW_NUMBER() OVER (w ORDER BY latency_ms) AS rn", "COUNT(*) OVER w AS n"]
        )
        return (
            f"SELECT {', '.join([*keys, ''])}"  # noqa: S608
            "MAX(CASE WHEN rn = (n + 1) / 2 THEN latency_ms END), "
            "MAX(CASE WHEN rn = (95 * n + 99) / 100 THEN latency_ms END) "
            f"FROM (SELECT {ranked} FROM ({source}) AS s WINDOW w AS ({partition})) AS r"
            + (f" GROUP BY {', '.join(keys)}" if keys else "")
        )

    def money_values(self, sums: Sequence[Any]) -> tuple[int | None, int | None]:
        cost, authoritative = sums
        return _atto(cost), _atto(authoritative)


class Postgres(Dialect):
    """Buckets are truncated timestamps, grouped as such and printed here, once per group (a
    `to_char` per row cost more than the rest of a roll-up row's aggregation)."""

    _FORMATS = {"day": "%Y-%m-%d", "hour": "%Y-%m-%dT%H:00Z"}

    def bucket(self, moment: str, group: str, grain: str | None = None) -> str:
        return moment if grain == group else f"date_trunc('{group}', {moment}, 'UTC')"

    def percentiles(self, keys: Sequence[str], source: str) -> str:
        """`percentile_disc`: the same nearest rank (module docstring), one sort per group."""
        percentiles = "percentile_disc(ARRAY[0.5, 0.95]) WITHIN GROUP (ORDER BY latency_ms) AS p"
        return (
            f"SELECT {', '.join([*keys, ''])}p[1], p[2] FROM (SELECT {', '.join([*keys, percentiles])} "  # noqa: S608
            f"FROM ({source}) AS s" + (f" GROUP BY {', '.join(keys)}" if keys else "") + ") AS r"
        )

    def bucket_text(self, value: Any, group: str) -> str:
        moment: datetime = value
        return moment.astimezone(UTC).strftime(self._FORMATS[group])


class SQLite(Dialect):
    """Times are UTC text, roll-ups' included: a bucket is always a slice of it."""

    def bucket(self, moment: str, group: str, grain: str | None = None) -> str:
        if group == "day":
            return f"substr({moment}, 1, 10)"
        return f"substr({moment}, 1, 10) || 'T' || substr({moment}, 12, 2) || '\\:00Z'"  # `\:`: not a bind

    def money(self, cost: str, authoritative: str) -> list[tuple[str, str]]:
        return [*_split(cost, "cost"), *_split(authoritative, "authoritative")]

    def money_values(self, sums: Sequence[Any]) -> tuple[int | None, int | None]:
        cost_nano, cost_atto, auth_nano, auth_atto = sums
        return _join(cost_nano, cost_atto), _join(auth_nano, auth_atto)


def _split(value: str, name: str) -> list[tuple[str, str]]:
    """`value` (decimal text with `COST_SCALE` decimals, maybe NULL or negative) as `<name>_nano`
    (whole nano-dollars) and `<name>_atto` (the remaining 1e-18 dollars), both signed."""
    digits = f"ltrim({value}, '-')"
    point = f"instr({digits}, '.')"
    sign = f"(CASE WHEN substr({value}, 1, 1) = '-' THEN -1 ELSE 1 END)"
    whole = f"CAST(substr({digits}, 1, {point} - 1) AS INTEGER)"
    nano = f"CAST(substr({digits}, {point} + 1, 9) AS INTEGER)"
    atto = f"CAST(substr({digits}, {point} + 10, {COST_SCALE - 9}) AS INTEGER)"
    return [(f"{sign} * ({whole} * {_NANO} + {nano})", f"{name}_nano"), (f"{sign} * {atto}", f"{name}_atto")]


def _join(nano: int | None, atto: int | None) -> int | None:
    return None if nano is None else int(nano) * _NANO + int(atto or 0)


def _atto(value: Decimal | None) -> int | None:
    """A NUMERIC sum (scale ≤ `COST_SCALE`) in 1e-18 USD, exactly (no decimal context involved)."""
    if value is None:
        return None
    sign, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)
    number = int("".join(map(str, digits)) or "0") * int(10 ** (exponent + COST_SCALE))
    return -number if sign else number


def dialect_for(name: str) -> Dialect:
    if name == "postgresql":
        return Postgres()
    if name == "sqlite":
        return SQLite()
    raise ValueError(f"usage reports support SQLite and PostgreSQL, not {name}")
