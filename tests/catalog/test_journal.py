"""The ledger's journal under the writer: rows on disk before the database, replayed once, read
back through an outage with memory flat — asserted on the journal's files and real DB rows."""

from __future__ import annotations

import asyncio
import gc
import sys
import tracemalloc
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import msgspec
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from catalog.journal import REJECTED, SEGMENT_GLOB, Journal
from catalog.ledger import LedgerWriter
from catalog.ledger_write import write_records
from catalog.migrate import upgrade_async
from catalog.records import LedgerRecord
from tests.catalog.test_ledger_writer import FAILED, FULL, ledger, record
from tests.support.waiting import wait_until


def segments(directory: Path) -> list[Path]:
    return sorted(directory.glob(SEGMENT_GLOB))


def journal_rows(directory: Path) -> list[LedgerRecord]:
    """Every row in the directory's segments, as a reader of the file format would decode them."""
    rows = []
    for path in segments(directory):
        header, *lines = path.read_bytes().splitlines()
        assert msgspec.json.decode(header)["switchyard_journal"] == 1
        rows += [msgspec.json.decode(line, type=LedgerRecord) for line in lines]
    return rows


def opened(directory: Path, **options: float) -> Journal:
    journal = Journal(directory, **options)  # type: ignore[arg-type]
    journal.open()
    return journal


async def test_a_row_is_in_the_journal_when_submit_returns_and_gone_once_committed(
    engine: AsyncEngine, tmp_path: Path
) -> None:
    journal = opened(tmp_path / "journal")
    writer = LedgerWriter(engine, journal=journal, required=True, flush_interval=10.0)
    writer.start()
    exact = record(7, cost_usd=Decimal("0.000012345678901234"), estimated_cost_usd=Decimal("1E-18"))
    for item in (FULL, exact, FAILED):
        writer.submit(item)
    assert journal_rows(tmp_path / "journal") == [FULL, exact, FAILED]  # before any database write
    assert await ledger(engine) == []
    await writer.flush()
    assert await ledger(engine) == [FULL, FAILED, exact]  # by request id
    await writer.close()
    assert segments(tmp_path / "journal") == []  # every row committed: nothing left to replay


async def test_rows_a_previous_process_left_are_replayed_once(engine: AsyncEngine, tmp_path: Path) -> None:
    """A process that stopped with rows unwritten (here: none of them committed) leaves its
    segments; the next one adopts and writes them, skipping the ones the database already has."""
    directory = tmp_path / "journal"
    left = opened(directory)
    rows = [record(n) for n in range(600)]
    for item in rows:
        assert left.append(item)
    left.close(committed=0)
    await write_records(engine, rows[:250])  # the dead process had written some of them
    assert len(journal_rows(directory)) == 600

    journal = opened(directory)
    assert journal.appended == 600
    writer = LedgerWriter(engine, journal=journal, batch_size=100)
    writer.start()
    new = record(1000)
    writer.submit(new)
    await writer.flush()
    assert await ledger(engine) == [*rows, new]
    assert journal_rows(directory) == [new]  # the adopted segment is deleted once replayed; the active one stays
    await writer.close()
    assert segments(directory) == []


async def test_a_live_process_segments_are_not_adopted(engine: AsyncEngine, tmp_path: Path) -> None:
    directory = tmp_path / "journal"
    first = opened(directory)
    assert first.append(FULL)
    second = opened(directory)  # another worker on the same directory
    assert (second.appended, len(segments(directory))) == (0, 2)
    second.close(committed=0)
    first.close(committed=0)
    third = opened(directory)
    assert third.appended == 1
    third.close(committed=1)
    assert segments(directory) == []


async def test_through_an_outage_rows_wait_on_disk_not_in_memory(
    fresh_url: Callable[[], Awaitable[str]], tmp_path: Path
) -> None:
    """The database is not there (not migrated: every write fails); 20,000 rows later the
    writer holds about one batch of them in memory, and once it is back every row is written once."""
    url = await fresh_url()
    engine = create_async_engine(url)
    directory = tmp_path / "journal"
    writer = LedgerWriter(engine, journal=opened(directory, segment_bytes=1 << 20), batch_size=256)
    writer.start()
    now = datetime.now(UTC)
    writer.submit(record(0, started_at=now, finished_at=now))  # recent: "behind" only once writes fail
    await wait_until(lambda: writer.state == "behind", within=5.0)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for n in range(1, 20_000):
        writer.submit(record(n))  # each record is dropped by the test at once: only the writer can keep it
    gc.collect()
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert grown < 1_000_000, f"{grown} bytes held for 20,000 rows"  # ~ 14 MB if they stayed in memory
    assert writer.pending == 20_000
    assert len(segments(directory)) > 5  # rotated: about 600 bytes a row, 1 MiB a segment
    await upgrade_async(url)
    await wait_until(lambda: writer.pending == 0, within=60.0)
    rows = await ledger(engine)
    assert [row.request_id for row in rows] == [record(n).request_id for n in range(20_000)]
    assert writer.state == "ok"
    assert len(segments(directory)) == 1  # only the active one: every full one was deleted
    await writer.close()
    await engine.dispose()


