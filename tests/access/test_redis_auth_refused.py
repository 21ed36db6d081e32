"""A `[redis] url` whose AUTH the server refuses (a wrong password; a password for a Redis whose
default user has none): keys with limits fail closed, as for a Redis that is down (access.md), and
the log says why, once, without the password. The limiter's own client (`app.access.resp`) was
the only one to fail when the password was for a passwordless Redis (redis-py, the cluster link's
client, ignores that refusal): every limited request was a 503 and no line said why."""

from __future__ import annotations

import pytest

from tests.access.conftest import ADMIN, PrivateRedis, bearer, keyed_gateway
from tests.support.client import COMPLETIONS, body
from tests.support.gateway import StartGateway
from tests.support.logs import Logs
from tests.support.replies import answer
from tests.support.upstream import ReplayUpstream

PASSWORD = "netaud-Secret-9f3"


async def test_a_refused_redis_password_fails_closed_and_says_why_once(
    start_gateway: StartGateway,
    up: ReplayUpstream,
    monkeypatch: pytest.MonkeyPatch,
    private_redis: PrivateRedis,
    logs: Logs,
) -> None:
    up.set_default(answer("ok"))
    url = f"redis://:{PASSWORD}@127.0.0.1:{private_redis.port}/0"  # its default user has no password
    gw = await keyed_gateway(start_gateway, up, monkeypatch, redis={"url": url, "key_prefix": "t"})
    limited = (await gw.client.post("/api/v1/keys", json={"name": "l", "rpm": 100}, headers=bearer(ADMIN))).json()

    statuses = [
        (await gw.client.post(COMPLETIONS, json=body("chat"), headers=bearer(limited["secret"]))).status_code
        for _ in range(3)
    ]

    assert statuses == [503, 503, 503]
    assert logs.lines("limits_unavailable", gw) == [
        {
            "event": "limits_unavailable",
            "level": "error",
            "reason": "RespError: ERR AUTH <password> called without any password configured for the default user. "
            "Are you sure your configuration is correct?",
            "detail": "keys with limits get 503",
        }
    ]
    assert PASSWORD not in logs.raw
    await gw.close()
