"""The SQL schema of the catalog and the usage ledger, and the two column types that keep it exact.

One `metadata` holds every table; the Alembic migration chain (`migrations/versions`) creates the
same schema explicitly, and `tests/catalog/test_migrations.py` checks that the chain at head agrees.

Two portability decisions live here, because SQLite and PostgreSQL must behave identically:

- `UTCDateTime`: PostgreSQL keeps `timestamptz`; SQLite has no time zone type, so the value is stored
  as naive UTC text (which sorts correctly, so range queries and indexes work) and comes back aware.
  Naive datetimes are refused on the way in: a naive timestamp is a bug, not a guess to make.
- `ExactDecimal`: PostgreSQL keeps `NUMERIC(p, s)`; SQLite's NUMERIC affinity would turn the value
  into a float, so there the value is stored as its decimal text. On both databases the value is
  first rounded (half-even) to the column's scale so a row reads back the same everywhere; a value
  with more integer digits than the column allows is refused. SQLite's `SUM` over that text would
  go through floats, so money on SQLite is summed as integer pieces of the text, in SQL
  (`catalog.exact_sum`, `catalog.usage_sql`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Dialect,
    Double,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    Numeric,
    String,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.sql.type_api import TypeEngine

from catalog.exact import COST_PRECISION as COST_PRECISION  # the columns' sizes, re-exported with the schema
from catalog.exact import COST_SCALE as COST_SCALE
from catalog.exact import PRICE_PRECISION as PRICE_PRECISION
from catalog.exact import PRICE_SCALE as PRICE_SCALE
from catalog.exact import Money, aware_utc, utc_sqlite_text
from catalog.records import UPSTREAM_ID_MAX


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware datetime stored as UTC; returned aware (UTC) on every database."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "sqlite":
            return dialect.type_descriptor(DateTime(timezone=False))
        return dialect.type_descriptor(DateTime(timezone=True))

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(f"naive datetime {value.isoformat()} given for a UTC column")
        utc = value.astimezone(UTC)
        return utc.replace(tzinfo=None) if dialect.name == "sqlite" else utc

    @staticmethod
    def aware_utc(value: datetime) -> datetime:
        """What `process_bind_param` hands PostgreSQL's driver: the same instant, in UTC."""
        return aware_utc(value)

    @staticmethod
    def sqlite_text(value: datetime) -> str:
        """What `process_bind_param` and SQLAlchemy's SQLite `DATETIME` together store."""
        return utc_sqlite_text(value)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


class ExactDecimal(TypeDecorator[Decimal]):
    """`NUMERIC(precision, scale)` that round-trips `Decimal` exactly on PostgreSQL and SQLite."""

    impl = Numeric
    cache_ok = True

    def __init__(self, precision: int, scale: int) -> None:
        super().__init__(precision=precision, scale=scale, asdecimal=True)
        self.precision = precision
        self.scale = scale
        self.money = Money(precision, scale)  # the arithmetic, shared with the SQLite writer's process

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "sqlite":
            return dialect.type_descriptor(String(self.precision + 2))
        return dialect.type_descriptor(Numeric(self.precision, self.scale, asdecimal=True))

    def quantize(self, value: Decimal) -> Decimal:
        """`value` rounded half-even to this column's scale; ValueError when it does not fit."""
        return self.money.quantize(value)

    def sqlite_text(self, value: Decimal) -> str:
        """The stored text on SQLite: the value rounded to the column's scale, never exponent form."""
        return self.money.sqlite_text(value)

    def process_bind_param(self, value: Decimal | None, dialect: Dialect) -> Decimal | str | None:
        if value is None:
            return None
        if dialect.name == "sqlite":
            return self.sqlite_text(value)
        return self.quantize(Decimal(value))

    def process_result_value(self, value: Any, dialect: Dialect) -> Decimal | None:
        if value is None:
            return None
        return value if isinstance(value, Decimal) else Decimal(str(value))


def _price_column() -> ExactDecimal:
    return ExactDecimal(PRICE_PRECISION, PRICE_SCALE)


def insert_for(dialect_name: str) -> Any:
    """The dialect's `insert` construct, which carries `on_conflict_do_nothing/do_update`.

    Typed `Any` because SQLite's and PostgreSQL's `Insert` classes share no typed base with those
    methods; callers use only `on_conflict_do_nothing(index_elements=...)` and
    `on_conflict_do_update(index_elements=..., set_=...)`, which both dialects spell the same.
    """
    if dialect_name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert
    if dialect_name == "sqlite":
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        return sqlite_insert
    raise ValueError(f"unsupported database dialect {dialect_name!r} (use sqlite or postgresql)")


metadata = MetaData()


class Base(DeclarativeBase):
    metadata: ClassVar[MetaData] = metadata


class Model(Base):
    __tablename__ = "models"

    id: Mapped[str] = mapped_column(String(200), primary_key=True)
    context_window: Mapped[int] = mapped_column(Integer)
    max_output: Mapped[int] = mapped_column(Integer)
    capabilities: Mapped[list[str]] = mapped_column(JSON)
    is_default: Mapped[bool] = mapped_column(Boolean, default=False)


