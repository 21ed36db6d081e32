"""Which failures of a ledger write are outages — the database (or the way to it) failing, so the
same rows may succeed later and are retried — and which are the rows' own fault, so they are set
aside. One place for the writer (`catalog.ledger`) and the stores (`catalog.ledger_store`):

- SQLite (the stdlib driver): `is_sqlite_outage` (`catalog.sqlite_rows`, which the SQLite writer's
  own process imports without SQLAlchemy);
- PostgreSQL (asyncpg, driven by the store itself): `postgres_outages`, which the store turns
  into `LedgerUnavailable` where it happens;
- SQLAlchemy's errors (the engine's own paths): sorted in `is_outage` as its dialects wrap them.
"""

from __future__ import annotations

import sqlite3

from sqlalchemy.exc import (
    DBAPIError,
    DisconnectionError,
    InterfaceError,
    InternalError,
    OperationalError,
    ProgrammingError,
)
from sqlalchemy.exc import TimeoutError as PoolTimeout

from catalog.sqlite_rows import is_sqlite_outage

_OUTAGE_ERRORS = (OperationalError, InterfaceError, ProgrammingError, InternalError)


class LedgerUnavailable(Exception):
    """The database failed a write, not the rows: the same batch may succeed later."""


def is_outage(exc: Exception) -> bool:
    """Whether retrying the same rows can succeed: the database (or the way to it) is failing.

    Errors about the data itself (a constraint, a value the column or the driver refuses, a bind
    error) never heal on retry; neither does a bug of ours. Those rows are set aside instead of
    blocking the rest. A missing table (`ProgrammingError`: not migrated yet) counts as an outage.
    """
    if isinstance(exc, sqlite3.Error):
        return is_sqlite_outage(exc)
    if isinstance(exc, LedgerUnavailable):  # the PostgreSQL store's driver errors, sorted where they happen
        return True
    if isinstance(exc, DBAPIError):
        return exc.connection_invalidated or isinstance(exc, _OUTAGE_ERRORS)
    # Outside the driver, only a pool timeout or a lost connection is the database's doing; any
    # other SQLAlchemy error (a bad argument, a statement that does not compile) is a bug of ours.
    return isinstance(exc, PoolTimeout | DisconnectionError | OSError)


def statement_timed_out(exc: BaseException) -> bool:
    """PostgreSQL cancelled the statement (57014: `statement_timeout`, or a cancel): an outage for
    one row (it waits behind a lock), but a batch that always runs longer than the server lets a
    statement run never gets through, so the writer writes its rows one by one, as for a bad row."""
    return getattr(exc.__cause__, "sqlstate", None) == "57014" or getattr(exc, "sqlstate", None) == "57014"


def postgres_outages() -> tuple[type[BaseException], ...]:
    """asyncpg's errors that SQLAlchemy's asyncpg dialect makes `InterfaceError`,
    `ProgrammingError` or `InternalError` (the writer's outages), the network's, and the server's
    states that pass: a read-only server (a failed-over standby, `default_transaction_read_only`),
    a statement cancelled (`statement_timeout` behind a lock, an administrator), a lock or
    serialization conflict, connections or disk exhausted, a shutdown or a start. Set aside as the
    rows' fault, an outage's rows were lost for good (a value or constraint the database refuses,
    classes 22 and 23, is still the rows' own)."""
    import asyncpg  # only where PostgreSQL is the database

    return (
        OSError,
        TimeoutError,
        asyncpg.InterfaceError,
        asyncpg.SyntaxOrAccessError,
        asyncpg.InternalServerError,
        asyncpg.InvalidCachedStatementError,  # a migration changed a table under the prepared statement
        asyncpg.PostgresConnectionError,  # 08
        asyncpg.InvalidTransactionStateError,  # 25: 25006, read-only
        asyncpg.TransactionRollbackError,  # 40: serialization failure, deadlock
        asyncpg.InsufficientResourcesError,  # 53: disk full, out of memory, too many connections
        asyncpg.ObjectNotInPrerequisiteStateError,  # 55: lock_timeout
        asyncpg.OperatorInterventionError,  # 57: statement_timeout, a cancel, shutdown, starting up
        asyncpg.PostgresSystemError,  # 58: I/O error
    )
