"""The API keys' table takes the name issue 11 gives it: `api_keys` becomes `keys`.

A rename, nothing else: the rows, the unique index on `secret_hash` and every column stay as 0004
made them (PostgreSQL and SQLite both rename a table in place).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.rename_table("api_keys", "keys")


def downgrade() -> None:
    op.rename_table("keys", "api_keys")
