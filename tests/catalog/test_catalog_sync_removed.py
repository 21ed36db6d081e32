"""`switchyard catalog sync` (config.md): the files say what is priced from now on."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

from catalog.database import open_engine
from catalog.files import CatalogFile, DeploymentSpec, ModelSpec, PriceSpec
from catalog.migrate import upgrade_async
from catalog.snapshot import load_snapshot
from catalog.sync import CHANGE_LEAD, sync_catalog

JAN = datetime(2026, 1, 1, tzinfo=UTC)
NOW = datetime(2026, 6, 15, 12, 30, tzinfo=UTC)
MODEL = ModelSpec(id="m", context_window=8192, max_output=1024, deployments=(DeploymentSpec("p", "u"),))


async def test_a_price_removed_from_the_files_no_longer_applies(tmp_path: Path) -> None:
    """A `[[prices]]` entry deleted from the files (a wrong rate, a provider that no longer bills
    this model) stayed in effect for ever: the sync added nothing, reported nothing, and every
    later request was still charged at it. History stays (rows are never deleted); from the
    change's instant on, the (provider, model) should be unpriced, as the files now say."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'catalog.db'}"
    await upgrade_async(url)
    engine = open_engine(url)
    try:
        priced = PriceSpec(provider="p", model="m", effective_from=JAN, input=Decimal("1"), output=Decimal("2"))
        await sync_catalog(engine, CatalogFile(models=(MODEL,), prices=(priced,)), now=NOW)
        removed = await sync_catalog(engine, CatalogFile(models=(MODEL,)), now=NOW)
        again = await sync_catalog(engine, CatalogFile(models=(MODEL,)), now=NOW + timedelta(hours=1))
        snapshot = await load_snapshot(engine)
    finally:
        await engine.dispose()
    assert (removed.prices_added, again.prices_added) == (1, 0)  # once, then idempotent
    assert snapshot.price_at("p", "m", NOW - timedelta(days=1)) is not None  # history kept
    assert snapshot.price_at("p", "m", NOW + CHANGE_LEAD + timedelta(seconds=1)) is None  # unpriced, not $0
    assert snapshot.prices_for("m", NOW + timedelta(hours=1)) == {}  # as `/api/v1/models` lists it
