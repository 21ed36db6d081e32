"""`sync_catalog` against SQLite and PostgreSQL: idempotent, and prices only ever gain rows."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from catalog.files import CatalogFile, DeploymentSpec, ModelSpec, PriceSpec, default_catalog_path, load_catalog
from catalog.sync import CHANGE_LEAD, SyncReport, sync_catalog
from catalog.tables import Price

JAN = datetime(2026, 1, 1, tzinfo=UTC)
MAR = datetime(2026, 3, 1, tzinfo=UTC)
NOW = datetime(2026, 6, 15, 12, 30, tzinfo=UTC)


def model(model_id: str, *aliases: str, deployments: tuple[DeploymentSpec, ...] = ()) -> ModelSpec:
    return ModelSpec(
        id=model_id,
        context_window=8192,
        max_output=1024,
        aliases=aliases,
        capabilities=frozenset({"tools", "vision"}),
        deployments=deployments,
    )


def price(start: datetime, input_rate: str, output_rate: str = "2", provider: str = "p") -> PriceSpec:
    return PriceSpec(
        provider=provider, model="m", effective_from=start, input=Decimal(input_rate), output=Decimal(output_rate)
    )


async def rows(engine: AsyncEngine, query: str) -> list[tuple[Any, ...]]:
    async with engine.connect() as connection:
        return [tuple(row) for row in await connection.execute(text(query))]


async def prices(engine: AsyncEngine) -> list[tuple[Any, ...]]:
    found = await rows(engine, "SELECT id, provider, model_id, input, output FROM prices ORDER BY id")
    return [(i, p, m, Decimal(str(a)), Decimal(str(b))) for i, p, m, a, b in found]


async def starts(engine: AsyncEngine) -> list[datetime]:
    async with engine.connect() as connection:
        return list((await connection.execute(select(Price.effective_from).order_by(Price.id))).scalars())


async def dump(engine: AsyncEngine) -> dict[str, list[tuple[Any, ...]]]:
    queries = {
        "models": "SELECT id, context_window, max_output, is_default FROM models ORDER BY id",
        "aliases": "SELECT alias, model_id FROM model_aliases ORDER BY alias",
        "deployments": "SELECT id, model_id, provider, upstream_model, priority FROM deployments ORDER BY id",
        "prices": "SELECT id, provider, model_id, effective_from, input, output, cache_read FROM prices ORDER BY id",
    }
    return {name: await rows(engine, query) for name, query in queries.items()}


async def test_sync_of_the_shipped_catalog_is_idempotent(engine: AsyncEngine) -> None:
    catalog = load_catalog([str(default_catalog_path())], default_catalog_path().parent)
    first = await sync_catalog(engine, catalog)
    assert first == SyncReport(
        models=5, aliases=7, deployments=7, models_removed=0, prices_added=7, prices_unchanged=0, prices_ignored=0
    )
    before = await dump(engine)
    second = await sync_catalog(engine, catalog)
    assert second == SyncReport(
        models=5, aliases=7, deployments=7, models_removed=0, prices_added=0, prices_unchanged=7, prices_ignored=0
    )
    assert await dump(engine) == before
    assert len(before["prices"]) == 7


async def test_a_changed_price_is_a_new_row_and_the_old_one_is_kept(engine: AsyncEngine) -> None:
    base = CatalogFile(models=(model("m"),), prices=(price(JAN, "1.00"),))
    await sync_catalog(engine, base, now=NOW)
    changed = CatalogFile(models=base.models, prices=(price(JAN, "1.25"),))
    report = await sync_catalog(engine, changed, now=NOW)
    assert (report.prices_added, report.prices_unchanged) == (1, 0)
    assert await prices(engine) == [
        (1, "p", "m", Decimal("1"), Decimal("2")),
        (2, "p", "m", Decimal("1.25"), Decimal("2")),
    ]
    assert await starts(engine) == [JAN, NOW + CHANGE_LEAD]  # once every process has loaded it
    again = await sync_catalog(engine, changed, now=NOW + timedelta(days=1))
    assert (again.prices_added, again.prices_unchanged) == (0, 1)
    reverted = await sync_catalog(engine, base, now=NOW + timedelta(days=2))
    assert reverted.prices_added == 1
    assert [row[3] for row in await prices(engine)] == [Decimal("1"), Decimal("1.25"), Decimal("1")]


async def test_a_newer_dated_entry_is_inserted_with_its_own_date(engine: AsyncEngine) -> None:
    await sync_catalog(engine, CatalogFile(models=(model("m"),), prices=(price(JAN, "1"),)), now=NOW)
    later = CatalogFile(models=(model("m"),), prices=(price(JAN, "1"), price(MAR, "3")))
    report = await sync_catalog(engine, later, now=NOW)
    assert (report.prices_added, report.prices_unchanged) == (1, 1)
    assert await starts(engine) == [JAN, MAR]
    assert [row[3] for row in await prices(engine)] == [Decimal(1), Decimal(3)]


async def test_editing_a_superseded_price_cannot_rewrite_history(engine: AsyncEngine) -> None:
    await sync_catalog(engine, CatalogFile(models=(model("m"),), prices=(price(JAN, "1"), price(MAR, "3"))))
    edited = CatalogFile(models=(model("m"),), prices=(price(JAN, "1.5"), price(MAR, "3")))
    report = await sync_catalog(engine, edited, now=NOW)
    assert (report.prices_added, report.prices_unchanged, report.prices_ignored) == (0, 1, 1)
    assert await starts(engine) == [JAN, MAR]


async def test_a_future_price_edited_before_it_starts(engine: AsyncEngine) -> None:
    future = datetime(2027, 1, 1, tzinfo=UTC)
    await sync_catalog(engine, CatalogFile(models=(model("m"),), prices=(price(future, "1"),)), now=NOW)
    report = await sync_catalog(engine, CatalogFile(models=(model("m"),), prices=(price(future, "2"),)), now=NOW)
    assert report.prices_added == 1
    assert await starts(engine) == [future, future + timedelta(microseconds=1)]


async def test_models_aliases_and_deployments_follow_the_files(engine: AsyncEngine) -> None:
    a, b = DeploymentSpec("p", "up/a", 10), DeploymentSpec("q", "up/a", 5)
    first = CatalogFile(models=(model("m", "x", "y", deployments=(a, b)), model("gone", "z")))
    await sync_catalog(engine, first)
    second = CatalogFile(models=(model("m", "x", deployments=(DeploymentSpec("p", "up/a", 99),)), model("n", "y")))
    report = await sync_catalog(engine, second)
    assert report.models_removed == 1
    state = await dump(engine)
    assert [row[0] for row in state["models"]] == ["m", "n"]
    assert state["aliases"] == [("x", "m"), ("y", "n")]
    assert [row[1:] for row in state["deployments"]] == [("m", "p", "up/a", 99)]
    assert state["deployments"][0][0] == 1  # the surviving deployment kept its row
    capabilities = await rows(engine, "SELECT capabilities FROM models WHERE id = 'm'")
    assert capabilities[0][0] in (["tools", "vision"], '["tools", "vision"]')


async def test_a_future_price_moved_earlier_holds_from_its_new_date(engine: AsyncEngine) -> None:
    """The later row had the entry's amounts, so the move was "unchanged": the old price stayed in
    effect until the old date. A future window rewrites no history; each run after the first
    changes nothing."""
    may, april = datetime(2030, 5, 1, tzinfo=UTC), datetime(2030, 4, 1, tzinfo=UTC)
    await sync_catalog(engine, CatalogFile(models=(model("m"),), prices=(price(JAN, "1"), price(may, "7"))), now=NOW)
    moved = CatalogFile(models=(model("m"),), prices=(price(JAN, "1"), price(april, "7")))
    report = await sync_catalog(engine, moved, now=NOW)
    assert (report.prices_added, report.prices_unchanged) == (1, 1)
    assert sorted(zip(await starts(engine), [row[3] for row in await prices(engine)], strict=True)) == [
        (JAN, Decimal(1)),
        (april, Decimal(7)),
        (may, Decimal(7)),
    ]
    assert (await sync_catalog(engine, moved, now=NOW)).prices_added == 0
    # moved earlier and changed: from April, and again after May's row, which held the old amounts
    changed = CatalogFile(models=(model("m"),), prices=(price(JAN, "1"), price(datetime(2030, 3, 1, tzinfo=UTC), "9")))
    assert (await sync_catalog(engine, changed, now=NOW)).prices_added == 3
    in_effect = sorted(zip(await starts(engine), [row[3] for row in await prices(engine)], strict=True))
    tick = timedelta(microseconds=1)
    assert [(at, rate) for at, rate in in_effect if rate == 9] == [
        (datetime(2030, 3, 1, tzinfo=UTC), Decimal(9)),
        (april + tick, Decimal(9)),
        (may + tick, Decimal(9)),
    ]
    assert (await sync_catalog(engine, changed, now=NOW)).prices_added == 0


async def test_a_future_price_edited_again_and_again_adds_a_row_each_time(engine: AsyncEngine) -> None:
    """A row already 1µs after the entry's date (the first edit's) made the next sync insert there
    again: a UNIQUE violation, and every later sync and start failed."""
    may = datetime(2030, 5, 1, tzinfo=UTC)
    tick = timedelta(microseconds=1)
    for rate, added in (("7", 2), ("8", 1), ("8", 0), ("9", 1), ("9", 0)):
        catalog = CatalogFile(models=(model("m"),), prices=(price(JAN, "1"), price(may, rate)))
        assert (await sync_catalog(engine, catalog, now=NOW)).prices_added == added, rate
    assert sorted(zip(await starts(engine), [row[3] for row in await prices(engine)], strict=True)) == [
        (JAN, Decimal(1)),
        (may, Decimal(7)),
        (may + tick, Decimal(8)),
        (may + 2 * tick, Decimal(9)),
    ]


async def test_a_past_entrys_window_holds_its_price_ahead_of_now(engine: AsyncEngine) -> None:
    """Later rows dated ahead inside a past entry's window (entries since removed from the file)
    are overruled from the instant after each: only its latest row used to be compared."""
    mar, apr, may = (datetime(2030, month, 1, tzinfo=UTC) for month in (3, 4, 5))
    before = (price(JAN, "1"), price(mar, "3"), price(apr, "1"), price(may, "7"))
    await sync_catalog(engine, CatalogFile(models=(model("m"),), prices=before), now=NOW)
    report = await sync_catalog(
        engine, CatalogFile(models=(model("m"),), prices=(price(JAN, "1"), price(may, "7"))), now=NOW
    )
    assert (report.prices_added, report.prices_unchanged) == (1, 1)
    assert (mar + timedelta(microseconds=1), Decimal(1)) in zip(
        await starts(engine), [row[3] for row in await prices(engine)], strict=True
    )
