"""Alembic, driven from code: upgrade, downgrade and read the current revision of a database.

There is no `alembic.ini`; the configuration is built here with `script_location` pointing at the
`migrations` package, and the URL travels in `config.attributes["url"]` (so a `%` in a password
needs no configparser escaping). `migrations/env.py` runs the async engine with `asyncio.run`, so
the synchronous functions must not be called from a running event loop; the `*_async` variants
run them in a worker thread for callers that are inside one (the app's lifespan, tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.util import CommandError
from sqlalchemy import Connection, make_url, pool

from catalog.database import open_engine, sqlite_file

if TYPE_CHECKING:
    from alembic.script import ScriptDirectory


MIGRATION_LOCK = 0x5377_6974_6368  # "Switch": the advisory lock's key, held until the migration commits
MIGRATING = "switchyard migration"  # a migration's session's application_name (not an older writer's)


class SchemaNotCurrent(Exception):
    """The database's schema is not this version's (never migrated, or migrated to another
    revision) and this start does not migrate it (PostgreSQL: `switchyard db upgrade`)."""


async def require_current(url: str) -> None:
    """Raise `SchemaNotCurrent` unless the database is at the newest revision."""
    stamped, newest = await current_async(url), head()
    _require_known(stamped)
    if stamped != newest:
        state = "has no Switchyard schema" if stamped is None else f"is at schema revision {stamped}, not {newest}"
        raise SchemaNotCurrent(f"the database {state}: run `switchyard db upgrade` first")


async def schema_ready(url: str, *, migrate: bool, create: bool = True) -> None:
    """Before a command reads or writes the database: migrate it (`auto_migrate`, SQLite's
    default), or raise `SchemaNotCurrent` when it is not at this version's revision. A report
    (`create=False`) never makes a SQLite file: run from another directory, it made an empty
    database and said "0 requests" where it should say it found none."""
    path = sqlite_file(url)
    if not create and path is not None and not os.path.exists(path):  # noqa: ASYNC240 (a stat, once, in a CLI command)
        message = f"no database at {path} (`switchyard serve` or `db upgrade` makes it): is this its config?"
        raise SchemaNotCurrent(message)
    if migrate:
        await upgrade_async(url)
    else:
        await require_current(url)


def _script_location() -> str:
    import migrations

    return str(Path(migrations.__file__).resolve().parent)


def alembic_config(url: str) -> Config:
    """An Alembic `Config` for `url` with this project's migration scripts."""
    config = Config()
    config.set_main_option("script_location", _script_location())
    config.attributes["url"] = url
    return config


def _require_known(stamped: str | None) -> None:
    """`SchemaNotCurrent` for a database stamped with a revision these scripts do not have: a newer
    Switchyard migrated it, and neither `db upgrade` nor `db downgrade` of this one can move it."""
    if stamped is None:
        return
    try:
        _scripts().get_revision(stamped)
    except CommandError:
        raise SchemaNotCurrent(
            f"the database is at schema revision {stamped}, which this version of Switchyard does not know "
            "(a newer version migrated it): run that version, or downgrade the database with it first"
        ) from None


def upgrade(url: str, revision: str = "head") -> None:
    """Migrate to `revision`, one process at a time: commands started together on a new database
    each ran the first migration (`table models already exists`). PostgreSQL takes an advisory
    lock in the migration's transaction (`migrations/env.py`); a SQLite file is locked here
    (`flock` on the file itself, which SQLite's own `fcntl` locks do not see). A database at a
    revision these scripts lack is `SchemaNotCurrent`, saying so (Alembic: "Can't locate revision")."""
    with _sqlite_file_locked(url):
        try:
            config = alembic_config(url)
            config.attributes["upgrading"] = True  # what `migrations/env.py` checks before an upgrade only
            command.upgrade(config, revision)
        except CommandError:
            _require_known(current(url))
            raise


@contextlib.contextmanager
def _sqlite_file_locked(url: str) -> Iterator[None]:
    """The file SQLite opens, as SQLAlchemy reads the URL (`%41` is `A`): the raw text made a
    second, empty file beside it and locked that one."""
    path = sqlite_file(url) if url else None
    if path is None or make_url(url).query:
        yield  # not a plain file (the caller's own engine, a URI): nothing a second process shares
        return
    try:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # an empty file is an empty database
    except OSError:  # no such directory, no right to it: SQLite says so in its own words
        yield
        return
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)  # and with it the lock


def downgrade(url: str, revision: str) -> None:
    """Revert to `revision`: Alembic's `CommandError` for a revision that does not exist or is
    above the database's (bad usage), `SchemaNotCurrent` for a database no script here knows."""
    try:
        command.downgrade(alembic_config(url), revision)
    except CommandError:
        _require_known(current(url))
        raise


def _revision_of(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()


async def current_async(url: str) -> str | None:
    """The revision stamped in the database, or None when it has never been migrated."""
    engine = open_engine(url, poolclass=pool.NullPool)
    try:
        async with engine.connect() as connection:
            return await connection.run_sync(_revision_of)
    finally:
        await engine.dispose()


def current(url: str) -> str | None:
    return asyncio.run(current_async(url))


async def upgrade_async(url: str, revision: str = "head") -> None:
    await asyncio.to_thread(upgrade, url, revision)


async def downgrade_async(url: str, revision: str) -> None:
    await asyncio.to_thread(downgrade, url, revision)


def head() -> str | None:
    """The newest revision among the migration scripts."""
    return _scripts().get_current_head()


def _scripts() -> ScriptDirectory:
    """The migration scripts."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config(""))
