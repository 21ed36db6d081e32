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
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy.engine import make_url

from catalog.database import open_engine
from catalog.journal import Journal
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


@pytest.mark.parametrize("journaled", [True, False])
async def test_a_batch_longer_than_the_statement_timeout_is_written_row_by_row(
    database: str, journaled: bool, tmp_path: Path
) -> None:
    """A `statement_timeout` cancels a batch that runs longer than it (a busy server, a slow
    trigger), every time: taken for an outage, the same batch was retried for good and the ledger
    stayed `behind` with no row written (the rows one by one were written before 57014 was an
    outage). One row still waits out a lock (`test_rows_wait_out_a_server_state...`)."""
    await admin(
        "CREATE FUNCTION slow_row() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN PERFORM pg_sleep(0.01); RETURN NEW; END $$; "
        "CREATE TRIGGER slow_row BEFORE INSERT ON ledger FOR EACH ROW EXECUTE FUNCTION slow_row()",
        database,
    )
    await admin(f"ALTER DATABASE \"{database}\" SET statement_timeout = '200ms'")  # a batch of 60: 600 ms
    engine = open_engine(f"postgresql+asyncpg://postgres@127.0.0.1:5432/{database}")
    journal = Journal(tmp_path / "journal") if journaled else None
    if journal is not None:
        journal.open()
    writer = LedgerWriter(engine, journal=journal, flush_interval=0.01)
    writer.start()
    for n in range(60):
        writer.submit(record(n))
    await asyncio.wait_for(writer.flush(), timeout=15)
    assert (writer.state, writer.rejected) == ("ok", [])
    assert await written(database) == [f"state-{n:04d}" for n in range(60)]
    await writer.close()  # closes the journal too
    await engine.dispose()
