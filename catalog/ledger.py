"""The usage ledger writer: one row per routed request, written off the request path, none lost.

`LedgerWriter.submit` is synchronous and never waits on the database. With a journal
(`catalog.journal`, the service's case) the row is first appended to it — one `os.write`, before
the response's last byte is sent — and then, while the writer keeps up, also kept in a bounded
in-memory queue, so the database write needs no read back from disk. One background task writes
batches of up to `batch_size` rows through the database's store (`catalog.ledger_store`), each as
one transaction that skips request ids already present (`ON CONFLICT (request_id) DO NOTHING`),
so replaying a row is harmless. Journal rows are written in append order; the count of rows
written (`committed`) tells the journal which segments it may delete. `flush()` waits until every
row submitted before it was written.

Rows wait on disk, not in memory, when the writer falls behind:
- the database fails (an outage: unreachable, not migrated, locked): the in-memory queue is
  dropped (its rows are in the journal), only the failing batch is kept and retried with
  exponential backoff, and rows are then read back from the journal a batch at a time. Memory
  stays flat however long the outage; `outage started`/`ended` are logged once each;
- the queue is full (a slow database): new rows stay on disk only, read back once it drains;
- at start-up the journal adopted rows a previous process left (a `kill -9`, an outage that
  outlived it): they are read back first, the same way (the replay).
The writer returns to the in-memory path as soon as it has read up to the journal's end.

Without a journal (none configured, or it cannot be written: disk full, read-only) rows are held
in memory only, as `loose` rows, until the database or a journal writable again takes them; the
service refuses requests in that state unless `[ledger] required = false` (`accepting`; the edge
answers 503, app/edge/asgi.py).

Records are checked and encoded for the database per batch, in a tight loop that keeps its code
in the CPU's caches (PostgreSQL's store joins the journal lines queued beside them instead). A
record the database would refuse (a naive datetime, a cost too large for its column) is
therefore found at write time and set aside like a row the database itself refuses: logged (its
request id and error type, never request data or keys), kept in `rejected` and, with a journal,
in its `rejected.jsonl`.

`close(timeout)` writes what it can within `timeout` seconds and then stops: with the database
down, rows stay in the journal for the next start instead of holding up the shutdown.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Literal

import structlog
from sqlalchemy.ext.asyncio import AsyncEngine

from catalog.journal import Journal
from catalog.ledger_store import store_for
from catalog.loose_rows import LooseRows
from catalog.outages import LedgerUnavailable, is_outage, statement_timed_out
from catalog.records import RECORD_JSON, LedgerRecord

_MAX_BACKOFF = 5.0
STORE_CLOSE_S = 2.0  # closing the store's connection (SQLite: on its thread, maybe in a busy wait)
BEHIND_AFTER_S = 10.0  # the oldest unwritten row older than this: the ledger is "behind"
LedgerState = Literal["ok", "behind", "unwritable"]

# Not cached on first use (the app's loggers are): the ledger logs rarely (outages, replays), and a
# logger cached at import time would keep writing to the first app's writer in a process that
# configures logging again (tests, an embedding application).
log = structlog.wrap_logger(None, cache_logger_on_first_use=False, logger_factory_args=("switchyard.ledger",))

_COLUMNS = tuple(LedgerRecord.__struct_fields__)


class LedgerWriter:
    """Batches `LedgerRecord`s into the `ledger` table from one background task."""

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        journal: Journal | None = None,
        required: bool = False,
        max_queue: int = 10_000,
        batch_size: int = 256,
        flush_interval: float = 0.05,
        idle: bool = False,
    ) -> None:
        """`idle`: no rows will come (`[ledger] enabled = false`), so the store is not readied
        ahead of a first batch (`LedgerStore.open`: the SQLite writer's process)."""
        self._max_queue = max_queue
        self._batch_size = max(1, batch_size)
        self._flush_interval = flush_interval
        self._store = store_for(engine, _COLUMNS, own_process=True)
        self._idle = idle
        self._journal = journal
        self._required = required
        # journal rows `committed` … on, while not behind, each with its journal line (the JSON the
        # PostgreSQL store reuses): one deque of pairs, so a row and its line cannot drift apart
        self._queue: deque[tuple[LedgerRecord, bytes]] = deque()
        self._loose = LooseRows()  # rows in memory only (no journal took them)
        self._committed = 0  # journal rows written to the database (or set aside), in append order
        self._behind = journal is not None and journal.appended > 0  # adopted rows: replay first
        self._submitted = journal.appended if journal is not None else 0
        self._written = 0
        self._closing = False
        self._drain_to = self._submitted  # rows submitted up to this count leave now, full batch or not
        self._head: datetime | None = None  # finished_at of the oldest row of the batch in hand
        self._last_written = journal.adopted_since() if journal else None  # finished_at; at start: oldest left
        self._failing_since: float | None = None  # monotonic time the current outage began
        self._wake = asyncio.Event()
        self._progress = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None
        self.rejected: list[LedgerRecord] = []  # rows the database refused as data; see `_on_rejected`

    @property
    def pending(self) -> int:
        """Records submitted (or adopted from the journal) and not yet written or set aside."""
        journal_rows = self._journal.appended - self._committed if self._journal is not None else 0
        return journal_rows + self._loose.pending

    @property
    def accepting(self) -> bool:
        """Whether a request may be served: its row can be journaled, or the journal is optional."""
        return not self._required or (self._journal is not None and not self._journal.broken)

    @property
    def state(self) -> LedgerState:
        """`/readyz`'s view: `unwritable` (no journal to write), `behind` (the database is failing
        or the oldest unwritten row is older than `BEHIND_AFTER_S`), else `ok`."""
        if (self._journal is None and self._required) or (self._journal is not None and self._journal.broken):
            return "unwritable"
        if self._failing_since is not None or self.oldest_pending_s() > BEHIND_AFTER_S:
            return "behind"
        return "ok"

    def oldest_pending_s(self) -> float:
        """Seconds since the oldest unwritten row's request finished (0 with nothing pending).
        While rows are read back from the journal this is the batch in hand's oldest row."""
        if not self.pending:
            return 0.0
        heads = ([self._loose.rows[0]] if self._loose.rows else []) + ([self._queue[0][0]] if self._queue else [])
        times = [t for t in (self._head, *(head.finished_at for head in heads)) if t]
        if not times:  # only rows on disk, not read yet: they came after the last row written
            times = [self._last_written] if self._last_written is not None else []
        if not times:
            return 0.0
        try:
            return max(0.0, (datetime.now(UTC) - min(times)).total_seconds())
        except TypeError:  # a naive finished_at (a bug upstream; the database refuses the row too)
            return 0.0

    def start(self) -> None:
        """Start the writer task; call from inside the running event loop."""
        self._started()

    def _started(self) -> asyncio.Task[None]:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="ledger-writer")
        return self._task

    def submit(self, record: LedgerRecord, encoded: bytes | None = None) -> None:
        """Journal `record` (`encoded`: `RECORD_JSON.encode(record)`, when the caller has it) and
        queue it for writing with that line. Never blocks, never raises for a full queue or a
        failed journal write (the row is then kept in memory)."""
        if self._closing:
            raise RuntimeError("the ledger writer is closed")
        self._submitted += 1
        journal = self._journal
        if journal is None:
            self._on_overflow(record)  # kept in memory
            return
        line = RECORD_JSON.encode(record) if encoded is None else encoded
        if not journal.append(record, line):
            self._on_overflow(record)
            return
        if not self._behind:
            if len(self._queue) < self._max_queue:
                self._queue.append((record, line))
                if len(self._queue) >= self._batch_size:
                    self._wake.set()
                return
            log.warning("ledger_queue_full", max_queue=self._max_queue, rows_wait_on="journal")
            self._behind = True  # this row and the next ones are read back from the journal
        if journal.appended - self._committed >= self._batch_size:
            self._wake.set()

    async def flush(self) -> None:
        """Wait until every record submitted before this call has been written."""
        if self._task is None:
            raise RuntimeError("the ledger writer was never started")
        journal_target = self._journal.appended if self._journal is not None else 0
        loose, loose_target = self._loose, self._loose.submitted
        moving = loose.pending > 0  # rows of it may go to the journal: then to be read back and written
        self._drain_to = max(self._drain_to, self._submitted)
        self._wake.set()
        async with self._progress:
            await self._progress.wait_for(
                lambda: (
                    (
                        self._committed >= max(journal_target, loose.moved_until if moving else 0)
                        and loose.done >= loose_target
                    )
                    or self._stopped()
                )
            )
        self._raise_if_crashed()

    async def close(self, timeout: float | None = None) -> None:  # noqa: ASYNC109 (a budget, split between steps)
        """Write everything still queued, then stop the writer task. After `timeout` seconds the
        rest stays in the journal (with the database down, a shutdown must not wait for it; in an
        outage with every pending row on disk it stops at once), and closing the store's
        connection is bounded by `STORE_CLOSE_S`."""
        self._closing = True
        task = self._started()
        self._journal_loose()
        self._wake.set()
        if self._failing_since is not None and self._journal is not None and not self._loose.pending:
            timeout = 0  # the database is down and every pending row is on disk: nothing to wait for
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout)
        except TimeoutError:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            self._loose.put_back()  # the batch whose write was cancelled: the journal may take it
            self._journal_loose()
            log.warning("ledger_closed_with_rows_pending", rows=self.pending, lost_from_memory=len(self._loose.rows))
        finally:
            if self._journal is not None:
                self._journal.close(self._committed)
            try:
                await asyncio.wait_for(self._store.close(), STORE_CLOSE_S)
            except TimeoutError:
                log.warning("ledger_store_close_timed_out", seconds=STORE_CLOSE_S)
        if not task.cancelled():
            self._raise_if_crashed()

    def _stopped(self) -> bool:
        return self._task is not None and self._task.done()

    def _raise_if_crashed(self) -> None:
        if self._task is not None and self._task.done() and not self._task.cancelled():
            error = self._task.exception()
            if error is not None:
                raise error

    def _on_overflow(self, record: LedgerRecord) -> None:
        """A row no journal holds: kept in memory until it is written."""
        waiting = self._loose.add(record)
        if waiting == self._max_queue:
            log.warning("ledger_queue_full", max_queue=self._max_queue, rows_wait_on="memory")
        if waiting >= self._batch_size:
            self._wake.set()

    def _journal_loose(self, *, in_hand: bool = False) -> int:
        """Memory-only rows (`in_hand`: the batch in hand's) into the journal once it takes rows
        again (`catalog.loose_rows`), to be read back after the rows before them; how many it took."""
        moved = self._loose.journal_into(self._journal, in_hand=in_hand)
        self._behind = self._behind or moved > 0
        return moved

    def _due(self) -> bool:
        """A full batch is waiting, or rows that must leave now: the flush interval passed without a
        full batch, or `flush()`/`close()` asked for them."""
        waiting = self.pending
        return waiting >= self._batch_size or (waiting > 0 and (self._closing or self._written < self._drain_to))

    async def _run(self) -> None:
        """Write full batches as they fill, and whatever is queued once `flush_interval` passes
        without one. Not the partial batch that gathered while the previous one was written: a
        batch has a fixed price (a hop to the store's thread and back, a commit), so under load
        batches stay full instead of shrinking to whatever arrived during the last write. The
        interval is a loop timer, not `asyncio.wait_for` (a task per wait, cancelled and awaited
        each time the interval passes); one left behind by a cancelled task only sets the event."""
        loop = asyncio.get_running_loop()
        if not self._idle:
            await self._store.open()
        while True:
            if not self._wake.is_set():
                timer = loop.call_later(self._flush_interval, self._interval_passed)
                await self._wake.wait()
                timer.cancel()
            self._wake.clear()
            while self._due():
                await self._write_next()
            if self._closing and not self.pending:
                return

    def _interval_passed(self) -> None:
        """`flush_interval` passed without a wake-up: the rows submitted so far leave now."""
        self._drain_to = max(self._drain_to, self._submitted)
        self._wake.set()

    async def _write_next(self) -> None:
        """Take the next batch (memory-only rows first, then the journal's, from memory or read
        back from disk), write it and count it done."""
        bad: list[bytes] = []
        lines: list[bytes] | None = None  # the rows' journal lines, when they come from memory
        if self._loose.rows:
            self._journal_loose()
        loose = bool(self._loose.rows)
        if loose:
            batch = self._loose.take(self._batch_size)
        elif self._queue:
            pairs = [self._queue.popleft() for _ in range(min(self._batch_size, len(self._queue)))]
            batch, lines = [record for record, _ in pairs], [line for _, line in pairs]
        else:
            batch, bad = await self._read_back()  # encoded again by the store: see `_read_back`
        if batch:
            self._head = batch[0].finished_at
            await self._write_with_retry(batch, lines, loose=loose)
        for line in bad:
            log.error("ledger_journal_line_unreadable", bytes=len(line))
            if self._journal is not None:
                self._journal.reject(line)
        async with self._progress:
            self._head = None
            if batch:
                self._last_written = batch[-1].finished_at
            self._written += len(batch) + len(bad)
            if loose:
                self._loose.finished(len(batch))
            else:
                self._committed += len(batch) + len(bad)
                if self._journal is not None:
                    self._journal.release(self._committed)
            self._progress.notify_all()

    async def _read_back(self) -> tuple[list[LedgerRecord], list[bytes]]:
        """The next rows from the journal itself; back to the in-memory path once at its end.
        The store encodes the decoded records: an older version's line may lack a field added
        since (which the record holds as its default), so the lines themselves are not used."""
        journal = self._journal
        assert journal is not None
        read = await journal.read(self._committed, self._batch_size)
        if read is None:  # a bug: rows counted that no segment holds; skipped, or the writer would spin
            log.error("ledger_journal_rows_missing", rows=journal.appended - self._committed)
            self._committed = journal.appended
            self._behind = False
            return [], []
        if self._committed + len(read.records) + len(read.bad) == journal.appended:
            self._behind = False  # rows appended from now on are queued in memory again
        return read.records, read.bad

    async def _write_with_retry(
        self, batch: Sequence[LedgerRecord], lines: Sequence[bytes] | None, *, loose: bool = False
    ) -> None:
        """`loose`: rows held in memory only; in an outage they go to the journal once it can
        take them (then read back from it, as its own rows), not retried from memory."""
        attempt = 0
        while True:
            try:
                await self._store.write(batch, lines)
            except Exception as exc:
                # a batch past the server's statement_timeout (one row is not: it waits out a lock)
                if not is_outage(exc) or (len(batch) > 1 and statement_timed_out(exc)):
                    await self._isolate(batch, lines, exc)
                    return
                if loose and self._journal_loose(in_hand=True) and not batch:  # every one journaled
                    self._on_write_failure(batch, exc, attempt + 1)
                    return
                attempt += 1
                await asyncio.sleep(self._on_write_failure(batch, exc, attempt))
            else:
                if self._failing_since is not None:
                    self._outage_ended()
                return

    async def _isolate(self, batch: Sequence[LedgerRecord], lines: Sequence[bytes] | None, exc: Exception) -> None:
        """The rows themselves failed: write them one by one so only the bad ones are set aside."""
        if len(batch) == 1:
            self._on_rejected(batch[0], exc)
            return
        for index, record in enumerate(batch):
            await self._write_with_retry([record], None if lines is None else [lines[index]])

    def _on_write_failure(self, batch: Sequence[LedgerRecord], exc: Exception, attempt: int) -> float:
        """The database is unreachable or failing: the first failure starts an outage (logged
        once; the journal's rows leave memory). Returns the delay before the retry."""
        if self._failing_since is None:
            self._failing_since = time.monotonic()
            # the cause in the database's words ("database is locked", "database or disk is full"):
            # an outage's message names the database's state, never a row's values
            detail = str(exc) if isinstance(exc, LedgerUnavailable) else None
            log.warning("ledger_outage_started", error=type(exc).__name__, detail=detail, rows_pending=self.pending)
        if self._journal is not None:
            self._queue.clear()  # these rows are in the journal: read back from it after the outage
            self._behind = True
        return float(min(_MAX_BACKOFF, 0.05 * 2 ** min(attempt, 10)))

    def _outage_ended(self) -> None:
        assert self._failing_since is not None
        seconds = round(time.monotonic() - self._failing_since, 3)
        self._failing_since = None
        log.info("ledger_outage_ended", seconds=seconds, rows_pending=self.pending)

    def _on_rejected(self, record: LedgerRecord, exc: Exception) -> None:
        """A row the database will never accept (a bug upstream of here); kept, not dropped."""
        log.error("ledger_row_rejected", request_id=record.request_id, error=type(exc).__name__)
        self.rejected.append(record)
        if self._journal is not None:
            self._journal.reject(self._journal.encode(record))
