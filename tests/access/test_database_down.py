"""A key with a budget whose spend this period must be read from the ledger (the first request
of a period, a Redis that lost its record) while PostgreSQL is out of reach: refused or hung. The
budget cannot be checked, so the request is refused with 503 `unavailable`, as any request that
needs the database while it is out of reach is, and not held for as long as the database takes
(it was, for good, on a connection that stopped answering); keys without a budget are served on."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import asyncpg
import pytest
from sqlalchemy import update
from sqlalchemy.ext.asyncio import create_async_engine

import app.access.gate
import app.access.keyring
from catalog.migrate import upgrade_async
from catalog.tables import ApiKey
from tests.access.conftest import ADMIN, bearer, keyed_gateway
from tests.catalog.conftest import PG_ADMIN_DSN, PgDatabases
from tests.support.client import COMPLETIONS, body
from tests.support.gateway import StartGateway
from tests.support.logs import Logs
from tests.support.replies import answer
from tests.support.tcp_proxy import TcpProxy
from tests.support.upstream import ReplayUpstream
from tests.support.waiting import wait_until


@pytest.fixture
async def proxied_database() -> AsyncIterator[tuple[str, TcpProxy]]:
    databases = PgDatabases()
    url = await databases.create()
    await upgrade_async(url)
    with TcpProxy(5432) as proxy:
        yield url.replace("127.0.0.1:5432", f"127.0.0.1:{proxy.port}"), proxy
    await databases.drop_all()


@pytest.mark.parametrize("trouble", ["cut", "stall"])
async def test_a_budget_whose_spend_cannot_be_read_is_a_503(
    start_gateway: StartGateway,
    up: ReplayUpstream,
    monkeypatch: pytest.MonkeyPatch,
    proxied_database: tuple[str, TcpProxy],
    trouble: str,
) -> None:
    monkeypatch.setattr(app.access.gate, "SPEND_READ_S", 0.5)
    up.set_default(answer("ok"))
    url, proxy = proxied_database
    gw = await keyed_gateway(start_gateway, up, monkeypatch, database_url=url)
    keys = [
        (await gw.client.post("/api/v1/keys", json={"name": name, **limits}, headers=bearer(ADMIN))).json()["secret"]
        for name, limits in (("budget", {"budget_usd": "1", "budget_period": "day"}), ("rpm", {"rpm": 100}))
    ]
    getattr(proxy, trouble)()  # "stall": the pooled connections never answer again; new ones do

    refused = await gw.client.post(COMPLETIONS, json=body("chat"), headers=bearer(keys[0]), timeout=10)
    assert refused.status_code == 503
    error = refused.json()["error"]
    assert (error["type"], error["message"]) == ("unavailable", "the database cannot be reached; try again shortly")
    assert (await gw.client.post(COMPLETIONS, json=body("chat"), headers=bearer(keys[1]))).status_code == 200
    proxy.restore()
    assert (await gw.client.post(COMPLETIONS, json=body("chat"), headers=bearer(keys[0]))).status_code == 200


async def test_a_revocation_by_the_cli_arrives_after_the_database_connection_stalled(
    start_gateway: StartGateway,
    up: ReplayUpstream,
    monkeypatch: pytest.MonkeyPatch,
    proxied_database: tuple[str, TcpProxy],
) -> None:
    """Without Redis a revocation made by the CLI (here: on the database directly, not through
    the stalled way) reaches a process by its poll; a poll on a connection that stopped answering
    hung for good, and the revoked key was served on."""
    monkeypatch.setattr(app.access.keyring, "READ_S", 0.5)
    up.set_default(answer("ok"))
    url, proxy = proxied_database
    gw = await keyed_gateway(start_gateway, up, monkeypatch, database_url=url)
    key = (await gw.client.post("/api/v1/keys", json={"name": "k"}, headers=bearer(ADMIN))).json()
    assert (await gw.client.post(COMPLETIONS, json=body("chat"), headers=bearer(key["secret"]))).status_code == 200
    proxy.stall()
    await asyncio.sleep(1.0)  # the poll (every 0.5 s) is now waiting on a stalled connection
    direct = create_async_engine(url.replace(f"127.0.0.1:{proxy.port}", "127.0.0.1:5432"))
    async with direct.begin() as connection:
        await connection.execute(
            update(ApiKey)
            .where(ApiKey.id == key["id"])
            .values(revoked_at=datetime.now(UTC), updated_at=datetime.now(UTC))
        )
    await direct.dispose()

    async def refused() -> bool:
        response = await gw.client.post(COMPLETIONS, json=body("chat"), headers=bearer(key["secret"]))
        return response.status_code == 401

    await wait_until(refused, within=10.0, interval=0.2)


async def test_a_database_outage_is_logged_once_by_the_key_poll_not_every_poll(
    logs: Logs,
    start_gateway: StartGateway,
    up: ReplayUpstream,
    monkeypatch: pytest.MonkeyPatch,
    proxied_database: tuple[str, TcpProxy],
) -> None:
    """The key poll (every 0.5 s) logged `keys_reload_failed` at every try while the database was
    down: 2 lines a second per process. One when it starts failing, one when it works again."""
    monkeypatch.setattr(app.access.keyring, "READ_S", 0.3)
    url, proxy = proxied_database
    gw = await keyed_gateway(start_gateway, up, monkeypatch, database_url=url)
    proxy.cut()
    await asyncio.sleep(2.5)  # five polls
    assert len(logs.lines("keys_reload_failed", gw)) == 1
    proxy.restore()

    async def recovered() -> bool:
        return len(logs.lines("keys_reload_recovered", gw)) == 1

    await wait_until(recovered, within=5.0, interval=0.2)
    await asyncio.sleep(1.0)
    assert len(logs.lines("keys_reload_failed", gw)) == 1
    assert len(logs.lines("keys_reload_recovered", gw)) == 1


@pytest.fixture
async def limited_role() -> AsyncIterator[tuple[str, str]]:
    """A database of its own and a role without superuser rights to use it (a superuser is never
    held to a connection limit): its URL, and the role to limit."""
    databases = PgDatabases()
    url = await databases.create()
    await upgrade_async(url)
    role = f"switchyard_test_{secrets.token_hex(6)}"
    name = url.rsplit("/", 1)[1]
    admin = await asyncpg.connect(PG_ADMIN_DSN.rsplit("/", 1)[0] + f"/{name}")
    try:
        await admin.execute(f'CREATE ROLE "{role}" LOGIN')
        await admin.execute(f'GRANT ALL ON ALL TABLES IN SCHEMA public TO "{role}"')
        await admin.execute(f'GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO "{role}"')
    finally:
        await admin.close()
    yield url.replace("postgres@", f"{role}@"), role
    await databases.drop_all()
    admin = await asyncpg.connect(PG_ADMIN_DSN)
    try:
        await admin.execute(f'DROP ROLE IF EXISTS "{role}"')
    finally:
        await admin.close()


async def test_a_budget_whose_spend_cannot_be_read_for_want_of_connections_is_a_503(
    start_gateway: StartGateway,
    up: ReplayUpstream,
    monkeypatch: pytest.MonkeyPatch,
    limited_role: tuple[str, str],
) -> None:
    """A server out of connections (max_connections, or a role's or database's limit) refuses a
    new one with SQLSTATE 53300, which SQLAlchemy raises as a plain `DBAPIError`: the request that
    had to read its key's spend was answered 500 `internal error` and logged as a crash."""
    up.set_default(answer("ok"))
    url, role = limited_role
    gw = await keyed_gateway(start_gateway, up, monkeypatch, database_url=url)
    secret = (
        await gw.client.post(
            "/api/v1/keys", json={"name": "b", "budget_usd": "1", "budget_period": "day"}, headers=bearer(ADMIN)
        )
    ).json()["secret"]
    admin = await asyncpg.connect(PG_ADMIN_DSN)
    try:
        await admin.execute(f'ALTER ROLE "{role}" CONNECTION LIMIT 0')
        await admin.execute(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}'")  # noqa: S608
        await asyncio.sleep(1.0)  # the key poll (every 0.5 s) met the ended sessions: none is pooled now
        for _ in range(2):
            refused = await gw.client.post(COMPLETIONS, json=body("chat"), headers=bearer(secret), timeout=10)
            error = refused.json()["error"]
            assert (refused.status_code, error["type"], error["message"]) == (
                503,
                "unavailable",
                "the database cannot be reached; try again shortly",
            )
        await admin.execute(f'ALTER ROLE "{role}" CONNECTION LIMIT -1')
    finally:
        await admin.close()
    assert (await gw.client.post(COMPLETIONS, json=body("chat"), headers=bearer(secret))).status_code == 200
