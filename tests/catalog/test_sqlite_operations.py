"""What operators do to the SQLite ledger file while the service runs, through the writer's own
process (`catalog.sqlite_child`): a file deleted or replaced under the writer must not take the
rows written after it (cost.md: no row lost) into a file no path reaches any more.

Deleted: the rows wait (an outage: `behind`) until a database is at the path again, then are
written there. Replaced (a backup restored with `mv`, the old file's `-wal` and `-shm` removed):
the rows after the swap are in the file at the path. Before, the writer's process kept its
connection to the old file and committed every later row into it: answered, released from the
journal, in no file any path reaches (1,411 of 1,411 with `switchyard serve --workers 2`).
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from pathlib import Path

import structlog
from sqlalchemy.ext.asyncio import AsyncEngine

from catalog.ledger import LedgerWriter
from catalog.migrate import upgrade_async
from tests.catalog.test_ledger_writer import ledger, record
from tests.catalog.test_sqlite_writer_process import sqlite_engine


async def one_row_written(tmp_path: Path) -> tuple[AsyncEngine, LedgerWriter]:
    """A started writer on a new SQLite file `ledger.db`, `record(1)` written."""
    engine = await sqlite_engine(tmp_path)
    writer = LedgerWriter(engine, flush_interval=0.01)
    writer.start()
    writer.submit(record(1))
    await asyncio.wait_for(writer.flush(), timeout=10)
    return engine, writer


def remove_database(path: Path) -> None:
    """`rm ledger.db ledger.db-wal ledger.db-shm`."""
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


async def test_rows_after_the_database_file_is_deleted_wait_until_a_database_is_there_again(tmp_path: Path) -> None:
    engine, writer = await one_row_written(tmp_path)
    await engine.dispose()
    path = tmp_path / "ledger.db"
    remove_database(path)
    for n in range(2, 5):
        writer.submit(record(n))
    await asyncio.sleep(1.0)  # the writer's interval passed: it tried
    assert writer.pending == 3  # not "written" into the deleted file
    assert not path.exists()  # and no empty database made at its path
    await upgrade_async(f"sqlite+aiosqlite:///{path}")  # the operator makes a new one
    await asyncio.wait_for(writer.flush(), timeout=15)
    assert await ledger(engine) == [record(2), record(3), record(4)]
    assert writer.rejected == []
    await writer.close()
    await engine.dispose()


async def test_rows_after_the_database_file_is_replaced_go_to_the_file_at_its_path(tmp_path: Path) -> None:
    engine, writer = await one_row_written(tmp_path)
    await engine.dispose()
    path, copy = tmp_path / "ledger.db", tmp_path / "restored.db"
    source, target = sqlite3.connect(path), sqlite3.connect(copy)
    source.backup(target)  # `sqlite3 ledger.db ".backup restored.db"`
    source.close()
    target.close()
    os.replace(copy, path)  # `mv restored.db ledger.db`
    for suffix in ("-wal", "-shm"):  # the old file's write-ahead log, not the restored one's
        os.unlink(f"{path}{suffix}")
    for n in range(2, 5):
        writer.submit(record(n))
    await asyncio.wait_for(writer.flush(), timeout=15)
    assert await ledger(engine) == [record(n) for n in range(1, 5)]
    assert writer.rejected == []
    await writer.close()
    await engine.dispose()


async def test_a_replaced_file_is_written_by_a_new_engine_too(tmp_path: Path) -> None:
    """The rows read back through a fresh engine (no connection opened before the swap)."""
    engine, writer = await one_row_written(tmp_path)
    await engine.dispose()
    path = tmp_path / "ledger.db"
    remove_database(path)
    fresh = await sqlite_engine(tmp_path)  # a new, migrated, empty database at the same path
    writer.submit(record(2))
    await asyncio.wait_for(writer.flush(), timeout=15)
    assert await ledger(fresh) == [record(2)]
    await writer.close()
    await fresh.dispose()


async def test_rows_after_the_write_ahead_log_is_deleted_reach_the_file_other_connections_read(tmp_path: Path) -> None:
    """`rm ledger.db-wal ledger.db-shm`: the writer's connection kept committing into the deleted
    log, which no other connection (a report, `/readyz`) reads: rows invisible until a checkpoint
    or the writer's close, and lost with a `kill -9` of its process. Its next batch now opens the
    file again (closing the old connection checkpoints the old log into the file)."""
    engine, writer = await one_row_written(tmp_path)
    await engine.dispose()
    for suffix in ("-wal", "-shm"):
        os.unlink(tmp_path / f"ledger.db{suffix}")
    for n in range(2, 5):
        writer.submit(record(n))
    await asyncio.wait_for(writer.flush(), timeout=15)
    assert await ledger(engine) == [record(n) for n in range(1, 5)]
    await writer.close()
    await engine.dispose()


async def test_the_outage_log_line_says_what_the_database_answered(tmp_path: Path) -> None:
    """`ledger_outage_started` named only `LedgerUnavailable` for a lock, a full disk and a
    missing file alike: the operator could not tell them apart."""
    engine, writer = await one_row_written(tmp_path)
    await engine.dispose()
    with structlog.testing.capture_logs() as captured:
        remove_database(tmp_path / "ledger.db")
        writer.submit(record(2))
        await asyncio.sleep(1.0)
    (started,) = [line for line in captured if line["event"] == "ledger_outage_started"]
    assert started["error"] == "LedgerUnavailable"
    assert started["detail"] == "OperationalError: unable to open database file"
    await upgrade_async(f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}")
    await asyncio.wait_for(writer.flush(), timeout=15)
    await writer.close()
