"""An upstream names its answer (`id`), and the ledger keeps that name in `upstream_request_id`, a
VARCHAR(300). PostgreSQL refused the row of a longer id, or of one with a NUL (SQLite keeps
either): the upstream's choice of name lost the request's row, its tokens and so its cost. The column
keeps the id's first 300 characters, without NUL, on both databases."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from catalog.migrate import upgrade_async
from tests.catalog.conftest import PgDatabases
from tests.routing.conftest import CATALOG
from tests.support.client import complete, stream
from tests.support.gateway import StartGateway, provider_table
from tests.support.replies import chunk, usage_chunk
from tests.support.upstream import ReplayUpstream, reply_json, reply_sse, upstream_fixture

alpha = upstream_fixture("alpha")
LONG = "chatcmpl-" + "x" * 991  # 1,000 characters
NUL = "chatcmpl-\x00abc"


@pytest.fixture(params=["sqlite", "postgresql"])
async def database_url(request: pytest.FixtureRequest) -> AsyncIterator[str | None]:
    if request.param == "sqlite":
        yield None  # the gateway's own file
        return
    databases = PgDatabases()
    url = await databases.create()
    await upgrade_async(url)
    yield url
    await databases.drop_all()


def whole(upstream_id: str) -> dict[str, object]:
    return {
        "id": upstream_id,
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }


async def test_an_upstream_id_the_column_cannot_hold_still_leaves_the_row(
    database_url: str | None, start_gateway: StartGateway, alpha: ReplayUpstream
) -> None:
    gw = await start_gateway(providers=provider_table({"alpha": alpha}), catalog=CATALOG, database_url=database_url)
    alpha.enqueue(reply_json(200, whole(LONG)))
    alpha.enqueue(reply_json(200, whole(NUL)))
    chunks = [chunk({"content": "hi"}, id=LONG), chunk({}, "stop", id=LONG), usage_chunk(3, 1, id=LONG)]
    alpha.enqueue(reply_sse(chunks))
    for _ in range(2):
        assert (await complete(gw)).status_code == 200
    await stream(gw)
    rows = await gw.ledger_rows()
    assert [(row["status"], row["input_tokens"], row["output_tokens"]) for row in rows] == [("ok", 3, 1)] * 3
    assert sorted(row["upstream_request_id"] for row in rows) == sorted([LONG[:300], "chatcmpl-abc", LONG[:300]])
