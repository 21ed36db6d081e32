"""Copies of the catalog snapshot and of the key table on local disk, for starting while the
database is down.

cost.md: with the journal, the service starts and serves while its database is unreachable. It
needs its catalog for that (models to route, prices to cost the rows it journals), so each
successful `load_snapshot` is saved beside the journal (`catalog-snapshot.json`) and read back
when a start cannot reach the database. In keys mode it needs its keys too (a worker that uvicorn
restarted during an outage failed its start, and uvicorn stopped the whole service): the key ring
saves every read of the table that changed it (`keys-snapshot.json`: the keys as the ring holds
them, hashes and limits, never a secret; readable by the service's user only). The files are
msgspec JSON (Decimals as strings, so prices and budgets come back exact), written to a temporary
file and renamed over the old one: a reader never sees half a file, and several workers saving at
once each rename a whole one.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from catalog.keys import KeyRecord
from catalog.snapshot import CatalogSnapshot, ModelEntry, PriceRow

SNAPSHOT_FILE = "catalog-snapshot.json"
KEYS_FILE = "keys-snapshot.json"
FORMAT_VERSION = 1


class SavedSnapshot(msgspec.Struct, frozen=True):
    version: int
    models: list[ModelEntry]
    prices: list[PriceRow]


def save_snapshot(snapshot: CatalogSnapshot, directory: Path) -> None:
    """Write `snapshot` to `directory` (made when missing: with `[ledger] enabled = false` no
    journal made it) atomically; raises OSError when it cannot."""
    saved = SavedSnapshot(FORMAT_VERSION, list(snapshot.models), list(snapshot.prices))
    _write(directory, SNAPSHOT_FILE, msgspec.json.encode(saved))


def read_saved_snapshot(directory: Path) -> CatalogSnapshot | None:
    """The snapshot last saved in `directory`, or None when there is none (or it is unreadable)."""
    try:
        saved = msgspec.json.decode((directory / SNAPSHOT_FILE).read_bytes(), type=SavedSnapshot)
    except (OSError, msgspec.DecodeError):
        return None
    if saved.version != FORMAT_VERSION:
        return None
    return CatalogSnapshot(saved.models, saved.prices)


class SavedKeys(msgspec.Struct, frozen=True):
    version: int
    keys: list[KeyRecord]


def save_keys(records: list[KeyRecord], directory: Path) -> None:
    """Write the key table's `records` to `directory` atomically, readable by this user only;
    raises OSError when it cannot."""
    _write(directory, KEYS_FILE, msgspec.json.encode(SavedKeys(FORMAT_VERSION, records)), mode=0o600)


def read_saved_keys(directory: Path) -> list[KeyRecord] | None:
    """The keys last saved in `directory`, or None when there are none (or they are unreadable)."""
    try:
        saved = msgspec.json.decode((directory / KEYS_FILE).read_bytes(), type=SavedKeys)
    except (OSError, msgspec.DecodeError):
        return None
    return saved.keys if saved.version == FORMAT_VERSION else None


def _write(directory: Path, name: str, data: bytes, mode: int = 0o644) -> None:
    """`data` as `directory/name` (the directory made when missing: with `[ledger] enabled = false`
    no journal made it), through a temporary file renamed over the old one."""
    directory.mkdir(parents=True, exist_ok=True)
    temporary = directory / f".{name}.{os.getpid()}"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as file:
        file.write(data)
    os.replace(temporary, directory / name)
