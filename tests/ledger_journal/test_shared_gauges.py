"""The ledger's gauges over several workers: two gateways in the test's event loop share one Redis
(as two workers do) and one PostgreSQL through a proxy the test cuts. Each journals its own rows;
`/metrics` on either shows both: the rows pending summed, the oldest of either. They were the
answering worker's own, so a scrape showed whichever worker answered."""

from __future__ import annotations

import asyncio

from catalog.migrate import upgrade_async
from tests.ledger_journal.conftest import with_port
from tests.ledger_journal.test_cut_mid_load import ledger_is
from tests.support.cli import CATALOG, Process
from tests.support.client import body, post
from tests.support.gateway import GatewayHandle, StartGateway
from tests.support.observe import metric, scrape
from tests.support.redis_keys import REDIS_URL
from tests.support.tcp_proxy import TcpProxy
from tests.support.waiting import wait_until


async def gauges(gw: GatewayHandle) -> tuple[float, float, float]:
    samples = await scrape(gw)
    names = ("rows_pending", "oldest_pending_seconds", "journal_writable")
    pending, oldest, writable = (metric(samples, f"switchyard_ledger_{name}") for name in names)
    return pending, oldest, writable


async def test_both_workers_show_every_workers_pending_rows(
    start_gateway: StartGateway, mock_upstream: tuple[int, list[Process]], pg_url: str, redis_prefix: str
) -> None:
    port, _ = mock_upstream
    await upgrade_async(pg_url)
    with TcpProxy(5432) as proxy:
        workers = [
            await start_gateway(
                providers={"local": {"kind": "local", "base_url": f"http://127.0.0.1:{port}/v1"}},
                catalog=CATALOG,
                database_url=with_port(pg_url, proxy.port),
                redis={"url": REDIS_URL, "key_prefix": redis_prefix},
            )
            for _ in range(2)
        ]
        first, second = workers
        proxy.cut()
        began = asyncio.get_running_loop().time()
        for gw, count in ((first, 3), (second, 2)):
            for _ in range(count):
                assert (await post(gw, body("tiny"))).status_code == 200
        for gw in workers:
            await wait_until(ledger_is(gw, "behind"), within=10.0)

        async def combined() -> bool:
            results = [await gauges(gw) for gw in workers]
            return all(pending == 5 for pending, _, _ in results)

        await wait_until(combined, within=5.0)  # each worker shares its gauges every second
        views = [await gauges(gw) for gw in workers]
        waited = asyncio.get_running_loop().time() - began
        for _pending, oldest, writable in views:
            assert writable == 1  # both journals, combined as the lesser
            assert waited - 1.5 <= oldest <= waited + 0.1  # the oldest row of either (a sum would be twice)
        proxy.restore()
        for gw in workers:
            await wait_until(ledger_is(gw, "ok"), within=10.0)
        await wait_until(lambda: _all_zero(workers), within=5.0)


async def _all_zero(workers: list[GatewayHandle]) -> bool:
    return [(await gauges(gw))[0] for gw in workers] == [0, 0]
