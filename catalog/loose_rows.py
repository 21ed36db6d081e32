"""Ledger rows that no journal holds: kept in the writer's memory until the database takes them,
or until a journal does.

A row is loose when there is no journal (none configured) or the journal could not take it (disk
full, read-only, its directory gone): the service then refuses new requests (503, unless `[ledger]
required = false`), but the requests already running finish and are answered, their rows here. A
shutdown in a database outage, or a `kill -9`, would lose them; so as soon as the journal takes
rows again they are moved into it (`journal_into`), in order, and from then on they are journal
rows like any other, read back from it.
"""

from __future__ import annotations

from collections import deque

from catalog.journal import Journal
from catalog.records import RECORD_JSON, LedgerRecord


class LooseRows:
    """The loose rows in submission order, the batch of them being written (`in_hand`) and the
    counts that tell `LedgerWriter.flush` when every one submitted is done: written, set aside, or
    moved into the journal (`moved_until`: the journal's row count after the latest move, which a
    flush waiting on loose rows then waits for the database to reach)."""

    __slots__ = ("done", "in_hand", "moved_until", "rows", "submitted")

    def __init__(self) -> None:
        self.rows: deque[LedgerRecord] = deque()
        self.in_hand: list[LedgerRecord] | None = None  # taken for the database, not written yet
        self.submitted = 0
        self.done = 0
        self.moved_until = 0

    @property
    def pending(self) -> int:
        return self.submitted - self.done

    def add(self, record: LedgerRecord) -> int:
        """Keep `record`; returns how many are waiting."""
        self.submitted += 1
        self.rows.append(record)
        return len(self.rows)

    def take(self, limit: int) -> list[LedgerRecord]:
        """The next batch for the database (`in_hand` until `finished`)."""
        batch = self.in_hand = [self.rows.popleft() for _ in range(min(limit, len(self.rows)))]
        return batch

    def finished(self, count: int) -> None:
        """The batch in hand is done: its `count` rows left written or set aside."""
        self.in_hand = None
        self.done += count

    def put_back(self) -> None:
        """The batch in hand was not written (its write cancelled): first in line again."""
        if self.in_hand:
            self.rows.extendleft(reversed(self.in_hand))
        self.in_hand = None

    def journal_into(self, journal: Journal | None, *, in_hand: bool = False) -> int:
        """Append the waiting rows (`in_hand`: the batch in hand's, which then holds only those
        the journal did not take) to `journal`, in order, while it takes them; how many it took
        (0 without a writable journal). They count as done."""
        source = self.in_hand if in_hand else self.rows
        if journal is None or journal.broken or not source:
            return 0
        moved = 0
        for record in source:
            if not journal.append(record, RECORD_JSON.encode(record)):
                break
            moved += 1
        if isinstance(source, list):
            del source[:moved]
        else:
            for _ in range(moved):
                source.popleft()
        self.done += moved
        if moved:
            self.moved_until = journal.appended
        return moved
