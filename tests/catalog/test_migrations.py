"""Alembic migrations: upgrade → downgrade → upgrade on SQLite and PostgreSQL, matching `metadata`."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, inspect, text
from sqlalchemy.ext.asyncio import create_async_engine

from catalog import migrate
from catalog.database import open_engine
from catalog.tables import metadata
from tests.catalog.conftest import PgDatabases
from tests.support.cli import cli_env, run_cli
from tests.support.ports import free_port

TABLES = {
    "models",
    "model_aliases",
    "deployments",
    "prices",
    "ledger",
    "keys",
    "usage_hourly",
    "usage_daily",
    "usage_hourly_models",
    "usage_hourly_model_status",
}
FIRST_TABLES = TABLES - {"keys", "usage_hourly", "usage_daily", "usage_hourly_models", "usage_hourly_model_status"}
LEDGER_INDEXES = {"ix_ledger_reporting": ["started_at", "model", "provider", "api_key_id", "status"]}
FIRST_LEDGER_INDEXES = {
    "ix_ledger_started_at": ["started_at"],
    "ix_ledger_model_started_at": ["model", "started_at"],
    "ix_ledger_provider_started_at": ["provider", "started_at"],
    "ix_ledger_api_key_started_at": ["api_key_id", "started_at"],
    "ix_ledger_status_started_at": ["status", "started_at"],
}


def _schema(connection: Connection) -> dict[str, Any]:
    inspector = inspect(connection)
    tables = set(inspector.get_table_names()) - {"alembic_version"}
    indexes = {i["name"]: i["column_names"] for i in inspector.get_indexes("ledger")} if "ledger" in tables else {}
    return {"tables": tables, "indexes": indexes}


def _diff(connection: Connection) -> list[Any]:
    context = MigrationContext.configure(connection, opts={"compare_type": True})
    return list(compare_metadata(context, metadata))


async def inspect_db(url: str, what: Callable[[Connection], Any]) -> Any:
    engine = create_async_engine(url)
    try:
        async with engine.connect() as connection:
            return await connection.run_sync(what)
    finally:
        await engine.dispose()


async def test_upgrade_downgrade_upgrade(fresh_url: Callable[[], Awaitable[str]]) -> None:
    url = await fresh_url()
    assert await migrate.current_async(url) is None
    await migrate.upgrade_async(url)
    assert await migrate.current_async(url) == migrate.head() == "0009"
    assert await inspect_db(url, _schema) == {"tables": TABLES, "indexes": LEDGER_INDEXES}
    await migrate.downgrade_async(url, "0008")
    assert await inspect_db(url, _schema) == {"tables": TABLES - {"keys"} | {"api_keys"}, "indexes": LEDGER_INDEXES}
    await migrate.downgrade_async(url, "0007")
    without = TABLES - {"usage_hourly_model_status", "keys"} | {"api_keys"}
    assert await inspect_db(url, _schema) == {"tables": without, "indexes": LEDGER_INDEXES}
    await migrate.downgrade_async(url, "0006")
    assert await inspect_db(url, _schema) == {"tables": without - {"usage_hourly_models"}, "indexes": LEDGER_INDEXES}
    await migrate.downgrade_async(url, "0003")
    assert await inspect_db(url, _schema) == {"tables": FIRST_TABLES, "indexes": LEDGER_INDEXES}
    await migrate.downgrade_async(url, "0001")
    assert await inspect_db(url, _schema) == {"tables": FIRST_TABLES, "indexes": FIRST_LEDGER_INDEXES}
    await migrate.downgrade_async(url, "base")
    assert await migrate.current_async(url) is None
    assert await inspect_db(url, _schema) == {"tables": set(), "indexes": {}}
    await migrate.upgrade_async(url)
    assert await migrate.current_async(url) == "0009"
    assert await inspect_db(url, _schema) == {"tables": TABLES, "indexes": LEDGER_INDEXES}


async def test_the_migrated_schema_matches_the_models(fresh_url: Callable[[], Awaitable[str]]) -> None:
    url = await fresh_url()
    await migrate.upgrade_async(url)
    assert await inspect_db(url, _diff) == []


async def test_the_sync_api_works_outside_an_event_loop(fresh_url: Callable[[], Awaitable[str]]) -> None:
    url = await fresh_url()
    await asyncio.to_thread(migrate.upgrade, url)
    assert await asyncio.to_thread(migrate.current, url) == "0009"
    await asyncio.to_thread(migrate.downgrade, url, "base")
    assert await asyncio.to_thread(migrate.current, url) is None


async def test_a_time_bounded_filtered_report_reads_the_reporting_index(
    fresh_url: Callable[[], Awaitable[str]],
) -> None:
    """The shape of every report (cost.md: a period, optional model/provider/key filters) is
    answered from `ix_ledger_reporting`, not by scanning the ledger."""
    url = await fresh_url()
    await migrate.upgrade_async(url)
    engine = create_async_engine(url)
    period = "started_at >= '2026-11-01' AND started_at < '2026-12-01'"
    report = f"SELECT count(*), sum(input_tokens) FROM ledger WHERE {period} AND model = 'm' AND api_key_id = 'k'"  # noqa: S608
    try:
        async with engine.connect() as connection:
            if engine.dialect.name == "sqlite":
                plan = (await connection.exec_driver_sql(f"EXPLAIN QUERY PLAN {report}")).all()
                search = "SEARCH ledger USING INDEX ix_ledger_reporting (started_at>? AND started_at<?)"
                assert [row[-1] for row in plan] == [search]
            else:
                await connection.exec_driver_sql("SET enable_seqscan = off")  # an empty table is cheaper to scan
                plan = "\n".join(row[0] for row in (await connection.exec_driver_sql(f"EXPLAIN {report}")).all())
                assert "ix_ledger_reporting" in plan
    finally:
        await engine.dispose()


async def test_a_start_that_does_not_migrate_needs_the_newest_schema(pg_databases: PgDatabases, tmp_path: Path) -> None:
    """PostgreSQL is not migrated by `serve` or `catalog sync`: on a database never migrated, or
    left at an older revision, they say to run `switchyard db upgrade` (exit 1) instead of
    failing on a missing table halfway through the catalog sync."""
    url = await pg_databases.create()
    config = tmp_path / "config.toml"
    config.write_text(f'[server]\nport = {free_port()}\n[database]\nurl = "{url}"\n')
    older = "0004"
    for prepare, told in ((None, "has no Switchyard schema"), (older, f"is at schema revision {older}")):
        if prepare is not None:
            await migrate.upgrade_async(url, prepare)
            assert await migrate.current_async(url) == older
        for args in (["catalog", "sync"], ["serve"]):
            result = run_cli(tmp_path, *args, "--config", str(config))
            assert result.returncode == 1, result.stderr
            assert result.stderr.startswith(f"switchyard: SchemaNotCurrent: the database {told}")
            assert result.stderr.endswith(": run `switchyard db upgrade` first\n")
    # a revision no script here has (a newer Switchyard's): upgrading would not help, and says so
    engine = open_engine(url)
    try:
        async with engine.begin() as connection:
            await connection.execute(text("UPDATE alembic_version SET version_num = '9999abcd'"))
    finally:
        await engine.dispose()
    for args in (["serve"], ["db", "upgrade"]):
        result = run_cli(tmp_path, *args, "--config", str(config))
        assert result.returncode == 1, result.stderr
        assert "schema revision 9999abcd, which this version of Switchyard does not know" in result.stderr


async def test_commands_started_together_on_a_new_database_migrate_it_once(
    fresh_url: Callable[[], Awaitable[str]],
) -> None:
    """Each ran the first migration at once: `table models already exists`, `duplicate key value
    violates unique constraint "pg_type_typname_nsp_index"`, or a SQLite file left deleted."""
    url = await fresh_url()
    code = f"from catalog.migrate import upgrade; upgrade({url!r})"  # processes: Alembic's context is one per process
    started = [
        await asyncio.create_subprocess_exec(sys.executable, "-c", code, env=cli_env(), stderr=asyncio.subprocess.PIPE)
        for _ in range(4)
    ]
    outcomes = [(await process.wait(), (await process.communicate())[1].decode()[-300:]) for process in started]
    assert outcomes == [(0, "")] * 4
    assert await migrate.current_async(url) == migrate.head()
