"""Redis unreachable: keys with limits fail closed (503 `unavailable`, `limits cannot be checked`)
unless `[auth] fail_open`, when the process enforces its share and says so in its log and
`/metrics`; keys without limits never need Redis. Uses a private `redis-server` on a free port
(`private_redis`), stopped in the middle of the test; tests/access/test_two_processes.py stops one
under two `serve` processes on PostgreSQL."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from redis.asyncio import Redis

from catalog.keys import KeyChanges, create_key, revoke_key
from tests.access.conftest import ADMIN, PrivateRedis, bearer, keyed_gateway
from tests.support.client import COMPLETIONS, body
from tests.support.gateway import GatewayHandle, StartGateway
from tests.support.logs import Logs
from tests.support.ports import free_port
from tests.support.replies import answer
from tests.support.tcp_proxy import TcpProxy
from tests.support.upstream import ReplayUpstream, reply_json
from tests.support.waiting import wait_until


async def _two_keys(gw: GatewayHandle) -> tuple[str, str]:
    client = gw.client
    limited = await client.post("/api/v1/keys", json={"name": "l", "rpm": 100}, headers=bearer(ADMIN))
    plain = await client.post("/api/v1/keys", json={"name": "p"}, headers=bearer(ADMIN))
    return limited.json()["secret"], plain.json()["secret"]


USAGE = {"prompt_tokens": 1000, "completion_tokens": 1000, "total_tokens": 2000}  # $0.003 at $1/$2 per M
COSTLY = {"choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}], "usage": USAGE}


async def test_limited_keys_fail_closed(
    start_gateway: StartGateway, up: ReplayUpstream, monkeypatch: pytest.MonkeyPatch, private_redis: PrivateRedis
) -> None:
    up.set_default(answer("ok"))
    gw = await keyed_gateway(start_gateway, up, monkeypatch, redis={"url": private_redis.url, "key_prefix": "t"})
    limited, plain = await _two_keys(gw)
    assert (await gw.client.post(COMPLETIONS, json=body("chat"), headers=bearer(limited))).status_code == 200
    assert (await gw.client.get("/readyz")).json()["limits"] == "ok"

    private_redis.stop()

    ready = await gw.client.get("/readyz")  # still ready (keys without limits are served), and says why not all
    assert (ready.status_code, ready.json()["status"], ready.json()["limits"]) == (200, "ok", "unavailable")

    refused = await gw.client.post(COMPLETIONS, json=body("chat"), headers=bearer(limited))
    assert refused.status_code == 503
    assert (refused.json()["error"]["type"], refused.json()["error"]["message"]) == (
        "unavailable",
        "limits cannot be checked",
    )
    assert (await gw.client.post(COMPLETIONS, json=body("chat"), headers=bearer(plain))).status_code == 200


async def test_readyz_answers_at_once_while_the_limiters_redis_hangs(
    start_gateway: StartGateway, up: ReplayUpstream, monkeypatch: pytest.MonkeyPatch, private_redis: PrivateRedis
) -> None:
    """A probe times out after a second by default (Kubernetes): a Redis that does not answer must
    not make every replica's /readyz that slow, and so unready."""
    up.set_default(answer("ok"))
    with TcpProxy(private_redis.port) as proxy:
        redis = {"url": f"redis://127.0.0.1:{proxy.port}/0", "key_prefix": "t"}
        gw = await keyed_gateway(start_gateway, up, monkeypatch, redis=redis)
        limited, _plain = await _two_keys(gw)
        assert (await gw.client.post(COMPLETIONS, json=body("chat"), headers=bearer(limited))).status_code == 200
        proxy.stall()
        started = asyncio.get_running_loop().time()
        ready = await gw.client.get("/readyz")
        assert asyncio.get_running_loop().time() - started < 0.9
        assert (ready.status_code, ready.json()["limits"]) == (200, "unavailable")


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
    assert "switchyard_limits_local_total 0.0" in (await client.get("/metrics")).text  # a rate needs a first sample
    private_redis.stop()

    statuses = [
        (await client.post(COMPLETIONS, json=body("chat"), headers=bearer(limited["secret"]))).status_code
        for _ in range(3)
    ]

    assert statuses == [200, 200, 429]  # this one process is all there is: its share is the whole rpm
    assert "switchyard_limits_local_total 3.0" in (await client.get("/metrics")).text
    assert (await client.get("/readyz")).json()["limits"] == "local"
    (line,) = logs.lines("limits_local", gw)
    assert line["level"] == "error"


