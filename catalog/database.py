"""The one way the service opens its database: `open_engine(url)`; `database_unreachable(exc)`
tells an outage from other errors where the service starts without its database (app/service.py).

SQLite (the embedded default) gets the pragmas a server process needs: write-ahead logging, so
readers never block the ledger writer and a commit is one append instead of a rollback journal
created, synced and deleted (that journal churn cost about a fifth of a core at 800 requests/s,
measured with per-thread CPU counters); `synchronous=NORMAL`, which in WAL mode never corrupts
the file and loses nothing on a process crash (only on power loss, the last commits); and a busy
timeout, so several workers share the file by waiting instead of failing with "database is
locked". PostgreSQL gets a connect timeout of `CONNECT_TIMEOUT_S` instead of asyncpg's 60 s: a
database host that swallows packets (down, partitioned) would otherwise hold a start-up, each
`/readyz` and a shutdown that waits for them for a minute per connection attempt.

PostgreSQL behind a pooler in transaction mode (PgBouncer, the "transaction" poolers of managed
databases): asyncpg names its prepared statements `__asyncpg_stmt_1__`, `_2__`, ... per client
connection, and the pooler hands one server session to many clients in turn, so a client's first
statement met another's: `prepared statement "__asyncpg_stmt_1__" already exists`, in `serve`
and every command. A URL with asyncpg's own `statement_cache_size=0` (its answer for poolers)
turns off both statement caches, asyncpg's and SQLAlchemy's: asyncpg (0.29 on) then prepares
each statement unnamed, and SQLAlchemy runs it in the transaction that prepared it, on one
server session; nothing is left in the session for the next client. The URL's text is made the
number asyncpg takes (a string there failed at the first connection).

A SQLite file that cannot be opened: aiosqlite stops its worker thread without waiting for it,
and the thread's answer to that stop, posted to an event loop a command had closed meanwhile,
printed "Exception in thread ... Event loop is closed" after the command's own one-line error
(one run in five). `_sqlite_connect` waits for that thread before the error goes on.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiosqlite
from sqlalchemy import event, make_url
from sqlalchemy.exc import DBAPIError, DisconnectionError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from catalog.sqlite_rows import SQLITE_PRAGMAS

CONNECT_TIMEOUT_S = 5.0


def sqlite_file(url: str) -> str | None:
    """The file a SQLite URL names, as SQLAlchemy reads it (`%41` is `A`); None for another
    database, `:memory:` or a `file:` URI."""
    parsed = make_url(url)
    path = parsed.database if parsed.get_backend_name() == "sqlite" else None
    return path if path and path != ":memory:" and not path.startswith("file:") else None


def open_engine(url: str, **options: Any) -> AsyncEngine:
    options.setdefault("hide_parameters", True)  # a statement's values (a key's hash) never in an error or a log line
    if url.startswith("postgresql"):
        connect_args = options.setdefault("connect_args", {})
        connect_args.setdefault("timeout", CONNECT_TIMEOUT_S)
        cache_size = make_url(url).query.get("statement_cache_size")
        if isinstance(cache_size, str):  # a URL's text, which asyncpg takes only as a number
            connect_args["statement_cache_size"] = int(cache_size)
            if int(cache_size) == 0:  # a pooler in transaction mode (module doc)
                connect_args.setdefault("prepared_statement_cache_size", 0)
    engine = create_async_engine(url, **options)
    if engine.dialect.name == "sqlite":
        event.listen(engine.sync_engine, "do_connect", _sqlite_connector)
        event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
    return engine


def _sqlite_connector(_dialect: Any, _record: Any, _cargs: Any, cparams: dict[str, Any]) -> None:
    cparams["async_creator_fn"] = _sqlite_connect  # SQLAlchemy's aiosqlite adapter calls it with the URL's arguments


async def _sqlite_connect(*args: Any, **kwargs: Any) -> aiosqlite.Connection:
    connection = aiosqlite.connect(*args, **kwargs)
    connection._thread.daemon = True  # as SQLAlchemy's own connect does: an open connection never holds an exit
    try:
        return await connection
    except BaseException:
        await asyncio.to_thread(connection._thread.join, 5.0)  # its stop answered while the loop still runs
        raise


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    for pragma in SQLITE_PRAGMAS:
        cursor.execute(pragma)
    cursor.close()


# SQLSTATE classes of a server that cannot take the connection or the statement now: connection
# exception, out of connections (max_connections, a role's or database's limit), disk or memory,
# shut down or starting up, I/O error. SQLAlchemy's asyncpg dialect raises them as a plain
# `DBAPIError`, which answered a request 500 `internal error` where it is 503 `unavailable`.
_PASSING_STATES = ("08", "53", "57", "58")


def database_unreachable(exc: BaseException) -> bool:
    """Whether `exc` says the database cannot be reached (down, refusing, gone mid-connection,
    out of connections), as opposed to a schema or data problem that a start must not paper over."""
    if isinstance(exc, OSError | TimeoutError | DisconnectionError | PoolTimeout):
        return True
    if isinstance(exc, DBAPIError):
        state = getattr(exc.orig, "sqlstate", None)
        passing = isinstance(state, str) and state.startswith(_PASSING_STATES)
        return exc.connection_invalidated or passing or isinstance(exc, OperationalError | InterfaceError)
    return False
