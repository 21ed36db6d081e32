"""Redis unreachable: keys with limits fail closed (503 `unavailable`, `limits cannot be checked`)
unless `[auth] fail_open`, when the process enforces its share and says so in its log and
`/metrics`; keys without limits never need Redis. Uses a private `redis-server` on a free port
(`private_redis`), stopped in the middle of the test; tests/access/test_two_processes.py stops one
under two `serve` processes on PostgreSQL."""

from __future__ import annotations

import pytest

from tests.access.conftest import ADMIN, PrivateRedis, bearer, keyed_gateway
from tests.support.client import COMPLETIONS, body
from tests.support.gateway import GatewayHandle, StartGateway
from tests.support.logs import Logs
from tests.support.replies import answer
from tests.support.upstream import ReplayUpstream


async def _two_keys(gw: GatewayHandle) -> tuple[str, str]:
    client = gw.client
    limited = await client.post("/api/v1/keys", json={"name": "l", "rpm": 100}, headers=bearer(ADMIN))
    plain = await client.post("/api/v1/keys", json={"name": "p"}, headers=bearer(ADMIN))
    return limited.json()["secret"], plain.json()["secret"]


async def test_limited_keys_fail_closed(
    start_gateway: StartGateway, up: ReplayUpstream, monkeypatch: pytest.MonkeyPatch, private_redis: PrivateRedis
) -> None:
    up.set_default(answer("ok"))
    gw = await keyed_gateway(start_gateway, up, monkeypatch, redis={"url": private_redis.url, "key_prefix": "t"})
    limited, plain = await _two_keys(gw)
    assert (await gw.client.post(COMPLETIONS, json=body("chat"), headers=bearer(limited))).status_code == 200

    private_redis.stop()

    refused = await gw.client.post(COMPLETIONS, json=body("chat"), headers=bearer(limited))
    assert refused.status_code == 503
    assert (refused.json()["error"]["type"], refused.json()["error"]["message"]) == (
        "unavailable",
        "limits cannot be checked",
    )
    assert (await gw.client.post(COMPLETIONS, json=body("chat"), headers=bearer(plain))).status_code == 200


async def test_fail_open_enforces_the_local_share_and_says_so(
    logs: Logs,
    start_gateway: StartGateway,
    up: ReplayUpstream,
    monkeypatch: pytest.MonkeyPatch,
    private_redis: PrivateRedis,
) -> None:
    up.set_default(answer("ok"))
    redis = {"url": private_redis.url, "key_prefix": "t"}
    gw = await keyed_gateway(start_gateway, up, monkeypatch, redis=redis, auth={"fail_open": True})
    client = gw.client
    limited = (await client.post("/api/v1/keys", json={"name": "l", "rpm": 2}, headers=bearer(ADMIN))).json()
    private_redis.stop()

    statuses = [
        (await client.post(COMPLETIONS, json=body("chat"), headers=bearer(limited["secret"]))).status_code
        for _ in range(3)
    ]

    assert statuses == [200, 200, 429]  # this one process is all there is: its share is the whole rpm
    assert "switchyard_limits_local_total 3.0" in (await client.get("/metrics")).text
    (line,) = logs.lines("limits_local", gw)
    assert line["level"] == "error"
