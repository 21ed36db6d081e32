"""The catalog snapshot's copy on disk (`catalog.saved_snapshot`): read back, it routes and prices
exactly as the snapshot it was saved from."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

from catalog.saved_snapshot import SNAPSHOT_FILE, read_saved_snapshot, save_snapshot
from catalog.snapshot import CatalogSnapshot, DeploymentEntry, ModelEntry, PriceRow

START = datetime(2026, 1, 1, tzinfo=UTC)
MODEL = ModelEntry(
    id="chat-1",
    aliases=("chat",),
    context_window=32768,
    max_output=4096,
    capabilities=frozenset({"tools", "vision"}),
    is_default=True,
    deployments=(DeploymentEntry("primary", "org/chat-1", 100), DeploymentEntry("secondary", "chat-1-hosted", 50)),
)
PRICES = [
    PriceRow(1, "primary", "chat-1", START, input=Decimal("0.10"), output=Decimal("0.40")),
    PriceRow(2, "primary", "chat-1", START + timedelta(days=30), input=Decimal("0.000000123456789012"), output=None),
    PriceRow(3, "secondary", "chat-1", START, input=Decimal("1"), output=Decimal("2"), cache_read=Decimal("0.5")),
]


def test_a_saved_snapshot_reads_back_the_same_models_and_exact_prices(tmp_path: Path) -> None:
    snapshot = CatalogSnapshot([MODEL], PRICES)
    save_snapshot(snapshot, tmp_path)
    saved = read_saved_snapshot(tmp_path)
    assert saved is not None
    assert saved.models == (MODEL,)
    assert sorted(saved.prices, key=lambda row: row.id) == PRICES
    assert saved.resolve("chat") == MODEL
    later = START + timedelta(days=31)
    assert saved.price_at("primary", "chat-1", later) == PRICES[1]
    assert saved.prices_for("chat-1", later) == snapshot.prices_for("chat-1", later)
    assert [path.name for path in tmp_path.iterdir()] == [SNAPSHOT_FILE]  # no temporary file left


def test_no_saved_snapshot_or_a_damaged_one_reads_as_none(tmp_path: Path) -> None:
    assert read_saved_snapshot(tmp_path) is None
    (tmp_path / SNAPSHOT_FILE).write_text('{"version": 1, "models": [')
    assert read_saved_snapshot(tmp_path) is None


def test_a_snapshot_is_saved_into_a_directory_not_made_yet(tmp_path: Path) -> None:
    """With the ledger off no journal makes the directory; the catalog's copy still lands there."""
    directory = tmp_path / "journal" / "nested"
    save_snapshot(CatalogSnapshot([MODEL], PRICES), directory)
    saved = read_saved_snapshot(directory)
    assert saved is not None
    assert saved.models == (MODEL,)
