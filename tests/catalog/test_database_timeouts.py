"""A PostgreSQL host that swallows packets (down, partitioned): connecting gives up after
`CONNECT_TIMEOUT_S`, not asyncpg's 60 s, and `/readyz`'s check answers "not ready" within
`READY_CHECK_S` — a start-up, a readiness probe and the shutdown that waits for it stay short.
The database here is a real listener that accepts connections and never answers."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

import app.service
import catalog.database
from app.service import Service, prepare_database
from app.settings import settings_from_mapping
from catalog.database import database_unreachable, open_engine
from catalog.migrate import upgrade_async
from tests.catalog.conftest import PG_ADMIN_DSN, PgDatabases


@pytest.fixture
async def silent_port() -> AsyncIterator[int]:
    held: list[asyncio.StreamWriter] = []

    async def accept(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # never a byte back

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1]
    for writer in held:
        writer.close()
    server.close()
    await server.wait_closed()


async def test_connecting_to_a_silent_database_gives_up_after_the_connect_timeout(
    silent_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(catalog.database, "CONNECT_TIMEOUT_S", 0.5)
    engine = open_engine(f"postgresql+asyncpg://postgres@127.0.0.1:{silent_port}/test")
    started = time.monotonic()
    with pytest.raises(Exception) as failed:  # noqa: PT011 (whatever the driver raises, it is an outage)
        async with engine.connect():
            pass
    assert 0.4 < time.monotonic() - started < 3.0
    assert database_unreachable(failed.value)
    await engine.dispose()


async def test_readiness_answers_not_ready_within_its_bound(
    silent_port: int, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(app.service, "READY_CHECK_S", 0.5)
    url = f"postgresql+asyncpg://postgres@127.0.0.1:{silent_port}/test"
    settings = settings_from_mapping({"database": {"url": url}}, base_dir=tmp_path, source="test")
    service = Service(settings)
    service.engine = open_engine(url)  # the connect timeout (5 s) alone would be too long for /readyz
    started = time.monotonic()
    assert await service.database_ready() is False
    assert time.monotonic() - started < 2.0
    await service.engine.dispose()


async def test_a_failed_statement_never_shows_its_values(tmp_path: Path) -> None:
    """SQLAlchemy writes a statement's parameters into its error, which an unhandled exception
    logs: a key's hash, a filter's value. The engines hide them."""
    engine = open_engine(f"sqlite+aiosqlite:///{tmp_path / 'hidden.db'}")
    with pytest.raises(Exception) as failed:  # noqa: PT011 (the driver's error, whatever it is)
        async with engine.connect() as connection:
            await connection.execute(text("SELECT * FROM nosuch WHERE v = :v"), {"v": "sy-not-in-the-error"})
    await engine.dispose()
    assert "nosuch" in str(failed.value)
    assert "sy-not-in-the-error" not in str(failed.value)


async def test_a_sqlite_file_that_cannot_be_opened_leaves_no_worker_thread_behind() -> None:
    """aiosqlite stops its thread without waiting: the thread's answer, posted after a command's
    loop had closed, printed a traceback under the command's one-line error. The connect waits."""
    engine = open_engine("sqlite+aiosqlite:////proc/switchyard-none/x.db")
    with pytest.raises(Exception, match="unable to open database file"):
        async with engine.connect():
            pass
    workers = [thread for thread in threading.enumerate() if "_connection_worker_thread" in thread.name]
    await engine.dispose()
    assert workers == []


async def test_readiness_is_not_failed_by_a_pooled_connection_the_server_ended(
    tmp_path: Path, pg_catalog_url: str
) -> None:
    """After a PostgreSQL restart or failover every pooled connection is dead, the database answers:
    the first /readyz of every replica said "not ready" (503) all the same."""
    settings = settings_from_mapping({"database": {"url": pg_catalog_url}}, base_dir=tmp_path, source="test")
    service = Service(settings)
    service.engine = open_engine(pg_catalog_url)
    assert await service.database_ready() is True  # its connection is pooled now
    async with service.engine.connect() as connection:
        pid = (await connection.execute(text("SELECT pg_backend_pid()"))).scalar_one()
    admin = await asyncpg.connect(PG_ADMIN_DSN)
    try:
        assert await admin.fetchval("SELECT pg_terminate_backend($1)", pid) is True
    finally:
        await admin.close()
    assert await service.database_ready() is True
    await service.engine.dispose()


async def test_a_migration_cancelled_by_statement_timeout_fails_the_start(
    tmp_path: Path, pg_databases: PgDatabases
) -> None:
    """The database answers, but cancels the migration's statement (57014: `statement_timeout`,
    here behind a lock; a long table rewrite the same): taken for "unreachable", the start skipped
    migrations and catalog sync with a warning and served on the old schema, its ledger rows
    failing as an outage for good. The start fails with the database's error, as before."""
    url = await pg_databases.create()
    await upgrade_async(url)
    name = url.rsplit("/", 1)[1]
    admin = await asyncpg.connect(PG_ADMIN_DSN.rsplit("/", 1)[0] + f"/{name}")
    try:
        await admin.execute(f"ALTER DATABASE \"{name}\" SET statement_timeout = '200ms'")
        await admin.execute("BEGIN; LOCK TABLE alembic_version IN ACCESS EXCLUSIVE MODE")
        mapping = {"database": {"url": url, "auto_migrate": True}, "catalog": {"sync_on_start": False}}
        settings = settings_from_mapping(mapping, base_dir=tmp_path, source="test")
        engine = open_engine(url)
        with pytest.raises(DBAPIError) as failed:
            await prepare_database(settings, engine)
        assert failed.value.orig.sqlstate == "57014"  # type: ignore[union-attr]
        await engine.dispose()
        await admin.execute("ROLLBACK")
    finally:
        await admin.close()
