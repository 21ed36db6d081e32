"""A ledger row's times against the clocks: `started_at` from the wall clock at the start, the rest
measured on the monotonic clock (a clock audit: an NTP step mid-request)."""

from __future__ import annotations

from datetime import datetime, timedelta

from tests.gateway.conftest import CATALOG, providers_for
from tests.support.client import complete
from tests.support.gateway import StartGateway
from tests.support.replies import answer
from tests.support.upstream import ReplayUpstream


async def test_a_rows_finish_is_its_start_plus_its_measured_latency(
    start_gateway: StartGateway, primary: ReplayUpstream, secondary: ReplayUpstream
) -> None:
    """`finished_at` was read from the wall clock as the request ended: a clock stepped back an hour
    while requests ran left rows that finished an hour before they started (latency, from the
    monotonic clock, stayed right). It is the start plus the elapsed time now, to the microsecond."""
    gw = await start_gateway(providers=providers_for(primary, secondary), catalog=CATALOG)
    primary.set_default(answer("ok"))
    for _ in range(10):
        assert (await complete(gw)).status_code == 200
    for row in await gw.ledger_rows():
        started, finished = (
            datetime.fromisoformat(row[name]) for name in ("started_at", "finished_at")
        )  # SQLite: text
        elapsed_us = (finished - started) / timedelta(microseconds=1)
        assert abs(elapsed_us - row["latency_ms"] * 1000) <= 1, row
