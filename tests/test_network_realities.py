"""The gateway on the networks operators deploy it on: here, PostgreSQL behind a pooler in
transaction mode (PgBouncer's `pool_mode = transaction`, the "transaction" poolers of managed
databases), stood in for by `tests.support.pg_pooler`.

Such a pooler hands one server session to many clients in turn, and asyncpg names its prepared
statements `__asyncpg_stmt_1__`, `_2__`, ... per client connection: the second client's first
statement met the first one's, `prepared statement "__asyncpg_stmt_1__" already exists`. Every
command and `serve` itself failed (exit 1), and no URL argument could say otherwise. asyncpg's own
`statement_cache_size=0` in the URL now turns both statement caches off: each statement is
prepared unnamed, inside its own transaction (`catalog.database`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from catalog.migrate import upgrade_async
from tests.catalog.conftest import PgDatabases
from tests.routing.conftest import CATALOG
from tests.support.cli import run_cli, write_config
from tests.support.client import complete
from tests.support.gateway import StartGateway, provider_table
from tests.support.pg_pooler import TransactionPooler
from tests.support.upstream import ReplayUpstream, reply_json, upstream_fixture

alpha = upstream_fixture("alpha")
SQLITE_URL = 'url = "sqlite+aiosqlite:///switchyard.db"'
REQUESTS = 40


@pytest.fixture
async def database() -> AsyncIterator[str]:
    """A new, migrated PostgreSQL database's name (migrated directly: an operator runs migrations
    on the direct connection)."""
    databases = PgDatabases()
    url = await databases.create()
    await upgrade_async(url)
    yield url.rsplit("/", 1)[1]
    await databases.drop_all()


def pooled_url(pooler: TransactionPooler, database: str) -> str:
    return f"postgresql+asyncpg://postgres@127.0.0.1:{pooler.port}/{database}?statement_cache_size=0"


async def ledger_ids(database: str) -> list[str]:
    connection = await asyncpg.connect(f"postgresql://postgres@127.0.0.1:5432/{database}")
    try:
        return [row[0] for row in await connection.fetch("SELECT request_id FROM ledger")]
    finally:
        await connection.close()


def test_every_command_works_through_a_transaction_pooler(tmp_path: Path, database: str) -> None:
    with TransactionPooler(database) as pooler:
        config = write_config(tmp_path)
        config.write_text(config.read_text().replace(SQLITE_URL, f'url = "{pooled_url(pooler, database)}"'))
        commands = [
            ("catalog", "sync"),
            ("catalog", "sync"),
            ("keys", "create", "--name", "pooled", "--format", "json"),
            ("keys", "list", "--format", "json"),
            ("usage", "--format", "json"),
        ]
        results = [run_cli(tmp_path, *command, "--config", str(config)) for command in commands]
        assert [(result.returncode, result.stderr) for result in results[:2]] == [(0, "")] * 2
        assert [result.returncode for result in results] == [0] * 5, [result.stderr for result in results]
        created = json.loads(results[2].stdout)
        assert [key["id"] for key in json.loads(results[3].stdout)] == [created["id"]]


async def test_every_answer_has_its_row_once_through_a_transaction_pooler(
    database: str, start_gateway: StartGateway, alpha: ReplayUpstream
) -> None:
    with TransactionPooler(database, size=2) as pooler:
        gw = await start_gateway(
            providers=provider_table({"alpha": alpha}),
            catalog=CATALOG,
            database_url=pooled_url(pooler, database),
            ledger={"flush_interval_s": 0.05, "batch_size": 8},
        )
        for _ in range(REQUESTS):
            alpha.enqueue(reply_json(200, ANSWER))
        responses = await asyncio.gather(*(complete(gw) for _ in range(REQUESTS)))
        assert [response.status_code for response in responses] == [200] * REQUESTS
        rows = await gw.ledger_rows()
        assert [(row["status"], row["input_tokens"], row["output_tokens"]) for row in rows] == [("ok", 3, 1)] * REQUESTS
        await gw.close()
    answered = sorted(response.headers["x-request-id"] for response in responses)
    assert sorted(await ledger_ids(database)) == answered


ANSWER = {
    "id": "chatcmpl-pooled",
    "object": "chat.completion",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}


@pytest.mark.parametrize("value", ["none", "-1", "0.5"])
def test_a_statement_cache_size_that_is_no_count_exits_2_naming_it(tmp_path: Path, value: str) -> None:
    config = write_config(tmp_path)
    url = f"postgresql+asyncpg://postgres@127.0.0.1:5432/x?statement_cache_size={value}"
    config.write_text(config.read_text().replace(SQLITE_URL, f'url = "{url}"'))
    result = run_cli(tmp_path, "db", "upgrade", "--config", str(config))
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        f"switchyard: {config}: database.url: statement_cache_size={value}: a statement cache size is a whole "
        "number (0 behind PgBouncer in transaction mode)\n"
    )
