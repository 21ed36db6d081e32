"""PostgreSQL cut mid-load through a proxy the test controls, with the gateway in the test's own
event loop: every answered request gets exactly one row, and the outage shows in `/readyz`,
`/metrics` and the log while it lasts."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from catalog.migrate import upgrade_async
from tests.ledger_journal.conftest import with_port
from tests.support.cli import CATALOG, Process
from tests.support.client import body, post
from tests.support.gateway import GatewayHandle, StartGateway
from tests.support.logs import Logs
from tests.support.tcp_proxy import TcpProxy
from tests.support.waiting import wait_until

TOTAL = 600


async def pending(gw: GatewayHandle) -> float:
    text = (await gw.client.get("/metrics")).text
    (line,) = [line for line in text.splitlines() if line.startswith("switchyard_ledger_rows_pending ")]
    return float(line.split()[1])


def ledger_is(gw: GatewayHandle, expected: str) -> Callable[[], Awaitable[bool]]:
    """A check for `wait_until`: `/readyz` says the ledger is `expected`."""

    async def check() -> bool:
        return bool((await gw.client.get("/readyz")).json()["ledger"] == expected)

    return check


async def test_postgres_cut_mid_load_loses_and_duplicates_no_row(
    start_gateway: StartGateway, mock_upstream: tuple[int, list[Process]], pg_url: str, logs: Logs
) -> None:
    port, _ = mock_upstream
    await upgrade_async(pg_url)
    with TcpProxy(5432) as proxy:
        gw = await start_gateway(
            providers={"local": {"kind": "local", "base_url": f"http://127.0.0.1:{port}/v1"}},
            catalog=CATALOG,
            database_url=with_port(pg_url, proxy.port),
            ledger={"flush_interval_s": 0.05, "batch_size": 32},
        )
        answered: list[str] = []
        sent = iter(range(TOTAL))
        cut, restore = asyncio.Event(), asyncio.Event()

        async def client() -> None:
            for n in sent:
                response = await post(gw, body("tiny", stream=n % 2 == 0))
                assert response.status_code == 200, response.text
                answered.append(response.headers["x-request-id"])
                if len(answered) == 150:
                    proxy.cut()
                    cut.set()
                elif len(answered) == 450:
                    restore.set()

        async def outage() -> None:
            await cut.wait()
            await wait_until(ledger_is(gw, "behind"), within=10.0, what="/readyz: ledger behind")
            assert await pending(gw) > 0
            await restore.wait()
            proxy.restore()

        await asyncio.gather(*(client() for _ in range(8)), outage())
        rows = await asyncio.wait_for(gw.ledger_rows(), 30.0)
        assert len(answered) == TOTAL
        assert sorted(row["request_id"] for row in rows) == sorted(answered)
        await wait_until(ledger_is(gw, "ok"), within=10.0, what="/readyz: ledger ok")
        assert await pending(gw) == 0
    assert len(logs.lines("ledger_outage_started", gw)) == 1
    assert len(logs.lines("ledger_outage_ended", gw)) == 1
