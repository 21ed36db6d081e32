"""The gateway under test: a real Switchyard server on loopback, configured per test.

`start_gateway(providers=..., catalog=..., server=..., routing=..., redis=...)` writes the catalog
file and a SQLite database into the test's tmp dir, builds `Settings` through the same path
`config.toml` takes, runs the app under uvicorn on a free port inside the test's event loop, and
returns a handle with an HTTP client (`redis` adds a `[redis]` table; calling it twice in one test
gives two gateways on one database, like two workers; `ledger` a `[ledger]` table: the journal is
`switchyard-journal` in the tmp dir unless it says otherwise). `handle.ledger_rows()` waits for the
gives two gateways on one database, like two workers; `auth` adds an `[auth]` table).
`handle.ledger_rows()` waits for the
ledger writer to flush and returns the rows from SQL.

`provider_table(upstreams, common, **overrides)` is the `[providers]` table for a set of
`ReplayUpstream`s: one `openai_compatible` provider per upstream unless the test says otherwise.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from sqlalchemy import text

from app.application import create_app
from app.edge.connection import protocol_factory
from app.service import Service
from app.settings import settings_from_mapping
from tests.support.upstream import ReplayUpstream
from tests.support.waiting import wait_until


class GatewayHandle:
    def __init__(self, server: uvicorn.Server, task: asyncio.Task[None], service: Service, url: str) -> None:
        self.server = server
        self.task = task
        self.service = service
        self.url = url
        self.client = httpx.AsyncClient(base_url=url, timeout=30.0)

    async def ledger_rows(self) -> list[dict[str, Any]]:
        assert self.service.ledger is not None
        assert self.service.engine is not None
        await self.service.ledger.flush()
        async with self.service.engine.connect() as conn:
            result = await conn.execute(text("SELECT * FROM ledger ORDER BY started_at, request_id"))
            return [dict(row._mapping) for row in result]

    async def close(self) -> None:
        await self.client.aclose()
        self.server.should_exit = True
        await asyncio.wait_for(self.task, 10)


StartGateway = Callable[..., Awaitable[GatewayHandle]]


def provider_table(
    upstreams: Mapping[str, ReplayUpstream], common: dict[str, Any] | None = None, **overrides: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    """A provider per upstream (name → server); `common` applies to every provider, `overrides[name]` to one."""
    return {
        name: {"kind": "openai_compatible", "base_url": upstream.url, **(common or {}), **overrides.get(name, {})}
        for name, upstream in upstreams.items()
    }


async def _serve(settings_raw: dict[str, object], base_dir: Path) -> GatewayHandle:
    settings = settings_from_mapping(settings_raw, base_dir=base_dir, source="test")
    app = create_app(settings)
    config = uvicorn.Config(
        app, host="127.0.0.1", port=0, log_level="warning", lifespan="on", http=protocol_factory(settings.server)
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    await wait_until(lambda: server.started or task.done(), within=5.0, what="uvicorn started")
    if task.done():
        task.result()
    assert server.started, "gateway did not start"
    port = server.servers[0].sockets[0].getsockname()[1]
    return GatewayHandle(server, task, app.state.service, f"http://127.0.0.1:{port}")


@pytest.fixture
async def start_gateway(tmp_path: Path) -> AsyncIterator[StartGateway]:
    handles: list[GatewayHandle] = []

    async def start(
        *,
        providers: dict[str, dict[str, Any]],
        catalog: str,
        server: dict[str, Any] | None = None,
        database_url: str | None = None,
        routing: dict[str, Any] | None = None,
        redis: dict[str, Any] | None = None,
        ledger: dict[str, Any] | None = None,
        auth: dict[str, Any] | None = None,
    ) -> GatewayHandle:
        catalog_dir = tmp_path / "catalog"
        catalog_dir.mkdir(exist_ok=True)
        (catalog_dir / "test.toml").write_text(catalog)
        raw: dict[str, object] = {
            "server": server or {},
            "database": {"url": database_url or f"sqlite+aiosqlite:///{tmp_path / 'switchyard.db'}"},
            "catalog": {"files": ["catalog/*.toml"]},
            "providers": providers,
            "routing": routing or {},
        }
        if redis is not None:
            raw["redis"] = redis
        if ledger is not None:
            raw["ledger"] = ledger
        if auth is not None:
            raw["auth"] = auth
        handle = await _serve(raw, tmp_path)
        handles.append(handle)
        return handle

    yield start
    for handle in handles:
        await handle.close()
