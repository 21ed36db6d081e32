"""Alembic environment: runs the migrations over an async engine (aiosqlite or asyncpg).

The URL comes from `config.attributes["url"]` (set by `catalog.migrate`), else from the
`sqlalchemy.url` main option. A caller that already holds a synchronous `Connection` (for example
inside `AsyncConnection.run_sync`) may pass it as `config.attributes["connection"]` instead.
SQLite gets `render_as_batch` so later ALTERs are emitted as table rebuilds.
"""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy import pool
from sqlalchemy.engine import Connection

from catalog.database import open_engine
from catalog.tables import metadata

MIGRATION_LOCK = 0x5377_6974_6368  # "Switch": the advisory lock's key, held until the migration commits


def _url() -> str:
    url = context.config.attributes.get("url") or context.config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("no database URL: set config.attributes['url'] or sqlalchemy.url")
    return str(url)


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":  # one migrating process at a time (`catalog.migrate.upgrade`)
            connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK})")
        context.run_migrations()


async def _run_async(url: str) -> None:
    engine = open_engine(url, poolclass=pool.NullPool)
    try:
        async with engine.connect() as connection:
            await connection.run_sync(_run)
    finally:
        await engine.dispose()


def _run_offline(url: str) -> None:
    context.configure(
        url=url,
        target_metadata=metadata,
        literal_binds=True,
        render_as_batch=url.startswith("sqlite"),
    )
    with context.begin_transaction():
        context.run_migrations()


def _main() -> None:
    given = context.config.attributes.get("connection")
    if isinstance(given, Connection):
        _run(given)
    elif context.is_offline_mode():
        _run_offline(_url())
    else:
        asyncio.run(_run_async(_url()))


_main()