async def test_a_torn_last_line_is_ignored_and_a_corrupt_one_set_aside(engine: AsyncEngine, tmp_path: Path) -> None:
    """A crash can leave half a line at a segment's end (never read) and, on a damaged disk, a line
    that does not decode (kept in `rejected.jsonl`, the rows around it written)."""
    directory = tmp_path / "journal"
    left = opened(directory)
    left.append(FULL)
    left.close(committed=0)
    (path,) = segments(directory)
    with path.open("ab") as file:
        file.write(b'{"request_id": "garbage\n')
        file.write(msgspec.json.encode(FAILED) + b"\n")
        file.write(msgspec.json.encode(record(9))[:40])  # torn: no newline
    writer = LedgerWriter(engine, journal=opened(directory))
    writer.start()
    await writer.flush()
    assert await ledger(engine) == [FULL, FAILED]
    assert (directory / REJECTED).read_bytes() == b'{"request_id": "garbage\n'
    await writer.close()


async def test_an_unwritable_journal_stops_accepting_but_keeps_the_rows(engine: AsyncEngine, tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    journal = opened(blocker / "journal")
    assert journal.broken
    writer = LedgerWriter(engine, journal=journal, required=True)
    assert (writer.accepting, writer.state) == (False, "unwritable")
    writer.start()
    writer.submit(FULL)  # a request that was already running: its row is kept in memory
    await writer.flush()
    assert await ledger(engine) == [FULL]
    optional = LedgerWriter(engine, journal=journal, required=False)
    assert (optional.accepting, optional.state) == (True, "unwritable")
    await writer.close()
    await optional.close()


async def test_a_broken_journal_is_writable_again_only_with_room_to_write(tmp_path: Path) -> None:
    """On a disk with a few kilobytes left a fresh segment's header fitted, the journal said
    writable, its next row failed: traffic flapped between 503 and 200 every second. It comes back
    once `min_free_bytes` are free (here: more than any disk has, then nothing)."""
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    journal = Journal(blocker / "journal", min_free_bytes=1 << 62)
    journal.open()
    assert journal.broken
    blocker.unlink()  # a directory could be made now: only the room is missing
    maintenance = asyncio.create_task(journal.run())
    try:
        await asyncio.sleep(1.5)  # a retry is due every second
        assert journal.broken
        journal.min_free_bytes = 0
        await wait_until(lambda: not journal.broken, within=3.0, what="the journal writable again")
        assert journal.append(record(0))
    finally:
        maintenance.cancel()
        journal.close(0)


FULL_DISK = """
import resource, sys
from pathlib import Path
from catalog.journal import Journal
from tests.catalog.test_ledger_writer import record

journal = Journal(Path(sys.argv[1]))
journal.open()
journal.append(record(0))
size = journal.segments[-1].size
resource.setrlimit(resource.RLIMIT_FSIZE, (size + 1000, resource.RLIM_INFINITY))  # room for one more row
accepted = [journal.append(record(n)) for n in range(1, 5)]
print(accepted, journal.broken, journal.appended)
"""


async def test_a_full_disk_breaks_the_journal_without_a_torn_line(engine: AsyncEngine, tmp_path: Path) -> None:
    """The file size limit stands in for a full disk (the write fails with EFBIG, or stops
    short): the row that did not fit is refused whole, the journal says it is broken, and the
    rows before it replay."""
    directory = tmp_path / "journal"
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", FULL_DISK, str(directory), stdout=asyncio.subprocess.PIPE
    )
    stdout, _ = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0
    assert stdout.decode().splitlines()[-1] == "[True, False, False, False] True 2"
    assert [row.request_id for row in journal_rows(directory)] == [record(0).request_id, record(1).request_id]
    writer = LedgerWriter(engine, journal=opened(directory))
    writer.start()
    await writer.flush()
    assert await ledger(engine) == [record(0), record(1)]
    await writer.close()


async def test_a_committed_segment_is_rotated_away_so_a_restart_replays_little(
    engine: AsyncEngine, tmp_path: Path
) -> None:
    directory = tmp_path / "journal"
    writer = LedgerWriter(engine, journal=opened(directory, committed_bytes=3000), batch_size=10)
    writer.start()
    for n in range(100):
        writer.submit(record(n))
        if n % 10 == 9:
            await writer.flush()
    assert len(await ledger(engine)) == 100
    assert len(journal_rows(directory)) < 10  # about 600 bytes a row: at most the last few stay
    await writer.close()


async def test_under_load_a_segment_is_rotated_though_the_writer_is_a_batch_behind(
    engine: AsyncEngine, tmp_path: Path
) -> None:
    """Rows keep coming while batches are written: the active segment always holds rows the
    database has not taken yet, and is still rotated once it passes `committed_bytes`, so the
    committed ones are deleted instead of piling up until `segment_bytes`."""
    directory = tmp_path / "journal"
    writer = LedgerWriter(engine, journal=opened(directory, committed_bytes=3000), batch_size=10, flush_interval=60)
    writer.start()
    for n in range(5):
        writer.submit(record(n))
    for n in range(5, 205):
        writer.submit(record(n))
        if n % 10 == 4:  # a batch of 10 is due: wait until it is written, 5 rows still pending
            await wait_until(lambda: writer.pending == 5, what="the batch to be written")
    kept = [row.request_id for row in journal_rows(directory)]
    assert 5 <= len(kept) < 30  # about 600 bytes a row: the last segments only
    assert kept[-5:] == [record(n).request_id for n in range(200, 205)]  # the rows not committed stay
    await writer.flush()
    assert len(await ledger(engine)) == 205
    await writer.close()
