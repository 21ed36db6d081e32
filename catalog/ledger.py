"""The usage ledger writer: one row per routed request, written off the request path.

`LedgerWriter.submit` is synchronous and never waits on the database: the record joins a bounded
in-memory queue, and one background task writes batches of up to `batch_size` rows through the
database's store (`catalog.ledger_store`), each as one transaction that skips request ids already
present (`ON CONFLICT (request_id) DO NOTHING`), so replaying a row is harmless. Rows are written
in submission order; `flush()` waits until every row submitted before it was written.

Records are encoded for the database per batch, not per request: in a tight loop over 256 rows
the encoder's code stays in the CPU's caches, while one encode between two requests ran at a
third of that speed (≈ 10 µs against 3 µs per row, measured with per-thread CPU counters). A
record the database would refuse (a naive datetime, a cost too large for its column) is
therefore found at write time and set aside like a row the database itself refuses.

No row is dropped. When the queue is full, records go to the overflow list (and keep their order:
while it is non-empty new records join it too). When a batch fails, the error is logged — its
type and the row count only, never request data or keys — and the same batch is retried with
exponential backoff. Both are in memory for now; `_on_overflow` and `_on_write_failure` are the
hooks where the durable spill-to-file (cost.md: "rows spill to a local append-only file and are
replayed when it returns") plugs in.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections import deque
from collections.abc import Sequence

import structlog
from sqlalchemy.exc import (
    DBAPIError,
    DisconnectionError,
    InterfaceError,
    InternalError,
    OperationalError,
    ProgrammingError,
)
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.ext.asyncio import AsyncEngine

from catalog.ledger_store import is_sqlite_outage, store_for
from catalog.records import LedgerRecord

_MAX_BACKOFF = 5.0
_OUTAGE_ERRORS = (OperationalError, InterfaceError, ProgrammingError, InternalError)

log = structlog.get_logger("switchyard.ledger")




_COLUMNS = tuple(LedgerRecord.__struct_fields__)


class LedgerWriter:
    """Batches `LedgerRecord`s into the `ledger` table from one background task."""

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        max_queue: int = 10_000,
        batch_size: int = 256,
        flush_interval: float = 0.05,
    ) -> None:
        self._max_queue = max_queue
        self._batch_size = max(1, batch_size)
        self._flush_interval = flush_interval
        self._store = store_for(engine, _COLUMNS)
        self._queue: deque[LedgerRecord] = deque()
        self._overflow: list[LedgerRecord] = []
        self._submitted = 0
        self._written = 0
        self._closing = False
        self._drain_to = 0  # rows submitted up to this count leave now, full batch or not
        self._wake = asyncio.Event()
        self._progress = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None
        self.rejected: list[LedgerRecord] = []  # rows the database refused as data; see `_on_rejected`

    @property
    def pending(self) -> int:
        """Records submitted and not yet written or set aside (queue and overflow)."""
        return self._submitted - self._written

    def start(self) -> None:
        """Start the writer task; call from inside the running event loop."""
        self._started()

    def _started(self) -> asyncio.Task[None]:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="ledger-writer")
        return self._task

    def submit(self, record: LedgerRecord) -> None:
        """Queue `record` for writing. Never blocks, never raises for a full queue."""
        if self._closing:
            raise RuntimeError("the ledger writer is closed")
        self._submitted += 1
        if self._overflow or len(self._queue) >= self._max_queue:
            self._on_overflow(record)
        else:
            self._queue.append(record)
        if len(self._queue) >= self._batch_size:
            self._wake.set()

    async def flush(self) -> None:
        """Wait until every record submitted before this call has been written."""
        if self._task is None:
            raise RuntimeError("the ledger writer was never started")
        target = self._drain_to = max(self._drain_to, self._submitted)
        self._wake.set()
        async with self._progress:
            await self._progress.wait_for(lambda: self._written >= target or self._stopped())
        self._raise_if_crashed()

    async def close(self) -> None:
        """Write everything still queued, then stop the writer task."""
        self._closing = True
        task = self._started()
        self._wake.set()
        try:
            await task
        finally:
            await self._store.close()
        self._raise_if_crashed()

    def _stopped(self) -> bool:
        return self._task is not None and self._task.done()

    def _raise_if_crashed(self) -> None:
        if self._task is not None and self._task.done() and not self._task.cancelled():
            error = self._task.exception()
            if error is not None:
                raise error

    def _on_overflow(self, record: LedgerRecord) -> None:
        """Hook: a record that found the queue full. Durable spill-to-file replaces this list."""
        if not self._overflow:
            log.warning("ledger_queue_full", max_queue=self._max_queue)
        self._overflow.append(record)

    def _refill(self) -> None:
        room = self._max_queue - len(self._queue)
        if self._overflow and room > 0:
            moved, self._overflow = self._overflow[:room], self._overflow[room:]
            self._queue.extend(moved)

    def _take_batch(self) -> list[LedgerRecord]:
        self._refill()
        count = min(self._batch_size, len(self._queue))
        return [self._queue.popleft() for _ in range(count)]

    def _due(self) -> bool:
        """A full batch is waiting, or rows that must leave now: the flush interval passed without a
        full batch, or `flush()`/`close()` asked for them."""
        waiting = len(self._queue) + len(self._overflow)
        return waiting >= self._batch_size or (waiting > 0 and (self._closing or self._written < self._drain_to))

    async def _run(self) -> None:
        """Write full batches as they fill, and whatever is queued once `flush_interval` passes
        without one. Not the partial batch that gathered while the previous one was written: a
        batch has a fixed price (a hop to the store's thread and back, a commit), so under load
        batches stay full instead of shrinking to whatever arrived during the last write."""
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), self._flush_interval)
            except TimeoutError:
                self._drain_to = max(self._drain_to, self._submitted)
            self._wake.clear()
            while self._due() and (batch := self._take_batch()):
                await self._write_with_retry(batch)
                async with self._progress:
                    self._written += len(batch)
                    self._progress.notify_all()
            if self._closing and not self._queue and not self._overflow:
                return

    async def _write_with_retry(self, batch: Sequence[LedgerRecord]) -> None:
        attempt = 0
        while True:
            try:
                await self._store.write(batch)
            except Exception as exc:
                if not _is_outage(exc):
                    await self._isolate(batch, exc)
                    return
                attempt += 1
                await asyncio.sleep(self._on_write_failure(batch, exc, attempt))
            else:
                return

    async def _isolate(self, batch: Sequence[LedgerRecord], exc: Exception) -> None:
        """The rows themselves failed: write them one by one so only the bad ones are set aside."""
        if len(batch) == 1:
            self._on_rejected(batch[0], exc)
            return
        for record in batch:
            await self._write_with_retry([record])

    def _on_write_failure(self, batch: Sequence[LedgerRecord], exc: Exception, attempt: int) -> float:
        """Hook: the database is unreachable or failing; returns the delay before the retry.

        Durable spill-to-file belongs here: append the batch to the spill file and move on.
        """
        log.warning("ledger_write_failed", error=type(exc).__name__, rows=len(batch), attempt=attempt)
        return float(min(_MAX_BACKOFF, 0.05 * 2 ** min(attempt, 10)))

    def _on_rejected(self, record: LedgerRecord, exc: Exception) -> None:
        """Hook: a row the database will never accept (a bug upstream of here); kept, not dropped."""
        log.error("ledger_row_rejected", request_id=record.request_id, error=type(exc).__name__)
        self.rejected.append(record)


def _is_outage(exc: Exception) -> bool:
    """Whether retrying the same rows can succeed: the database (or the way to it) is failing.

    Errors about the data itself (a constraint, a value the column or the driver refuses, a bind
    error) never heal on retry; neither does a bug of ours. Those rows are set aside instead of
    blocking the rest. A missing table (`ProgrammingError`: not migrated yet) counts as an outage.
    """
    if isinstance(exc, sqlite3.Error):
        return is_sqlite_outage(exc)
    if isinstance(exc, DBAPIError):
        return exc.connection_invalidated or isinstance(exc, _OUTAGE_ERRORS)
    # Outside the driver, only a pool timeout or a lost connection is the database's doing; any
    # other SQLAlchemy error (a bad argument, a statement that does not compile) is a bug of ours.
    return isinstance(exc, PoolTimeout | DisconnectionError | OSError)


async def write_records(engine: AsyncEngine, records: Sequence[LedgerRecord]) -> None:
    """Write `records` now in one transaction, idempotently (a known request id is skipped).

    The writer's batches take the same path (`catalog.ledger_store`); so can replays and tools.
    Not for the request path.
    """
    store = store_for(engine, _COLUMNS)
    try:
        if records:
            await store.write(records)
    finally:
        await store.close()
