"""The ledger's local journal: every row on disk before its response's last byte is sent.

cost.md: "no row is lost". `Journal.append(record)` is called on the request path (through
`LedgerWriter.submit`, from the pipeline's `_close`, before the JSON answer is sent or the final
SSE frames are rendered) and costs one msgspec encode and ONE `os.write` of one line: a row is in
the operating system's page cache, so a `kill -9` cannot lose it. Durability against a machine
crash is `fsync` every `[ledger] fsync_interval_s`, on the journal's own thread (never on the
event loop): a crash loses at most the last interval.

File format (a directory, `[ledger] journal`, relative to the config file):

    ledger-<time_ns:019>-<pid>.jsonl   segments. Line 1 is a header,
                                       {"switchyard_journal":1,"pid":…,"created":"…"}; every
                                       other line is one `LedgerRecord` as msgspec JSON (its
                                       field names as keys, Decimals as strings, RFC 3339
                                       times), so the format follows the record's fields and a
                                       field added later decodes from old lines by its default.
    rejected.jsonl                     rows the database refused as data (never replayed)
    catalog-snapshot.json              the last catalog loaded from SQL (catalog.saved_snapshot)

A segment is rotated when it reaches `segment_bytes` (64 MiB: a long outage at full load makes
few files, each holding one descriptor and its lock) or, once the database has taken some of its
rows, when it passes `committed_bytes` (1 MiB), and deleted once every row in it is committed to
the database (`release(committed)`). "Some", not "all": under load the writer is always a batch
behind, so the active segment never has every row committed. So while the writer keeps up, a
segment holds about a megabyte of rows: a `kill -9` leaves little to replay, and a segment is
usually deleted before the next `fsync`, its pages never written to the disk (50 MiB for 79,000
rows in the bench became 6 MiB: bench/RESULTS.md). In an outage nothing is committed and the
active segment grows to `segment_bytes`. Rows are numbered in append order (`seq`, starting at
the adopted segments' rows); a segment knows its first seq and its row count.

Who owns a segment: the process that holds its `flock`, for as long as the file exists. At start
a journal adopts every segment no live process holds (a killed process's, or a clean shutdown's
rows the database never took); adopted rows come first in seq order and are replayed by the
writer like rows of an outage, idempotently (the stores skip a known request id). Several
workers sharing one directory each adopt distinct segments (the lock decides).

A failed write (disk full, read-only, I/O error) truncates the torn line away, marks the journal
`broken` and raises nothing: `append` returns False and the writer keeps that row in memory. The
maintenance task (`run`) tries a fresh segment every `_RETRY_S` while broken, once `min_free_bytes`
are free (by default 16 MiB, or a quarter of a smaller volume): on a full disk a fresh segment's
header fitted, the next row did not (503/200 flapping). Rows a broken journal could not take wait
in the writer's memory and are journaled as soon as it takes rows again (`LedgerWriter`).

A segment whose file left its path (its directory deleted or replaced while the process runs)
is written back under the directory at the next fsync interval (`Journal._restore_moved`): until
then a `kill -9` would lose the rows only an open descriptor still reached.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import msgspec
import structlog

from catalog.journal_files import (
    Segment,
    adopt,
    copy_range,
    discard,
    fsync_all,
    moved,
    read_rows,
    restored,
    room_to_write,
    segment_path,
)
from catalog.records import RECORD_JSON, LedgerRecord

SEGMENT_GLOB = "ledger-*.jsonl"
REJECTED = "rejected.jsonl"
FORMAT_VERSION = 1
_RETRY_S = 1.0

# Not cached on first use (the app's loggers are): the ledger logs rarely (outages, replays), and a
# logger cached at import time would keep writing to the first app's writer in a process that
# configures logging again (tests, an embedding application).
log = structlog.wrap_logger(None, cache_logger_on_first_use=False, logger_factory_args=("switchyard.ledger",))


class ReadBatch(msgspec.Struct, frozen=True):
    """Rows read back from the journal, in order: the records and the lines that did not decode
    (set aside by the writer); together they are the rows read."""

    records: list[LedgerRecord]
    bad: list[bytes]


class Journal:
    """Append-only segments in one directory; see the module docstring for the format."""

    def __init__(
        self,
        directory: Path,
        *,
        fsync_interval: float = 1.0,
        segment_bytes: int = 64 << 20,
        committed_bytes: int = 1 << 20,
        min_free_bytes: int | None = None,
    ) -> None:
        self.directory = directory
        self.min_free_bytes = min_free_bytes
        self.fsync_interval = fsync_interval
        self.segment_bytes = segment_bytes
        self.committed_bytes = committed_bytes
        self.segments: list[Segment] = []
        self.appended = 0  # seq of the next row
        self.error: str | None = None  # why the journal is broken (None: writable)
        self._line = bytearray()
        self._dirty = False
        self._syncing = False
        self._to_close: list[int] = []
        self._cursor: tuple[int, Segment | None, int] = (-1, None, 0)  # where the last read ended
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="ledger-journal")

    @property
    def broken(self) -> bool:
        return self.error is not None

    def open(self) -> int:
        """Create the directory, adopt the segments no live process owns and start a fresh one.
        Returns the rows adopted. Never raises: a directory that cannot be used leaves the
        journal `broken` (the adopted rows are still read back)."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            for path in sorted(self.directory.glob(SEGMENT_GLOB)):
                segment = adopt(path, self.appended)
                if segment is not None:
                    self.segments.append(segment)
                    self.appended += segment.rows
            self._new_segment()
        except OSError as exc:
            self._broken_by(exc)
        return sum(segment.rows for segment in self.segments)

    def adopted_since(self) -> datetime | None:
        """`finished_at` of the oldest row the adopted segments hold (the writer's age of what is
        pending before it has read any: a restart with a backlog said `ok`, 0 s old)."""
        return min((segment.oldest for segment in self.segments if segment.oldest is not None), default=None)

    def append(self, record: LedgerRecord, encoded: bytes | None = None) -> bool:
        """Write `record` as one line with one `os.write`; False (and the journal broken) when the
        operating system refused it. `encoded`: the record's msgspec JSON when the caller has it
        already (the pipeline encodes each record once, for this line and the log's)."""
        if self.error is not None:
            return False
        segment = self.segments[-1]
        line = self._line  # reused: encoded in place, one allocation fewer per row
        if encoded is None:
            RECORD_JSON.encode_into(record, line)
        else:
            line[:] = encoded
        line.append(0x0A)
        try:
            written = os.write(segment.fd, line)
        except OSError as exc:
            self._fail(segment, exc)
            return False
        if written != len(line):  # the disk filled up mid-line
            self._fail(segment, OSError(errno.ENOSPC, f"short write: {written} of {len(line)} bytes"))
            return False
        segment.size += written
        segment.rows += 1
        self.appended += 1
        self._dirty = True
        if segment.size >= self.segment_bytes:
            self._rotate()
        return True

    def _fail(self, segment: Segment, exc: OSError) -> None:
        with contextlib.suppress(OSError):
            os.ftruncate(segment.fd, segment.size)  # no torn line for the reader to meet
        segment.sealed = True
        self._broken_by(exc)

    def _broken_by(self, exc: OSError) -> None:
        self.error = f"{type(exc).__name__}: {exc.strerror or exc}"
        log.error("ledger_journal_unwritable", directory=str(self.directory), error=self.error)

    def _rotate(self) -> None:
        try:
            self._new_segment()
        except OSError as exc:
            self._fail(self.segments[-1], exc)

    def _new_segment(self) -> None:
        if self.segments:
            self.segments[-1].sealed = True
        path = segment_path(self.directory)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, 0o640)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            header = msgspec.json.encode(
                {"switchyard_journal": FORMAT_VERSION, "pid": os.getpid(), "created": datetime.now(UTC)}
            )
            line = header + b"\n"
            size = os.write(fd, line)
        except OSError:
            discard(fd, path)
            raise
        if size != len(line):  # a full disk: a row after a torn header would be read as the header
            discard(fd, path)
            raise OSError(errno.ENOSPC, f"short write of a segment's header: {size} of {len(line)} bytes")
        self.segments.append(Segment(path, fd, self.appended, size=size, data_start=size))
        self._dirty = True

    def release(self, committed: int) -> None:
        """Delete the sealed segments whose every row is below `committed` (in the database); an
        active segment past `committed_bytes` some of whose rows are committed is rotated first."""
        active = self.segments[-1] if self.segments else None
        if (
            active is not None
            and not active.sealed
            and active.size >= self.committed_bytes
            and active.first < committed
        ):
            self._rotate()
        while self.segments and self.segments[0].sealed:
            segment = self.segments[0]
            if segment.first + segment.rows > committed:
                return
            try:
                segment.path.unlink(missing_ok=True)
            except OSError as exc:  # a read-only directory: the rows are committed, the file stays
                log.warning("ledger_journal_not_deleted", path=str(segment.path), error=type(exc).__name__)
            self._close_fd(segment.fd)
            self.segments.pop(0)

    def _close_fd(self, fd: int) -> None:
        if self._syncing:
            self._to_close.append(fd)  # the sync thread may hold it: closed when it is done
        else:
            os.close(fd)

    async def read(self, seq: int, limit: int) -> ReadBatch | None:
        """Up to `limit` rows from `seq` on (stopping at a segment's end), read and decoded on the
        journal's thread; None when `seq` is past the last row."""
        for segment in self.segments:
            if segment.first <= seq < segment.first + segment.rows:
                break
        else:
            return None
        cached_seq, cached_segment, cached_offset = self._cursor
        if cached_seq == seq and cached_segment is segment:
            skip, offset = 0, cached_offset
        else:
            skip, offset = seq - segment.first, segment.data_start
        count = min(limit, segment.first + segment.rows - seq)
        loop = asyncio.get_running_loop()
        records, bad, end = await loop.run_in_executor(
            self._thread, read_rows, segment.fd, offset, segment.size, skip, count
        )
        self._cursor = (seq + len(records) + len(bad), segment, end)
        return ReadBatch(records, bad)

    def reject(self, line: bytes) -> None:
        """Keep a row the database refused in `rejected.jsonl` (one write, like a journal row)."""
        try:
            fd = os.open(self.directory / REJECTED, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o640)
            try:
                os.write(fd, line.rstrip(b"\n") + b"\n")
            finally:
                os.close(fd)
        except OSError as exc:
            log.error("ledger_reject_file_unwritable", error=type(exc).__name__)  # noqa: TRY400 (no traceback: an OS error)

    def encode(self, record: LedgerRecord) -> bytes:
        return RECORD_JSON.encode(record)

    async def run(self) -> None:
        """Every `fsync_interval`: fsync what was written since the last one, on the journal's
        thread; while broken, try a fresh segment instead."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(min(self.fsync_interval, _RETRY_S) if self.broken else self.fsync_interval)
            await self._restore_moved()
            if self.broken and not any(moved(segment) for segment in self.segments):  # one to copy back first
                self._recover()
            elif self._dirty:
                await self.sync(loop)

    async def sync(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._dirty = False
        fds = [segment.fd for segment in self.segments]
        self._syncing = True
        try:
            await (loop or asyncio.get_running_loop()).run_in_executor(self._thread, fsync_all, fds, self.directory)
        finally:
            self._syncing = False
            while self._to_close:
                os.close(self._to_close.pop())

    async def _restore_moved(self) -> None:
        """Segments whose files left their paths (the directory deleted, moved away or replaced:
        an operator, a clean-up job) hold rows that only this process's descriptors reach, and a
        kill lost them all while `/readyz` said writable. Each is written back under the directory
        (`_restore`); one that cannot be breaks the journal (503) until it can."""
        for segment in [segment for segment in self.segments if moved(segment)]:
            self._syncing = True  # a segment released meanwhile keeps its descriptor until then
            try:
                await self._restore(segment)
            except OSError as exc:
                if not self.broken:
                    self._fail(self.segments[-1], exc)
                return
            finally:
                self._syncing = False
                while self._to_close:
                    os.close(self._to_close.pop())

    async def _restore(self, segment: Segment) -> None:
        """The segment's bytes copied to a new file on the journal's thread (`restored`), the rows
        appended meanwhile then here, and the new file used from then on."""
        size, loop = segment.size, asyncio.get_running_loop()
        made = self._thread.submit(restored, segment.fd, size, segment.path, self.directory)
        try:
            fd, path = await asyncio.wrap_future(made, loop=loop)
        except asyncio.CancelledError:  # shut down meanwhile: `close` restores it (`_discard_made`)
            made.add_done_callback(_discard_made)
            raise
        if segment not in self.segments:  # every row of it committed meanwhile: not needed
            discard(fd, path)
            return
        try:
            copy_range(segment.fd, fd, size, segment.size)  # the rows appended meanwhile
        except OSError:
            discard(fd, path)
            raise
        old, segment.fd, segment.path = segment.fd, fd, path
        self._thread.submit(os.close, old)  # after any read or fsync of it queued before
        self._dirty = True
        log.warning("ledger_journal_segment_restored", path=str(path), rows=segment.rows)

    def _recover(self) -> None:
        if not room_to_write(self.directory, self.min_free_bytes):
            return  # a disk that filled up: writable again once there is room for a while (module doc)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._new_segment()
        except OSError:
            return
        log.info("ledger_journal_writable", directory=str(self.directory), was=self.error)
        self.error = None

    def _restore_at_close(self, segment: Segment) -> None:
        """`_restore` without the journal's thread (shut down): the rows of a segment whose file
        left its path would be lost with its descriptor."""
        try:
            fd, path = restored(segment.fd, segment.size, segment.path, self.directory)
        except OSError as exc:
            log.error("ledger_journal_rows_lost", path=str(segment.path), rows=segment.rows, error=type(exc).__name__)  # noqa: TRY400 (an OS error: no traceback)
            return
        os.close(segment.fd)
        segment.fd, segment.path = fd, path
        log.warning("ledger_journal_segment_restored", path=str(path), rows=segment.rows)

    def close(self, committed: int) -> None:
        """Delete every segment whose rows are all below `committed` (the active one too) and
        release the locks: rows still in the journal stay for the next start."""
        if self.segments:
            self.segments[-1].sealed = True
        self._thread.shutdown(wait=True)
        self.release(committed)
        for segment in self.segments:
            if moved(segment):  # its file left its path since the last interval: the task is gone
                self._restore_at_close(segment)
            with contextlib.suppress(OSError):
                os.fsync(segment.fd)
            os.close(segment.fd)
        for fd in self._to_close:
            os.close(fd)
        self.segments, self._to_close = [], []


def _discard_made(made: Future[tuple[int, Path]]) -> None:
    """The file a restore cancelled mid-copy had made: closed and deleted on the journal's thread
    as the copy ends, so before `Journal.close`'s `shutdown` returns and writes the segment back
    whole at its own path (on the loop, the copy held that path through `close`: the segment went
    to a second name and both files were on disk until the loop ran again). A copy still queued is
    cancelled and never made."""
    if not made.cancelled() and made.exception() is None:
        discard(*made.result())
