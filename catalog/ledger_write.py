"""Ledger rows written at once, outside the batched writer (`catalog.ledger.LedgerWriter`): for
tools, replays and tests. The same stores and the same statements as the writer's batches
(`catalog.ledger_store`), so the rows and their roll-ups are the same; never on the request path."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.ext.asyncio import AsyncEngine

from catalog.ledger_store import store_for
from catalog.records import LedgerRecord

_COLUMNS = tuple(LedgerRecord.__struct_fields__)


async def write_records(engine: AsyncEngine, records: Sequence[LedgerRecord]) -> None:
    """Write `records` now in one transaction, idempotently (a known request id is skipped)."""
    store = store_for(engine, _COLUMNS)
    try:
        if records:
            await store.write(records, None)
    finally:
        await store.close()
