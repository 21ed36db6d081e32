"""An hourly roll-up per model, without the caller's dimensions, so an hour-grouped report sums
models, not keys.

`usage_hourly_models` (see `catalog.tables.UsageHourlyModels`): the sums of `usage_hourly` per UTC
hour x model x provider x status — the hourly roll-up without the key, its owner and the api (the
door the request came in by). A 30-day report grouped by hour read the 178,808 hourly rows of the
bench's month (bench/RESULTS.md: 90 to 118 ms, most of it the aggregate over those rows, ≈ 0.4 µs
a row); reports that neither group by nor filter on a key, an owner or an api now read their hours
here. Which dimensions go, by the bench's row counts for its month (50 keys, 10 owners, 4 apis, 8
models on 3 providers): without key and owner, 92,288 rows (1.9 times fewer: each key's requests
come through 2 apis, and every model is served by every provider), and an hour-grouped report
still took 89 to 102 ms; without the api too, 36,771 (4.9 times fewer). The api goes with the key:
both say who called and how, and a caller's door multiplies rows as its key does; the model, the
provider and the status say what was served and what it cost, which is what the time-grouped and
untimed reports break down. A report grouped or filtered by api reads `usage_hourly`, as before.
The ledger stores keep this level in the rows' transaction, with the other two
(`catalog.rollup`); here it is filled once from `usage_hourly`, which already holds every
existing row exactly.

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

_LENGTHS = {"model": 200, "provider": 100}
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
    """The hourly roll-up summed per model: grouped by PostgreSQL itself; on SQLite (whose
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
