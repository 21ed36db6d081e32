"""Database fixtures for the catalog tests: SQLite in a tmp file and the real local PostgreSQL.

PostgreSQL tests never skip: if the server is down, they fail. Each test session creates its own
databases (`switchyard_test_<random>`) through an admin connection to `test` and drops them at the
end, so runs never see each other's rows.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from catalog.migrate import upgrade_async

PG_ADMIN_DSN = "postgresql://postgres@127.0.0.1:5432/test"
PG_URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/{name}"
TABLES = (
    "ledger",
    "usage_hourly",
    "usage_hourly_models",
    "usage_hourly_model_status",
    "usage_daily",
    "prices",
    "deployments",
    "model_aliases",
    "models",
    "keys",
)


class PgDatabases:
    """Creates fresh PostgreSQL databases for this test session and drops them afterwards."""

    def __init__(self) -> None:
        self.names: list[str] = []

    async def create(self) -> str:
        name = f"switchyard_test_{secrets.token_hex(6)}"
        admin = await asyncpg.connect(PG_ADMIN_DSN)
        try:
            await admin.execute(f'CREATE DATABASE "{name}"')
        finally:
            await admin.close()
        self.names.append(name)
        return PG_URL.format(name=name)

    async def drop_all(self) -> None:
        admin = await asyncpg.connect(PG_ADMIN_DSN)
        try:
            for name in self.names:
                await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()


@pytest.fixture(scope="session")
async def pg_databases() -> AsyncIterator[PgDatabases]:
    databases = PgDatabases()
    yield databases
    await databases.drop_all()


@pytest.fixture(scope="session")
async def pg_catalog_url(pg_databases: PgDatabases) -> str:
    """One migrated PostgreSQL database shared by the tests; each test truncates it first."""
    url = await pg_databases.create()
    await upgrade_async(url)
    return url


NewDatabase = Callable[[], Awaitable[str]]


@pytest.fixture(params=["sqlite", "postgresql"])
def fresh_url(request: pytest.FixtureRequest, tmp_path: Path, pg_databases: PgDatabases) -> NewDatabase:
    """Makes URLs of new, empty (unmigrated) databases of the parametrized dialect."""
    counter = iter(range(1000))

    async def make() -> str:
        if request.param == "sqlite":
            return f"sqlite+aiosqlite:///{tmp_path / f'fresh{next(counter)}.db'}"
        return await pg_databases.create()

    return make


@pytest.fixture(params=["sqlite", "postgresql"])
async def engine(request: pytest.FixtureRequest, tmp_path: Path, pg_catalog_url: str) -> AsyncIterator[AsyncEngine]:
    """An engine on a migrated, empty database: SQLite (tmp file) or PostgreSQL."""
    if request.param == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path / 'catalog.db'}"
        await upgrade_async(url)
    else:
        url = pg_catalog_url
    created = create_async_engine(url)
    if request.param == "postgresql":
        async with created.begin() as connection:
            await connection.execute(text(f"TRUNCATE {', '.join(TABLES)} RESTART IDENTITY CASCADE"))
    yield created
    await created.dispose()
