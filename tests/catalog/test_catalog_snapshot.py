"""The in-memory catalog snapshot, loaded from SQL after a sync."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from catalog.files import CatalogFile, DeploymentSpec, ModelSpec, PriceSpec
from catalog.snapshot import CatalogSnapshot, DeploymentEntry, ModelEntry, PriceRow, load_snapshot
from catalog.sync import sync_catalog

JAN = datetime(2026, 1, 1, tzinfo=UTC)
MAR = datetime(2026, 3, 1, tzinfo=UTC)
TICK = timedelta(microseconds=1)

CATALOG = CatalogFile(
    models=(
        ModelSpec(
            id="gemma-4-31b",
            context_window=131072,
            max_output=16384,
            aliases=("gemma", "gemma-4"),
            capabilities=frozenset({"tools", "reasoning"}),
            default=True,
            deployments=(
                DeploymentSpec("fastrun", "google/gemma-4-31b-it", 50),
                DeploymentSpec("local", "google/gemma-4-31b-it", 100),
                DeploymentSpec("primalabs", "gemma-4-31b", 70),
            ),
        ),
        ModelSpec(id="aardvark-1", context_window=4096, max_output=512),
    ),
    prices=(
        PriceSpec("fastrun", "gemma-4-31b", JAN, input=Decimal("0.10"), output=Decimal("0.40")),
        PriceSpec(
            "fastrun", "gemma-4-31b", MAR, input=Decimal("0.12"), output=Decimal("0.40"), cache_read=Decimal("0.025")
        ),
        PriceSpec("local", "gemma-4-31b", JAN, input=Decimal(0), output=Decimal(0)),
    ),
)


@pytest.fixture
async def snapshot(engine: AsyncEngine) -> CatalogSnapshot:
    await sync_catalog(engine, CATALOG)
    return await load_snapshot(engine)


async def test_resolve_by_id_and_alias(snapshot: CatalogSnapshot) -> None:
    gemma = snapshot.resolve("gemma")
    assert gemma == ModelEntry(
        id="gemma-4-31b",
        aliases=("gemma", "gemma-4"),
        context_window=131072,
        max_output=16384,
        capabilities=frozenset({"tools", "reasoning"}),
        is_default=True,
        deployments=(
            DeploymentEntry("local", "google/gemma-4-31b-it", 100),
            DeploymentEntry("primalabs", "gemma-4-31b", 70),
            DeploymentEntry("fastrun", "google/gemma-4-31b-it", 50),
        ),
    )
    assert snapshot.resolve("gemma-4") is gemma
    assert snapshot.resolve("gemma-4-31b") is gemma
    assert snapshot.resolve("google/gemma-4-31b-it") is None
    assert snapshot.resolve("Gemma") is None


async def test_models_are_ordered_and_defaults_listed(snapshot: CatalogSnapshot) -> None:
    assert [model.id for model in snapshot.models] == ["aardvark-1", "gemma-4-31b"]
    assert [model.id for model in snapshot.default_models()] == ["gemma-4-31b"]
    aardvark = snapshot.resolve("aardvark-1")
    assert aardvark is not None
    assert aardvark.deployments == ()
    assert aardvark.aliases == ()


async def test_price_at_picks_the_row_in_effect(snapshot: CatalogSnapshot) -> None:
    before = snapshot.price_at("fastrun", "gemma-4-31b", JAN - TICK)
    first = snapshot.price_at("fastrun", "gemma-4-31b", JAN)
    last_of_first = snapshot.price_at("fastrun", "gemma-4-31b", MAR - TICK)
    second = snapshot.price_at("fastrun", "gemma-4-31b", MAR)
    assert before is None
    assert first is not None
    assert first == last_of_first
    assert (first.input, first.output, first.cache_read, first.effective_from) == (
        Decimal("0.10"),
        Decimal("0.40"),
        None,
        JAN,
    )
    assert second is not None
    assert second.id != first.id
    assert (second.input, second.cache_read, second.effective_from) == (Decimal("0.12"), Decimal("0.025"), MAR)
    assert snapshot.price_at("primalabs", "gemma-4-31b", MAR) is None
    assert snapshot.price_at("fastrun", "gemma", MAR) is None  # prices are keyed by the canonical id


async def test_prices_for_gives_the_row_in_effect_per_provider(snapshot: CatalogSnapshot) -> None:
    now = snapshot.prices_for("gemma-4-31b", datetime(2026, 2, 1, tzinfo=UTC))
    assert sorted(now) == ["fastrun", "local"]
    assert now["fastrun"].input == Decimal("0.10")
    assert now["local"].input == Decimal(0)
    assert snapshot.prices_for("gemma-4-31b")["fastrun"].input == Decimal("0.12")
    assert snapshot.prices_for("aardvark-1") == {}


def test_price_at_needs_an_aware_time() -> None:
    row = PriceRow(id=1, provider="p", model="m", effective_from=JAN, input=Decimal("1"))  # a row with no rate is none
    snapshot = CatalogSnapshot((), (row,))
    assert snapshot.price_at("p", "m", JAN) == row
    with pytest.raises(ValueError, match="timezone-aware"):
        snapshot.price_at("p", "m", datetime(2026, 1, 2))


def test_empty_snapshot() -> None:
    empty = CatalogSnapshot.empty()
    assert empty.models == ()
    assert empty.default_models() == ()
    assert empty.resolve("x") is None
