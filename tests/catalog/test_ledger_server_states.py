"""PostgreSQL states an operator or a failover puts the server in while the gateway writes its
ledger: each is an outage the rows wait out in the journal, never the rows' fault.

Sorted as the rows' fault, they were set aside (`ledger_row_rejected`, `rejected.jsonl`) and never
written: a standby after a failover refused every batch as read-only, a `statement_timeout` cut
the batches waiting behind a lock, and a database renamed (or dropped and made again) failed the
store's connect, which was not sorted at all. Each lost every answered request of the spell."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
from sqlalchemy.engine import make_url

from catalog.database import open_engine
from catalog.ledger import LedgerWriter
from catalog.migrate import upgrade_async
from catalog.records import LedgerRecord
from tests.catalog.conftest import PG_ADMIN_DSN, PgDatabases
from tests.support.waiting import wait_until

START = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)


def record(n: int) -> LedgerRecord:
    at = START + timedelta(milliseconds=n)
    return LedgerRecord(
        request_id=f"state-{n:04d}", started_at=at, finished_at=at, status="ok", streamed=False, latency_ms=1.0
    )


@pytest.fixture
async def database(pg_databases: PgDatabases) -> AsyncIterator[str]:
    url = await pg_databases.create()
    await upgrade_async(url)
    name = make_url(url).database or ""
    yield name
    await admin(f'DROP DATABASE IF EXISTS "{name}_away" WITH (FORCE)')  # a failed "renamed" case's


async def admin(sql: str, database: str | None = None) -> None:
    dsn = PG_ADMIN_DSN if database is None else PG_ADMIN_DSN.rsplit("/", 1)[0] + f"/{database}"
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute(sql)
    finally:
        await connection.close()


async def end_sessions(name: str) -> None:
    """The writer's connection ended, as a failover or an administrator ends it."""
    await admin(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'")  # noqa: S608


async def written(name: str) -> list[str]:
    connection = await asyncpg.connect(PG_ADMIN_DSN.rsplit("/", 1)[0] + f"/{name}")
    try:
        return [row[0] for row in await connection.fetch("SELECT request_id FROM ledger ORDER BY request_id")]
    finally:
        await connection.close()


@pytest.mark.parametrize("state", ["read_only", "statement_timeout", "renamed"])
async def test_rows_wait_out_a_server_state_and_are_all_written_after_it(database: str, state: str) -> None:
    engine = open_engine(f"postgresql+asyncpg://postgres@127.0.0.1:5432/{database}")
    writer = LedgerWriter(engine, flush_interval=0.01)
    writer.start()
    writer.submit(record(0))
    await asyncio.wait_for(writer.flush(), timeout=10)
    locker: asyncpg.Connection | None = None
    if state == "read_only":  # what a promoted-away primary or a standby looks like
        await admin(f'ALTER DATABASE "{database}" SET default_transaction_read_only = on')
    elif state == "statement_timeout":  # every batch waits on a lock longer than it may run
        await admin(f"ALTER DATABASE \"{database}\" SET statement_timeout = '50ms'")
    await end_sessions(database)
    if state == "renamed":
        await admin(f'ALTER DATABASE "{database}" RENAME TO "{database}_away"')
    elif state == "statement_timeout":
        locker = await asyncpg.connect(PG_ADMIN_DSN.rsplit("/", 1)[0] + f"/{database}")
        await locker.execute("SET statement_timeout = 0; BEGIN; LOCK TABLE ledger IN ACCESS EXCLUSIVE MODE")
    for n in range(1, 6):
        writer.submit(record(n))
    await wait_until(lambda: writer.state == "behind", within=5)
    await asyncio.sleep(0.5)  # several retries
    assert writer.rejected == []
    assert writer.pending == 5
    if locker is not None:
        await locker.execute("ROLLBACK")
        await locker.close()
    if state == "renamed":
        await admin(f'ALTER DATABASE "{database}_away" RENAME TO "{database}"')
    else:
        await admin(f'ALTER DATABASE "{database}" RESET ALL')
        await end_sessions(database)
    await asyncio.wait_for(writer.flush(), timeout=15)
    assert writer.rejected == []
    assert await written(database) == [f"state-{n:04d}" for n in range(6)]
    await writer.close()
    await engine.dispose()
