"""API keys (access.md): the `api_keys` table.

Only the SHA-256 of each secret is stored (`secret_hash`, unique: the lookup index), with a short
display prefix. Budgets are USD in the price columns' exact type; `models` is a JSON list of
catalog ids (NULL: every model).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from catalog.tables import PRICE_PRECISION, PRICE_SCALE, ExactDecimal, UTCDateTime

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("secret_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("prefix", sa.String(16), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("owner", sa.String(200), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.Column("expires_at", UTCDateTime(), nullable=True),
        sa.Column("revoked_at", UTCDateTime(), nullable=True),
        sa.Column("models", sa.JSON(), nullable=True),
        sa.Column("budget_usd", ExactDecimal(PRICE_PRECISION, PRICE_SCALE), nullable=True),
        sa.Column("budget_period", sa.String(8), nullable=True),
        sa.Column("rpm", sa.Integer(), nullable=True),
        sa.Column("tpm", sa.Integer(), nullable=True),
        sa.Column("max_concurrency", sa.Integer(), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("api_keys")
