"""An hourly roll-up per model and status, without the provider, so a report that needs neither
the caller nor the provider sums fewer rows.

`usage_hourly_model_status` (see `catalog.tables.UsageHourlyModelStatus`): the sums of
`usage_hourly` per UTC hour x model x status — `usage_hourly_models` without the provider. The
30-day hour x model report (5,768 groups) summed the ≈ 36,700 rows of `usage_hourly_models` for
the month's whole hours, ≈ 40 ms of its 79 to 86 ms (bench/RESULTS.md); in the bench every model
is served by every provider, and without the provider the month holds ≈ 13,700 rows (the
aggregate alone: 16 to 19 ms against 27 to 32 ms). Reports that neither group by nor filter on
the provider, a key, an owner or an api read their hours here; the others read the level that
holds what they need, as before. The ledger stores keep this level in the rows' transaction, with
the other three (`catalog.rollup`); here it is filled once from `usage_hourly`, which already
holds every existing row exactly.

A frozen snapshot: the statements and the exact sums are written out here, not taken from
`catalog.rollup`, so that a later change there cannot change what this revision does.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

from catalog.tables import ExactDecimal, UTCDateTime

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TABLE = "usage_hourly_model_status"
_KEY = ("hour", "model", "status")
_TOKENS = ("input_tokens", "output_tokens", "reasoning_tokens", "cache_read_tokens", "cache_write_tokens")
_COUNTS = ("requests", "unpriced_requests", *_TOKENS)
_MONEY = ("cost_usd", "authoritative_cost_usd")
_SUMS = (*_COUNTS, *_MONEY)
_SCALE = 18  # the cost columns' scale: SQLite stores costs as decimal text with exactly this many decimals
_BACKFILL_CHUNK = 10_000


def upgrade() -> None:
    op.create_table(
        _TABLE,
        sa.Column("hour", UTCDateTime(), nullable=False),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        *(sa.Column(name, sa.BigInteger(), nullable=False) for name in _COUNTS),
        *(sa.Column(name, ExactDecimal(38, _SCALE), nullable=True) for name in _MONEY),
        sa.PrimaryKeyConstraint(*_KEY, name="pk_usage_hourly_model_status"),
    )
    _backfill()


def _backfill() -> None:
    """The hourly roll-up summed per hour x model x status: grouped by PostgreSQL itself (NUMERIC
    sums are exact, SUM skips NULLs and is NULL when every value is); on SQLite (whose costs are
    decimal text) read in chunks and summed exactly in Python, one entry per group."""
    bind = op.get_bind()
    columns = f"{', '.join(_KEY)}, {', '.join(_SUMS)}"
    if bind.dialect.name == "postgresql":
        sums = ", ".join(f"SUM({name})" for name in _SUMS)
        select = f"SELECT {', '.join(_KEY)}, {sums} FROM usage_hourly GROUP BY 1, 2, 3"  # noqa: S608
        op.execute(f"INSERT INTO {_TABLE} ({columns}) {select}")
        return
    result = bind.exec_driver_sql(f"SELECT {columns} FROM usage_hourly")  # noqa: S608
    rows = _summed(_chunks(result))
    if rows:
        marks = ", ".join("?" * (len(_KEY) + len(_SUMS)))
        bind.exec_driver_sql(f"INSERT INTO {_TABLE} ({columns}) VALUES ({marks})", rows)  # noqa: S608


def _chunks(result: sa.CursorResult[Any]) -> Iterator[Any]:
    while chunk := result.fetchmany(_BACKFILL_CHUNK):
        yield from chunk


def _summed(rows: Iterator[Sequence[Any]]) -> list[tuple[Any, ...]]:
    """`_KEY` then `_SUMS` rows summed per key: counts as integers, costs as integers of 1e-18 USD
    (exact), None while no row of the group had one; the groups in key order, costs as text."""
    groups: dict[tuple[Any, ...], list[Any]] = {}
    width = len(_KEY)
    for row in rows:
        key, counts, money = tuple(row[:width]), row[width : width + len(_COUNTS)], row[width + len(_COUNTS) :]
        sums = groups.setdefault(key, [0] * len(_COUNTS) + [None] * len(_MONEY))
        for index, value in enumerate(counts):
            sums[index] += value
        for index, value in enumerate(money, start=len(_COUNTS)):
            if value is not None:
                sums[index] = _atto(value) + (sums[index] or 0)
    return [(*key, *sums[: len(_COUNTS)], *map(_text, sums[len(_COUNTS) :])) for key, sums in sorted(groups.items())]


def _atto(text: str) -> int:
    """Decimal text with `_SCALE` decimals (maybe negative) as an integer of 1e-18 USD."""
    whole, _, fraction = text.partition(".")
    digits = int(whole.lstrip("-") + fraction.ljust(_SCALE, "0")[:_SCALE])
    return -digits if whole.startswith("-") else digits


def _text(value: int | None) -> str | None:
    """An integer of 1e-18 USD as the stored text: `_SCALE` decimals, a sign when negative."""
    if value is None:
        return None
    whole, fraction = divmod(abs(value), 10**_SCALE)
    return f"{'-' if value < 0 else ''}{whole}.{fraction:0{_SCALE}d}"


def downgrade() -> None:
    op.drop_table(_TABLE)
