"""Alembic environment: runs the migrations over an async engine (aiosqlite or asyncpg).

The URL comes from `config.attributes["url"]` (set by `catalog.migrate`), else from the
`sqlalchemy.url` main option. A caller that already holds a synchronous `Connection` (for example
inside `AsyncConnection.run_sync`) may pass it as `config.attributes["connection"]` instead.
SQLite gets `render_as_batch` so later ALTERs are emitted as table rebuilds.

On PostgreSQL an upgrade of a database below 0008 refuses while another session is connected to
it (`_refuse_older_writers`): the processes of an older version that a rolling upgrade leaves
running keep writing ledger rows without the roll-ups the reports read (none before 0005), and
every such row would be missing from the usage reports. From 0008 on every version keeps all four.
"""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy import pool, text
from sqlalchemy.engine import Connection

from catalog.database import open_engine
from catalog.migrate import MIGRATING, MIGRATION_LOCK, SchemaNotCurrent
from catalog.tables import metadata

ROLLUPS_COMPLETE = "0008"  # from this revision on every version's writer keeps all four roll-ups (ids: 4 digits)
# Other clients of this database, but not other migrations (named `MIGRATING`: waiting for the lock, or
# about to take it). Another role's session shows NULL in every column but its ids and name to a role
# without pg_read_all_stats: counted (autovacuum, with no role, is not).
_OTHER_SESSIONS = (
    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
    "AND usesysid IS NOT NULL AND (backend_type = 'client backend' OR backend_type IS NULL) "
    "AND application_name IS DISTINCT FROM :migrating AND wait_event IS DISTINCT FROM 'advisory'"
)


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
            _refuse_older_writers(connection)
        context.run_migrations()


def _refuse_older_writers(connection: Connection) -> None:
    """SchemaNotCurrent for an upgrade of a database below `ROLLUPS_COMPLETE` while another session
    is connected to it (module doc): stop the older version's processes first."""
    stamped = context.get_context().get_current_revision()
    if not context.config.attributes.get("upgrading") or stamped is None or stamped >= ROLLUPS_COMPLETE:
        return
    others = connection.execute(text(_OTHER_SESSIONS), {"migrating": MIGRATING}).scalar_one()
    if others:
        raise SchemaNotCurrent(
            f"the database is at schema revision {stamped} and {others} other session(s) are connected to it: "
            "stop every Switchyard process of the older version, then run `switchyard db upgrade` (rows they "
            "wrote after it would be missing from the usage reports)"
        )


async def _run_async(url: str) -> None:
    named = {"server_settings": {"application_name": MIGRATING}} if url.startswith("postgresql") else {}
    engine = open_engine(url, poolclass=pool.NullPool, connect_args=named)
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
