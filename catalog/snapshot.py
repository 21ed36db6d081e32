"""An immutable in-memory view of the SQL catalog, loaded once per sync.

The request path resolves models and prices many times a second and must never wait on SQL, so
the app loads a `CatalogSnapshot` at start-up (and after each sync) and swaps the reference; a
snapshot never changes after it is built. Prices are kept per (provider, model) sorted by
`effective_from`, so the row in effect at a request's start time is a bisection.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from decimal import Decimal
from types import MappingProxyType

from msgspec import Struct
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from catalog.tables import Deployment, Model, ModelAlias, Price


class DeploymentEntry(Struct, frozen=True):
    provider: str
    upstream_model: str
    priority: int


class ModelEntry(Struct, frozen=True):
    id: str
    aliases: tuple[str, ...]
    context_window: int
    max_output: int
    capabilities: frozenset[str]
    is_default: bool
    deployments: tuple[DeploymentEntry, ...]  # highest priority first


class PriceRow(Struct, frozen=True):
    """One `prices` row: USD per million tokens, None where the bucket has no rate."""

    id: int
    provider: str
    model: str
    effective_from: datetime
    input: Decimal | None = None
    output: Decimal | None = None
    cache_read: Decimal | None = None
    cache_write: Decimal | None = None
    reasoning: Decimal | None = None


class _PriceSeries:
    """One (provider, model)'s rows by start. A row with no rate at all (`catalog.sync`: the files
    no longer price the pair) is no price from its start: `at` answers None there."""

    __slots__ = ("priced", "rows", "starts")

    def __init__(self, rows: list[PriceRow]) -> None:
        self.rows = sorted(rows, key=lambda row: row.effective_from)
        self.starts = [row.effective_from for row in self.rows]
        self.priced = [row if _rated(row) else None for row in self.rows]

    def at(self, when: datetime) -> PriceRow | None:
        index = bisect_right(self.starts, when) - 1
        return self.priced[index] if index >= 0 else None

    def until(self, when: datetime) -> datetime | None:
        """When the row in effect at `when` stops being it: the next row's start (None: never)."""
        index = bisect_right(self.starts, when)
        return self.starts[index] if index < len(self.starts) else None


def _rated(row: PriceRow) -> bool:
    return any(rate is not None for rate in (row.input, row.output, row.cache_read, row.cache_write, row.reasoning))


class CatalogSnapshot:
    """Models by id and alias, and prices by (provider, model) and time. Read-only."""

    __slots__ = ("_by_name", "_models", "_prices", "_providers_by_model")

    def __init__(self, models: Iterable[ModelEntry], prices: Iterable[PriceRow]) -> None:
        self._models = tuple(sorted(models, key=lambda model: model.id))
        by_name: dict[str, ModelEntry] = {}
        for model in self._models:
            by_name.update(dict.fromkeys(model.aliases, model))
        by_name.update((model.id, model) for model in self._models)
        self._by_name: Mapping[str, ModelEntry] = MappingProxyType(by_name)
        grouped: defaultdict[tuple[str, str], list[PriceRow]] = defaultdict(list)
        for row in prices:
            grouped[(row.provider, row.model)].append(row)
        self._prices = {key: _PriceSeries(rows) for key, rows in grouped.items()}
        providers: defaultdict[str, list[str]] = defaultdict(list)
        for provider, model_id in sorted(self._prices):
            providers[model_id].append(provider)
        self._providers_by_model = {key: tuple(value) for key, value in providers.items()}

    @classmethod
    def empty(cls) -> CatalogSnapshot:
        return cls((), ())

    @property
    def models(self) -> tuple[ModelEntry, ...]:
        """Every model, ordered by id."""
        return self._models

    @property
    def prices(self) -> tuple[PriceRow, ...]:
        """Every price row (by provider, model and `effective_from`)."""
        return tuple(row for key in sorted(self._prices) for row in self._prices[key].rows)

    def same_as(self, other: CatalogSnapshot) -> bool:
        """Whether `other` holds the same models (aliases, deployments) and price rows."""
        return self._models == other._models and self.prices == other.prices

    def resolve(self, name: str) -> ModelEntry | None:
        """The model whose id or alias is `name`."""
        return self._by_name.get(name)

    def default_models(self) -> tuple[ModelEntry, ...]:
        return tuple(model for model in self._models if model.is_default)

    def price_at(self, provider: str, model: str, when: datetime) -> PriceRow | None:
        """The row in effect at `when` (aware) for `model` (canonical id) served by `provider`."""
        if when.tzinfo is None:
            raise ValueError("price_at needs a timezone-aware datetime")
        series = self._prices.get((provider, model))
        return series.at(when) if series is not None else None

    def price_until(self, provider: str, model: str, when: datetime) -> datetime | None:
        """When `price_at(provider, model, when)` changes next: the next row's start, None if never."""
        series = self._prices.get((provider, model))
        return series.until(when) if series is not None else None

    def first_priced(self, model: str) -> datetime | None:
        """When the model's earliest price row (any provider) took effect; None when it has none."""
        starts = [self._prices[(provider, model)].starts[0] for provider in self._providers_by_model.get(model, ())]
        return min(starts, default=None)

    def prices_for(self, model: str, when: datetime | None = None) -> dict[str, PriceRow]:
        """Per provider, the row in effect at `when` (default: now) for `model`."""
        moment = when or datetime.now(UTC)
        found: dict[str, PriceRow] = {}
        for provider in self._providers_by_model.get(model, ()):
            row = self._prices[(provider, model)].at(moment)
            if row is not None:
                found[provider] = row
        return found


async def _read_models(connection: AsyncConnection) -> list[ModelEntry]:
    aliases: defaultdict[str, list[str]] = defaultdict(list)
    for alias, model_id in await connection.execute(
        select(ModelAlias.alias, ModelAlias.model_id).order_by(ModelAlias.alias)
    ):
        aliases[model_id].append(alias)
    deployments: defaultdict[str, list[DeploymentEntry]] = defaultdict(list)
    query = select(Deployment.model_id, Deployment.provider, Deployment.upstream_model, Deployment.priority)
    for model_id, provider, upstream_model, priority in await connection.execute(
        query.order_by(Deployment.priority.desc(), Deployment.provider, Deployment.upstream_model)
    ):
        deployments[model_id].append(DeploymentEntry(provider, upstream_model, priority))
    rows = await connection.execute(select(Model).order_by(Model.id))
    return [
        ModelEntry(
            id=row.id,
            aliases=tuple(aliases[row.id]),
            context_window=row.context_window,
            max_output=row.max_output,
            capabilities=frozenset(row.capabilities),
            is_default=row.is_default,
            deployments=tuple(deployments[row.id]),
        )
        for row in rows
    ]


async def _read_prices(connection: AsyncConnection) -> list[PriceRow]:
    rows = await connection.execute(select(Price).order_by(Price.id))
    return [
        PriceRow(
            id=row.id,
            provider=row.provider,
            model=row.model_id,
            effective_from=row.effective_from,
            input=row.input,
            output=row.output,
            cache_read=row.cache_read,
            cache_write=row.cache_write,
            reasoning=row.reasoning,
        )
        for row in rows
    ]


async def load_snapshot(engine: AsyncEngine) -> CatalogSnapshot:
    """Read the whole catalog in one transaction and build a snapshot of it."""
    async with engine.connect() as connection:
        models = await _read_models(connection)
        prices = await _read_prices(connection)
    return CatalogSnapshot(models, prices)
