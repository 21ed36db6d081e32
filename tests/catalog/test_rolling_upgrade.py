"""A rolling upgrade on PostgreSQL (an upgrade audit): processes of the version before a migration
keep running while `switchyard db upgrade` applies it, until each is restarted.

- 0009 renamed `api_keys` to `keys`: a view keeps the old name, so an older process still sees
  (and makes) every key change; without it a key revoked with the new version kept working there.
- 0005 to 0008 added the roll-ups the reports read: a ledger writer from before 0008 keeps fewer of
  them (none before 0005), so rows it writes after the upgrade would be missing from every report.
  The upgrade of such a database refuses while another session is connected to it.

The older processes are stood in for by what they run: their SQL (catalog/keys.py before 0009),
their ledger writer's plain INSERT (no roll-ups before 0005)."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import asyncpg
import msgspec
import pytest
from sqlalchemy import insert, text
from sqlalchemy.ext.asyncio import create_async_engine

from catalog import migrate
from catalog.keys import hash_secret, revoke_key
from catalog.migrate import MIGRATING, MIGRATION_LOCK
from catalog.tables import LedgerRow
from catalog.usage_query import parse_query
from catalog.usage_report import usage_report
from tests.catalog.conftest import PG_ADMIN_DSN, PgDatabases
from tests.catalog.usage_oracle import expected, ledger_rows

SECRET = "sy-rolling-upgrade-secret-00000000000000000000"
HOUR = datetime(2026, 11, 28, 10, 0, tzinfo=UTC)


async def test_a_process_from_before_0009_still_sees_keys_revoked_and_made_after_it(pg_databases: PgDatabases) -> None:
    url = await pg_databases.create()
    await migrate.upgrade_async(url, "0008")
    engine = create_async_engine(url)
    now = datetime.now(UTC)
    try:
        async with engine.begin() as connection:  # a key the older version made, with its own SQL
            await connection.execute(
                text(
                    "INSERT INTO api_keys (id, secret_hash, prefix, name, owner, created_at, updated_at) "
                    "VALUES ('key_old', :hash, 'sy-roll', 'old', 'team-a', :now, :now)"
                ),
                {"hash": hash_secret(SECRET), "now": now},
            )
        await migrate.upgrade_async(url)
        assert await revoke_key(engine, "key_old") is not None  # revoked with the new version
        async with engine.connect() as connection:  # the older process's lookup and its poll for changes
            revoked = await connection.scalar(
                text("SELECT revoked_at FROM api_keys WHERE secret_hash = :hash"), {"hash": hash_secret(SECRET)}
            )
            latest = await connection.scalar(text("SELECT max(updated_at) FROM api_keys"))
        assert revoked is not None
        assert latest > now  # the poll's watermark moved: the older process reloads its keys
        await migrate.downgrade_async(url, "0008")  # and back: the view goes, the table takes its name again
        async with engine.connect() as connection:
            kinds = await connection.scalar(text("SELECT relkind::text FROM pg_class WHERE relname = 'api_keys'"))
        assert kinds == "r"
    finally:
        await engine.dispose()


def _old_row(n: int) -> dict[str, object]:
    """A ledger row as a writer from before 0005 inserts it: no owner, no roll-ups."""
    started = HOUR + timedelta(minutes=n)
    return {
        "request_id": f"old-{n}",
        "started_at": started,
        "finished_at": started + timedelta(seconds=1),
        "status": "ok",
        "streamed": False,
        "latency_ms": 12.5,
        "model": "mock-model",
        "provider": "mock",
        "api": "openai_chat",
        "input_tokens": 10,
        "output_tokens": 3,
        "cost_usd": Decimal("0.0000095"),
        "estimated_cost_usd": Decimal("0.0000095"),
        "cost_source": "estimated",
    }


@pytest.mark.parametrize("older", ["0004", "0007"])
async def test_an_upgrade_to_the_roll_ups_refuses_while_an_older_process_is_connected(
    pg_databases: PgDatabases, older: str
) -> None:
    url = await pg_databases.create()
    await migrate.upgrade_async(url, older)
    old = create_async_engine(url)  # the older process: its pool keeps a connection between batches
    try:
        async with old.begin() as connection:
            await connection.execute(insert(LedgerRow.__table__), [_old_row(n) for n in range(3)])
        with pytest.raises(migrate.SchemaNotCurrent, match=f"schema revision {older}.*1 other session"):
            await migrate.upgrade_async(url)
        assert await migrate.current_async(url) == older  # nothing applied
        await old.dispose()  # the older process stopped: now it upgrades
        await migrate.upgrade_async(url)
        if older >= "0005":
            return  # (a writer of 0005 to 0007 keeps some roll-ups, which this stand-in does not)
        ledger = await ledger_rows(old)  # 0005 rolls the rows up from the ledger: the reports count them all
        query = parse_query({"from": "2026-11-28", "to": "2026-11-29", "group_by": "model"}, datetime.now(UTC))
        answer = msgspec.to_builtins(await usage_report(old, query))
        assert answer["totals"]["requests"] == 3
        assert {k: answer[k] for k in ("group_by", "rows", "totals")} == expected(ledger, query)
    finally:
        await old.dispose()


async def test_an_upgrade_past_the_roll_ups_does_not_mind_other_sessions(pg_databases: PgDatabases) -> None:
    """From 0008 on every version's writer keeps the four roll-ups: a rolling upgrade is safe."""
    url = await pg_databases.create()
    await migrate.upgrade_async(url, "0008")
    old = create_async_engine(url)
    try:
        async with old.connect() as connection:
            await connection.execute(text("SELECT 1"))
            await migrate.upgrade_async(url)
        assert await migrate.current_async(url) == migrate.head()
    finally:
        await old.dispose()