class ModelAlias(Base):
    __tablename__ = "model_aliases"

    alias: Mapped[str] = mapped_column(String(200), primary_key=True)
    model_id: Mapped[str] = mapped_column(String(200), ForeignKey("models.id", ondelete="CASCADE"))


class Deployment(Base):
    __tablename__ = "deployments"
    __table_args__ = (UniqueConstraint("model_id", "provider", "upstream_model", name="uq_deployments_model_provider"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    model_id: Mapped[str] = mapped_column(String(200), ForeignKey("models.id", ondelete="CASCADE"))
    provider: Mapped[str] = mapped_column(String(100))
    upstream_model: Mapped[str] = mapped_column(String(300))
    priority: Mapped[int] = mapped_column(Integer, default=0)


class Price(Base):
    """USD per million tokens. Never updated: a change is a new row with a later `effective_from`.

    `model_id` is deliberately not a foreign key: price history outlives a model's removal from
    the catalog files, because old ledger rows still point at these rows.
    """

    __tablename__ = "prices"
    __table_args__ = (UniqueConstraint("provider", "model_id", "effective_from", name="uq_prices_provider_model_from"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    provider: Mapped[str] = mapped_column(String(100))
    model_id: Mapped[str] = mapped_column(String(200))
    effective_from: Mapped[datetime] = mapped_column(UTCDateTime())
    input: Mapped[Decimal | None] = mapped_column(_price_column(), nullable=True)
    output: Mapped[Decimal | None] = mapped_column(_price_column(), nullable=True)
    cache_read: Mapped[Decimal | None] = mapped_column(_price_column(), nullable=True)
    cache_write: Mapped[Decimal | None] = mapped_column(_price_column(), nullable=True)
    reasoning: Mapped[Decimal | None] = mapped_column(_price_column(), nullable=True)


class LedgerRow(Base):
    """One row per request that reached routing (see cost.md). NULL token buckets mean unknown."""

    __tablename__ = "ledger"
    __table_args__ = (
        # One index for the time-bounded reports, covering their filters (migration 0002).
        Index("ix_ledger_reporting", "started_at", "model", "provider", "api_key_id", "status"),
    )

    request_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime] = mapped_column(UTCDateTime())
    api_key_id: Mapped[str | None] = mapped_column(String(100), nullable=True)
    owner: Mapped[str | None] = mapped_column(String(200), nullable=True)  # the key's owner then (migration 0005)
    api: Mapped[str | None] = mapped_column(String(32), nullable=True)  # the ingress (migration 0003)
    model: Mapped[str | None] = mapped_column(String(200), nullable=True)
    provider: Mapped[str | None] = mapped_column(String(100), nullable=True)
    upstream_model: Mapped[str | None] = mapped_column(String(300), nullable=True)
    upstream_request_id: Mapped[str | None] = mapped_column(String(UPSTREAM_ID_MAX), nullable=True)
    streamed: Mapped[bool] = mapped_column(Boolean)
    status: Mapped[str] = mapped_column(String(16))
    error_type: Mapped[str | None] = mapped_column(String(100), nullable=True)
    error_status: Mapped[int | None] = mapped_column(Integer, nullable=True)
    stop_reason: Mapped[str | None] = mapped_column(String(32), nullable=True)
    input_tokens: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    output_tokens: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    reasoning_tokens: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    cache_read_tokens: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    cache_write_tokens: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    usage_estimated: Mapped[bool] = mapped_column(Boolean, default=False)  # counted here (migration 0003)
    cost_usd: Mapped[Decimal | None] = mapped_column(ExactDecimal(COST_PRECISION, COST_SCALE), nullable=True)
    estimated_cost_usd: Mapped[Decimal | None] = mapped_column(ExactDecimal(COST_PRECISION, COST_SCALE), nullable=True)
    cost_source: Mapped[str | None] = mapped_column(String(16), nullable=True)
    price_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    latency_ms: Mapped[float] = mapped_column(Double)
    ttft_ms: Mapped[float | None] = mapped_column(Double, nullable=True)
    attempts: Mapped[int] = mapped_column(Integer, default=1)


ROLLUP_COST_PRECISION = 38


class _Sums:
    """The sums every roll-up level holds per group (after its time column and dimensions)."""

    requests: Mapped[int] = mapped_column(BigInteger)
    unpriced_requests: Mapped[int] = mapped_column(BigInteger)
    input_tokens: Mapped[int] = mapped_column(BigInteger)
    output_tokens: Mapped[int] = mapped_column(BigInteger)
    reasoning_tokens: Mapped[int] = mapped_column(BigInteger)
    cache_read_tokens: Mapped[int] = mapped_column(BigInteger)
    cache_write_tokens: Mapped[int] = mapped_column(BigInteger)
    cost_usd: Mapped[Decimal | None] = mapped_column(ExactDecimal(ROLLUP_COST_PRECISION, COST_SCALE), nullable=True)
    authoritative_cost_usd: Mapped[Decimal | None] = mapped_column(
        ExactDecimal(ROLLUP_COST_PRECISION, COST_SCALE), nullable=True
    )


class _RolledUp(_Sums):
    """The dimensions of the keyed levels, hourly and daily (their time column comes first)."""

    model: Mapped[str] = mapped_column(String(200), primary_key=True, sort_order=-1)
    provider: Mapped[str] = mapped_column(String(100), primary_key=True, sort_order=-1)
    api_key_id: Mapped[str] = mapped_column(String(100), primary_key=True, sort_order=-1)
    owner: Mapped[str] = mapped_column(String(200), primary_key=True, sort_order=-1)
    api: Mapped[str] = mapped_column(String(32), primary_key=True, sort_order=-1)
    status: Mapped[str] = mapped_column(String(16), primary_key=True, sort_order=-1)


class UsageHourly(_RolledUp, Base):
    """The ledger summed per UTC hour x model x provider x key x owner x api x status (migration 0005).

    Kept by the ledger stores in the transaction that inserts the rows (`catalog.rollup`); reports
    read the whole hours outside whole days here when they group by or filter on the key, the
    owner or the api (`catalog.usage_report`; whole days come from `UsageDaily`, other hours from
    `UsageHourlyModels` or `UsageHourlyModelStatus`). A NULL dimension of a ledger row is '' here,
    so that the primary key (also the upsert's conflict target and the reports' range index, led
    by the hour) can hold it on both databases; reports turn '' back into null. Errors and
    cancellations are the `requests` of rows whose `status` says so. Token sums count known
    buckets only (NULL is unknown, summed as nothing); `cost_usd` is NULL while no row of the group
    had a cost, like SQL's SUM.
    """

    __tablename__ = "usage_hourly"

    hour: Mapped[datetime] = mapped_column(UTCDateTime(), primary_key=True, sort_order=-2)


class UsageHourlyModels(_Sums, Base):
    """`UsageHourly` without the caller's dimensions (key, owner, api): the same sums per UTC hour x
    model x provider x status (migration 0007), for reports that neither group by nor filter on
    those (4.9 times fewer rows in the bench: bench/RESULTS.md). Kept with the other levels, in the
    rows' transaction."""

    __tablename__ = "usage_hourly_models"

    hour: Mapped[datetime] = mapped_column(UTCDateTime(), primary_key=True, sort_order=-2)
    model: Mapped[str] = mapped_column(String(200), primary_key=True, sort_order=-1)
    provider: Mapped[str] = mapped_column(String(100), primary_key=True, sort_order=-1)
    status: Mapped[str] = mapped_column(String(16), primary_key=True, sort_order=-1)


class UsageHourlyModelStatus(_Sums, Base):
    """`UsageHourlyModels` without the provider: the same sums per UTC hour x model x status
    (migration 0008), for reports that neither group by nor filter on the provider, the key, the
    owner or the api (2.7 times fewer rows than `UsageHourlyModels` in the bench, whose every
    model is served by every provider: bench/RESULTS.md). Kept with the other levels, in the
    rows' transaction."""

    __tablename__ = "usage_hourly_model_status"

    hour: Mapped[datetime] = mapped_column(UTCDateTime(), primary_key=True, sort_order=-2)
    model: Mapped[str] = mapped_column(String(200), primary_key=True, sort_order=-1)
    status: Mapped[str] = mapped_column(String(16), primary_key=True, sort_order=-1)


class UsageDaily(_RolledUp, Base):
    """`UsageHourly` one level up: the same sums per UTC day (midnight UTC) x the same dimensions
    (migration 0006). A 30-day report reads about 24 times fewer rows here than hourly; the ledger
    stores keep it in the same transaction as the rows and the hourly roll-ups."""

    __tablename__ = "usage_daily"

    day: Mapped[datetime] = mapped_column(UTCDateTime(), primary_key=True, sort_order=-2)


class ApiKey(Base):
    """One API key (access.md). The secret itself is never stored: `secret_hash` is the hex SHA-256
    of it (random 32-byte secrets need no salt or slow hash), `prefix` what lists show (`sy-3fA9`).
    `updated_at` changes with every change, so a process polling the table sees what the CLI did."""

    __tablename__ = "keys"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    secret_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    name: Mapped[str] = mapped_column(String(200))
    owner: Mapped[str | None] = mapped_column(String(200), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    models: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)
    budget_usd: Mapped[Decimal | None] = mapped_column(_price_column(), nullable=True)
    budget_period: Mapped[str | None] = mapped_column(String(8), nullable=True)
    rpm: Mapped[int | None] = mapped_column(Integer, nullable=True)
    tpm: Mapped[int | None] = mapped_column(Integer, nullable=True)
    max_concurrency: Mapped[int | None] = mapped_column(Integer, nullable=True)
