"""The API keys' table takes the name issue 11 gives it: `api_keys` becomes `keys`.

A rename: the rows, the unique index on `secret_hash` and every column stay as 0004 made them
(PostgreSQL and SQLite both rename a table in place).

On PostgreSQL a view keeps the old name (`api_keys`, `SELECT * FROM keys`: a simple view, which
PostgreSQL lets older processes write through). During a rolling upgrade the processes of the
version before this one still poll `api_keys` for key changes and look keys up there, and their
`keys` command writes it: without the view they saw no change made after the rename, so a key
revoked with the new version kept working on every older process until it restarted (an upgrade
audit). SQLite is one machine's database, upgraded by `serve` as it starts: no view. A later
migration that changes a column of `keys` drops the view first (PostgreSQL refuses to alter a
column a view reads).

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
    if op.get_bind().dialect.name == "postgresql":
        op.execute("CREATE VIEW api_keys AS SELECT * FROM keys")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP VIEW IF EXISTS api_keys")
    op.rename_table("keys", "api_keys")
