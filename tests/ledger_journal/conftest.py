"""The journal's process-level tests: a real `switchyard serve` (or an in-process gateway) killed,
stopped and cut off from its database, then asked whether every answered request has its row.

- `pg_url`: a new PostgreSQL database of this test's own (dropped at the end of the session);
- `ServeGateway`: a config (a `local` provider at the mock upstream, the database URL the test
  gives, often through a `TcpProxy`) and `switchyard serve` subprocesses started on it in turn;
- `Load`: clients posting completions (JSON and streamed) back to back from threads, keeping the
  request id (`x-request-id`) of every 200 answer they read to its last byte;
- `ledger_ids(url)`: the request ids in the ledger, read directly (never through the proxy).
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from tests.catalog.conftest import PgDatabases
from tests.support.cli import CATALOG, Process, cli_env, processes, start_mock
from tests.support.client import COMPLETIONS, body
from tests.support.ports import free_port


@pytest.fixture(scope="session")
async def journal_pg_databases() -> AsyncIterator[PgDatabases]:
    databases = PgDatabases()
    yield databases
    await databases.drop_all()


@pytest.fixture
async def pg_url(journal_pg_databases: PgDatabases) -> str:
    return await journal_pg_databases.create()


def ledger_ids(url: str) -> list[str]:
    """Every request id in the ledger (a request id twice would be listed twice)."""
    return [row[0] for row in ledger_query(url, "SELECT request_id FROM ledger")]


def ledger_query(url: str, sql: str) -> list[tuple[Any, ...]]:
    """`sql`'s rows, from the database `url` names (SQLite file or PostgreSQL), read directly."""
    if url.startswith("sqlite"):
        with sqlite3.connect(url.split(":///", 1)[1]) as connection:
            return connection.execute(sql).fetchall()

    async def fetch() -> list[tuple[Any, ...]]:
        connection = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))
        try:
            return [tuple(row) for row in await connection.fetch(sql)]
        finally:
            await connection.close()

    return asyncio.run(fetch())


def with_port(url: str, port: int) -> str:
    """`url` (PostgreSQL on 127.0.0.1:5432) at another port: the proxy's."""
    return url.replace("127.0.0.1:5432", f"127.0.0.1:{port}")


class ServeGateway:
    """`switchyard serve` on one config, started as often as the test asks (one at a time)."""

    def __init__(
        self, directory: Path, started: list[Process], upstream_port: int, database_url: str, extra: str = ""
    ) -> None:
        self.directory = directory
        self.started = started
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        (directory / "models.toml").write_text(CATALOG)
        self.config = directory / "config.toml"
        self.config.write_text(
            f"""
[database]
url = "{database_url}"
auto_migrate = true

[catalog]
files = ["models.toml"]

[ledger]
fsync_interval_s = 0.2
flush_interval_s = 0.25  # the outage tests cut the database for less than a second: the writer must try meanwhile

[providers.local]
kind = "local"
base_url = "http://127.0.0.1:{upstream_port}/v1"
{extra}"""
        )
        self.journal = directory / "switchyard-journal"

    def start(self, *more: str) -> Process:
        args = ["serve", "--config", str(self.config), "--port", str(self.port), *more]
        process = Process(self.directory, f"serve{len(self.started)}", args, cli_env())
        self.started.append(process)
        process.wait_http(f"{self.base}/healthz", timeout=30.0)
        return process

    def complete(self, *, stream: bool = False, key: str | None = None) -> str:
        """One completion read to its end (with API key `key`); must be 200. Its request id."""
        headers = {} if key is None else {"authorization": f"Bearer {key}"}
        response = httpx.post(
            f"{self.base}{COMPLETIONS}", json=body("tiny", stream=stream), headers=headers, timeout=20
        )
        assert response.status_code == 200, response.text
        return response.headers["x-request-id"]

    def segments(self) -> list[Path]:
        return sorted(self.journal.glob("ledger-*.jsonl"))


class Load:
    """Clients posting completions back to back until `stop()`; `completed` holds the request ids
    of the 200 answers read to their last byte (JSON and streamed, alternately)."""

    def __init__(self, base: str, clients: int = 6) -> None:
        self.base = base
        self.completed: list[str] = []
        self.failures = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, args=(n,), daemon=True) for n in range(clients)]

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)

    def _client(self, n: int) -> None:
        with httpx.Client(base_url=self.base, timeout=10) as client:
            count = n
            while not self._stop.is_set():
                count += 1
                try:
                    response = client.post(COMPLETIONS, json=body("tiny", stream=count % 2 == 0))
                except httpx.HTTPError:  # the server was killed mid-answer: not a completed response
                    self.failures += 1
                    self._stop.wait(0.05)  # a killed server refuses at once: do not spin on it
                    continue
                if response.status_code == 200:
                    self.completed.append(response.headers["x-request-id"])


@pytest.fixture
def mock_upstream(tmp_path: Path) -> Iterator[tuple[int, list[Process]]]:
    """A `switchyard mock-upstream` subprocess, and the list every process of the test joins
    (all SIGKILLed on the way out)."""
    with processes() as started:
        yield start_mock(tmp_path, started), started
