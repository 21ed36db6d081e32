"""Initial schema: catalog (models, aliases, deployments, prices) and the usage ledger.

The reporting indexes on the ledger exist from this first revision (cost.md).

Revision ID: 0001
Revises:
Create Date: 2026-01-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from catalog.tables import ExactDecimal, UTCDateTime

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_PRICE_COLUMNS = ("input", "output", "cache_read", "cache_write", "reasoning")
_TOKEN_COLUMNS = (
    "input_tokens",
    "output_tokens",
    "reasoning_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
)
_LEDGER_INDEXES = {
    "ix_ledger_started_at": ["started_at"],
    "ix_ledger_model_started_at": ["model", "started_at"],
    "ix_ledger_provider_started_at": ["provider", "started_at"],
    "ix_ledger_api_key_started_at": ["api_key_id", "started_at"],
    "ix_ledger_status_started_at": ["status", "started_at"],
}


def _price() -> ExactDecimal:
    return ExactDecimal(20, 10)


def _cost() -> ExactDecimal:
    return ExactDecimal(30, 18)


def _create_catalog() -> None:
    op.create_table(
        "models",
        sa.Column("id", sa.String(200), primary_key=True),
        sa.Column("context_window", sa.Integer(), nullable=False),
        sa.Column("max_output", sa.Integer(), nullable=False),
        sa.Column("capabilities", sa.JSON(), nullable=False),
        sa.Column("is_default", sa.Boolean(), nullable=False),
    )
    op.create_table(
        "model_aliases",
        sa.Column("alias", sa.String(200), primary_key=True),
        sa.Column("model_id", sa.String(200), sa.ForeignKey("models.id", ondelete="CASCADE"), nullable=False),
    )
    op.create_table(
        "deployments",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("model_id", sa.String(200), sa.ForeignKey("models.id", ondelete="CASCADE"), nullable=False),
        sa.Column("provider", sa.String(100), nullable=False),
        sa.Column("upstream_model", sa.String(300), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.UniqueConstraint("model_id", "provider", "upstream_model", name="uq_deployments_model_provider"),
    )
    op.create_table(
        "prices",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("provider", sa.String(100), nullable=False),
        sa.Column("model_id", sa.String(200), nullable=False),
        sa.Column("effective_from", UTCDateTime(), nullable=False),
        *(sa.Column(name, _price(), nullable=True) for name in _PRICE_COLUMNS),
        sa.UniqueConstraint("provider", "model_id", "effective_from", name="uq_prices_provider_model_from"),
    )


def _create_ledger() -> None:
    op.create_table(
        "ledger",
        sa.Column("request_id", sa.String(64), primary_key=True),
        sa.Column("started_at", UTCDateTime(), nullable=False),
        sa.Column("finished_at", UTCDateTime(), nullable=False),
        sa.Column("api_key_id", sa.String(100), nullable=True),
        sa.Column("model", sa.String(200), nullable=True),
        sa.Column("provider", sa.String(100), nullable=True),
        sa.Column("upstream_model", sa.String(300), nullable=True),
        sa.Column("upstream_request_id", sa.String(300), nullable=True),
        sa.Column("streamed", sa.Boolean(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("error_type", sa.String(100), nullable=True),
        sa.Column("error_status", sa.Integer(), nullable=True),
        sa.Column("stop_reason", sa.String(32), nullable=True),
        *(sa.Column(name, sa.BigInteger(), nullable=True) for name in _TOKEN_COLUMNS),
        sa.Column("cost_usd", _cost(), nullable=True),
        sa.Column("estimated_cost_usd", _cost(), nullable=True),
        sa.Column("cost_source", sa.String(16), nullable=True),
        sa.Column("price_id", sa.Integer(), nullable=True),
        sa.Column("latency_ms", sa.Double(), nullable=False),
        sa.Column("ttft_ms", sa.Double(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
    )
    for name, columns in _LEDGER_INDEXES.items():
        op.create_index(name, "ledger", columns)


def upgrade() -> None:
    _create_catalog()
    _create_ledger()


def downgrade() -> None:
    for name in reversed(_LEDGER_INDEXES):
        op.drop_index(name, table_name="ledger")
    op.drop_table("ledger")
    op.drop_table("prices")
    op.drop_table("deployments")
    op.drop_table("model_aliases")
    op.drop_table("models")
