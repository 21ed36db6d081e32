"""The ledger records the key's owner, and an hourly roll-up of the ledger feeds the usage reports.

`ledger.owner`: the owner of the request's API key as it was when the request was made (a key's
owner may change later; the report groups by who owned it then). NULL on earlier rows.

`usage_hourly` (see `catalog.tables.UsageHourly`): one row per UTC hour x model x provider x key x
owner x api x status with the request count, the unpriced count, the five token sums, the cost
sum and its authoritative part, exact. Its primary key, led by the hour, is the upsert's conflict
target and the index a time-bounded report reads. The ledger stores keep it in the rows'
transaction (`catalog.rollup`); here it is filled once from the rows already in the ledger.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

from catalog.rollup import DIMENSIONS, KEY, SOURCE, SUMS, TOKENS, postgres_backfill, summed
from catalog.tables import ExactDecimal, UTCDateTime

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_LENGTHS = {"model": 200, "provider": 100, "api_key_id": 100, "owner": 200, "api": 32}
_BACKFILL_CHUNK = 10_000


def upgrade() -> None:
    with op.batch_alter_table("ledger") as batch:
        batch.add_column(sa.Column("owner", sa.String(200), nullable=True))
    op.create_table(
        "usage_hourly",
        sa.Column("hour", UTCDateTime(), nullable=False),
        *(sa.Column(name, sa.String(_LENGTHS[name]), nullable=False) for name in DIMENSIONS),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        sa.Column("unpriced_requests", sa.BigInteger(), nullable=False),
        *(sa.Column(name, sa.BigInteger(), nullable=False) for name in TOKENS),
        sa.Column("cost_usd", ExactDecimal(38, 18), nullable=True),
        sa.Column("authoritative_cost_usd", ExactDecimal(38, 18), nullable=True),
        sa.PrimaryKeyConstraint(*KEY, name="pk_usage_hourly"),
    )
    _backfill()


def _backfill() -> None:
    """The roll-up of the existing rows: grouped by PostgreSQL itself; on SQLite (whose costs are
    decimal text) read in chunks and summed exactly in Python, holding one entry per group."""
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        op.execute(postgres_backfill())
        return
    result = bind.exec_driver_sql(f"SELECT {', '.join(SOURCE)} FROM ledger")  # noqa: S608
    rows = summed(_chunks(result))
    if rows:
        marks = ", ".join("?" * (len(KEY) + len(SUMS)))
        bind.exec_driver_sql(
            f"INSERT INTO usage_hourly ({', '.join(KEY)}, {', '.join(SUMS)}) VALUES ({marks})",  # noqa: S608
            rows,
        )


def _chunks(result: sa.CursorResult[Any]) -> Iterator[Any]:
    while chunk := result.fetchmany(_BACKFILL_CHUNK):
        yield from chunk


def downgrade() -> None:
    op.drop_table("usage_hourly")
    with op.batch_alter_table("ledger") as batch:
        batch.drop_column("owner")
