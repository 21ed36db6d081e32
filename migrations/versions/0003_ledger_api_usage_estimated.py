"""The ledger records which ingress took a request and whether its usage was counted here.

`api`: the front door (`unified` for `POST /api/v1/completions`; the OpenAI and Anthropic ingresses
add theirs), so reports can group by it (cost.md `group_by=api`). NULL on rows written before.

`usage_estimated`: true when the token buckets are the gateway's own count rather than the
upstream's report — a cancelled stream whose upstream never sent usage records the prompt's
estimate and the deltas already relayed (app/pipeline/estimate.py), so that a cancellation is not
free. False on every earlier row.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("ledger") as batch:
        batch.add_column(sa.Column("api", sa.String(32), nullable=True))
        batch.add_column(sa.Column("usage_estimated", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("ledger") as batch:
        batch.drop_column("usage_estimated")
        batch.drop_column("api")
