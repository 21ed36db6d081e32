"""A `total` budget refused only because other requests' reservations are still held is lifted
when they settle: that refusal must not say `x-should-retry: false`."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from tests.access.conftest import ADMIN, bearer, keyed_gateway
from tests.support.gateway import GatewayHandle, StartGateway
from tests.support.replies import answer
from tests.support.upstream import ReplayUpstream, upstream_fixture

up = upstream_fixture("up")
REQUEST: Any = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
async def gw(start_gateway: StartGateway, up: ReplayUpstream, monkeypatch: pytest.MonkeyPatch) -> GatewayHandle:
    return await keyed_gateway(start_gateway, up, monkeypatch)


async def refused_while_held(gw: GatewayHandle, up: ReplayUpstream, period: str) -> httpx.Response:
    """The 429 of a request on a key whose `period` budget ($0.003) one slow request in flight
    holds with its worst case; the same request passes once that one settled."""
    made = await gw.client.post(
        "/api/v1/keys", json={"name": "k", "budget_usd": "0.003", "budget_period": period}, headers=bearer(ADMIN)
    )
    key = bearer(made.json()["secret"])
    up.enqueue(answer("slow", first_byte_delay_s=1.5))
    up.set_default(answer("ok"))
    first = asyncio.create_task(gw.client.post("/v1/chat/completions", json=REQUEST, headers=key))
    for _ in range(100):
        if up.requests:
            break
        await asyncio.sleep(0.02)
    refused = await gw.client.post("/v1/chat/completions", json=REQUEST, headers=key)
    assert refused.status_code == 429, refused.text
    assert (await first).status_code == 200
    retried = await gw.client.post("/v1/chat/completions", json=REQUEST, headers=key)
    assert retried.status_code == 200, retried.text  # a wait lifted it
    return refused


async def test_a_total_budget_held_by_a_request_in_flight_is_not_final(gw: GatewayHandle, up: ReplayUpstream) -> None:
    refused = await refused_while_held(gw, up, "total")
    assert "x-should-retry" not in refused.headers, refused.json()


async def test_a_month_budget_held_by_a_request_in_flight_still_says_not_to_retry(
    gw: GatewayHandle, up: ReplayUpstream
) -> None:
    """A `day` or `month` budget refused only for what a request in flight reserves passes once it
    settles, but its `Retry-After` is the period's end (access.md), which the JS SDKs would sleep
    out: it says `x-should-retry: false` (a decision for the lead: a short Retry-After instead
    would contradict access.md)."""
    refused = await refused_while_held(gw, up, "month")
    assert refused.headers["x-should-retry"] == "false"
    assert int(refused.headers["retry-after"]) > 60  # the month's end
