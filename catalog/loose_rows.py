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
from collections.abc import Sequence

from catalog.journal import Journal
from catalog.records import RECORD_JSON, LedgerRecord


class LooseRows:
    """The loose rows in submission order, the batch of them being written (`in_hand`) and the
    counts that tell `LedgerWriter.flush` when every one submitted is done."""

    __slots__ = ("done", "in_hand", "rows", "submitted")

    def __init__(self) -> None:
        self.rows: deque[LedgerRecord] = deque()
        self.in_hand: list[LedgerRecord] | None = None  # taken for the database, not written yet
        self.submitted = 0
        self.done = 0  # written to the database, set aside, or moved into the journal

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
        """The batch in hand is done: written, set aside or journaled."""
        self.in_hand = None
        self.done += count

    def put_back(self) -> None:
        """The batch in hand was not written (its write cancelled): first in line again."""
        if self.in_hand:
            self.rows.extendleft(reversed(self.in_hand))
        self.in_hand = None

    def journal_into(self, journal: Journal | None, rows: Sequence[LedgerRecord] | None = None) -> int:
        """Append `rows` (by default the waiting ones, which then count as done) to `journal`, in
        order, while it takes them; returns how many it took (0 without a writable journal)."""
        if journal is None or journal.broken:
            return 0
        source = self.rows if rows is None else rows
        moved = 0
        for record in source:
            if not journal.append(record, RECORD_JSON.encode(record)):
                break
            moved += 1
        if rows is None:
            for _ in range(moved):
                self.rows.popleft()
            self.done += moved
        return moved
