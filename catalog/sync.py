"""Bring the SQL catalog in line with the catalog files, idempotently.

Models, aliases and deployments are the files' to own: they are upserted, and those no longer in
the files are removed. Prices are history and are never updated or deleted, because ledger rows
point at them and old requests must re-price exactly. For each (provider, model) the file entries,
sorted by `effective_from`, each own a window `[effective_from, next entry's effective_from)`:

- no database row in the window: the entry is inserted with its own `effective_from`, even one
  already past (a newly listed price or a newly dated entry keeps the date the file gives it);
- otherwise the entry's price is made to hold over what of its window is still ahead, from
  `start = max(effective_from, now + CHANGE_LEAD)`: a row is inserted at `start` when the price in
  effect there is another (the file's price changed), and after each later row in the window whose
  price is another (a date moved earlier, a price edited before it starts). Where a row of another
  price sits at that very instant, the new one starts 1µs after it (a row is never updated).
  Nothing before `start` changes: a change to a price the database already holds never takes
  effect retroactively, nor before every process has loaded it (`CHANGE_LEAD`).
- a window wholly before `start` cannot change without rewriting history: an edit of it is
  skipped and counted in `prices_ignored`; a window whose price already holds counts in
  `prices_unchanged`. `prices_added` counts rows.
- a (provider, model) priced in the database whose model is still in the files but with no price
  entry left for that provider: a row with no rates from `now + CHANGE_LEAD` (unpriced from then
  on, as the files say; a deleted entry used to price every later request for good), once.

Run twice, the second run changes nothing. On PostgreSQL a transaction-scoped advisory lock keeps
concurrent syncs (several workers starting at once) from racing.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Literal

from msgspec import Struct
from sqlalchemy import delete, insert, select, text, tuple_
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from catalog.files import MONEY_KEYS, CatalogFile, ModelSpec, PriceSpec
from catalog.tables import (
    PRICE_PRECISION,
    PRICE_SCALE,
    Deployment,
    ExactDecimal,
    Model,
    ModelAlias,
    Price,
    insert_for,
)

_SYNC_LOCK_KEY = 0x5717C4A7  # pg_advisory_xact_lock key for catalog syncs
_PRICE_TYPE = ExactDecimal(PRICE_PRECISION, PRICE_SCALE)
_TICK = timedelta(microseconds=1)
CHANGE_LEAD = timedelta(seconds=7)
"""How long after a sync a changed price takes effect: the catalog watch's poll
(`app.catalog_watch.CATALOG_POLL_S`, 5 s) and 2 s for the sync's own transaction, so that every
process serving has the new row before it applies and each request is priced at the row in effect
when it started (cost.md). A change that took effect at once was charged at the old row by every
process until its next poll (up to 3.5 s seen with two replicas)."""


class SyncReport(Struct, frozen=True):
    models: int
    aliases: int
    deployments: int
    models_removed: int
    prices_added: int
    prices_unchanged: int
    prices_ignored: int


Amounts = tuple[Decimal | None, ...]


def _amounts(source: object) -> Amounts:
    values = (getattr(source, key) for key in MONEY_KEYS)
    return tuple(None if value is None else _PRICE_TYPE.quantize(value) for value in values)


async def _sync_models(connection: AsyncConnection, models: tuple[ModelSpec, ...]) -> int:
    """Upsert models, aliases and deployments; delete what the files no longer name."""
    upsert = insert_for(connection.dialect.name)
    ids = [model.id for model in models]
    for model in models:
        row = {
            "id": model.id,
            "context_window": model.context_window,
            "max_output": model.max_output,
            "capabilities": sorted(model.capabilities),
            "is_default": model.default,
        }
        statement = upsert(Model).values(row)
        await connection.execute(statement.on_conflict_do_update(index_elements=["id"], set_=row))
    await _sync_aliases(connection, models)
    await _sync_deployments(connection, models)
    removed = await connection.execute(delete(Model).where(Model.id.not_in(ids)))
    return removed.rowcount


async def _sync_aliases(connection: AsyncConnection, models: tuple[ModelSpec, ...]) -> None:
    upsert = insert_for(connection.dialect.name)
    wanted = {alias: model.id for model in models for alias in model.aliases}
    await connection.execute(delete(ModelAlias).where(ModelAlias.alias.not_in(list(wanted))))
    for alias, model_id in wanted.items():
        statement = upsert(ModelAlias).values(alias=alias, model_id=model_id)
        await connection.execute(statement.on_conflict_do_update(index_elements=["alias"], set_={"model_id": model_id}))


async def _sync_deployments(connection: AsyncConnection, models: tuple[ModelSpec, ...]) -> None:
    upsert = insert_for(connection.dialect.name)
    keys = ["model_id", "provider", "upstream_model"]
    wanted = {(model.id, d.provider, d.upstream_model): d.priority for model in models for d in model.deployments}
    existing = await connection.execute(select(Deployment.model_id, Deployment.provider, Deployment.upstream_model))
    for stale in {tuple(row) for row in existing} - set(wanted):
        await connection.execute(
            delete(Deployment).where(
                tuple_(Deployment.model_id, Deployment.provider, Deployment.upstream_model) == tuple_(*stale)
            )
        )
    for (model_id, provider, upstream_model), priority in wanted.items():
        row = {
            "model_id": model_id,
            "provider": provider,
            "upstream_model": upstream_model,
            "priority": priority,
        }
        statement = upsert(Deployment).values(row)
        await connection.execute(statement.on_conflict_do_update(index_elements=keys, set_={"priority": priority}))


async def _price_rows(connection: AsyncConnection) -> dict[tuple[str, str], list[tuple[datetime, Amounts]]]:
    rows: defaultdict[tuple[str, str], list[tuple[datetime, Amounts]]] = defaultdict(list)
    for price in (await connection.execute(select(Price).order_by(Price.effective_from))).all():
        rows[(price.provider, price.model_id)].append((price.effective_from, _amounts(price)))
    return rows


def _decide(
    entry: PriceSpec, until: datetime | None, existing: list[tuple[datetime, Amounts]], now: datetime
) -> list[datetime] | Literal["unchanged", "superseded"]:
    """The `effective_from`s to insert `entry` with, or why nothing is inserted (module doc)."""
    in_window = [row for row in existing if row[0] >= entry.effective_from and (until is None or row[0] < until)]
    if not in_window:
        return [entry.effective_from]
    amounts = _amounts(entry)
    start = max(entry.effective_from, now + CHANGE_LEAD)
    if until is not None and start >= until:
        return "unchanged" if in_window[-1][1] == amounts else "superseded"
    return _holding(amounts, start, until, existing) or "unchanged"


def _holding(
    amounts: Amounts, start: datetime, until: datetime | None, existing: list[tuple[datetime, Amounts]]
) -> list[datetime]:
    """Where rows of `amounts` are needed so that they are the price in effect over `[start,
    until)`: at `start`, and after each later row of other amounts, wherever the price in effect is
    another; at the instant after any row already there (`existing` is sorted by its start)."""
    rows: list[tuple[datetime, Amounts]] = list(existing)
    inserted: list[datetime] = []
    for point in [start, *(row[0] + _TICK for row in existing if row[0] >= start)]:
        at: datetime | None = point
        while at is not None:
            index = bisect.bisect_right(rows, at, key=_start)
            in_effect = rows[index - 1] if index else None
            if in_effect is not None and in_effect[1] == amounts:
                at = None  # already the price here
            elif in_effect is not None and in_effect[0] == at:
                at += _TICK  # a row of another price starts here: the instant after it
            else:
                break
        if at is None:
            continue
        if until is not None and at >= until:
            break
        bisect.insort(rows, (at, amounts), key=_start)
        inserted.append(at)
    return inserted


def _start(row: tuple[datetime, Amounts]) -> datetime:
    return row[0]


async def _insert_price(connection: AsyncConnection, entry: PriceSpec, effective_from: datetime) -> None:
    values = {key: getattr(entry, key) for key in MONEY_KEYS}
    await connection.execute(
        insert(Price).values(provider=entry.provider, model_id=entry.model, effective_from=effective_from, **values)
    )


async def _sync_prices(
    connection: AsyncConnection, prices: tuple[PriceSpec, ...], models: set[str], now: datetime
) -> tuple[int, int, int]:
    existing = await _price_rows(connection)
    series: defaultdict[tuple[str, str], list[PriceSpec]] = defaultdict(list)
    for price in prices:
        series[(price.provider, price.model)].append(price)
    added = unchanged = ignored = 0
    for key, entries in series.items():
        entries.sort(key=lambda entry: entry.effective_from)
        for index, entry in enumerate(entries):
            until = entries[index + 1].effective_from if index + 1 < len(entries) else None
            decision = _decide(entry, until, existing.setdefault(key, []), now)
            if decision == "unchanged":
                unchanged += 1
            elif decision == "superseded":
                ignored += 1
            else:
                for effective_from in decision:
                    await _insert_price(connection, entry, effective_from)
                    bisect.insort(existing[key], (effective_from, _amounts(entry)), key=_start)  # for the next entries
                added += len(decision)
    unpriced: Amounts = (None,) * len(MONEY_KEYS)
    for (provider, model), rows in existing.items():  # priced in SQL, no longer in the files
        if (provider, model) in series or model not in models or not rows:
            continue
        for effective_from in _holding(unpriced, now + CHANGE_LEAD, None, rows):  # unpriced from then on
            await _insert_price(connection, PriceSpec(provider, model, effective_from), effective_from)
            added += 1
    return added, unchanged, ignored


async def sync_catalog(engine: AsyncEngine, catalog: CatalogFile, *, now: datetime | None = None) -> SyncReport:
    """Make the SQL catalog match `catalog` (see the module docstring for the price rule).

    `now` (aware) is the sync's instant: a changed price takes effect at `max(effective_from, now +
    CHANGE_LEAD)`; tests pass it, callers leave it.
    """
    moment = (now or datetime.now(UTC)).astimezone(UTC)
    async with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            await connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _SYNC_LOCK_KEY})
        removed = await _sync_models(connection, catalog.models)
        model_ids = {model.id for model in catalog.models}
        added, unchanged, ignored = await _sync_prices(connection, catalog.prices, model_ids, moment)
    return SyncReport(
        models=len(catalog.models),
        aliases=sum(len(model.aliases) for model in catalog.models),
        deployments=sum(len(model.deployments) for model in catalog.models),
        models_removed=removed,
        prices_added=added,
        prices_unchanged=unchanged,
        prices_ignored=ignored,
    )
