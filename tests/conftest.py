"""The gateway harness: a real Switchyard server on loopback, configured per test.

`start_gateway(providers=..., catalog=..., server=..., routing=..., redis=...)` writes the catalog
file and a SQLite database into the test's tmp dir, builds `Settings` through the same path
`config.toml` takes, runs the app under uvicorn on a free port inside the test's event loop, and
returns a handle with an HTTP client (`redis` adds a `[redis]` table; calling it twice in one test
gives two gateways on one database, like two workers). `handle.ledger_rows()` waits for the ledger writer to flush and
returns the rows from SQL.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
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
        settings = settings_from_mapping(raw, base_dir=tmp_path, source="test")
        app = create_app(settings)
        config = uvicorn.Config(
            app, host="127.0.0.1", port=0, log_level="warning", lifespan="on", http=protocol_factory(settings.server)
        )
        uv_server = uvicorn.Server(config)
        task = asyncio.create_task(uv_server.serve())
        for _ in range(500):
            if uv_server.started or task.done():
                break
            await asyncio.sleep(0.01)
        if task.done():
            task.result()
        assert uv_server.started, "gateway did not start"
        port = uv_server.servers[0].sockets[0].getsockname()[1]
        handle = GatewayHandle(uv_server, task, app.state.service, f"http://127.0.0.1:{port}")
        handles.append(handle)
        return handle

    yield start
    for handle in handles:
        await handle.close()
