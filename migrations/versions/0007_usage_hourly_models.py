"""A key-less hourly roll-up of the ledger, so an hour-grouped report sums models, not keys.

`usage_hourly_models` (see `catalog.tables.UsageHourlyModels`): the sums of `usage_hourly` per UTC
hour x model x provider x api x status — the hourly roll-up without the key and its owner. A
30-day report grouped by hour read the 178,808 hourly rows of the period (bench/RESULTS.md: 90 to
118 ms, most of it the aggregate over those rows); reports that neither group by nor filter on a key or
an owner now read their hours here. Which dimensions go: the key is the one that multiplies rows
(50 keys in the bench, and as many as a deployment hands out), and the owner follows the key
(a key has one owner at a time), so dropping both leaves 34,560 rows for the bench's month (5.2
times fewer). The api stays: it is one of four doors, so it costs at most 4 times the rows of a
level without it (13,680 rows in the bench), and with it reports grouped or filtered by api read
this level too. Model and provider stay for the same reason (a provider mostly follows its model).
The ledger stores keep it in the rows' transaction, with the other two levels (`catalog.rollup`);
here it is filled once from `usage_hourly`, which already holds every existing row exactly.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

from catalog.rollup import KEY, MODEL_DIMENSIONS, MODEL_KEY, SUMS, TOKENS, postgres_models_backfill, summed_by_model
from catalog.tables import ExactDecimal, UTCDateTime

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_LENGTHS = {"model": 200, "provider": 100, "api": 32}
_BACKFILL_CHUNK = 10_000


def upgrade() -> None:
    op.create_table(
        "usage_hourly_models",
        sa.Column("hour", UTCDateTime(), nullable=False),
        *(sa.Column(name, sa.String(_LENGTHS[name]), nullable=False) for name in MODEL_DIMENSIONS),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        sa.Column("unpriced_requests", sa.BigInteger(), nullable=False),
        *(sa.Column(name, sa.BigInteger(), nullable=False) for name in TOKENS),
        sa.Column("cost_usd", ExactDecimal(38, 18), nullable=True),
        sa.Column("authoritative_cost_usd", ExactDecimal(38, 18), nullable=True),
        sa.PrimaryKeyConstraint(*MODEL_KEY, name="pk_usage_hourly_models"),
    )
    _backfill()


def _backfill() -> None:
    """The key-less sums of the hourly roll-up: grouped by PostgreSQL itself; on SQLite (whose
    costs are decimal text) read in chunks and summed exactly in Python, one entry per group."""
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        op.execute(postgres_models_backfill())
        return
    result = bind.exec_driver_sql(f"SELECT {', '.join(KEY)}, {', '.join(SUMS)} FROM usage_hourly")  # noqa: S608
    rows = summed_by_model(_chunks(result))
    if rows:
        marks = ", ".join("?" * (len(MODEL_KEY) + len(SUMS)))
        bind.exec_driver_sql(
            f"INSERT INTO usage_hourly_models ({', '.join(MODEL_KEY)}, {', '.join(SUMS)}) VALUES ({marks})",  # noqa: S608
            rows,
        )


def _chunks(result: sa.CursorResult[Any]) -> Iterator[Any]:
    while chunk := result.fetchmany(_BACKFILL_CHUNK):
        yield from chunk


def downgrade() -> None:
    op.drop_table("usage_hourly_models")
