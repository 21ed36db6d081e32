"""The ledger's five secondary indexes become one, led by time and covering the report filters.

Reports are time-bounded (`from`/`to`, cost.md) and filter by model, provider, key and status: one
index on (started_at, model, provider, api_key_id, status) serves every such report by a range
scan of the period's index entries, reading from the table only the rows that match. The four
(column, started_at) indexes it replaces served only reports filtered on one column over an
unbounded period, and each cost every ledger insert one more B-tree insert: on SQLite, which
writes on the core that serves requests, 10.1 → 6.2 µs per row (bench/RESULTS.md, step 18), the
largest single item of the ledger's price. Long-range reports are what roll-ups are for.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_REPORTING = "ix_ledger_reporting"
_REPORTING_COLUMNS = ["started_at", "model", "provider", "api_key_id", "status"]
_REPLACED = {
    "ix_ledger_started_at": ["started_at"],
    "ix_ledger_model_started_at": ["model", "started_at"],
    "ix_ledger_provider_started_at": ["provider", "started_at"],
    "ix_ledger_api_key_started_at": ["api_key_id", "started_at"],
    "ix_ledger_status_started_at": ["status", "started_at"],
}


def upgrade() -> None:
    op.create_index(_REPORTING, "ledger", _REPORTING_COLUMNS)
    for name in _REPLACED:
        op.drop_index(name, table_name="ledger")


def downgrade() -> None:
    for name, columns in _REPLACED.items():
        op.create_index(name, "ledger", columns)
    op.drop_index(_REPORTING, table_name="ledger")
