"""A copy of the catalog snapshot on local disk, for starting while the database is down.

cost.md: with the journal, the service starts and serves while its database is unreachable. It
needs its catalog for that (models to route, prices to cost the rows it journals), so each
successful `load_snapshot` is saved beside the journal (`catalog-snapshot.json`) and read back
when a start cannot reach the database. The file is msgspec JSON of the snapshot's models and
price rows (Decimals as strings, so prices come back exact), written to a temporary file and
renamed over the old one: a reader never sees half a file, and several workers saving at once
each rename a whole one.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from catalog.snapshot import CatalogSnapshot, ModelEntry, PriceRow

SNAPSHOT_FILE = "catalog-snapshot.json"
FORMAT_VERSION = 1


class SavedSnapshot(msgspec.Struct, frozen=True):
    version: int
    models: list[ModelEntry]
    prices: list[PriceRow]


def save_snapshot(snapshot: CatalogSnapshot, directory: Path) -> None:
    """Write `snapshot` to `directory` (made when missing: with `[ledger] enabled = false` no
    journal made it) atomically; raises OSError when it cannot."""
    directory.mkdir(parents=True, exist_ok=True)
    saved = SavedSnapshot(FORMAT_VERSION, list(snapshot.models), list(snapshot.prices))
    target = directory / SNAPSHOT_FILE
    temporary = directory / f".{SNAPSHOT_FILE}.{os.getpid()}"
    temporary.write_bytes(msgspec.json.encode(saved))
    os.replace(temporary, target)


def read_saved_snapshot(directory: Path) -> CatalogSnapshot | None:
    """The snapshot last saved in `directory`, or None when there is none (or it is unreadable)."""
    try:
        saved = msgspec.json.decode((directory / SNAPSHOT_FILE).read_bytes(), type=SavedSnapshot)
    except (OSError, msgspec.DecodeError):
        return None
    if saved.version != FORMAT_VERSION:
        return None
    return CatalogSnapshot(saved.models, saved.prices)
