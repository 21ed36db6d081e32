"""Requests Redis admitted that are still in flight when Redis goes away: with `[auth] fail_open`
their reservations must still count in this process's own share, or concurrent requests together
spend more than the budget (access.md, "Budgets never overshoot"); and an outage's lost
settlements are logged once, not at every resend.

Each request costs exactly its worst case's output part: the upstream reports 0 prompt and 1000
completion tokens ($0.002 at $2/M) for `max_tokens` 1000, and the worst case adds the input bound
at $1/M (well under $0.0001). A $0.011 budget admits 5 of them at a time (6 worst cases exceed it).
"""

from __future__ import annotations

import asyncio
from decimal import Decimal

import httpx
import pytest

from tests.access.conftest import ADMIN, PrivateRedis, bearer, keyed_gateway
from tests.support.client import COMPLETIONS, body
from tests.support.gateway import GatewayHandle, StartGateway
from tests.support.logs import Logs
from tests.support.tcp_proxy import TcpProxy
from tests.support.upstream import ReplayUpstream, played, reply_json
from tests.support.waiting import wait_until

USAGE = {"prompt_tokens": 0, "completion_tokens": 1000, "total_tokens": 1000}  # $0.002
COSTLY = {"choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}], "usage": USAGE}
BUDGET = Decimal("0.011")
HELD_S = 2.0  # how long the upstream holds each answer: the first batch is in flight across the outage


async def _budget_key(gw: GatewayHandle) -> dict[str, str]:
    made = await gw.client.post(
        "/api/v1/keys", json={"name": "b", "budget_usd": str(BUDGET), "budget_period": "day"}, headers=bearer(ADMIN)
    )
    assert made.status_code == 201, made.text
    return bearer(made.json()["secret"])


async def _batch(gw: GatewayHandle, key: dict[str, str], count: int = 6) -> list[int]:
    async with httpx.AsyncClient(base_url=gw.url, timeout=30.0) as client:
        calls = [client.post(COMPLETIONS, json=body("chat", max_tokens=1000), headers=key) for _ in range(count)]
        return sorted(r.status_code for r in await asyncio.gather(*calls))


async def _ledger_spend(gw: GatewayHandle) -> Decimal:
    rows = await gw.ledger_rows()
    return sum((Decimal(row["cost_usd"]) for row in rows if row["cost_usd"] is not None), Decimal(0))


async def test_fail_open_counts_what_redis_admitted_that_is_still_in_flight(
    start_gateway: StartGateway, up: ReplayUpstream, monkeypatch: pytest.MonkeyPatch, private_redis: PrivateRedis
) -> None:
    up.set_default(played(reply_json(200, COSTLY), first_byte_delay_s=HELD_S))
    with TcpProxy(private_redis.port) as proxy:
        redis = {"url": f"redis://127.0.0.1:{proxy.port}/0", "key_prefix": "t"}
        gw = await keyed_gateway(start_gateway, up, monkeypatch, redis=redis, auth={"fail_open": True})
        key = await _budget_key(gw)
        first = asyncio.ensure_future(_batch(gw, key))
        await wait_until(lambda: len(up.requests) == 5, what="5 requests admitted and at the upstream")

        proxy.cut()  # this process alone now: its share (all of it) of the budget, from the ledger's spend
        second = await _batch(gw, key)

        assert await first == [200] * 5 + [429]
        spent = await _ledger_spend(gw)
        assert spent <= BUDGET, f"{second}: the ledger spent ${spent} of ${BUDGET}"


async def test_a_lost_settlement_is_logged_once_per_outage_not_at_every_resend(
    logs: Logs,
    start_gateway: StartGateway,
    up: ReplayUpstream,
    monkeypatch: pytest.MonkeyPatch,
    private_redis: PrivateRedis,
) -> None:
    """One budgeted request ends while Redis is unreachable: its spend goes again until Redis takes
    it (README: "every second ... without a log line each"). Meanwhile another key's requests get
    their 503s (each gives back the slot its lost admission may hold, which sends every waiting
    settlement along): 3 s of outage must not write a `limits_settle_failed` line per resend."""
    up.set_default(played(reply_json(200, COSTLY), first_byte_delay_s=0.5))
    with TcpProxy(private_redis.port) as proxy:
        redis = {"url": f"redis://127.0.0.1:{proxy.port}/0", "key_prefix": "t"}
        gw = await keyed_gateway(start_gateway, up, monkeypatch, redis=redis)
        key = await _budget_key(gw)
        made = await gw.client.post("/api/v1/keys", json={"name": "c", "max_concurrency": 4}, headers=bearer(ADMIN))
        capped = bearer(made.json()["secret"])
        in_flight = asyncio.ensure_future(gw.client.post(COMPLETIONS, json=body("chat", max_tokens=1000), headers=key))
        await wait_until(lambda: len(up.requests) == 1, what="the budgeted request at the upstream")
        proxy.cut()
        assert (await in_flight).status_code == 200  # its settlement is lost: Redis is gone
        loop = asyncio.get_running_loop()
        until = loop.time() + 3.0
        refused = 0
        while loop.time() < until:
            response = await gw.client.post(COMPLETIONS, json=body("chat"), headers=capped)
            assert response.status_code == 503
            refused += 1
            await asyncio.sleep(0.02)
        lines = logs.lines("limits_settle_failed", gw)
        assert len(lines) <= 4, f"{len(lines)} limits_settle_failed lines in 3 s of outage ({refused} 503s meanwhile)"
