"""A budget over a provider priced by GPU time (`gpu_hour_usd`, `cost_source: amortized`).

Such a request costs its share of the server's busy time, not its tokens at the catalog's rates,
so its reservation is the larger of the token bound and the time bound (`gpu_hour_usd` for the
provider's `timeouts.total`). With the token bound alone `chat` (a dollar per million tokens)
reserved a fraction of a cent and settled at dollars: concurrent requests spent the budget many
times over. Both limiters: the in-process one and Redis's.
"""

from __future__ import annotations

import asyncio
from decimal import Decimal

import pytest

from tests.access.conftest import ADMIN, bearer, keyed_gateway
from tests.support.client import COMPLETIONS, body
from tests.support.gateway import StartGateway
from tests.support.replies import answer
from tests.support.upstream import ReplayUpstream
from tests.support.waiting import wait_until

GPU = {"kind": "local", "gpu_hour_usd": "3600", "timeouts": {"total": 2}}  # $1 a busy second: $2 at most


@pytest.mark.parametrize("limiter", ["local", "redis"])
async def test_a_request_on_gpu_time_reserves_what_its_time_can_cost(
    start_gateway: StartGateway,
    up: ReplayUpstream,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
    limiter: str,
) -> None:
    redis = (
        {"redis": {"url": request.getfixturevalue("private_redis").url, "key_prefix": "g"}}
        if limiter == "redis"
        else {}
    )
    gw = await keyed_gateway(start_gateway, up, monkeypatch, provider=GPU, **redis)
    created = await gw.client.post(
        "/api/v1/keys", json={"name": "gpu", "budget_usd": "3", "budget_period": "total"}, headers=bearer(ADMIN)
    )
    key = created.json()
    up.enqueue(answer("slow", first_byte_delay_s=0.5))
    first = asyncio.create_task(
        gw.client.post(COMPLETIONS, json=body("chat", max_tokens=10), headers=bearer(key["secret"]))
    )
    await wait_until(lambda: len(up.requests) == 1, within=5.0, what="the first request upstream")
    refused = await gw.client.post(COMPLETIONS, json=body("chat", max_tokens=10), headers=bearer(key["secret"]))
    assert refused.status_code == 429, refused.text  # $2 reserved; $2 more would pass $3
    assert refused.json()["error"]["type"] == "insufficient_quota"
    answered = await first
    assert answered.status_code == 200, answered.text
    assert answered.json()["cost_source"] == "amortized"
    (row, _refusal) = sorted(await gw.ledger_rows(), key=lambda row: row["status"] != "ok")
    cost = Decimal(row["cost_usd"])
    assert Decimal("0.5") <= cost < Decimal("2")  # its half second or so of GPU time, settled

    async def settled() -> bool:  # Redis's settlements go in batches, within about 20 ms
        me = (await gw.client.get("/api/v1/keys/me", headers=bearer(key["secret"]))).json()
        return abs(Decimal(me["spent_usd"]) - cost) < Decimal("0.000000001")  # the real cost, not the $2

    await wait_until(settled, within=2.0, what="the first request's settlement")
    up.enqueue(answer("again"))
    again = await gw.client.post(COMPLETIONS, json=body("chat", max_tokens=10), headers=bearer(key["secret"]))
    assert again.status_code == 200, again.text  # the reservation gave back, the budget admits again