@pytest.fixture
async def roles() -> AsyncIterator[tuple[str, str, str]]:
    """A database owned by a role of its own (which migrates it) and a service role that writes it:
    the least-privilege setup. Dropped afterwards, roles included."""
    suffix = secrets.token_hex(4)
    database, owner, service = f"switchyard_test_roles_{suffix}", f"sy_owner_{suffix}", f"sy_service_{suffix}"
    await _as_admin(
        f"CREATE ROLE {owner} LOGIN", f"CREATE ROLE {service} LOGIN", f"CREATE DATABASE {database} OWNER {owner}"
    )
    yield database, owner, service
    await _as_admin(
        f"DROP DATABASE IF EXISTS {database} WITH (FORCE)",
        f"DROP ROLE IF EXISTS {service}",
        f"DROP ROLE IF EXISTS {owner}",
    )


async def _as_admin(*statements: str) -> None:
    admin = await asyncpg.connect(PG_ADMIN_DSN)
    try:
        for statement in statements:
            await admin.execute(statement)
    finally:
        await admin.close()


async def test_an_older_process_connected_as_another_role_is_seen(roles: tuple[str, str, str]) -> None:
    """To a role without `pg_read_all_stats`, another role's sessions show NULL in every column of
    `pg_stat_activity` but their ids: the guard counted none of them (a review)."""
    database, owner, service = roles
    url = f"postgresql+asyncpg://{owner}@127.0.0.1:5432/{database}"
    await migrate.upgrade_async(url, "0004")
    granting = await asyncpg.connect(f"postgresql://{owner}@127.0.0.1:5432/{database}")
    try:
        await granting.execute(f"GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA public TO {service}")
    finally:
        await granting.close()
    older = await asyncpg.connect(f"postgresql://{service}@127.0.0.1:5432/{database}")  # the older process
    try:
        await older.execute("SELECT count(*) FROM ledger")
        with pytest.raises(migrate.SchemaNotCurrent, match="1 other session"):
            await migrate.upgrade_async(url)
    finally:
        await older.close()


async def test_two_upgrades_started_together_below_0008_both_succeed(pg_databases: PgDatabases) -> None:
    """Another `db upgrade` of the same version, connected but not yet waiting for the migration's
    lock (its session between connecting and `pg_advisory_xact_lock`), counted as an older writer:
    upgrades started together, one per replica, refused each other (a review; 1 in 8 with three).
    A migration's session is named (`catalog.migrate.MIGRATING`) and not counted."""
    url = await pg_databases.create()
    await migrate.upgrade_async(url, "0004")
    plain = url.replace("postgresql+asyncpg://", "postgresql://")
    other = await asyncpg.connect(plain, server_settings={"application_name": MIGRATING})
    try:
        await other.execute("BEGIN")  # the other command: connected, its transaction begun ...
        first = asyncio.ensure_future(migrate.upgrade_async(url))
        await asyncio.sleep(0.5)  # ... while this one checks
        waiting = asyncio.ensure_future(other.execute(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK})"))
        await asyncio.wait_for(first, 30)
        await asyncio.wait_for(waiting, 30)
        await other.execute("COMMIT")
        assert await migrate.current_async(url) == migrate.head()
    finally:
        await other.close()