async def test_a_key_made_in_the_database_reaches_a_process_whose_redis_is_down_within_a_second(
    start_gateway: StartGateway, up: ReplayUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key created or revoked by the CLI (or by another replica, whose announcement this process
    cannot hear): with `[redis]` configured the table was read every 10 s only, the safety net
    meant for a missed message. The watermark is read every 0.5 s, Redis or not."""
    up.set_default(answer("ok"))
    redis = {"url": f"redis://127.0.0.1:{free_port()}/0", "key_prefix": "d"}  # nothing listens there
    gw = await keyed_gateway(start_gateway, up, monkeypatch, redis=redis)
    engine = gw.service.engine
    assert engine is not None
    record, secret = await create_key(engine, KeyChanges(name="from the cli"))

    async def status() -> int:
        return (await gw.client.post(COMPLETIONS, json=body("chat"), headers=bearer(secret))).status_code

    await wait_until(lambda: _is(status(), 200), within=1.5, what="the new key accepted")
    await revoke_key(engine, record.id)
    await wait_until(lambda: _is(status(), 401), within=1.5, what="the revoked key refused")


async def _is(value: Awaitable[int], expected: int) -> bool:
    return await value == expected


async def _spender(
    start_gateway: StartGateway, up: ReplayUpstream, monkeypatch: pytest.MonkeyPatch, proxy: TcpProxy
) -> Callable[[], Awaitable[int]]:
    """A `fail_open` gateway whose Redis is behind `proxy`, and a request of a key with a $0.01
    budget ($0.003 each, a worst case of $0.0001 reserved): its status, once the ledger has it."""
    redis = {"url": f"redis://127.0.0.1:{proxy.port}/0", "key_prefix": "t"}
    gw = await keyed_gateway(start_gateway, up, monkeypatch, redis=redis, auth={"fail_open": True})
    made = await gw.client.post("/api/v1/keys", json={"name": "b", "budget_usd": "0.01"}, headers=bearer(ADMIN))
    key = bearer(made.json()["secret"])

    async def spend() -> int:
        response = await gw.client.post(COMPLETIONS, json=body("chat", max_tokens=1), headers=key)
        assert gw.service.ledger is not None
        await gw.service.ledger.flush()
        return response.status_code

    return spend


async def test_fail_open_takes_each_outages_spend_from_the_ledger_of_then(
    start_gateway: StartGateway, up: ReplayUpstream, monkeypatch: pytest.MonkeyPatch, private_redis: PrivateRedis
) -> None:
    """The process kept the spend it loaded at its first outage: at the next one it admitted as if
    nothing had been spent through Redis meanwhile (167 % of a budget in the chaos run)."""
    up.set_default(reply_json(200, COSTLY))
    with TcpProxy(private_redis.port) as proxy:
        spend = await _spender(start_gateway, up, monkeypatch, proxy)
        proxy.cut()  # the first outage: its spend $0 from the ledger, then $0.003
        assert await spend() == 200
        proxy.restore()
        assert [await spend(), await spend()] == [200, 200]  # through Redis: $0.009 in all
        proxy.cut()  # the second: $0.009 from the ledger, room for one more worst case only
        assert [await spend(), await spend(), await spend()] == [200, 429, 429]


async def test_fail_open_spend_reaches_redis_once_it_answers(
    start_gateway: StartGateway, up: ReplayUpstream, monkeypatch: pytest.MonkeyPatch, private_redis: PrivateRedis
) -> None:
    """What the process admitted alone during an outage was never added to Redis's spend: once
    Redis answered again the key admitted as if it was not spent (191 % of a budget in the Redis
    chaos run). It is added as Redis answers, before the next admission."""
    up.set_default(reply_json(200, COSTLY))
    with TcpProxy(private_redis.port) as proxy:
        spend = await _spender(start_gateway, up, monkeypatch, proxy)
        assert await spend() == 200  # through Redis: its spend $0.003
        await asyncio.sleep(0.1)  # its settlement sent (within 20 ms)
        proxy.cut()
        assert [await spend(), await spend()] == [200, 200]  # alone: $0.009 in all
        proxy.restore()
        assert [await spend(), await spend()] == [200, 429]  # Redis: $0.009 of $0.01, then $0.012


@pytest.mark.parametrize("refusal", ["read_only_replica", "out_of_memory"])
async def test_readyz_says_unavailable_while_redis_answers_but_refuses_writes(
    start_gateway: StartGateway,
    up: ReplayUpstream,
    monkeypatch: pytest.MonkeyPatch,
    private_redis: PrivateRedis,
    refusal: str,
) -> None:
    """A Redis made a replica (a failover's old primary: `READONLY`) or full under `noeviction`
    (`OOM`) still answers `PING`: limited keys got 503 while /readyz said `limits: ok`."""
    up.set_default(answer("ok"))
    gw = await keyed_gateway(start_gateway, up, monkeypatch, redis={"url": private_redis.url, "key_prefix": "t"})
    limited, plain = await _two_keys(gw)
    assert (await gw.client.post(COMPLETIONS, json=body("chat"), headers=bearer(limited))).status_code == 200
    assert (await gw.client.get("/readyz")).json()["limits"] == "ok"
    admin = Redis.from_url(private_redis.url)
    if refusal == "read_only_replica":
        await admin.execute_command("REPLICAOF", "127.0.0.1", str(free_port()))  # a primary that is not there
    else:
        await admin.config_set("maxmemory-policy", "noeviction")
        await admin.config_set("maxmemory", "1")
    ready = await gw.client.get("/readyz")
    assert (ready.status_code, ready.json()["status"], ready.json()["limits"]) == (200, "ok", "unavailable")

    async def refused() -> bool:  # once the lease this process holds is over
        response = await gw.client.post(COMPLETIONS, json=body("chat"), headers=bearer(limited))
        return (response.status_code, response.text.count("limits cannot be checked")) == (503, 2)

    await wait_until(refused, within=5.0, interval=0.1)
    assert (await gw.client.post(COMPLETIONS, json=body("chat"), headers=bearer(plain))).status_code == 200
    await admin.execute_command("REPLICAOF", "NO", "ONE")
    await admin.config_set("maxmemory", "0")
    await admin.aclose()
    assert (await gw.client.get("/readyz")).json()["limits"] == "ok"
    assert (await gw.client.post(COMPLETIONS, json=body("chat"), headers=bearer(limited))).status_code == 200


async def test_a_flapping_redis_says_limits_unavailable_once_a_spell(
    start_gateway: StartGateway,
    up: ReplayUpstream,
    monkeypatch: pytest.MonkeyPatch,
    private_redis: PrivateRedis,
    logs: Logs,
) -> None:
    """A Redis answering now and then (paused, sleeping, a flaky link: the operator audit) said
    `limits_unavailable` at each refusal after an admission that passed: 58 lines in 10 s. Once
    in `SAY_EVERY_S` now; every such request is still a 503."""
    up.set_default(answer("ok"))
    with TcpProxy(private_redis.port) as proxy:
        redis = {"url": f"redis://127.0.0.1:{proxy.port}/0", "key_prefix": "t"}
        gw = await keyed_gateway(start_gateway, up, monkeypatch, redis=redis)
        made = await gw.client.post("/api/v1/keys", json={"name": "c", "max_concurrency": 4}, headers=bearer(ADMIN))
        key = bearer(made.json()["secret"])  # max_concurrency: every admission asks Redis (no lease)

        async def status() -> int:
            return (await gw.client.post(COMPLETIONS, json=body("chat"), headers=key)).status_code

        for _ in range(3):
            assert await status() == 200
            proxy.cut()
            assert await status() == 503
            proxy.restore()
            await wait_until(lambda: _is(status(), 200), within=5.0, what="Redis answering again")
    assert [line["event"] for line in logs.lines("limits_unavailable", gw)] == ["limits_unavailable"]
    await gw.close()


async def test_an_outage_that_starts_soon_after_a_blip_is_still_said(
    start_gateway: StartGateway,
    up: ReplayUpstream,
    monkeypatch: pytest.MonkeyPatch,
    private_redis: PrivateRedis,
    logs: Logs,
) -> None:
    """A blip (said), Redis back, then down for good within `SAY_EVERY_S`: the refusal that began
    the long outage was not said, yet it marked the outage as said, so nothing was ever logged
    for it however long it lasted (the only line in the log was the blip's)."""
    monkeypatch.setattr("app.access.gate.SAY_EVERY_S", 1.0)
    up.set_default(answer("ok"))
    with TcpProxy(private_redis.port) as proxy:
        redis = {"url": f"redis://127.0.0.1:{proxy.port}/0", "key_prefix": "t"}
        gw = await keyed_gateway(start_gateway, up, monkeypatch, redis=redis)
        made = await gw.client.post("/api/v1/keys", json={"name": "c", "max_concurrency": 4}, headers=bearer(ADMIN))
        key = bearer(made.json()["secret"])

        async def status() -> int:
            return (await gw.client.post(COMPLETIONS, json=body("chat"), headers=key)).status_code

        assert await status() == 200
        proxy.cut()
        assert await status() == 503  # the blip: said
        proxy.restore()
        await wait_until(lambda: _is(status(), 200), within=5.0, what="Redis answering again")
        proxy.cut()  # down for good, within the window of the blip's line
        assert await status() == 503
        await asyncio.sleep(1.2)
        assert await status() == 503
        assert len(logs.lines("limits_unavailable", gw)) == 2
    await gw.close()


async def test_readyz_says_ok_for_a_redis_user_kept_to_the_limiters_keys(
    start_gateway: StartGateway, up: ReplayUpstream, monkeypatch: pytest.MonkeyPatch, private_redis: PrivateRedis
) -> None:
    """An ACL that keeps the gateway's user to its own keys (`{prefix}:lim:*`, `{prefix}:gen`, the
    events channel: the README's least privilege) refuses the probe's `{prefix}:ready` with
    NOPERM: /readyz said `limits: unavailable` while every limited key was admitted."""
    admin = Redis.from_url(private_redis.url)
    await admin.execute_command("ACL", "SETUSER", "gw", "on", ">pw", "~t:lim:*", "~t:gen", "&*", "+@all")
    await admin.aclose()
    up.set_default(answer("ok"))
    url = f"redis://gw:pw@127.0.0.1:{private_redis.port}/0"
    gw = await keyed_gateway(start_gateway, up, monkeypatch, redis={"url": url, "key_prefix": "t"})
    made = await gw.client.post("/api/v1/keys", json={"name": "l", "rpm": 100}, headers=bearer(ADMIN))
    limited = bearer(made.json()["secret"])
    assert (await gw.client.post(COMPLETIONS, json=body("chat"), headers=limited)).status_code == 200
    assert (await gw.client.get("/readyz")).json()["limits"] == "ok"
    await gw.close()
